"""Step 4 of the search: the answer as a versioned, self-contained document."""

from __future__ import annotations

from planner.specs import Alternative, ClusterSpec, ModelSpec, SearchReport, SolveDocument, StackAnswer, TieBreak

from .candidates import INFEASIBLE, CostTables
from .explain import explain
from .solve import TIE_RULE, SearchResult, SearchStats, seconds_per_token


def solve_document(model: ModelSpec, cluster: ClusterSpec, num_gpus: int, result: SearchResult) -> SolveDocument:
    best = result.best
    assert best is not None  # a search that found a plan (planner/api.py:solve raises otherwise)
    tables = CostTables(model, cluster, best.job)
    pc = tables.pipeline(best.candidate)
    faster = [i for i, a in enumerate(result.alternatives, start=1) if seconds_per_token(a) < seconds_per_token(best)]
    return SolveDocument(
        model=model,
        cluster=cluster,
        num_gpus=num_gpus,
        job=best.job,
        plan=best.plan,
        estimate=best.estimate,
        alternatives=[
            Alternative(
                plan=a.plan, global_batch_size=a.job.global_batch_size, estimate=a.estimate, target=a.job.target
            )
            for a in result.alternatives
        ],
        search=search_report(result.stats),
        explanation=explain(model, cluster, best.job, best.plan, best.estimate, pc, tables.links(best.candidate)),
        stacks=_stack_answers(result),
        tie_rule=TieBreak(faster_alternatives=faster, rule=TIE_RULE) if faster else None,
    )


def search_report(st: SearchStats) -> SearchReport:
    return SearchReport(
        candidates_considered=st.candidates_considered,
        layouts_represented_log10=max(0.0, st.layouts_represented_log10),  # 0 when no candidate was bounded
        infeasible={k: v for k, v in sorted(st.rejected.items()) if k in INFEASIBLE},
        skipped={k: v for k, v in sorted(st.rejected.items()) if k not in INFEASIBLE},
        pruned_by_bound=st.pruned_by_bound,
        refined_bounds=st.refined,
        ilp_candidates=st.ilps_solved - st.deferred,  # a deferred candidate's MILP runs twice
        ilps_solved=st.ilps_solved,
        solver=st.solver,
        solve_time_s=st.solve_time_s,
        optimal=st.optimal,
        optimality_gap=st.optimality_gap,
    )


def _position(stack, result: SearchResult):
    """Where the document holds the stack's own recommendation: 0 the plan, K alternative K."""
    if stack.result is None or stack.result.best is None:
        return None
    own = stack.result.best
    for k, f in enumerate([result.best, *result.alternatives]):
        if f.plan == own.plan and f.estimate == own.estimate:
            return k
    raise ValueError(
        f"solve_document: {stack.target.value}'s recommendation is not in the result"
    )  # an internal invariant


def _stack_answers(result: SearchResult) -> list[StackAnswer]:
    """Each stack's answer; those with a plan first, in the document's order (the plan, then
    the alternatives by predicted time)."""
    answers = [
        StackAnswer(
            target=s.target,
            alternative=_position(s, result),
            reason=s.reason,
            search=None if s.result is None else search_report(s.result.stats),
        )
        for s in result.stacks
    ]
    return sorted(answers, key=lambda a: (a.alternative is None, a.alternative or 0))
