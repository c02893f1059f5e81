"""Refit the cost model to the trials measured so far: its three software constants (through
cost_models/fit.py:fit_constants, the function benchmarks/fidelity_published.py calls), the
memory it does not see (fit.fit_memory_overhead), and the interval the residuals justify.

The interval. Before any trial, the prior's: the cluster's (or its stack's) cross-validated
uncertainty, else PRIOR_RELATIVE. After n trials that ran, with k constants fitted, the
half-width in log space is w = 2 s (about 95 % for normal errors), where s^2 = (sum of the
squared log residuals + (w0 / 2)^2) / (n - k + 1): the residuals' variance with one
pseudo-observation at the prior's own s (w0 / 2), so that a few lucky residuals cannot
shrink the interval to nothing; until n > k the residuals say nothing about the error (the
constants can match any k points) and the prior's width stays. Never below FLOOR_LOG, the
run-to-run noise of a CPU step on a shared machine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional, Sequence

from cost_models.estimate import estimate as predict
from cost_models.fit import (
    CONSTANTS,
    NAMES,
    Prior,
    constants_of,
    fit_constants,
    fit_memory_overhead,
    loss,
    nelder_mead,
    with_constants,
)
from planner.specs import ClusterSpec, JobSpec, ModelSpec, Plan, Uncertainty

# The constants the tune fits: fit.CONSTANTS' (the same three, the same meanings), within the
# ranges the cost model accepts on any machine rather than those of published GPU runs: a
# user's slice may be CPU ranks, or a node under other load, far below a GPU's sustained
# fraction (fit.CONSTANTS stops at 0.5) and far above its per-operator gap (50 us there).
TUNE_CONSTANTS = tuple(
    replace(c, lo=0.05)
    if c.name == "sustained_fraction"
    else replace(c, hi=2000.0)
    if c.name == "kernel_overhead_us"
    else c
    for c in CONSTANTS
)

# Relative half-width of the prior's interval where the cluster states none (measured
# profiles): CPU-profile runs came within +-50 % in the worst conditions docs/notebook.md
# records (-44 % under load), so x/ 1.5; its coverage is that assumption, not a measurement.
PRIOR_RELATIVE, PRIOR_COVERAGE = 0.5, 0.9
FLOOR_LOG = 0.02  # ln(1.02): steps of one plan on this machine vary by about 2 % run to run
# The data's weight against the prior: a constant one prior width away costs as much as every
# trial missing by NOISE_LOG (2 %, the repeatability of a measured step on a quiet CPU).
NOISE_LOG = 0.02


@dataclass(frozen=True)
class Observation:
    """A trial that ran: what ran and its measured step and peak."""

    model: ModelSpec
    job: JobSpec
    plan: Plan
    step_time_s: float
    peak_memory_gib: float
    # Its weight in the fit, relative to the others' (mean 1): a layout measured more often, or
    # whose measurements spread less, counts more (planner/tune/loop.py:observations).
    weight: float = 1.0


@dataclass(frozen=True)
class Refit:
    cluster: ClusterSpec  # the prior cluster with the refit constants, interval and memory overhead
    constants: tuple[float, ...]  # CONSTANTS' order
    log_halfwidth: float  # w: the interval is x/ exp(w) on the slice
    residuals: tuple[float, ...]  # log(predicted / measured) per observation, refit constants
    overhead_gib: float  # DeviceSpec.framework_overhead_gib after the memory refit


def prior_uncertainty(cluster: ClusterSpec, target: str) -> Uncertainty:
    u = cluster.for_target(target).uncertainty
    return u if u is not None else Uncertainty(relative=PRIOR_RELATIVE, coverage=PRIOR_COVERAGE)


def _prior_log_halfwidth(u: Uncertainty) -> float:
    return math.log1p(u.relative)  # the whole step's (per-term widths apply to their shares of it)


def residuals_of(cluster: ClusterSpec, target: str, observations: Sequence[Observation], weighted: bool = False):
    """fit_constants' residuals: log(predicted / measured) of every observation, one group;
    `weighted`: each times the square root of its weight (the fit's loss is their mean square)."""

    def residuals(theta):
        trial_cluster = with_constants(cluster, target, theta)
        for o in observations:
            r = math.log(predict(o.model, trial_cluster, o.job, o.plan).step_time_s / o.step_time_s)
            yield "trials", r * math.sqrt(o.weight) if weighted else r

    return residuals


def refit(
    prior: ClusterSpec,
    target: str,
    ran: Sequence[Observation],
    out_of_memory: Sequence[tuple[ModelSpec, JobSpec, Plan]],
    capacity_gib: float,
    start: Optional[Sequence[float]] = None,
    rounds: int = 6,
    noise_floor_log: float = 0.0,
) -> Refit:
    """The constants that best explain `ran` (the prior's as a penalty), the interval, and the
    memory overhead that `ran` and the out-of-memory trials agree with. `start`: where the
    search for the constants begins (the previous refit's: each refit goes on from the last,
    so the coordinate-wise search of fit_constants gets further along a narrow valley).
    Each observation counts by its weight. `noise_floor_log`: the measured repeatability (2
    sigma, log), under which the interval does not narrow."""
    centre = constants_of(prior, target)
    width = tuple((c.hi - c.lo) / 2 for c in CONSTANTS)  # the prior's trust: the published fit's ranges
    n = len(ran)
    residuals = residuals_of(prior, target, ran)
    w0 = _prior_log_halfwidth(prior_uncertainty(prior, target))
    weighted = residuals_of(prior, target, ran, weighted=True)
    theta = _fit(weighted, Prior(centre, width, NOISE_LOG**2 / n), start or centre, rounds) if n else centre
    errors = tuple(r for _, r in residuals(theta))
    dof = n - len(NAMES)
    floor = max(FLOOR_LOG, noise_floor_log)  # no interval narrower than a measurement repeats
    w = w0 if dof < 1 else max(floor, 2 * math.sqrt((sum(r * r for r in errors) + (w0 / 2) ** 2) / (dof + 1)))
    base = prior.device.framework_overhead_gib
    peaks = [(predict(o.model, prior, o.job, o.plan).peak_memory_gib, o.peak_memory_gib) for o in ran]
    ooms = [predict(m, prior, j, p).peak_memory_gib for m, j, p in out_of_memory]
    overhead = fit_memory_overhead(base, capacity_gib, peaks, ooms, margin_gib=1e-6 * capacity_gib)
    cluster = prior
    if overhead != base:
        cluster = prior.model_copy(
            update={"device": prior.device.model_copy(update={"framework_overhead_gib": overhead})}
        )
    cluster = with_constants(
        cluster,
        target,
        theta,
        provenance="plan tune (in progress)",
        uncertainty=Uncertainty(relative=math.expm1(w), coverage=_coverage(errors, w) if n else PRIOR_COVERAGE),
    )
    return Refit(cluster, tuple(theta), w, errors, overhead)


def _fit(residuals, prior: Prior, start: Sequence[float], rounds: int) -> tuple[float, ...]:
    """fit_constants (one sweep at a time) accelerated by pattern moves (Hooke and Jeeves,
    "Direct search solution of numerical and statistical problems", JACM 1961): after each
    sweep, try again from twice as far along the step the sweep made, and keep whichever ends
    lower. Sustained fraction and kernel gap both lengthen compute, so the loss has a long
    narrow valley between them that coordinate-wise sweeps alone cross in tiny steps (on the
    tests' fake machine, 20 plain sweeps came a third as close as 8 of these rounds). The sweeps
    start where a Nelder-Mead simplex from `start` ended: with a pipeline trial of interleaved
    chunks among the tests' fake trials, sweeps alone stopped at kernel gap 50 us, sustained
    fraction 0.95 (loss 17 times the truth's) while the truth was 20 us, 0.6.
    `rounds` 0: fit_constants' own 3 sweeps."""
    if rounds <= 0:
        return fit_constants(residuals, prior=prior, start=start, constants=TUNE_CONSTANTS)

    def value(theta):
        return loss(residuals, theta, prior)

    previous = nelder_mead(value, start, TUNE_CONSTANTS)
    theta = fit_constants(residuals, sweeps=1, prior=prior, start=previous, constants=TUNE_CONSTANTS)
    best = value(theta)
    for _ in range(rounds):
        jump = tuple(min(max(t + 2 * (t - p), c.lo), c.hi) for t, p, c in zip(theta, previous, TUNE_CONSTANTS))
        candidates = [
            fit_constants(residuals, sweeps=1, prior=prior, start=s, constants=TUNE_CONSTANTS) for s in (jump, theta)
        ]
        scored = min((value(c), c) for c in candidates)
        if scored[0] >= best:
            break
        previous, theta, best = theta, scored[1], scored[0]
    return tuple(theta)


def _coverage(errors: Sequence[float], w: float) -> float:
    """The fraction of the trials inside the interval, (inside + 1/2) / (n + 1) so that it
    stays strictly between 0 and 1 as the schema requires (in-sample: the trials were fitted)."""
    inside = sum(abs(r) <= w for r in errors)
    return (inside + 0.5) / (len(errors) + 1)


def profile_uncertainty(prior: ClusterSpec, target: str, fit: Refit, one_node: bool) -> Uncertainty:
    """The tuned profile's interval for jobs beyond the slice: compute narrows to what the
    trials justify; communication narrows too only where the slice exercised the links a
    larger job uses. A slice on one node never ran an inter-node ring, so there the
    communication term keeps the prior's width where that is wider."""
    measured = math.expm1(fit.log_halfwidth)
    u = prior_uncertainty(prior, target)
    prior_comm = u.communication if u.communication is not None else u.relative
    communication = max(measured, prior_comm) if one_node else measured
    coverage = _coverage(fit.residuals, fit.log_halfwidth) if fit.residuals else u.coverage
    return Uncertainty(
        relative=max(measured, communication), coverage=coverage, compute=measured, communication=communication
    )
