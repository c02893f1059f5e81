"""How a trial is measured: the interface the tune loop calls, and a fake for tests.

The loop hands an executor a `Trial` (the layout as searched, on the slice's GPUs) and gets a
`Measurement` back; an out-of-memory, failed or timed-out trial is a measurement too, never
an exception (only an interruption, Ctrl-C or SIGTERM, propagates). The real executor is
planner/tune/run_executor.py (`plan run` on this machine's ranks, or under `srun`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Protocol, Sequence

from cost_models.estimate import estimate as predict
from cost_models.fit import with_constants
from planner.specs import ClusterSpec, JobSpec, ModelSpec, Plan, Target
from planner.tune.journal import Ran


@dataclass(frozen=True)
class Trial:
    """One layout to measure."""

    index: int
    model: ModelSpec
    cluster: ClusterSpec  # the prior cluster (what the plan file carries)
    num_gpus: int
    job: JobSpec
    plan: Plan


@dataclass(frozen=True)
class Measurement:
    status: str  # "ok", "oom" (did not fit), "failed", "timeout"
    step_time_s: Optional[float] = None  # slowest rank per step, mean over the timed steps
    peak_memory_gib: Optional[float] = None  # the largest rank's measured peak
    detail: str = ""
    ran: Optional[Ran] = None  # what ran, where it differs from the trial (a scaled model); None: as given
    wall_s: float = 0.0


class Executor(Protocol):
    def describe(self) -> dict:
        """The settings that decide what a measurement means (recorded in the journal)."""

    def measure(self, trial: Trial) -> Measurement:
        """Run the trial; failures are returned as Measurements, not raised."""


@dataclass
class FakeExecutor:
    """A machine whose "true" constants are known (tests): a trial measures the cost model's
    prediction under `true_constants` (CONSTANTS' order) and `true_overhead_gib`, deterministic,
    and runs out of memory where that prediction exceeds `memory_limit_gib`. `noise` (one
    factor per trial, cycled) multiplies the time, to stand for run-to-run variation."""

    true_constants: Sequence[float]
    target: str = Target.generic.value
    memory_limit_gib: Optional[float] = None
    true_overhead_gib: Optional[float] = None
    noise: Sequence[float] = ()
    fail_keys: Sequence[str] = ()  # layouts (planner/tune/loop.py:layout_key) that fail
    measured: list = field(default_factory=list)  # the trials measured, in order

    def describe(self) -> dict:
        return {"executor": "fake", "true_constants": list(self.true_constants)}

    def truth(self, cluster: ClusterSpec) -> ClusterSpec:
        true = with_constants(cluster, self.target, self.true_constants, provenance="fake executor's truth")
        if self.true_overhead_gib is not None:
            true = true.model_copy(
                update={"device": true.device.model_copy(update={"framework_overhead_gib": self.true_overhead_gib})}
            )
        return true

    def measure(self, trial: Trial) -> Measurement:
        from planner.tune.loop import layout_key

        self.measured.append(trial)
        if layout_key(trial.plan) in self.fail_keys:
            return Measurement("failed", detail="injected failure")
        est = predict(trial.model, self.truth(trial.cluster), trial.job, trial.plan)
        if self.memory_limit_gib is not None and est.peak_memory_gib > self.memory_limit_gib:
            return Measurement(
                "oom",
                peak_memory_gib=est.peak_memory_gib,
                detail=f"needs {est.peak_memory_gib:.2f} GiB, the limit is {self.memory_limit_gib:.2f} GiB",
            )
        factor = self.noise[(len(self.measured) - 1) % len(self.noise)] if self.noise else 1.0
        return Measurement("ok", step_time_s=est.step_time_s * factor, peak_memory_gib=est.peak_memory_gib)
