"""Step 4 of the search: the answer as a versioned, self-contained document."""

from __future__ import annotations

import math

from planner.specs import Alternative, ClusterSpec, ModelSpec, SearchReport, SolveDocument

from .candidates import INFEASIBLE, CostTables
from .explain import explain
from .solve import SearchResult


def solve_document(model: ModelSpec, cluster: ClusterSpec, num_gpus: int, result: SearchResult) -> SolveDocument:
    best, st = result.best, result.stats
    tables = CostTables(model, cluster, best.job)
    pc = tables.pipeline(best.candidate)
    return SolveDocument(
        model=model,
        cluster=cluster,
        num_gpus=num_gpus,
        job=best.job,
        plan=best.plan,
        estimate=best.estimate,
        alternatives=[
            Alternative(plan=a.plan, global_batch_size=a.job.global_batch_size, estimate=a.estimate) for a in result.alternatives
        ],
        search=SearchReport(
            candidates_considered=st.candidates_considered,
            layouts_represented_log10=math.log10(st.layouts_represented) if st.layouts_represented else 0.0,
            infeasible={k: v for k, v in sorted(st.rejected.items()) if k in INFEASIBLE},
            skipped={k: v for k, v in sorted(st.rejected.items()) if k not in INFEASIBLE},
            pruned_by_bound=st.pruned_by_bound,
            refined_bounds=st.refined,
            ilp_candidates=st.ilps_solved,  # one candidate per ILP
            ilps_solved=st.ilps_solved,
            solver=st.solver,
            solve_time_s=st.solve_time_s,
            optimal=st.optimal,
            optimality_gap=st.optimality_gap,
        ),
        explanation=explain(model, cluster, best.job, best.plan, best.estimate, pc, tables.links(best.candidate)),
    )
