"""Parameters, FLOPs and compute time of transformer layers.

Counts follow Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM", eq. 2-3) and Korthikanti et al. 2022 ("Reducing Activation
Recomputation in Large Transformer Models", appendix): a GEMM of an (m x k) by (k x n)
matrix costs 2mkn FLOPs, backward costs twice the forward (input and weight gradients),
and attention (QK^T and AV) costs 4 b s^2 h in forward, counted without causal masking.
Generalised here to grouped-query attention, gated MLPs (SwiGLU, GeGLU), extra norms and
sliding-window attention.

Times, operator by operator: a GEMM by its shape (tiles, waves, k; DeviceSpec.gemm) or, for
measured CPU profiles, by its FLOPs on the measured curve; fused attention at the device's
own kernel efficiency; norms, activations, residual adds, dropout, rotary and unfused softmax
are memory-bound and cost bytes moved / achieved memory bandwidth; every launched kernel
adds a gap (DeviceSpec.kernel_overhead_us). Everything that a training loop sustains below
microbenchmarks scales by DeviceSpec.sustained_fraction.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass
from typing import Callable, TypeVar

from planner import stacks
from planner.specs import DTYPE_BYTES, DeviceSpec, DType, JobSpec, Layout, LossKernel, ModelSpec, Target

_Number = TypeVar("_Number", int, float)  # over_layers: an int per layer sums to an int

# --------------------------------------------------------------------------- parameters


@dataclass(frozen=True)
class LayerParams:
    """Parameters of one transformer layer on one tensor-parallel rank."""

    sharded: int  # split over the TP group (weights of column/row-parallel linears, column biases)
    replicated: int  # copied on every TP rank (norms, row-parallel biases, the MoE router)
    expert: int = 0  # routed experts held by this GPU (num_experts / ep of them; expert-TP 1)

    @property
    def total(self) -> int:
        return self.sharded + self.replicated + self.expert


def kv_shard(model: ModelSpec, tp: int) -> int:
    """KV heads on one TP rank: split while tp <= kv heads, replicated beyond (GQA)."""
    return max(1, model.kv_heads // tp)


def attention_linears(model: ModelSpec, tp: int = 1, fused_qkv: bool = False) -> list[tuple[int, int, str]]:
    """The attention block's linear layers on one TP rank, (in, out, kind) with kind 'column'
    (column-parallel: output split over TP), 'row' (row-parallel: input split) or 'duplicated'
    (whole on every TP rank). Standard attention: Q, K and V projections (one fused QKV GEMM
    with `fused_qkv`) and the output projection. Multi-head latent attention (DeepSeek-V2
    sec. 2.1, DeepSeek-V3 sec. 2.1.1): a query down-projection to q_lora_rank and its
    up-projection to every head's query (nope + rope features; or one full-rank query
    projection without q_lora_rank), a key-value down-projection to kv_lora_rank plus the
    shared rotary key, and its up-projection to every head's key (nope) and value, then the
    output projection of heads x v_head_dim. The down-projections are duplicated over TP, as
    Megatron-Core's MLASelfAttention builds them; under sequence parallelism each rank applies
    them to its own tokens (layer_compute)."""
    h = model.hidden_size
    q = model.q_width // tp
    out = [(model.out_width // tp, h, "row")]
    if model.mla:
        heads = model.num_heads // tp
        if model.q_lora_rank:
            qs = [(h, model.q_lora_rank, "duplicated"), (model.q_lora_rank, q, "column")]
        else:
            qs = [(h, q, "column")]
        kvs = [
            (h, model.kv_lora_rank + model.qk_rope_head_dim, "duplicated"),
            (model.kv_lora_rank, heads * (model.head_dim + model.v_dim), "column"),
        ]
        return qs + kvs + out
    kv = model.head_dim * kv_shard(model, tp)
    qkv = [(h, q + 2 * kv, "column")] if fused_qkv else [(h, q, "column"), (h, kv, "column"), (h, kv, "column")]
    return qkv + out


def attention_input_width(model: ModelSpec, target: Target = Target.megatron) -> int:
    """Features per token that the attention's column-parallel projections take in, so what
    tensor parallelism gathers (or all-reduces the gradient of) for them: the layer input h;
    under MLA, in a stack whose down-projections run on each rank's own tokens
    (Stack.mla_local_down_projections: Megatron-Core's MLASelfAttention), the query latent (or
    h without q_lora_rank), the key-value latent and the shared rotary key."""
    if not model.mla or not stacks.get(target).mla_local_down_projections:
        return model.hidden_size
    return (model.q_lora_rank or model.hidden_size) + model.kv_lora_rank + model.qk_rope_head_dim


def selective_recompute_flops(
    model: ModelSpec, micro_batch: int, seq_len: int, flash_attention: bool = True, cp: int = 1
) -> float:
    """FLOPs selective recompute reruns, whole layer: the core attention (as model FLOPs count
    it; a rank's seq_len tokens meet cp times as many keys under context parallelism); under
    MLA the up-projections, and the core attention only where it is unfused (layer_compute)."""
    core = cp * attention_flops_forward(model, micro_batch, seq_len)
    if not model.mla:
        return core
    up = sum(i * o for i, o, kind in attention_linears(model) if kind == "column")
    return 2.0 * micro_batch * seq_len * up + (0.0 if flash_attention else core)


def latent_norm_width(model: ModelSpec) -> int:
    """Features MLA normalises besides the layer's own norms: the query latent (with
    q_lora_rank) and the key-value latent, one RMSNorm each; 0 for standard attention."""
    return (model.q_lora_rank or 0) + (model.kv_lora_rank or 0)


def norm_weights(model: ModelSpec, width: int) -> int:
    """Parameters of norms over `width` features in all: a weight each (RMSNorm), and a bias
    (LayerNorm)."""
    return 2 * width if model.norm == "layernorm" else width


def mlp_inputs(model: ModelSpec) -> int:
    """Matrices on the MLP's input side: gate and up for a gated unit (SwiGLU, GeGLU), fc1 for GELU."""
    return 2 if model.gated else 1


def layer_params(model: ModelSpec, tp: int = 1, ep: int = 1, dense: bool = False) -> LayerParams:
    """Parameters of one layer per TP rank. With tp=1 and a GPT layer: 12h^2 + 13h (Narayanan eq. 2).

    A mixture-of-experts layer (model.is_moe and not `dense`, which asks for one of the first
    dense layers) replaces the MLP by a router (h x E, replicated), shared experts (an MLP of
    num_shared x expert width, TP-sharded like the dense one) and E routed experts of
    (mlp matrices) x h x expert width each, E / ep of them on this GPU, not TP-sharded
    (expert-TP 1, Megatron-Core's recommended setting for fine-grained experts)."""
    h, d = model.hidden_size, model.head_dim
    moe = model.is_moe and not dense
    f = model.num_shared_experts * model.moe_ffn if moe else model.ffn
    mlp_in = mlp_inputs(model)
    attn = attention_linears(model, tp)
    sharded = sum(i * o for i, o, kind in attn if kind != "duplicated") + mlp_in * h * (f // tp) + (f // tp) * h
    replicated = sum(i * o for i, o, kind in attn if kind == "duplicated")
    expert = 0
    if model.linear_bias:
        sharded += sum(o for _, o, kind in attn if kind == "column") + mlp_in * (f // tp)  # column-parallel biases
        replicated += 2 * h  # row-parallel biases (attention output, fc2)
    elif model.qkv_bias:  # Qwen2: the query, key and value projections' biases only
        sharded += sum(o for _, o, kind in attn if kind == "column")
    replicated += norm_weights(model, model.norms_per_layer * h + latent_norm_width(model))
    if model.qk_norm:
        replicated += 2 * d  # one weight of head_dim each for queries and keys, shared by the heads (Qwen3, Gemma 3)
    if moe:
        assert model.num_experts is not None  # moe: model.is_moe
        replicated += h * model.num_experts  # router
        expert = (model.num_experts // ep) * (mlp_in + 1) * h * model.moe_ffn
        if model.linear_bias:
            expert += (model.num_experts // ep) * (mlp_in * model.moe_ffn + h)
    return LayerParams(sharded, replicated, expert)


def vocab_shard(model: ModelSpec, tp: int) -> int:
    """Vocabulary rows on one TP rank (the table is padded to a multiple of tp)."""
    return -(-model.vocab_size // tp)


def embedding_params(model: ModelSpec, tp: int = 1) -> int:
    """Input embedding on the first pipeline stage: vocab-parallel table + learned positions."""
    n = vocab_shard(model, tp) * model.hidden_size
    if model.learned_position_embeddings:
        n += model.max_seq_len * model.hidden_size
    return n


def head_params(model: ModelSpec, tp: int = 1, pipeline_stages: int = 1) -> int:
    """Final norm and LM head on the last stage. A tied head still needs its own copy of the
    table when the embedding lives on another pipeline stage (Megatron keeps one and all-reduces
    their gradients)."""
    norm = norm_weights(model, model.hidden_size)
    if model.tied_embeddings and pipeline_stages == 1:
        return norm
    return norm + vocab_shard(model, tp) * model.hidden_size


def over_layers(model: ModelSpec, per_layer: Callable[[bool], _Number]) -> _Number:
    """Sum of `per_layer(dense)` over the model's layers: its first_dense_layers dense ones
    (dense=True) and the rest (dense=False; MoE layers in a MoE model)."""
    k = model.first_dense_layers
    return (model.num_layers - k) * per_layer(False) + (k * per_layer(True) if k else 0)


def mtp_params(model: ModelSpec, tp: int = 1) -> int:
    """One multi-token-prediction module on one TP rank besides its transformer layer: the norms
    of its two inputs and its final norm, and the column-parallel 2h -> h projection (the
    embedding and the LM head are the model's own)."""
    h = model.hidden_size
    return norm_weights(model, 3 * h) + 2 * h * (h // tp)


def mtp_module_params(model: ModelSpec, active: bool = False) -> int:
    """Parameters of the model's multi-token-prediction modules (whole, each a layer of the last
    layer's kind; `active`: top-k of its routed experts)."""
    if not model.mtp_layers:
        return 0
    dense = not model.is_moe
    layer = active_layer_params(model, dense) if active else layer_params(model, dense=dense).total
    return model.mtp_layers * (layer + mtp_params(model))


def total_params(model: ModelSpec) -> int:
    """Parameter count of the whole model (each tensor once), its multi-token-prediction
    modules included (DeepSeek-V3's published 671B is its main model: total_params less
    mtp_module_params)."""
    main = (
        over_layers(model, lambda dense: layer_params(model, dense=dense).total)
        + embedding_params(model)
        + head_params(model)
    )
    return main + mtp_module_params(model)


def active_layer_params(model: ModelSpec, dense: bool = False) -> int:
    """Parameters of one layer a token passes through: a MoE layer's router, shared experts and
    top-k routed experts instead of all of them."""
    p = layer_params(model, dense=dense)
    if not p.expert:
        return p.total
    assert model.num_experts is not None and model.experts_per_token is not None  # routed experts: a MoE layer
    return p.total - p.expert + model.experts_per_token * (p.expert // model.num_experts)


def active_params(model: ModelSpec) -> int:
    """Parameters one token passes through (equal to total_params for a dense model)."""
    return (
        over_layers(model, lambda dense: active_layer_params(model, dense))
        + embedding_params(model)
        + head_params(model)
        + mtp_module_params(model, active=True)
    )


# --------------------------------------------------------------------------- FLOPs


def active_ffn(model: ModelSpec, dense: bool = False) -> int:
    """MLP width a token passes through: the dense width, or (top-k + shared) x expert width."""
    if not model.is_moe or dense:
        return model.ffn
    return (model.experts_per_token + model.num_shared_experts) * model.moe_ffn


def layer_flops_forward(model: ModelSpec, micro_batch: int, seq_len: int, dense: bool = False) -> float:
    """Forward FLOPs of one layer, whole (unsharded): 2 x tokens x matmul weights + 4 b s^2 h.

    For a GPT layer (f = 4h, MHA) this is 24 b s h^2 + 4 b s^2 h (Narayanan et al. 2021). A MoE
    layer counts the weights a token passes through (active parameters: router, shared and
    top-k experts), the convention of MoE MFU figures (e.g. DeepSeek-V3's 37B active).
    """
    tokens = micro_batch * seq_len
    h, f = model.hidden_size, active_ffn(model, dense)
    mlp_in = mlp_inputs(model)
    matmul_weights = sum(i * o for i, o, _ in attention_linears(model)) + (mlp_in + 1) * h * f
    if model.is_moe and not dense:
        matmul_weights += h * model.num_experts  # router
    return 2.0 * tokens * matmul_weights + attention_flops_forward(model, micro_batch, seq_len)


def attention_flops_forward(model: ModelSpec, micro_batch: int, seq_len: int) -> float:
    """QK^T and AV: 2 b s^2 a (d_qk + d_v) (4 b s^2 h when a d = h; MLA's query/key heads are
    wider than its value heads), counted without causal masking (the usual convention), times
    the share of query-key pairs that sliding windows leave (attention_pairs_fraction)."""
    width = model.q_width + model.out_width
    return 2.0 * micro_batch * seq_len * seq_len * width * attention_pairs_fraction(model, seq_len)


def attention_pairs_fraction(model: ModelSpec, seq_len: int) -> float:
    """Share of causal attention's query-key pairs the model's layers compute, averaged over
    layers. Query i of a sliding-window layer attends to min(i, w) keys: w(w + 1)/2 + (s - w) w
    pairs instead of s(s + 1)/2 once s > w (Beltagy et al. 2020, Longformer sec. 3.1; Jiang et
    al. 2023, Mistral 7B sec. 2). The average stands for every layer: a pipeline stage holding
    more full-attention layers than its share (Gemma 3: 1 in 6) does more of it."""
    w, s = model.sliding_window, seq_len
    if w is None or s <= w:
        return 1.0
    windowed = (w * (w + 1) / 2 + (s - w) * w) / (s * (s + 1) / 2)
    return 1.0 - model.sliding_window_layers / model.num_layers * (1.0 - windowed)


def head_flops_forward(model: ModelSpec, micro_batch: int, seq_len: int) -> float:
    """LM head projection: 2 b s h V."""
    return 2.0 * micro_batch * seq_len * model.hidden_size * model.vocab_size


def model_flops_per_step(model: ModelSpec, global_batch: int, seq_len: int) -> float:
    """Model FLOPs of one step, no recompute: 3 x forward (Korthikanti et al.:
    72 B L s h^2 (1 + s/(6h) + V/(12 h L)) for GPT layers)."""
    fwd = over_layers(model, lambda dense: layer_flops_forward(model, 1, seq_len, dense)) + head_flops_forward(
        model, 1, seq_len
    )
    # each multi-token-prediction module: its 2h -> h projection, its layer, the LM head again
    h = model.hidden_size
    fwd += model.mtp_layers * (
        2.0 * seq_len * 2 * h * h
        + layer_flops_forward(model, 1, seq_len, not model.is_moe)
        + head_flops_forward(model, 1, seq_len)
    )
    return 3.0 * global_batch * fwd


# --------------------------------------------------------------------------- time


def matmul_efficiency(device: DeviceSpec, flops: float) -> float:
    """Achieved fraction of peak for one GEMM of `flops`, interpolated in log10(FLOPs)."""
    pts = device.matmul_efficiency
    assert pts is not None  # called where the device has no `gemm` model, so a curve (DeviceSpec's validator)
    if flops <= pts[0].gemm_flops:
        return pts[0].efficiency
    if flops >= pts[-1].gemm_flops:
        return pts[-1].efficiency
    xs = [p.gemm_flops for p in pts]
    i = bisect_left(xs, flops)
    lo, hi = pts[i - 1], pts[i]
    w = (math.log10(flops) - math.log10(lo.gemm_flops)) / (math.log10(hi.gemm_flops) - math.log10(lo.gemm_flops))
    return lo.efficiency + w * (hi.efficiency - lo.efficiency)


def gemm_time(device: DeviceSpec, dtype: DType, flops: float) -> float:
    """Seconds for one GEMM (or batched GEMM) of `flops` at the size-dependent efficiency of
    the device's measured curve (profiles from `plan profile`, which time square GEMMs)."""
    if flops <= 0:
        return 0.0
    peak = device.peak_tflops[dtype] * 1e12 * device.sustained_fraction
    return flops / (peak * matmul_efficiency(device, flops))


def gemm_shape_time(
    device: DeviceSpec, dtype: DType, m: float, n: float, k: float, batch: int = 1, fp8: bool = False
) -> float:
    """Seconds for `batch` GEMMs of an (m x k) by (k x n) matrix.

    With a shape model (DeviceSpec.gemm): the output is cut in tiles spread over the SMs in
    waves; a wave streams k (plus a fixed per-tile prologue/epilogue) at the best achievable
    rate, the last wave is partly idle, and a GEMM is never faster than reading its operands
    and writing its result once. Time is nondecreasing in m, n and k, and efficiency
    (FLOPs / time) nondecreasing too: a larger GEMM of the same family never runs slower
    per FLOP. Without one: the measured efficiency-by-FLOPs curve."""
    flops = 2.0 * m * n * k * batch
    if flops <= 0:
        return 0.0
    g = device.gemm
    if fp8:
        if device.fp8_peak_tflops is None or g is None or g.fp8_max_efficiency is None:
            raise ValueError(f"{device.name} has no FP8 GEMM figures (fp8_peak_tflops, gemm.fp8_max_efficiency)")
        rate = device.fp8_peak_tflops * 1e12 * g.fp8_max_efficiency * device.sustained_fraction
        operands = 1.0 * batch * (m * k + k * n) + DTYPE_BYTES[dtype] * batch * m * n  # FP8 in, 16-bit out
    elif g is None:
        return gemm_time(device, dtype, flops)
    else:
        rate = device.peak_tflops[dtype] * 1e12 * g.max_efficiency * device.sustained_fraction
        operands = DTYPE_BYTES[dtype] * batch * (m * k + k * n + m * n)
    tiles = batch * (max(m, g.tile_m) / g.tile_m) * (max(n, g.tile_n) / g.tile_n)
    waves = max(1.0, tiles / g.sm_count + g.wave_tail)
    wave_s = 2.0 * g.tile_m * g.tile_n * (k + g.k_overhead) * g.sm_count / rate
    return max(waves * wave_s, memory_bound_time(device, operands))


def linear_times(
    device: DeviceSpec, dtype: DType, tokens: float, n_in: float, n_out: float, batch: int = 1, fp8: bool = False
) -> tuple[float, float]:
    """(forward, backward) of a linear layer on `tokens` rows: Y = X W is one GEMM
    (tokens, n_out, n_in); backward is the input gradient (tokens, n_in, n_out) and the weight
    gradient (n_in, n_out, tokens). `batch` such layers side by side (grouped experts).

    FP8 (Transformer Engine's recipe): all three GEMMs in FP8, plus what the casts add: the
    FP8 copy of the input (and of the output gradient in backward) is written by the kernel
    before it (Transformer Engine fuses the cast into the norm, the activation and the GEMM
    epilogue), with a transposed FP8 copy for the weight gradient: 2 bytes written per
    element; the weights' FP8 copies are cast once per step and kept (not per micro-batch)."""
    fwd = gemm_shape_time(device, dtype, tokens, n_out, n_in, batch, fp8)
    bwd = gemm_shape_time(device, dtype, tokens, n_in, n_out, batch, fp8) + gemm_shape_time(
        device, dtype, n_in, n_out, tokens, batch, fp8
    )
    if fp8:
        fwd += memory_bound_time(device, batch * tokens * n_in * 2)  # FP8 copy + transposed copy
        bwd += memory_bound_time(device, batch * tokens * n_out * 2)
    return fwd, bwd


def routed_tokens(model: ModelSpec, micro_batch: int, seq_len: int, tp: int) -> float:
    """Token-expert assignments one GPU computes per MoE layer and micro-batch: its sequence
    shard (b s / tp with sequence parallelism; b s at tp 1) times top-k, whatever ep is: with
    balanced routing (every expert receives the same share, the assumption stated) the ep
    ranks of a group send each other equal numbers of tokens."""
    assert model.experts_per_token is not None  # a MoE model's (ModelSpec._shapes)
    return micro_batch * seq_len / tp * model.experts_per_token


def mlp_kernels(model: ModelSpec, k) -> tuple[int, int]:
    """(GEMMs, activation kernels) of one MLP as a stack's code launches it (a dense layer's, or
    one expert's): gate and up fused into fc1 or apart, then down; the activation (and a clamped
    GLU's clamps before it)."""
    gemms = (3 if k.separate_gate_up else 2) if model.gated else 2
    clamp = k.glu_clamp if model.glu_limit is not None else 0
    return gemms, (k.gated_activation + clamp) if model.gated else k.activation


def glu_clamp_bytes(model: ModelSpec, k, tokens: float, f: int, e: int) -> float:
    """Forward bytes of a clamped GLU's clamps (ModelSpec.glu_limit) over `tokens` rows of a
    half `f` wide, as the stack `k` launches them; 0 without a clamp."""
    return k.glu_clamp_passes * tokens * f * e if model.glu_limit is not None else 0.0


def rotary_scaled_by_stack(model: ModelSpec, k) -> bool:
    """The rotary embedding carries an attention factor the stack's fused kernel cannot apply
    (ModelSpec.rope_attention_factor; Kernels.scaled_rotary): it rotates in eager operators.
    Not under MLA: Megatron-Core's YaRN embedding for it folds the factor into its cos and sin
    cache and its fused MLA RoPE kernels apply them (yarn_rotary_pos_embedding.py)."""
    return (
        model.rope_attention_factor != 1.0
        and not model.learned_position_embeddings
        and not model.mla
        and k.scaled_rotary > 0
    )


def separate_norms(model: ModelSpec, k, dense: bool = False) -> int:
    """Norms of one layer that run as kernels of their own before a linear layer, which keeps
    their output for its weight gradient (what Plan.recompute_norm_act discards and reruns):
    both, where the stack runs norms apart; where it fuses them into the linear layers after
    them (Kernels.norm_in_linear), a MoE layer's pre-MLP norm (the router and the dispatch read
    its output) and multi-head latent attention's input norm (its down-projections are plain
    linears). Gemma's post-norms feed residual adds, not linear layers: not counted."""
    if not k.norm_in_linear:
        return 2
    return int(model.mla) + int(model.is_moe and not dense)


def norm_act_recompute_time(
    model: ModelSpec,
    device: DeviceSpec,
    dtype: DType,
    micro_batch: int,
    seq_len: int,
    tp: int,
    sequence_parallel: bool,
    k,
    ep: int = 1,
    dense: bool = False,
) -> float:
    """Seconds Plan.recompute_norm_act adds to one layer's backward per micro-batch: the forward
    of its separate norms (separate_norms: read and write this rank's rows) and, in a MoE layer,
    of the routed experts' activation (read the fc1 output, write the activation's: as
    expert_times counts it, a clamped GLU's clamps with it), with a gap per kernel launched."""
    e, h = DTYPE_BYTES[dtype], model.hidden_size
    rows = micro_batch * seq_len / (tp if sequence_parallel else 1)
    n = separate_norms(model, k, dense)
    nbytes = n * 2 * rows * h * e
    launched = n * (k.rmsnorm if model.norm == "rmsnorm" else k.layernorm)
    if model.is_moe and not dense:
        assert model.num_experts is not None  # model.is_moe
        assigned, f = routed_tokens(model, micro_batch, seq_len, tp), model.moe_ffn
        nbytes += (mlp_inputs(model) + 1) * assigned * f * e + glu_clamp_bytes(model, k, assigned, f, e)
        act = mlp_kernels(model, k)[1]
        launched += act * (model.num_experts // ep if k.experts == "loop" else 1)
    return memory_bound_time(device, nbytes) + kernels_time(device, launched)


def moe_kernels(model: ModelSpec, k, local: int) -> int:
    """Kernels one MoE layer's router, dispatch, combine and `local` routed experts launch in
    forward, as a stack's code launches them (planner/stacks/stack.py:Kernels): grouped, the
    experts' GEMMs (gate and up fused or not, then down) and their activation once for all;
    one GEMM per local expert and projection with one activation kernel (a grouped linear
    layer looping over cuBLAS); or each expert's MLP on its own. Biased experts whose bias is
    added outside the GEMM add `expert_bias` per local expert."""
    gemms, act = mlp_kernels(model, k)
    experts = {"grouped": gemms + act, "gemm_per_expert": local * gemms + act, "loop": local * (gemms + act)}[k.experts]
    return k.moe_dispatch + experts + local * (k.expert_extra + (k.expert_bias if model.linear_bias else 0))


def expert_times(
    model: ModelSpec,
    device: DeviceSpec,
    dtype: DType,
    micro_batch: int,
    seq_len: int,
    tp: int,
    ep: int,
    kernels,
    fp8: bool = False,
) -> tuple:
    """(forward, backward, executed forward FLOPs) of one MoE layer's router and routed
    experts on one GPU: the router GEMM over its tokens, then E / ep experts as grouped GEMMs
    of (assignments / local experts) rows each, the activation, the token permutations
    around the dispatch and combine (memory-bound copies), and a gap per kernel the stack's
    MoE layer launches (`kernels`, a stack's Kernels: moe_kernels)."""
    h, f, e = model.hidden_size, model.moe_ffn, DTYPE_BYTES[dtype]
    assert model.num_experts is not None  # a MoE layer's
    local = model.num_experts // ep
    tokens = micro_batch * seq_len / tp
    assigned = routed_tokens(model, micro_batch, seq_len, tp)
    rows = assigned / local
    mlp_in = mlp_inputs(model)
    router = linear_times(device, dtype, tokens, h, model.num_experts)  # kept in 16 bits (routing precision)
    fc1 = linear_times(device, dtype, rows, h, mlp_in * f, local, fp8)
    fc2 = linear_times(device, dtype, rows, f, h, local, fp8)
    act_bytes = (mlp_in + 1) * assigned * f * e + glu_clamp_bytes(model, kernels, assigned, f, e)
    permute_bytes = 2 * (2 * assigned * h * e)  # dispatch and combine: read + write each
    t_mem = memory_bound_time(
        device, act_bytes + permute_bytes + 4 * tokens * model.num_experts
    )  # + fp32 router softmax
    # a biased expert's output bias added outside its GEMM: as many passes backward as forward
    t_bias = memory_bound_time(device, kernels.expert_bias_passes * assigned * h * e) if model.linear_bias else 0.0
    gap = kernels_time(device, moe_kernels(model, kernels, local))
    forward = router[0] + fc1[0] + fc2[0] + t_mem + t_bias + gap
    backward = router[1] + fc1[1] + fc2[1] + 2 * t_mem + t_bias + 2 * gap
    flops = 2.0 * (tokens * h * model.num_experts + assigned * (mlp_in + 1) * h * f)
    return forward, backward, flops


def loss_kernel(job) -> LossKernel:
    """The job's cross-entropy implementation: its own, else its target stack's."""
    return job.loss_kernel or stacks.get(job.target).loss_kernel


def attention_kernel(job) -> str:
    """The job's fused-attention kernel (the device table's entry): its own, else its target stack's."""
    return job.attention_kernel or stacks.get(job.target).attention_kernel


def attention_times(
    device: DeviceSpec,
    dtype: DType,
    b: int,
    heads: int,
    s: int,
    d: int,
    fused: bool,
    kernel: str = "flash2",
    dv: int | None = None,
) -> tuple[float, float]:
    """(forward, backward) of the core attention (QK^T, softmax, AV) of `heads` heads of
    query/key width d and value width dv (d when None), the softmax excluded when unfused
    (memory-bound, costed with the other element-wise kernels).

    Fused (FlashAttention): a causal kernel skips the masked half; forward at the device's
    fused-attention efficiency; backward executes 2.5x the forward FLOPs (it recomputes the
    scores: Dao 2023, FlashAttention-2, sec. 3) at its own efficiency. Unfused: two batched
    GEMMs (b x heads of (s, s, d) and (s, d, s)), backward twice each."""
    dv = d if dv is None else dv
    if fused:
        flops = 0.5 * 2.0 * b * heads * s * s * (d + dv)
        table = device.attention or {}
        att = table.get(kernel) or table.get("flash2")
        if att is None:  # no kernel table: attention costs what GEMMs of its FLOPs cost
            if device.matmul_efficiency is not None:  # on the measured curve (profiles)
                fwd = gemm_time(device, dtype, flops)
            else:  # the shape model: the unfused path's two batched GEMMs, half of them (causal)
                fwd = 0.5 * (
                    gemm_shape_time(device, dtype, s, s, d, b * heads)
                    + gemm_shape_time(device, dtype, s, dv, s, b * heads)
                )
            return fwd, 2.0 * fwd
        peak = device.peak_tflops[dtype] * 1e12 * device.sustained_fraction
        return flops / (peak * att.forward), 2.5 * flops / (peak * att.backward)
    batch = b * heads
    fwd = gemm_shape_time(device, dtype, s, s, d, batch) + gemm_shape_time(device, dtype, s, dv, s, batch)
    return fwd, 2.0 * fwd


def memory_bound_time(device: DeviceSpec, nbytes: float) -> float:
    """Seconds to stream `nbytes` through device memory at the achieved bandwidth."""
    return nbytes / (device.memory_bandwidth_gbps * 1e9 * device.memory_bandwidth_efficiency)


def kernels_time(device: DeviceSpec, kernels: float) -> float:
    """The gaps between `kernels` launched kernels of a training loop."""
    return kernels * device.kernel_overhead_us * 1e-6


def layer_kernels(model: ModelSpec, k, flash_attention: bool, mlp: bool = True) -> tuple[int, int]:
    """Kernels one layer launches in forward, (attention core, the rest), for a stack's
    per-operator counts `k` (planner/stacks/stack.py:Kernels). The core: the fused attention
    kernel, or two batched GEMMs around the softmax kernels (and the probabilities' dropout);
    the rest: the projections as GEMMs, the norms (2 or 4, and QK-norm's 2), rotary, the
    residual adds with their dropouts, the MLP's GEMMs and activation (`mlp` False: a MoE layer
    with no shared experts, whose experts expert_times counts), K/V repeats and output copies."""
    core = 1 if flash_attention else 2 + k.softmax + (1 if model.dropout else 0)
    norm = k.rmsnorm if model.norm == "rmsnorm" else k.layernorm
    gemms = len(attention_linears(model, fused_qkv=not k.separate_qkv))
    rest = model.norms_per_layer * norm + (2 * k.rmsnorm if model.qk_norm else 0)
    rest += (
        0 if model.learned_position_embeddings else k.scaled_rotary if rotary_scaled_by_stack(model, k) else k.rotary
    )
    if model.mla:  # the latents' norms; queries and keys concatenated from their rotary and other parts
        rest += (2 if model.q_lora_rank else 1) * norm + 2 * k.attention_out
    rest += 2 * (k.residual + (k.dropout if model.dropout else 0))
    rest += 2 * k.kv_repeat if model.kv_heads < model.num_heads else 0
    rest += k.attention_out
    if mlp:
        mlp_gemms, act = mlp_kernels(model, k)
        gemms, rest = gemms + mlp_gemms, rest + act
    return core, gemms + rest


@dataclass(frozen=True)
class LayerCompute:
    """Compute time of one layer, one micro-batch, one GPU (communication excluded)."""

    forward: float
    backward: float
    attention_core_forward: float  # QK^T, softmax, AV (and MLA's up-projections): what selective recompute reruns
    flops_forward: float  # executed per GPU (causal skipping of flash kernels included)


def layer_compute(
    model: ModelSpec, device: DeviceSpec, job: JobSpec, layout: Layout, dense: bool = False
) -> LayerCompute:
    """Forward/backward time of one transformer layer (`dense`: one of a MoE model's first dense
    layers) on one TP rank, operator by operator: four linear layers as GEMMs by shape (forward,
    input and weight gradients), the core attention (fused kernel or batched GEMMs), the
    memory-bound kernels at achieved memory bandwidth, and a gap per launched kernel. The job
    gives the precision, the sequence (a rank's s / cp tokens under context parallelism), the
    attention kernel and the stack; the layout its micro-batch, tp, sp, ep, cp and FP8."""
    dtype, micro_batch, seq_len, target = job.precision, layout.micro_batch_size, job.seq_len, job.target
    tp, sequence_parallel, flash_attention = layout.tp, layout.sequence_parallel, job.flash_attention
    ep, fp8, cp = layout.ep, layout.fp8, layout.cp
    moe = model.is_moe and not dense
    # A MoE layer's TP-sharded MLP is its shared experts (none: no dense MLP at all).
    b, s, h = micro_batch, seq_len, model.hidden_size
    d, dv = model.qk_head_dim, model.v_dim
    f = model.num_shared_experts * model.moe_ffn if moe else model.ffn
    T = b * s
    e = DTYPE_BYTES[dtype]
    heads = model.num_heads // tp
    kv_cols = 2 * d * kv_shard(model, tp)  # this rank's K and V (standard attention)
    mlp_in = mlp_inputs(model)
    # Norms/residuals/dropout (and MLA's duplicated down-projections) act on the full sequence
    # on every TP rank unless sequence parallelism shards them.
    rows = T / tp if sequence_parallel else T

    # Linear layers (column-parallel QKV and fc1, row-parallel output and fc2): (tokens, in, out).
    q = model.q_width // tp
    kernels = stacks.get(target).kernels  # as the stack launches them: fused QKV / gate+up or not
    assert kernels is not None  # Stack.__post_init__ fills a None with EAGER
    kinds = attention_linears(model, tp, not kernels.separate_qkv)
    local = rows if stacks.get(target).mla_local_down_projections else T  # MLA's down-projections' tokens on this rank
    attn = [(local if kind == "duplicated" else T, i, o) for i, o, kind in kinds]
    mlp_first = [(h, f // tp)] * mlp_in if kernels.separate_gate_up else [(h, mlp_in * f // tp)]
    shapes = attn + ([(T, i, o) for i, o in mlp_first + [(f // tp, h)]] if f else [])
    lin = [linear_times(device, dtype, t, n_in, n_out, fp8=fp8) for t, n_in, n_out in shapes]
    linear_flops = [2.0 * t * n_in * n_out for t, n_in, n_out in shapes]
    kernel = attention_kernel(job)  # the job's (JobSpec.attention_kernel), else the stack's
    attn_fwd, attn_bwd = attention_times(device, dtype, b, heads, s, d, flash_attention, kernel, dv)
    attn_exec = 2.0 * b * heads * s * s * (d + dv) * (0.5 if flash_attention else 1.0)
    # Context parallelism (`seq_len` is then a rank's s / cp tokens): its queries meet every
    # key of the sequence, cp blocks of the chunk's size (load-balanced causal chunks, so each
    # rank does 1/cp of the whole attention). Sliding windows: a fused kernel skips the tiles
    # outside the window (FlashAttention-2's local attention); unfused, every score is computed.
    kept = attention_pairs_fraction(model, s * cp) if flash_attention else 1.0
    attn_fwd, attn_bwd, attn_exec = attn_fwd * cp * kept, attn_bwd * cp * kept, attn_exec * cp * kept

    mem_bytes, rope_bytes = _memory_bound_bytes(model, job, layout, kernels, (rows, T, f, q, kv_cols, heads))
    softmax_bytes = 0.0
    if not flash_attention:
        scores = b * heads * s * s
        softmax_bytes = 2 * scores * e + (2 * scores * e + scores if model.dropout else 0.0)
    t_mem = memory_bound_time(device, mem_bytes)
    t_softmax = memory_bound_time(device, softmax_bytes)
    # Kernels launched in forward, as the stack's code launches them; backward about twice.
    core_kernels, other_kernels = layer_kernels(model, kernels, flash_attention, bool(f))
    core_gap, other_gap = kernels_time(device, core_kernels), kernels_time(device, other_kernels)
    core = attn_fwd + t_softmax + core_gap
    forward = sum(x[0] for x in lin) + t_mem + other_gap + core
    if model.mla:
        # What selective recompute reruns under MLA: the up-projections (the column-parallel
        # linears), their rotary and concatenation (Megatron-Core's recompute_modules
        # mla_up_proj), keeping the latents instead of Q, K and V; and the core attention only
        # where it is unfused (a fused kernel keeps no scores: Megatron-Core's own advice).
        up = sum(x[0] for x, (_, _, kind) in zip(lin, kinds) if kind == "column") + memory_bound_time(
            device, rope_bytes
        )
        core = up + (0.0 if flash_attention else core)
    backward = sum(x[1] for x in lin) + attn_bwd + 2.0 * (t_mem + t_softmax) + 2.0 * (core_gap + other_gap)
    flops = sum(linear_flops) + attn_exec
    if moe:
        x_fwd, x_bwd, x_flops = expert_times(model, device, dtype, b, s, tp, ep, kernels, fp8)
        forward, backward, flops = forward + x_fwd, backward + x_bwd, flops + x_flops
    return LayerCompute(
        forward=forward,
        backward=backward,
        attention_core_forward=core,
        flops_forward=flops,
    )


def _memory_bound_bytes(model: ModelSpec, job: JobSpec, layout: Layout, kernels, shape: tuple) -> tuple[float, float]:
    """Bytes a layer's memory-bound kernels move forward (norms, QK-norm, residuals, dropout,
    activation, rotary), and the rotary's alone (what MLA's selective recompute reruns).
    `shape`: the layer's rows of norms, tokens, MLP width, query and key/value columns and
    heads on this rank, as layer_compute counts them."""
    rows, T, f, q, kv_cols, heads = shape
    h, e, tp, mlp_in = model.hidden_size, DTYPE_BYTES[job.precision], layout.tp, mlp_inputs(model)
    norm_bytes = model.norms_per_layer * (2 * rows * h * e)  # each norm: read + write
    # QK-norm: this rank's queries and keys, read and written (head-sharded, not sequence-sharded)
    qk_norm_bytes = 2 * T * (q + kv_cols // 2) * e if model.qk_norm else 0.0
    residual_bytes = 2 * (3 * rows * h * e)  # two residual adds: read 2, write 1
    dropout_bytes = 2 * (2 * rows * h * e + rows * h) if model.dropout else 0.0  # + 1-byte mask
    act_bytes: float = (mlp_in + 1) * T * (f // tp) * e  # GELU: read+write; SwiGLU: read 2, write 1
    act_bytes += glu_clamp_bytes(model, kernels, T, f // tp, e)
    rope_passes = kernels.scaled_rotary_passes if rotary_scaled_by_stack(model, kernels) else 2  # fused: read, write
    rope_bytes = (
        0.0 if model.learned_position_embeddings else rope_passes * T * (q + kv_cols // 2) * e
    )  # queries and keys
    if model.mla:
        # the latents' norms; rotary on the queries' and the shared key's rope features, then
        # the queries and keys written whole from their parts (the shared key once per head)
        norm_bytes += 2 * rows * latent_norm_width(model) * e
        rope_bytes = rope_passes * T * (heads + 1) * model.qk_rope_head_dim * e + 2 * 2 * T * q * e
    return norm_bytes + qk_norm_bytes + residual_bytes + dropout_bytes + act_bytes + rope_bytes, rope_bytes


def embedding_forward_time(model: ModelSpec, device: DeviceSpec, dtype: DType, micro_batch: int, seq_len: int) -> float:
    """Embedding lookup (+ position add): memory-bound, writes b s h activations."""
    e = DTYPE_BYTES[dtype]
    rows = micro_batch * seq_len
    nbytes = rows * model.hidden_size * e * (3 if model.learned_position_embeddings else 1)
    return memory_bound_time(device, nbytes)


def head_forward_time(
    model: ModelSpec, device: DeviceSpec, dtype: DType, micro_batch: int, seq_len: int, tp: int
) -> float:
    """Final norm, LM-head GEMM and cross-entropy (softmax over V/tp logits in fp32); with logit
    soft-capping, c tanh(logits / c) as three elementwise kernels (divide, tanh, multiply: the
    Hugging Face Gemma2ForCausalLM), each reading and writing the 16-bit logits."""
    T = micro_batch * seq_len
    e = DTYPE_BYTES[dtype]
    gemm = gemm_shape_time(device, dtype, T, vocab_shard(model, tp), model.hidden_size)
    logits = T * vocab_shard(model, tp)
    # write logits, read them as fp32 for log-softmax, write fp32 probabilities for backward
    loss_bytes = logits * (e + 4 + 4) + 4 * T * model.hidden_size * e
    softcap = 3 if model.logit_softcapping else 0
    loss_bytes += softcap * 2 * logits * e
    return gemm + memory_bound_time(device, loss_bytes) + kernels_time(device, 4 + softcap)
