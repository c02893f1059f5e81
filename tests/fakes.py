"""Test fakes of product interfaces: an executor of `plan tune` whose "true" constants are known."""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass, field
from typing import Optional, Sequence

from cost_models.estimate import estimate as predict
from cost_models.fit import with_constants
from planner.specs import ClusterSpec, Target
from planner.tune.executors import Measurement, Trial
from planner.tune.loop import layout_key


@dataclass
class FakeExecutor:
    """A machine whose "true" constants are known (tests): a trial measures the cost model's
    prediction under `true_constants` (CONSTANTS' order) and `true_overhead_gib`, deterministic,
    and runs out of memory where that prediction exceeds `memory_limit_gib`. `noise` (one
    factor per trial, cycled) multiplies the time, to stand for run-to-run variation.
    `sigma`: seeded noise of known size instead, a log-normal factor per trial (the machine's
    load between trials) of standard deviation `sigma` in log, and `steps` timed steps each
    spread by `step_sigma` around it (the trial's time is their median)."""

    true_constants: Sequence[float]
    target: str = Target.generic.value
    memory_limit_gib: Optional[float] = None
    true_overhead_gib: Optional[float] = None
    noise: Sequence[float] = ()
    fail_keys: Sequence[str] = ()  # layouts (planner/tune/loop.py:layout_key) that fail
    measured: list = field(default_factory=list)  # the trials measured, in order
    sigma: float = 0.0
    seed: int = 0
    steps: int = 0
    step_sigma: float = 0.0
    factors: dict = field(default_factory=dict)  # layout_key: a factor on its true time (to make ties)
    rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

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
        factor *= self.factors.get(layout_key(trial.plan), 1.0)
        if self.sigma:
            factor *= math.exp(self.rng.gauss(0.0, self.sigma))
        t = est.step_time_s * factor
        steps = tuple(t * math.exp(self.rng.gauss(0.0, self.step_sigma)) for _ in range(self.steps))
        return Measurement(
            "ok",
            step_time_s=statistics.median(steps) if steps else t,
            steps_s=steps,
            peak_memory_gib=est.peak_memory_gib,
        )
