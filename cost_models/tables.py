"""Coefficient tables of one candidate layout: what one layer, the first and last stages and
the links cost, per micro-batch, on one GPU. cost_models/terms.py turns them into the linear
expressions that every consumer (estimate, bounds, ILP) reads.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property, lru_cache
from typing import NamedTuple, Optional

from planner import stacks
from planner.specs import (
    DTYPE_BYTES,
    MESH_AXES,
    Axis,
    FP8_PARTS,
    ClusterSpec,
    Collective,
    JobSpec,
    ModelSpec,
    Optimizer,
    Layout,
    Plan,
    PlanError,
    Schedule,
)

from . import compute, memory
from .communication import GroupLink, mesh_strides, overlapped
from .costs import LayoutTables, EdgeCosts, LayerCosts
from .terms import DEEPSPEED_REDUCE_BUCKET_ELEMENTS, GRADIENT_BUCKET_BYTES, MODES, LayoutTerms

ADAM_UPDATE_BYTES = 30  # per parameter: read fp32 master/m/v + grad, write master/m/v + 16-bit copy
SGD_UPDATE_BYTES = 18


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


def spine_factor(cluster: ClusterSpec, link: GroupLink) -> float:
    """How much longer the network part of an all-to-all over `link` takes on an oversubscribed
    spine (ClusterSpec.spine) than on a non-blocking one: 1 where there is none, or the group
    fits under one leaf. The group's N domains (nodes, or scale-up domains) fill leaves of L;
    each sends its remote bytes R evenly to the N - 1 others, of which N - L sit under other
    leaves, so a leaf's L domains push L R (N - L) / (N - 1) through uplinks that carry L B /
    oversubscription (B: a domain's network bandwidth) while each NIC carries R at B: the
    slower of the two is max(1, oversubscription (N - L) / (N - 1)) times R / B. Rings (all-reduce,
    all-gather, reduce-scatter) and pipeline sends are not slowed: a ring crosses each leaf
    boundary with one flow, which the uplinks carry at full speed."""
    spine = cluster.spine
    if spine is None or not link.inter_node:
        return 1.0
    per_leaf = max(1, spine.nodes_per_leaf * cluster.gpus_per_node // cluster.domain_gpus)
    n = link.nodes
    if n <= per_leaf:
        return 1.0
    return max(1.0, spine.oversubscription * (n - per_leaf) / (n - 1))


def all_to_all_time(
    link: GroupLink, nbytes: float, cluster: ClusterSpec, top_k: int = 1, deepep: bool = False
) -> float:
    """One all-to-all of `nbytes` per rank over `link`: each rank sends (n-1)/n of its buffer,
    a different piece to every other rank (the presets carry no all-to-all fit; NCCL runs it
    as n-1 concurrent point-to-point exchanges). Inside a node the all-gather fit of NVLink
    prices it. Across nodes each rank's own NIC carries the (n - k)/n going to other nodes
    (k of the group's ranks per node) at the network's point-to-point bandwidth, while the
    (k - 1)/n for its node's ranks goes over NVLink at the same time: unlike an all-gather,
    the pieces are distinct, so the node's other NICs cannot share the load.

    DeepEP (`deepep`; DeepSeek-V3 report sec. 3.2.2, DeepEP's README): a token bound for
    several experts on one remote node crosses the network once and is fanned out over
    NVLink there; with `top_k` experts drawn uniformly from the group's N nodes, a token
    reaches (N - 1)(1 - (1 - 1/N)^top_k) remote nodes on average instead of sending
    top_k (n - k) / n copies (`nbytes` holds its top_k copies). Inside a node the same rule holds
    rank by rank: DeepEP's dispatch layout sends a token once to each rank holding any of its
    experts (deep_ep/buffer.py get_dispatch_layout: num_tokens_per_rank, is_token_in_rank), and
    the combine returns one reduced copy per rank, so a token reaches
    (n - 1)(1 - (1 - 1/n)^top_k) other ranks instead of top_k (n - 1) / n.

    An oversubscribed spine (ClusterSpec.spine) multiplies the network part by spine_factor.

    A measured all-to-all (a tier's all_to_all fit, which `plan profile` times with torch's
    all_to_all_single: inside a node, over k consecutive ranks; across nodes, over one rank per
    node, so that its bus bandwidth is what a rank's all-to-all traffic to other nodes gets)
    replaces the all-gather fit inside a node and the point-to-point fit of the network part for
    NCCL's all-to-all; DeepEP's own kernels keep the rules above."""
    n = link.size
    if n <= 1:
        return 0.0
    # NCCL's all-to-all inside a node: measured, else the all-gather fit
    node = (
        Collective.all_to_all if not deepep and cluster.intra_node.has(Collective.all_to_all) else Collective.all_gather
    )
    if not link.inter_node:
        if deepep:  # one copy per destination rank (priced as the all-gather fit's (n - 1)/n of a buffer)
            return link.time(Collective.all_gather, nbytes / top_k * n * (1 - (1 - 1 / n) ** top_k))
        return link.time(node, nbytes)
    k = max(1, n // link.nodes)
    network = Collective.all_to_all if not deepep and cluster.inter_node.has(Collective.all_to_all) else Collective.p2p
    fit = cluster.inter_node.fit(network, n)
    remote = nbytes * (n - k) / n
    if deepep:
        N = link.nodes
        remote = nbytes / top_k * (N - 1) * (1 - (1 - 1 / N) ** top_k)
    net = fit.latency_us * 1e-6 + remote / (fit.bandwidth_gbps * 1e9) * spine_factor(cluster, link)
    local = GroupLink(cluster, k, 1).time(node, nbytes * k / n) if k > 1 else 0.0
    return max(net, local)


def layer_costs(
    model: ModelSpec, cluster: ClusterSpec, job: JobSpec, layout: Layout, links: dict, dense: bool = False
) -> LayerCosts:
    """One layer of the model under `layout` (its micro-batch, tp, sp, tp_comm_overlap, ep,
    fp8, cp and recompute_norm_act are read) over `links` (links[Axis.tp] and, where the layout
    has them, Axis.ep and Axis.cp; an axis absent is not communicated over). `dense`: one of a
    MoE model's first dense layers; with cp, `job.seq_len` is a rank's s / cp tokens;
    recompute_norm_act applies in the modes that keep activations."""
    dtype, b, s, tp, sp = job.precision, layout.micro_batch_size, job.seq_len, layout.tp, layout.sequence_parallel
    ep, fp8, cp = layout.ep, layout.fp8, layout.cp
    tp_link, ep_link, cp_link = links[Axis.tp], links.get(Axis.ep), links.get(Axis.cp)
    moe = model.is_moe and not dense
    lc = compute.layer_compute(model, cluster.device, job, layout, dense)
    measured = measured_layer(cluster, model, job, "block", b, tp)
    if measured is not None:
        # A measured profile of this model: its times replace the analytic ones; the core
        # attention keeps its analytic share of the forward (what selective recompute reruns).
        share = lc.attention_core_forward / lc.forward if lc.forward else 0.0
        lc = compute.LayerCompute(
            forward=measured[0],
            backward=measured[1],
            attention_core_forward=share * measured[0],
            flops_forward=lc.flops_forward,
        )
    tp_fwd, tp_bwd, mla_regather = _tp_times(model, job, layout, tp_link)
    if layout.tp_comm_overlap:
        # Overlapped with the layer's GEMMs that produce / consume the buffers, as data-parallel
        # overlap is (communication.overlapped): what stays exposed is the slowdown of the
        # compute beside it, and whatever outlasts that compute.
        eta = cluster.overlap_efficiency
        tp_fwd = overlapped(tp_fwd, 0.0, lc.forward, eta)
        tp_bwd = overlapped(tp_bwd, 0.0, lc.backward, eta)
    ep_fwd = _dispatch_time(model, cluster, job, layout, ep_link) if moe else 0.0
    ring_fwd, ring_bwd = _ring_times(model, cluster, job, layout, cp_link)
    tp_fwd, tp_bwd = tp_fwd + ep_fwd + ring_fwd, tp_bwd + ep_fwd + ring_bwd
    flops = compute.layer_flops_forward(model, b, s, dense)
    params = compute.layer_params(model, tp, ep, dense)
    acts = tuple(
        memory.layer_activation_bytes(model, b, s, tp, sp, r, job.flash_attention, dtype, dense, fp8) for r in MODES
    )
    if measured is not None and not sp:
        # measured bytes saved with nothing recomputed; selective frees the analytic core
        # attention share of them; full recompute keeps the layer input only (exact).
        a_none = measured[2]
        acts = (a_none, max(acts[2], a_none - (acts[0] - acts[1])), acts[2])
    rerun = 0.0
    if layout.recompute_norm_act:
        # the separate norms' and the experts' activation outputs rebuilt in backward, not kept
        kernels = stacks.get(job.target).kernels
        rerun = compute.norm_act_recompute_time(model, cluster.device, dtype, b, s, tp, sp, kernels, ep, dense)
        freed = memory.norm_act_bytes(model, b, s, tp, sp, kernels, dtype, dense, fp8)
        acts = (max(acts[2], acts[0] - freed), max(acts[2], acts[1] - freed), acts[2])
    return LayerCosts(
        forward=lc.forward,
        backward=lc.backward,
        tp_forward=tp_fwd,
        tp_backward=tp_bwd,
        recompute=(rerun, lc.attention_core_forward + mla_regather + rerun, lc.forward + tp_fwd),
        activation_bytes=acts,
        params=params.total,
        flops_forward=flops,
        recompute_flops=(0.0, compute.selective_recompute_flops(model, b, s, job.flash_attention, cp), flops),
        expert_params=params.expert,
    )


def _tp_times(model: ModelSpec, job: JobSpec, layout: Layout, tp_link: GroupLink) -> tuple[float, float, float]:
    """A layer's tensor-parallel collectives, forward and backward, per micro-batch, and what
    selective recompute of MLA's up-projections gathers again."""
    dtype, b, s, sp = job.precision, layout.micro_batch_size, job.seq_len, layout.sequence_parallel
    # Four all-reduces of b s h per layer per micro-batch, two forward and two backward
    # (Narayanan et al. 2021, sec. 3.2); with sequence parallelism each becomes an
    # all-gather plus a reduce-scatter of the same buffer (Korthikanti et al. sec. 4.2.2).
    # Multi-head latent attention gathers its latents, not the layer input, for the attention's
    # column-parallel up-projections (compute.attention_linears): compute.attention_input_width.
    buf = DTYPE_BYTES[dtype] * b * s * model.hidden_size
    width = compute.attention_input_width(model, job.target)
    attn_in = buf * width / model.hidden_size
    if width == model.hidden_size:
        one = (
            tp_link.time(Collective.all_gather, buf) + tp_link.time(Collective.reduce_scatter, buf)
            if sp
            else tp_link.time(Collective.all_reduce, buf)
        )
        tp_fwd = tp_bwd = 2 * one
    elif sp:  # backward: each forward gather's reduce-scatter and each reduce-scatter's gather
        tp_fwd = (
            tp_link.time(Collective.all_gather, buf)
            + tp_link.time(Collective.all_gather, attn_in)
            + 2 * tp_link.time(Collective.reduce_scatter, buf)
        )
        tp_bwd = (
            2 * tp_link.time(Collective.all_gather, buf)
            + tp_link.time(Collective.reduce_scatter, attn_in)
            + tp_link.time(Collective.reduce_scatter, buf)
        )
    else:  # forward: after the row-parallel projections; backward: the column-parallel inputs' gradients
        tp_fwd = 2 * tp_link.time(Collective.all_reduce, buf)
        tp_bwd = tp_link.time(Collective.all_reduce, buf) + tp_link.time(Collective.all_reduce, attn_in)
    # selective recompute of MLA's up-projections gathers their latents again (sequence
    # parallel; the gathered rotary key is kept)
    latents = buf * compute.latent_norm_width(model) / model.hidden_size
    mla_regather = tp_link.time(Collective.all_gather, latents) if width != model.hidden_size and sp else 0.0
    return tp_fwd, tp_bwd, mla_regather


def _dispatch_time(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, layout: Layout, ep_link) -> float:
    """The expert dispatch and combine of one MoE layer, forward (and again backward)."""
    dtype, b, s, tp, ep = job.precision, layout.micro_batch_size, job.seq_len, layout.tp, layout.ep
    # MoE: each rank's token-expert assignments go to the ranks holding their experts and come
    # back (dispatch and combine), forward and again backward, on the critical path (not
    # overlapped: Megatron-Core overlaps them only with its optional shared-expert overlap).
    ep_fwd = 0.0
    if ep > 1 and ep_link is not None:
        assert model.experts_per_token is not None  # ep > 1: a MoE model (planner/specs/job.py:ep_problem)
        one = all_to_all_time(
            ep_link,
            DTYPE_BYTES[dtype] * compute.routed_tokens(model, b, s, tp) * model.hidden_size,
            cluster,
            model.experts_per_token,
            job.moe_dispatcher == "deepep",
        )
        ep_fwd = 2 * one
    return ep_fwd


def _ring_times(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, layout: Layout, cp_link) -> tuple[float, float]:
    """Ring attention's exposed sends of one layer (context parallelism), forward and backward."""
    dtype, b, s, tp, cp = job.precision, layout.micro_batch_size, job.seq_len, layout.tp, layout.cp
    if cp > 1 and cp_link is not None:
        # Ring attention: cp - 1 steps, each passing a rank's K and V chunk (its KV heads: GQA
        # shrinks it) to the next rank while the current block is computed; backward passes K,
        # V and their gradients. What the attention of the steps does not hide is exposed.
        attn_f, attn_b = compute.attention_times(
            cluster.device,
            dtype,
            b,
            model.num_heads // tp,
            s,
            model.qk_head_dim,
            job.flash_attention,
            compute.attention_kernel(job),
            model.v_dim,
        )
        kv = DTYPE_BYTES[dtype] * b * s * (model.qk_head_dim + model.v_dim) * compute.kv_shard(model, tp)
        step = cp_link.time(Collective.p2p, kv)
        eta = cluster.overlap_efficiency
        ring_fwd = overlapped((cp - 1) * step, 0.0, (cp - 1) * attn_f, eta)
        ring_bwd = overlapped(2 * (cp - 1) * step, 0.0, (cp - 1) * attn_b, eta)
        return ring_fwd, ring_bwd
    return 0.0, 0.0


def edge_costs(
    model: ModelSpec, cluster: ClusterSpec, job: JobSpec, layout: Layout, links: dict, layer: LayerCosts | None = None
) -> EdgeCosts:
    """The first stage's embedding, the last stage's head and loss, the pipeline sends; a MoE
    model's first dense layers (first_dense_layers, which the first stage must hold: Plan's
    rule) enter the first stage as what they cost beyond the MoE layers they are counted as
    (time, parameters, activations kept with no recompute)."""
    dtype, b, s, dev = job.precision, layout.micro_batch_size, job.seq_len, cluster.device
    tp, sp, pp, tp_link, pp_link = layout.tp, layout.sequence_parallel, layout.pp, links[Axis.tp], links[Axis.pp]
    buf = DTYPE_BYTES[dtype] * b * s * model.hidden_size
    loss = compute.loss_kernel(job)
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
    # Pipeline sends: b s h values. With SP each TP rank holds and sends its 1/t shard. Without
    # it every TP rank holds the whole activation, and Megatron sends only a 1/t slice per
    # rank and all-gathers it over the TP link on arrival (its scatter/gather optimisation,
    # on by default): cheaper when the pipeline link is slower than the TP link.
    p2p = pp_link.time(Collective.p2p, buf / (tp if sp else 1))
    if tp > 1 and not sp:
        p2p = min(p2p, pp_link.time(Collective.p2p, buf / tp) + tp_link.time(Collective.all_gather, buf))
    extra = _dense_first_extra(model, cluster, job, layout, links, layer)
    head_acts = memory.head_activation_bytes(model, b, s, tp, sp, dtype, loss)
    io = _EdgeIO(emb, emb_tp, emb_bwd, head, head_bwd, head_tp, loss_tp, head_acts)
    mtp = _mtp_costs(model, cluster, job, layout, links, layer, io) if model.mtp_layers else (0.0, 0.0, 0, 0.0, 0)
    return EdgeCosts(
        embedding_forward=emb + emb_tp + extra[0],
        embedding_backward=emb_bwd + extra[1],
        head_forward=head + loss_tp + mtp[0],
        head_backward=head_bwd + head_tp + mtp[1],
        embedding_params=compute.embedding_params(model, tp) + extra[2],
        head_params=compute.head_params(model, tp, pp) + mtp[2],
        embedding_activation_bytes=memory.embedding_activation_bytes(model, b, s, tp, sp) + extra[3],
        head_activation_bytes=head_acts + mtp[3],
        logits_temporary_bytes=memory.logits_temporary_bytes(model, b, s, tp, dtype, loss),
        p2p=p2p,
        head_expert_params=mtp[4],
    )


class _EdgeIO(NamedTuple):
    """The embedding's and the head's times (and the head's activations) that multi-token
    prediction repeats per module."""

    emb: float
    emb_tp: float
    emb_bwd: float
    head: float
    head_bwd: float
    head_tp: float
    loss_tp: float
    head_acts: float


def _mtp_costs(
    model: ModelSpec, cluster: ClusterSpec, job: JobSpec, layout: Layout, links: dict, layer, io: _EdgeIO
) -> tuple:
    """(forward s, backward s, parameters, activation bytes, expert parameters) multi-token
    prediction adds to the last stage."""
    dtype, b, s, dev = job.precision, layout.micro_batch_size, job.seq_len, cluster.device
    tp, sp, pp, tp_link = layout.tp, layout.sequence_parallel, layout.pp, links[Axis.tp]
    buf = DTYPE_BYTES[dtype] * b * s * model.hidden_size
    emb, emb_tp, emb_bwd, head, head_bwd, head_tp, loss_tp, head_acts = io
    # Multi-token prediction on the last stage (Megatron-Core's multi_token_prediction.py
    # builds it there), per module: the embedding of the next tokens (and, with a pipeline, a
    # copy of the table on this stage unless the head already holds it, tied), the norms of
    # the two inputs, the column-parallel 2h -> h projection (its 2h input gathered under
    # SP; its output gathered over TP, then split again), one layer of the last layer's kind
    # kept whole for backward (whatever the stage's recompute; under Plan.recompute_norm_act
    # its norm and activation outputs rerun, as the layer's config says), a final norm, and
    # the LM head and loss again.
    k, L = (
        model.mtp_layers,
        layer or layer_costs(model, cluster, job, *_edge_layer(layout, links), dense=not model.is_moe),
    )
    e, rows = DTYPE_BYTES[dtype], b * s / (tp if sp else 1)
    proj = compute.linear_times(dev, dtype, b * s, 2 * model.hidden_size, model.hidden_size // tp, fp8=layout.fp8)
    norms = compute.memory_bound_time(dev, 3 * 2 * rows * model.hidden_size * e)
    if sp:
        comm = (
            tp_link.time(Collective.all_gather, 2 * buf) + tp_link.time(Collective.all_gather, buf),
            tp_link.time(Collective.reduce_scatter, 2 * buf),
        )
    else:
        comm = (tp_link.time(Collective.all_gather, buf), tp_link.time(Collective.all_reduce, 2 * buf))
    table = compute.vocab_shard(model, tp) * model.hidden_size if pp > 1 and not model.tied_embeddings else 0
    return (
        k * (emb + emb_tp + norms + proj[0] + comm[0] + L.forward + L.tp_forward + head + loss_tp),
        k
        * (emb_bwd + 2 * norms + proj[1] + comm[1] + L.backward + L.tp_backward + L.recompute[0] + head_bwd + head_tp),
        k * (compute.mtp_params(model, tp) + L.params) + table,
        k * (L.activation_bytes[0] + e * rows * 3 * model.hidden_size + e * b * s * 2 * model.hidden_size + head_acts),
        k * L.expert_params,
    )


def _edge_layer(layout: Layout, links: dict) -> tuple[Layout, dict]:
    """The layout and links the edge's own layers are costed with (the first dense layers, the
    multi-token prediction layer): no TP overlap and no context parallelism."""
    return replace(layout, tp_comm_overlap=False, cp=1), {a: links[a] for a in (Axis.tp, Axis.ep) if a in links}


def _dense_first_extra(
    model: ModelSpec, cluster: ClusterSpec, job: JobSpec, layout: Layout, links: dict, layer: LayerCosts | None
) -> tuple:
    """(forward s, backward s, parameters, activation bytes) the first dense layers add beyond
    as many MoE layers; zeros for a dense model."""
    k = model.first_dense_layers
    if not model.is_moe or not k:
        return (0.0, 0.0, 0, 0.0)
    plain = _edge_layer(layout, links)
    moe = layer or layer_costs(model, cluster, job, *plain)
    dense = layer_costs(model, cluster, job, *plain, dense=True)
    return (
        k * (dense.forward + dense.tp_forward - moe.forward - moe.tp_forward),
        # (and, under Plan.recompute_norm_act, the dense layer's rerun in place of the MoE layer's)
        k
        * (dense.backward + dense.tp_backward + dense.recompute[0] - moe.backward - moe.tp_backward - moe.recompute[0]),
        k * (dense.params - moe.params),
        # the stage's recompute mode is not known here: the largest difference over the modes
        # (never lets a dense layer that keeps less than a MoE layer lower the estimate)
        k * max(d - m for d, m in zip(dense.activation_bytes, moe.activation_bytes)),
    )


def cp_link_of(cluster: ClusterSpec, dpw: int, tp: int, pp: int, cp: int, mesh_order) -> Optional[GroupLink]:
    """The link of a context-parallel group: cp consecutive positions of the mesh's dp axis
    (which holds dp x cp = `dpw` ranks, cp innermost); None without context parallelism."""
    if cp == 1:
        return None
    return GroupLink(cluster, cp, mesh_strides({Axis.dp: dpw, Axis.tp: tp, Axis.pp: pp}, mesh_order)[Axis.dp])


def shard_links_of(
    cluster: ClusterSpec, dpw: int, tp: int, pp: int, shard: int, mesh_order
) -> tuple[GroupLink, GroupLink]:
    """Hybrid sharding's two groups on the mesh's dp axis (dp x cp = `dpw` ranks): the ZeRO shard
    group, its innermost `shard` positions, and the replicas of it, `shard` positions apart."""
    stride = mesh_strides({Axis.dp: dpw, Axis.tp: tp, Axis.pp: pp}, mesh_order)[Axis.dp]
    return GroupLink(cluster, shard, stride), GroupLink(cluster, dpw // shard, stride * shard)


def rank_job(job: JobSpec, cp: int) -> JobSpec:
    """The job as one rank sees it: s / cp tokens of each sequence under context parallelism."""
    return job.model_copy(update={"seq_len": job.seq_len // cp}) if cp > 1 else job


def ep_stride(dp: int, tp: int, pp: int, mesh_order) -> int:
    """The stride of an expert-parallel group's ranks: ep ranks carved from the tp x dp block,
    the innermost of the two axes first (Megatron-Core's folding, tp-cp-ep-dp-pp order)."""
    strides = mesh_strides({Axis.dp: dp, Axis.tp: tp, Axis.pp: pp}, mesh_order)
    return min(strides[Axis.tp], strides[Axis.dp]) if tp > 1 else strides[Axis.dp]


def ep_link_of(cluster: ClusterSpec, dp: int, tp: int, pp: int, ep: int, mesh_order) -> GroupLink:
    """The link of an expert-parallel group (ep ranks at ep_stride)."""
    return GroupLink(cluster, ep, ep_stride(dp, tp, pp, mesh_order))


def mesh_links(cluster: ClusterSpec, dp: int, tp: int, pp: int, mesh_order) -> dict[Axis, GroupLink]:
    degrees = {Axis.dp: dp, Axis.tp: tp, Axis.pp: pp}
    strides = mesh_strides(degrees, mesh_order)
    return {a: GroupLink(cluster, degrees[a], strides[a]) for a in MESH_AXES}


@dataclass(eq=False)
class PipelineCosts(LayoutTables):
    """A layout's cost tables (costs.py:LayoutTables) and, built once on first use, the linear
    expressions every consumer reads (terms.py:LayoutTerms)."""

    @cached_property
    def terms(self) -> LayoutTerms:
        """Every cost of this layout as expressions linear in the layer counts."""
        return LayoutTerms(self)


def pipeline_costs(
    model: ModelSpec,
    cluster: ClusterSpec,
    job: JobSpec,
    plan: Plan,
    links: dict | None = None,
    layer: LayerCosts | None = None,
    edge: EdgeCosts | None = None,
) -> PipelineCosts:
    """Cost tables of `plan`'s layout; `links`, `layer`, `edge` may come from a cache. The
    cluster is read as job.target's software runs on it (ClusterSpec.for_target)."""
    return layout_costs(model, cluster.for_target(job.target), job, plan.layout, links, layer, edge)


def layout_costs(
    model: ModelSpec,
    cluster: ClusterSpec,
    job: JobSpec,
    layout: Layout,
    links: dict | None = None,
    layer: LayerCosts | None = None,
    edge: EdgeCosts | None = None,
    model_flops: float | None = None,
) -> PipelineCosts:
    """Cost tables of one layout; `links`, `layer`, `edge` and `model_flops` (per step) may
    come from a cache.

    Context parallelism: a rank holds s / cp tokens of each sequence, so the per-layer and
    edge tables are those of that length (attention and its ring corrected in layer_costs);
    weights are replicated over dp x cp ranks (the dp axis of the mesh holds cp innermost),
    which gradients are reduced over and ZeRO shards over: `dp` of the tables below is dp x cp,
    while the batch counts dp replicas of the data."""
    lo = layout
    dp, tp, pp, cp, ep = lo.dp, lo.tp, lo.pp, lo.cp, lo.ep
    dpw = dp * cp
    links = links or mesh_links(cluster, dpw, tp, pp, lo.mesh_order)
    ep_link = ep_link_of(cluster, dpw, tp, pp, ep, lo.mesh_order) if ep > 1 else None
    if lo.fp8 and cluster.device.fp8_peak_tflops is None:
        raise PlanError(
            f"{cluster.device.name} has no FP8 tensor cores; drop fp8 (or plan on a cluster with FP8: {FP8_PARTS})"
        )
    per_rank = rank_job(job, cp)
    cp_link = cp_link_of(cluster, dpw, tp, pp, cp, lo.mesh_order)
    groups = {**links, **({Axis.ep: ep_link} if ep_link else {}), **({Axis.cp: cp_link} if cp_link else {})}
    layer = layer or layer_costs(model, cluster, per_rank, lo, groups)
    edge = edge or edge_costs(model, cluster, per_rank, lo, groups, layer)
    upd = ADAM_UPDATE_BYTES if job.optimizer == Optimizer.adam else SGD_UPDATE_BYTES
    shard = lo.shard_dp * cp  # the ZeRO group: all of dp x cp, or dp_shard x cp of it
    dp_link, replica_link = links[Axis.dp], None
    if shard < dpw:  # hybrid: the innermost dp_shard x cp ranks of the dp axis shard, the rest replicate
        dp_link, replica_link = shard_links_of(cluster, dpw, tp, pp, shard, lo.mesh_order)
    z3 = lo.zero_stage >= 3 and shard > 1
    batch = lo.global_batch_size
    reduce_hidden, reduce = stacks.get(job.target).gradient_reduce(pp, lo.zero_stage)
    return PipelineCosts(
        pp=pp,
        vpp=lo.vpp,
        dp=dpw,
        tp=tp,
        num_micro_batches=lo.num_micro_batches,
        zero_stage=lo.zero_stage,
        num_layers=model.num_layers,
        layer=layer,
        edge=edge,
        in_flight=_in_flight_table(lo.schedule, pp, lo.num_micro_batches, lo.vpp),
        comm_bytes_per_param=DTYPE_BYTES[job.precision],
        dp_link=dp_link,
        shard_size=shard if replica_link else 0,
        replica_link=replica_link,
        overlap=cluster.overlap_efficiency,
        optimizer_seconds_per_param=compute.memory_bound_time(cluster.device, upd)
        / (shard if lo.zero_stage >= 1 else 1),
        overhead_bytes=cluster.device.framework_overhead_gib * memory.GIB,
        zero3_reduce_calls_per_layer=zero3_reduce_calls(job, layer.params) if z3 else 1.0,
        **dp_calls(job, lo, shard),
        step_overhead_s=cluster.step_overhead_s(job.target),
        gradient_reduce_hidden=reduce_hidden,
        gradient_reduce=reduce,
        tokens_per_step=batch * job.seq_len,
        model_flops_per_step=model_flops
        if model_flops is not None
        else compute.model_flops_per_step(model, batch, job.seq_len),
        memory_capacity_gib=cluster.device.memory_gib,
        peak_flops=cluster.device.peak_tflops[job.precision] * 1e12,
        uncertainty=cluster.uncertainty,
        gpipe=lo.schedule == Schedule.gpipe,
        first_stage_min_layers=max(1, model.first_dense_layers),
        **_state_tables(model, job, lo, layer, edge, per_rank.seq_len),
    )


def _state_tables(model: ModelSpec, job: JobSpec, lo: Layout, layer: LayerCosts, edge: EdgeCosts, seq: int) -> dict:
    """PipelineCosts' model-state fields: bytes per parameter held of the dense and the routed
    expert weights, gradients and optimizer states as the target stack holds them (ZeRO over dp x
    cp, experts over their expert-DP group), the gathered unit and the buffers beside them."""
    dpw, zero, e = lo.shard_dp * lo.cp, lo.zero_stage, DTYPE_BYTES[job.precision]  # ZeRO's group (Layout.dp_shard)
    recipe = stacks.get(job.target).model_states  # how the stack holds them (cost_models/memory.py:STATE_RECIPES)
    if recipe == "megatron" and job.grad_reduce_bf16:  # --grad-reduce-in-bf16: a 16-bit gradient buffer
        recipe = "megatron_bf16_grads"
    states = memory.model_state_bytes(1, dpw, zero, job.precision, job.optimizer, recipe)  # per parameter held
    # Routed experts are replicated on tp x dp x cp / ep ranks (the expert-DP group), ZeRO shards over those.
    edp = max(1, lo.tp * dpw // lo.ep)  # (with hybrid sharding: within the shard group)
    expert_states = memory.model_state_bytes(1, edp, zero, job.precision, job.optimizer, recipe)
    if lo.fp8:  # each weight's FP8 copy, cast once per step and kept (ZeRO-3: of the shard; transposes made per use)
        states = (states[0] + 1 / (dpw if zero >= 3 else 1), *states[1:])
        expert_states = (expert_states[0] + 1 / (edp if zero >= 3 else 1), *expert_states[1:])
    # one layer's parameters materialised beside the shards (gathered, prefetched, their gradients
    # before the reduce-scatter) and the stack's reduction buckets (memory.live_layer_bytes_per_param,
    # memory.bucket_bytes)
    live = (
        memory.live_layer_bytes_per_param(recipe, zero, job.precision)
        if (dpw > 1 or recipe in ("fsdp2", "accelerate"))
        else 0.0
    )
    # the largest unit a sharding stack gathers: a layer, or the embedding / LM head table (DeepSpeed's
    # estimator takes its largest module; FSDP2 wraps the embedding and the head as units of their own)
    unit = max(layer.params, edge.embedding_params, edge.head_params)
    buckets = (
        memory.bucket_bytes(recipe, zero, job.precision, GRADIENT_BUCKET_BYTES / e, DEEPSPEED_REDUCE_BUCKET_ELEMENTS)
        if lo.dp * lo.cp > 1
        else 0.0
    )
    overlap = memory.tp_overlap_buffer_bytes(model, lo.micro_batch_size, seq, e) if lo.tp_comm_overlap else 0.0
    return dict(
        state_bytes_per_param=states,
        expert_state_bytes_per_param=expert_states,
        zero3_gather_bytes=unit * live,
        comm_buffer_bytes=overlap + buckets,
    )


# The data-parallel mechanisms beyond the alpha-beta ring, each a fact of how a stack issues its
# collectives (dp_calls); benchmarks/fidelity_published.py turns each off in turn to show what it
# does to the error of each source left out.
# Both below are off: flipped on, neither lowered the leave-one-source-out error of the groups
# that did not suggest them (docs/calibration.md, "Mechanisms"); they stay to be checked again.
MECHANISMS = {
    # each bucket of a bucketed gradient reduction (and ZeRO-1's parameter gather) is a call paying
    # the ring's latency, with the stack's bucket; DeepSpeed's ZeRO-3 gathers module by module
    "calls_as_issued": False,
    # gradients reduced in fp32 where the stack does so by default: Megatron's fp32 main-gradient
    # buffer without --grad-reduce-in-bf16 (torchtitan's FSDP2 reduces in fp32 too, but the PyTorch
    # FSDP runs it is calibrated on, fms-fsdp's and llm-foundry's recipes, reduce in bf16: not priced)
    "fp32_gradient_reduce": False,
}
# Megatron-Core's default bucket: max(40M, 1M x dp) parameters ("large enough to remain
# bandwidth-bound rather than latency-bound": megatron/core/distributed/distributed_data_parallel.py)
MEGATRON_BUCKET_PARAMS, MEGATRON_BUCKET_PARAMS_PER_RANK = 40_000_000, 1_000_000
# DeepSpeed's ZeRO-3 fetches each parameterised module of a block on its own (its partitioned
# parameter coordinator, deepspeed/runtime/zero/partitioned_param_coordinator.py): the two norms,
# the fused QKV and output projections and the two MLP projections of a Megatron-DeepSpeed block.
DEEPSPEED_ZERO3_GATHERS_PER_LAYER = 6


def dp_calls(job: JobSpec, lo: Layout, shard: int) -> dict:
    """How job.target issues its data-parallel collectives (MECHANISMS): ZeRO-3 gathers per
    layer, the bytes of one bucket of a bucketed reduction (0: one call), and the gradients'
    bytes on the wire per parameter byte."""
    stack = stacks.get(job.target)
    e = DTYPE_BYTES[job.precision]
    scale = 1.0
    if MECHANISMS["fp32_gradient_reduce"] and e == 2 and stack.model_states == "megatron" and not job.grad_reduce_bf16:
        scale = 2.0
    if not MECHANISMS["calls_as_issued"]:
        return dict(grad_wire_scale=scale)
    grad = e * scale
    if stack.model_states.startswith("megatron"):
        bucket = max(MEGATRON_BUCKET_PARAMS, MEGATRON_BUCKET_PARAMS_PER_RANK * lo.dp * lo.cp) * grad
    elif stack.model_states == "deepspeed":
        bucket = DEEPSPEED_REDUCE_BUCKET_ELEMENTS * grad
    else:
        bucket = GRADIENT_BUCKET_BYTES
    gathers = DEEPSPEED_ZERO3_GATHERS_PER_LAYER if stack.zero3 == "deepspeed" and lo.zero_stage >= 3 else 1.0
    return dict(zero3_gathers_per_layer=gathers, reduce_bucket_bytes=bucket, grad_wire_scale=scale)


def zero3_reduce_calls(job: JobSpec, layer_params: float) -> float:
    """Reduce-scatter calls per layer per micro-batch under ZeRO-3, as the target stack issues
    them (planner/stacks/<stack>: `zero3`). FSDP (torchtitan, Accelerate, plan run's executor)
    reduce-scatters each wrapped block's gradients in one call. DeepSpeed's ZeRO-3 copies
    gradients into a bucket of reduce_bucket_size elements as backward produces them and
    reduce-scatters each full bucket (its stage-3 optimizer with overlap_comm): a layer of P
    parameters takes P / bucket calls (fewer than one where buckets span layers), each paying
    the group's latency, which grows with the ring (communication.GroupLink.step_latency_us)."""
    if stacks.get(job.target).zero3 != "deepspeed":
        return 1.0
    return layer_params / DEEPSPEED_REDUCE_BUCKET_ELEMENTS


@lru_cache(maxsize=4096)
def _in_flight_table(schedule: Schedule, pp: int, num_micro_batches: int, vpp: int) -> tuple:
    """Per rank: micro-batches per model chunk held at the peak."""
    return tuple(memory.in_flight_micro_batches(schedule, pp, num_micro_batches, r, vpp) / vpp for r in range(pp))
