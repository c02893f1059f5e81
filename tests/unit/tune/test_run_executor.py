"""The real executor's reading of a `plan run` report (planner/tune/run_executor.py): every timed
step reaches the tuner (the slowest rank's, step by step) and the trial's step time is their
median. End to end with real ranks: tests/distributed/test_tune_run.py."""

from __future__ import annotations

import pytest

from hardware_profiles import load_cluster
from planner.executor.prepare import prepare_case
from planner.executor.runner import build_report
from planner.presets import load_model
from planner.specs import JobSpec, MemoryBytes, Plan, RankMeasurement, RunSettings, Verification
from planner.tune.executors import Trial
from planner.tune.run_executor import RunExecutor

CLUSTER = load_cluster("dgx-a100-80gb")
PLAN = Plan(dp=2, tp=1, pp=1, micro_batch_size=1, num_micro_batches=1)
JOB = JobSpec(global_batch_size=2, seq_len=64, precision="fp32")


def _rank(rank: int, steps: list[float]) -> RankMeasurement:
    return RankMeasurement(
        rank=rank,
        dp_rank=rank,
        tp_rank=0,
        pp_rank=0,
        virtual_stages=[0],
        layers=12,
        step_times_s=steps,
        memory=MemoryBytes(
            weights_bytes=2**20, gradients_bytes=2**20, optimizer_states_bytes=2**21, activations_bytes=0
        ),
        peak_memory_bytes=2**22,
        memory_method="count",
        cores=[rank],
    )


def _report_file(tmp_path, passed: bool = True):
    case = prepare_case(load_model("gpt2-124m"), JOB, PLAN, steps=7, warmup=2)
    settings = RunSettings(
        steps=7,
        warmup_steps=2,
        seed=0,
        learning_rate=1e-3,
        world_size=2,
        nnodes=1,
        backend="gloo",
        device="cpu",
        timeout_s=30,
        changes=[],
        pinned=True,
    )
    verification = Verification(
        passed=passed,
        tolerance=1e-5,
        losses=[1.0],
        reference_losses=[1.0],
        grad_norms=[1.0],
        reference_grad_norms=[1.0],
        max_loss_rel_error=0.0,
        max_grad_norm_rel_error=0.0,
        message="all steps match" if passed else "step 1: loss off",
    )
    # the slowest rank per step: 1.0, 1.2, 5.0 (a step other work slowed), 1.1, 0.9
    ranks = [_rank(0, [1.0, 0.8, 5.0, 1.1, 0.9]), _rank(1, [0.7, 1.2, 0.6, 1.0, 0.8])]
    report = build_report(case, CLUSTER, settings, ranks, verification, None)
    path = tmp_path / "report.json"
    path.write_text(report.model_dump_json())
    return path, case


@pytest.mark.parametrize("passed, status", [(True, "ok"), (False, "failed")])
def test_every_timed_step_reaches_the_tuner_and_the_median_is_the_trial(tmp_path, passed, status):
    path, case = _report_file(tmp_path, passed)
    trial = Trial(index=0, model=case.model, cluster=CLUSTER, num_gpus=2, job=case.job, plan=case.plan)
    log = tmp_path / "run.log"
    log.write_text("")
    result = RunExecutor()._result("done", path, log, trial)
    assert result["status"] == status
    assert result["steps_s"] == (1.0, 1.2, 5.0, 1.1, 0.9)
    assert result["step_time_s"] == pytest.approx(1.1)  # the median; the mean would be 1.84


def test_a_rank_over_the_memory_limit_keeps_its_steps(tmp_path):
    path, case = _report_file(tmp_path)
    trial = Trial(index=0, model=case.model, cluster=CLUSTER, num_gpus=2, job=case.job, plan=case.plan)
    log = tmp_path / "run.log"
    log.write_text("")
    result = RunExecutor(memory_limit_gib=1 / 1024)._result("done", path, log, trial)  # 1 MiB; a rank peaked at 4
    assert result["status"] == "oom" and len(result["steps_s"]) == 5 and result["step_time_s"] == pytest.approx(1.1)
