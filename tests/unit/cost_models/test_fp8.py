"""FP8 GEMMs (Plan.fp8): where the device has them, GEMMs run at its FP8 rate with the FP8
copies the kernels before them write, linear inputs are kept in one byte, each weight keeps an
FP8 copy; the search may choose FP8 (`plan solve --fp8`) and finds the brute-force optimum;
a device without FP8 is refused in one line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cost_models import compute, memory
from cost_models.estimate import estimate
from hardware_profiles import load_cluster
from tests.unit.search.test_solver import assert_same_optimum, tiny_cluster
from planner.presets import load_model
from planner.search.candidates import SearchSpace
from planner.specs import Axis, DType, JobSpec, ModelSpec, Plan, Recompute

H100 = load_cluster("dgx-h100-80gb")


def test_large_gemm_runs_at_the_fp8_rate():
    """An 8192^3 GEMM: FP8 at 1,979 TFLOP/s x 0.779 against bf16 at 989 x 0.823 (the presets'
    datasheet peaks and best measured GEMMs), both times the fitted sustained fraction."""
    dev = H100.device
    n = 16384
    t16 = compute.gemm_shape_time(dev, DType.bf16, n, n, n)
    t8 = compute.gemm_shape_time(dev, DType.bf16, n, n, n, fp8=True)
    flops = 2.0 * n**3
    assert t8 == pytest.approx(flops / (1979e12 * 0.779 * dev.sustained_fraction) * (1 + 64 / n), rel=0.02)
    assert t16 / t8 == pytest.approx((1979 * 0.779) / (989 * dev.gemm.max_efficiency), rel=0.02)


def test_a_linear_layer_pays_its_casts():
    dev, T, a, b = H100.device, 8192, 4096, 4096
    f8, b8 = compute.linear_times(dev, DType.bf16, T, a, b, fp8=True)
    g = [compute.gemm_shape_time(dev, DType.bf16, *s, fp8=True) for s in ((T, b, a), (T, a, b), (a, b, T))]
    assert f8 == pytest.approx(g[0] + compute.memory_bound_time(dev, T * a * 2), rel=1e-12)
    assert b8 == pytest.approx(g[1] + g[2] + compute.memory_bound_time(dev, T * b * 2), rel=1e-12)


def test_linear_inputs_are_kept_in_one_byte():
    """Without recompute a Llama layer keeps QKV and fc1 inputs (2 s b h / t with SP), the output
    projection's (s b h / t) and fc2's (s b f / t): each one byte instead of two under FP8."""
    m = load_model("llama3-8b")
    b, s, t = 1, 4096, 2
    full = memory.layer_activation_bytes(m, b, s, t, True, Recompute.none, True, DType.bf16)
    f8 = memory.layer_activation_bytes(m, b, s, t, True, Recompute.none, True, DType.bf16, fp8=True)
    h, f = m.hidden_size, m.ffn
    assert full - f8 == pytest.approx(2 * s * b * h / t + s * b * h / t + s * b * f / t)


def test_weights_keep_an_fp8_copy():
    m = load_model("llama3-8b")
    job = JobSpec(global_batch_size=64, seq_len=4096)
    plan = Plan(dp=8, tp=1, pp=1, micro_batch_size=1, num_micro_batches=8)
    a = estimate(m, H100, job, plan).memory_gib_per_pipeline_rank[0]
    b = estimate(m, H100, job, plan.model_copy(update={"fp8": True})).memory_gib_per_pipeline_rank[0]
    params = compute.total_params(m)
    assert b.weights - a.weights == pytest.approx(params / 2**30, rel=1e-9)
    assert b.activations < a.activations


SMALL = ModelSpec(
    name="small",
    num_layers=4,
    hidden_size=2048,
    num_heads=16,
    vocab_size=32000,
    max_seq_len=4096,
    activation="swiglu",
    learned_position_embeddings=False,
    linear_bias=False,
    norm="rmsnorm",
    dropout=False,
)


@pytest.mark.slow
@pytest.mark.parametrize("memory_gib", [80, 1.2])
def test_fp8_choice_matches_brute_force(memory_gib):
    """The search over FP8 or not (with every split and recompute) finds the brute-force optimum;
    with room, FP8's faster GEMMs win; tight, its weight copies may not fit."""
    job = JobSpec(global_batch_size=4, seq_len=4096)
    space = SearchSpace(
        num_gpus=2, global_batch_size=4, fp8=(False, True), fixed={"mesh_order": (Axis.tp, Axis.dp, Axis.pp)}
    )
    res = assert_same_optimum(
        SMALL, tiny_cluster(memory_gib, overlap=H100.overlap_efficiency, preset="dgx-h100-80gb"), job, space
    )
    if memory_gib == 80:
        assert res.fastest.plan.fp8


@pytest.mark.slow
def test_fp8_on_a_device_without_it_is_one_line():
    for cmd in (["estimate", "--tp", "1", "--fp8"], ["solve", "--fp8"]):
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "planner.cli.main",
                *cmd,
                "--model",
                "llama3-8b",
                "--cluster",
                "dgx-a100-80gb",
                "--gpus",
                "8",
                "--global-batch",
                "64",
            ],
            capture_output=True,
            text=True,
        )
        assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and "FP8" in res.stderr
