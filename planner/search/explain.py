"""Why the chosen plan looks the way it does: its memory and compute bottlenecks, and the
traffic of each parallel dimension with the link it rides."""

from __future__ import annotations

from planner.units import gib

from cost_models.communication import VOLUME_FACTOR
from cost_models.estimate import rank_counts as rank_counts_of
from cost_models.estimate import recompute_counts
from cost_models.tables import PipelineCosts
from cost_models.memory import GIB
from planner.specs import (
    DTYPE_BYTES,
    Axis,
    ClusterSpec,
    Collective,
    Estimate,
    Explanation,
    JobSpec,
    LinkVolume,
    ModelSpec,
    Plan,
)

_MEMORY_HINTS = {
    "model states": "shard them further (ZeRO stage, more dp/tp/pp)",
    "activations": "recompute more, raise tp with sequence parallelism, or shrink the micro-batch",
    "temporary": "shrink the micro-batch (logits scale with it) or raise tp",
}


def explain(
    model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan, est: Estimate, pc: PipelineCosts, links: dict
) -> Explanation:
    peak = max(est.memory_gib_per_pipeline_rank, key=lambda s: s.total)
    parts = {
        "model states": peak.weights + peak.gradients + peak.optimizer_states,
        "activations": peak.activations,
        "temporary": peak.temporary,
    }
    part = max(parts, key=parts.__getitem__)
    memory = (
        f"pipeline rank {peak.pipeline_rank}: {peak.total:.1f} of {gib(est.memory_capacity_gib)} GiB, mostly {part} "
        f"({parts[part]:.1f} GiB); to relieve it: {_MEMORY_HINTS[part]}"
    )
    bd = est.time_breakdown_s.model_dump()
    top = max(bd, key=bd.__getitem__)
    compute = (
        f"{top.replace('_', ' ')} takes {bd[top]:.3g} s of the {est.step_time_s:.3g} s step "
        f"({100 * bd[top] / est.step_time_s:.0f}%) on pipeline rank {est.bottleneck_pipeline_rank}; MFU {100 * est.mfu:.1f}%"
    )

    e = DTYPE_BYTES[job.precision]
    m, b, s, h = (
        plan.num_micro_batches,
        plan.micro_batch_size,
        job.seq_len // plan.cp,
        model.hidden_size,
    )  # a rank's tokens
    counts = recompute_counts(plan, model.num_layers)
    rank = est.bottleneck_pipeline_rank
    rank_counts = counts[rank :: plan.pp]
    layers = sum(sum(c) for c in rank_counts)
    full_layers = sum(c[2] for c in rank_counts)
    buf = e * b * s * h
    volumes = []
    t = plan.tp
    if t > 1:
        coll = Collective.all_gather if plan.sequence_parallel else Collective.all_reduce
        per = (2 * VOLUME_FACTOR[Collective.all_gather](t) if plan.sequence_parallel else VOLUME_FACTOR[coll](t)) * buf
        n_coll = 4 * layers + 2 * full_layers  # + the recomputed forward's two
        volumes.append((Axis.tp, coll, m * n_coll * per))
    if plan.pp > 1:
        sends = 2 if 0 < rank < plan.pp - 1 else 1
        volumes.append((Axis.pp, Collective.p2p, m * plan.vpp * sends * buf / (t if plan.sequence_parallel else 1)))
    if plan.dp * plan.cp > 1:  # gradients over every replica of the weights: dp x cp
        rank_params = pc.terms.ranks()[rank].params(rank_counts_of(counts, plan.pp)[rank])
        g = rank_params * e
        f = VOLUME_FACTOR[Collective.reduce_scatter](plan.dp * plan.cp)
        if plan.zero_stage == 3:
            vol, coll = m * 3 * f * g, Collective.all_gather
        else:
            vol, coll = 2 * f * g, (Collective.all_reduce if plan.zero_stage == 0 else Collective.reduce_scatter)
        volumes.append((Axis.dp, coll, vol))
    comms = []
    for axis, coll, vol in volumes:
        link = links[axis]
        tier = cluster.inter_node if link.inter_node else cluster.intra_node
        comms.append(
            LinkVolume(
                axis=axis,
                degree=link.size,
                link=tier.name + (f" x {link.rails} rails" if link.rails > 1 else ""),
                inter_node=link.inter_node,
                bandwidth_gbps=link.bandwidth_gbps(coll),
                gib_per_gpu_per_step=vol / GIB,
            )
        )
    return Explanation(memory_bottleneck=memory, compute_bottleneck=compute, communication=comms)
