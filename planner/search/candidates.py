"""Step 1 of the search: enumerate layouts (every outer choice except the layer split and
recompute), cost them from cached tables, and bound them from below.

A Candidate fixes dp, tp, pp, virtual stages, micro-batch size and count, schedule, ZeRO
stage, sequence parallelism and mesh order. What is left (layers per stage and per-stage
recompute counts) is the ILP's job. Each candidate gets two lower bounds on its best
time per token: a cheap one that ignores memory (O(1)) and a refined one that charges the
recomputation memory forces on each pipeline rank (continuous relaxation, bisection on the
slowest rank's time). Both are proven lower bounds, so pruning on them is safe.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

from cost_models.estimate import (
    GRADIENT_BUCKET_BYTES,
    dp_exposed,
    EdgeCosts,
    LayerCosts,
    PipelineCosts,
    edge_costs,
    layer_costs,
    layout_costs,
    mesh_links,
)
from cost_models.memory import GIB
from planner.specs import Axis, ClusterSpec, Collective, JobSpec, ModelSpec, Plan, Schedule

MESH_ORDERS = [tuple(p) for p in itertools.permutations((Axis.tp, Axis.dp, Axis.pp))]

# Why a candidate was not solved; reported by `plan solve`.
DIVISIBILITY = "divisibility"
TP_ACROSS_NODES = "tp_across_nodes"
MEMORY = "memory"
DOMINATED = "dominated"
FIXED = "excluded_by_fix"


@dataclass(frozen=True, order=True)
class Candidate:
    """One layout, everything fixed but the layer split and per-stage recompute."""

    dp: int
    tp: int
    pp: int
    vpp: int
    micro_batch_size: int
    num_micro_batches: int
    schedule: str
    zero_stage: int
    sequence_parallel: bool
    mesh_order: tuple

    def plan(self, layers_per_stage=None, stage_recompute=None, recompute="none") -> Plan:
        return Plan(
            dp=self.dp, tp=self.tp, pp=self.pp, vpp=self.vpp, micro_batch_size=self.micro_batch_size,
            num_micro_batches=self.num_micro_batches, schedule=self.schedule, zero_stage=self.zero_stage,
            sequence_parallel=self.sequence_parallel, mesh_order=list(self.mesh_order),
            layers_per_stage=layers_per_stage, stage_recompute=stage_recompute, recompute=recompute,
        )

    @property
    def global_batch_size(self) -> int:
        return self.dp * self.micro_batch_size * self.num_micro_batches


@dataclass(frozen=True)
class SearchSpace:
    """What the search may vary. `fixed` pins fields of Candidate (from --fix)."""

    num_gpus: int
    global_batch_size: Optional[int] = None  # fixed batch; else micro_batch_size (+ micro_batches)
    micro_batch_size: Optional[int] = None
    micro_batches: Optional[int] = None  # with micro_batch_size; default 3 x pp
    max_tp: Optional[int] = None  # default: GPUs per node (TP stays on NVLink)
    max_vpp: int = 8
    max_micro_batch_size: int = 64
    include_dominated: bool = False  # brute-force tests: enumerate dominated choices too
    fixed: dict = field(default_factory=dict)
    recompute_modes: tuple = (0, 1, 2)  # indices of none / selective / full the ILP may use


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def tp_ok(model: ModelSpec, tp: int) -> bool:
    return model.num_heads % tp == 0 and model.ffn % tp == 0 and (model.kv_heads % tp == 0 or tp % model.kv_heads == 0)


def _batch_options(space: SearchSpace, dp: int, pp: int) -> list[tuple[int, int]]:
    """(micro-batch size, micro-batches) pairs for this dp and pp."""
    if space.global_batch_size is not None:
        if space.global_batch_size % dp:
            return []
        per_replica = space.global_batch_size // dp
        return [(b, per_replica // b) for b in divisors(per_replica) if b <= space.max_micro_batch_size]
    m = space.micro_batches or 3 * pp  # the usual 2-4x rule for 1F1B: m = 3 x stages
    return [(space.micro_batch_size, m)]


def _mesh_orders(cluster: ClusterSpec, dp: int, tp: int, pp: int, keep_all: bool) -> tuple[list, int]:
    """Mesh orders whose link costs are not dominated by another order's (every axis's
    alpha and beta no larger); equal ones are deduplicated. Returns (orders, dropped)."""
    scored = []
    for order in MESH_ORDERS:
        links = mesh_links(cluster, dp, tp, pp, order)
        vec = tuple(
            x for a in Axis for c in Collective for x in (links[a].coefficients(c) if links[a].size > 1 else (0.0, 0.0))
        )
        scored.append((order, vec))
    if keep_all:
        return [o for o, _ in scored], 0
    kept = []
    for i, (order, vec) in enumerate(scored):
        dominated = False
        for j, (_, other) in enumerate(scored):
            if j != i and all(x <= y for x, y in zip(other, vec)) and (other != vec or j < i):
                dominated = True  # strictly better elsewhere, or equal to an earlier order
                break
        if not dominated:
            kept.append(order)
    return kept, len(MESH_ORDERS) - len(kept)


def enumerate_candidates(
    model: ModelSpec, cluster: ClusterSpec, space: SearchSpace
) -> tuple[list[Candidate], Counter]:
    """Every layout of the search space, and how many were rejected and why."""
    rejected: Counter = Counter()
    out: list[Candidate] = []
    n, L = space.num_gpus, model.num_layers
    max_tp = space.max_tp or cluster.gpus_per_node
    fixed = space.fixed
    order_cache: dict = {}
    for tp in divisors(n):
        if not tp_ok(model, tp):
            rejected[DIVISIBILITY] += 1
            continue
        if tp > max_tp:
            rejected[TP_ACROSS_NODES] += 1
            continue
        for pp in divisors(n // tp):
            if pp > L:
                rejected[DIVISIBILITY] += 1
                continue
            dp = n // (tp * pp)
            options = _batch_options(space, dp, pp)
            if not options:
                rejected[DIVISIBILITY] += 1
            key = (dp, tp, pp)
            if key not in order_cache:
                order_cache[key] = _mesh_orders(cluster, dp, tp, pp, space.include_dominated)
            orders, dropped_orders = order_cache[key]
            for b, m in options:
                # Interleaving: Megatron-LM's rule, every model chunk holds L / (pp v) layers
                # (recompute stays free per chunk); the interleaved schedule needs m % pp == 0.
                vpps = [1] + [v for v in range(2, space.max_vpp + 1) if pp > 1 and L % (pp * v) == 0 and m % pp == 0]
                for v in vpps:
                    schedules = ["1f1b", "gpipe"] if v == 1 else ["interleaved-1f1b"]
                    for sched in schedules:
                        for zero in range(4):
                            for sp in ([False, True] if tp > 1 else [False]):
                                # GPipe runs as fast as 1F1B and holds more activations; with
                                # dp = 1 every ZeRO stage is ZeRO-0. Neither can win.
                                dominated = (sched == "gpipe" and pp > 1) or (zero > 0 and dp == 1) or (
                                    sched == "gpipe" and pp == 1
                                )
                                if dominated and not space.include_dominated:
                                    rejected[DOMINATED] += len(MESH_ORDERS)
                                    continue
                                rejected[DOMINATED] += dropped_orders
                                for order in orders:
                                    c = Candidate(dp, tp, pp, v, b, m, sched, zero, sp, order)
                                    if any(getattr(c, k) != val for k, val in fixed.items()):
                                        rejected[FIXED] += 1
                                        continue
                                    out.append(c)
    return out, rejected


class CostTables:
    """Per-solve caches of link, layer and edge costs: many candidates share them."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, job: JobSpec):
        self.model, self.cluster, self.job = model, cluster, job
        self._links: dict = {}
        self._layer: dict = {}
        self._edge: dict = {}

    def links(self, c: Candidate) -> dict:
        key = (c.dp, c.tp, c.pp, c.mesh_order)
        if key not in self._links:
            self._links[key] = mesh_links(self.cluster, c.dp, c.tp, c.pp, c.mesh_order)
        return self._links[key]

    def layer(self, c: Candidate) -> LayerCosts:
        tp_link = self.links(c)[Axis.tp]
        key = (c.micro_batch_size, c.tp, c.sequence_parallel, tp_link.signature)
        if key not in self._layer:
            self._layer[key] = layer_costs(self.model, self.cluster, self.job, c.micro_batch_size, c.tp, c.sequence_parallel, tp_link)
        return self._layer[key]

    def edge(self, c: Candidate) -> EdgeCosts:
        links = self.links(c)
        key = (c.micro_batch_size, c.tp, c.sequence_parallel, c.pp, links[Axis.tp].signature, links[Axis.pp].signature)
        if key not in self._edge:
            self._edge[key] = edge_costs(
                self.model, self.cluster, self.job, c.micro_batch_size, c.tp, c.sequence_parallel, c.pp,
                links[Axis.tp], links[Axis.pp],
            )
        return self._edge[key]

    def job_for(self, c: Candidate) -> JobSpec:
        if c.global_batch_size == self.job.global_batch_size:
            return self.job
        return self.job.model_copy(update={"global_batch_size": c.global_batch_size})

    def pipeline(self, c: Candidate) -> PipelineCosts:
        return layout_costs(
            self.model, self.cluster, self.job, c.dp, c.tp, c.pp, c.vpp, c.micro_batch_size, c.num_micro_batches,
            c.schedule, c.zero_stage, c.sequence_parallel, c.mesh_order, self.links(c), self.layer(c), self.edge(c),
        )


# --------------------------------------------------------------------------- bounds


def _dp_step_floor(pc: PipelineCosts, total_params: float, min_rank_params: float) -> float:
    """A lower bound on the exposed once-per-step DP communication (max over ranks)."""
    if pc.dp <= 1 or pc.zero_stage == 3:
        return 0.0
    t, e = pc.dp_link.time, pc.comm_bytes_per_param
    if pc.zero_stage == 0:
        return t(Collective.all_reduce, min(min_rank_params * e, GRADIENT_BUCKET_BYTES))
    # The rank with the most parameters gathers at least the mean.
    return t(Collective.all_gather, total_params / pc.pp * e)


def _dp_micro_batch_floor(pc: PipelineCosts) -> float:
    """A lower bound on a rank's exposed DP communication per micro-batch (ZeRO-2/3)."""
    if pc.dp <= 1:
        return 0.0
    if pc.zero_stage == 3:
        return 2 * pc.zero3_first_gather
    if pc.zero_stage == 2:  # the last gradient bucket of a rank holding at least one layer
        return pc.dp_link.time(Collective.reduce_scatter, min(pc.layer.params * pc.comm_bytes_per_param, GRADIENT_BUCKET_BYTES))
    return 0.0


def cheap_bound(pc: PipelineCosts, memory_limit_gib: float) -> Optional[float]:
    """Seconds per step no split can beat, ignoring activation memory; None if even the
    model states cannot fit (the fullest rank holds at least the mean parameter count)."""
    lc, L, P, m, v = pc.layer, pc.num_layers, pc.num_stages, pc.num_micro_batches, pc.vpp
    total_params = L * lc.params + pc.edge.embedding_params + pc.edge.head_params
    floor_mem = pc.memory_per_param * total_params / pc.pp + pc.overhead_bytes + pc.zero3_gather_bytes
    if floor_mem > memory_limit_gib * GIB:
        return None
    a = lc.forward + lc.backward + lc.tp_forward + lc.tp_backward
    z3 = _dp_micro_batch_floor(pc)  # exposed ZeRO-2/3 traffic per micro-batch and rank, at least
    ends = [pc.stage_extras(0)] if P == 1 else [pc.stage_extras(0), pc.stage_extras(P - 1)]
    W = L * a + sum(x.compute for x in ends) + pc.edge.p2p * 2 * (P - 1) + pc.pp * z3  # sum of stage times
    end_stage = max(a + x.compute + x.p2p for x in ends) + z3 / v  # an end stage holds >= 1 layer
    if v == 1:
        t_pipe = W + (m - 1) * max(W / P, end_stage)
    else:
        t_pipe = m * max(W / pc.pp, end_stage) + (pc.pp - 1) * max(W / P, end_stage)
    t_opt = pc.optimizer_seconds_per_param * total_params / pc.pp
    return t_pipe + _dp_step_floor(pc, total_params, lc.params) + t_opt


@dataclass(frozen=True)
class _Rank:
    K: float  # fixed time per micro-batch (edges, p2p, least exposed ZeRO-2/3 traffic)
    c: float  # memory needed beyond the layers, minus the limit (bytes); must end <= 0
    q: float  # memory per layer with nothing recomputed
    smax: float  # most memory one layer's recompute can save
    rho: float  # cheapest seconds of recompute per byte saved
    nmin: int  # fewest layers the rank can hold
    nhi: int  # most layers the rank can hold


def _rank_dp_floors(pc: PipelineCosts, xs: list, lo: float, hi: float, rmax: float) -> tuple[float, float]:
    """Least exposed DP communication (per micro-batch, per step) of a rank holding between
    `lo` and `hi` layers, whatever the split: cost_models.estimate.dp_exposed is piecewise
    linear in the layer count n, so its minimum over [lo, hi] sits at an end or a kink.
    The backward window is taken with every layer recomputed (`rmax` extra per layer),
    which can only hide more, so the result is a lower bound."""
    if pc.dp <= 1 or hi < lo:
        return 0.0, 0.0
    lc, e = pc.layer, pc.comm_bytes_per_param
    fl = lc.forward + lc.tp_forward
    a = lc.forward + lc.backward + lc.tp_forward + lc.tp_backward
    P_r = sum(x.params for x in xs)
    F_r = sum(x.forward for x in xs)
    B_r = sum(x.compute + x.p2p for x in xs) - F_r

    def g(n):  # bytes
        return e * (lc.params * n + P_r)

    def at(n):
        return dp_exposed(pc, lc.params * n + P_r, fl * n + F_r, (a - fl + rmax) * n + B_r)

    # Kinks: where a gradient bucket fills, and where alpha + beta g(n) - window(n) meets a
    # constant (the first gather, the last bucket); solved for every collective and window.
    pts = {lo, hi}
    if lc.params:
        pts.add((GRADIENT_BUCKET_BYTES / e - P_r) / lc.params)
    consts = [pc.zero3_first_gather] + [pc.dp_link.time(c, GRADIENT_BUCKET_BYTES) for c in (Collective.all_reduce, Collective.reduce_scatter)]
    coef = [pc.dp_link.coefficients(c) for c in Collective if c != Collective.p2p]
    coef.append(tuple(x + y for x, y in zip(pc.dp_link.coefficients(Collective.all_gather), pc.dp_link.coefficients(Collective.reduce_scatter))))
    for alpha, beta in coef:
        for w0, w1 in ((F_r, fl), (B_r, a - fl + rmax)):
            slope = beta * e * lc.params - w1
            if slope:
                for k in consts + [0.0]:
                    pts.add((k - alpha - beta * e * P_r + w0) / slope)
    vals = [at(n) for n in pts if lo <= n <= hi]
    return min(v[0] for v in vals), min(v[1] for v in vals)


def refined_bound(pc: PipelineCosts, memory_limit_gib: float, modes: tuple = (0, 1, 2)) -> Optional[float]:
    """Seconds per step no split can beat, charging the recomputation that memory forces.

    Continuous relaxation per pipeline rank r: with n layers, memory is c_r + q_r n bytes
    before recompute; recompute saves at most smax_r per layer and costs at least rho_r per
    byte saved, so the rank's micro-batch time is at least
        S_r(n) = K_r + a n + rho_r max(0, c_r + q_r n),  feasible while c_r + (q_r - smax_r) n <= 0,
    with K_r including the least exposed ZeRO-2/3 traffic over the rank's possible layer
    counts. Any split has some rank at least as slow as the smallest tau with
    sum_r nmax_r(tau) >= L (bisection), and T >= sum_r S_r + (m - 1) tau (interleaved:
    m tau + (p - 1) tau / v). Returns None when no split fits (memory).
    """
    lc, L, pp, v, m = pc.layer, pc.num_layers, pc.pp, pc.vpp, pc.num_micro_batches
    P = pc.num_stages
    a = lc.forward + lc.backward + lc.tp_forward + lc.tp_backward
    a0, a1, a2 = lc.activation_bytes
    s = pc.memory_per_param
    limit = memory_limit_gib * GIB
    rmax = max(lc.recompute[i] for i in modes)
    ranks, step_floor = [], 0.0
    for r in range(pp):
        xs = [pc.stage_extras(j) for j in range(r, P, pp)]
        f = pc.in_flight[r]
        c = (s * sum(x.params for x in xs) + f * sum(x.activation_bytes for x in xs) + max(x.temporary_bytes for x in xs)
             + pc.overhead_bytes + pc.zero3_gather_bytes - limit)
        q = s * lc.params + f * a0
        options = [(lc.recompute[i], f * (a0 - ai)) for i, ai in ((1, a1), (2, a2)) if a0 - ai > 0 and i in modes]
        smax = max((sv for _, sv in options), default=0.0)
        rho = min((cost / sv for cost, sv in options), default=float("inf"))
        # Interleaved chunks are equal (L / (pp v) layers each); otherwise >= 1 layer a stage.
        nmin, nhi = (L // pp, L // pp) if v > 1 else (1, L - pp + 1)
        slope = q - smax  # > 0: recompute keeps each layer's input and weights
        cap = -c / slope if slope > 0 else (float("inf") if c <= 0 else -1.0)
        per_mb, step = _rank_dp_floors(pc, xs, nmin, min(nhi, cap), rmax)
        step_floor = max(step_floor, step)
        ranks.append(_Rank(sum(x.compute + x.p2p for x in xs) + per_mb, c, q, smax, rho, nmin, min(nhi, cap)))

    def time_at(rk: _Rank, n: float) -> float:
        need = rk.c + rk.q * n
        return rk.K + a * n + (rk.rho * need if need > 0 else 0.0)

    def nmax(rk: _Rank, tau: float) -> float:
        n1 = (tau - rk.K) / a
        if rk.c + rk.q * n1 > 0:
            n1 = (tau - rk.K - rk.rho * rk.c) / (a + rk.rho * rk.q) if rk.rho < float("inf") else -rk.c / rk.q
        return min(n1, rk.nhi)

    if any(rk.nhi < rk.nmin for rk in ranks) or sum(rk.nhi for rk in ranks) < L:
        return None
    lo = max(time_at(rk, rk.nmin) for rk in ranks)
    if sum(nmax(rk, lo) for rk in ranks) < L:
        hi = max(lo, 1e-9) * 2
        while sum(nmax(rk, hi) for rk in ranks) < L:
            hi *= 2
        for _ in range(60):
            mid = (lo + hi) / 2
            if sum(nmax(rk, mid) for rk in ranks) >= L:
                hi = mid
            else:
                lo = mid
        tau = hi
    else:
        tau = lo
    total = L * a + sum(rk.K for rk in ranks)
    t_pipe = total + (m - 1) * tau if v == 1 else m * tau + (pp - 1) * tau / v
    total_params = L * lc.params + pc.edge.embedding_params + pc.edge.head_params
    t_opt = pc.optimizer_seconds_per_param * total_params / pp
    return t_pipe + max(step_floor, _dp_step_floor(pc, total_params, lc.params)) + t_opt
