"""Predicted against published: every calibration run, the fitted constants, and
leave-one-group-out and leave-one-source-out cross-validation against a naive estimator.

    python benchmarks/fidelity_published.py            # the table, the fit, the cross-validation
    python benchmarks/fidelity_published.py --write    # also write the fitted constants into the presets

The cost model's figures come from kernel-level public data (hardware_profiles/presets/*.json:
datasheet peaks, measured maximum GEMM throughput, FlashAttention kernel efficiencies, NCCL's
latency model). Three constants per stack (five for the stacks of SPLIT), each with a physical
meaning, are fitted to the published runs of benchmarks/published_cases.py (least squares in
log(predicted / published), each group of runs weighted equally, so that one large table does
not decide the fit):

- sustained_fraction: throughput a training loop sustains relative to microbenchmarks
  (clocks under sustained power, synchronisation), multiplying GEMM and attention rates. For
  the stacks of SPLIT, one per GPU generation (sustained_fraction for Hopper and any device
  without an entry of its own, sustained_fraction_ampere for the A100s): how much of a generation's measured peak
  a stack's kernels reach is the software's, and only there did one software release run on
  both generations (llm-foundry's one benchmark table, IBM's one blog). Megatron's A100 runs
  are NeMo's 2022 releases and its H100 runs 2024-2026 ones, DeepSpeed has no H100 run, and
  pooled over the stacks, which pull apart, a fraction per generation cross-validated worse:
  one value there;
- kernel_overhead_us: the gap per modelled operator (launches, casts and copies around it);
- overlap_efficiency: the fraction of overlapped communication that is free (1 - the
  slowdown compute suffers while a collective runs beside it);
- step_overhead_s (the stacks of SPLIT): the time per optimizer step the GPUs wait on the
  training loop's host work (the optimizer's launches, gradient clipping, metrics and logging,
  the next batch). Eager PyTorch loops spend tens of milliseconds there, which steps of
  0.6-2.5 s show (llm-foundry's small models, IBM's 7B and 13B on H100): predicted with none,
  they came out 5-21% fast while steps of 5 s and more of the same tables did not. The other stacks' runs take seconds
  per step and cannot tell it from the sustained fraction: 0 there (and in the pooled fit).

Naive estimator: a constant fraction of peak FLOP/s (model FLOPs), fitted to the same runs.
Cross-validation: for each group, fit both on the other groups and predict it; and for each
source (benchmarks/published_cases.py:SOURCES: a code base's or publisher's tables, which are
not independent of one another), fit both without any of its groups and predict them.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # runnable as a script from anywhere
from benchmarks.published_cases import Case, cases, source_of  # noqa: E402
from cost_models import fit as fitlib  # noqa: E402
from cost_models import tables  # noqa: E402
from cost_models.estimate import estimate  # noqa: E402
from cost_models.fit import NAMES  # noqa: E402
from hardware_profiles import (  # noqa: E402
    PRESET_DIR,
    UNCALIBRATED,
    UNCALIBRATED_WIDENING,
    uncalibrated_entry,
    uncalibrated_reason,
    widened,
)
from planner.specs import Uncertainty  # noqa: E402

STACK_DIR = Path(__file__).resolve().parent.parent / "planner" / "stacks"


# The fitted constants: cost_models/fit.py's three, the sustained fraction being Hopper's (and
# that of any later or unmeasured device: the "*" entry of a stack's constants.json), plus the
# sustained fraction on Ampere (the A100 presets' own entries) and the host time per step
# (StackConstants.step_overhead_s).
AMPERE = ("dgx-a100-40gb", "dgx-a100-80gb")  # the calibrated presets of the older generation
CONSTANTS = fitlib.CONSTANTS + (
    fitlib.Constant("sustained_fraction_ampere", 0.5, 1.0, 0.85, "sustained_fraction on the A100s (Ampere)"),
    fitlib.Constant("step_overhead_s", 0.0, 0.5, 0.0, "host time per optimizer step, s"),
)
FITTED = tuple(c.name for c in CONSTANTS)
# The stacks whose runs measured the same software on both generations (see the module's
# docstring): each has a sustained fraction per generation, and a host time per step; the others
# one fraction for every device and no host time.
SPLIT = ("torchtitan",)


def _fit(res, split: bool, sweeps: int = 3, prior=None, start=None):
    """fit_constants over CONSTANTS (split) or cost_models/fit.py's three, the Ampere fraction
    then tied to the other and no host time per step; from `start`, one sweep within WARM of
    it. In CONSTANTS' order."""
    k = len(CONSTANTS) if split else len(NAMES)
    kw = dict(constants=CONSTANTS[:k], free=FITTED[:k])
    if prior is not None:
        kw["prior"] = fitlib.Prior(tuple(prior.centre[:k]), tuple(prior.width[:k]), prior.weight)
    if start is not None:
        kw.update(start=tuple(start[:k]), within=WARM[:k])
        sweeps = 1
    th = fitlib.fit_constants(res if split else (lambda t: res(tied(t))), sweeps, **kw)
    return tuple(th) if split else tied(th)


def tied(theta) -> tuple:
    """cost_models/fit.py's three constants in CONSTANTS' order: one sustained fraction, no host time."""
    return (*theta[:3], theta[0], 0.0)


def on_ampere(cluster) -> bool:
    return cluster.name in AMPERE


def device_constants(cluster, theta) -> tuple:
    """The three constants (cost_models/fit.py) that `theta` (in CONSTANTS' order) gives `cluster`."""
    sf = theta[3] if len(theta) > 3 and on_ampere(cluster) else theta[0]
    return (sf, theta[1], theta[2])


def with_constants(c: Case, theta) -> Case:
    """Case c with theta (in CONSTANTS' order) as the constants of its stack on its device."""
    step = theta[4] if len(theta) > 4 else None  # None: the entry's
    cluster = fitlib.with_constants(c.cluster, c.job.target, device_constants(c.cluster, theta), step_overhead_s=step)
    return Case(c.name, c.group, c.model, cluster, c.job, c.plan, c.metric, c.published, c.peak_memory_gib)


def predict(c: Case, theta=None):
    """(predicted metric, estimate) of case c with constants theta (None: as the presets ship)."""
    cc = with_constants(c, theta) if theta is not None else c
    est = estimate(cc.model, cc.cluster, cc.job, cc.plan)
    return c.predicted(est), est


def naive(c: Case, fraction: float, est) -> float:
    """A constant fraction of peak: model FLOPs per token at `fraction` of the dense peak."""
    peak = c.cluster.device.peak_tflops[c.job.precision] * 1e12
    flops_per_token = est.model_flops_per_step / (c.job.global_batch_size * c.job.seq_len)
    tokens = fraction * peak / flops_per_token
    if c.metric == "tokens_per_s_per_gpu":
        return tokens
    return fraction * peak / 1e12 * est.hardware_tflops_per_gpu / est.model_tflops_per_gpu


def _groups(cs):
    g = defaultdict(list)
    for c in cs:
        g[c.group].append(c)
    return g


def residuals(cs):
    """The runs' (group, log(predicted / published)) as a function of the constants."""
    return lambda theta: ((c.group, math.log(predict(c, theta)[0] / c.published)) for c in cs)


def fit(cs, sweeps: int = 3, start=None):
    """The pooled constants that fit runs cs best (cost_models/fit.py:fit_constants), one
    sustained fraction for every device; from `start` (a fit on a superset of cs), one sweep
    within WARM of it."""
    return _fit(residuals(cs), False, sweeps, start=start)


# Cross-validation starts each fold's fit from the fit on every run and searches this far around it
# (one sweep): a fold leaves out one group of 17, which moves the constants by far less.
WARM = (0.08, 12.0, 0.25, 0.08, 0.1)


def fit_naive(cs) -> float:
    """Geometric-mean fraction of peak that reproduces the runs (groups weighted equally)."""
    per = defaultdict(list)
    for c in cs:
        _, est = predict(c)
        per[c.group].append(math.log(c.published / naive(c, 1.0, est)))
    return math.exp(sum(sum(v) / len(v) for v in per.values()) / len(per))


def mape(pairs) -> float:
    return 100 * sum(abs(p / q - 1) for p, q in pairs) / len(pairs)


LN2 = math.log(2)


def per_term_widths(resid, comm_share) -> tuple[float, float]:
    """(sd_compute, sd_communication) maximising the likelihood of the residuals under
    log(predicted / published) ~ N(0, ((1 - f) sd_c)^2 + (f sd_m)^2), f a run's communication
    share, with sd_c <= sd_m <= ln 2 (communication figures come from microbenchmarks on idle
    networks: never more certain than compute; exposed communication is what is left of a
    collective once compute hides part of it, so a factor 2 at one sd is a wide but physical
    bound, which the runs, at most ~15% communication, cannot pin down further). Grid search."""

    def nll(sc, sm):
        tot = 0.0
        for r, f in zip(resid, comm_share):
            var = ((1 - f) * sc) ** 2 + (f * sm) ** 2
            tot += 0.5 * math.log(var) + r * r / (2 * var)
        return tot

    def best(xs, ys):
        return min(((sc, sm) for sc in xs for sm in ys if sm >= sc), key=lambda x: nll(*x))

    coarse = best([0.02 * i for i in range(1, 35)], [0.02 * i for i in range(1, 35)] + [LN2])  # up to ln 2
    near = [[v + 0.005 * d for d in range(-4, 5) if 0 < v + 0.005 * d <= LN2] for v in coarse]
    return best(*near)


def coverage_scale(resid, comm_share, sds, coverage: float) -> float:
    """The factor k such that `coverage` of the runs lie within k x their predicted sd: the
    intervals then hold the stated share of held-out runs whatever the residuals' shape."""
    z = sorted(abs(r) / math.hypot((1 - f) * sds[0], f * sds[1]) for r, f in zip(resid, comm_share))
    return z[min(len(z) - 1, math.ceil(coverage * len(z)) - 1)]


# --------------------------------------------------------------------------- per stack

STACKS = ("megatron", "deepspeed", "torchtitan")  # each fitted on its own runs (published_cases.py:stack_of)
SHARED = {"accelerate": "torchtitan"}  # Accelerate runs PyTorch FSDP2 with eager kernels, as torchtitan does
# A stack's constants are pulled towards the pooled fit (the other stacks' runs included): a
# move of one width costs as much as every group of the stack being off by sqrt(PRIOR_WEIGHT)
# in log (10%), so a stack with few runs stays near the pooled constants unless its runs insist.
# The host time per step has no pooled value to be pulled towards (the pooled fit has none): its
# width, 1 s, only says that it is well under a second.
PRIOR_WIDTH = (0.1, 15.0, 0.3, 0.1, 1.0)
PRIOR_WEIGHT = 0.01
MIN_GROUPS_FOR_OWN_INTERVAL = 4  # fewer: the interval's widths come from every stack's residuals


def dense(cs):
    """The runs the constants are fitted on: dense models. A mixture-of-experts layer runs other
    kernels (grouped GEMMs, token permutation, the router) whose speed the dense constants do not
    measure, and its predictions err both ways (0.75-1.3x on Megatron): fitted in, they would pull
    every dense prediction off. MoE runs are predicted with their stack's constants, and their
    cross-validated errors widen the stack's interval."""
    return [c for c in cs if not c.model.is_moe]


def stack_fit(cs, pooled, sweeps: int = 3, start=None):
    """A stack's constants: its dense runs' fit, pulled towards the pooled constants (PRIOR_*);
    from `start` as fit() does."""
    own = dense(cs)
    if not own:
        return tuple(pooled)
    split = own[0].job.target.value in SPLIT
    return _fit(
        residuals(own), split, sweeps, prior=fitlib.Prior(tuple(pooled), PRIOR_WIDTH, PRIOR_WEIGHT), start=start
    )


def fit_naive_of(cs) -> float:
    return fit_naive(cs) if cs else 0.5


@dataclass
class Held:
    """One run predicted by constants fitted without its group."""

    case: Case
    stack: str
    model: float  # predicted by the stack's constants
    pooled: float  # predicted by the pooled constants (what `generic` ships)
    naive: float  # by the stack's naive constant
    comm_share: float
    fold: str = ""  # what was left out with it (its group, or its source)

    def __post_init__(self):
        self.fold = self.fold or self.case.group  # left out with its group unless said otherwise


def comm_share(est) -> float:
    b = est.time_breakdown_s
    return (b.tp_communication + b.pp_communication + b.dp_communication_exposed) / est.step_time_s


def by_group(c: Case) -> str:
    return c.group


def by_source(c: Case) -> str:
    return source_of(c.group)


def cross_validate(cs, thetas: dict, fold: Callable[[Case], str] = by_group) -> list[Held]:
    """Leave one fold out (a group, or with `fold=by_source` every group of one source): for
    each fold, the pooled and each stack's constants and the naive fraction fitted on every
    other fold (each fit started from the fit on every run, `thetas`), then the fold's runs
    predicted. A stack none of whose runs are left is predicted with the pooled constants and
    the pooled naive fraction."""
    out = []
    folds: dict[str, list[Case]] = defaultdict(list)
    for c in cs:
        folds[fold(c)].append(c)
    for f, fcs in folds.items():
        rest = [c for c in cs if fold(c) != f]
        pooled = fit(dense(rest), start=thetas["generic"])
        for stack in dict.fromkeys(c.job.target.value for c in fcs):
            rest_stack = [c for c in rest if c.job.target.value == stack]
            own = stack_fit(rest_stack, pooled, start=thetas[stack]) if dense(rest_stack) else pooled
            fr = fit_naive_of(rest_stack) if rest_stack else fit_naive(rest)
            for c in fcs:
                if c.job.target.value != stack:
                    continue
                p, est = predict(c, own)
                q, _ = predict(c, pooled)
                out.append(Held(c, stack, p, q, naive(c, fr, est), comm_share(est), f))
    return out


@dataclass(frozen=True)
class Interval:
    sds: tuple  # (compute, communication) log sd
    k: float  # multiple of the sd holding 80% of the residuals

    def halfwidth(self, f: float) -> float:
        return self.k * math.hypot((1 - f) * self.sds[0], f * self.sds[1])

    def factors(self) -> tuple:
        return math.exp(self.k * self.sds[0]), math.exp(self.k * self.sds[1])


def interval_of(resid, shares, coverage: float = 0.8) -> Interval:
    sds = per_term_widths(resid, shares)
    return Interval(sds, coverage_scale(resid, shares, sds, coverage))


def _interval_sample(held: list[Held], stack: str, pooled: bool = False):
    """The cross-validated residuals a stack's interval is fitted on: its own where it has
    MIN_GROUPS_FOR_OWN_INTERVAL groups, else every stack's."""
    own = [h for h in held if h.stack == stack]
    if pooled:
        return [(math.log(h.pooled / h.case.published), h.comm_share, h.fold) for h in held]
    if len({h.case.group for h in own}) < MIN_GROUPS_FOR_OWN_INTERVAL:
        own = held
    return [(math.log(h.model / h.case.published), h.comm_share, h.fold) for h in own]


# How much wider the interval grows per doubling beyond the calibrated region (planner/specs/
# cluster.py:Uncertainty.widening): checked below on each source left out, whose runs beyond the
# region of the other sources' runs are widened as a plan beyond the shipped region is.
EXTRAPOLATION = 0.5


def gpus_of(c: Case) -> int:
    return c.plan.dp * c.plan.cp * c.plan.tp * c.plan.pp


def shard_of(c: Case) -> int:
    """Ranks of the run's ZeRO shard group (0: no ZeRO)."""
    return ((c.plan.dp_shard or c.plan.dp) * c.plan.cp) if c.plan.zero_stage else 0


def region_of(cs) -> tuple[int, int]:
    """(GPUs of the largest run, ranks of the largest ZeRO shard group) of runs cs."""
    return max(map(gpus_of, cs)), max([shard_of(c) for c in cs] + [1])


def widening(region: tuple[int, int], c: Case, extrapolation: float = EXTRAPOLATION) -> float:
    u = Uncertainty(
        relative=0.1,
        coverage=0.8,
        calibrated_gpus=region[0],
        calibrated_shard=region[1],
        extrapolation=extrapolation,
    )
    return u.widening(gpus_of(c), shard_of(c))[0]


@dataclass
class Coverage:
    """An interval's coverage measured on folds left out: inside / checked, in and out of the
    region of the runs it was fitted on (out: widened)."""

    inside: int = 0
    checked: int = 0
    inside_out: int = 0
    out: int = 0

    @property
    def share(self) -> float:
        return self.inside / max(1, self.checked)


def stack_interval_by_source(
    held: list[Held], stack: str, pooled: bool = False, extrapolation: float = EXTRAPOLATION
) -> tuple[Interval, Coverage, tuple[int, int]]:
    """(the stack's interval fitted on the leave-one-source-out residuals `held`, its coverage,
    the region of its runs): the coverage fits it again without each source and counts that
    source's runs inside it, widened where they leave the region of the other sources' runs."""
    sample = _interval_sample(held, stack, pooled)
    iv = interval_of([r for r, _, _ in sample], [f for _, f, _ in sample])
    checked = [h for h in held if pooled or h.stack == stack]
    cov = Coverage()
    for g in {h.fold for h in checked}:
        rest = [(r, f) for r, f, gg in sample if gg != g]
        if len(rest) < 3:
            continue
        ivg = interval_of([r for r, _ in rest], [f for _, f in rest])
        others = [h.case for h in checked if h.fold != g] or [h.case for h in held if h.fold != g]
        region, devices = region_of(others), {c.cluster.device.name for c in others}
        for h in checked:
            if h.fold == g:
                r = math.log((h.pooled if pooled else h.model) / h.case.published)
                k = widening(region, h.case, extrapolation)
                unseen = h.case.cluster.device.name not in devices  # a stack x device pair without runs
                k *= UNCALIBRATED_WIDENING if unseen else 1.0
                ok = abs(r) <= k * ivg.halfwidth(h.comm_share)
                cov.inside += ok
                cov.checked += 1
                if gpus_of(h.case) > region[0] or shard_of(h.case) > region[1] or unseen:
                    cov.out += 1
                    cov.inside_out += ok
    return iv, cov, region_of([h.case for h in checked])


def stack_interval(held: list[Held], stack: str, pooled: bool = False) -> tuple[Interval, float, int]:
    """(the stack's interval, its out-of-fold coverage, runs it was checked on): the stated
    interval is fitted on all the cross-validated residuals; its coverage is measured by
    fitting it again without each fold (a group, or a source: what `held` left out) and
    counting that fold's runs inside."""
    sample = _interval_sample(held, stack, pooled)
    iv = interval_of([r for r, _, _ in sample], [f for _, f, _ in sample])
    checked = [h for h in held if pooled or h.stack == stack]
    inside = 0
    for g in {h.fold for h in checked}:
        rest = [(r, f) for r, f, gg in sample if gg != g]
        if len(rest) < 3:
            continue
        ivg = interval_of([r for r, _ in rest], [f for _, f in rest])
        for h in checked:
            if h.fold == g:
                r = math.log((h.pooled if pooled else h.model) / h.case.published)
                inside += abs(r) <= ivg.halfwidth(h.comm_share)
    return iv, inside / max(1, len(checked)), len(checked)


def _print_runs(cs, thetas, frac):
    print(
        f"\n{'run':58s} {'stack':10s} {'published':>10s} {'model':>6s} {'naive':>6s}  compute  tp   pp  bubble dp-exp  fits"
    )
    for c in cs:
        p, est = predict(c, thetas[c.job.target.value])
        b, t = est.time_breakdown_s, est.step_time_s

        def share(x, t=t):
            return f"{100 * x / t:4.0f}%"

        print(
            f"{c.name[:58]:58s} {c.job.target.value:10s} {c.published:10.1f} {p / c.published:6.2f} "
            f"{naive(c, frac[c.job.target.value], est) / c.published:6.2f}  {share(b.compute + b.recompute)} "
            f"{share(b.tp_communication)} {share(b.pp_communication)} {share(b.pipeline_bubble)} "
            f"{share(b.dp_communication_exposed)}  {'yes' if est.fits else 'NO'} {est.peak_memory_gib:.1f}/{est.memory_capacity_gib:.0f}"
        )


def _print_cv(held: list[Held], what: str = "group"):
    print(
        f"\nleave-one-{what}-out cross-validation (constants fitted without the {what}; ratio = predicted / published)"
    )
    print(
        f"{'stack':10s} {'group':28s} {'runs':>4s} {'model MAPE':>10s} {'naive MAPE':>10s} {'pooled MAPE':>11s}  better"
    )
    for stack in STACKS:
        for g in dict.fromkeys(h.case.group for h in held if h.stack == stack):
            hs = [h for h in held if h.case.group == g]
            m = mape([(h.model, h.case.published) for h in hs])
            n = mape([(h.naive, h.case.published) for h in hs])
            q = mape([(h.pooled, h.case.published) for h in hs])
            print(f"{stack:10s} {g:28s} {len(hs):4d} {m:9.1f}% {n:9.1f}% {q:10.1f}%  {'yes' if m < n else 'NO'}")
    groups = list(dict.fromkeys(h.case.group for h in held))
    wins = sum(
        mape([(h.model, h.case.published) for h in held if h.case.group == g])
        < mape([(h.naive, h.case.published) for h in held if h.case.group == g])
        for g in groups
    )
    print(
        f"leave-one-{what}-out: the model beats the naive estimator on {wins} of {len(groups)} groups; "
        f"MAPE over all {len(held)} runs {mape([(h.model, h.case.published) for h in held]):.1f}% "
        f"(naive {mape([(h.naive, h.case.published) for h in held]):.1f}%)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--write",
        action="store_true",
        help="write the fitted constants into hardware_profiles/presets (pooled) and planner/stacks/*/constants.json",
    )
    ap.add_argument(
        "--no-mechanisms", action="store_true", help="skip flipping each mechanism (saves about two minutes each)"
    )
    args = ap.parse_args()
    every, skipped = cases()
    # Runs on hardware the shipped presets mark uncalibrated (hardware_profiles.UNCALIBRATED:
    # Blackwell, AMD) are held out of every fit and interval: they check those presets, whose
    # constants are the A100/H100 ones and whose intervals are widened (printed at the end).
    cs = [c for c in every if c.cluster.name not in UNCALIBRATED]
    new_hardware = [c for c in every if c.cluster.name in UNCALIBRATED]
    pooled = fit(dense(cs))
    thetas = {"generic": pooled}
    frac = {"generic": fit_naive(cs)}
    print(
        f"{len(cs)} runs in {len(_groups(cs))} groups; the constants, each a property of the software that runs the plan:"
    )
    for c in CONSTANTS:
        print(f"  {c.name}: {c.meaning} (fitted within {c.lo:g}-{c.hi:g})")
    print(
        f"{'stack':10s} {'runs':>4s} {'groups':>6s}  "
        + " ".join(f"{n:>19s}" for n in (*NAMES, "(on Ampere)", "step_overhead_s"))
        + "  fit (rms log ratio)"
    )
    for stack in (*STACKS, "generic"):
        own = cs if stack == "generic" else [c for c in cs if c.job.target.value == stack]
        if stack != "generic":
            thetas[stack] = stack_fit(own, pooled)
            frac[stack] = fit_naive_of(own)
        th = thetas[stack]
        rms = math.sqrt(fitlib.loss(residuals(dense(own)), th))
        print(
            f"{stack:10s} {len(own):4d} {len(_groups(own)):6d}  "
            + " ".join(f"{v:19.3f}" for v in th)
            + f"  {rms:.3f}"
            + (f"  ({len(dense(own))} dense runs fitted" + (", every stack's)" if stack == "generic" else ")"))
        )
    _print_runs(cs, thetas, frac)
    held = cross_validate(cs, thetas)
    _print_cv(held)
    by_src = cross_validate(cs, thetas, by_source)
    print(
        f"\n{len({by_source(c) for c in cs})} sources (published_cases.py:SOURCES): a source's groups are left out together"
    )
    _print_cv(by_src, "source")
    intervals, regions = _print_intervals(held, by_src)
    if not args.no_mechanisms:
        _print_mechanisms(cs, by_src)
    if new_hardware:
        _print_new_hardware(new_hardware, thetas, frac, intervals)
    resid = sorted(abs(math.log(h.model / h.case.published)) for h in held)
    print(
        f"cross-validated |log ratio| with each run's stack constants: median {resid[len(resid) // 2]:.3f}, "
        f"80th percentile {resid[int(0.8 * (len(resid) - 1))]:.3f}"
    )
    print(f"\nexcluded {len(skipped)} records:")
    why = defaultdict(int)
    for _, w in skipped:
        why[w] += 1
    for w, k in sorted(why.items(), key=lambda x: -x[1]):
        print(f"  {k:3d}  {w}")
    if args.write:
        write_constants(thetas, intervals, regions, devices_of(cs), len(cs))


# The model's mechanisms beyond the alpha-beta cost of each operator, each checked by flipping it
# (cost_models/tables.py:MECHANISMS, and the per-generation constants of SPLIT) and cross-validating
# by source again; MOTIVATED_BY names the groups whose residuals suggested it, which its verdict
# leaves out: a mechanism earns its place by what it does to the others.
MOTIVATED_BY = {
    "calls_as_issued": (),  # suggested by held-out runs (sharded data parallelism at scale), none of these
    "fp32_gradient_reduce": (),  # a default of two stacks' code, suggested by no group
    "per_generation_fraction": ("llm_foundry_h100", "llm_foundry_a100_80gb", "ibm_fsdp_blog_2024"),
}


@contextmanager
def flipped(name: str):
    """The model with mechanism `name` turned the other way (on -> off, or off -> on)."""
    global SPLIT
    if name == "per_generation_fraction":
        saved, SPLIT = SPLIT, (() if SPLIT else ("torchtitan",))
        try:
            yield
        finally:
            SPLIT = saved
        return
    tables.MECHANISMS[name] = not tables.MECHANISMS[name]
    try:
        yield
    finally:
        tables.MECHANISMS[name] = not tables.MECHANISMS[name]


def shipped(name: str) -> bool:
    return bool(SPLIT) if name == "per_generation_fraction" else tables.MECHANISMS[name]


def refit(cs) -> dict:
    pooled = fit(dense(cs))
    return {"generic": pooled, **{st: stack_fit([c for c in cs if c.job.target.value == st], pooled) for st in STACKS}}


def group_mapes(held: list[Held]) -> dict:
    return {
        g: mape([(h.model, h.case.published) for h in held if h.case.group == g])
        for g in dict.fromkeys(h.case.group for h in held)
    }


# Refitting the same runs from another start moves a group's cross-validated MAPE by a few
# hundredths of a point: a mechanism must lower the other groups' mean by more to be kept.
NOISE = 0.05


def _print_mechanisms(cs, by_src: list[Held]) -> None:
    """Each mechanism flipped: the leave-one-source-out MAPE of each group with it and without,
    and the verdict on the groups that did not motivate it (kept if it lowers their mean by more
    than NOISE points; a flip that changes nothing leaves it as shipped)."""
    print(
        "\nmechanisms (cost_models/tables.py:MECHANISMS; SPLIT), each flipped and cross-validated by source again: "
        "leave-one-source-out MAPE with / without it"
    )
    base = group_mapes(by_src)
    for name, motivated in MOTIVATED_BY.items():
        with flipped(name):
            other = group_mapes(cross_validate(cs, refit(cs), by_source))
        on, off = (base, other) if shipped(name) else (other, base)
        rest = [g for g in base if g not in motivated]
        mean_on, mean_off = (sum(m[g] for g in rest) / len(rest) for m in (on, off))
        better = sum(on[g] < off[g] - 0.05 for g in rest)
        worse = sum(on[g] > off[g] + 0.05 for g in rest)
        keep = mean_on < mean_off - NOISE  # a real improvement, beyond the refits' noise
        state = "on" if shipped(name) else "off"
        tie = abs(mean_on - mean_off) <= NOISE
        verdict = (
            ("kept" if shipped(name) else "kept off")
            if keep == shipped(name) or (tie and not shipped(name))
            else "FLIP IT"
        )
        moved = ", ".join(f"{g} {on[g]:.1f}/{off[g]:.1f}" for g in sorted(rest, key=lambda g: -abs(on[g] - off[g]))[:4])
        print(
            f"  {name:26s} ({state}) other groups' mean {mean_on:.2f}% with / {mean_off:.2f}% without "
            f"({better} better, {worse} worse by > 0.05 points): {verdict}; most moved: {moved}"
        )
        if motivated:
            mine = [g for g in motivated if g in base]
            print("    the groups that motivated it: " + ", ".join(f"{g} {on[g]:.1f}/{off[g]:.1f}" for g in mine))


def _print_intervals(held: list[Held], by_src: list[Held]) -> tuple[dict, dict]:
    """Each stack's interval, fitted on the leave-one-source-out residuals, and its coverage on
    each source left out (widened beyond the other sources' region), beside the coverage of an
    interval fitted on the leave-one-group-out residuals measured on each group left out; then
    the coverage of runs beyond the region at other growths per doubling. (intervals, regions)."""
    print(
        "\nintervals fitted on the leave-one-source-out residuals; coverage measured on each source left out (the "
        "interval fitted without it, widened by x(1 + "
        f"{EXTRAPOLATION:g} log2(n / largest)) for runs beyond the other sources' GPUs or ZeRO shard group), beside an "
        "interval fitted on the leave-one-group-out residuals measured on each group left out"
    )
    intervals, regions = {}, {}
    for stack in (*STACKS, "generic"):
        pooled = stack == "generic"
        iv, cov, region = stack_interval_by_source(by_src, stack, pooled)
        _, cov_group, _ = stack_interval(held, stack, pooled)
        intervals[stack], regions[stack] = iv, region
        fc, fm = iv.factors()
        out = (
            f"{cov.inside_out} of {cov.out} beyond the region or on a device without runs inside"
            if cov.out
            else "none beyond the region"
        )
        print(
            f"{stack:10s} compute x/ {fc:.3f}, communication x/ {fm:.3f} (log sd {iv.sds[0]:.3f} / {iv.sds[1]:.3f}); "
            f"stated 80%, out-of-source {100 * cov.share:.0f}% of {cov.checked} runs ({out}); out-of-group "
            f"{100 * cov_group:.0f}%; region {region[0]:,} GPUs, shard group {region[1]:,}"
        )
    for w in (0.0, 0.25, 1.0):
        covs = [stack_interval_by_source(by_src, st, st == "generic", w)[1] for st in STACKS]
        print(
            f"  growth {w:g} per doubling instead: out-of-source {100 * sum(c.inside for c in covs) / max(1, sum(c.checked for c in covs)):.0f}%, "
            f"beyond the region {sum(c.inside_out for c in covs)} of {sum(c.out for c in covs)} inside (the stacks' own)"
        )
    return intervals, regions


def _print_new_hardware(cs, thetas, frac, intervals) -> None:
    """Runs on uncalibrated hardware, predicted with the constants fitted on every calibrated
    run (none of them fitted on these): per group the MAPE against the naive estimator's (the
    stack's fraction of peak), and how many runs fall inside the stack's interval widened as
    the uncalibrated presets widen it (log half-width x UNCALIBRATED_WIDENING)."""

    print(
        f"\nuncalibrated hardware ({', '.join(sorted({c.cluster.name for c in cs}))}): {len(cs)} runs held out of every fit, "
        f"predicted with the shipped constants; interval = the stack's x{UNCALIBRATED_WIDENING:g} in log"
    )
    _print_runs(cs, thetas, frac)
    print(
        f"{'stack':10s} {'group':28s} {'runs':>4s} {'model MAPE':>10s} {'naive MAPE':>10s}  better  inside widened interval"
    )
    for g, gcs in _groups(cs).items():
        stack = gcs[0].job.target.value
        pairs, naive_pairs, inside = [], [], 0
        for c in gcs:
            p, est = predict(c, thetas[stack])
            pairs.append((p, c.published))
            naive_pairs.append((naive(c, frac[stack], est), c.published))
            inside += abs(math.log(p / c.published)) <= UNCALIBRATED_WIDENING * intervals[stack].halfwidth(
                comm_share(est)
            )
        m, n = mape(pairs), mape(naive_pairs)
        print(
            f"{stack:10s} {g:28s} {len(gcs):4d} {m:9.1f}% {n:9.1f}%  {'yes' if m < n else 'NO':6s}  {inside} of {len(gcs)}"
        )


def _uncertainty(iv: Interval, region: tuple[int, int]) -> dict:
    fc, fm = iv.factors()
    q = max(fc, fm)
    return {
        "relative": round(q - 1, 4),
        "coverage": 0.8,
        "compute": round(fc - 1, 4),
        "communication": round(fm - 1, 4),
        "calibrated_gpus": region[0],
        "calibrated_shard": region[1],
        "extrapolation": EXTRAPOLATION,
    }


def devices_of(cs) -> dict:
    """Per stack (and `generic`), the devices (DeviceSpec.name) its calibrated runs ran on."""
    out: dict = defaultdict(set)
    for c in cs:
        out[c.job.target.value].add(c.cluster.device.name)
        out["generic"].add(c.cluster.device.name)
    return out


def write_constants(thetas: dict, intervals: dict, regions: dict, devices: dict, runs: int) -> None:
    """The pooled constants as every preset's own (what `generic` and profiles without a stack
    entry use); each stack's in its folder's constants.json (planner/stacks/<stack>/), which the
    preset loader adds to every preset: an entry for each device the stack's runs ran on (the
    Ampere sustained fraction on an A100 for the stacks of SPLIT), and for any other device ("*")
    the same constants with the interval widened (log half-width x UNCALIBRATED_WIDENING) and
    saying why: a stack x device pair without runs. A stack with no runs of its own (SHARED) is
    widened everywhere. An uncalibrated preset (hardware_profiles.UNCALIBRATED: no run here was
    measured on its device) gets the constants with its intervals widened once, as its own
    stack_constants."""
    today = date.today().isoformat()
    ampere = {json.loads((PRESET_DIR / f"{p}.json").read_text())["device"]["name"] for p in AMPERE}
    base = {}
    for stack in (*STACKS, *SHARED):
        src = SHARED.get(stack, stack)
        t = thetas[src]

        def entry(sf, where, t=t, src=src):
            host = (
                {"step_overhead_s": round(t[4], 4)} if src in SPLIT else {}
            )  # the others have none (module docstring)
            return {
                "sustained_fraction": round(sf, 4),
                "kernel_overhead_us": round(t[1], 3),
                "overlap_efficiency": round(t[2], 4),
                **host,
                "uncertainty": _uncertainty(intervals[src], regions[src]),
                "provenance": f"benchmarks/fidelity_published.py {today}: fitted on the {src} runs of "
                f"benchmarks/data (of {runs}), pulled towards the pooled fit; sustained fraction {where}",
            }

        def fraction(name: str, t=t, src=src) -> tuple:
            if src in SPLIT and name in ampere:
                return t[3], "of Ampere (A100 runs)"
            return t[0], "of Hopper (H100 runs)" if src in SPLIT else "one for every device"

        base[stack] = entry(*fraction("*"))
        mine = sorted(devices[src]) if stack == src else []
        why = (
            f"no published {stack} run on this device: the constants of its runs on {', '.join(mine)}"
            if mine
            else f"no published {stack} run: the constants of {src}'s runs"
        ) + f", log half-width x{UNCALIBRATED_WIDENING:g}"

        def wide(e: dict, why=why) -> dict:
            return {**e, "uncertainty": {**widened(e["uncertainty"]), "widened_for": why}}

        anywhere = wide(base[stack])
        # a shared stack (no runs of its own) keeps its source's per-device fractions, widened everywhere
        shared = [] if stack == src else sorted(n for n in devices[src] if fraction(n) != fraction("*"))
        own = {name: entry(*fraction(name)) for name in mine} | {name: wide(entry(*fraction(name))) for name in shared}
        (STACK_DIR / stack / "constants.json").write_text(json.dumps({"*": anywhere, **own}, indent=2) + "\n")
    th = thetas["generic"]
    for f in sorted(PRESET_DIR.glob("*.json")):
        data = json.loads(f.read_text())
        data["device"]["sustained_fraction"] = round(th[3] if f.stem in AMPERE else th[0], 4)
        data["device"]["kernel_overhead_us"] = round(th[1], 3)
        data["overlap_efficiency"] = round(th[2], 4)
        data["uncertainty"] = _uncertainty(intervals["generic"], regions["generic"])
        if f.stem in UNCALIBRATED:
            data["uncertainty"] = {
                **widened(data["uncertainty"]),
                "widened_for": uncalibrated_reason(data["device"]["name"]),
            }
            data["stack_constants"] = {s: uncalibrated_entry(e, data["device"]["name"]) for s, e in base.items()}
        f.write_text(json.dumps(data, indent=2) + "\n")
    print("wrote the constants into", PRESET_DIR, "and", STACK_DIR)


if __name__ == "__main__":
    main()
