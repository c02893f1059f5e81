"""DeepSpeed 0.19.8 (the user's torch module under deepspeed.initialize): what it runs (below),
what it can express (rules.py), how a plan becomes its config JSON (export.py) and its fitted
constants per device (constants.json)."""

from planner.specs import LossKernel
from planner.stacks.deepspeed.rules import RULES, layout_problems, model_problems, problems
from planner.stacks.stack import TRANSFORMERS, Stack

STACK = Stack(
    name="deepspeed",
    attention_kernel="flash2",  # the model's own attention: FlashAttention-2 through SDPA
    loss_kernel=LossKernel.eager,  # the model's torch cross-entropy
    tp_comm_overlap=RULES.tp_comm_overlap,  # AutoTP overlaps its all-reduce only, not the SP collectives
    zero3="deepspeed",  # its ZeRO-3 engine: parameters gathered per bucket, as its prefetch limits allow
    model_states="deepspeed",  # its ZeRO optimizer's fp32 gradient partition (cost_models/memory.py)
    rules=RULES,
    model_problems=model_problems,
    layout_problems=layout_problems,
    problems=problems,
    exporter="planner.export.deepspeed",
    kernels=TRANSFORMERS,  # the Hugging Face model it trains, run eagerly (stack.py:TRANSFORMERS)
    # ZeRO-0: engine.backward all-reduces the gradients once backward is done (runtime/engine.py,
    # allreduce_gradients after the backward pass). pp > 1: the pipeline engine reduces them only
    # at the schedule's last instruction, ReduceGrads after the last micro-batch
    # (runtime/pipe/schedule.py TrainSchedule; pipe/engine.py is_gradient_accumulation_boundary is
    # true only inside _exec_reduce_grads; the engine turns overlap_comm off for a pipeline).
    # ZeRO-1 in BF16 stays DeepSpeedZeroOptimizer's reduce-scatter: BF16_Optimizer, which
    # all-reduces whole gradients there, is taken only with data_types.grad_accum_dtype fp32,
    # which export.py does not set. ZeRO 1-2 at pp = 1 reduce in backward hooks on a side
    # stream (overlap_comm, as export.py sets).
    reduce_after_backward_zero0=True,
    reduce_after_pipeline=True,
)
