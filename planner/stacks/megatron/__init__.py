"""Megatron-LM / Megatron-Core (core_v0.16.1) with Transformer Engine: what it runs (below),
what it can express (rules.py), how a plan becomes its arguments (export.py) and its fitted
constants per device (constants.json)."""

from planner.specs import LossKernel
from planner.stacks.megatron.rules import RULES, layout_problems, model_problems, problems
from planner.stacks.stack import Kernels, Stack

STACK = Stack(
    name="megatron",
    attention_kernel="cudnn",  # Transformer Engine's DotProductAttention on cuDNN's fused attention
    # Megatron's fused vocab-parallel cross-entropy (tensor_parallel/cross_entropy.py): fp32 softmax in place
    loss_kernel=LossKernel.vocab_parallel,
    tp_comm_overlap=RULES.tp_comm_overlap,  # --tp-comm-overlap: Transformer Engine userbuffers, on top of SP
    # Megatron-Core's ZeRO-3 is Megatron-FSDP (--data-parallel-sharding-strategy optim_grads_params),
    # which the exporter does not write (RULES.zero_stages): none here
    zero3="none",
    model_states="megatron",  # fp32 main gradients under --bf16 (cost_models/memory.py)
    rules=RULES,
    model_problems=model_problems,
    layout_problems=layout_problems,
    problems=problems,
    exporter="planner.export.megatron",
    # Megatron-Core's transformer layer with Transformer Engine (transformer_layer.py,
    # attention.py, mlp.py): fused QKV (linear_qkv) and fc1 holding gate and up (linear_fc1), one
    # normalization kernel per norm (TE's LayerNormLinear and its RMSNorm), fused RoPE (one kernel
    # per tensor; --no-rope-fusion turns it off), bias-GeLU / bias-SwiGLU fusions (one kernel),
    # bias-dropout-add (one kernel per residual, dropout in it), cuDNN attention reading shared
    # KV heads as they are, and FusedScaleMaskSoftmax on the unfused path.
    # Its MoE layer (transformer/moe/: router.py with --moe-router-fusion, token_dispatcher.py's
    # all-to-all dispatcher with --moe-permute-fusion, experts.py TEGroupedMLP): the gating GEMM,
    # the fused top-k score kernel, the auxiliary loss's fused score and loss (4); the routing map's
    # token counts, the send splits, their all-gather over the EP group, the local experts' slice,
    # two sums and the device-to-host copy of the counts (7); the fused permutation (row map,
    # permute: 2); all-to-alls of tokens and of probabilities (2); the fused sort by local expert
    # (1); after the experts the inverse sort, the returning all-to-all and the fused unpermute (3):
    # 19. The experts: Transformer Engine's GroupedLinear for fc1 and fc2, which on cuBLAS launches
    # one GEMM per local expert (TransformerEngine common/gemm/cublaslt_gemm.cu:
    # nvte_multi_tensor_gemm -> multi_stream_cublas_gemm unless NVTE_USE_CUTLASS_GROUPED_GEMM on
    # Hopper), the weighted bias-activation fusion (1); a biased expert's fc2 bias added per local
    # expert in Python (TEGroupedMLP._apply_bias: bias x probability, add: 2), then the experts'
    # outputs concatenated: 6 passes (the product written, the sum's two reads and its write, the
    # concatenation's read and write). A clamped GLU (fusions/fused_bias_geglu.py:
    # weighted_bias_quick_geglu_impl with activation_func_clamp_value, GPT-OSS) chunks the fc1
    # output, clamps both halves eagerly and concatenates them before the fused activation: 3
    # kernels, 8 passes over a half. RoPE with YaRN's mscale (models/common/embeddings/rope_utils.py:
    # apply_rotary_pos_emb: "mscale ... is not supported by TE's fused RoPE") runs
    # _apply_rotary_pos_emb_bshd per tensor: cos and sin of the frequencies each scaled and cast
    # (6 small kernels), t * cos, the negated half, its concatenation, the product by sin, the sum
    # and the concatenation with the unrotated part (6 over the tensor: 12 passes): 24 for q and k.
    # The attention's and a dense MLP's norms run inside Transformer Engine's LayerNormLinear
    # (gpt_layer_specs.py: input_layernorm and a dense layer's pre_mlp_layernorm are IdentityOp);
    # a MoE layer's pre-MLP norm and MLA's input norm are TENorm modules of their own
    kernels=Kernels(
        separate_qkv=False,
        separate_gate_up=False,
        layernorm=1,
        rmsnorm=1,
        rotary=2,
        activation=1,
        gated_activation=1,
        residual=1,
        dropout=0,
        kv_repeat=0,
        softmax=1,
        attention_out=0,
        moe_dispatch=19,
        experts="gemm_per_expert",
        expert_bias=2,
        expert_bias_passes=6,
        glu_clamp=3,
        glu_clamp_passes=8,
        scaled_rotary=24,
        scaled_rotary_passes=12,
        norm_in_linear=True,
    ),
    # transformer/multi_latent_attention.py: linear_q_down_proj / linear_kv_down_proj 'duplicated'
    mla_local_down_projections=True,
    # --recompute-granularity selective --recompute-modules layernorm moe_act (export.py)
    recompute_norm_act=RULES.recompute_norm_act,
)
