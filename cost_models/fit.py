"""Fitting the cost model's few software constants to measured step times: the one fit
function that benchmarks/fidelity_published.py (published runs) and `plan tune` (trials
measured on the user's machines) both call.

The constants are three of planner/specs/cluster.py:StackConstants, each with a physical meaning
(the fourth, a stack's host time per step, is kept as the cluster states it: with_constants):

- sustained_fraction: throughput a training loop sustains relative to microbenchmarks
  (clocks under sustained power, synchronisation), multiplying GEMM and attention rates;
- kernel_overhead_us: the gap per modelled operator (launches, casts and copies around it);
- overlap_efficiency: the fraction of overlapped communication that is free (1 - the
  slowdown compute suffers while a collective runs beside it).

The loss is the mean over groups of the mean squared log(predicted / measured) in the group
(each group weighted equally, so that one large table does not decide the fit), plus, where
a prior is given, a penalty pulling each constant towards it in units of its prior width
(what `plan tune` starts from: the preset's fit, trusted as far as its cross-validated
error says). Minimised by coordinate-wise golden-section search within each constant's
physical bounds: few constants, a smooth loss, no gradient needed, deterministic.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Iterable, Optional, Sequence

from planner.specs import ClusterSpec, StackConstants, Target


@dataclass(frozen=True)
class Constant:
    name: str
    lo: float
    hi: float
    start: float
    meaning: str


CONSTANTS = (
    Constant("sustained_fraction", 0.5, 1.0, 0.85, "throughput sustained relative to microbenchmarks"),
    # up to 50 us per modelled operator: eager PyTorch launches several kernels for one modelled
    # operator (casts, copies, autograd bookkeeping, 5-10 us each)
    Constant("kernel_overhead_us", 0.0, 50.0, 5.0, "gap per modelled operator, us"),
    Constant("overlap_efficiency", 0.0, 1.0, 0.85, "fraction of overlapped communication that is free"),
)
NAMES = tuple(c.name for c in CONSTANTS)

# Residuals of one setting of the constants: (group, log(predicted / measured)) per observation.
Residuals = Callable[[Sequence[float]], Iterable[tuple[str, float]]]


@dataclass(frozen=True)
class Prior:
    """Where the constants start and how far the data must pull them: the penalty is
    weight x sum(((theta - centre) / width)^2), widths in each constant's units."""

    centre: tuple[float, ...]
    width: tuple[float, ...]
    weight: float = 1.0

    def penalty(self, theta: Sequence[float]) -> float:
        return self.weight * sum(((t - c) / w) ** 2 for t, c, w in zip(theta, self.centre, self.width))


def loss(residuals: Residuals, theta: Sequence[float], prior: Optional[Prior] = None) -> float:
    """Mean over groups of the mean squared log ratio in the group (+ the prior's penalty)."""
    per = defaultdict(list)
    for group, r in residuals(theta):
        per[group].append(r * r)
    value = sum(sum(v) / len(v) for v in per.values()) / len(per) if per else 0.0
    return value + (prior.penalty(theta) if prior is not None else 0.0)


def golden(f: Callable[[float], float], lo: float, hi: float, tol: float) -> float:
    """The minimiser of a unimodal f on [lo, hi], to within tol (golden-section search)."""
    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(c), f(d)
    while b - a > tol:
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(d)
    return (a + b) / 2


def fit_constants(
    residuals: Residuals,
    sweeps: int = 3,
    prior: Optional[Prior] = None,
    free: Sequence[str] = NAMES,
    start: Optional[Sequence[float]] = None,
    constants: Sequence[Constant] = CONSTANTS,
    within: Optional[Sequence[float]] = None,
) -> tuple[float, ...]:
    """The constants (in `constants`' order) minimising `loss`; those not in `free` stay at
    their start (`start`, else the prior's centre, else each constant's own start). `within`:
    half-widths around the start to search in (a warm start near a known fit), else each
    constant's whole range."""
    theta = list(start or (prior.centre if prior is not None else tuple(c.start for c in constants)))
    for _ in range(sweeps):
        for i, c in enumerate(constants):
            if c.name not in free:
                continue

            def f(x, i=i):
                t = list(theta)
                t[i] = x
                return loss(residuals, t, prior)

            lo, hi = (
                (c.lo, c.hi) if within is None else (max(c.lo, theta[i] - within[i]), min(c.hi, theta[i] + within[i]))
            )
            theta[i] = golden(f, lo, hi, (c.hi - c.lo) / 200)
    return tuple(theta)


def nelder_mead(
    f: Callable[[tuple], float],
    start: Sequence[float],
    constants: Sequence[Constant] = CONSTANTS,
    step: float = 0.15,
    evaluations: int = 200,
) -> tuple[float, ...]:
    """A minimiser of f near `start` by the simplex method of Nelder and Mead ("A simplex method
    for function minimization", Computer Journal 1965; reflection 1, expansion 2, contraction
    and shrink 1/2), in coordinates scaled to each constant's range and clipped to it. Unlike
    coordinate-wise sweeps it walks along a narrow valley oblique to the axes (sustained
    fraction against kernel gap); at most `evaluations` calls of f."""
    lo, span = [c.lo for c in constants], [c.hi - c.lo for c in constants]
    n = len(constants)

    def point(u):
        return tuple(min(max(a + x * w, a), a + w) for a, x, w in zip(lo, u, span))

    def mix(a, b, t):  # a + t (b - a)
        return [x + t * (y - x) for x, y in zip(a, b)]

    base = [(x - a) / w for x, a, w in zip(start, lo, span)]
    simplex = [base] + [
        [x + (step if j == i else 0.0) * (-1 if x + step > 1 else 1) for j, x in enumerate(base)] for i in range(n)
    ]
    values = [f(point(u)) for u in simplex]
    used = n + 1
    while used < evaluations:
        order = sorted(range(n + 1), key=values.__getitem__)
        simplex, values = [simplex[k] for k in order], [values[k] for k in order]
        if values[-1] - values[0] <= 1e-12 * max(1.0, abs(values[0])):
            break
        centre = [sum(u[j] for u in simplex[:-1]) / n for j in range(n)]
        worst = simplex[-1]
        reflected = mix(worst, centre, 2.0)
        fr = f(point(reflected))
        used += 1
        if fr < values[0]:
            expanded = mix(worst, centre, 3.0)
            fe = f(point(expanded))
            used += 1
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            inner = mix(worst, centre, 0.5)
            fi = f(point(inner))
            used += 1
            if fi < values[-1]:
                simplex[-1], values[-1] = inner, fi
            else:
                simplex = [simplex[0]] + [mix(simplex[0], u, 0.5) for u in simplex[1:]]
                values = [values[0]] + [f(point(u)) for u in simplex[1:]]
                used += n
    return point(simplex[min(range(n + 1), key=values.__getitem__)])


def with_constants(
    cluster: ClusterSpec,
    target: Target | str,
    theta: Sequence[float],
    provenance: Optional[str] = None,
    uncertainty=None,
    step_overhead_s: Optional[float] = None,
) -> ClusterSpec:
    """`cluster` with `theta` (in CONSTANTS' order) as the constants of stack `target`; its
    host time per step (StackConstants.step_overhead_s) `step_overhead_s`, else the entry's."""
    values = dict(zip(NAMES, theta))
    old = cluster.stack_constants.get(Target(target))
    step = step_overhead_s if step_overhead_s is not None else cluster.step_overhead_s(target)
    entry = StackConstants.model_validate(
        {
            **values,
            "step_overhead_s": step,
            "uncertainty": uncertainty if uncertainty is not None else (old.uncertainty if old else None),
            "provenance": provenance,
        }
    )
    return cluster.model_copy(update={"stack_constants": {**cluster.stack_constants, Target(target): entry}})


def constants_of(cluster: ClusterSpec, target: Target | str) -> tuple[float, ...]:
    """The constants the cost model uses for `target` on `cluster`, in CONSTANTS' order."""
    c = cluster.for_target(target)
    return (c.device.sustained_fraction, c.device.kernel_overhead_us, c.overlap_efficiency)


def fit_memory_overhead(
    overhead_gib: float,
    capacity_gib: float,
    fitted: Iterable[tuple[float, float]],
    out_of_memory: Iterable[float],
    margin_gib: float = 0.0,
) -> float:
    """The per-device memory the model does not see (DeviceSpec.framework_overhead_gib) that
    agrees with what trials showed, never below `overhead_gib` (the prior's). `fitted`:
    (predicted peak, measured peak) of trials that ran, GiB; `out_of_memory`: the predicted
    peaks of trials that did not fit, under a limit of `capacity_gib`. A measured peak above
    its prediction raises the overhead by the difference; a trial that ran out of memory
    while predicted to fit raises it until that prediction reaches the capacity (+ `margin_gib`),
    as far as the trials that ran allow (they fitted, so their predictions must stay within
    it): an additive constant, as a CUDA context or the memory other tenants hold is."""
    raise_by = 0.0
    ran_top = None
    for predicted, measured in fitted:
        raise_by = max(raise_by, measured - predicted)
        ran_top = predicted if ran_top is None else max(ran_top, predicted)
    for predicted in out_of_memory:
        need = capacity_gib - predicted + margin_gib
        if ran_top is not None:
            need = min(need, capacity_gib - ran_top)
        raise_by = max(raise_by, need)
    return overhead_gib + max(0.0, raise_by)
