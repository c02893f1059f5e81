"""Kernel-level tables of a device, measured: what the shipped presets take from public data.

On a GPU, `plan profile` fills the same fields the presets carry (planner/specs/cluster.py:DeviceSpec):

- `gemm` (GemmModel): the SM count from the device, and `max_efficiency`, the best fraction of
  the datasheet peak any GEMM of the sweep reached (the presets take the MAMF table; here it is
  this device, this driver, this clock);
- `attention`: the fused kernel PyTorch's scaled_dot_product_attention dispatches to
  (FlashAttention-2 on A100/H100 with torch's default backends), forward and backward, causal,
  as the FLOPs it executes over peak x time;
- `kernel_overhead_us`: the time per kernel of a stream of tiny kernels, what a launch costs
  when the device is not the bottleneck;
- `memory_bandwidth_efficiency`: achieved copy bandwidth over the datasheet's.

The pure functions (`gemm_model`, `attention_efficiency`, ...) turn timings into those fields
and are tested on synthetic timings; the `measure_*` functions time the kernels and run on any
torch device (CPU included, where they only feed tests and the profile's own sanity checks).
"""

from __future__ import annotations

import time
from typing import Callable, Optional

from planner.specs import AttentionEfficiency, GemmModel

# A GEMM sweep point counts for max_efficiency only if it is large enough to fill the device
# (smaller ones measure launch and tile effects, which GemmModel models on its own).
MIN_GEMM_FLOPS = 2.0 * 4096**3


def gemm_model(sm_count: int, points: list[tuple[float, float]], peak_tflops: float) -> GemmModel:
    """GemmModel of a device from (flops, seconds) GEMM timings: the best large GEMM's
    fraction of peak is `max_efficiency`; tile shape, prologue and wave tail keep their
    defaults (they describe cuBLAS's kernels, not the device)."""
    big = [(f, s) for f, s in points if f >= MIN_GEMM_FLOPS and s > 0] or [(f, s) for f, s in points if s > 0]
    if not big:
        raise ValueError("no GEMM timing to fit")
    best = max(f / s for f, s in big) / (peak_tflops * 1e12)
    return GemmModel(sm_count=sm_count, max_efficiency=min(1.0, best))


def attention_flops(batch: int, heads: int, seq: int, head_dim: int, causal: bool = True) -> float:
    """FLOPs a fused attention forward executes: QK^T and AV, 4 b a s^2 d, half when causal
    (the kernel skips masked tiles)."""
    return 4.0 * batch * heads * seq * seq * head_dim * (0.5 if causal else 1.0)


def attention_efficiency(
    flops_forward: float, forward_s: float, backward_s: float, peak_tflops: float
) -> AttentionEfficiency:
    """Achieved fractions of peak; the backward executes 2.5x the forward's FLOPs (it
    recomputes the scores: FlashAttention-2, sec. 3), as cost_models/compute.py charges it."""
    peak = peak_tflops * 1e12
    return AttentionEfficiency(
        forward=min(1.0, flops_forward / (forward_s * peak)),
        backward=min(1.0, 2.5 * flops_forward / (backward_s * peak)),
    )


def launch_gap_us(kernels: int, seconds: float) -> float:
    """Microseconds per kernel of a stream of tiny kernels."""
    return 1e6 * seconds / kernels


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2]


def _time(fn: Callable[[], None], reps: int, sync: Callable[[], None]) -> float:
    fn()
    sync()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - t0)
    return _median(out)


def measure_attention(
    torch,
    device,
    dtype,
    reps: int,
    sync: Callable[[], None],
    batch: int = 1,
    heads: int = 16,
    seq: int = 4096,
    head_dim: int = 128,
) -> tuple[float, float, float]:
    """(forward FLOPs, forward s, backward s) of causal scaled_dot_product_attention."""
    import torch.nn.functional as F

    shape = (batch, heads, seq, head_dim)
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    grad = torch.randn_like(out)

    def fwd():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def fwd_bwd():
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        o.backward(grad)

    t_fwd = _time(fwd, reps, sync)
    t_both = _time(fwd_bwd, reps, sync)
    return attention_flops(batch, heads, seq, head_dim), t_fwd, max(t_both - t_fwd, 1e-9)


def measure_launch_gap(torch, device, reps: int, sync: Callable[[], None], kernels: int = 2000) -> float:
    """Microseconds per kernel of `kernels` back-to-back one-element adds."""
    x = torch.zeros(1, device=device)

    def run():
        for _ in range(kernels):
            x.add_(1.0)

    return launch_gap_us(kernels, _time(run, reps, sync))


def device_tables(
    torch,
    device,
    dtype,
    reps: int,
    sync: Callable[[], None],
    matmul: list[tuple[float, float]],
    peak_tflops: float,
    sm_count: Optional[int],
) -> dict:
    """The DeviceSpec fields this module measures, for a CUDA device (sm_count known)."""
    out: dict = {"kernel_overhead_us": measure_launch_gap(torch, device, reps, sync)}
    if sm_count:
        out["gemm"] = gemm_model(sm_count, matmul, peak_tflops)
        flops, t_fwd, t_bwd = measure_attention(torch, device, dtype, reps, sync)
        out["attention"] = {"flash2": attention_efficiency(flops, t_fwd, t_bwd, peak_tflops)}
    return out
