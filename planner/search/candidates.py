"""Step 1 of the search: enumerate layouts (every outer choice except the layer split and
recompute), cost them from cached tables, and bound them from below.

A Layout fixes dp, tp, pp, virtual stages, micro-batch size and count, schedule, ZeRO
stage, sequence parallelism and mesh order. What is left (layers per stage and per-stage
recompute counts) is the ILP's job. Each candidate gets two lower bounds on its best
time per token: a cheap one that ignores memory (O(1)) and a refined one that charges the
recomputation memory forces on each pipeline rank (continuous relaxation, bisection on the
slowest rank's time). Both are proven lower bounds, so pruning on them is safe.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Callable, Optional

from cost_models.tables import (
    EdgeCosts,
    LayerCosts,
    PipelineCosts,
    cp_link_of,
    edge_costs,
    ep_link_of,
    layer_costs,
    layout_costs,
    mesh_links,
    rank_job,
)
from cost_models.communication import mesh_strides
from cost_models.compute import model_flops_per_step
from cost_models.terms import MODES
from planner.specs import (
    MAX_GLOBAL_BATCH,
    REQUIRED_COLLECTIVES,
    MESH_AXES,
    Axis,
    ClusterSpec,
    Collective,
    JobSpec,
    Layout,
    ModelSpec,
    Recompute,
    Schedule,
    tp_problem,
)
from planner.stacks.stack import Rules

from .deadline import NO_DEADLINE, Deadline, polled

MESH_ORDERS = [tuple(p) for p in itertools.permutations((Axis.tp, Axis.dp, Axis.pp))]

# Why a candidate was not solved; reported by `plan solve`: it cannot run...
DIVISIBILITY = "divisibility"
MEMORY = "memory"
INFEASIBLE = (DIVISIBILITY, MEMORY)
# ... or it could, but is not searched.
TP_ACROSS_NODES = "tp_across_nodes"
DOMINATED = "dominated"
FIXED = "excluded_by_fix"
TARGET = "not_expressible_in_target"  # plan solve --target: the stack cannot run the layout


@dataclass(frozen=True)
class SearchSpace:
    """What the search may vary. `fixed` pins fields of Layout (from --fix)."""

    num_gpus: int
    global_batch_size: Optional[int] = None  # fixed batch; else micro_batch_size (+ micro_batches)
    micro_batch_size: Optional[int] = None
    micro_batches: Optional[int] = None  # with micro_batch_size; default 3 x pp
    max_tp: Optional[int] = None  # default: GPUs per node (TP stays on NVLink)
    max_vpp: int = 8
    max_micro_batch_size: int = 64
    include_dominated: bool = False  # brute-force tests: enumerate dominated choices too
    fixed: dict = field(default_factory=dict)
    recompute_modes: tuple = MODES  # the Recompute modes the ILP may use
    tp_comm_overlap: tuple = (False,)  # choices for Plan.tp_comm_overlap (both where the target has it)
    # choices for Plan.recompute_norm_act (both where the target has it and it frees memory: norm_act_choices)
    recompute_norm_act: tuple = (False,)
    rules: Optional[Rules] = None  # the target stack's Rules: only what it can express
    # Layout -> what else the stack cannot run of the layout (its Stack.layout_problems,
    # which reads only fields a Layout shares with a Plan: no Plan is built per candidate)
    target_problems: Optional[Callable] = None
    fp8: tuple = (False,)  # choices for Plan.fp8 ((False, True) with `plan solve --fp8` on a device that has it)
    cp_degrees: tuple = (1,)  # context-parallel degrees to try (plan solve: for long sequences, see cli/solve.py)
    seq_len: Optional[int] = None  # with cp_degrees: the sequence CP splits (SP then needs s / cp divisible by tp)


def divisors(n: int, limit: Optional[int] = None) -> list[int]:
    """Divisors of n (up to `limit`), ascending, from its prime factorisation: the work grows
    with the number of divisors, not with n (2^40 GPUs or a batch of 10^9 are instant)."""
    factors: dict[int, int] = {}
    m, p = n, 2
    while p * p <= m:
        while m % p == 0:
            factors[p] = factors.get(p, 0) + 1
            m //= p
        p += 1 if p == 2 else 2
    if m > 1:
        factors[m] = factors.get(m, 0) + 1
    out = [1]
    for prime, k in factors.items():
        out = [d * prime**e for d in out for e in range(k + 1) if limit is None or d * prime**e <= limit]
    return sorted(out)


def _batch_options(space: SearchSpace, dp: int, pp: int) -> list[tuple[int, int]]:
    """(micro-batch size, micro-batches) pairs for this dp and pp."""
    if space.global_batch_size is not None:
        if space.global_batch_size % dp:
            return []
        per_replica = space.global_batch_size // dp
        return [(b, per_replica // b) for b in divisors(per_replica, space.max_micro_batch_size)]
    assert space.micro_batch_size is not None  # given where the global batch is not (planner/api.py:solve)
    m = space.micro_batches or 3 * pp  # the usual 2-4x rule for 1F1B: m = 3 x stages
    if dp * space.micro_batch_size * m > MAX_GLOBAL_BATCH:  # a step of more sequences than any document holds
        return []
    return [(space.micro_batch_size, m)]


def _mesh_orders(cluster: ClusterSpec, dp: int, tp: int, pp: int, keep_all: bool) -> tuple[list, int]:
    """Mesh orders whose link costs are not dominated by another order's (every axis's
    alpha and beta no larger); equal ones are deduplicated. Returns (orders, dropped)."""
    scored = []
    # a measured all-to-all (both tiers: LinkTier.has) prices the EP groups' exchanges: compared too
    both = cluster.intra_node.has(Collective.all_to_all) and cluster.inter_node.has(Collective.all_to_all)
    collectives = REQUIRED_COLLECTIVES + ((Collective.all_to_all,) if both else ())
    for order in MESH_ORDERS:
        links = mesh_links(cluster, dp, tp, pp, order)
        vec = tuple(
            x
            for a in MESH_AXES
            for c in collectives
            for x in (links[a].coefficients(c) if links[a].size > 1 else (0.0, 0.0))
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


@dataclass(frozen=True)
class Layouts:
    """Every layout of a search space before --fix and a target's filters, and the rejections
    so far: what the searches of several stacks over one space share (planner/search/stacks.py)."""

    space: SearchSpace  # the space they were enumerated for
    candidates: tuple  # of Layout, in enumeration order
    rejected: Counter

    def covers(self, space: SearchSpace) -> bool:
        """Whether these are the layouts of `space` (which may have fewer TP-overlap or norm/act
        recompute choices)."""
        return (
            _untargeted(self.space) == _untargeted(space)
            and set(space.tp_comm_overlap) <= set(self.space.tp_comm_overlap)
            and set(space.recompute_norm_act) <= set(self.space.recompute_norm_act)
        )


def _untargeted(space: SearchSpace) -> SearchSpace:
    """`space` without what enumerate_candidates applies after enumerate_layouts."""
    return replace(
        space,
        fixed={},
        recompute_modes=MODES,
        tp_comm_overlap=(),
        recompute_norm_act=(),
        rules=None,
        target_problems=None,
    )


def candidate_modes(space: SearchSpace, c: Layout) -> tuple:
    """The recompute modes candidate `c`'s layers may use: the space's, less full recompute
    where they recompute their norms and activation (Plan.recompute_norm_act: a fully recomputed
    layer reruns its whole forward, and no stack does both)."""
    if c.recompute_norm_act:
        return tuple(m for m in space.recompute_modes if m != Recompute.full)
    return space.recompute_modes


def enumerate_candidates(
    model: ModelSpec,
    cluster: ClusterSpec,
    space: SearchSpace,
    layouts: Optional[Layouts] = None,
    deadline: Deadline = NO_DEADLINE,
) -> tuple[list[Layout], Counter]:
    """Every layout of the search space, and how many were rejected and why: the layouts
    (`layouts` when enumerated once for several targets), less what --fix excludes and what
    the target stack cannot express. OutOfTime (planner/search/deadline.py) past `deadline`."""
    if layouts is None:
        layouts = enumerate_layouts(model, cluster, space, deadline)
    elif not layouts.covers(space):
        raise ValueError("enumerate_candidates: layouts of another search space")  # an internal invariant
    rejected = Counter(layouts.rejected)
    out: list[Layout] = []
    seen: dict = {}  # the rules' verdicts, which no micro-batching changes
    for c in polled(layouts.candidates, deadline):
        if c.sequence_parallel and c.tp_comm_overlap not in space.tp_comm_overlap:
            continue  # a choice this target does not have (layouts enumerated for one that has it)
        if c.recompute_norm_act not in space.recompute_norm_act:
            continue
        if any(getattr(c, "shard_dp" if k == "dp_shard" else k) != val for k, val in space.fixed.items()):
            rejected[FIXED] += 1
        elif stack_problems(space, c, model.num_layers, seen):
            rejected[TARGET] += 1
        else:
            out.append(c)
    return out, rejected


def enumerate_layouts(
    model: ModelSpec, cluster: ClusterSpec, space: SearchSpace, deadline: Deadline = NO_DEADLINE
) -> Layouts:
    """Every layout of the search space that can work and can win (divisibility, TP inside a
    node, dominated choices), before --fix and the target's rules. OutOfTime past `deadline`."""
    rejected: Counter = Counter()
    out: list[Layout] = []
    n, L = space.num_gpus, model.num_layers
    max_tp = space.max_tp or cluster.domain_gpus  # TP inside the fast link's domain
    order_cache: dict = {}
    # A choice --fix pins is searched even where another would dominate it (the user asked for it)
    keep_orders = space.include_dominated or "mesh_order" in space.fixed
    keep_gpipe = space.include_dominated or space.fixed.get("schedule") == Schedule.gpipe
    keep_zero = space.include_dominated or space.fixed.get("zero_stage", 0) > 0
    for tp in divisors(n):
        if tp_problem(model, tp):
            rejected[DIVISIBILITY] += 1
            continue
        if tp > max_tp:
            rejected[TP_ACROSS_NODES] += 1
            continue
        for pp in divisors(n // tp):
            if pp > L:
                rejected[DIVISIBILITY] += 1
                continue
            for cp in [c for c in space.cp_degrees if (n // (tp * pp)) % c == 0]:
                dp = n // (tp * pp * cp)
                dpw = dp * cp  # ranks holding the same weights: the mesh's dp axis (cp innermost)
                options = _batch_options(space, dp, pp)
                if not options:
                    rejected[DIVISIBILITY] += 1
                key = (dpw, tp, pp)
                if key not in order_cache:
                    orders, dropped = _mesh_orders(cluster, dpw, tp, pp, keep_orders)
                    if space.max_tp is None:  # TP stays on NVLink: no mesh order may stretch it across nodes
                        inside = [o for o in orders if not mesh_links(cluster, dpw, tp, pp, o)[Axis.tp].inter_node]
                        rejected[TP_ACROSS_NODES] += len(orders) - len(inside)
                        orders = inside
                    order_cache[key] = (orders, dropped)
                orders, dropped_orders = order_cache[key]
                for b, m in polled(options, deadline, every=1):
                    # Interleaving: any v whose pp x v chunks each hold a layer; the ILP splits the
                    # layers over the chunks, unevenly where L is no multiple of pp x v (Megatron's
                    # --pipeline-model-parallel-layout, torchtitan's module lists; a stack that
                    # splits evenly refuses those: stack_problems). The schedule needs m % pp == 0.
                    vpps = [1] + [v for v in range(2, space.max_vpp + 1) if pp > 1 and pp * v <= L and m % pp == 0]
                    for v in vpps:
                        schedules = [Schedule.one_f_one_b, Schedule.gpipe] if v == 1 else [Schedule.interleaved_1f1b]
                        for sched in schedules:
                            for zero in range(4):
                                # MoE with TP dispatches each rank's sequence shard: SP is required
                                for sp in [False, True] if tp > 1 and not model.is_moe else [tp > 1]:
                                    if sp and cp > 1 and space.seq_len and (space.seq_len // cp) % tp:
                                        rejected[DIVISIBILITY] += 1
                                        continue
                                    # GPipe runs as fast as 1F1B and holds more activations: it
                                    # cannot win. A ZeRO stage whose shard groups have one rank
                                    # each (dp x cp = 1, no routed experts replicated over tp / ep
                                    # ranks) shards nothing: the same run as ZeRO-0, enumerated once,
                                    # as ZeRO-0 (zero_shards_nothing; --fix zero=N keeps it).
                                    eps = _ep_degrees(model, dpw, tp)
                                    if zero > 0 and not keep_zero:
                                        eps = [ep for ep in eps if not zero_shards_nothing(model, dpw, tp, ep)]
                                    dominated = (sched == Schedule.gpipe and not keep_gpipe) or not eps
                                    if dominated:
                                        rejected[DOMINATED] += len(MESH_ORDERS)
                                        continue
                                    rejected[DOMINATED] += dropped_orders
                                    base = Layout(dp, tp, pp, v, b, m, sched, zero, sp, cp=cp)
                                    out.extend(_variants(cluster, space, base, orders, eps))
    return Layouts(space, tuple(out), rejected)


# Hybrid sharding searched: shard groups spanning this many scale-up domains (nodes), below all
# of dp. Larger groups save memory and cost latency; past a few nodes the full group is the one
# to weigh (a --fix dp_shard searches any other).
SHARD_DOMAINS = (1, 2, 4, 8)


@lru_cache(maxsize=4096)
def _shard_cache(domain: int, dp: int, cp: int, stride: int, fixed: int) -> tuple:
    out = [0]  # all of dp
    for d in range(1, dp):
        # a group of one rank shards nothing (ZeRO-0's twin): only where --fix asks for it
        if dp % d == 0 and (d == fixed or (d * cp > 1 and any(stride * d * cp == domain * k for k in SHARD_DOMAINS))):
            out.append(d)
    return tuple(out)


def _shard_sizes(cluster: ClusterSpec, space: SearchSpace, dp: int, cp: int, tp: int, pp: int, order) -> tuple:
    """dp_shard choices of a ZeRO layout: all of dp (0), and each shard group of dp_shard x cp ranks
    that fills SHARD_DOMAINS whole domains of the mesh (or the size --fix names)."""
    if dp == 1:
        return (0,)
    stride = mesh_strides({Axis.dp: dp * cp, Axis.tp: tp, Axis.pp: pp}, order)[Axis.dp]
    return _shard_cache(cluster.domain_gpus, dp, cp, stride, space.fixed.get("dp_shard", 0))


def _variants(cluster: ClusterSpec, space: SearchSpace, base: Layout, orders, eps) -> list[Layout]:
    """`base` in each mesh order, TP-overlap, expert degree, FP8 and norm/act choice and, with
    ZeRO, each shard group (_shard_sizes; hybrid sharding with experts is not searched)."""
    out = []
    dp, tp, pp, v, b, m, cp = (
        base.dp,
        base.tp,
        base.pp,
        base.vpp,
        base.micro_batch_size,
        base.num_micro_batches,
        base.cp,
    )
    sched, zero, sp = base.schedule, base.zero_stage, base.sequence_parallel
    overlaps = space.tp_comm_overlap if sp else (False,)
    for order, ov, ep, fp8, na in itertools.product(orders, overlaps, eps, space.fp8, space.recompute_norm_act):
        shards = _shard_sizes(cluster, space, dp, cp, tp, pp, order) if zero and ep == 1 else (0,)
        for shard in shards:
            out.append(Layout(dp, tp, pp, v, b, m, sched, zero, sp, order, ov, ep, fp8, cp, na, shard))
    return out


def zero_shards_nothing(model: ModelSpec, dpw: int, tp: int, ep: int) -> bool:
    """Whether every ZeRO group of a layout has one rank, so a ZeRO stage above 0 is the same
    run as ZeRO-0: the dense states' group is dp x cp (`dpw`, cost_models/tables.py:
    _state_tables), and a MoE model's routed experts are also sharded over their expert-DP group
    of tp x dp x cp / ep ranks."""
    return dpw == 1 and (not model.is_moe or tp * dpw // ep == 1)


def _ep_degrees(model: ModelSpec, dp: int, tp: int) -> list[int]:
    """Expert-parallel degrees of a layout: 1 for a dense model; for a MoE model every common
    divisor of the expert count and tp x dp (specs.ep_problem's rule)."""
    if not model.is_moe:
        return [1]
    assert model.num_experts is not None  # model.is_moe
    return divisors(math.gcd(model.num_experts, tp * dp))


def stack_problems(space: SearchSpace, c: Layout, num_layers: int, seen: Optional[dict] = None) -> list[str]:
    """Why the space's target stack cannot run this layout whatever its split (its Rules, an even
    split the layers do not divide, and what it refuses beyond them); [] where it can. `seen`: a
    cache of the rules' verdicts over one space's candidates (they ignore the micro-batching)."""
    rules = space.rules
    if rules is None:
        return []
    key = (
        c.dp,
        c.tp,
        c.pp,
        c.vpp,
        c.schedule,
        c.zero_stage,
        c.sequence_parallel,
        c.mesh_order,
        c.tp_comm_overlap,
        c.ep,
        c.fp8,
        c.cp,
        c.recompute_norm_act,
        c.dp_shard,
    )
    out = None if seen is None else seen.get(key)
    if out is None:
        out = rules.layout_problems(c)
        if rules.split == "even" and num_layers % (c.pp * c.vpp):
            out.append(f"{num_layers} layers over {c.pp * c.vpp} stages ({rules.stack} splits layers evenly)")
        if seen is not None:
            seen[key] = out
    if out or space.target_problems is None:
        return out
    return space.target_problems(c)


class CostTables:
    """Per-solve caches of link, layer and edge costs: many candidates share them."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, job: JobSpec):
        # the cluster as job.target's software runs on it (its fitted constants, ClusterSpec.for_target)
        self.model, self.cluster, self.job = model, cluster.for_target(job.target), job
        self._links: dict = {}
        self._layer: dict = {}
        self._edge: dict = {}
        self._flops: dict = {}

    def links(self, c: Layout) -> dict:
        key = (c.dp * c.cp, c.tp, c.pp, c.mesh_order)
        if key not in self._links:
            self._links[key] = mesh_links(self.cluster, c.dp * c.cp, c.tp, c.pp, c.mesh_order)
        return self._links[key]

    def layer(self, c: Layout) -> LayerCosts:
        tp_link = self.links(c)[Axis.tp]
        ep_link = self.ep_link(c)
        cp_link = cp_link_of(self.cluster, c.dp * c.cp, c.tp, c.pp, c.cp, c.mesh_order)
        key = (
            c.micro_batch_size,
            c.tp,
            c.sequence_parallel,
            tp_link.signature,
            c.tp_comm_overlap,
            c.ep,
            ep_link.signature if ep_link else None,
            c.fp8,
            c.cp,
            cp_link.signature if cp_link else None,
            c.recompute_norm_act,
        )
        if key not in self._layer:
            groups = {
                Axis.tp: tp_link,
                **({Axis.ep: ep_link} if ep_link else {}),
                **({Axis.cp: cp_link} if cp_link else {}),
            }
            self._layer[key] = layer_costs(self.model, self.cluster, rank_job(self.job, c.cp), c, groups)
        return self._layer[key]

    def ep_link(self, c: Layout):
        return ep_link_of(self.cluster, c.dp * c.cp, c.tp, c.pp, c.ep, c.mesh_order) if c.ep > 1 else None

    def edge(self, c: Layout) -> EdgeCosts:
        links = self.links(c)
        ep_link = self.ep_link(c)
        # the first dense layers and multi-token prediction are costed from the layer (self.layer):
        # their edge costs depend on all that it does
        layered = bool(self.model.first_dense_layers or self.model.mtp_layers)
        cp_link = cp_link_of(self.cluster, c.dp * c.cp, c.tp, c.pp, c.cp, c.mesh_order) if layered else None
        key = (
            c.micro_batch_size,
            c.tp,
            c.sequence_parallel,
            c.pp,
            links[Axis.tp].signature,
            links[Axis.pp].signature,
            c.ep,
            ep_link.signature if ep_link else None,
            c.tp_comm_overlap if layered else None,
            c.fp8 if layered else None,
            c.cp,
            cp_link.signature if cp_link else None,
            c.recompute_norm_act if layered else None,
        )
        if key not in self._edge:
            groups = {**links, **({Axis.ep: ep_link} if ep_link else {})}
            self._edge[key] = edge_costs(self.model, self.cluster, rank_job(self.job, c.cp), c, groups, self.layer(c))
        return self._edge[key]

    def job_for(self, c: Layout) -> JobSpec:
        if c.global_batch_size == self.job.global_batch_size:
            return self.job
        return self.job.model_copy(update={"global_batch_size": c.global_batch_size})

    def flops(self, c: Layout) -> float:
        batch = c.global_batch_size
        if batch not in self._flops:
            self._flops[batch] = model_flops_per_step(self.model, batch, self.job.seq_len)
        return self._flops[batch]

    def pipeline(self, c: Layout) -> PipelineCosts:
        return layout_costs(
            self.model, self.cluster, self.job, c, self.links(c), self.layer(c), self.edge(c), self.flops(c)
        )


# --fix's names of Layout fields (KEY=VALUE), the short one first: planner/inputs.py:parse_fixes
# reads them, refusals write them back (fix_key, fix_text).
FIX_KEYS = {
    "dp": ("dp", int),
    "tp": ("tp", int),
    "pp": ("pp", int),
    "vpp": ("vpp", int),
    "ep": ("ep", int),
    "cp": ("cp", int),
    "mbs": ("micro_batch_size", int),
    "micro_batch_size": ("micro_batch_size", int),
    "zero": ("zero_stage", int),
    "zero_stage": ("zero_stage", int),
    "dp_shard": ("dp_shard", int),
    "sp": ("sequence_parallel", "bool"),
    "sequence_parallel": ("sequence_parallel", "bool"),
    "schedule": ("schedule", str),
    "mesh_order": ("mesh_order", "axes"),
    "recompute": ("recompute", str),
    "tp_comm_overlap": ("tp_comm_overlap", "bool"),
    "fp8": ("fp8", "bool"),
    "recompute_norm_act": ("recompute_norm_act", "bool"),
}


def fix_items(fixes) -> tuple[str, ...]:
    """--fix's KEY=VALUE strings, from those strings or from a mapping {key: value} (the API's:
    {"tp": 8, "sp": True, "mesh_order": ["tp", "pp", "dp"]})."""
    if not hasattr(fixes, "items"):
        return tuple(fixes)
    return tuple(f"{key}={fix_text(value)}" for key, value in fixes.items())


def fix_key(field: str) -> str:
    """The shortest --fix key for a Layout field (`mbs` for micro_batch_size)."""
    return next(key for key, (f, _) in FIX_KEYS.items() if f == field)


def fix_text(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return ",".join(str(getattr(v, "value", v)) for v in value)
    return str(getattr(value, "value", value))
