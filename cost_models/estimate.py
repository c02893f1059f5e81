"""The one function that turns (model, cluster, job, plan) into an Estimate.

`plan estimate`, `plan solve` and `plan run`'s predicted column all go through here, so a
prediction never differs between commands. :func:`evaluate` plugs a plan's integer layer
counts into the expressions of cost_models/terms.py, the same ones the solver's ILP and
bounds read.

Per virtual pipeline stage j, one micro-batch costs S_j = stage_time_j + (its rank's exposed
ZeRO-2/3 traffic per micro-batch) / v; the pipeline takes T = sum_j S_j + (m - 1) max_j S_j
(cost_models/pipeline.py), and the step adds the per-step data-parallel communication that
does not hide behind backward and the optimizer update, each the maximum over ranks.
"""

from __future__ import annotations

import math

from planner.specs import ClusterSpec, Estimate, JobSpec, ModelSpec, Plan, PipelineRankMemory, TimeBreakdown
from planner.stacks import validate_plan

from . import pipeline
from .memory import GIB
from .tables import PipelineCosts, pipeline_costs
from .terms import MODES


def recompute_counts(plan: Plan, num_layers: int) -> list[tuple[int, int, int]]:
    """(none, selective, full) layer counts of every virtual stage."""
    if plan.stage_recompute is not None:
        return [(r.none, r.selective, r.full) for r in plan.stage_recompute]
    slot = MODES.index(plan.recompute)
    return [
        (n if slot == 0 else 0, n if slot == 1 else 0, n if slot == 2 else 0) for n in plan.stage_layers(num_layers)
    ]


def estimate(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan) -> Estimate:
    """Predict step time and per-GPU memory of `plan`. Raises PlanError for an impossible plan."""
    validate_plan(plan, model, job)
    return evaluate(pipeline_costs(model, cluster, job, plan), recompute_counts(plan, model.num_layers))


def rank_counts(counts, pp: int) -> list[tuple[int, int, int]]:
    """Per pipeline rank, its stages' counts summed per recompute mode."""
    return [tuple(sum(c[i] for c in counts[r::pp]) for i in range(3)) for r in range(pp)]


def evaluate(pc: PipelineCosts, counts: list[tuple[int, int, int]]) -> Estimate:
    """Time and memory of one layer split and recompute choice (counts of layers under
    none/selective/full per virtual stage) of the layout `pc` describes."""
    pp, v, m, terms = pc.pp, pc.vpp, pc.num_micro_batches, pc.terms
    ranks, totals = terms.ranks(), rank_counts(counts, pp)
    exposed = [rk.exposure.values(n) for rk, n in zip(ranks, totals)]  # (per micro-batch, per step)
    stage_totals = [ranks[j % pp].stages[j // pp].total(c) + exposed[j % pp][0] / v for j, c in enumerate(counts)]
    if pc.gpipe:
        forward = [ranks[j % pp].stages[j // pp].forward_pass(c) for j, c in enumerate(counts)]
        t_pipe = pipeline.gpipe_time(stage_totals, forward, m)
    else:
        t_pipe = pipeline.pipeline_time(stage_totals, pp, m, v, padded=pc.uneven_chunks)
    rank_work = pipeline.rank_times(stage_totals, pp)
    bn = max(range(pp), key=rank_work.__getitem__)
    t_opt = max(rk.optimizer(n) for rk, n in zip(ranks, totals))
    t_dp = max(e[1] for e in exposed)
    step = t_pipe + t_dp + t_opt

    def on_bottleneck(part: str) -> float:
        stages = ranks[bn].stages
        return m * sum(getattr(s, part)(c) for s, c in zip(stages, counts[bn::pp]))

    breakdown = TimeBreakdown(
        compute=on_bottleneck("compute"),
        recompute=on_bottleneck("recompute"),
        pipeline_bubble=t_pipe - m * rank_work[bn],
        tp_communication=on_bottleneck("tp"),
        pp_communication=on_bottleneck("p2p"),
        dp_communication_exposed=m * exposed[bn][0] + t_dp,
        optimizer=t_opt,
    )
    stage_mem = [_rank_memory(rk, n, counts[rk.rank :: pp]) for rk, n in zip(ranks, totals)]
    peak = max(sm.total for sm in stage_mem)

    gpus = pc.dp * pc.tp * pp
    lc = pc.layer
    sel, full = sum(c[1] for c in counts), sum(c[2] for c in counts)
    rec_flops = (sel * lc.recompute_flops[1] + full * lc.recompute_flops[2]) * m * pc.dp
    mf = pc.model_flops_per_step
    u = pc.uncertainty
    return Estimate(
        step_time_s=step,
        time_breakdown_s=breakdown,
        tokens_per_s=pc.tokens_per_step / step,
        model_tflops_per_gpu=mf / step / gpus / 1e12,
        hardware_tflops_per_gpu=(mf + rec_flops) / step / gpus / 1e12,
        mfu=mf / step / gpus / pc.peak_flops,
        peak_memory_gib=peak,
        memory_capacity_gib=pc.memory_capacity_gib,
        fits=peak <= pc.memory_capacity_gib,
        memory_gib_per_pipeline_rank=stage_mem,
        bottleneck_pipeline_rank=bn,
        model_flops_per_step=mf,
        interval_coverage=u.coverage if u else None,
        **_interval(u, breakdown, step, gpus, (pc.shard_size or pc.dp) if pc.zero_stage else 0),
    )


COMMUNICATION_TERMS = ("tp_communication", "pp_communication", "dp_communication_exposed")


def _interval(u, breakdown: TimeBreakdown, step: float, gpus: int, shard: int) -> dict:
    """The step-time interval and per-term uncertainty from the cluster's cross-validated
    errors: compute-like and communication terms each carry their own relative error, taken
    as independent (combined in quadrature, in log space); widened where the plan leaves the
    calibrated region (Uncertainty.widening: `gpus` GPUs, ZeRO over `shard` ranks), saying why."""
    if u is None:
        return {}
    terms = breakdown.model_dump()
    comm = sum(terms[k] for k in COMMUNICATION_TERMS)
    factor, why = u.widening(gpus, shard)
    w = factor * u.log_halfwidth((step - comm) / step, comm / step)
    out: dict[str, object] = {"step_time_interval_s": [step * math.exp(-w), step * math.exp(w)]}
    if why:
        out["interval_widened"] = why
    if u.compute is not None and u.communication is not None:
        grow = math.exp(factor * math.log1p(u.compute)) - 1, math.exp(factor * math.log1p(u.communication)) - 1
        most = step * math.expm1(w)  # no term is more uncertain than the whole step's interval allows
        out["time_uncertainty_s"] = TimeBreakdown(
            **{k: min(most, v * (grow[1] if k in COMMUNICATION_TERMS else grow[0])) for k, v in terms.items()}
        )
    return out


def _rank_memory(rk, n, stage_counts) -> PipelineRankMemory:
    mem = rk.memory
    w, g, o, a = (x(n) / GIB for x in (mem.weights, mem.gradients, mem.optimizer, mem.activations))
    t = (mem.transient(stage_counts) + mem.fixed - mem.overhead) / GIB
    overhead = mem.overhead / GIB
    return PipelineRankMemory(
        pipeline_rank=rk.rank,
        layers=sum(n),
        weights=w,
        gradients=g,
        optimizer_states=o,
        activations=a,
        temporary=t,
        overhead=overhead,
        total=w + g + o + a + t + overhead,
    )
