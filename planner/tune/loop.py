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

Stop rule: no untried layout's lower bound beats the measured best by more than the
tolerance, once more trials ran than the refit has constants (until then the constants can
match every trial, and the interval is only the prior's, whose constants the refit has left):
proven under the refit model, as the search lists layouts best first, so a layout it
did not list has a bound no lower than the last listed one's), or the trial or time budget
is spent.
"""

from __future__ import annotations

import hashlib
import math
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
from planner.tune.refit import Observation, Refit, refit

MAX_CANDIDATES = 128  # the most layouts one round asks the search for
# At most this many first trials spread over signatures, and two thirds of the trial budget: the
# first trial and one for each of three uncertain terms (tp, pp, ZeRO-3) in a budget of 6, so
# that no term the space holds is left to the prior's word (a budget of 6 spent half on the
# spread left TP unmeasured, and the refit then missed the TP layouts by 40 %+:
# benchmarks/tune.py, December 2026); the rest is spent where the refit model says.
SPREAD_TRIALS = 4
SPREAD_LIST = 64  # layouts listed while the trials spread


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


@dataclass
class TuneResult:
    request: TuneRequest
    records: list[TrialRecord]
    refit: Refit
    best: Optional[TrialRecord]
    stop: str  # "proven", "trials", "time", "exhausted" (every layout tried)
    margin: Optional[float]  # how much faster the best untried layout could be, fraction (<= tolerance when proven)
    challenger: Optional[Contender]
    exhaustive: int  # feasible layouts in the search space (under the prior's memory model)
    tolerance: float = 0.02
    exhaustive_complete: bool = True  # False: the count stopped at its time limit (a lower bound)


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


def observations(request: TuneRequest, records: list[TrialRecord]) -> tuple[list[Observation], list]:
    """The trials that ran (what ran, measured) and those out of memory (what ran)."""
    ran, oom = [], []
    for r in records:
        what = r.ran or None
        model, job, plan = (what.model, what.job, what.plan) if what else (request.model, r.job, r.plan)
        if r.status == "ok":
            assert r.step_time_s is not None  # a trial that ran has its step time (TrialRecord's validator)
            ran.append(Observation(model, job, plan, r.step_time_s, r.peak_memory_gib or 0.0))
        elif r.status == "oom":
            oom.append((model, job, plan))
    return ran, oom


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

    @property
    def last_fit(self) -> Refit:
        assert self.fit is not None  # tune calls refit() before anything else
        return self.fit

    def refit(self) -> None:
        ran, oom = observations(self.request, self.records)
        start = self.fit.constants if self.fit is not None else None  # go on from the last fit
        self.fit = refit(
            self.request.cluster, self.request.target, ran, oom, self.capacity_gib, start, self.budget.refit_rounds
        )

    def best(self) -> tuple[Optional[TrialRecord], Optional[float]]:
        """The fastest measured trial and its time per token (the searched layout's)."""
        timed = [
            (measured_per_token(self.request, r, self.last_fit.cluster, r.job), r)
            for r in self.records
            if r.status == "ok"
        ]
        if not timed:
            return None, None
        per_token, record = min(timed, key=lambda t: t[0])
        return record, per_token

    def corrections(self) -> dict:
        """Per signature (tp > 1, pp > 1, ZeRO-3, recompute), the factor by which the refit model
        still missed that signature's trials: exp(-mean log(predicted / measured)). The three
        constants cannot express every cost of every machine (gloo's per-call cost of TP on CPU
        ranks, docs/notebook.md), so a family measured slower than the refit predicts is
        expected to stay so; untried layouts of a measured signature are chosen and bounded
        with it."""
        ran = [r for r in self.records if r.status == "ok"]
        per: dict[tuple[bool, bool, bool, bool], list[float]] = {}
        for record, residual in zip(ran, self.last_fit.residuals):
            per.setdefault(signature(record.plan), []).append(residual)
        return {sig: math.exp(-sum(rs) / len(rs)) for sig, rs in per.items()}

    def untried(self) -> tuple[list[Contender], float, bool]:
        """The untried layouts of the search under the refit model (each corrected by its
        signature's factor), best bound first; a floor under every unlisted layout's bound;
        True when the list is all. The search is asked for more layouts only while none
        listed is worth a trial and the floor could still beat the best (the proof needs the
        layouts below the last listed)."""
        tried = {r.key for r in self.records}
        _, best = self.best()
        threshold = best * (1 - self.budget.tolerance) if best is not None else math.inf
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


def _corrected(c: Contender, factor: float) -> Contender:
    return c if factor == 1.0 else replace(c, low=c.low * factor, mid=c.mid * factor, factor=factor)


def spread_trials(budget: Budget) -> int:
    """How many first trials spread over the uncertain terms (SPREAD_TRIALS' rule)."""
    return min(SPREAD_TRIALS, max(1, 2 * budget.trials // 3))


def choose(
    untried: list[Contender], records: list[TrialRecord], best: Optional[float], budget: Budget
) -> Optional[tuple[Contender, str]]:
    """The next trial and why (the module's docstring states the rule); None: nothing can win."""
    threshold = best * (1 - budget.tolerance) if best is not None else math.inf
    if sum(r.status == "ok" for r in records) <= len(NAMES):  # too few to estimate the interval: no proof yet
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


def _record(index: int, chosen: Contender, why: str, measurement, wall_s: float) -> TrialRecord:
    est = chosen.estimate
    interval = est.step_time_interval_s or [est.step_time_s, est.step_time_s]
    return TrialRecord(
        index=index,
        key=chosen.key,
        label=layout_label(chosen.plan),
        plan=chosen.plan,
        job=chosen.job,
        why=why,
        predicted_s=est.step_time_s,
        interval_s=list(interval),
        predicted_peak_gib=est.peak_memory_gib,
        status=measurement.status,
        step_time_s=measurement.step_time_s,
        peak_memory_gib=measurement.peak_memory_gib,
        detail=measurement.detail,
        ran=measurement.ran,
        wall_s=wall_s,
        finished_at=_now(),
    )


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
    while True:
        untried, floor, complete = state.untried()
        _, best = state.best()
        if len(state.records) >= budget.trials:
            stop = "trials"
        elif budget.time_s is not None and time.monotonic() - start >= budget.time_s:
            stop = "time"
        else:
            pick = choose(untried, state.records, best, budget)
            if pick is None:
                stop = "exhausted" if not untried and complete else "proven"
            else:
                chosen, why = pick
                index = len(state.records)
                if chosen.factor != 1.0:
                    why += f" (x{chosen.factor:.2f}, its signature's trials)"
                say(
                    f"trial {index + 1}/{budget.trials}: {layout_label(chosen.plan)} ({why}); predicted "
                    f"{chosen.estimate.step_time_s * chosen.factor:.4g} s"
                )
                t0 = time.monotonic()
                measurement = executor.measure(
                    Trial(index, request.model, request.cluster, request.gpus, chosen.job, chosen.plan)
                )
                record = _record(index, chosen, why, measurement, time.monotonic() - t0)
                if journal_path is not None:
                    journal.append(journal_path, record)
                state.records.append(record)
                state.refit()
                trial_hook(record, state.last_fit)
                continue
        challenger = untried[0] if untried else None
        break
    best_record, best = state.best()
    margin = None
    if best is not None:
        bound = min([c.low for c in untried] + ([floor] if not complete else []), default=math.inf)
        margin = (best - bound) / best if bound < math.inf else 0.0
    layouts, counted = count_layouts(request)
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
    )


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
    if result.best is not None and record.index == result.best.index:
        return "best"
    # an ok trial, so there is a best (an ok one too) and both have step times (TrialRecord's validator)
    assert result.best is not None and record.step_time_s is not None and result.best.step_time_s is not None
    return f"+{100 * (record.step_time_s / result.best.step_time_s - 1):.1f} % vs best"
