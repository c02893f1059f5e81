"""How a trial is measured: the interface the tune loop calls (a fake for tests: tests/fakes.py).

The loop hands an executor a `Trial` (the layout as searched, on the slice's GPUs) and gets a
`Measurement` back; an out-of-memory, failed or timed-out trial is a measurement too, never
an exception (only an interruption, Ctrl-C or SIGTERM, propagates). The real executor is
planner/tune/run_executor.py (`plan run` on this machine's ranks, or under `srun`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol

from planner.specs import ClusterSpec, JobSpec, ModelSpec, Plan
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
    step_time_s: Optional[float] = None  # slowest rank per step, median over the timed steps
    steps_s: tuple[float, ...] = ()  # every timed step (after warm-up): the slowest rank's time
    peak_memory_gib: Optional[float] = None  # the largest rank's measured peak
    detail: str = ""
    ran: Optional[Ran] = None  # what ran, where it differs from the trial (a scaled model); None: as given
    wall_s: float = 0.0


class Executor(Protocol):
    def describe(self) -> dict:
        """The settings that decide what a measurement means (recorded in the journal)."""

    def measure(self, trial: Trial) -> Measurement:
        """Run the trial; failures are returned as Measurements, not raised."""
