"""The tune loop: prior -> choose a trial -> measure -> refit -> re-solve, until proven or spent.

Choice rule. Every round the search (planner.api.solve) returns the best layouts under the
refit model, each with an interval x/ exp(w) (planner/tune/refit.py). The next trial is the
untried layout with the lowest lower bound: optimism under uncertainty, the layout that could
beat the measured best by the most if the model errs in its favour, as a lower confidence
bound rule does (Auer et al., "Finite-time analysis of the multiarmed bandit problem", 2002,
for the upper bound of rewards). A layout whose lower bound cannot beat the measured best
by more than the tolerance is never worth a trial. The first trials spread instead: while
the constants are still the prior's (the first SPREAD_TRIALS, at most two thirds of the budget), the
lowest-bound layout with a term no trial has had yet (tp > 1, pp > 1, ZeRO-3, recompute: the
terms whose constants are least certain), with as few other terms as possible (one new term
alone isolates it), whether or not it could win, so the first
measurements tell those terms apart instead of being near-copies of one layout.

Where the refit still misses the trials of a signature (the three constants cannot express
every cost of every machine), the layouts of that signature are chosen and bounded with the
factor its trials measured (_State.corrections): a family measured slower than the model says
is not tried again and again on the model's word.

Noise (issue 44). A trial keeps every timed step; its time is their median (slowest rank
per step). A layout measured several times counts by the median of its trials. When a new
layout lands within noise of the best (NOISE_Z sigma of the difference, or the tolerance),
both are measured again, the incumbent first (A B A B: a drift of the machine's load falls
on both), up to MAX_MEASURES times each and REPEAT_SHARE of the budget in all; the repeats
count against the budget. The noise
(sigma of one trial's log time) is pooled from the repeats (_noise), printed, and widens the
margins: a layout is tried only if it could beat the best by more than max(tolerance, NOISE_Z
sigma), and before the tune says "proven" it measures the best again if nothing was repeated
yet, so that the noise it states is measured. Layouts still within noise of the best at the
end are reported as tied with it (at most three named): an honest tie is a result.

Stop rule: no untried layout's lower bound beats the measured best by more than the
margin (the tolerance, or the noise where larger), once more trials ran than the refit has constants (until then the constants can
match every trial, and the interval is only the prior's, whose constants the refit has left):
proven under the refit model, as the search lists layouts best first, so a layout it
did not list has a bound no lower than the last listed one's), or the trial or time budget
is spent.
"""

from __future__ import annotations

import hashlib
import math
import statistics
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional

from cost_models.estimate import estimate as predict
from cost_models.fit import NAMES
from planner import api
from planner.errors import InfeasibleError, PlannerError
from planner.specs import ClusterSpec, Estimate, JobSpec, ModelSpec, Plan, Recompute, Target, memory_limit_gib
from planner.tune import journal
from planner.tune.executors import Executor, Trial
from planner.tune.journal import TrialRecord, TuneHeader
from planner.tune.refit import FLOOR_LOG, Observation, Refit, refit

MAX_CANDIDATES = 128  # the most layouts one round asks the search for
# At most this many first trials spread over signatures, and two thirds of the trial budget: the
# first trial and one for each of three uncertain terms (tp, pp, ZeRO-3) in a budget of 6, so
# that no term the space holds is left to the prior's word (a budget of 6 spent half on the
# spread left TP unmeasured, and the refit then missed the TP layouts by 40 %+:
# benchmarks/tune.py, December 2026); the rest is spent where the refit model says.
SPREAD_TRIALS = 4
SPREAD_LIST = 64  # layouts listed while the trials spread
# Noise. A difference between two measured layouts counts only beyond NOISE_Z standard deviations
# of the difference of their medians (about 95 % for normal errors); a layout is measured at most
# MAX_MEASURES times. Before any repeat the noise of one trial is what its steps spread (the
# median's standard error, 1.2533 sd / sqrt(n)) or ASSUMED_SIGMA where that is less: refit.py's
# FLOOR_LOG (2 %, a CPU step's run-to-run variation on a quiet machine) as a 2-sigma level.
NOISE_Z = 2.0
MAX_MEASURES = 3
ASSUMED_SIGMA = FLOOR_LOG / NOISE_Z
# At most this share of the trial budget goes to repeats (at least one, to measure the noise):
# on a machine whose noise exceeds the differences between layouts, repeats could otherwise take
# the whole budget (benchmarks/tune.py measured 6 of 9 so, December 2026) and leave layouts
# untried; beyond it, layouts within noise are reported tied.
REPEAT_SHARE = 1 / 3
SIGMA_FLOOR = 1e-3  # the least sigma a layout's weight assumes (0.1 %: below any timer's repeatability)


@dataclass(frozen=True)
class TuneRequest:
    """What `plan tune` tunes: `plan solve`'s inputs on the slice's `gpus`."""

    model: ModelSpec
    cluster: ClusterSpec  # the prior
    gpus: int
    solve: dict = field(default_factory=dict)  # planner.api.solve's keywords (not model, cluster, gpus, top_k)

    @property
    def target(self) -> str:
        return self.solve.get("target") or Target.generic.value

    def search_keywords(self) -> dict:
        return {**self.solve, "target": self.target}


@dataclass(frozen=True)
class Budget:
    trials: int = 8
    time_s: Optional[float] = None
    tolerance: float = 0.02  # a layout must be able to beat the best by more than this to be tried
    candidates: int = 16  # layouts per round to start with (doubled while the proof needs more)
    refit_rounds: int = 6  # pattern moves per refit (planner/tune/refit.py:_fit; 0: plain sweeps, faster)


@dataclass(frozen=True)
class Contender:
    key: str
    plan: Plan
    job: JobSpec
    estimate: Estimate
    low: float  # lower end of its interval, seconds per token
    mid: float  # prediction, seconds per token
    factor: float = 1.0  # the correction of its signature (_State.corrections) in low and mid


@dataclass(frozen=True)
class Noise:
    """How much one trial's measurement of a layout varies: sigma, the standard deviation of its
    log time; `source` says what it was estimated from ("repeats": layouts measured more than
    once, pooled; "steps": the spread of the steps within trials, before any repeat; "assumed":
    ASSUMED_SIGMA, nothing measured says more)."""

    sigma: float
    source: str = "assumed"
    repeats: int = 0  # degrees of freedom behind a "repeats" estimate (measurements beyond each layout's first)

    @property
    def level(self) -> float:
        """The relative difference two single measurements of one layout stay within (NOISE_Z sigma)."""
        return math.expm1(NOISE_Z * self.sigma)

    def describe(self) -> str:
        where = {
            "repeats": f"from {self.repeats} repeat{'s' if self.repeats != 1 else ''}",
            "steps": "from the steps within trials (no layout repeated yet)",
            "assumed": "assumed: nothing repeated yet",
        }[self.source]
        return f"+/- {100 * self.level:.1f} % between two measurements of one layout ({where})"


@dataclass(frozen=True)
class Measured:
    """A layout that ran: its trials that ran (the first first) and each one's time per token of
    the layout as searched; it counts by their median."""

    key: str
    records: tuple[TrialRecord, ...]
    values: tuple[float, ...]

    @property
    def per_token(self) -> float:
        return statistics.median(self.values)

    @property
    def first(self) -> TrialRecord:
        return self.records[0]

    @property
    def step_time_s(self) -> float:
        """The median of its trials' step times (of what ran)."""
        return statistics.median(r.step_time_s or 0.0 for r in self.records)


@dataclass
class TuneResult:
    request: TuneRequest
    records: list[TrialRecord]
    refit: Refit
    best: Optional[TrialRecord]  # the first trial of the best layout (the least median)
    stop: str  # "proven", "trials", "time", "exhausted" (every layout tried)
    margin: Optional[float]  # how much faster the best untried layout could be, fraction (<= tolerance when proven)
    challenger: Optional[Contender]
    exhaustive: int  # feasible layouts in the search space (under the prior's memory model)
    tolerance: float = 0.02
    exhaustive_complete: bool = True  # False: the count stopped at its time limit (a lower bound)
    noise: Noise = field(default_factory=lambda: Noise(ASSUMED_SIGMA))
    measured: list[Measured] = field(default_factory=list)  # every layout that ran, best first
    tied: list[Measured] = field(default_factory=list)  # layouts within noise of the best, best first (<= 3)
    # The refit's error on each layout left out of its fit (mean |predicted / measured - 1|), None
    # with too few layouts to leave one out (fewer than the constants + 2)
    held_out_error: Optional[float] = None

    @property
    def best_step_time_s(self) -> Optional[float]:
        """The best layout's median step time (of what ran)."""
        return self.measured[0].step_time_s if self.measured else None

    @property
    def repeats(self) -> int:
        return sum(r.repeat_of is not None for r in self.records)


def layout_key(plan: Plan) -> str:
    """A layout's identity: a digest of its canonical JSON (12 hex digits)."""
    return hashlib.sha256(plan.model_dump_json().encode()).hexdigest()[:12]


def layout_label(plan: Plan) -> str:
    """A layout in a few words: 'dp2 tp1 pp2 mbs2x4 1f1b z1 rc=sel'."""
    parts = [f"dp{plan.dp}", f"tp{plan.tp}", f"pp{plan.pp}"] + ([f"vpp{plan.vpp}"] if plan.vpp > 1 else [])
    parts += [f"mbs{plan.micro_batch_size}x{plan.num_micro_batches}"] + ([plan.schedule.value] if plan.pp > 1 else [])
    parts.append(f"z{plan.zero_stage}")
    parts += ["sp"] if plan.sequence_parallel else []
    rc = _recompute(plan)
    parts += [f"rc={rc}"] if rc else []
    return " ".join(parts)


def _recompute(plan: Plan) -> str:
    if plan.stage_recompute is not None:
        mix = [(r.selective, r.full) for r in plan.stage_recompute]
        sel, full = sum(m[0] for m in mix), sum(m[1] for m in mix)
        return "" if not sel and not full else f"{sel}sel/{full}full"
    return "" if plan.recompute == Recompute.none else plan.recompute.value[:4]


def signature(plan: Plan) -> tuple[bool, bool, bool, bool]:
    """The terms the first trials tell apart: tp > 1, pp > 1, ZeRO-3, any recompute."""
    return plan.tp > 1, plan.pp > 1, plan.zero_stage == 3, bool(_recompute(plan))


def _tokens(job: JobSpec) -> int:
    return job.global_batch_size * job.seq_len


def search(request: TuneRequest, cluster: ClusterSpec, count: int) -> tuple[list[Contender], bool]:
    """The `count` best layouts under `cluster`, best first, with their intervals; True when
    the search has no more feasible layouts than it returned."""
    try:
        doc = api.solve(request.model, cluster, gpus=request.gpus, top_k=count - 1, **request.search_keywords())
    except InfeasibleError as exc:
        raise InfeasibleError(f"no layout fits under the refit memory model: {exc}") from None
    entries = [(doc.plan, doc.job, doc.estimate)]
    entries += [
        (a.plan, doc.job.model_copy(update={"global_batch_size": a.global_batch_size}), a.estimate)
        for a in doc.alternatives
    ]
    out = []
    for plan, job, est in entries:
        low = est.step_time_interval_s[0] if est.step_time_interval_s else est.step_time_s
        out.append(Contender(layout_key(plan), plan, job, est, low / _tokens(job), est.step_time_s / _tokens(job)))
    out.sort(key=lambda c: c.mid)
    return out, len(out) < count


def measured_layouts(request: TuneRequest, records: list[TrialRecord], cluster: ClusterSpec) -> list[Measured]:
    """Every layout that ran, best (least median time per token) first."""
    by: dict[str, list[TrialRecord]] = {}
    for r in records:
        if r.status == "ok":
            by.setdefault(r.key, []).append(r)
    out = [
        Measured(key, tuple(rs), tuple(measured_per_token(request, r, cluster, r.job) for r in rs))
        for key, rs in by.items()
    ]
    return sorted(out, key=lambda m: (m.per_token, m.first.index))


def _noise(layouts: list[Measured]) -> Noise:
    """The noise of one trial (Noise): pooled over the layouts measured more than once; before
    any repeat, from the steps' spread within trials (the median's standard error), never below
    ASSUMED_SIGMA."""
    squares, dof = 0.0, 0
    for m in layouts:
        if len(m.values) > 1:
            logs = [math.log(v) for v in m.values]
            centre = sum(logs) / len(logs)
            squares += sum((x - centre) ** 2 for x in logs)
            dof += len(logs) - 1
    if dof:
        return Noise(math.sqrt(squares / dof), "repeats", dof)
    within = []
    for m in layouts:
        for r in m.records:
            if len(r.steps_s) > 2:
                logs = [math.log(x) for x in r.steps_s]
                within.append(1.2533 * statistics.stdev(logs) / math.sqrt(len(logs)))
    if within and statistics.mean(within) > ASSUMED_SIGMA:
        return Noise(statistics.mean(within), "steps")
    return Noise(ASSUMED_SIGMA)


def _spread(a: Measured, b: Measured, noise: Noise) -> float:
    """NOISE_Z sigma of the difference of the two layouts' log medians (of so many measurements)."""
    return NOISE_Z * noise.sigma * math.sqrt(1 / len(a.values) + 1 / len(b.values))


def _close(a: Measured, b: Measured, noise: Noise, tolerance: float) -> bool:
    """Whether b cannot be told from a: their medians differ by no more than the tolerance or
    the noise of their difference (_spread)."""
    return abs(math.log(b.per_token / a.per_token)) <= max(math.log1p(tolerance), _spread(a, b, noise))


def observations(
    request: TuneRequest, records: list[TrialRecord], noise: Noise = Noise(ASSUMED_SIGMA)
) -> tuple[list[Observation], list, list[str]]:
    """The layouts that ran (what ran, the median of its trials, weighted by the inverse variance
    of that median: a layout measured k times counts k times one measured once, one whose trials
    spread more counts less), those out of memory (what ran), and the ran ones' keys in order."""
    by: dict[str, list[TrialRecord]] = {}
    oom = []
    for r in records:
        what = r.ran or None
        if r.status == "ok":
            by.setdefault(r.key, []).append(r)
        elif r.status == "oom":
            model, job, plan = (what.model, what.job, what.plan) if what else (request.model, r.job, r.plan)
            oom.append((model, job, plan))
    rows, variances = [], []
    for key, rs in by.items():
        what = rs[0].ran or None
        model, job, plan = (what.model, what.job, what.plan) if what else (request.model, rs[0].job, rs[0].plan)
        times = [r.step_time_s or 0.0 for r in rs]
        logs = [math.log(t) for t in times]
        # the layout's own spread, shrunk towards the pooled noise (two pseudo-measurements at it)
        own = sum((x - sum(logs) / len(logs)) ** 2 for x in logs)
        pooled = max(noise.sigma, SIGMA_FLOOR)  # repeats of a noiseless machine (a fake) measure 0
        variance = (own + 2 * pooled**2) / (len(logs) - 1 + 2) / len(logs)
        rows.append((key, model, job, plan, statistics.median(times), max(r.peak_memory_gib or 0.0 for r in rs)))
        variances.append(variance)
    mean_inverse = sum(1 / v for v in variances) / len(variances) if variances else 1.0
    ran = [
        Observation(model, job, plan, t, peak, weight=(1 / v) / mean_inverse)
        for (_, model, job, plan, t, peak), v in zip(rows, variances)
    ]
    return ran, oom, [row[0] for row in rows]


def measured_per_token(request: TuneRequest, record: TrialRecord, cluster: ClusterSpec, job: JobSpec) -> float:
    """A trial's measured time per token of the layout as searched: where a scaled model ran,
    the measurement times the refit model's ratio of the searched layout to what ran."""
    assert record.step_time_s is not None  # a trial that ran (status ok): TrialRecord's validator
    per_token = record.step_time_s / _tokens(job)
    if record.ran is None:
        return per_token
    full = predict(request.model, cluster, job, record.plan).step_time_s
    small = predict(record.ran.model, cluster, record.ran.job, record.ran.plan).step_time_s
    return per_token * full / small


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def header(request: TuneRequest, executor: Executor) -> TuneHeader:
    return TuneHeader(
        model=request.model,
        cluster=request.cluster,
        gpus=request.gpus,
        solve=request.solve,
        run=executor.describe(),
        started_at=_now(),
    )


def request_of(head: TuneHeader) -> TuneRequest:
    return TuneRequest(head.model, head.cluster, head.gpus, dict(head.solve))


@dataclass
class _State:
    request: TuneRequest
    budget: Budget
    records: list[TrialRecord]
    capacity_gib: float
    fit: Optional[Refit] = None  # the last refit; tune refits first, before anything reads it
    fitted_keys: list[str] = field(default_factory=list)  # the layouts of the last refit's residuals, in order
    queue: list[str] = field(default_factory=list)  # layouts to measure again, in this order

    @property
    def last_fit(self) -> Refit:
        assert self.fit is not None  # tune calls refit() before anything else
        return self.fit

    def measured(self) -> list[Measured]:
        cluster = self.fit.cluster if self.fit is not None else self.request.cluster
        return measured_layouts(self.request, self.records, cluster)

    def noise(self) -> Noise:
        return _noise(self.measured())

    def margin(self) -> float:
        """How much faster than the best a layout must be able to be to be worth a trial."""
        return max(self.budget.tolerance, self.noise().level)

    def refit(self) -> None:
        noise = self.noise()
        ran, oom, self.fitted_keys = observations(self.request, self.records, noise)
        start = self.fit.constants if self.fit is not None else None  # go on from the last fit
        self.fit = refit(
            self.request.cluster,
            self.request.target,
            ran,
            oom,
            self.capacity_gib,
            start,
            self.budget.refit_rounds,
            noise_floor_log=NOISE_Z * noise.sigma if noise.source == "repeats" else 0.0,
        )

    def best(self) -> tuple[Optional[TrialRecord], Optional[float]]:
        """The best measured layout's first trial and its median time per token (the searched layout's)."""
        layouts = self.measured()
        return (layouts[0].first, layouts[0].per_token) if layouts else (None, None)

    def corrections(self) -> dict:
        """Per signature (tp > 1, pp > 1, ZeRO-3, recompute), the factor by which the refit model
        still missed that signature's layouts: exp(-mean log(predicted / measured)). The three
        constants cannot express every cost of every machine (gloo's per-call cost of TP on CPU
        ranks, docs/notebook.md), so a family measured slower than the refit predicts is
        expected to stay so; untried layouts of a measured signature are chosen and bounded
        with it."""
        plans = {r.key: r.plan for r in self.records}
        per: dict[tuple[bool, bool, bool, bool], list[float]] = {}
        for key, residual in zip(self.fitted_keys, self.last_fit.residuals):
            per.setdefault(signature(plans[key]), []).append(residual)
        return {sig: math.exp(-sum(rs) / len(rs)) for sig, rs in per.items()}

    def untried(self) -> tuple[list[Contender], float, bool]:
        """The untried layouts of the search under the refit model (each corrected by its
        signature's factor), best bound first; a floor under every unlisted layout's bound;
        True when the list is all. The search is asked for more layouts only while none
        listed is worth a trial and the floor could still beat the best (the proof needs the
        layouts below the last listed)."""
        tried = {r.key for r in self.records}
        _, best = self.best()
        threshold = best * (1 - self.margin()) if best is not None else math.inf
        factors = self.corrections()
        lowest = min([1.0, *factors.values()])
        count = self.budget.candidates
        if len(self.records) < spread_trials(self.budget):
            count = max(count, SPREAD_LIST)  # the spread looks for every term, not only among the best few
        while True:
            listed, complete = search(self.request, self.last_fit.cluster, count)
            rest = sorted(
                (_corrected(c, factors.get(signature(c.plan), 1.0)) for c in listed if c.key not in tried),
                key=lambda c: c.low,
            )
            floor = listed[-1].low * lowest  # an unlisted layout: no lower than the last listed, corrected the most
            hopeful = any(c.low < threshold for c in rest)
            if hopeful or complete or floor >= threshold or count >= MAX_CANDIDATES:
                return rest, floor, complete
            count = min(2 * count, MAX_CANDIDATES)

    def repeats_wanted(self, stopping: bool) -> list[str]:
        """The layouts to measure again next, in order: the best, then its closest contender
        (interleaved with their earlier trials), while a measured layout is within noise of
        the best, the noise and not the tolerance is what ties them (more measurements can
        still tell them apart) and either has fewer than MAX_MEASURES trials, while repeats are
        fewer than REPEAT_SHARE of the budget; when `stopping`
        and no layout was measured twice yet, the best once more, so that the noise the answer
        states is measured."""
        left = self.budget.trials - len(self.records)
        layouts = self.measured()
        if left < 1 or not layouts:
            return []
        best, noise = layouts[0], self.noise()
        repeats = sum(r.repeat_of is not None for r in self.records)
        allowed = max(1, int(self.budget.trials * REPEAT_SHARE)) - repeats
        if allowed < 1:
            return []  # the rest of the budget explores: a tie is reported rather than resolved
        left = min(left, allowed)
        for other in layouts[1:]:
            if _spread(best, other, noise) <= math.log1p(self.budget.tolerance) or not _close(
                best, other, noise, self.budget.tolerance
            ):
                continue
            keys = [m.key for m in (best, other) if len(m.values) < MAX_MEASURES]
            if keys:
                return keys[:left]
        if stopping and noise.source != "repeats":
            return [best.key]
        return []

    def tied(self) -> list[Measured]:
        """The best layout and those still within noise of it, best first, at most three."""
        layouts = self.measured()
        if not layouts:
            return []
        noise = self.noise()
        return [layouts[0]] + [m for m in layouts[1:] if _close(layouts[0], m, noise, self.budget.tolerance)][:2]


def _corrected(c: Contender, factor: float) -> Contender:
    return c if factor == 1.0 else replace(c, low=c.low * factor, mid=c.mid * factor, factor=factor)


def spread_trials(budget: Budget) -> int:
    """How many first trials spread over the uncertain terms (SPREAD_TRIALS' rule)."""
    return min(SPREAD_TRIALS, max(1, 2 * budget.trials // 3))


def choose(
    untried: list[Contender],
    records: list[TrialRecord],
    best: Optional[float],
    budget: Budget,
    margin: Optional[float] = None,
) -> Optional[tuple[Contender, str]]:
    """The next trial and why (the module's docstring states the rule); None: nothing can win.
    `margin`: how much faster than `best` a layout must be able to be (default: the tolerance)."""
    margin = budget.tolerance if margin is None else margin
    threshold = best * (1 - margin) if best is not None else math.inf
    if len({r.key for r in records if r.status == "ok"}) <= len(
        NAMES
    ):  # too few to estimate the interval: no proof yet
        threshold = math.inf
    hopeful = [c for c in untried if c.low < threshold]
    if not hopeful:
        return None
    if len(records) < spread_trials(
        budget
    ):  # among every listed layout: a term is measured to learn it, even in a layout unlikely to win
        seen = {i for r in records for i, on in enumerate(signature(r.plan)) if on}
        fresh = [c for c in untried if any(on and i not in seen for i, on in enumerate(signature(c.plan)))]
        fresh.sort(key=lambda c: (sum(signature(c.plan)), c.low))  # a new term alone first: it isolates that term
        if not records:
            return hopeful[0], "lowest lower bound (the first trial)"
        if fresh:
            chosen = fresh[0]
            names = ("tp>1", "pp>1", "zero-3", "recompute")
            terms = [n for n, on in zip(names, signature(chosen.plan)) if on] or ["plain dp"]
            return chosen, f"spread: lowest bound with {' + '.join(terms)}, a term not yet measured"
    return hopeful[0], "lowest lower bound"


def _record(
    index: int, chosen: Contender, why: str, measurement, wall_s: float, repeat_of: Optional[TrialRecord] = None
) -> TrialRecord:
    """A finished trial; a repeat keeps its first trial's layout, job and prediction."""
    est = chosen.estimate
    interval = est.step_time_interval_s or [est.step_time_s, est.step_time_s]
    return TrialRecord(
        index=index,
        key=chosen.key,
        label=layout_label(chosen.plan),
        plan=chosen.plan,
        job=chosen.job,
        why=why,
        predicted_s=repeat_of.predicted_s if repeat_of else est.step_time_s,
        interval_s=list(repeat_of.interval_s) if repeat_of else list(interval),
        predicted_peak_gib=repeat_of.predicted_peak_gib if repeat_of else est.peak_memory_gib,
        status=measurement.status,
        step_time_s=measurement.step_time_s,
        steps_s=list(measurement.steps_s),
        repeat_of=repeat_of.index if repeat_of else None,
        peak_memory_gib=measurement.peak_memory_gib,
        detail=measurement.detail,
        ran=measurement.ran,
        wall_s=wall_s,
        finished_at=_now(),
    )


def _again(state: _State, key: str) -> tuple[Contender, TrialRecord]:
    """A layout measured before, as a contender to measure again, and its first trial."""
    first = next(r for r in state.records if r.key == key and r.repeat_of is None)
    est = predict(state.request.model, state.last_fit.cluster, first.job, first.plan)
    per_token = est.step_time_s / _tokens(first.job)
    return Contender(key, first.plan, first.job, est, per_token, per_token), first


def tune(
    request: TuneRequest,
    executor: Executor,
    budget: Budget = Budget(),
    journal_path: Optional[Path] = None,
    done: Optional[list[TrialRecord]] = None,
    say: Callable[[str], None] = lambda _: None,
    trial_hook: Callable[[TrialRecord, Refit], None] = lambda *_: None,
) -> TuneResult:
    """Run the loop. `done`: trials a resumed journal already holds (never run again);
    `journal_path`: where each finished trial is appended (its header already written).
    `say` hears progress lines; `trial_hook` each finished trial with the refit after it."""
    start = time.monotonic()
    limit = memory_limit_gib(request.cluster, request.solve.get("max_memory_gib"))
    state = _State(request, budget, list(done or []), limit)
    state.refit()
    stop, challenger = "trials", None
    untried: list[Contender] = []
    floor, complete = math.inf, True
    while True:
        if len(state.records) >= budget.trials:
            stop = "trials"
        elif budget.time_s is not None and time.monotonic() - start >= budget.time_s:
            stop = "time"
        else:
            if not state.queue:
                state.queue = state.repeats_wanted(stopping=False)
            first: Optional[TrialRecord] = None
            if state.queue:
                again, first = _again(state, state.queue.pop(0))
                pick: Optional[tuple[Contender, str]] = (again, _why_again(state, again.key))
            else:
                untried, floor, complete = state.untried()
                pick = choose(untried, state.records, state.best()[1], budget, state.margin())
                if pick is None:
                    state.queue = state.repeats_wanted(stopping=True)
                    if state.queue:
                        continue
                    stop = "exhausted" if not untried and complete else "proven"
            if pick is not None:
                _trial(state, executor, pick, first, journal_path, say, trial_hook)
                continue
        if stop in ("trials", "time"):  # the list of the last choice is stale: the last trial ran since
            untried, floor, complete = state.untried()
        challenger = untried[0] if untried else None
        break
    best_record, best = state.best()
    margin = None
    if best is not None:
        bound = min([c.low for c in untried] + ([floor] if not complete else []), default=math.inf)
        margin = (best - bound) / best if bound < math.inf else 0.0
    layouts, counted = count_layouts(request)
    tied = state.tied()
    return TuneResult(
        request,
        state.records,
        state.last_fit,
        best_record,
        stop,
        margin,
        challenger,
        layouts,
        budget.tolerance,
        counted,
        noise=state.noise(),
        measured=state.measured(),
        tied=tied if len(tied) > 1 else [],
        held_out_error=held_out_error(state),
    )


def _why_again(state: _State, key: str) -> str:
    leader, _ = state.best()
    role = "the best" if leader is not None and key == leader.key else "a contender"
    return f"repeat: {role}, measured again (interleaved) to tell it from a close layout"


def _trial(
    state: _State,
    executor: Executor,
    pick: tuple[Contender, str],
    first: Optional[TrialRecord],
    journal_path: Optional[Path],
    say: Callable[[str], None],
    trial_hook: Callable[[TrialRecord, Refit], None],
) -> None:
    """Measure the chosen layout (`first`: its first trial, for a repeat), journal the record,
    refit."""
    chosen, why = pick
    request, index = state.request, len(state.records)
    if chosen.factor != 1.0:
        why += f" (x{chosen.factor:.2f}, its signature's trials)"
    say(f"trial {index + 1}/{state.budget.trials}: {layout_label(chosen.plan)} ({why})")
    t0 = time.monotonic()
    measurement = executor.measure(Trial(index, request.model, request.cluster, request.gpus, chosen.job, chosen.plan))
    record = _record(index, chosen, why, measurement, time.monotonic() - t0, first)
    if journal_path is not None:
        journal.append(journal_path, record)
    state.records.append(record)
    state.refit()
    trial_hook(record, state.last_fit)


def held_out_error(state: _State) -> Optional[float]:
    """The refit's error on each measured layout left out of its fit: mean |predicted /
    measured - 1| over the layouts, each predicted by constants refit to the others (a quick
    refit from the final constants). None with fewer layouts than the constants + 2."""
    ran, oom, _ = observations(state.request, state.records, state.noise())
    if len(ran) < len(NAMES) + 2:
        return None
    errors = []
    for i, left in enumerate(ran):
        others = ran[:i] + ran[i + 1 :]
        fit = refit(
            state.request.cluster, state.request.target, others, oom, state.capacity_gib, state.last_fit.constants, 0
        )
        errors.append(abs(predict(left.model, fit.cluster, left.job, left.plan).step_time_s / left.step_time_s - 1))
    return sum(errors) / len(errors)


def count_layouts(request: TuneRequest, time_limit_s: float = 60.0) -> tuple[int, bool]:
    """How many feasible layouts the search space holds (under the prior's memory model): the
    trials an exhaustive sweep would need; False when the count stopped at the time limit
    (then it is a lower bound) or at the search's 1,000 alternatives."""
    try:
        doc = api.solve(
            request.model,
            request.cluster,
            gpus=request.gpus,
            top_k=1000,
            time_limit=time_limit_s,
            **request.search_keywords(),
        )
    except PlannerError:
        return 0, True
    return 1 + len(doc.alternatives), doc.search.optimal and len(doc.alternatives) < 1000


def predicted_before_after(result: TuneResult, record: TrialRecord) -> tuple[float, float]:
    """A trial's step time predicted by the prior and by the refit model, for what ran."""
    what = record.ran
    model, job, plan = (what.model, what.job, what.plan) if what else (result.request.model, record.job, record.plan)
    return (
        predict(model, result.request.cluster, job, plan).step_time_s,
        predict(model, result.refit.cluster, job, plan).step_time_s,
    )


def verdict(result: TuneResult, record: TrialRecord) -> str:
    if record.status != "ok":
        return {"oom": "out of memory", "timeout": "timed out", "failed": "failed"}[record.status] + (
            f": {record.detail}" if record.detail else ""
        )
    if result.best is not None and record.key == result.best.key:
        return "best" + (" (tied)" if result.tied else "")
    # an ok trial, so there is a best (an ok one too) and both have step times (TrialRecord's validator)
    assert result.best_step_time_s is not None and record.step_time_s is not None
    tied = any(m.key == record.key for m in result.tied)
    return f"+{100 * (record.step_time_s / result.best_step_time_s - 1):.1f} % vs best" + (
        " (tied within noise)" if tied else ""
    )
