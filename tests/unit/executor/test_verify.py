"""`plan run`'s verifier (planner/executor/verify.py): tight where both sides hold the same
weights, the measured rounding drift later, per parameter and per pipeline rank. Both ways on
real runs (correct plans the previous fixed tolerance failed now pass, each injected error is
caught): tests/distributed/test_verify_runs.py."""

from __future__ import annotations

import math

import pytest

from planner.executor.verify import DEFAULT_TOLERANCE, SENSITIVITY, Trajectory, allowed, compare, relative_error

NAMES = ["embed.tok.weight", "layers.0.norm1.weight", "head.output.weight"]


def traj(losses, norms_sq):
    return Trajectory(list(losses), [list(s) for s in norms_sq])


def steady(n, sq=(4.0, 1e-6, 5.0)):
    """A reference of n steps, loss 2.0 and the same squared norms each step."""
    return traj([2.0] * n, [sq] * n)


def test_step_zero_is_held_to_the_tolerance():
    ref = steady(3)
    ok = compare(traj([2.0 * (1 + 1e-7), 2.0, 2.0], ref.grad_sq), ref, ref, NAMES, DEFAULT_TOLERANCE)
    assert ok.passed and "all 3 steps match" in ok.message
    bad = compare(traj([2.0 * (1 + 3e-5), 2.0, 2.0], ref.grad_sq), ref, ref, NAMES, DEFAULT_TOLERANCE)
    assert not bad.passed and bad.message.startswith("step 0: loss") and "the same weights on both sides" in bad.message


def test_later_steps_allow_the_measured_drift_and_no_more():
    """At step 4 a run 1e-4 off the float64 reference passes where fp32 rounding alone moved the
    reference 2e-5 by then (8 x 2e-5 + 1e-5 allowed), and fails where it moved only 1e-7."""
    n = 5
    ref = steady(n)
    run = traj([2.0] * (n - 1) + [2.0 * (1 + 1e-4)], ref.grad_sq)
    drifted = traj([2.0, 2.0, 2.0 * (1 + 2e-5), 2.0, 2.0], ref.grad_sq)  # the largest drift so far counts
    calm = traj([2.0] * (n - 1) + [2.0 * (1 + 1e-7)], ref.grad_sq)
    assert compare(run, ref, drifted, NAMES, DEFAULT_TOLERANCE).passed
    v = compare(run, ref, calm, NAMES, DEFAULT_TOLERANCE)
    assert not v.passed and v.message.startswith("step 4: loss") and "drift" in v.message
    assert v.allowed_loss_rel_error[4] == pytest.approx(DEFAULT_TOLERANCE + SENSITIVITY * 1e-7)
    wrong = traj([2.0] * (n - 1) + [2.0 * 1.01], ref.grad_sq)  # a wrong update: 1 %
    assert not compare(wrong, ref, drifted, NAMES, DEFAULT_TOLERANCE).passed


def test_allowance_is_the_running_largest_drift():
    assert allowed(1e-5, [2e-7, 3e-6, 1e-6, 5e-6]) == pytest.approx(
        [1e-5, 1e-5 + 8 * 3e-6, 1e-5 + 8 * 3e-6, 1e-5 + 8 * 5e-6]
    )
    assert allowed(1e-5, [0.0, math.nan]) == [
        1e-5,
        math.inf,
    ]  # a diverged fp32 reference: the run's own NaN still fails


def test_a_lost_shard_of_a_small_parameter_is_caught_where_the_global_norm_cannot_see_it():
    """The norm weight's gradient is 1e-3 of the total: losing half of it moves the global norm
    by 4e-8, far inside the tolerance; its own norm moves by 30 %."""
    ref = traj([2.0], [(4.0, 1e-6 * 4.0, 5.0)])
    run = traj([2.0], [(4.0, 1e-6 * 2.0, 5.0)])
    assert relative_error(run.grad_norms[0], ref.grad_norms[0]) < 1e-6
    v = compare(run, ref, ref, NAMES, DEFAULT_TOLERANCE)
    assert not v.passed and "gradient norm of layers.0.norm1.weight" in v.message
    assert v.worst_parameter == "layers.0.norm1.weight" and v.parameters_checked == 3


def test_a_parameter_without_gradient_is_no_relative_error():
    """An embedding row never seen has no gradient: its rounding is measured against 1e-3 of
    the global norm, not against zero."""
    ref = traj([2.0], [(4.0, 0.0, 5.0)])
    run = traj([2.0], [(4.0, 1e-20, 5.0)])
    assert compare(run, ref, ref, NAMES, DEFAULT_TOLERANCE).passed


def test_layout_nan_and_missing_steps_fail():
    ref = steady(2)
    assert not compare(traj([math.nan, 2.0], ref.grad_sq), ref, ref, NAMES, DEFAULT_TOLERANCE).passed
    short = compare(traj([2.0], ref.grad_sq[:1]), ref, ref, NAMES, DEFAULT_TOLERANCE)
    assert not short.passed and "reported 1 steps" in short.message
    moved = compare(
        ref,
        ref,
        ref,
        NAMES,
        DEFAULT_TOLERANCE,
        layout_problem="rank 1 ran 3 layers, the plan's split [2, 2] gives it 2",
    )
    assert not moved.passed and moved.message.startswith("rank 1")
