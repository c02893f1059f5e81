"""CPU ranks own their cores (planner/distributed/launch.py:core_slices, own_cores) where the
machine has enough, `plan run` says so where it has not (runner.core_sharing), and a measured
step time is the median of the slowest rank's steps (runner.time_comparison). The pinning on
real ranks: tests/distributed/test_pinned_ranks.py."""

from __future__ import annotations

import pytest

from cost_models.estimate import estimate
from hardware_profiles import load_cluster
from planner.distributed.launch import LaunchSpec, core_slices
from planner.executor import runner
from planner.executor.prepare import prepare_case
from planner.presets import load_model
from planner.specs import MemoryBytes, JobSpec, Plan, RankMeasurement


@pytest.mark.parametrize(
    "cores, ranks, slices",
    [
        ([0, 1], 2, [(0,), (1,)]),
        ([0, 1, 2, 3], 2, [(0, 1), (2, 3)]),
        ([3, 1, 2, 0], 4, [(0,), (1,), (2,), (3,)]),  # sorted first: neighbours together
        ([0, 1, 2, 3, 4, 5, 6], 3, [(0, 1), (2, 3), (4, 5)]),  # core 6 left to the launcher
        ([4, 5, 8, 9], 2, [(4, 5), (8, 9)]),  # an affinity mask that is not 0..n-1 (a cgroup's cpuset)
        ([0, 1, 2, 3], 1, [(0, 1, 2, 3)]),
        ([0, 1], 3, None),  # fewer cores than ranks: they share, none is pinned
        ([0], 2, None),
        ([0, 1], 0, None),
    ],
)
def test_core_slices_are_disjoint_contiguous_and_equal(cores, ranks, slices):
    assert core_slices(cores, ranks) == slices


def test_core_slices_never_overlap():
    for n in range(1, 33):
        for ranks in range(1, n + 1):
            slices = core_slices(list(range(n)), ranks)
            assert slices is not None and len(slices) == ranks
            flat = [c for s in slices for c in s]
            assert len(flat) == len(set(flat)) == ranks * (n // ranks)


def test_ranks_beyond_the_cores_are_said_in_one_line(monkeypatch):
    monkeypatch.setattr(runner, "usable_cores", lambda: 2)
    line = runner.core_sharing(LaunchSpec(nproc_per_node=4), "gloo")
    assert line == "4 ranks share 2 cores: step times are noisy; use at most 2 ranks here to measure"
    assert runner.core_sharing(LaunchSpec(nproc_per_node=2), "gloo") is None
    assert runner.core_sharing(LaunchSpec(nproc_per_node=4), "nccl") is None  # GPU ranks: the device is theirs


def _rank(rank: int, steps: list[float]) -> RankMeasurement:
    return RankMeasurement(
        rank=rank,
        dp_rank=rank,
        tp_rank=0,
        pp_rank=0,
        virtual_stages=[0],
        layers=2,
        step_times_s=steps,
        memory=MemoryBytes(weights_bytes=1, gradients_bytes=1, optimizer_states_bytes=1, activations_bytes=1),
        peak_memory_bytes=4,
        memory_method="count",
    )


def test_measured_step_time_is_the_median_of_the_slowest_rank_per_step():
    """Per step the slowest rank (1.0, 1.2, 5.0, 1.1, 0.9), then the median (1.1): the one step
    that other work slowed to 5 s does not move it (the mean would be 1.84 s)."""
    ranks = [_rank(0, [1.0, 0.8, 5.0, 1.1, 0.9]), _rank(1, [0.7, 1.2, 0.6, 1.0, 0.8])]
    assert runner.slowest_rank_steps(ranks) == [1.0, 1.2, 5.0, 1.1, 0.9]
    plan = Plan(dp=2, tp=1, pp=1, micro_batch_size=1, num_micro_batches=1)
    job = JobSpec(global_batch_size=2, seq_len=64, precision="fp32")
    case = prepare_case(load_model("gpt2-124m"), job, plan, steps=7, warmup=2)
    est = estimate(case.model, load_cluster("dgx-a100-80gb"), case.job, case.plan)
    tm = runner.time_comparison(est, case, ranks)
    assert tm.measured_step_time_s == pytest.approx(1.1) and tm.measured_steps == 5
    assert tm.measured_tokens_per_s == pytest.approx(2 * 64 / 1.1)
