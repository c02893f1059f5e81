"""Megatron-LM / Megatron-Core (core_v0.16.1) with Transformer Engine: what it runs (below),
what it can express (rules.py), how a plan becomes its arguments (export.py) and its fitted
constants per device (constants.json)."""

from planner.specs import LossKernel
from planner.stacks.megatron.rules import RULES, layout_problems, model_problems, problems
from planner.stacks.stack import Stack

STACK = Stack(
    name="megatron",
    attention_kernel="cudnn",  # Transformer Engine's DotProductAttention on cuDNN's fused attention
    # Megatron's fused vocab-parallel cross-entropy (tensor_parallel/cross_entropy.py): fp32 softmax in place
    loss_kernel=LossKernel.vocab_parallel,
    tp_comm_overlap=RULES.tp_comm_overlap,  # --tp-comm-overlap: Transformer Engine userbuffers, on top of SP
    # Megatron-Core's ZeRO-3 is Megatron-FSDP (--data-parallel-sharding-strategy optim_grads_params),
    # which the exporter does not write (RULES.zero_stages): none here
    zero3="none",
    rules=RULES,
    model_problems=model_problems,
    layout_problems=layout_problems,
    problems=problems,
    exporter="planner.stacks.megatron.export",
)
