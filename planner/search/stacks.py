"""`plan solve` without --target: search every training stack, recommend the best plan one runs.

Each stack is searched on its own (solve.py:solve) with its own JobSpec, since the cost model
reads job.target (its attention kernel, cross-entropy and TP overlap; cost_models/tables.py),
and its own space: what it can express (its Rules and layout_problems: planner/stacks/<stack>/
rules.py). The searches share only the layout enumeration (candidates.py:enumerate_layouts),
which reads neither the job nor the stack. The answers are then pooled: every plan the stacks
found, fastest first, and the tie rule (solve.py:break_ties) over all of them, so the
recommendation's worst case is no higher than any stack's own recommendation's, and the fastest
plan found is the fastest any stack can run. Each stack's own answer stays in the result.

A profile `plan tune` wrote (ClusterSpec.tuned_stacks) holds fitted constants of the stacks it
tuned: without --target only those are searched (default_targets), and a --target of another
stack is refused (tuned_refusal), since the constants of the others are not the profile's.
"""

from __future__ import annotations

from planner.units import gib

import time
from collections import Counter
from dataclasses import dataclass, replace
from typing import Optional, cast

from cost_models import memory
from planner import stacks
from planner.errors import InfeasibleError, UsageError
from planner.specs import ClusterSpec, JobSpec, ModelSpec, Recompute, Target
from planner.specs import memory_limit_gib as memory_limit_gib_of

from .candidates import MEMORY, SearchSpace, enumerate_layouts, fix_key, fix_text
from .deadline import NO_DEADLINE, Deadline, OutOfTime
from .ilp import default_solver
from .solve import (
    Found,
    SearchResult,
    SearchStats,
    break_ties,
    infeasibility,
    log10_sum,
    min_memory_needed,
    seconds_per_token,
    solve,
    stack_refusal,
)

STACK_TARGETS = tuple(Target(s) for s in stacks.EXPORT_STACKS)  # what `plan solve` searches without --target
# The order they are searched in under a --time-limit: the narrowest space first. A search's
# enumeration and bounds come before any plan (the limit cuts them, and the stack then has none), so
# the widest space searched first can spend a short limit before any stack has a plan: for
# gpt3-175b on 1,024 A100s accelerate has 24 candidates (no pipeline), deepspeed 108 (no TP
# with pp), torchtitan 108 and megatron 3,890 (TP overlap doubles the SP layouts; 0.9 s to
# enumerate and bound on the 2-core development machine, against a --time-limit 0.5; the order is
# checked in tests/unit/api/test_api.py). Results are pooled in STACK_TARGETS order all the same.
SEARCH_ORDER = (Target.accelerate, Target.deepspeed, Target.torchtitan, Target.megatron)


@dataclass
class StackSearch:
    """One stack's search within a search of every stack."""

    target: Target
    job: JobSpec  # the job as this stack runs it (its target)
    space: Optional[SearchSpace]  # None: not searched (a --fix or a model the stack cannot honour; see reason)
    result: Optional[SearchResult] = None
    reason: Optional[str] = None  # why the stack has no plan
    fix_refused: Optional[str] = None  # FixRefusal.problem where a --fix ruled the stack out
    fix_refused_generic_too: bool = False  # ... one that --target generic refuses as well (FixRefusal.generic_too)


def target_space(base: SearchSpace, model: ModelSpec, job: JobSpec) -> SearchSpace:
    """`base` narrowed to what job.target can run: for a named stack only the layouts, splits
    and recompute modes it can express (planner/stacks); TP overlap a choice where the stack
    has it. FixRefusal when a --fix is one the stack cannot express, UsageError when the model is."""
    stack = stacks.get(job.target)
    overlap = (False, True) if stack.tp_comm_overlap else (False,)
    norm_act = _norm_act_space(base, model, stack)
    if stack.rules is None:  # generic: every layout the cost model prices
        return replace(base, tp_comm_overlap=overlap, recompute_norm_act=norm_act)
    refusal = stacks.model_refusal(stack.name, model)  # an architecture the stack cannot build
    if refusal:
        raise UsageError(refusal)
    rules = stack.rules
    _refuse_fixes(base.fixed, rules)
    modes = tuple(m for m in base.recompute_modes if m.value in rules.recompute_modes)
    if not modes:
        raise FixRefusal(
            f"--fix recompute={base.recompute_modes[0].value}",
            f"{rules.stack} has recompute {', '.join(rules.recompute_modes)}",
        )
    problems = stack.layout_problems  # what the stack refuses beyond its Rules
    return replace(
        base,
        tp_comm_overlap=overlap,
        recompute_norm_act=norm_act,
        rules=rules,
        recompute_modes=modes,
        target_problems=lambda layout: problems(layout, model, job),
    )


def default_targets(cluster: ClusterSpec) -> tuple[Target, ...]:
    """The stacks `plan solve` searches without --target: those a tuned profile was tuned for
    (ClusterSpec.tuned_stacks: its fitted constants are of those stacks, all of them used), else
    STACK_TARGETS."""
    return cluster.tuned_stacks or STACK_TARGETS


def tuned_refusal(cluster: ClusterSpec, target: Target | str, name: str) -> Optional[str]:
    """Why a plan for `target` may not use cluster `name` (as the user gave it), a profile tuned
    for other stacks: its constants are theirs. None where it may (no tuned stack, or this one)."""
    tuned, target = cluster.tuned_stacks, Target(target)
    if not tuned or target in tuned:
        return None
    targets = " or ".join(f"--target {t.value}" for t in tuned)
    return (
        f"{name} was tuned for {_tuned_names(tuned)}; its constants do not apply to {target.value}: "
        f"pass {targets}, or tune with --target {target.value}"
    )


def tuned_search_note(cluster: ClusterSpec, name: str) -> Optional[str]:
    """The line `plan solve` without --target says on a tuned profile (default_targets), or None."""
    tuned = cluster.tuned_stacks
    if not tuned:
        return None
    what = "that stack" if len(tuned) == 1 else "those stacks"
    return (
        f"{name} was tuned for {_tuned_names(tuned)}: searched {what} only (the other stacks have no tuned "
        "constants here; `plan tune --target STACK` tunes one)"
    )


def _tuned_names(tuned: tuple) -> str:
    """'--target generic', '--target generic and megatron'."""
    names = [t.value for t in tuned]
    return "--target " + (names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}")


class FixRefusal(UsageError):
    """A --fix choice a stack cannot honour: `problem` (the fix and why) and what to do."""

    def __init__(
        self,
        fix: str,
        why: str,
        advice: str = "; change or drop the fix, or plan for another --target",
        generic_too: bool = False,
    ):
        self.problem = f"{fix}: {why}"
        self.generic_too = generic_too  # --target generic refuses it as well
        super().__init__(self.problem + advice)


def _refuse_fixes(fixed: dict, rules) -> None:
    """FixRefusal for the first --fix the stack cannot express whatever the rest of the layout
    (Rules.value_problem: a ZeRO stage, schedule or feature it lacks, a degree over its maximum).
    (Fixes that clash only with other choices are the search's to report.)"""
    for key, value in fixed.items():
        why = rules.value_problem(key, value)
        if why:
            raise FixRefusal(f"--fix {fix_key(key)}={fix_text(value)}", why)


def _norm_act_space(base: SearchSpace, model: ModelSpec, stack) -> tuple:
    """Plan.recompute_norm_act's choices for `stack` in `base`: --fix's, else norm_act_choices;
    off where --fix leaves only full recompute (nothing then keeps the outputs it would rerun).
    FixRefusal for a --fix the stack or the recompute modes cannot honour."""
    only_full = all(m == Recompute.full for m in base.recompute_modes)
    if "recompute_norm_act" not in base.fixed:
        return (False,) if only_full else norm_act_choices(model, stack)
    if base.fixed["recompute_norm_act"]:
        if not stack.recompute_norm_act:
            raise FixRefusal(
                "--fix recompute_norm_act=true",
                f"{stack.name} does not recompute the norms and the experts' activation apart",
                f"; --target {stacks.having('recompute_norm_act')}, or drop the fix",
                generic_too=not stacks.get(Target.generic).recompute_norm_act,
            )
        if base.fixed.get("fp8") and stack.rules is not None and not stack.rules.recompute_norm_act_fp8:
            raise FixRefusal(
                "--fix recompute_norm_act=true with --fix fp8=true",
                f"{stack.name}'s FP8 recipe refuses the norm and activation recompute",
                "; drop one of the fixes",
            )
        if only_full:
            raise FixRefusal(
                "--fix recompute_norm_act=true with --fix recompute=full",
                "a fully recomputed layer reruns its whole forward already",
                "; drop one of the fixes",
                generic_too=True,
            )
    return (base.fixed["recompute_norm_act"],)


def norm_act_frees_memory(model: ModelSpec, stack) -> bool:
    """Whether Plan.recompute_norm_act is worth trying for `model` on `stack`: the stack has it
    and it frees memory for this model (a norm of its own or MoE experts: cost_models/memory.py:
    norm_act_bytes); elsewhere it would only cost time."""
    return stack.recompute_norm_act and memory.norm_act_bytes(model, 1, 1, 1, False, stack.kernels) > 0


def norm_act_choices(model: ModelSpec, stack) -> tuple:
    """Plan.recompute_norm_act's choices in a search for `stack`: both where it frees memory
    (norm_act_frees_memory), else off."""
    return (False, True) if norm_act_frees_memory(model, stack) else (False,)


def solve_stacks(
    model: ModelSpec,
    cluster: ClusterSpec,
    job: JobSpec,
    base: SearchSpace,
    memory_limit_gib: Optional[float] = None,
    top_k: int = 3,
    time_limit: Optional[float] = None,
    solver: Optional[str] = None,
    targets: Optional[tuple] = None,
    deadline: Deadline = NO_DEADLINE,
) -> SearchResult:
    """The best plan any of `targets` (default_targets: every stack, or a tuned profile's)
    runs (job's own target is ignored): each stack searched
    with its own job and space. A --time-limit (`time_limit` seconds from now, or `deadline`,
    whichever comes first) is shared out in SEARCH_ORDER: each stack gets the time left over
    the stacks still to search, so what one leaves unused goes to the next; a stack with no
    plan in its share is reported (its reason) and the plans of the others are the answer,
    marked not proven. `alternatives` holds the next `top_k` plans of any stack and each
    stack's own recommendation; `stacks` each stack's search."""
    start = time.perf_counter()
    deadline = deadline.sooner(time_limit)
    limit = memory_limit_gib_of(cluster, memory_limit_gib)
    solver = solver or default_solver()
    searches = [_stack_search(base, model, job, t) for t in (default_targets(cluster) if targets is None else targets)]
    todo = [s for s in searches if s.space is not None]
    try:  # every target's TP-overlap choice in one enumeration; each search takes its own (candidates.py)
        every = replace(
            base,
            tp_comm_overlap=(False, True),
            recompute_norm_act=tuple(
                sorted({x for s in todo if s.space is not None for x in s.space.recompute_norm_act})
            ),
        )
        layouts = enumerate_layouts(model, cluster, every, deadline.before_first_plan())
    except OutOfTime:
        layouts = None
    for k, s in enumerate(sorted(todo, key=_search_rank)):
        if layouts is None:  # the time ran out enumerating: no stack has a plan
            s.result = SearchResult(
                None, [], SearchStats(solver=solver, optimal=False, lower_bound=0.0)
            )  # nothing proven
        else:
            assert s.space is not None  # todo: the stacks searched
            left = deadline.left()
            share = deadline.sooner(None if left is None else left / (len(todo) - k))
            if any(d.result is not None and d.result.best is not None for d in todo):
                share = share.without_grace()  # the grace is for a first plan of any stack
            s.result = solve(
                model, cluster, s.job, s.space, limit, top_k, None, solver, layouts=layouts, deadline=share
            )
        if s.result.best is None:
            s.reason = _why_none(s.result, limit)
    results = cast(list[SearchResult], [s.result for s in todo])  # each set in the loop above
    best, alternatives, fastest = _pool([r for r in results if r.best is not None], top_k)
    stats = _combined_stats([r.stats for r in results], solver, time.perf_counter() - start, fastest)
    return SearchResult(best, alternatives, stats, fastest, searches)


def _search_rank(search: StackSearch) -> int:
    return SEARCH_ORDER.index(search.target) if search.target in SEARCH_ORDER else len(SEARCH_ORDER)


def _stack_search(base: SearchSpace, model: ModelSpec, job: JobSpec, target: Target) -> StackSearch:
    sjob = job.model_copy(update={"target": target})
    try:
        return StackSearch(target, sjob, target_space(base, model, sjob))
    except UsageError as exc:
        return StackSearch(
            target,
            sjob,
            None,
            reason=str(exc),
            fix_refused=getattr(exc, "problem", None),
            fix_refused_generic_too=getattr(exc, "generic_too", False),
        )


def _why_none(result: SearchResult, limit_gib: float) -> str:
    if not result.stats.optimal:
        return "no plan found within its share of --time-limit"
    if result.stats.rejected.get(MEMORY):
        return f"no layout it can express fits in {gib(limit_gib)} GiB per GPU"
    return "no layout it can express is valid for this model and GPU count (check --fix and divisibility)"


def _pool(results: list, top_k: int) -> tuple:
    """(recommendation, alternatives, fastest) over every plan the stacks found: the tie rule
    over all of them; the alternatives are the next `top_k` and each stack's own recommendation.
    A layout two stacks found with the same prediction is listed once (the first stack's)."""
    found: list[Found] = []
    for f in sorted(
        (f for r in results for f in [r.best, *r.alternatives]), key=seconds_per_token
    ):  # stable: stack order
        if not any(f.plan == g.plan and f.estimate == g.estimate for g in found):
            found.append(f)
    if not found:
        return None, [], None
    ranked = break_ties(found)
    own = [next(g for g in found if g.plan == r.best.plan and g.estimate == r.best.estimate) for r in results]
    listed = {id(f) for f in ranked[1 : top_k + 1] + own}
    return ranked[0], [f for f in found if f is not ranked[0] and id(f) in listed], found[0]


def _combined_stats(stats: list[SearchStats], solver: str, wall_s: float, fastest) -> SearchStats:
    """The searches' counts summed; optimal when every stack's search was proven, the gap over
    the least bound any of them left (0 from a search the time cut before it bounded anything:
    the plans of that stack may be any faster)."""
    out = SearchStats(solver=solver, solve_time_s=wall_s, rejected=sum((s.rejected for s in stats), Counter()))
    for field in ("candidates_considered", "refined", "ilps_solved", "deferred", "pruned_by_bound"):
        setattr(out, field, sum(getattr(s, field) for s in stats))
    for s in stats:
        out.layouts_represented_log10 = log10_sum(out.layouts_represented_log10, s.layouts_represented_log10)
    out.optimal = all(s.optimal for s in stats)
    out.lower_bound = min((s.lower_bound for s in stats), default=float("inf"))
    if fastest is not None and not out.optimal:
        best = seconds_per_token(fastest)
        out.optimality_gap = max(0.0, (best - out.lower_bound) / best)
    return out


def stacks_infeasibility(
    model: ModelSpec, cluster: ClusterSpec, searches: list, limit_gib: float, deadline: Deadline = NO_DEADLINE
) -> InfeasibleError | UsageError:
    """Why no stack has a plan: the message of the stack whose most frugal layout needs least
    (past the deadline, only that nothing fits); a UsageError where --fix choices rule out every stack."""
    searched = [s for s in searches if s.space is not None]
    if not searched and all(s.fix_refused for s in searches):  # the fixes rule out every stack: usage
        generic = "" if any(s.fix_refused_generic_too for s in searches) else ", or plan with --target generic"
        return UsageError(
            "no stack can run these --fix choices: "
            + "; ".join(dict.fromkeys(s.fix_refused for s in searches))
            + "; change or drop them"
            + generic
        )
    if not searched:
        return InfeasibleError(
            "; ".join(
                s.reason if s.reason.startswith(s.target.value) else f"{s.target.value}: {s.reason}" for s in searches
            )
        )
    names = f"any of {', '.join(s.target.value for s in searched)}"
    try:  # the --fix choices are what every stack refuses, where layouts with them exist: each stack's reason
        why = (
            {s.target: stack_refusal(model, cluster, s.space, deadline) for s in searched}
            if searched[0].space.fixed
            else {}
        )
    except OutOfTime:
        why = {}
    refused = {
        s.target: s.fix_refused for s in searches if s.fix_refused
    }  # the stacks a fix ruled out before the search
    if (len(searched) > 1 or refused) and why and all(why.values()):
        fixes = " and ".join(f"--fix {fix_key(k)}={fix_text(v)}" for k, v in searched[0].space.fixed.items())
        reasons = {
            s.target: refused.get(s.target) or why[s.target] for s in searches if s.target in refused or s.target in why
        }
        return UsageError(
            f"no stack can run {fixes}: "
            + "; ".join(f"{t.value}: {w}" for t, w in reasons.items())
            + "; change or drop "
            + ("it" if len(searched[0].space.fixed) == 1 else "them")
            + ", or plan with --target generic"
        )
    try:
        need = {s.target: min_memory_needed(model, cluster, s.job, s.space, deadline) for s in searched}
    except OutOfTime:
        return infeasibility(model, cluster, searched[0].job, searched[0].space, limit_gib, names, deadline)
    least = min(searched, key=lambda s: float("inf") if (n := need[s.target]) is None else n)
    return infeasibility(model, cluster, least.job, least.space, limit_gib, stacks=names, deadline=deadline)
