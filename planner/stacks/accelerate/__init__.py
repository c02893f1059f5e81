"""Hugging Face Accelerate 1.15 with FSDP2 (and its ParallelismConfig TP): what it runs (below),
what it can express (rules.py), how a plan becomes its YAML config (export.py) and its fitted
constants per device (constants.json)."""

from planner.specs import LossKernel
from planner.stacks.accelerate.rules import RULES, layout_problems, model_problems, problems
from planner.stacks.stack import TRANSFORMERS, Stack

STACK = Stack(
    name="accelerate",
    attention_kernel="flash2",  # the transformers model's SDPA attention: FlashAttention-2
    loss_kernel=LossKernel.eager,  # the model's torch cross-entropy
    tp_comm_overlap=RULES.tp_comm_overlap,
    zero3="fsdp2",  # ZeRO-2/3 are FSDP2 (fsdp_version 2) over every data-parallel rank
    model_states="accelerate",  # DDP under autocast at ZeRO-0, FSDP2 with fp32 shards at 2/3 (cost_models/memory.py)
    rules=RULES,
    model_problems=model_problems,
    layout_problems=layout_problems,
    problems=problems,
    exporter="planner.export.accelerate",
    kernels=TRANSFORMERS,  # the Hugging Face model it trains, run eagerly (stack.py:TRANSFORMERS)
)
