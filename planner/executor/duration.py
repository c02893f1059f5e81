"""How long `plan run` takes on CPU processes: said before it starts, refined as it goes.

Before starting (`estimate_run`), from FLOPs: the cost model's FLOPs of a step (recompute
included) over the ranks, at the rate one core multiplies fp32 matrices here, measured now in
a fraction of a second (`core_gemm_rates`, so it carries the load of the moment), times the
fraction of that rate a training step keeps; plus starting the workers, and the
single-process reference runs (planner/executor/verify.py: float64, then fp32, one thread,
the whole global batch every step). Once steps are done (`RunClock`), the time between step
reports replaces the step's estimate. Every figure is an estimate and is said to be one.

The fractions were measured on this repository's 2-core development machine with GPT-2 124M
(2 ranks, 256 tokens, global batch 2: steps 6-13 s apart, reference runs 53-66 s for 3
steps, depending on what else ran) and are rough: a small model's step is dominated by per-operator overhead and gloo latency, which
FLOPs do not see.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

# Of one core's fp32 GEMM rate, what a distributed training step keeps per rank on CPU
# (attention, norms, elementwise work, gloo collectives and the memory count's hooks
# between the GEMMs): 3.9e11 FLOP a step over 2 ranks took 6-7 s apart at 91 GFLOP/s a
# core (0.33), and 13 s at 85 GFLOP/s with other work loading the machine (0.18).
STEP_EFFICIENCY = 0.3
# Of the fp32 and float64 GEMM rates, what the reference runs keep (one process, no
# communication): 3 steps x 4.5e11 FLOP in each dtype took 66 s at 85 and 45 GFLOP/s.
REFERENCE_EFFICIENCY = 0.7
# Starting workers: the elastic agent and one interpreter importing torch per rank (~2 s,
# ranks beyond the cores wait for one), then every rank builds the whole model from the seed
# (planner/distributed/reference_model.py: ~12 ns a parameter on one thread, measured for
# GPT-2 124M; x4 for the first step's allocation and shape work).
START_S, IMPORT_S, BUILD_S_PER_PARAM = 4.0, 2.0, 5e-8


def core_gemm_rates(seconds: float = 0.1, n: int = 512) -> tuple[float, float]:
    """(fp32, float64) FLOP/s of an n x n matrix product on one thread, each timed for
    about `seconds` (torch is imported by the caller's command already)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _rate(torch, torch.float32, n, seconds), _rate(torch, torch.float64, n, seconds)
    finally:
        torch.set_num_threads(threads)


def _rate(torch, dtype, n: int, seconds: float) -> float:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b  # first call: allocation, kernel choice
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        count += 1
    return 2 * n**3 * count / (time.perf_counter() - start)


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity), else the machine's."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@dataclass(frozen=True)
class RunEstimate:
    """What `plan run` will take here, before it starts (seconds)."""

    startup_s: float  # workers started and the model built, until the first step begins
    step_s: float  # one distributed training step
    steps: int
    reference_s: float  # the single-process reference runs, all steps
    step_basis: str  # where step_s comes from, in words
    busy: str = ""  # what else loads this machine, in words, when it does

    @property
    def total_s(self) -> float:
        return self.startup_s + self.steps * self.step_s + self.reference_s

    def describe(self, fmt: Callable[[float], str]) -> str:
        return (
            f"about {fmt(self.total_s)} (refined after the first steps): workers start in ~{fmt(self.startup_s)}; "
            f"{self.steps} steps of ~{fmt(self.step_s)} ({self.step_basis}); the single-process reference runs "
            f"~{fmt(self.reference_s)} (float64 and fp32, one CPU thread, from FLOPs){self.busy}"
        )


def estimate_run(case, rates: tuple[float, float], gpu_cluster=None, cores: Optional[int] = None) -> RunEstimate:
    """The time of `case` (a prepared RunCase) at this machine's one-core GEMM `rates`: on CPU
    processes from FLOPs; on GPUs (`gpu_cluster`, the plan's) with the cost model's step time."""
    from cost_models.compute import model_flops_per_step, total_params
    from cost_models.estimate import estimate
    from hardware_profiles import load_cluster

    cores = cores or usable_cores()
    ranks = case.plan.world_size
    crowd = max(1.0, ranks / cores) if gpu_cluster is None else 1.0  # ranks sharing a core run that much slower
    threads = max(1, cores // ranks)  # each rank pinned to cores of its own, a thread each (launch.own_cores)
    model_flops = model_flops_per_step(case.model, case.job.global_batch_size, case.job.seq_len)
    fp32, fp64 = rates
    reference_s = case.steps * model_flops * (1 / fp32 + 1 / fp64) / REFERENCE_EFFICIENCY
    startup_s = START_S + IMPORT_S * crowd + BUILD_S_PER_PARAM * total_params(case.model) * crowd
    est = estimate(case.model, gpu_cluster or load_cluster("dgx-a100-80gb"), case.job, case.plan)
    busy = busy_note(cores)
    if gpu_cluster is not None:
        return RunEstimate(
            startup_s, est.step_time_s, case.steps, reference_s, f"the plan's prediction on {gpu_cluster.name}", busy
        )
    step_flops = model_flops * est.hardware_tflops_per_gpu / est.model_tflops_per_gpu  # recompute included; any cluster
    step_s = step_flops / ranks / (fp32 * threads * STEP_EFFICIENCY) * crowd
    share = f", {ranks} ranks on {cores} cores" if ranks > cores else f", {threads} cores a rank" if threads > 1 else ""
    return RunEstimate(
        startup_s,
        step_s,
        case.steps,
        reference_s,
        f"{flop_words(step_flops)} each at the {fp32 / 1e9:.0f} GFLOP/s one core multiplies here{share}",
        busy,
    )


def flop_words(flops: float) -> str:
    """'390 GFLOP', '3.1 TFLOP'."""
    for unit, size in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if flops >= size:
            return f"{flops / size:.2g} {unit}" if flops < 10 * size else f"{flops / size:.0f} {unit}"
    return f"{flops:.0f} FLOP"


def busy_note(cores: int) -> str:
    """'; this machine is busy (load 5.1 on 2 cores): expect longer' when other work runs
    (the 1-minute load average, which counts this command's own thread, beyond half the cores)."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    return f"; this machine is busy (load {load:.1f} on {cores} cores): expect longer" if load - 1 > cores / 2 else ""


@dataclass
class RunClock:
    """The time left, from the estimate before starting and the step reports since. Reports
    (done, total, message) come in three phases: starting (done 0, no step yet), the steps
    (done > 0, one message), then the reference runs (another message). After two steps the
    mean time between their reports is the step's time; after one, its time less the
    estimated start-up. `update` takes each report and returns the time left in words."""

    estimate: RunEstimate
    fmt: Callable[[float], str]
    clock: Callable[[], float] = time.monotonic
    start: float = field(default=0.0)
    reports: list[float] = field(default_factory=list)  # when each step was reported
    steps_message: Optional[str] = None
    phase_start: Optional[float] = None  # when the reference runs began

    def __post_init__(self) -> None:
        self.start = self.start or self.clock()

    def step_s(self) -> float:
        if len(self.reports) >= 2:
            return (self.reports[-1] - self.reports[0]) / (len(self.reports) - 1)
        if self.reports:
            return max(self.reports[0] - self.start - self.estimate.startup_s, 0.25 * (self.reports[0] - self.start))
        return self.estimate.step_s

    def update(self, done: int, total: int, message: str) -> str:
        now = self.clock()
        if self.phase_start is None and done == 0 and not self.reports:  # the workers are starting
            left = self.estimate.total_s - (now - self.start)
            return f"about {self.fmt(left)} left (estimated)" if left > 0 else "taking longer than estimated"
        if self.phase_start is None and done > 0 and self.steps_message in (None, message):
            self.steps_message = message
            self.reports.extend([now] * max(0, done - len(self.reports)))
            left = (total - done) * self.step_s() + self.estimate.reference_s
            return f"about {self.fmt(left)} left ({self.fmt(self.step_s())} a step, measured)"
        if self.phase_start is None:
            self.phase_start = now
        left = self.estimate.reference_s - (now - self.phase_start)
        return f"about {self.fmt(left)} left (estimated)" if left > 0 else "taking longer than estimated"


@dataclass
class ItemClock:
    """The time left of work reported item by item ('done/total message', each item as it
    starts), from each item's estimated seconds: the items not finished, scaled by how the
    finished ones compared with their estimate once those are a tenth of the work, less the
    time already spent on the current one. Used for `plan profile`."""

    items: list[float]
    fmt: Callable[[float], str]
    clock: Callable[[], float] = time.monotonic
    first: Optional[float] = None  # when the first item started
    current: tuple[int, float] = (-1, 0.0)  # the item under way and when it started

    def update(self, done: int, total: int, message: str) -> str:
        now = self.clock()
        if total != len(self.items) or not self.items:
            return ""
        if self.first is None:
            self.first = now
        if done != self.current[0]:
            self.current = (done, now)
        finished = sum(self.items[:done])
        ratio = (
            (self.current[1] - self.first) / finished if finished >= 0.1 * sum(self.items) else 1.0
        )  # measured / estimated
        ahead = sum(self.items[done + 1 :]) * ratio
        left = max(ahead, ahead + (self.items[done] if done < total else 0.0) * ratio - (now - self.current[1]))
        return f"about {self.fmt(left)} left" if left >= 1 else ""
