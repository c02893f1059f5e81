"""planner/profiler/kernels.py: timings become the preset's kernel tables (GemmModel,
fused-attention efficiency, launch gap), and the cost model reads them like the presets'."""

import pytest

from cost_models import compute
from hardware_profiles import load_cluster
from planner.presets import load_model
from planner.profiler import kernels
from planner.specs import DType

torch = pytest.importorskip("torch")


def test_gemm_model_takes_the_best_large_gemm():
    peak = 989.0
    big = 2.0 * 8192**3
    points = [
        (2.0 * 1024**3, 2.0 * 1024**3 / (0.95 * peak * 1e12)),  # small: ignored even if it looks fast
        (big, big / (0.70 * peak * 1e12)),
        (big, big / (0.78 * peak * 1e12)),
    ]
    g = kernels.gemm_model(132, points, peak)
    assert g.sm_count == 132
    assert g.max_efficiency == pytest.approx(0.78, rel=1e-12)


def test_attention_efficiency_counts_the_backward_recompute():
    flops = kernels.attention_flops(2, 16, 4096, 128)
    assert flops == 4.0 * 2 * 16 * 4096**2 * 128 / 2  # causal: half the tiles
    eff = kernels.attention_efficiency(flops, forward_s=flops / (0.5 * 312e12), backward_s=2.5 * flops / (0.4 * 312e12), peak_tflops=312)
    assert eff.forward == pytest.approx(0.5) and eff.backward == pytest.approx(0.4)


def test_launch_gap():
    assert kernels.launch_gap_us(2000, 0.01) == pytest.approx(5.0)


def test_measured_tables_feed_the_cost_model():
    """A device whose measured attention runs at half the preset's efficiency takes longer per
    layer by exactly the attention's extra time; a lower measured GEMM ceiling slows GEMMs."""
    dev = load_cluster("dgx-h100-80gb").device
    model = load_model("llama3-8b")
    base = compute.layer_compute(model, dev, DType.bf16, 1, 4096, 1, False, True)
    slow_att = {k: v.model_copy(update={"forward": v.forward / 2, "backward": v.backward / 2}) for k, v in dev.attention.items()}
    slow = compute.layer_compute(model, dev.model_copy(update={"attention": slow_att}), DType.bf16, 1, 4096, 1, False, True)
    f0, b0 = compute.attention_times(dev, DType.bf16, 1, model.num_heads, 4096, model.head_dim, True)
    assert slow.forward - base.forward == pytest.approx(f0, rel=1e-9)
    assert slow.backward - base.backward == pytest.approx(b0, rel=1e-9)
    lower = dev.model_copy(update={"gemm": dev.gemm.model_copy(update={"max_efficiency": dev.gemm.max_efficiency / 2})})
    assert compute.layer_compute(model, lower, DType.bf16, 1, 4096, 1, False, True).forward > base.forward


def test_measurements_run_on_cpu():
    """The timing code itself, on small CPU shapes: positive times, tables a DeviceSpec accepts."""
    torch.set_num_threads(1)
    flops, fwd, bwd = kernels.measure_attention(torch, "cpu", torch.float32, 3, lambda: None, heads=2, seq=128, head_dim=16)
    assert flops > 0 and fwd > 0 and bwd > 0
    gap = kernels.measure_launch_gap(torch, "cpu", 3, lambda: None, kernels=200)
    assert 0 < gap < 1e4
    tables = kernels.device_tables(torch, "cpu", torch.float32, 3, lambda: None, [(2e9, 0.1)], peak_tflops=1.0, sm_count=None)
    assert set(tables) == {"kernel_overhead_us"}
    dev = load_cluster("dgx-a100-80gb").device
    fake = kernels.gemm_model(108, [(2e9, 0.1)], 1.0)
    dev.model_validate({**dev.model_dump(), "gemm": fake.model_dump(), "kernel_overhead_us": gap})
