"""torchtitan 0.3.0: what it runs (below), what it can express (rules.py, with the model configs
it ships), how a plan becomes its command-line overrides (export.py) and its fitted constants
per device (constants.json)."""

from planner.specs import LossKernel
from planner.stacks.stack import Stack
from planner.stacks.torchtitan.rules import RULES, layout_problems, model_problems, problems

STACK = Stack(
    name="torchtitan",
    # Priced with the device's flash2 entry: its language models run FlexAttention (export.py's
    # docstring), which has no entry of its own
    attention_kernel="flash2",
    loss_kernel=LossKernel.eager,  # torch's cross-entropy
    tp_comm_overlap=RULES.tp_comm_overlap,  # async TP: micro-pipelined all-gather / reduce-scatter matmuls, on top of SP
    zero3="fsdp2",  # fully_shard per transformer block (fsdp_reshard_after_forward "always")
    rules=RULES,
    model_problems=model_problems,
    layout_problems=layout_problems,
    problems=problems,
    exporter="planner.stacks.torchtitan.export",
)
