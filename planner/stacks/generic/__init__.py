"""generic: PyTorch eager as `plan run`'s executor runs it (planner/executor/parallelize.py),
and the optimum over every layout the cost model prices. It has no exporter and no Rules:
`plan solve --target generic` searches everything, `plan export` writes no generic config."""

from planner.specs import LossKernel
from planner.stacks.stack import Stack

STACK = Stack(
    name="generic",
    attention_kernel="flash2",  # FlashAttention-2 through torch's scaled_dot_product_attention
    loss_kernel=LossKernel.eager,  # torch's cross-entropy: logits upcast to fp32, log-softmax saved
    tp_comm_overlap=False,
    zero3="fsdp2",  # the executor's fully_shard per block (planner/executor/parallelize.py)
    # kernels: left to stack.py:EAGER, the executor's layer as it runs
)
