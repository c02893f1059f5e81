"""Parameters, FLOPs and compute time of transformer layers.

Counts follow Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM", eq. 2-3) and Korthikanti et al. 2022 ("Reducing Activation
Recomputation in Large Transformer Models", appendix): a GEMM of an (m x k) by (k x n)
matrix costs 2mkn FLOPs, backward costs twice the forward (input and weight gradients),
and attention (QK^T and AV) costs 4 b s^2 h in forward, counted without causal masking.
Generalised here to grouped-query attention and SwiGLU.

Times: a GEMM runs at peak x efficiency(its FLOPs) (the device's measured curve); norms,
activations, residual adds, dropout and unfused softmax are memory-bound and cost bytes
moved / achieved memory bandwidth.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass

from planner.specs import DTYPE_BYTES, Activation, DeviceSpec, DType, ModelSpec

# --------------------------------------------------------------------------- parameters


@dataclass(frozen=True)
class LayerParams:
    """Parameters of one transformer layer on one tensor-parallel rank."""

    sharded: int  # split over the TP group (weights of column/row-parallel linears, column biases)
    replicated: int  # copied on every TP rank (norms, row-parallel biases)

    @property
    def total(self) -> int:
        return self.sharded + self.replicated


def kv_shard(model: ModelSpec, tp: int) -> int:
    """KV heads on one TP rank: split while tp <= kv heads, replicated beyond (GQA)."""
    return max(1, model.kv_heads // tp)


def layer_params(model: ModelSpec, tp: int = 1) -> LayerParams:
    """Parameters of one layer per TP rank. With tp=1 and a GPT layer: 12h^2 + 13h (Narayanan eq. 2)."""
    h, d, f = model.hidden_size, model.head_dim, model.ffn
    q_cols = h // tp
    kv_cols = 2 * d * kv_shard(model, tp)
    mlp_in = 2 if model.activation == Activation.swiglu else 1
    sharded = h * (q_cols + kv_cols) + q_cols * h + mlp_in * h * (f // tp) + (f // tp) * h
    replicated = 0
    if model.linear_bias:
        sharded += q_cols + kv_cols + mlp_in * (f // tp)  # column-parallel biases
        replicated += 2 * h  # row-parallel biases (attention output, fc2)
    norm_params = 2 * h if model.norm == "layernorm" else h
    replicated += 2 * norm_params
    return LayerParams(sharded, replicated)


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
    norm = 2 * model.hidden_size if model.norm == "layernorm" else model.hidden_size
    if model.tied_embeddings and pipeline_stages == 1:
        return norm
    return norm + vocab_shard(model, tp) * model.hidden_size


def total_params(model: ModelSpec) -> int:
    """Parameter count of the whole model (each tensor once)."""
    return model.num_layers * layer_params(model).total + embedding_params(model) + head_params(model)


# --------------------------------------------------------------------------- FLOPs


def layer_flops_forward(model: ModelSpec, micro_batch: int, seq_len: int) -> float:
    """Forward FLOPs of one layer, whole (unsharded): 2 x tokens x matmul weights + 4 b s^2 h.

    For a GPT layer (f = 4h, MHA) this is 24 b s h^2 + 4 b s^2 h (Narayanan et al. 2021).
    """
    tokens = micro_batch * seq_len
    h, f, d = model.hidden_size, model.ffn, model.head_dim
    mlp_in = 2 if model.activation == Activation.swiglu else 1
    matmul_weights = 2 * h * h + 2 * h * d * model.kv_heads + (mlp_in + 1) * h * f
    return 2.0 * tokens * matmul_weights + attention_flops_forward(model, micro_batch, seq_len)


def attention_flops_forward(model: ModelSpec, micro_batch: int, seq_len: int) -> float:
    """QK^T and AV: 2 x (2 b s^2 h), counted without causal masking (the usual convention)."""
    return 4.0 * micro_batch * seq_len * seq_len * model.hidden_size


def head_flops_forward(model: ModelSpec, micro_batch: int, seq_len: int) -> float:
    """LM head projection: 2 b s h V."""
    return 2.0 * micro_batch * seq_len * model.hidden_size * model.vocab_size


def model_flops_per_step(model: ModelSpec, global_batch: int, seq_len: int) -> float:
    """Model FLOPs of one step, no recompute: 3 x forward (Korthikanti et al.:
    72 B L s h^2 (1 + s/(6h) + V/(12 h L)) for GPT layers)."""
    fwd = model.num_layers * layer_flops_forward(model, 1, seq_len) + head_flops_forward(model, 1, seq_len)
    return 3.0 * global_batch * fwd


# --------------------------------------------------------------------------- time


def matmul_efficiency(device: DeviceSpec, flops: float) -> float:
    """Achieved fraction of peak for one GEMM of `flops`, interpolated in log10(FLOPs)."""
    pts = device.matmul_efficiency
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
    """Seconds for one GEMM (or batched GEMM) of `flops` at the size-dependent efficiency."""
    if flops <= 0:
        return 0.0
    peak = device.peak_tflops[dtype] * 1e12
    return flops / (peak * matmul_efficiency(device, flops))


def memory_bound_time(device: DeviceSpec, nbytes: float) -> float:
    """Seconds to stream `nbytes` through device memory at the achieved bandwidth."""
    return nbytes / (device.memory_bandwidth_gbps * 1e9 * device.memory_bandwidth_efficiency)


@dataclass(frozen=True)
class LayerCompute:
    """Compute time of one layer, one micro-batch, one GPU (communication excluded)."""

    forward: float
    backward: float
    attention_core_forward: float  # QK^T, softmax, AV: what selective recompute reruns
    flops_forward: float  # executed per GPU (causal skipping of flash kernels included)


def layer_compute(
    model: ModelSpec,
    device: DeviceSpec,
    dtype: DType,
    micro_batch: int,
    seq_len: int,
    tp: int,
    sequence_parallel: bool,
    flash_attention: bool,
) -> LayerCompute:
    """Forward/backward time of one transformer layer on one TP rank."""
    b, s, h, f, d = micro_batch, seq_len, model.hidden_size, model.ffn, model.head_dim
    T = b * s
    e = DTYPE_BYTES[dtype]
    heads = model.num_heads // tp
    kv_cols = 2 * d * kv_shard(model, tp)
    mlp_in = 2 if model.activation == Activation.swiglu else 1

    # GEMMs, forward (each backward GEMM pair costs twice the forward one).
    linear = [
        2.0 * T * h * (h // tp + kv_cols),  # fused QKV projection (column parallel)
        2.0 * T * (h // tp) * h,  # attention output projection (row parallel)
        2.0 * T * h * (mlp_in * f // tp),  # fc1 (and gate for SwiGLU)
        2.0 * T * (f // tp) * h,  # fc2
    ]
    # Attention: batched over b x heads. A fused causal kernel skips the masked half.
    attn_flops = 4.0 * b * heads * s * s * d
    attn_exec = attn_flops * (0.5 if flash_attention else 1.0)
    t_linear = sum(gemm_time(device, dtype, fl) for fl in linear)
    t_attn = gemm_time(device, dtype, attn_exec)

    # Memory-bound kernels, forward bytes. Norms/residuals/dropout act on the full sequence on
    # every TP rank unless sequence parallelism shards them.
    rows = T / tp if sequence_parallel else T
    norm_bytes = 2 * (2 * rows * h * e)  # two norms: read + write
    residual_bytes = 2 * (3 * rows * h * e)  # two residual adds: read 2, write 1
    dropout_bytes = 2 * (2 * rows * h * e + rows * h) if model.dropout else 0.0  # + 1-byte mask
    act_bytes = (mlp_in + 1) * T * (f // tp) * e  # GELU: read+write; SwiGLU: read 2, write 1
    rope_bytes = 0.0 if model.learned_position_embeddings else 2 * T * (h // tp + kv_cols) * e
    softmax_bytes = 0.0
    if not flash_attention:
        scores = b * heads * s * s
        softmax_bytes = 2 * scores * e + (2 * scores * e + scores if model.dropout else 0.0)
    t_mem = memory_bound_time(device, norm_bytes + residual_bytes + dropout_bytes + act_bytes + rope_bytes)
    t_softmax = memory_bound_time(device, softmax_bytes)

    forward = t_linear + t_attn + t_mem + t_softmax
    backward = 2.0 * forward
    return LayerCompute(
        forward=forward,
        backward=backward,
        attention_core_forward=t_attn + t_softmax,
        flops_forward=sum(linear) + attn_exec,
    )


def embedding_forward_time(model: ModelSpec, device: DeviceSpec, dtype: DType, micro_batch: int, seq_len: int) -> float:
    """Embedding lookup (+ position add): memory-bound, writes b s h activations."""
    e = DTYPE_BYTES[dtype]
    rows = micro_batch * seq_len
    nbytes = rows * model.hidden_size * e * (3 if model.learned_position_embeddings else 1)
    return memory_bound_time(device, nbytes)


def head_forward_time(model: ModelSpec, device: DeviceSpec, dtype: DType, micro_batch: int, seq_len: int, tp: int) -> float:
    """Final norm, LM-head GEMM and cross-entropy (softmax over V/tp logits in fp32)."""
    T = micro_batch * seq_len
    e = DTYPE_BYTES[dtype]
    gemm = gemm_time(device, dtype, 2.0 * T * model.hidden_size * vocab_shard(model, tp))
    logits = T * vocab_shard(model, tp)
    # write logits, read them as fp32 for log-softmax, write fp32 probabilities for backward
    loss_bytes = logits * (e + 4 + 4) + 4 * T * model.hidden_size * e
    return gemm + memory_bound_time(device, loss_bytes)
