"""torchtitan 0.3.0: what it runs (below), what it can express (rules.py, with the model configs
it ships), how a plan becomes its command-line overrides (export.py) and its fitted constants
per device (constants.json)."""

from planner.specs import LossKernel
from planner.stacks.stack import Kernels, Stack
from planner.stacks.torchtitan.rules import RULES, layout_problems, model_problems, problems

STACK = Stack(
    name="torchtitan",
    # Priced with the device's flash2 entry: its language models run FlexAttention (export.py's
    # docstring), which has no entry of its own
    attention_kernel="flash2",
    loss_kernel=LossKernel.eager,  # torch's cross-entropy
    tp_comm_overlap=RULES.tp_comm_overlap,  # async TP: micro-pipelined all-gather / reduce-scatter matmuls, on top of SP
    zero3="fsdp2",  # fully_shard per transformer block (fsdp_reshard_after_forward "always")
    model_states="fsdp2",  # fp32 sharded parameters and gradients on every layout (cost_models/memory.py)
    rules=RULES,
    model_problems=model_problems,
    layout_problems=layout_problems,
    problems=problems,
    exporter="planner.export.torchtitan",
    # Its Llama model run eagerly (torchtitan/models/llama3/model: no compile by default): wq, wk,
    # wv and w1, w3 as separate GEMMs; nn.RMSNorm, one fused kernel on CUDA (aten._fused_rms_norm);
    # rotary as a complex product between two casts (3 per tensor); silu(w1 x) * w3 x (2); plain
    # residual adds; attention through SDPA with enable_gqa (no K/V repeat), its output made
    # contiguous once. It has no unfused attention path: eager PyTorch's (the Hugging Face one's).
    # Its MoE layer (torchtitan/models/moe/moe.py): router GEMM, score function, top-k, the tokens
    # per expert (histc), the reorder by expert (argsort, gather) and the scores' product (7); the
    # all-to-all of counts, of tokens and back, with the permutation indices into each local
    # expert's aligned rows and the gathers around them (6); the group offsets' cumsum (1); the
    # weighted scatter-add of the output (1): 15. The experts (GroupedExperts): torch._grouped_mm,
    # one kernel for w1, w3 and w2 each, silu and product between.
    kernels=Kernels(
        separate_qkv=True,
        separate_gate_up=True,
        layernorm=1,
        rmsnorm=1,
        rotary=6,
        activation=1,
        gated_activation=2,
        residual=1,
        dropout=1,
        kv_repeat=0,
        softmax=4,
        attention_out=1,
        moe_dispatch=15,
        experts="grouped",
    ),
)
