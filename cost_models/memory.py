"""Per-GPU memory: model states under ZeRO, activations under TP/SP/recompute, in-flight
micro-batches per pipeline schedule.

Model states follow Rajbhandari et al. 2020 (ZeRO, sec. 3 and 5): mixed-precision Adam
keeps 2 bytes of 16-bit weights, 2 of 16-bit gradients and 12 of fp32 master weights,
momentum and variance per parameter (16 Psi), and stage 1/2/3 divide the optimizer /
+gradient / +weight part by the data-parallel degree N.

Activations follow Korthikanti et al. 2022 (sec. 4, Table 2): per layer, 16-bit
activations and 1-byte dropout masks,
    no parallelism                  s b h (34 + 5 a s / h)
    tensor parallel                 s b h (10 + 24/t + 5 a s / (h t))
    TP + sequence parallel          s b h (34/t + 5 a s / (h t))
    TP + selective recompute        s b h (10 + 24/t)
    TP + SP + selective recompute   s b h 34 / t
    full recompute                  2 s b h (layer input only; / t with SP)
generalised term by term to GQA (K and V of kv_heads), multi-head latent attention (wider
query/key heads, and the latents), SwiGLU (gate, up and product of f each), models without
dropout (no masks) and fused attention (no s x s scores stored).
"""

from __future__ import annotations

from planner.specs import DTYPE_BYTES, DType, LossKernel, ModelSpec, Optimizer, Recompute, Schedule

from .compute import kv_shard, latent_norm_width, mlp_inputs, separate_norms, vocab_shard

GIB = float(2**30)


# --------------------------------------------------------------------------- model states


# How each training stack holds the model states (STATE_RECIPES; a Stack names its recipe,
# planner/stacks/<name>/__init__.py). Per category, (bytes every rank of the ZeRO group keeps,
# bytes split over the group), per parameter; model_state_bytes adds them up. h is the compute
# copy (2 at 16 bits, 4 at fp32), m the optimizer moments (Adam's two fp32, SGD's one), w the
# fp32 master weights a 16-bit run keeps (0 at fp32).
#
# zero        Rajbhandari et al. 2020 sec. 5 (plan run's executor, `generic`): weights h,
#             gradients h, optimizer w + m; stages 1 / 2 / 3 shard the optimizer / + gradients /
#             + weights: 16, 4 + 12/d, 2 + 14/d, 16/d bytes (bf16, Adam).
# megatron    Megatron-LM (core_v0.16.1): bf16 runs keep fp32 main gradients in the DDP grad
#             buffer (arguments.py turns accumulate_allreduce_grads_in_fp32 on for --bf16;
#             distributed/param_and_grad_buffer.py sizes the buffer in grad_dtype), which the
#             distributed optimizer (ZeRO-1) leaves whole and reduce-scatters; fp16 runs keep
#             16-bit gradients and the optimizer an fp32 copy of its shard. Megatron's own table
#             (docs/source/api-guide/dist_optimizer.md): bf16 param / fp32 grads 18 and 6 + 12/d,
#             fp16 / fp16 20 and 4 + 16/d, fp32 16 and 8 + 8/d. --grad-reduce-in-bf16 makes the
#             buffer 16-bit: 4 + 12/d (megatron_bf16_grads). ZeRO-2/3 are Megatron-FSDP
#             (--use-megatron-fsdp, optim_grads / optim_grads_params), which shards the main
#             gradients and then the weights too: 2 + 16/d and 18/d (Megatron-MoE-ModelZoo runs).
# deepspeed   DeepSpeed 0.19.8 with bf16 and its default 16-bit gradient accumulation: ZeRO-0
#             the fused 16-bit optimizer (fp32 master weights whole) 16; ZeRO-1 the 16-bit
#             gradients whole plus the fp32 gradient partition the ZeRO optimizer steps on
#             (runtime/zero/stage_1_and_2.py: single_partition_of_fp32_groups) 4 + 16/d; ZeRO-2
#             2 + 18/d ("2_grads_16bit + 4_grads_32bit + 4_params_32bit +
#             8_optimizer_states_32bit", its estimate_zero2_model_states_mem_needs) and ZeRO-3
#             18/d (16-bit weights and the fp32 partitions: estimate_zero3_model_states_mem_needs,
#             whose 16-bit gradients live only in its reduce bucket and the current layer).
# fsdp2       torch FSDP2 with MixedPrecisionPolicy(param_dtype=bf16) as torchtitan 0.3 applies it
#             to every layout (models/llama3/parallelize.py: apply_fsdp_to_decoder "always", a
#             shard degree of 1 at ZeRO-0): the sharded parameters stay fp32 (the master weights
#             are the parameters), the gradients are fp32 shards, no separate master copy: 16/d;
#             ZeRO-2 (reshard_after_forward False) also keeps every layer's unsharded 16-bit copy
#             from forward to backward: h + 16/d.
# accelerate  Accelerate 1.15: ZeRO-2/3 as fsdp2 (utils/fsdp_utils.py upcasts the sharded
#             parameters to fp32); ZeRO-0 is DistributedDataParallel under bf16 autocast: fp32
#             parameters, fp32 gradients and DDP's bucket copy of them (gradient_as_bucket_view
#             off, its default), and the 16-bit weight casts autocast makes in forward, which
#             autograd keeps for backward: 4 + 2 + 4 + 4 + 8 = 22.
STATE_RECIPES = ("zero", "megatron", "megatron_bf16_grads", "deepspeed", "fsdp2", "accelerate")


def state_parts(
    recipe: str, zero_stage: int, precision: DType, optimizer: Optimizer
) -> tuple[tuple[float, float], ...]:
    """((kept, split) bytes per parameter) for weights, gradients and optimizer states, as
    `recipe` holds them at `zero_stage` (the comment above says where each number comes from)."""
    half = precision != DType.fp32
    h = DTYPE_BYTES[precision]
    m = 8 if optimizer == Optimizer.adam else 4
    w = 4 if half else 0
    z = zero_stage
    if recipe == "zero":
        return ((0, h) if z >= 3 else (h, 0)), ((0, h) if z >= 2 else (h, 0)), ((0, w + m) if z >= 1 else (w + m, 0))
    if recipe in ("megatron", "megatron_bf16_grads"):
        fp32_buffer = precision == DType.bf16 and recipe == "megatron"  # bf16: fp32 main grads in the buffer
        grads = 4 if (fp32_buffer or not half) else h
        copy = 4 if precision == DType.fp16 else 0  # fp16: the optimizer's fp32 copy of its gradient shard
        opt = w + m + copy
        if z >= 2:  # Megatron-FSDP (optim_grads / optim_grads_params): the main gradients sharded too, then the weights
            return ((0, h) if z >= 3 else (h, 0)), (0, grads), (0, opt)
        return (h, 0), (grads, 0), ((0, opt) if z >= 1 else (opt, 0))
    if recipe == "deepspeed":
        fp32_grads = 4 if half else 0  # the ZeRO optimizer's fp32 gradient partition
        if z == 0:
            return (h, 0), (h, 0), (w + m, 0)
        # ZeRO-1 keeps the 16-bit gradients whole, ZeRO-2 its partition of them; ZeRO-3 reduces
        # them out of its bucket into the fp32 partition (the layer's own are live bytes)
        grad_parts = (h, fp32_grads) if z == 1 else (0, h + fp32_grads) if z == 2 else (0, fp32_grads or h)
        return ((0, h) if z >= 3 else (h, 0)), grad_parts, (0, w + m)
    if recipe == "accelerate" and z < 2:  # DDP under autocast: fp32 parameters, gradients and buckets
        return (4 + (h if half else 0), 0), (8, 0), (m, 0)
    if recipe in ("fsdp2", "accelerate"):
        if z < 2:  # a shard degree of 1: everything whole
            return (4, 0), (4, 0), (m, 0)
        return (h if z == 2 else 0, 4), (0, 4), (0, m)
    raise ValueError(f"unknown model-state recipe {recipe!r} (one of {', '.join(STATE_RECIPES)})")


def model_state_bytes(
    params: float, dp: int, zero_stage: int, precision: DType, optimizer: Optimizer, recipe: str = "zero"
) -> tuple[float, float, float]:
    """(weights, gradients, optimizer states) bytes on one GPU holding `params` parameters,
    sharded over a ZeRO group of `dp` ranks as `recipe` shards them (state_parts).

    The ZeRO paper's mixed-precision Adam: stage 0: 16 Psi; 1: 4 Psi + 12 Psi/N; 2: 2 Psi + 14 Psi/N; 3: 16 Psi/N.
    """
    d = max(1, dp)
    weights, grads, states = (
        params * (kept + split / d) for kept, split in state_parts(recipe, zero_stage, precision, optimizer)
    )
    return weights, grads, states


def live_layer_bytes_per_param(recipe: str, zero_stage: int, precision: DType) -> float:
    """Bytes per parameter of one layer that a sharding stack materialises beside the shards
    while it runs (times the layer's parameters on the rank).

    deepspeed ZeRO-3: the gathered 16-bit parameters and their 16-bit gradients of the largest
    layer, 2 h, what estimate_zero3_model_states_mem_needs adds (4 x largest_layer_params); the
    export's stage3_max_live_parameters keeps the prefetched layer within that.
    fsdp2 (torchtitan, Accelerate's ZeRO-2/3): the current and the prefetched layer's unsharded
    16-bit parameters (2 h, not at ZeRO-2, whose copies are model states already) and the
    layer's unsharded gradient with its copy in the reduce dtype, fp32 (torchtitan's
    mixed_precision_reduce), before the reduce-scatter: h + 4.
    zero (plan run's executor at ZeRO-3): the current and prefetched layers' parameters, 2 h.
    Stacks that shard nothing (megatron) or not at this stage: 0."""
    h = DTYPE_BYTES[precision]
    if recipe == "fsdp2" or (recipe == "accelerate" and zero_stage >= 2):
        return (0.0 if zero_stage == 2 else 2.0 * h) + h + 4.0
    if recipe in ("deepspeed", "zero", "megatron", "megatron_bf16_grads"):  # Megatron-FSDP gathers as the executor does
        return 2.0 * h if zero_stage >= 3 else 0.0
    return 0.0


def bucket_bytes(
    recipe: str, zero_stage: int, precision: DType, bucket_elements: float, reduce_bucket_elements: float
) -> float:
    """Communication buffers of a stack's gradient reduction, bytes per GPU. DeepSpeed's ZeRO-1/2
    with overlap_comm: 4.5 x (reduce_bucket_size + allgather_bucket_size) elements, its own
    rule (docs/_pages/config-json.md: "overlap_comm=True uses 4.5x the allgather_bucket_size and
    reduce_bucket_size values"), at `bucket_elements` each as the export writes them; its ZeRO-3
    keeps one contiguous reduce bucket of `reduce_bucket_elements` (stage3.py: the ipg buffer).
    The others reduce in their gradient buffers (Megatron), into the shards (FSDP2) or in DDP's
    buckets, counted as gradients: 0."""
    if recipe != "deepspeed" or zero_stage == 0:
        return 0.0
    e = DTYPE_BYTES[precision]
    if zero_stage < 3:
        return 4.5 * 2 * bucket_elements * e
    return reduce_bucket_elements * e


# --------------------------------------------------------------------------- activations


def layer_activation_bytes(
    model: ModelSpec,
    micro_batch: int,
    seq_len: int,
    tp: int,
    sequence_parallel: bool,
    recompute: Recompute,
    flash_attention: bool,
    dtype: DType = DType.bf16,
    dense: bool = False,
    fp8: bool = False,
) -> float:
    """Activation bytes one layer keeps for backward, per micro-batch, on one TP rank. A MoE
    layer's MLP keeps, per token-expert assignment (top-k of them per token of this rank's
    sequence shard), the permuted expert input and the expert MLP's tensors, plus the fp32
    router probabilities, and the expert outputs the weighted combine needs for the routing
    weights' gradient; its shared experts keep what a dense MLP of their width does."""
    moe = model.is_moe and not dense
    s, b, h = seq_len, micro_batch, model.hidden_size
    f = (model.experts_per_token + model.num_shared_experts) * model.moe_ffn if moe else model.ffn
    e = DTYPE_BYTES[dtype]
    sbh = s * b * h
    sp_div = tp if sequence_parallel else 1
    if recompute == Recompute.full:
        return e * sbh / sp_div

    # Replicated over TP unless sequence parallel: inputs of the norms (two; Gemma's four), of
    # the QKV and fc1 projections (4 tensors of s b h with two norms), and the two dropout masks
    # (1 byte each).
    replicated = (2 + model.norms_per_layer) * e * sbh + (2 * sbh if model.dropout else 0)
    # Sharded over TP: Q, K, V (for QK^T and AV), input of the output projection, and the MLP.
    q = s * b * (model.q_width // tp)
    out = s * b * (model.out_width // tp)
    kv = s * b * model.head_dim * kv_shard(model, tp)
    attention: float = e * (q + 2 * kv + q)
    if model.mla:
        # Q and K (every head's, the shared rotary key copied into each), V and the output
        # projection's input; the latents, as their norms' inputs and as the up-projections'
        # inputs (this rank's tokens under SP: a column-parallel layer gathers again in backward)
        latent = s * b * latent_norm_width(model)
        attention = e * (2 * q + 2 * out + 2 * latent / sp_div)
        if recompute == Recompute.selective:
            # the up-projections rerun in backward: Q, K and V are not kept; the gathered
            # rotary key is (Megatron-Core's mla_up_proj checkpoint)
            attention -= e * (2 * q + out - s * b * model.qk_rope_head_dim)
    if model.qk_norm:
        attention += e * (q + kv)  # the queries and keys before their norms
    mlp_tensors = 1 + mlp_inputs(model)  # fc1 out, act out (+ up, for a gated unit)
    if model.glu_limit is not None:  # the clamped halves, kept beside the fc1 output the clamps keep
        mlp_tensors += 2
    mlp = e * mlp_tensors * s * b * (f // tp)
    total = replicated / sp_div + attention + mlp
    if moe:
        assert model.num_experts is not None and model.experts_per_token is not None  # a MoE layer's
        rows = s * b / tp  # this rank's tokens (MoE with tp > 1 runs with sequence parallelism)
        # the permuted expert inputs, and the experts' outputs the weighted combine keeps for
        # the routing weights' gradient, one each per assignment; fp32 router probabilities
        total += 2 * e * rows * model.experts_per_token * h + 4 * rows * model.num_experts
    if fp8:
        # Linear layers keep their inputs for the weight gradient as FP8 (1 byte): the QKV and
        # fc1 inputs, the attention output projection's, and fc2's (the activation output);
        # the experts' permuted inputs too.
        saved = 2 * sbh / sp_div + out + s * b * (f // tp)
        if moe:
            assert model.experts_per_token is not None  # a MoE layer's
            saved += s * b / tp * model.experts_per_token * h
        total -= (e - 1) * saved
    if recompute == Recompute.none:
        total += attention_score_bytes(model, micro_batch, seq_len, tp, flash_attention, e)
    return total


def norm_act_bytes(
    model: ModelSpec,
    micro_batch: int,
    seq_len: int,
    tp: int,
    sequence_parallel: bool,
    kernels,
    dtype: DType = DType.bf16,
    dense: bool = False,
    fp8: bool = False,
) -> float:
    """Bytes of layer_activation_bytes one layer (not fully recomputed) no longer keeps per
    micro-batch under Plan.recompute_norm_act: the output of each separate norm
    (compute.separate_norms, as the linear layer after it keeps it: this rank's rows, FP8 under
    FP8 GEMMs) and, in a MoE layer, the routed experts' activation output (fc2's input) with a
    clamped GLU's two clamped halves; the fc1 output the activation reruns from is kept."""
    e = DTYPE_BYTES[dtype]
    kept = 1 if fp8 else e
    s, b = seq_len, micro_batch
    out = separate_norms(model, kernels, dense) * kept * s * b * model.hidden_size / (tp if sequence_parallel else 1)
    if model.is_moe and not dense:
        assert model.experts_per_token is not None  # a MoE model's (ModelSpec._shapes)
        act = s * b * (model.experts_per_token * model.moe_ffn // tp)
        out += kept * act + (2 * e * act if model.glu_limit is not None else 0)
    return out


def attention_score_bytes(
    model: ModelSpec, micro_batch: int, seq_len: int, tp: int, flash_attention: bool, e: int = 2
) -> float:
    """What core attention keeps beyond Q, K, V: softmax output (2 a s^2 b), dropout mask
    (a s^2 b) and dropout output (2 a s^2 b), i.e. 5 a s^2 b / t; a fused kernel keeps only the
    fp32 log-sum-exp per row."""
    heads = model.num_heads // tp
    if flash_attention:
        return 4.0 * micro_batch * heads * seq_len
    scores = micro_batch * heads * seq_len * seq_len
    return e * scores + ((1 + e) * scores if model.dropout else 0)


def embedding_activation_bytes(
    model: ModelSpec, micro_batch: int, seq_len: int, tp: int, sequence_parallel: bool
) -> float:
    """First stage: the embedding's dropout mask (Korthikanti: s b h p / t with SP)."""
    if not model.dropout:
        return 0.0
    return micro_batch * seq_len * model.hidden_size / (tp if sequence_parallel else 1)


def loss_bytes_per_logit(kernel: LossKernel, e: int) -> tuple[float, float]:
    """(kept for backward, transient at the start of backward) bytes per logit of the loss,
    e the 16-bit element size.

    eager (PyTorch `cross_entropy(logits.float(), ...)`): the fp32 log-softmax is saved (4,
    Korthikanti et al.'s 4 s b V / t); at the start of backward the 16-bit logits, still held
    by the model's output, and the fp32 gradient (4) are live too.
    vocab-parallel (Megatron-Core's fused vocab-parallel cross-entropy): the 16-bit logits are
    upcast once and freed, the softmax is formed in place in the fp32 copy (4, saved), and
    backward writes the gradient into that buffer before casting it to 16 bits (e).
    fused (flash-attn's cross_entropy kernel, llm-foundry's default `loss_fn`): the kernel
    reads the 16-bit logits (e, saved) and keeps one fp32 log-sum-exp per row; backward
    produces a 16-bit gradient (e)."""
    if kernel == LossKernel.vocab_parallel:
        return 4.0, float(e)
    if kernel == LossKernel.fused:
        return float(e), float(e)
    return 4.0, e + 4.0


def head_activation_bytes(
    model: ModelSpec,
    micro_batch: int,
    seq_len: int,
    tp: int,
    sequence_parallel: bool,
    dtype: DType = DType.bf16,
    loss: LossKernel = LossKernel.eager,
) -> float:
    """Last stage: final-norm input and LM-head input (2 x e s b h) and what the loss keeps
    per logit over V/t logits (loss_bytes_per_logit)."""
    e = DTYPE_BYTES[dtype]
    sbh = micro_batch * seq_len * model.hidden_size
    kept, _ = loss_bytes_per_logit(loss, e)
    if model.logit_softcapping:
        kept += e  # tanh's 16-bit output, saved for its backward (the scalings by c save nothing)
    return 2 * e * sbh / (tp if sequence_parallel else 1) + kept * micro_batch * seq_len * vocab_shard(model, tp)


def logits_temporary_bytes(
    model: ModelSpec,
    micro_batch: int,
    seq_len: int,
    tp: int,
    dtype: DType = DType.bf16,
    loss: LossKernel = LossKernel.eager,
) -> float:
    """Transient buffers of the loss on the last stage at the start of backward."""
    _, transient = loss_bytes_per_logit(loss, DTYPE_BYTES[dtype])
    return transient * micro_batch * seq_len * vocab_shard(model, tp)


def tp_overlap_buffer_bytes(model: ModelSpec, micro_batch: int, seq_len: int, e: int) -> float:
    """Communication buffers of TP comm overlap: Megatron-LM registers Transformer Engine
    userbuffers of shape (seq_len x micro_batch, hidden) (megatron/training's
    _initialize_tp_communicators), one per overlapped GEMM: the forward and input-gradient
    GEMMs of QKV, the attention projection, fc1 and fc2, i.e. eight of s b h elements."""
    return 8.0 * e * seq_len * micro_batch * model.hidden_size


# --------------------------------------------------------------------------- schedules


def in_flight_micro_batches(schedule: Schedule, pp: int, num_micro_batches: int, rank: int, vpp: int = 1) -> int:
    """Micro-batches (times model chunks, for interleaving) whose activations pipeline rank
    `rank` holds at its peak.

    GPipe: all m forward passes finish before any backward. 1F1B (Narayanan et al. 2021):
    rank i runs p - i warm-up forwards, so it holds min(p - i, m). Interleaved 1F1B (Megatron's
    warm-up count): 2 (p - i - 1) + (v - 1) p + 1 chunk-micro-batches, at most m v; the first
    rank's total is L (1 + (p - 1)/(p v)) layers' worth, Korthikanti et al. sec. 4.2.3.
    """
    m = num_micro_batches
    if schedule == Schedule.gpipe:
        return m * vpp
    if schedule == Schedule.one_f_one_b:
        return min(pp - rank, m)
    return min(2 * (pp - rank - 1) + (vpp - 1) * pp + 1, m * vpp)
