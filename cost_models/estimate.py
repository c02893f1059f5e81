"""The one function that turns (model, cluster, job, plan) into an Estimate.

`plan estimate`, `plan solve` (its ILP cost tables come from :func:`layer_costs` and
:func:`edge_costs`) and `plan run`'s predicted column all go through here, so a prediction
never differs between commands.

Per virtual pipeline stage j, one micro-batch costs
    S_j = n_j (forward + backward + TP comm) + recompute extras
          + embedding (j = 0) + LM head and loss (j = last) + p2p sends,
the pipeline takes T = sum_j S_j + (m - 1) max_j S_j (cost_models.pipeline), and the step
adds the data-parallel communication that does not hide behind backward plus the
optimizer update.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.specs import (
    Axis,
    ClusterSpec,
    Collective,
    Estimate,
    JobSpec,
    ModelSpec,
    Plan,
    Recompute,
    StageMemory,
    TimeBreakdown,
)

from . import compute, memory, pipeline
from .communication import GroupLink, overlapped

GRADIENT_BUCKET_BYTES = 25 * 2**20  # PyTorch DDP's default bucket_cap_mb=25
ADAM_UPDATE_BYTES = 30  # per parameter: read fp32 master/m/v + grad, write master/m/v + 16-bit copy
SGD_UPDATE_BYTES = 18


@dataclass(frozen=True)
class LayerCosts:
    """One transformer layer, one micro-batch, one GPU of a (micro-batch, tp, sp) choice."""

    forward: float  # compute seconds
    backward: float
    tp_forward: float  # TP collectives on the critical path
    tp_backward: float
    recompute: dict  # Recompute -> extra backward seconds (compute + comm)
    activation_bytes: dict  # Recompute -> bytes kept per micro-batch
    params: int  # parameters on this GPU (TP-sharded, before ZeRO)
    flops_forward: float  # whole layer (unsharded), for model FLOPs
    recompute_flops: dict  # Recompute -> extra FLOPs, whole layer


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


def layer_costs(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan) -> LayerCosts:
    dtype = job.precision
    b, s, t, sp = plan.micro_batch_size, job.seq_len, plan.tp, plan.sequence_parallel
    lc = compute.layer_compute(model, cluster.device, dtype, b, s, t, sp, job.flash_attention)
    # Four all-reduces of b s h per layer per micro-batch, two forward and two backward
    # (Narayanan et al. 2021, sec. 3.2); with sequence parallelism each becomes an
    # all-gather plus a reduce-scatter of the same buffer (Korthikanti et al. sec. 4.2.2).
    e = 4 if dtype.value == "fp32" else 2
    buf = e * b * s * model.hidden_size
    tp_link = GroupLink(cluster, plan, Axis.tp)
    if sp:
        one = tp_link.time(Collective.all_gather, buf) + tp_link.time(Collective.reduce_scatter, buf)
    else:
        one = tp_link.time(Collective.all_reduce, buf)
    tp_fwd = tp_bwd = 2 * one
    recompute = {
        Recompute.none: 0.0,
        Recompute.selective: lc.attention_core_forward,
        Recompute.full: lc.forward + tp_fwd,
    }
    acts = {
        r: memory.layer_activation_bytes(model, b, s, t, sp, r, job.flash_attention, dtype) for r in Recompute
    }
    flops = compute.layer_flops_forward(model, b, s)
    return LayerCosts(
        forward=lc.forward,
        backward=lc.backward,
        tp_forward=tp_fwd,
        tp_backward=tp_bwd,
        recompute=recompute,
        activation_bytes=acts,
        params=compute.layer_params(model, t).total,
        flops_forward=flops,
        recompute_flops={
            Recompute.none: 0.0,
            Recompute.selective: compute.attention_flops_forward(model, b, s),
            Recompute.full: flops,
        },
    )


def edge_costs(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan) -> EdgeCosts:
    dtype = job.precision
    b, s, t, sp = plan.micro_batch_size, job.seq_len, plan.tp, plan.sequence_parallel
    dev = cluster.device
    e = 4 if dtype.value == "fp32" else 2
    buf = e * b * s * model.hidden_size
    # Vocab-parallel embedding all-reduces its output (forward); the column-parallel head
    # all-reduces its input gradient (backward); the parallel cross-entropy reduces max and
    # sum of exp over the TP group (b s fp32 values, twice).
    tp_link = GroupLink(cluster, plan, Axis.tp)
    reduce = Collective.reduce_scatter if sp else Collective.all_reduce
    emb_tp = tp_link.time(reduce, buf)
    head_tp = tp_link.time(reduce, buf)
    loss_tp = 2 * tp_link.time(Collective.all_reduce, 4 * b * s)
    emb_fwd = compute.embedding_forward_time(model, dev, dtype, b, s) + emb_tp
    head_fwd = compute.head_forward_time(model, dev, dtype, b, s, t) + loss_tp
    # Pipeline sends: b s h values; with SP only the local 1/t shard (Megatron's
    # scatter/gather optimisation, Narayanan et al. sec. 4.1).
    p2p = GroupLink(cluster, plan, Axis.pp).time(Collective.p2p, buf / (t if sp else 1))
    return EdgeCosts(
        embedding_forward=emb_fwd,
        embedding_backward=2 * compute.embedding_forward_time(model, dev, dtype, b, s),
        head_forward=head_fwd,
        head_backward=2 * (head_fwd - loss_tp) + head_tp,
        embedding_params=compute.embedding_params(model, t),
        head_params=compute.head_params(model, t, plan.pp),
        embedding_activation_bytes=memory.embedding_activation_bytes(model, b, s, t, sp),
        head_activation_bytes=memory.head_activation_bytes(model, b, s, t, sp, dtype),
        logits_temporary_bytes=memory.logits_temporary_bytes(model, b, s, t, dtype),
        p2p=p2p,
    )


def estimate(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan) -> Estimate:
    """Predict step time and per-GPU memory of `plan`. Raises PlanError for an impossible plan."""
    plan.validate_for(model, job)
    lc = layer_costs(model, cluster, job, plan)
    ec = edge_costs(model, cluster, job, plan)
    return estimate_from_costs(model, cluster, job, plan, lc, ec)


def recompute_counts(plan: Plan, num_layers: int) -> list[tuple[int, int, int]]:
    """(none, selective, full) layer counts of every virtual stage."""
    if plan.stage_recompute is not None:
        return [(r.none, r.selective, r.full) for r in plan.stage_recompute]
    slot = {Recompute.none: 0, Recompute.selective: 1, Recompute.full: 2}[plan.recompute]
    out = []
    for n in plan.stage_layers(num_layers):
        c = [0, 0, 0]
        c[slot] = n
        out.append((c[0], c[1], c[2]))
    return out


def estimate_from_costs(
    model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan, lc: LayerCosts, ec: EdgeCosts
) -> Estimate:
    pp, v, m, dp = plan.pp, plan.vpp, plan.num_micro_batches, plan.dp
    counts = recompute_counts(plan, model.num_layers)
    last = len(counts) - 1
    dev = cluster.device
    e = 4 if job.precision.value == "fp32" else 2
    R = Recompute

    # --- one micro-batch through each virtual stage, by cause, and what the stage holds
    fb, fwd_layer, tp_layer = lc.forward + lc.backward, lc.forward + lc.tp_forward, lc.tp_forward + lc.tp_backward
    rec_sel, rec_full = lc.recompute[R.selective], lc.recompute[R.full]
    act_none, act_sel, act_full = (lc.activation_bytes[r] for r in (R.none, R.selective, R.full))
    flight = [memory.in_flight_micro_batches(plan.schedule, pp, m, r, v) / v for r in range(pp)]  # per chunk
    comp, rec, tp, p2p, fwd = [], [], [], [], []
    rank_layers, rank_params, rank_acts, rank_temp = [0] * pp, [0.0] * pp, [0.0] * pp, [0.0] * pp
    for j, (n0, n1, n2) in enumerate(counts):
        n, r = n0 + n1 + n2, j % pp
        c, f, params, acts, temp = n * fb, n * fwd_layer, n * lc.params, n0 * act_none + n1 * act_sel + n2 * act_full, 0.0
        if j == 0:
            c += ec.embedding_forward + ec.embedding_backward
            f += ec.embedding_forward
            params += ec.embedding_params
            acts += ec.embedding_activation_bytes
        if j == last:
            c += ec.head_forward + ec.head_backward
            f += ec.head_forward
            params += ec.head_params
            acts += ec.head_activation_bytes
            temp = ec.logits_temporary_bytes
        if n2:
            temp += act_none  # a fully recomputed layer rebuilds all its activations in its backward
        comp.append(c)
        rec.append(n1 * rec_sel + n2 * rec_full)
        tp.append(n * tp_layer)
        # Each stage receives an activation and sends one forward, and the reverse backward;
        # sends are not overlapped with compute.
        p2p.append(ec.p2p * ((j != last) + (j != 0)))
        fwd.append(f)
        rank_layers[r] += n
        rank_params[r] += params
        rank_acts[r] += flight[r] * acts
        rank_temp[r] = max(rank_temp[r], temp)
    totals = [a + b + c + d for a, b, c, d in zip(comp, rec, tp, p2p)]
    if plan.zero_stage >= 3 and dp > 1:
        # FSDP holds the gathered parameters of the current and the prefetched layer.
        rank_temp = [x + 2 * lc.params * e for x in rank_temp]

    # --- data-parallel communication per rank
    dp_per_mb = [0.0] * pp  # ZeRO-3: exposed gathers per micro-batch, stretches the stage
    dp_step = [0.0] * pp  # exposed once per step
    if dp > 1:
        dp_time = GroupLink(cluster, plan, Axis.dp).time
        for r in range(pp):
            grad_bytes = param_bytes = rank_params[r] * e
            f = sum(fwd[r::pp])
            b = sum(totals[r::pp]) - f
            bucket = min(grad_bytes, GRADIENT_BUCKET_BYTES)
            if plan.zero_stage == 0:
                # DDP: bucketed all-reduce overlaps the last micro-batch's backward, except the last bucket.
                ar = dp_time(Collective.all_reduce, grad_bytes)
                dp_step[r] = overlapped(ar, dp_time(Collective.all_reduce, bucket), b)
            elif plan.zero_stage in (1, 2):
                # Reduce-scatter overlaps backward like DDP; the parameter all-gather after the
                # optimizer step is exposed (DeepSpeed ZeRO-1/2, torch ZeroRedundancyOptimizer).
                rs = dp_time(Collective.reduce_scatter, grad_bytes)
                ag = dp_time(Collective.all_gather, param_bytes)
                dp_step[r] = overlapped(rs, dp_time(Collective.reduce_scatter, bucket), b) + ag
            else:
                # ZeRO-3 / FSDP: every micro-batch gathers each layer again in forward and in
                # backward and reduce-scatters its gradients; prefetching hides them behind the
                # previous layer's compute, except the first gather.
                ag = dp_time(Collective.all_gather, param_bytes)
                rs = dp_time(Collective.reduce_scatter, grad_bytes)
                first = ag / max(1, rank_layers[r])
                dp_per_mb[r] = overlapped(ag, first, f) + overlapped(ag + rs, first, b)

    # --- pipeline
    stage_totals = [t + dp_per_mb[j % pp] / v for j, t in enumerate(totals)]
    t_pipe = pipeline.pipeline_time(stage_totals, pp, m, v)
    rank_work = pipeline.rank_times(stage_totals, pp)
    bottleneck = max(range(pp), key=rank_work.__getitem__)

    # --- optimizer update on the local shard
    upd = ADAM_UPDATE_BYTES if job.optimizer.value == "adam" else SGD_UPDATE_BYTES
    shard = dp if plan.zero_stage >= 1 else 1
    t_opt = compute.memory_bound_time(dev, max(rank_params) / shard * upd)
    t_dp_step = max(dp_step)
    step = t_pipe + t_dp_step + t_opt

    b_ = bottleneck
    bd = TimeBreakdown(
        compute=m * sum(comp[b_::pp]),
        recompute=m * sum(rec[b_::pp]),
        pipeline_bubble=t_pipe - m * rank_work[b_],
        tp_communication=m * sum(tp[b_::pp]),
        pp_communication=m * sum(p2p[b_::pp]),
        dp_communication_exposed=m * dp_per_mb[b_] + t_dp_step,
        optimizer=t_opt,
    )

    # --- memory per rank
    overhead = dev.framework_overhead_gib
    stage_mem = []
    for r in range(pp):
        w, g, o = memory.model_state_bytes(rank_params[r], dp, plan.zero_stage, job.precision, job.optimizer)
        w, g, o, a, t = (x / memory.GIB for x in (w, g, o, rank_acts[r], rank_temp[r]))
        stage_mem.append(
            StageMemory(
                stage=r, layers=rank_layers[r], weights=w, gradients=g, optimizer_states=o,
                activations=a, temporary=t, overhead=overhead, total=w + g + o + a + t + overhead,
            )
        )
    peak = max(sm.total for sm in stage_mem)

    # --- throughput
    gpus = plan.world_size
    model_flops = compute.model_flops_per_step(model, job.global_batch_size, job.seq_len)
    sel = sum(c[1] for c in counts)
    full = sum(c[2] for c in counts)
    rec_flops = (sel * lc.recompute_flops[R.selective] + full * lc.recompute_flops[R.full]) * m * dp
    peak_flops = dev.peak_tflops[job.precision] * 1e12
    return Estimate(
        step_time_s=step,
        time_breakdown_s=bd,
        tokens_per_s=job.global_batch_size * job.seq_len / step,
        model_tflops_per_gpu=model_flops / step / gpus / 1e12,
        hardware_tflops_per_gpu=(model_flops + rec_flops) / step / gpus / 1e12,
        mfu=model_flops / step / gpus / peak_flops,
        peak_memory_gib=peak,
        memory_capacity_gib=dev.memory_gib,
        fits=peak <= dev.memory_gib,
        memory_gib_per_stage=stage_mem,
        bottleneck_stage=bottleneck,
        model_flops_per_step=model_flops,
    )
