"""The interval widens where a plan leaves the calibrated region (Uncertainty.widening): by
1 + extrapolation x log2(n / largest) per dimension beyond it, compounded, and the estimate says
which widening applied."""

import math

import pytest

from cost_models.estimate import estimate
from hardware_profiles import load_cluster
from planner.presets import load_model
from planner.specs import JobSpec, Plan, Uncertainty

U = Uncertainty(relative=0.1, coverage=0.8, compute=0.08, communication=0.5, calibrated_gpus=512, calibrated_shard=256)


def test_inside_the_region_nothing_widens():
    assert U.widening(512, 256) == (1.0, [])
    assert U.widening(64, 0) == (1.0, [])


def test_each_doubling_beyond_adds_the_extrapolation():
    factor, why = U.widening(2048, 0)  # two doublings past 512 GPUs
    assert factor == pytest.approx(1 + 0.5 * 2)
    assert len(why) == 1 and "2,048 GPUs" in why[0] and "512" in why[0] and "x2.00" in why[0]


def test_both_dimensions_compound():
    factor, why = U.widening(1024, 1024)
    assert factor == pytest.approx((1 + 0.5 * 1) * (1 + 0.5 * 2))
    assert len(why) == 2 and "shard group" in why[1]


def test_a_stated_reason_is_always_said():
    u = U.model_copy(update={"widened_for": "no published run on B200"})
    assert u.widening(8, 0) == (1.0, ["no published run on B200"])


def test_no_region_no_widening():
    u = Uncertainty(relative=0.1, coverage=0.8)
    assert u.widening(100_000, 100_000) == (1.0, [])


def test_the_estimate_widens_its_interval_and_says_why():
    """The same plan on a cluster whose interval was calibrated up to 64 GPUs: on 256 GPUs the log
    half-width is (1 + 0.5 log2 4) = 2x that of the calibrated interval."""
    base = load_cluster("dgx-h100-80gb")
    u = Uncertainty(relative=0.1, coverage=0.8, compute=0.08, communication=0.5)
    model, job = load_model("llama3-8b"), JobSpec(global_batch_size=256, seq_len=4096)
    plan = Plan(dp=256, tp=1, pp=1, micro_batch_size=1, num_micro_batches=1, zero_stage=3)
    plain = estimate(model, base.model_copy(update={"uncertainty": u}), job, plan)
    region = u.model_copy(update={"calibrated_gpus": 64, "calibrated_shard": 256})
    wide = estimate(model, base.model_copy(update={"uncertainty": region}), job, plan)
    assert plain.interval_widened is None
    assert wide.interval_widened and "256 GPUs" in wide.interval_widened[0]
    half = math.log(plain.step_time_interval_s[1] / plain.step_time_s)
    assert math.log(wide.step_time_interval_s[1] / wide.step_time_s) == pytest.approx(2 * half, rel=1e-9)


def test_no_term_is_more_uncertain_than_the_step():
    """Far beyond the region the communication term's +/- would exceed the whole step's interval
    (x/ 2.9 widened 5x): it is capped at the interval's upper width."""
    base = load_cluster("dgx-h100-80gb")
    u = Uncertainty(relative=1.9, coverage=0.8, compute=0.1, communication=1.9, calibrated_gpus=64, calibrated_shard=64)
    model, job = load_model("llama3-8b"), JobSpec(global_batch_size=2048, seq_len=4096)
    plan = Plan(dp=2048, tp=1, pp=1, micro_batch_size=1, num_micro_batches=1, zero_stage=3)
    est = estimate(model, base.model_copy(update={"uncertainty": u}), job, plan)
    most = est.step_time_interval_s[1] - est.step_time_s
    spread = est.time_uncertainty_s.model_dump()
    assert max(spread.values()) == pytest.approx(most, rel=1e-9)
    assert all(v <= most * (1 + 1e-12) for v in spread.values())
