"""What `plan show` draws, as data: the pipeline schedule of one step, memory per pipeline
rank, and where every rank sits. No plotting here (planner/draw.py draws these; the terminal
text is in planner/cli/show.py), so tests check the numbers a picture is made of.

The timeline replays the plan's schedule op by op from the cost model's per-stage times
(cost_models/estimate.py reads the same PipelineCosts): each pipeline rank runs its forward
(F) and backward (B) passes in the order the schedule prescribes, and an op starts when its
rank is free and its input is ready (F of stage j after F of stage j-1; B of stage j after
B of stage j+1, the last stage's B after its own F). Op orders:
  gpipe: every forward, then every backward;
  1f1b: p - r - 1 warm-up forwards on rank r, then one forward and one backward in turn,
    then the remaining backwards (Narayanan et al. 2021, sec. 2.2);
  interleaved-1f1b: Megatron-LM's order (schedules.py of megatron-core): forwards go through
    micro-batches in groups of p, model chunk by model chunk; (p - r - 1) x 2 + (v - 1) x p
    warm-up forwards; backwards visit the chunks in reverse.
Inside an op, the stage's time is split by cause: a forward is the forward part of compute
and TP collectives (split between them in proportion to the stage's compute and TP time)
plus half the pipeline sends; a backward is the rest, with the recomputation first and the
stage's exposed per-micro-batch ZeRO traffic last. After its last op, each rank's exposed
per-step data-parallel communication, then its optimizer step.

A zoomed timeline (`plan show --micro-batches A-B --ranks A-B`) is a window of this one
replay: the ranks and micro-batches chosen and the span of time their passes take (window).

The estimate's pipeline time is the closed form sum_j S_j + (m - 1) max_j S_j (exact for
equal stages); the replay is the schedule itself, so where stages differ the two may differ
slightly, and `plan show` prints both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from cost_models.communication import GroupLink, mesh_strides
from cost_models.estimate import rank_counts, recompute_counts
from cost_models.tables import ep_stride, mesh_links, pipeline_costs, shard_links_of, spine_factor
from planner.errors import PlannerError
from planner.specs import MESH_AXES, Axis, ClusterSpec, Estimate, JobSpec, ModelSpec, Plan, Schedule

# What a segment of an op is doing; "idle" is what is left of a rank's step.
KINDS = ("forward", "backward", "recompute", "tp_comm", "pp_comm", "dp_comm", "optimizer")


@dataclass
class Op:
    """One forward or backward pass of one micro-batch through one virtual stage."""

    rank: int
    kind: str  # "F" or "B"
    stage: int  # virtual stage
    micro_batch: int
    start: float
    segments: tuple[tuple[str, float], ...]  # (KINDS entry, seconds), in order
    duration: float = field(init=False)  # their sum, added once: a replay reads it millions of times

    def __post_init__(self) -> None:
        self.duration = sum(s for _, s in self.segments)

    @property
    def end(self) -> float:
        return self.start + self.duration


@dataclass
class Timeline:
    """One optimizer step, every pipeline rank's ops and its per-step tail."""

    pp: int
    num_micro_batches: int
    ops: list[Op]
    tails: list[list[tuple[str, float, float]]]  # per rank: (kind, start, seconds) after its last op
    pipeline_end: float  # when the last op ends
    step_time: float  # the end of the step (the last rank's optimizer)
    bottleneck_rank: int  # the estimate's bottleneck pipeline rank
    busy: list[float] = field(default_factory=list)  # per rank, seconds of ops

    def idle(self, rank: int) -> float:
        """Idle time of `rank` while the pipeline runs (its bubble)."""
        return self.pipeline_end - self.busy[rank]

    @property
    def bubble_share(self) -> float:
        """The bottleneck rank's pipeline bubble as a share of the step (the estimate's
        time_breakdown_s.pipeline_bubble / step_time_s)."""
        return self.idle(self.bottleneck_rank) / self.step_time


def _orders(schedule: Schedule, pp: int, vpp: int, m: int) -> list[list[tuple[str, int, int]]]:
    """Per pipeline rank, its ops (kind, virtual stage, micro-batch) in execution order."""
    orders = []
    for r in range(pp):
        if schedule == Schedule.interleaved_1f1b:
            total = m * vpp

            def chunk_mb(k: int, backward: bool) -> tuple[int, int]:
                group, within = divmod(k, pp * vpp)
                chunk = within // pp
                return (vpp - 1 - chunk if backward else chunk), group * pp + within % pp

            fwd = [("F", chunk * pp + r, mb) for chunk, mb in (chunk_mb(k, False) for k in range(total))]
            bwd = [("B", chunk * pp + r, mb) for chunk, mb in (chunk_mb(k, True) for k in range(total))]
            warm = total if m == pp else min(total, (pp - r - 1) * 2 + (vpp - 1) * pp)
        else:
            fwd = [("F", r, i) for i in range(m)]
            bwd = [("B", r, i) for i in range(m)]
            warm = m if schedule == Schedule.gpipe else min(m, pp - r - 1)
        order = fwd[:warm]
        for i in range(len(fwd) - warm):
            order += [fwd[warm + i], bwd[i]]
        order += bwd[len(fwd) - warm :]
        orders.append(order)
    return orders


def replay(schedule: Schedule, pp: int, vpp: int, m: int, segments: dict) -> list[Op]:
    """Every pass of one step in the schedule's order, each starting when its rank is free and
    its input is ready; `segments[kind, j]`: the (cause, seconds) pieces of a pass of virtual
    stage j ("F" or "B")."""
    last = pp * vpp - 1
    end: dict[tuple[str, int, int], float] = {}
    orders = _orders(schedule, pp, vpp, m)
    pieces = {
        key: tuple(s for s in parts if s[1] > 0) for key, parts in segments.items()
    }  # shared by the ops of a stage
    pos, free = [0] * pp, [0.0] * pp
    ops: list[Op] = []
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for r in range(pp):
            while pos[r] < len(orders[r]):
                kind, j, i = orders[r][pos[r]]
                dep = ("F", j - 1, i) if kind == "F" else (("B", j + 1, i) if j < last else ("F", j, i))
                if kind == "F" and j == 0:
                    ready = 0.0
                elif dep in end:
                    ready = end[dep]
                else:
                    break
                op = Op(r, kind, j, i, max(free[r], ready), pieces[kind, j])
                end[kind, j, i] = free[r] = op.end
                ops.append(op)
                pos[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # an order that waits on itself: a bug here, not the user's input
            raise AssertionError(f"schedule {schedule.value} deadlocked at {pos}")
    return ops


# Above this many ops a replay (and its picture) stops being useful and gets slow: 400,000 took
# 7 s of CPU (16 s on a busy 2-core machine) for `plan show --json`; 100,000 about a quarter of that.
MAX_OPS = 100_000


def timeline(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, plan: Plan, est: Estimate) -> Timeline:
    """Replay one step of `plan` (see the module docstring)."""
    pc = pipeline_costs(model, cluster, job, plan)
    pp, v, m = pc.pp, pc.vpp, pc.num_micro_batches
    if 2 * m * pp * v > MAX_OPS:
        raise PlannerError(
            f"the timeline would have {2 * m * pp * v:,} passes (more than {MAX_OPS:,}); show a plan with fewer micro-batches"
        )
    counts = recompute_counts(plan, model.num_layers)
    ranks = pc.terms.ranks()
    totals = rank_counts(counts, pp)
    exposed = [rk.exposure.values(n) for rk, n in zip(ranks, totals)]

    segments: dict[tuple[str, int], list[tuple[str, float]]] = {}
    for j, c in enumerate(counts):
        r = j % pp
        st = ranks[r].stages[j // pp]
        comp, tp, rec, p2p, fwd = st.compute(c), st.tp(c), st.recompute(c), st.p2p(c), st.forward(c)
        share = comp / (comp + tp) if comp + tp > 0 else 1.0
        f_comp, f_tp = fwd * share, fwd * (1 - share)
        segments["F", j] = [("forward", f_comp), ("tp_comm", f_tp), ("pp_comm", p2p / 2)]
        segments["B", j] = [
            ("recompute", rec),
            ("backward", comp - f_comp),
            ("tp_comm", tp - f_tp),
            ("pp_comm", p2p / 2),
            ("dp_comm", exposed[r][0] / v),
        ]

    ops = replay(plan.schedule, pp, v, m, segments)
    free = [0.0] * pp  # when each rank's last op ends
    busy = [0.0] * pp
    for op in ops:
        free[op.rank] = max(free[op.rank], op.end)
        busy[op.rank] += op.duration
    pipeline_end = max(free)
    tails = []
    for r, (rk, n) in enumerate(zip(ranks, totals)):
        t, tail = free[r], []
        for kind, seconds in (("dp_comm", exposed[r][1]), ("optimizer", rk.optimizer(n))):
            if seconds > 0:
                tail.append((kind, t, seconds))
                t += seconds
        tails.append(tail)
    step = max([pipeline_end] + [k[1] + k[2] for tail in tails for k in tail])
    return Timeline(pp, m, ops, tails, pipeline_end, step, est.bottleneck_pipeline_rank, busy)


@dataclass(frozen=True)
class Window:
    """A part of one step's timeline: pipeline ranks and micro-batches (inclusive ranges,
    numbered from 0 as the pictures number them) and the span of time from the first start
    to the last end of their passes; from the step's start when micro-batch 0 is in it, to the
    ranks' last optimizer step when the last micro-batch is."""

    first_rank: int
    last_rank: int
    first_micro_batch: int
    last_micro_batch: int
    start: float
    end: float

    @classmethod
    def whole(cls, tl: Timeline) -> "Window":
        return window(tl)

    @property
    def ranks(self) -> range:
        return range(self.first_rank, self.last_rank + 1)

    def chosen(self, op: Op) -> bool:
        """Whether `op` is one of the window's passes (not another micro-batch's running inside it)."""
        return op.rank in self.ranks and self.first_micro_batch <= op.micro_batch <= self.last_micro_batch

    def overlaps(self, start: float, seconds: float) -> bool:
        return start < self.end and start + seconds > self.start

    def is_whole(self, tl: Timeline) -> bool:
        return (self.first_rank, self.last_rank, self.first_micro_batch, self.last_micro_batch) == (
            0,
            tl.pp - 1,
            0,
            tl.num_micro_batches - 1,
        )

    def describe(self, tl: Timeline) -> str:
        """The window in words, for a picture's title."""

        def span(a: int, b: int) -> str:
            return str(a) if a == b else f"{a}-{b}"

        return (
            f"zoom: pipeline ranks {span(self.first_rank, self.last_rank)} of 0-{tl.pp - 1}, micro-batches "
            f"{span(self.first_micro_batch, self.last_micro_batch)} of 0-{tl.num_micro_batches - 1}: "
            f"{self.start:.3g}-{self.end:.3g} s of the {tl.step_time:.3g} s step"
        )


def window(tl: Timeline, micro_batches: tuple[int, int] | None = None, ranks: tuple[int, int] | None = None) -> Window:
    """The part of the replayed step `tl` that `micro_batches` and `ranks` (first, last; all
    when None) cover. The ranges must lie inside the plan (planner/cli/show.py checks them)."""
    mb = micro_batches or (0, tl.num_micro_batches - 1)
    rk = ranks or (0, tl.pp - 1)
    if not (0 <= mb[0] <= mb[1] < tl.num_micro_batches and 0 <= rk[0] <= rk[1] < tl.pp):
        raise ValueError(f"window micro-batches {mb}, ranks {rk} outside the plan")
    chosen = [op for op in tl.ops if rk[0] <= op.rank <= rk[1] and mb[0] <= op.micro_batch <= mb[1]]
    start = 0.0 if mb[0] == 0 else min(op.start for op in chosen)
    end = max(op.end for op in chosen)
    if mb[1] == tl.num_micro_batches - 1:
        end = max([end] + [s + d for r in range(rk[0], rk[1] + 1) for _, s, d in tl.tails[r]])
    return Window(rk[0], rk[1], mb[0], mb[1], start, end)


MEMORY_KINDS = ("weights", "gradients", "optimizer_states", "activations", "temporary", "overhead")


def memory_bars(est: Estimate) -> list[dict[str, float]]:
    """Per pipeline rank, GiB by kind (the estimate's memory_gib_per_pipeline_rank)."""
    return [{k: getattr(m, k) for k in MEMORY_KINDS} for m in est.memory_gib_per_pipeline_rank]


@dataclass
class Placement:
    """Where every rank sits: node, GPU on the node, and its coordinate on each axis."""

    gpus_per_node: int
    ranks: Sequence[dict]  # {"rank", "node", "gpu", "dp", "cp", "tp", "pp", "ep", "leaf"}, made when read (_Ranks)
    axes: list[dict]  # per axis: {"axis", "degree", "stride", "inter_node", "rails", "link", "where" (in words)}
    nodes_per_leaf: int | None = None  # the spine's leaves (ClusterSpec.spine), None without one

    @property
    def expert_parallel(self) -> bool:
        return any(a["axis"] == "ep" for a in self.axes)


class _Ranks(Sequence):
    """Every rank's place, each dict made when it is read: a plan of 10^6 GPUs took 8 s of CPU
    to list them all, where `plan show` counts them, lists a node's and draws at most
    draw.MAX_PLACEMENT_RANKS."""

    def __init__(
        self, plan: Plan, strides: dict, degrees: dict, gpus_per_node: int, leaf_gpus: int | None, tp_inner: bool
    ) -> None:
        self._axes = [(a.value, strides[a], degrees[a]) for a in MESH_AXES]
        self._cp, self._g, self._n = plan.cp, gpus_per_node, plan.world_size
        self._tp, self._ep, self._leaf, self._replicas = plan.tp, plan.ep, leaf_gpus, plan.dp * plan.cp
        self._tp_inner = tp_inner  # the expert groups fold tp first (else dp x cp), as ep_stride says

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._n))]
        if not -self._n <= i < self._n:
            raise IndexError(i)
        rank = i % self._n
        coord = {name: (rank // stride) % degree for name, stride, degree in self._axes}
        coord["cp"], coord["dp"] = coord["dp"] % self._cp, coord["dp"] // self._cp
        # expert parallelism: ep ranks of the tp x (dp x cp) block, the innermost of tp and dp first (Megatron-Core's
        # folding with expert-TP 1, as cost_models/tables.py:ep_stride prices it); the rank's position in its group
        replica = coord["dp"] * self._cp + coord["cp"]
        block = coord["tp"] + self._tp * replica if self._tp_inner else replica + self._replicas * coord["tp"]
        coord["ep"] = block % self._ep
        leaf = rank // self._leaf if self._leaf else None
        return {"rank": rank, "node": rank // self._g, "gpu": rank % self._g, **coord, "leaf": leaf}


def placement(plan: Plan, cluster: ClusterSpec) -> Placement:
    """Rank r = sum over axes of coordinate x stride, the axes in the plan's mesh order
    (innermost first; cost_models/communication.py:mesh_strides); ranks fill nodes in order,
    gpus_per_node each (as torchrun numbers them), and nodes fill the spine's leaves in order.
    With expert parallelism an "ep" row follows the mesh axes: the group the cost model prices
    (cost_models/tables.py:ep_stride), and what an oversubscribed spine does to its all-to-all."""
    degrees = {Axis.dp: plan.dp * plan.cp, Axis.tp: plan.tp, Axis.pp: plan.pp}  # cp innermost in the dp axis
    strides = mesh_strides(degrees, plan.mesh_order)
    g = cluster.gpus_per_node
    spine = cluster.spine
    expert_stride = ep_stride(plan.dp * plan.cp, plan.tp, plan.pp, plan.mesh_order)
    ranks = _Ranks(
        plan,
        strides,
        degrees,
        g,
        spine.nodes_per_leaf * g if spine else None,
        plan.tp > 1 and expert_stride == strides[Axis.tp],
    )
    links = mesh_links(cluster, plan.dp * plan.cp, plan.tp, plan.pp, plan.mesh_order)
    # the fast link's reach: a node, or a scale-up domain of several (ClusterSpec.domain_gpus)
    unit, across = (
        ("a node", "nodes")
        if cluster.domain_gpus == g
        else (f"a scale-up domain of {cluster.domain_gpus} GPUs", "scale-up domains")
    )

    def row(axis: str, degree: int, stride: int, link: GroupLink) -> dict:
        tier = cluster.inter_node if link.inter_node else cluster.intra_node
        name = tier.name if degree > 1 else "none (degree 1)"
        where = (
            f"across {across} ({link.rails} rail(s)): {name}"
            if link.inter_node
            else name
            if degree == 1
            else f"inside {unit}: {name}"
        )
        return {
            "axis": axis,
            "degree": degree,
            "stride": stride,
            "inter_node": link.inter_node,
            "rails": link.rails if link.inter_node else None,
            "link": name,
            "where": where,
        }

    axes = [
        row(a.value if a != Axis.dp or plan.cp == 1 else "dp x cp", degrees[a], strides[a], links[a])
        for a in plan.mesh_order
    ]
    if plan.dp_shard:  # hybrid sharding: the ZeRO group and its replicas, as the cost model prices them
        group, replicas = shard_links_of(
            cluster, degrees[Axis.dp], plan.tp, plan.pp, plan.dp_shard * plan.cp, plan.mesh_order
        )
        axes.append(row("dp shard (ZeRO group)", group.size, strides[Axis.dp], group))
        axes.append(row("dp replicas", replicas.size, strides[Axis.dp] * group.size, replicas))
    if plan.ep > 1:
        link = GroupLink(cluster, plan.ep, expert_stride)  # the group cost_models/tables.py:ep_link_of prices
        ep = row("ep", plan.ep, expert_stride, link)
        slowed = spine_factor(cluster, link)
        if slowed > 1:
            assert spine is not None  # spine_factor is 1 without one (cost_models/tables.py)
            ep["where"] += (
                f"; its all-to-all crosses the spine ({spine.nodes_per_leaf} nodes a leaf, "
                f"{spine.oversubscription:g}:1), network part x{slowed:.2f}"
            )
        axes.append(ep)
    return Placement(g, ranks, axes, spine.nodes_per_leaf if spine else None)


def rank_coordinates(rk: dict, cp: bool, ep: bool) -> str:
    """A rank's place as the placement shows it: "d1 t0 p2", with "c1" under context
    parallelism and "e5" (its place in its expert group) under expert parallelism."""
    return f"d{rk['dp']} t{rk['tp']} p{rk['pp']}" + (f" c{rk['cp']}" if cp else "") + (f" e{rk['ep']}" if ep else "")


__all__ = [
    "KINDS",
    "MEMORY_KINDS",
    "Op",
    "Placement",
    "Timeline",
    "Window",
    "memory_bars",
    "placement",
    "rank_coordinates",
    "timeline",
    "window",
]
