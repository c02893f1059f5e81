"""The one function that turns (model, cluster, job, plan) into an Estimate.

`plan estimate`, `plan solve` and `plan run`'s predicted column all go through here, so a
prediction never differs between commands. The solver's ILP takes its coefficients from
the same :class:`PipelineCosts` that :func:`evaluate` reads, and decodes every answer back
through :func:`evaluate`.

Per virtual pipeline stage j, one micro-batch costs
    S_j = n_j (forward + backward + TP comm) + recompute extras
          + embedding (j = 0) + LM head and loss (j = last) + p2p sends
          (+ exposed ZeRO-3 gathers of its rank / v),
the pipeline takes T = sum_j S_j + (m - 1) max_j S_j (cost_models.pipeline), and the step
adds the data-parallel communication that does not hide behind backward plus the
optimizer update.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from planner.specs import (
    DTYPE_BYTES,
    Axis,
    ClusterSpec,
    Collective,
    DType,
    Estimate,
    JobSpec,
    ModelSpec,
    Optimizer,
    Plan,
    Recompute,
    Schedule,
    StageMemory,
    TimeBreakdown,
)

from . import compute, memory, pipeline
from .communication import GroupLink, mesh_strides, overlapped

GRADIENT_BUCKET_BYTES = 25 * 2**20  # PyTorch DDP's default bucket_cap_mb=25
ADAM_UPDATE_BYTES = 30  # per parameter: read fp32 master/m/v + grad, write master/m/v + 16-bit copy
SGD_UPDATE_BYTES = 18
MODES = (Recompute.none, Recompute.selective, Recompute.full)


@dataclass(frozen=True)
class LayerCosts:
    """One transformer layer, one micro-batch, one GPU of a (micro-batch, tp, sp) choice."""

    forward: float  # compute seconds
    backward: float
    tp_forward: float  # TP collectives on the critical path
    tp_backward: float
    recompute: tuple  # extra backward seconds (compute + comm) per mode (none, selective, full)
    activation_bytes: tuple  # bytes kept per micro-batch per mode (none, selective, full)
    params: int  # parameters on this GPU (TP-sharded, before ZeRO)
    flops_forward: float  # whole layer (unsharded), for model FLOPs
    recompute_flops: tuple  # extra FLOPs per mode, whole layer


@dataclass(frozen=True)
class EdgeCosts:
    """What the first and last stages carry besides layers, and the pipeline sends."""

    embedding_forward: float
    embedding_backward: float
    head_forward: float
    head_backward: float
    embedding_params: int
    head_params: int
    embedding_activation_bytes: float
    head_activation_bytes: float
    logits_temporary_bytes: float
    p2p: float  # one activation (or gradient) send between neighbouring stages


def measured_layer(cluster: ClusterSpec, model: ModelSpec, job: JobSpec, kind: str, micro_batch: int, tp: int):
    """(forward s, backward s, saved bytes) of this layer kind from the profile, if the cluster is a
    measured profile of this very model, sequence length and dtype (else None: analytic).
    A micro-batch size that was not measured scales the nearest measured one linearly."""
    m = cluster.measured
    if m is None or m.environment.dtype != job.precision:
        return None
    ignore = {"name", "source", "param_dtype"}
    if m.model.model_dump(exclude=ignore) != model.model_dump(exclude=ignore):
        return None
    same = [x for x in m.layers if x.kind == kind and x.seq_len == job.seq_len and x.tp == tp]
    if not same:
        return None
    x = min(same, key=lambda x: (abs(x.micro_batch_size - micro_batch), -x.micro_batch_size))
    scale = micro_batch / x.micro_batch_size
    return x.forward_s * scale, x.backward_s * scale, x.activation_bytes * scale


def layer_costs(
    model: ModelSpec, cluster: ClusterSpec, job: JobSpec, micro_batch: int, tp: int, sp: bool, tp_link: GroupLink
) -> LayerCosts:
    dtype, b, s = job.precision, micro_batch, job.seq_len
    lc = compute.layer_compute(model, cluster.device, dtype, b, s, tp, sp, job.flash_attention)
    measured = measured_layer(cluster, model, job, "block", b, tp)
    if measured is not None:
        # A measured profile of this model: its times replace the analytic ones; the core
        # attention keeps its analytic share of the forward (what selective recompute reruns).
        share = lc.attention_core_forward / lc.forward if lc.forward else 0.0
        lc = compute.LayerCompute(
            forward=measured[0], backward=measured[1], attention_core_forward=share * measured[0], flops_forward=lc.flops_forward,
        )
    # Four all-reduces of b s h per layer per micro-batch, two forward and two backward
    # (Narayanan et al. 2021, sec. 3.2); with sequence parallelism each becomes an
    # all-gather plus a reduce-scatter of the same buffer (Korthikanti et al. sec. 4.2.2).
    buf = DTYPE_BYTES[dtype] * b * s * model.hidden_size
    if sp:
        one = tp_link.time(Collective.all_gather, buf) + tp_link.time(Collective.reduce_scatter, buf)
    else:
        one = tp_link.time(Collective.all_reduce, buf)
    tp_fwd = tp_bwd = 2 * one
    flops = compute.layer_flops_forward(model, b, s)
    acts = tuple(memory.layer_activation_bytes(model, b, s, tp, sp, r, job.flash_attention, dtype) for r in MODES)
    if measured is not None and not sp:
        # measured bytes saved with nothing recomputed; selective frees the analytic core
        # attention share of them; full recompute keeps the layer input only (exact).
        a_none = measured[2]
        acts = (a_none, max(acts[2], a_none - (acts[0] - acts[1])), acts[2])
    return LayerCosts(
        forward=lc.forward,
        backward=lc.backward,
        tp_forward=tp_fwd,
        tp_backward=tp_bwd,
        recompute=(0.0, lc.attention_core_forward, lc.forward + tp_fwd),
        activation_bytes=acts,
        params=compute.layer_params(model, tp).total,
        flops_forward=flops,
        recompute_flops=(0.0, compute.attention_flops_forward(model, b, s), flops),
    )


def edge_costs(
    model: ModelSpec, cluster: ClusterSpec, job: JobSpec, micro_batch: int, tp: int, sp: bool, pp: int,
    tp_link: GroupLink, pp_link: GroupLink,
) -> EdgeCosts:
    dtype, b, s, dev = job.precision, micro_batch, job.seq_len, cluster.device
    buf = DTYPE_BYTES[dtype] * b * s * model.hidden_size
    # Vocab-parallel embedding all-reduces its output (forward); the column-parallel head
    # all-reduces its input gradient (backward); the parallel cross-entropy reduces max and
    # sum of exp over the TP group (b s fp32 values, twice).
    reduce = Collective.reduce_scatter if sp else Collective.all_reduce
    emb_tp = tp_link.time(reduce, buf)
    head_tp = tp_link.time(reduce, buf)
    loss_tp = 2 * tp_link.time(Collective.all_reduce, 4 * b * s)
    emb = compute.embedding_forward_time(model, dev, dtype, b, s)
    head = compute.head_forward_time(model, dev, dtype, b, s, tp)
    emb_bwd = 2 * emb
    head_bwd = 2 * head
    m_emb = measured_layer(cluster, model, job, "embedding", b, 1)
    m_head = measured_layer(cluster, model, job, "head", b, 1)
    if m_emb is not None:
        emb, emb_bwd = m_emb[0], m_emb[1]
    if m_head is not None:  # measured unsharded; a vocab-parallel head does 1/tp of the work
        head, head_bwd = m_head[0] / tp, m_head[1] / tp
    # Pipeline sends: b s h values; with SP only the local 1/t shard (Megatron's
    # scatter/gather optimisation, Narayanan et al. sec. 4.1).
    p2p = pp_link.time(Collective.p2p, buf / (tp if sp else 1))
    return EdgeCosts(
        embedding_forward=emb + emb_tp,
        embedding_backward=emb_bwd,
        head_forward=head + loss_tp,
        head_backward=head_bwd + head_tp,
        embedding_params=compute.embedding_params(model, tp),
        head_params=compute.head_params(model, tp, pp),
        embedding_activation_bytes=memory.embedding_activation_bytes(model, b, s, tp, sp),
        head_activation_bytes=memory.head_activation_bytes(model, b, s, tp, sp, dtype),
        logits_temporary_bytes=memory.logits_temporary_bytes(model, b, s, tp, dtype),
        p2p=p2p,
    )


def mesh_links(cluster: ClusterSpec, dp: int, tp: int, pp: int, mesh_order) -> dict[Axis, GroupLink]:
    degrees = {Axis.dp: dp, Axis.tp: tp, Axis.pp: pp}
    strides = mesh_strides(degrees, mesh_order)
    return {a: GroupLink(cluster, degrees[a], strides[a]) for a in Axis}


@dataclass(frozen=True)
class StageExtras:
    """What virtual stage j carries besides its layers, per micro-batch."""

    compute: float  # embedding / head and loss, forward + backward
    forward: float  # the forward part of `compute`
    p2p: float  # pipeline sends
    params: float
    activation_bytes: float
    temporary_bytes: float  # logits on the last stage


@dataclass(frozen=True)
class PipelineCosts:
    """Everything needed to cost any layer split and recompute choice of one layout: the
    coefficient tables that both :func:`evaluate` and the solver's ILP read."""

    pp: int
    vpp: int
    dp: int
    tp: int
    num_micro_batches: int
    zero_stage: int
    num_layers: int
    layer: LayerCosts
    edge: EdgeCosts
    in_flight: tuple  # per rank, micro-batches per model chunk held at the peak
    state_bytes_per_param: tuple  # (weights, gradients, optimizer) after ZeRO sharding
    comm_bytes_per_param: int  # gradients / gathered parameters on the wire
    dp_link: GroupLink
    overlap: float  # fraction of DP communication that hides behind compute
    optimizer_seconds_per_param: float  # update of the local shard, per parameter held
    overhead_bytes: float
    zero3_gather_bytes: float  # gathered current + prefetched layer (ZeRO-3)
    zero3_first_gather: float  # exposed all-gather of the first layer (ZeRO-3)
    tokens_per_step: int
    model_flops_per_step: float
    memory_capacity_gib: float
    peak_flops: float

    @property
    def num_stages(self) -> int:
        return self.pp * self.vpp

    @property
    def memory_per_param(self) -> float:
        return sum(self.state_bytes_per_param)

    def stage_extras(self, j: int) -> StageExtras:
        ec, last = self.edge, self.num_stages - 1
        comp = fwd = params = acts = temp = 0.0
        if j == 0:
            comp += ec.embedding_forward + ec.embedding_backward
            fwd += ec.embedding_forward
            params += ec.embedding_params
            acts += ec.embedding_activation_bytes
        if j == last:
            comp += ec.head_forward + ec.head_backward
            fwd += ec.head_forward
            params += ec.head_params
            acts += ec.head_activation_bytes
            temp = ec.logits_temporary_bytes
        # Each stage receives an activation and sends one forward, and the reverse backward;
        # sends are not overlapped with compute.
        p2p = ec.p2p * ((j != last) + (j != 0))
        return StageExtras(comp, fwd, p2p, params, acts, temp)


def pipeline_costs(
    model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan, links: dict | None = None,
    layer: LayerCosts | None = None, edge: EdgeCosts | None = None,
) -> PipelineCosts:
    """Cost tables of `plan`'s layout; `links`, `layer`, `edge` may come from a cache."""
    return layout_costs(
        model, cluster, job, plan.dp, plan.tp, plan.pp, plan.vpp, plan.micro_batch_size, plan.num_micro_batches,
        plan.schedule, plan.zero_stage, plan.sequence_parallel, plan.mesh_order, links, layer, edge,
    )


def layout_costs(
    model: ModelSpec, cluster: ClusterSpec, job: JobSpec, dp: int, tp: int, pp: int, vpp: int, micro_batch: int,
    num_micro_batches: int, schedule: Schedule, zero: int, sp: bool, mesh_order, links: dict | None = None,
    layer: LayerCosts | None = None, edge: EdgeCosts | None = None,
) -> PipelineCosts:
    links = links or mesh_links(cluster, dp, tp, pp, mesh_order)
    layer = layer or layer_costs(model, cluster, job, micro_batch, tp, sp, links[Axis.tp])
    edge = edge or edge_costs(model, cluster, job, micro_batch, tp, sp, pp, links[Axis.tp], links[Axis.pp])
    e = DTYPE_BYTES[job.precision]
    w, g, o = memory.state_bytes_per_param(job.precision, job.optimizer)
    states = (w / (dp if zero >= 3 else 1), g / (dp if zero >= 2 else 1), o / (dp if zero >= 1 else 1))
    upd = ADAM_UPDATE_BYTES if job.optimizer == Optimizer.adam else SGD_UPDATE_BYTES
    z3 = zero >= 3 and dp > 1
    batch = dp * micro_batch * num_micro_batches
    schedule = Schedule(schedule) if not isinstance(schedule, Schedule) else schedule
    return PipelineCosts(
        pp=pp,
        vpp=vpp,
        dp=dp,
        tp=tp,
        num_micro_batches=num_micro_batches,
        zero_stage=zero,
        num_layers=model.num_layers,
        layer=layer,
        edge=edge,
        in_flight=_in_flight_table(schedule, pp, num_micro_batches, vpp),
        state_bytes_per_param=states,
        comm_bytes_per_param=e,
        dp_link=links[Axis.dp],
        overlap=cluster.overlap_efficiency,
        optimizer_seconds_per_param=compute.memory_bound_time(cluster.device, upd) / (dp if zero >= 1 else 1),
        overhead_bytes=cluster.device.framework_overhead_gib * memory.GIB,
        zero3_gather_bytes=2 * layer.params * e if z3 else 0.0,
        zero3_first_gather=links[Axis.dp].time(Collective.all_gather, layer.params * e) if z3 else 0.0,
        tokens_per_step=batch * job.seq_len,
        model_flops_per_step=compute.model_flops_per_step(model, batch, job.seq_len),
        memory_capacity_gib=cluster.device.memory_gib,
        peak_flops=cluster.device.peak_tflops[job.precision] * 1e12,
    )


@lru_cache(maxsize=4096)
def _in_flight_table(schedule: Schedule, pp: int, num_micro_batches: int, vpp: int) -> tuple:
    """Per rank: micro-batches per model chunk held at the peak."""
    return tuple(memory.in_flight_micro_batches(schedule, pp, num_micro_batches, r, vpp) / vpp for r in range(pp))


def recompute_counts(plan: Plan, num_layers: int) -> list[tuple[int, int, int]]:
    """(none, selective, full) layer counts of every virtual stage."""
    if plan.stage_recompute is not None:
        return [(r.none, r.selective, r.full) for r in plan.stage_recompute]
    slot = MODES.index(plan.recompute)
    return [tuple(n if i == slot else 0 for i in range(3)) for n in plan.stage_layers(num_layers)]


def estimate(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan) -> Estimate:
    """Predict step time and per-GPU memory of `plan`. Raises PlanError for an impossible plan."""
    plan.validate_for(model, job)
    return evaluate(pipeline_costs(model, cluster, job, plan), recompute_counts(plan, model.num_layers))


def dp_exposed(pc: PipelineCosts, params: float, forward: float, backward: float) -> tuple[float, float]:
    """(per micro-batch, per step) exposed data-parallel communication of one rank holding
    `params` parameters, whose micro-batch forward/backward take `forward`/`backward`."""
    if pc.dp <= 1:
        return 0.0, 0.0
    t, eta = pc.dp_link.time, pc.overlap
    nbytes = params * pc.comm_bytes_per_param
    bucket = min(nbytes, GRADIENT_BUCKET_BYTES)
    if pc.zero_stage == 0:
        # DDP: bucketed all-reduce overlaps the last micro-batch's backward, except the last bucket.
        return 0.0, overlapped(t(Collective.all_reduce, nbytes), t(Collective.all_reduce, bucket), backward, eta)
    if pc.zero_stage == 1:
        # ZeRO-1 (Megatron's distributed optimizer): gradients accumulate in a full buffer
        # and are reduce-scattered once, overlapping the last micro-batch's backward like
        # DDP; the parameter all-gather after the optimizer step is exposed.
        rs = overlapped(t(Collective.reduce_scatter, nbytes), t(Collective.reduce_scatter, bucket), backward, eta)
        return 0.0, rs + t(Collective.all_gather, nbytes)
    if pc.zero_stage == 2:
        # ZeRO-2 keeps only its gradient shard, so with gradient accumulation it
        # reduce-scatters after every micro-batch's backward (DeepSpeed stage 2, FSDP
        # SHARD_GRAD_OP); parameters are all-gathered once per step.
        rs = overlapped(t(Collective.reduce_scatter, nbytes), t(Collective.reduce_scatter, bucket), backward, eta)
        return rs, t(Collective.all_gather, nbytes)
    # ZeRO-3 / FSDP: every micro-batch gathers each layer again in forward and in backward
    # and reduce-scatters its gradients; prefetching hides them behind the previous layer's
    # compute, except the first layer's gather.
    ag, rs, first = t(Collective.all_gather, nbytes), t(Collective.reduce_scatter, nbytes), pc.zero3_first_gather
    return overlapped(ag, first, forward, eta) + overlapped(ag + rs, first, backward, eta), 0.0


def evaluate(pc: PipelineCosts, counts: list[tuple[int, int, int]]) -> Estimate:
    """Time and memory of one layer split and recompute choice (counts of layers under
    none/selective/full per virtual stage) of the layout `pc` describes."""
    pp, v, m, lc = pc.pp, pc.vpp, pc.num_micro_batches, pc.layer
    fb, fwd_layer, tp_layer = lc.forward + lc.backward, lc.forward + lc.tp_forward, lc.tp_forward + lc.tp_backward
    a0, a1, a2 = lc.activation_bytes
    comp, rec, tp, p2p, fwd = [], [], [], [], []
    rank_layers, rank_params, rank_acts, rank_temp = [0] * pp, [0.0] * pp, [0.0] * pp, [0.0] * pp
    for j, (n0, n1, n2) in enumerate(counts):
        n, r, x = n0 + n1 + n2, j % pp, pc.stage_extras(j)
        comp.append(n * fb + x.compute)
        rec.append(n1 * lc.recompute[1] + n2 * lc.recompute[2])
        tp.append(n * tp_layer)
        p2p.append(x.p2p)
        fwd.append(n * fwd_layer + x.forward)
        rank_layers[r] += n
        rank_params[r] += n * lc.params + x.params
        rank_acts[r] += pc.in_flight[r] * (n0 * a0 + n1 * a1 + n2 * a2 + x.activation_bytes)
        # A fully recomputed layer rebuilds all its activations during its own backward.
        rank_temp[r] = max(rank_temp[r], x.temporary_bytes + (a0 if n2 else 0.0))
    totals = [a + b + c + d for a, b, c, d in zip(comp, rec, tp, p2p)]

    dp_per_mb, dp_step = [0.0] * pp, [0.0] * pp
    for r in range(pp):
        f = sum(fwd[r::pp])
        dp_per_mb[r], dp_step[r] = dp_exposed(pc, rank_params[r], f, sum(totals[r::pp]) - f)

    stage_totals = [t + dp_per_mb[j % pp] / v for j, t in enumerate(totals)]
    t_pipe = pipeline.pipeline_time(stage_totals, pp, m, v)
    rank_work = pipeline.rank_times(stage_totals, pp)
    bn = max(range(pp), key=rank_work.__getitem__)
    t_opt = pc.optimizer_seconds_per_param * max(rank_params)
    t_dp = max(dp_step)
    step = t_pipe + t_dp + t_opt
    breakdown = TimeBreakdown(
        compute=m * sum(comp[bn::pp]),
        recompute=m * sum(rec[bn::pp]),
        pipeline_bubble=t_pipe - m * rank_work[bn],
        tp_communication=m * sum(tp[bn::pp]),
        pp_communication=m * sum(p2p[bn::pp]),
        dp_communication_exposed=m * dp_per_mb[bn] + t_dp,
        optimizer=t_opt,
    )

    gib, overhead = memory.GIB, pc.overhead_bytes / memory.GIB
    stage_mem = []
    for r in range(pp):
        w, g, o = (rank_params[r] * k / gib for k in pc.state_bytes_per_param)
        a, t = rank_acts[r] / gib, (rank_temp[r] + pc.zero3_gather_bytes) / gib
        stage_mem.append(
            StageMemory(
                stage=r, layers=rank_layers[r], weights=w, gradients=g, optimizer_states=o,
                activations=a, temporary=t, overhead=overhead, total=w + g + o + a + t + overhead,
            )
        )
    peak = max(sm.total for sm in stage_mem)

    gpus = pc.dp * pc.tp * pp
    sel, full = sum(c[1] for c in counts), sum(c[2] for c in counts)
    rec_flops = (sel * lc.recompute_flops[1] + full * lc.recompute_flops[2]) * m * pc.dp
    mf = pc.model_flops_per_step
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
        memory_gib_per_stage=stage_mem,
        bottleneck_stage=bn,
        model_flops_per_step=mf,
    )
