"""The search loop: candidates -> bounds -> ILPs in bound order -> decoded plans.

Best-first over candidate layouts keyed by a lower bound on time per token: a cheap bound
for every candidate, refined (memory-aware) when a candidate reaches the front, then an
ILP per front candidate (planner/search/bounds.py, planner/search/ilp.py). One candidate
per ILP: an ILP that must also choose between candidates has a weak relaxation (a
fractional choice mixes layouts), and one such batch of four took minutes where the four
alone take a second. The loop stops when no remaining bound can beat the
k-th best plan found, so the answer (and the top-k list) is the exact optimum of the
search space under the cost model. A time limit returns the best so far, marked as not
proven optimal.
"""

from __future__ import annotations

from planner.units import gib

import math

import heapq
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Optional

from cost_models.estimate import evaluate
from cost_models.memory import GIB
from cost_models.tables import PipelineCosts
from cost_models.terms import MODES
from planner.errors import InfeasibleError, MemoryMiss
from planner.specs import ClusterSpec, Estimate, JobSpec, ModelSpec, Plan, Recompute, Schedule, StageRecompute
from planner.stacks import validate_plan
from planner.specs import memory_limit_gib as memory_limit_gib_of

from .bounds import cheap_bound, min_peak_memory, refined_bound
from planner.specs import Layout
from .candidates import (
    MEMORY,
    TP_ACROSS_NODES,
    CostTables,
    Layouts,
    SearchSpace,
    candidate_modes,
    enumerate_candidates,
    fix_key,
    fix_text,
    stack_problems,
)
from .deadline import NO_DEADLINE, Deadline, OutOfTime, polled
from .ilp import Solution, attempt_candidate, canonical_counts, default_solver

REL_TOL = 1e-9  # bound comparisons
# A candidate's MILP not settled within this many seconds waits for the plans found meanwhile
# (`_search`); measured in docs/benchmarks.md.
DEFER_AFTER_S = 1.0


@dataclass
class Found:
    candidate: Layout
    plan: Plan
    job: JobSpec
    estimate: Estimate


@dataclass
class SearchStats:
    candidates_considered: int = 0
    rejected: Counter = field(default_factory=Counter)
    refined: int = 0
    ilps_solved: int = 0
    deferred: int = 0  # MILPs stopped after DEFER_AFTER_S and solved again later (counted in ilps_solved)
    pruned_by_bound: int = 0
    solver: str = ""
    solve_time_s: float = 0.0
    optimal: bool = True
    optimality_gap: float = 0.0  # (best found - lower bound) / best found: 0 when proven optimal
    lower_bound: float = float("inf")  # seconds per token no plan of the space beats (the best found when optimal)
    layouts_represented_log10: float = (
        -math.inf
    )  # log10 of the layouts with every layer split and recompute choice the ILP covers


@dataclass
class SearchResult:
    best: Optional[Found]  # the recommendation: the fastest, or a tied plan with a better worst case (break_ties)
    alternatives: list
    stats: SearchStats
    fastest: Optional[Found] = None  # the shortest predicted time (the ILP's optimum)
    stacks: list = field(default_factory=list)  # without a target: each stack's own search (planner/search/stacks.py)


def decode(c: Layout, counts) -> Plan:
    """A Plan from the ILP's per-stage (none, selective, full) layer counts."""
    layers = [sum(x) for x in counts]
    modes = {i for x in counts for i, v in enumerate(x) if v}
    if len(modes) == 1:
        return c.plan(layers_per_stage=layers, recompute=MODES[modes.pop()])
    return c.plan(
        layers_per_stage=layers,
        recompute=Recompute.mixed,
        stage_recompute=[StageRecompute(none=x[0], selective=x[1], full=x[2]) for x in counts],
    )


def layouts_represented(stages: int, layers: int, equal_chunks: bool = False) -> int:
    """Number of (layer split, per-stage recompute counts) choices: ways to give each of
    `stages` stages >= 1 of `layers` layers (interleaved: chunks of L // S layers or one more), and split each
    stage's layers over 3 modes. Exact, with up to 10^5 digits: the search reports
    :func:`layouts_represented_log10`."""
    if equal_chunks:  # chunks of n = L // S layers, L % S of them one more
        n, extra = divmod(layers, stages)
        return (
            math.comb(stages, extra) * ((n + 2) * (n + 1) // 2) ** (stages - extra) * ((n + 3) * (n + 2) // 2) ** extra
        )
    return _free_splits(stages, layers)


@lru_cache(maxsize=1024)
def _free_splits(stages: int, layers: int) -> int:
    """Coefficient of z^L in f(z)^S, f(z) = sum_{n>=1} C(n+2, 2) z^n = 1/(1-z)^3 - 1
    = z (3 - 3z + z^2) / (1-z)^3 (S = stages, L = layers). With P(z) = (3 - 3z + z^2)^S = sum p_k z^k,
    the coefficient is sum_k p_k C(L - S - k + 3S - 1, 3S - 1): at most 2S + 1 terms. The p_k
    follow from q P' = S q' P, q = 3 - 3z + z^2: 3(k+1) p_{k+1} = 3(k - S) p_k + (2S - k + 1) p_{k-1}."""
    S, L = stages, layers
    if L < S:
        return 0
    total, p_prev, p = 0, 0, 3**S
    for k in range(min(2 * S, L - S) + 1):
        total += p * math.comb(L - S - k + 3 * S - 1, 3 * S - 1)
        p_prev, p = p, ((3 * k - 3 * S) * p + (2 * S - k + 1) * p_prev) // (3 * (k + 1))
    return total


def layouts_represented_log10(stages: int, layers: int, equal_chunks: bool = False) -> float:
    """log10 of :func:`layouts_represented` in floating point (to ~1e-10): the exact count of a
    10^5-layer model takes seconds per stage count to form (bignum binomials), this O(stages)."""
    if layers < stages:
        return -math.inf
    if equal_chunks:
        n, extra = divmod(layers, stages)
        return (
            math.log10(math.comb(stages, extra))
            + (stages - extra) * math.log10((n + 2) * (n + 1) // 2)
            + extra * math.log10((n + 3) * (n + 2) // 2)
        )
    return _free_splits_log10(stages, layers)


@lru_cache(maxsize=1024)
def _free_splits_log10(stages: int, layers: int) -> float:
    """log10 of _free_splits(S, L) as a sum of positive terms (logs then add without
    cancellation): with u = 1 - z, f(z) = z (u^-3 + u^-2 + u^-1), so f(z)^S = z^S sum_j t_j u^-(S+j)
    with t_j the coefficients of (1 + x + x^2)^S, and [z^(L-S)] u^-k = C(L - S + k - 1, k - 1):
    the count is sum_{j=0}^{2S} t_j C(L + j - 1, S + j - 1). From (1 + x + x^2) T' = S (1 + 2x) T,
    (j+1) t_{j+1} = (S - j) t_j + (2S - j + 1) t_{j-1}: positive ratios r_j = t_j / t_{j-1} for
    j <= S, and t_{2S-j} = t_j."""
    S, L = stages, layers
    log_t = [0.0]  # log10 t_0 = log10 1
    r = None
    for j in range(S):  # t_{j+1} / t_j = ((S - j) + (2S - j + 1) / r_j) / (j + 1)
        r = (S - j + (0.0 if r is None else (2 * S - j + 1) / r)) / (j + 1)
        log_t.append(log_t[-1] + math.log10(r))
    log_t += log_t[-2::-1]  # j = S+1 .. 2S by symmetry
    terms = [lt + _log10_comb(L + j - 1, S + j - 1) for j, lt in enumerate(log_t)]
    top = max(terms)
    return top + math.log10(math.fsum(10.0 ** (x - top) for x in terms))


def _log10_comb(n: int, k: int) -> float:
    return (math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)) / math.log(10)


def log10_sum(a: float, b: float) -> float:
    """log10(10^a + 10^b) without forming either power (both may be past float range)."""
    hi, lo = max(a, b), min(a, b)
    return hi if lo == -math.inf else hi + math.log10(1.0 + 10.0 ** (lo - hi))


def solve(
    model: ModelSpec,
    cluster: ClusterSpec,
    job: JobSpec,
    space: SearchSpace,
    memory_limit_gib: Optional[float] = None,
    top_k: int = 3,
    time_limit: Optional[float] = None,
    solver: Optional[str] = None,
    layouts: Optional[Layouts] = None,
    deadline: Deadline = NO_DEADLINE,
) -> SearchResult:
    """Find the layout with the shortest predicted time per token that fits every GPU, for
    job.target (`space` holds what that stack can express). `layouts`: the space's layouts
    when enumerated once for several targets (candidates.py:enumerate_layouts). `time_limit`
    (seconds from now) and `deadline`: whichever comes first ends the search with the best
    plans so far (planner/search/deadline.py); with none found by then, the first one found
    within the deadline's grace."""
    start = time.perf_counter()
    deadline = deadline.sooner(time_limit)
    early = deadline.before_first_plan()  # for work before a first plan
    limit = memory_limit_gib_of(cluster, memory_limit_gib)
    solver = solver or default_solver()
    stats = SearchStats(solver=solver)
    try:
        cands, stats.rejected = enumerate_candidates(model, cluster, space, layouts, early)
        stats.candidates_considered = len(cands) + sum(stats.rejected.values())
        tables = CostTables(model, cluster, job)
        heap, costs = _bound_all(cands, tables, limit, model.num_layers, stats, early)
    except OutOfTime:  # no bound for every candidate yet: no plan, nothing proven (the only bound is 0)
        stats.optimal, stats.lower_bound, stats.solve_time_s = False, 0.0, time.perf_counter() - start
        return SearchResult(None, [], stats)
    found, unproven, cut = _search(cands, costs, heap, limit, top_k, solver, space, stats, deadline)
    stats.pruned_by_bound = len(heap) + cut  # + candidates whose ILP proved them no faster than the k-th plan
    stats.solve_time_s = time.perf_counter() - start
    # Every plan not found is no faster than the least bound left unexplored.
    unexplored = float("inf") if stats.optimal else min(unproven, heap[0][0] if heap else float("inf"))
    stats.lower_bound = min(unexplored, found[0][0] if found else float("inf"))
    if found and not stats.optimal:
        stats.optimality_gap = max(0.0, (found[0][0] - stats.lower_bound) / found[0][0])

    results = [
        _materialise(
            tables,
            costs[i],
            sol,
            limit,
            candidate_modes(space, sol.candidate),
            solver,
            space.rules,
            deadline,
        )
        for _, i, sol in found[: top_k + 1]
    ]
    if not results:
        return SearchResult(None, [], stats)
    fastest = results[0]
    results = break_ties(results)
    return SearchResult(results[0], results[1:], stats, fastest)


def _search(
    cands: list,
    costs: dict,
    heap: list,
    limit: float,
    top_k: int,
    solver: str,
    space: SearchSpace,
    stats: SearchStats,
    deadline: Deadline,
) -> tuple[list, float, int]:
    """Best-first over the bounded candidates (`heap`, popped in place): refine the front
    candidate's bound, or solve its ILP once refined, until no bound left can beat the
    (top_k + 1)-th plan found, or the deadline (its grace while none is found). Returns (found: (seconds per token, index,
    solution), fastest first; the least bound of candidates whose ILP stopped unproven;
    candidates whose ILP proved them no faster than the (top_k + 1)-th plan)."""
    found: list[tuple[float, int, Solution]] = []
    unproven = float("inf")
    cut = 0
    deferred: set[int] = set()

    def threshold() -> float:
        need = top_k + 1
        return found[need - 1][0] if len(found) >= need else float("inf")

    while heap:
        stop = deadline if found else deadline.before_first_plan()
        if stop.expired():
            stats.optimal = False
            break
        if heap[0][0] >= threshold() * (1 - REL_TOL):
            break
        lb, i, refined = heap[0]
        if not refined:
            try:
                rb = refined_bound(costs[i], limit, candidate_modes(space, cands[i]), stop)
            except OutOfTime:  # the candidate stays on the heap with its cheap bound
                stats.optimal = False
                break
            heapq.heappop(heap)
            stats.refined += 1
            if rb is None:
                stats.rejected[MEMORY] += 1
                continue
            heapq.heappush(heap, (max(lb, rb / costs[i].tokens_per_step), i, True))
            continue
        # The front candidate's bound is refined: solve its ILP.
        heapq.heappop(heap)
        # Only a plan faster than the (top_k + 1)-th found so far can change the answer.
        cutoff = threshold() * costs[i].tokens_per_step if len(found) > top_k else None
        got = _attempt(cands[i], costs[i], limit, solver, space, cutoff, stop, i not in deferred)
        sol, status = got.solution, got.status
        stats.ilps_solved += 1
        if status == "Cutoff":
            cut += 1
            continue
        settled = status == "Infeasible" or (sol is not None and sol.proven)
        if not settled and i not in deferred and not stop.expired():
            deferred.add(i)  # back on the heap under the bound its first try proved
            stats.deferred += 1
            heapq.heappush(heap, (max(lb, got.lower_bound_s / costs[i].tokens_per_step), i, True))
            continue
        if not settled:
            stats.optimal = False  # stopped by the time limit: the candidate keeps only its bound
            unproven = min(unproven, lb)
        if sol is None:
            if status == "Infeasible":
                stats.rejected[MEMORY] += 1
            continue
        found.append((sol.objective / costs[i].tokens_per_step, i, sol))
        found.sort(key=lambda t: (t[0], t[1]))
    return found, unproven, cut


def _attempt(
    cand: Layout,
    pc: PipelineCosts,
    limit: float,
    solver: str,
    space: SearchSpace,
    cutoff: Optional[float],
    stop: Deadline,
    first_try: bool,
):
    """One candidate's ILP. A first try gets DEFER_AFTER_S; one it does not settle goes back on
    the heap under the bound it proved (`_search`) and is solved in full when that bound comes
    to the front again, with the cutoff of the plans found meanwhile (often enough to prune it
    at once): a hard MILP no longer holds up the easy ones that would have cut it off."""
    return attempt_candidate(
        cand,
        pc,
        limit,
        solver,
        DEFER_AFTER_S if first_try else None,
        candidate_modes(space, cand),
        space.rules,
        cutoff,
        deadline=stop,
    )


def _per_token(f: Found, t: float) -> float:
    return t / (f.job.global_batch_size * f.job.seq_len)


def seconds_per_token(f: Found) -> float:
    """What the search minimises: the predicted step time over the tokens of the step."""
    return _per_token(f, f.estimate.step_time_s)


# break_ties in one sentence, for the places that print a recommendation (planner/cli/render.py
# and the document's tie_rule, planner/search/report.py).
TIE_RULE = (
    "among the plans whose predicted intervals overlap the fastest plan's, the one whose interval ends lowest "
    "(the best worst case) is recommended"
)


def break_ties(results: list) -> list:
    """The tie rule (TIE_RULE). Plans whose intervals overlap the fastest plan's cannot be told apart
    by the prediction; among them recommend the one whose interval ends lowest (the best
    worst case, time per token). Compute and communication carry different errors
    (planner/specs/cluster.py:Uncertainty), so this prefers the plan that depends least on the
    uncertain terms: a communication-heavy plan must be faster by more than its wider
    interval to be recommended. Without intervals (measured profiles) the fastest stays first."""
    best = results[0]
    if best.estimate.step_time_interval_s is None:
        return results
    top = _per_token(best, best.estimate.step_time_interval_s[1])
    tied = [
        f
        for f in results
        if f.estimate.step_time_interval_s and _per_token(f, f.estimate.step_time_interval_s[0]) <= top
    ]
    pick = min(tied, key=lambda f: _per_token(f, f.estimate.step_time_interval_s[1]))
    return [pick] + [f for f in results if f is not pick]


def _bound_all(
    cands: list, tables: CostTables, limit: float, num_layers: int, stats: SearchStats, deadline: Deadline = NO_DEADLINE
) -> tuple[list, dict]:
    """Every candidate's cost tables and cheap bound: a heap of (bound on seconds per token,
    index, refined?) and the tables by index; what cannot fit even its model states is
    counted as memory-infeasible. OutOfTime when the deadline passes first."""
    heap: list = []
    costs: dict[int, PipelineCosts] = {}
    for i, c in polled(enumerate(cands), deadline, every=64):
        pc = tables.pipeline(c)
        lb = cheap_bound(pc, limit)
        stats.layouts_represented_log10 = log10_sum(
            stats.layouts_represented_log10, layouts_represented_log10(c.pp * c.vpp, num_layers, c.vpp > 1)
        )
        if lb is None:
            stats.rejected[MEMORY] += 1
            continue
        costs[i] = pc
        heapq.heappush(heap, (lb / pc.tokens_per_step, i, False))
    return heap, costs


def settle(
    pc: PipelineCosts, counts, limit_gib: float, modes: tuple, solver: str, rules=None, deadline: Deadline = NO_DEADLINE
) -> tuple:
    """The canonical split of those as fast as `counts` (ilp.canonical_counts, within the
    deadline), with any recomputation that still costs nothing dropped (:func:`tidy`)."""
    step = evaluate(pc, list(counts)).step_time_s
    # One stage has no placement to choose, and a split with no recomputation is already what
    # the tie-break prefers: tidy() settles those.
    ties = pc.num_stages > 1 and any(c[1] or c[2] for c in counts)
    canonical = (
        canonical_counts(pc, counts, step, limit_gib, solver, modes, rules, deadline)
        if ties and not deadline.expired()
        else None
    )
    if canonical is not None:
        est = evaluate(pc, list(canonical))
        if est.step_time_s <= step * (1 + 1e-12) and est.peak_memory_gib <= limit_gib:
            counts, step = canonical, est.step_time_s
    return tidy(pc, counts, limit_gib, modes, step, rules, deadline)


def tidy(
    pc: PipelineCosts, counts, limit_gib: float, modes: tuple, step: float, rules=None, deadline: Deadline = NO_DEADLINE
) -> tuple:
    """Drop recomputation the ILP chose where it costs nothing (a stage off the critical
    path of an interleaved schedule ties with and without it): keep the step time `step` of
    `counts` and the memory limit, prefer less recompute, stage by stage (O(stages^2): past
    the deadline the stages left keep what the ILP chose)."""
    counts = [tuple(c) for c in counts]
    best = step
    for j, (n0, n1, n2) in enumerate(counts):
        if deadline.expired():
            break
        for option in ((n0 + n1 + n2, 0, 0), (n0 + n1, 0, n2), (n0, n1 + n2, 0)):
            if option == counts[j]:
                break
            if any(option[i] and MODES[i] not in modes for i in range(3)):
                continue
            trial = counts[:j] + [option] + counts[j + 1 :]
            if rules is not None and rules.counts_problems(trial):
                continue  # the target stack could not run it
            est = evaluate(pc, trial)
            if est.step_time_s <= best * (1 + 1e-12) and est.peak_memory_gib <= limit_gib:
                counts = trial
                break
    return tuple(counts)


def _materialise(
    tables: CostTables,
    pc: PipelineCosts,
    sol: Solution,
    limit_gib: float,
    modes: tuple,
    solver: str,
    rules=None,
    deadline: Deadline = NO_DEADLINE,
) -> Found:
    counts = settle(pc, sol.counts, limit_gib, modes, solver, rules, deadline)
    plan = decode(sol.candidate, counts)
    cjob = tables.job_for(sol.candidate)
    validate_plan(plan, tables.model, cjob)
    # The ILP optimises exactly what `plan estimate` predicts (tests/unit/cost_models/test_terms_consistency.py).
    return Found(sol.candidate, plan, cjob, evaluate(pc, list(counts)))


def infeasibility(
    model: ModelSpec,
    cluster: ClusterSpec,
    job: JobSpec,
    space: SearchSpace,
    limit_gib: float,
    stacks: Optional[str] = None,
    deadline: Deadline = NO_DEADLINE,
) -> InfeasibleError:
    """Why nothing fits: the least memory any layout needs, how far over that is, and what
    would make it fit. `stacks`: the stacks searched, where not job.target alone. Past the
    deadline, only that nothing fits."""
    try:
        return _infeasibility(model, cluster, job, space, limit_gib, stacks, deadline)
    except OutOfTime:
        return InfeasibleError(
            f"no layout {stacks or job.target.value} can express fits in {gib(limit_gib)} GiB per GPU (--time-limit "
            "ran out before the least memory a layout needs was found; allow more time to see it)"
        )


def _infeasibility(
    model: ModelSpec,
    cluster: ClusterSpec,
    job: JobSpec,
    space: SearchSpace,
    limit_gib: float,
    stacks: Optional[str],
    deadline: Deadline,
) -> InfeasibleError:
    need = min_memory_needed(model, cluster, job, space, deadline)
    if need is None:
        return InfeasibleError(_no_valid_layout(model, cluster, space, deadline))
    over = need - limit_gib
    if over <= 0:  # the floor ignores what the target stack cannot express of splits and recompute
        return MemoryMiss(
            f"no layout fits in {gib(limit_gib)} GiB per GPU under what {stacks or job.target.value} can express (its splits and "
            f"recompute rules; a free split would need {need:.1f} GiB); try --target generic to see the free optimum, "
            "more GPUs, or a larger-memory cluster"
        )
    hints = []
    for factor in (2, 4, 8, 16, 32, 64):
        bigger = SearchSpace(**{**space.__dict__, "num_gpus": space.num_gpus * factor})
        m2 = min_memory_needed(model, cluster, job, bigger, deadline)
        if m2 is not None and m2 <= limit_gib:
            hints.append(f"at least {space.num_gpus * factor} GPUs")
            break
    if space.fixed:
        hints.append("fewer --fix constraints")
    if space.global_batch_size is None and (space.micro_batch_size or 1) > 1:  # with a batch, the floor tried 1 already
        hints.append("micro-batch size 1")
    device_limit = memory_limit_gib_of(cluster)
    if limit_gib < device_limit and need <= device_limit:  # --max-memory-gib, below what the device holds and would do
        hints.append(f"a higher --max-memory-gib (the device's own limit is {gib(device_limit)} GiB)")
    hints.append("a larger-memory cluster")
    return MemoryMiss(
        f"no layout fits in {gib(limit_gib)} GiB per GPU: the least any layout needs (full recompute, best ZeRO stage and split) "
        f"is {need:.1f} GiB, {_over(over, limit_gib)}; to fit, try {', or '.join(hints)}"
    )


def _no_valid_layout(model: ModelSpec, cluster: ClusterSpec, space: SearchSpace, deadline: Deadline) -> str:
    """Why the search space holds no valid layout. With --fix: one enumeration without the fixes
    (what a solve without them enumerates), each layout scored by the fixes it breaks; a fix
    that alone rules out a layout is named, and two or more such are named as clashing. Else the
    sizes that leave none, and what rejected them. Past the deadline, the short line."""
    short = "no layout of the search space is valid for this model and GPU count (check --fix and divisibility)"
    shown = {k: f"--fix {fix_key(k)}={fix_text(v)}" for k, v in space.fixed.items()}
    try:
        # the choices a fix keeps although they are dominated (gpipe, a mesh order, a ZeRO stage) are
        # enumerated too: else the fix alone would be blamed for what another fix rules out
        dominated = space.include_dominated or bool({"schedule", "mesh_order", "zero_stage"} & set(space.fixed))
        free = replace(space, fixed={}, include_dominated=dominated)
        layouts, rejected = enumerate_candidates(model, cluster, free, deadline=deadline)
        alone: set = set()
        fewest: Optional[frozenset] = None
        for c in polled(layouts, deadline, every=256):
            broken = frozenset(k for k, v in space.fixed.items() if getattr(c, k) != v)
            if len(broken) == 1:
                alone |= broken
            if fewest is None or len(broken) < len(fewest):
                fewest = broken
    except OutOfTime:
        return short
    blamed = alone or fewest or frozenset({"tp"})  # the generic case: any tp
    fixed_tp = space.fixed.get("tp")
    # a tp over the scale-up domain, or a mesh order stretching a smaller one across nodes
    cross = (
        " (or --allow-cross-node-tp: tp may not leave a node)"
        if rejected.get(TP_ACROSS_NODES)
        and blamed & {"tp", "mesh_order"}
        and ("mesh_order" in blamed or fixed_tp is None or fixed_tp > cluster.domain_gpus)
        else ""
    )
    try:  # only where the stack runs layouts without the fixes: else the fixes are not what rules them out
        refused = stack_refusal(model, cluster, space, deadline) if space.fixed and fewest is not None else None
    except OutOfTime:
        refused = None
    if refused:  # layouts with the fixes exist; the target stack runs none of them
        assert space.rules is not None  # stack_refusal refuses only for a target stack
        names = " and ".join(shown.values())
        return (
            f"no layout {space.rules.stack} can run has {names}: {refused}; change or drop {'it' if len(shown) == 1 else 'them'}, "
            "or plan for another --target"
        )
    if len(alone) == 1:
        return (
            f"no layout of the search space is valid with {shown[next(iter(alone))]} ({model.name} on {space.num_gpus:,} "
            f"GPUs has layouts without it: its divisibility or the target stack rules it out); change or drop it{cross}"
        )
    clash = alone or fewest
    if clash:
        names = " and ".join(shown[k] for k in sorted(clash))
        return (
            f"no layout of the search space is valid with {names} together ({model.name} on {space.num_gpus:,} GPUs has "
            f"layouts without {'any one' if alone else 'all'} of them); change or drop {'one' if alone else 'them'}{cross}"
        )
    batch = f"global batch {space.global_batch_size:,}" if space.global_batch_size else "this micro-batch"
    return (
        f"no layout of the search space is valid for {model.name} on {space.num_gpus:,} GPUs with {batch}: dp x tp x pp "
        f"(x cp) must make the GPU count, dp divide the batch, tp the heads and pp the layers; try fewer GPUs"
        + (" or a larger batch" if space.global_batch_size else "")
        + cross
    )


def stack_refusal(
    model: ModelSpec, cluster: ClusterSpec, space: SearchSpace, deadline: Deadline = NO_DEADLINE
) -> Optional[str]:
    """Where layouts with the space's --fix choices exist but its target stack runs none of them:
    why it refuses them, from the layouts it refuses for the fewest reasons (the nearest to
    running): the reason most of those share, "and other reasons" where it is not their only
    one. None without a target stack, where no layout has the fixes, or where the stack runs one.
    OutOfTime past `deadline`."""
    if space.rules is None:
        return None
    layouts, _ = enumerate_candidates(
        model, cluster, replace(space, rules=None, target_problems=None), deadline=deadline
    )
    problems = [stack_problems(space, c, model.num_layers) for c in polled(layouts, deadline, every=256)]
    refused = [p for p in problems if p]
    if not refused or len(refused) < len(problems):  # no layout has the fixes, or the stack runs some
        return None
    least = min(len(p) for p in refused)
    nearest = [p for p in refused if len(p) == least]
    reason, count = Counter(x for p in nearest for x in p).most_common(1)[0]
    return reason + ("" if least == 1 and count == len(nearest) else ", and other reasons")


def _over(over: float, limit: float) -> str:
    """How far over a limit: 'X GiB (P%) over', or as a multiple where that reads better (a
    limit of 1e-30 GiB is 3e30 times too small, not a 33-digit percentage)."""
    ratio = over / limit
    if ratio < 10:
        return f"{over:.1f} GiB ({100 * ratio:.0f}%) over"
    return f"{over:.1f} GiB over ({ratio + 1:.3g} times the limit)"


def min_memory_needed(
    model: ModelSpec, cluster: ClusterSpec, job: JobSpec, space: SearchSpace, deadline: Deadline = NO_DEADLINE
) -> Optional[float]:
    """A lower bound (GiB) on the peak memory of the most frugal layout: every layer in its most
    frugal recompute mode the candidate may use (full recompute, unless the candidate reruns its
    norms and activation instead), layers spread to equalise rank memory (continuous
    water-filling). OutOfTime past the deadline.

    An interleaved candidate whose plain 1F1B sibling (vpp 1, all else equal) is searched too
    is skipped: it holds the same states and extras, at least v layers per rank, and per layer
    at least as many micro-batches in flight (cost_models/memory.py in_flight_micro_batches:
    (2 (p - r - 1) + (v - 1) p + 1) / v >= p - r for v >= 2), so it never needs less."""
    cands, _ = enumerate_candidates(model, cluster, space, deadline=deadline)
    tables = CostTables(model, cluster, job)
    plain = {c for c in cands if c.vpp == 1 and c.schedule == Schedule.one_f_one_b}
    cands = [c for c in cands if c.vpp == 1 or replace(c, vpp=1, schedule=Schedule.one_f_one_b) not in plain]
    best = None
    for c in polled(cands, deadline, every=64):
        pc = tables.pipeline(c)
        need = min_peak_memory(pc, candidate_modes(space, c))
        best = need if best is None else min(best, need)
    return None if best is None else best / GIB
