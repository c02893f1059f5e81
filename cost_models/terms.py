"""Every cost of one candidate layout, stated once, per pipeline rank, as expressions linear in
that rank's layer counts per recompute mode.

A candidate (cost_models/costs.py:LayoutTables) fixes everything but how many layers each
virtual stage runs under each recompute mode. Once it is fixed, every cost is linear in those
counts, or a maximum of linear pieces:

- the time of one micro-batch through virtual stage j (compute, recompute, TP collectives,
  pipeline sends): :meth:`LayoutTerms.stage_time`;
- a pipeline rank's memory (model states, in-flight activations, fixed buffers) plus the
  largest transient buffer of its stages, where a stage with a fully recomputed layer also
  rebuilds one layer's activations during backward: :meth:`LayoutTerms.rank_memory`;
- a rank's exposed data-parallel / ZeRO communication, per micro-batch and per step, as a sum
  of terms, each linear or a :class:`Hidden` (communication beside a compute window, the
  maximum of two linear pieces, with the gradient-bucket case as a named switch):
  :meth:`LayoutTerms.exposure`;
- the optimizer update of the rank's parameter shard.

Three consumers read these expressions and nothing else: cost_models/estimate.py:evaluate
plugs integer counts into them, planner/search/ilp.py turns them into `lpSum` rows and
`U >= piece` constraints, and planner/search/bounds.py reads their slopes and pieces. A new
term (a context-parallel all-gather, an expert all-to-all) is added here, once.

Counts are (none, selective, full) tuples in the order of MODES, of one virtual stage or summed
over the stages of one pipeline rank: every per-layer slope of a rank is the same for all its
stages, so rank expressions depend on the rank's summed counts only.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import NamedTuple, Optional

from planner.specs import Collective, Recompute

from .communication import overlapped
from .costs import LayoutTables

MODES = (Recompute.none, Recompute.selective, Recompute.full)
GRADIENT_BUCKET_BYTES = 25 * 2**20  # PyTorch DDP's default bucket_cap_mb=25
# DeepSpeed's default reduce_bucket_size, in gradient elements (its ZeRO config docs; deepspeed/runtime/zero/config.py),
# which the export writes for ZeRO-3 (planner/stacks/deepspeed/export.py) and tables.zero3_reduce_calls charges
DEEPSPEED_REDUCE_BUCKET_ELEMENTS = 500_000_000


class Linear:
    """const + sum_i slope[i] x n_i, with n_i the layers under recompute mode MODES[i].
    (Slotted and never changed after construction: the search builds many of them.)"""

    __slots__ = ("const", "slope")

    def __init__(self, const: float, slope: tuple[float, float, float]):
        self.const = const
        self.slope = slope

    def __repr__(self) -> str:
        return f"Linear({self.const!r}, {self.slope!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, Linear) and self.const == other.const and self.slope == other.slope

    __hash__ = None  # type: ignore[assignment]

    def __call__(self, counts) -> float:
        s, n = self.slope, counts
        return self.const + s[0] * n[0] + s[1] * n[1] + s[2] * n[2]

    def __add__(self, other: "Linear") -> "Linear":
        s, t = self.slope, other.slope
        return Linear(self.const + other.const, (s[0] + t[0], s[1] + t[1], s[2] + t[2]))

    def __sub__(self, other: "Linear") -> "Linear":
        s, t = self.slope, other.slope
        return Linear(self.const - other.const, (s[0] - t[0], s[1] - t[1], s[2] - t[2]))

    def scaled(self, k: float) -> "Linear":
        s = self.slope
        return Linear(k * self.const, (k * s[0], k * s[1], k * s[2]))

    def plus(self, c: float) -> "Linear":
        return Linear(self.const + c, self.slope)

    @staticmethod
    def per_layer(const: float, per_layer: float) -> "Linear":
        """The same slope for every recompute mode."""
        return Linear(const, (per_layer, per_layer, per_layer))


class Hidden(NamedTuple):
    """Communication `comm` that runs beside compute `window`, except a piece `edge` (the last
    gradient bucket, the first layer's gather) that can never hide, when a fraction
    `efficiency` of the rest actually hides (communication.overlapped):
        exposed = max((1 - eta) comm + eta edge,  comm - eta window).
    Gradient-bucket switch: when `bucket_bytes` (the rank's gradient bytes) is below one
    bucket (`bucket`, bytes), everything goes in that one last bucket: the piece that never
    hides is then `tail` (linear in the counts: what the last bucket holds, the rank's whole
    reduction), or, without one, all of `comm` (exposed = comm: DDP's bucket, whose comm is
    the reduction alone). At the switch the tail equals the edge, so nothing jumps there."""

    comm: Linear
    edge: float
    window: Linear
    efficiency: float
    bucket_bytes: Optional[Linear] = None
    bucket: float = GRADIENT_BUCKET_BYTES
    tail: Optional[Linear] = None

    def bucket_full(self, counts) -> bool:
        return self.bucket_bytes is None or self.bucket_bytes(counts) >= self.bucket

    def _edge(self, counts, full: bool) -> float:
        return self.edge if full else self.tail(counts) if self.tail is not None else self.comm(counts)

    def __call__(self, counts, bucket_full: Optional[bool] = None) -> float:
        full = self.bucket_full(counts) if bucket_full is None else bucket_full
        return overlapped(self.comm(counts), self._edge(counts, full), self.window(counts), self.efficiency)

    def never_hidden(self, counts, bucket_full: Optional[bool] = None) -> float:
        """What stays exposed however long the window: nondecreasing in the counts."""
        full = self.bucket_full(counts) if bucket_full is None else bucket_full
        return overlapped(self.comm(counts), self._edge(counts, full), float("inf"), self.efficiency)

    def window_piece(self) -> Linear:
        return self.comm - self.window.scaled(self.efficiency)

    def edge_piece(self, bucket_full: bool = True) -> Linear:
        """The piece that does not depend on the window (edge <= comm: every rank holds a layer;
        tail <= comm: it is part of it)."""
        if not bucket_full:
            if self.tail is None:
                return self.comm
            return self.comm.scaled(1.0 - self.efficiency) + self.tail.scaled(self.efficiency)
        return self.comm.scaled(1.0 - self.efficiency).plus(self.efficiency * self.edge)


class Exposure(NamedTuple):
    """Exposed data-parallel communication of one pipeline rank: per micro-batch (added to
    each of the rank's stages, 1/v each) and per step (after the pipeline drains), each the
    sum of its terms."""

    per_micro_batch: tuple
    per_step: tuple

    def values(self, counts) -> tuple[float, float]:
        return sum(t(counts) for t in self.per_micro_batch), sum(t(counts) for t in self.per_step)


NO_EXPOSURE = Exposure((), ())


class StageTime(NamedTuple):
    """One micro-batch through one virtual stage (forward + backward), by cause."""

    compute: Linear  # layers' forward + backward math, embedding / head and loss
    recompute: Linear  # extra forward of recomputed layers
    tp: Linear  # TP collectives on the critical path
    p2p: Linear  # pipeline sends (not overlapped)
    forward: Linear  # the forward part of compute + tp (the window ZeRO-3 gathers hide behind)
    total: Linear  # compute + recompute + tp + p2p

    @property
    def forward_pass(self) -> Linear:
        """The forward pass of one micro-batch: the forward part plus half the sends (the
        backward pass is the rest of `total`: recompute, backward math, the other half)."""
        return self.forward + self.p2p.scaled(0.5)


class RankMemory(NamedTuple):
    """Peak memory of one pipeline rank, bytes: linear parts in the rank's summed counts,
    plus the largest transient buffer over its stages."""

    weights: Linear
    gradients: Linear
    optimizer: Linear
    activations: Linear  # in-flight micro-batches x saved bytes
    fixed: float  # framework overhead + gathered ZeRO-3 layers + TP-overlap buffers
    overhead: float  # the framework part of `fixed`
    temporary: tuple  # per stage of the rank: transient bytes (logits on the last stage)
    full_recompute_buffer: float  # one layer's activations, rebuilt in a stage with a fully recomputed layer
    linear: Linear  # everything but the transient buffer: weights + gradients + optimizer + activations + fixed

    def transient(self, stage_counts) -> float:
        """Largest transient buffer of the rank, given each of its stages' counts."""
        return max(
            [t + (self.full_recompute_buffer if c[2] else 0.0) for t, c in zip(self.temporary, stage_counts)] + [0.0]
        )


_DP_COLLECTIVES = (Collective.all_reduce, Collective.all_gather, Collective.reduce_scatter)


@dataclass(frozen=True, eq=False)
class DataParallel:
    """What a rank's exposed data-parallel communication depends on besides its own counts.
    Made by :meth:`of`, which returns one object for equal settings, so that layouts with
    equal settings share cached bounds (compared by identity)."""

    size: int
    zero_stage: int
    efficiency: float  # fraction of overlappable communication that hides (communication.overlapped)
    bytes_per_param: int  # gradients / gathered parameters on the wire
    layer_bytes: float  # one layer's parameters on the wire (ZeRO-3's gather / reduce-scatter unit)
    costs: tuple  # (alpha s, beta s per byte) of all-reduce, all-gather, reduce-scatter on the DP link
    reduce_calls: float = 1.0  # ZeRO-3 reduce-scatter calls per layer (tables.zero3_reduce_calls)
    # ZeRO 0-1: whether the gradient reduction hides beside the last micro-batch's backward, and
    # the collective that reduces (the stack's: planner/stacks/stack.py:Stack.gradient_reduce)
    reduce_hidden: bool = True
    reduce: Collective = Collective.reduce_scatter
    # hybrid sharding (Layout.dp_shard): `size` is the shard group; each reduction is followed by
    # an all-reduce of its 1 / size share across `replicas` groups, (alpha s, beta s per byte)
    replicas: int = 1
    replica_costs: tuple = (0.0, 0.0)
    # calls as the stack issues them (tables.dp_calls): ZeRO-3 gathers per layer, and the bytes
    # of one bucket of a bucketed reduction (each bucket a call paying the latency; 0: one call)
    gathers: float = 1.0
    bucket_bytes: float = 0.0
    grad_scale: float = 1.0  # gradient bytes on the wire per parameter byte (2: an fp32 reduce of 16-bit weights)

    @staticmethod
    def of(pc: LayoutTables) -> "DataParallel":
        size = pc.shard_size or pc.dp
        replica = pc.replica_link
        return _data_parallel(
            pc.dp_link if size > 1 else None,
            size,
            pc.zero_stage,
            pc.overlap,
            pc.comm_bytes_per_param,
            pc.layer.params * pc.comm_bytes_per_param,
            (pc.zero3_reduce_calls_per_layer, pc.zero3_gathers_per_layer, pc.reduce_bucket_bytes, pc.grad_wire_scale),
            pc.gradient_reduce_hidden,
            pc.gradient_reduce,
            (replica.size, replica.coefficients(Collective.all_reduce)) if replica is not None else (1, (0.0, 0.0)),
        )

    @property
    def width(self) -> int:
        """Ranks holding the same weights: the shard group times its replicas."""
        return self.size * self.replicas

    def collective(self, c: Collective, nbytes: Linear) -> Linear:
        """A bucketed stream moving `nbytes`: the latency paid once per bucket (bucket_bytes; at
        least once), the bytes at the link's bandwidth."""
        alpha, beta = self.costs[_DP_COLLECTIVES.index(c)]
        per_byte = beta + (alpha / self.bucket_bytes if self.bucket_bytes else 0.0)
        return nbytes.scaled(per_byte).plus(alpha)

    def reduction(self, c: Collective, nbytes: Linear, calls: float = 0.0) -> Linear:
        """A gradient reduction of `nbytes` in the shard group (one call, or `calls` per layer), then,
        hybrid, the all-reduce of each rank's share across the replicas (FSDP2 HSDP, MiCS, Megatron's
        optimizer instances: reduce-scatter within, all-reduce across)."""
        out = self.per_layer_calls(c, nbytes, calls) if calls else self.collective(c, nbytes)
        if self.replicas > 1:
            alpha, beta = self.replica_costs
            if calls:
                out = out + nbytes.scaled(beta / self.size) + Linear.per_layer(0.0, alpha * calls)
            else:  # one all-reduce per bucket of the shard
                per_call = alpha / self.bucket_bytes if self.bucket_bytes else 0.0
                out = out + nbytes.scaled(beta / self.size + per_call).plus(alpha)
        return out

    def per_layer_calls(self, c: Collective, nbytes: Linear, calls: float = 1.0) -> Linear:
        """`calls` calls per layer moving `nbytes` in all: the latency is paid that often per layer."""
        alpha, beta = self.costs[_DP_COLLECTIVES.index(c)]
        return nbytes.scaled(beta) + Linear.per_layer(0.0, alpha * calls)

    def time(self, c: Collective, nbytes: float) -> float:
        alpha, beta = self.costs[_DP_COLLECTIVES.index(c)]
        return alpha + beta * nbytes

    def reduction_time(self, c: Collective, nbytes: float) -> float:
        """:meth:`reduction` of one call of `nbytes`, in seconds."""
        alpha, beta = self.replica_costs
        return self.time(c, nbytes) + (alpha + beta * nbytes / self.size if self.replicas > 1 else 0.0)


@lru_cache(maxsize=1 << 14)
def _data_parallel(
    link,
    size: int,
    zero_stage: int,
    efficiency: float,
    bytes_per_param: int,
    layer_bytes: float,
    calls: tuple = (1.0, 1.0, 0.0, 1.0),  # (reduce_calls, gathers, bucket_bytes, grad_scale) of DataParallel
    reduce_hidden: bool = True,
    reduce: Collective = Collective.reduce_scatter,
    replica: tuple = (1, (0.0, 0.0)),  # (replicas, the all-reduce's (alpha, beta) across them)
) -> DataParallel:
    """One DataParallel per setting (links are shared between layouts of one search)."""
    costs = (
        tuple(link.coefficients(c) for c in _DP_COLLECTIVES)
        if link is not None
        else ((0.0, 0.0),) * len(_DP_COLLECTIVES)
    )
    return DataParallel(
        size,
        zero_stage,
        efficiency,
        bytes_per_param,
        layer_bytes,
        costs,
        calls[0],
        reduce_hidden,
        reduce,
        *replica,
        *calls[1:],
    )


def dp_exposure(dp: DataParallel, params: Linear, forward: Linear, time: Linear) -> Exposure:
    """Exposed DP / ZeRO communication of a rank holding `params` parameters whose
    micro-batch takes `time`, `forward` of it in forward (all three linear in its counts).

    DDP: the bucketed gradient all-reduce overlaps the last micro-batch's backward, except
    the last bucket. ZeRO-1 (Megatron's distributed optimizer): gradients accumulate in a
    full buffer and are reduce-scattered once the same way; the parameter all-gather after
    the optimizer step is exposed. A stack that reduces after backward instead (DeepSpeed at
    ZeRO-0, and its pipeline engine: DataParallel.reduce_hidden) exposes the whole reduction,
    an all-reduce where it reduces whole gradients (DataParallel.reduce). ZeRO-2 keeps only its gradient shard, so it
    reduce-scatters after every micro-batch's backward (DeepSpeed stage 2, FSDP
    SHARD_GRAD_OP) and gathers parameters once per step. ZeRO-3 / FSDP gathers every layer
    again in forward and in backward of every micro-batch and reduce-scatters its
    gradients, one collective per layer (each paying the group's latency, which grows with
    the group: communication.GroupLink.step_latency_us); prefetching one layer ahead hides
    them behind the neighbouring layers' compute, except the first layer's gather in forward
    and the first gather and last reduce-scatter in backward (Rajbhandari et al. 2020, sec. 5;
    PyTorch FSDP, Zhao et al. 2023, sec. 3.3). Identical layers make the per-layer overlap
    max(0, comm - compute) summed over layers equal to the rank's total one.

    What hides is slowed: compute that runs beside a collective loses a fraction
    1 - efficiency of its speed (SMs and memory bandwidth taken by the communication
    kernels), which is what `efficiency` < 1 charges (communication.overlapped)."""
    if dp.width <= 1:
        return NO_EXPOSURE
    eta = dp.efficiency
    param_bytes = params.scaled(dp.bytes_per_param)
    grad_bytes = params.scaled(dp.bytes_per_param * dp.grad_scale)
    backward = time - forward
    rsc = Collective.reduce_scatter

    last_bucket = dp.bucket_bytes or GRADIENT_BUCKET_BYTES

    def bucketed(c: Collective) -> Hidden:
        return Hidden(
            dp.reduction(c, grad_bytes), dp.reduction_time(c, last_bucket), backward, eta, grad_bytes, last_bucket
        )

    def reduced(c: Collective):
        return bucketed(c) if dp.reduce_hidden else dp.reduction(c, grad_bytes)

    ag = dp.collective(Collective.all_gather, param_bytes)
    if dp.zero_stage == 0:
        return Exposure((), (reduced(Collective.all_reduce),))
    if dp.zero_stage == 1:
        return Exposure((), (reduced(dp.reduce), ag))
    if dp.zero_stage == 2:  # one reduce-scatter and one gather per layer, as FSDP issues them (plan run's FSDP2)
        rs_calls = dp.reduction(rsc, grad_bytes, 1.0)
        rs = Hidden(rs_calls, dp.reduction_time(rsc, last_bucket), backward, eta, grad_bytes, last_bucket)
        return Exposure((rs,), (dp.per_layer_calls(Collective.all_gather, param_bytes),))
    ag_calls = dp.per_layer_calls(Collective.all_gather, param_bytes, dp.gathers)
    rs_calls = dp.reduction(rsc, grad_bytes, dp.reduce_calls)
    first = dp.time(Collective.all_gather, dp.layer_bytes)
    bucket = dp.layer_bytes / dp.reduce_calls  # the last call's bucket
    last = dp.reduction_time(rsc, bucket)
    if dp.reduce_calls < 1:
        # buckets spanning layers (DeepSpeed's, fewer calls than layers): a rank whose gradients do
        # not fill one reduces them all in that last bucket, after backward; its gathers still hide
        back = Hidden(ag_calls + rs_calls, first + last, backward, eta, grad_bytes, bucket, rs_calls.plus(first))
    else:
        back = Hidden(ag_calls + rs_calls, first + last, backward, eta)
    return Exposure((Hidden(ag_calls, first, forward, eta), back), ())


class LayoutTerms:
    """The cost expressions of one candidate (everything fixed but the layer counts)."""

    def __init__(self, pc: LayoutTables):
        self.pc = pc
        lc, ec = pc.layer, pc.edge
        self.pp, self.vpp, self.num_stages, self.num_layers = pc.pp, pc.vpp, pc.pp * pc.vpp, pc.num_layers
        # Per layer and micro-batch: forward + backward compute, TP collectives, and the extra
        # forward that each recompute mode reruns in backward.
        self.layer_compute = lc.forward + lc.backward
        self.layer_tp = lc.tp_forward + lc.tp_backward
        self.layer_forward = lc.forward + lc.tp_forward
        self.layer_recompute = lc.recompute
        self.layer_params = lc.params
        a = self.layer_compute + self.layer_tp
        self._slope = (a + lc.recompute[0], a + lc.recompute[1], a + lc.recompute[2])
        self.total_params = self.num_layers * lc.params + ec.embedding_params + ec.head_params
        # Memory that does not depend on the split: framework overhead, gathered ZeRO-3 layers.
        self.fixed_bytes = pc.overhead_bytes + pc.zero3_gather_bytes + pc.comm_buffer_bytes
        self._data_parallel: Optional[DataParallel] = None
        self._ranks: Optional[list] = None

    @property
    def data_parallel(self) -> "DataParallel":
        if self._data_parallel is None:
            self._data_parallel = DataParallel.of(self.pc)
        return self._data_parallel

    # ------------------------------------------------------------------ layout rules

    def rank_stages(self, r: int) -> range:
        """Virtual stages of pipeline rank r (stage j runs on rank j % pp)."""
        return range(r, self.num_stages, self.pp)

    def layer_range(self, r: int) -> tuple[int, int]:
        """Fewest and most layers rank r can hold: interleaved model chunks hold L // P
        layers or one more (as even as L allows; equal when P divides L), otherwise every
        stage holds >= 1."""
        L, P = self.num_layers, self.num_stages
        if self.vpp > 1:
            k = len(self.rank_stages(r))
            extra = L % P  # chunks that take one layer more
            return k * (L // P), k * (L // P) + min(k, extra)
        return 1, L - P + 1

    def stage_time_slope(self) -> tuple[float, float, float]:
        """Seconds per micro-batch one layer adds to its stage, per recompute mode: forward +
        backward compute and TP collectives, plus the forward that the mode reruns."""
        return self._slope

    # ------------------------------------------------------------------ time

    def stage_time(self, j: int) -> StageTime:
        """One micro-batch through virtual stage j, excluding per-micro-batch DP exposure."""
        x = self.pc.stage_extras(j)
        compute = Linear.per_layer(x.compute, self.layer_compute)
        recompute = Linear(0.0, self.layer_recompute)
        tp = Linear.per_layer(0.0, self.layer_tp)
        p2p = Linear(x.p2p, (0.0, 0.0, 0.0))
        forward = Linear.per_layer(x.forward, self.layer_forward)
        return StageTime(compute, recompute, tp, p2p, forward, compute + recompute + tp + p2p)

    def stage_constants(self) -> tuple[float, float, float]:
        """The first and last virtual stage's time per micro-batch besides its layers (the
        constant of :meth:`stage_time`'s total), and its sum over all stages, in O(1)
        (tables.py:EdgeCosts.stage_constants)."""
        return self.pc.edge.stage_constants(self.num_stages)

    def rank_params(self, r: int, xs: Optional[list] = None) -> Linear:
        """Parameters on rank r (its stages' extras `xs`, when the caller has them)."""
        xs = xs if xs is not None else [self.pc.stage_extras(j) for j in self.rank_stages(r)]
        return Linear.per_layer(sum(x.params for x in xs), self.layer_params)

    def optimizer_time(self, params: Linear) -> Linear:
        """The update of the local shard of `params` (memory-bound) and the stack's host time
        per step (StackConstants.step_overhead_s): once per step."""
        return params.scaled(self.pc.optimizer_seconds_per_param).plus(self.pc.step_overhead_s)

    def states_bytes(self, params: float) -> float:
        """Model states (weights, gradients, optimizer, after ZeRO) of `params` parameters
        plus the fixed bytes: what a rank holding them needs before any activation."""
        per = self.pc.state_bytes_per_param
        if self.pc.layer.expert_params:  # a floor when some of them are experts, sharded otherwise
            per = tuple(min(k, ke) for k, ke in zip(per, self.pc.expert_state_bytes_per_param))
        return sum(per) * params + self.fixed_bytes

    # ------------------------------------------------------------------ data parallel

    def exposure(self, params: Linear, forward: Linear, time: Linear) -> Exposure:
        """Exposed DP / ZeRO communication of a rank of this layout (:func:`dp_exposure`)."""
        return dp_exposure(self.data_parallel, params, forward, time)

    # ------------------------------------------------------------------ memory

    def rank_memory(self, r: int, xs: Optional[list] = None, params: Optional[Linear] = None) -> RankMemory:
        """Rank r's memory (its stages' extras `xs` and parameters, when the caller has them)."""
        pc = self.pc
        xs = xs if xs is not None else [pc.stage_extras(j) for j in self.rank_stages(r)]
        params = params if params is not None else self.rank_params(r, xs)
        w, g, o = (params.scaled(k) for k in pc.state_bytes_per_param)
        if pc.layer.expert_params:  # routed experts: ZeRO over the expert-DP group, not dp
            extra = sum(x.expert_params for x in xs)  # the stages' own (multi-token prediction's layers)
            w, g, o = (
                x + Linear(extra * (ke - k), (pc.layer.expert_params * (ke - k),) * 3)
                for x, k, ke in zip((w, g, o), pc.state_bytes_per_param, pc.expert_state_bytes_per_param)
            )
        f = pc.in_flight[r]
        acts = Linear(f * sum(x.activation_bytes for x in xs), tuple(f * a for a in pc.layer.activation_bytes))
        fixed = self.fixed_bytes
        return RankMemory(
            weights=w,
            gradients=g,
            optimizer=o,
            activations=acts,
            fixed=fixed,
            overhead=pc.overhead_bytes,
            temporary=tuple(x.temporary_bytes for x in xs),
            full_recompute_buffer=pc.layer.activation_bytes[0],
            linear=(w + g + o + acts).plus(fixed),
        )

    # ------------------------------------------------------------------ per rank, all together

    def ranks(self) -> list["RankTerms"]:
        if self._ranks is None:
            exposures: dict = {}  # the middle ranks' equal terms have equal exposure: priced once
            self._ranks = [self._rank(r, exposures) for r in range(self.pp)]
        return self._ranks

    def _rank(self, r: int, exposures: Optional[dict] = None) -> "RankTerms":
        # The rank's stages share their per-layer slopes: in the rank's summed counts, its
        # time is the sum of the stages' constants (stage_time(j).total.const) plus one slope.
        xs = [self.pc.stage_extras(j) for j in self.rank_stages(r)]
        time = Linear(sum(x.constant for x in xs), self.stage_time_slope())
        forward = Linear.per_layer(sum(x.forward for x in xs), self.layer_forward)
        params = self.rank_params(r, xs)
        key = (time.const, time.slope, forward.const, forward.slope, params.const, params.slope)
        exposure = exposures.get(key) if exposures is not None else None
        if exposure is None:
            exposure = self.exposure(params, forward, time)
            if exposures is not None:
                exposures[key] = exposure
        return RankTerms(
            self,
            r,
            time,
            forward,
            params,
            exposure,
            self.optimizer_time(params),
            self.rank_memory(r, xs, params),
        )


class RankTerms:
    """Every cost expression of one pipeline rank (counts: the rank's summed counts, except
    `stages`, which take each stage's own)."""

    def __init__(
        self,
        layout: LayoutTerms,
        rank: int,
        time: Linear,
        forward: Linear,
        params: Linear,
        exposure: Exposure,
        optimizer: Linear,
        memory: RankMemory,
    ):
        self._layout = layout
        self.rank = rank
        self.time = time  # one micro-batch through all its stages (the sum of the stage totals)
        self.forward = forward  # its forward part
        self.params = params
        self.exposure = exposure
        self.optimizer = optimizer  # the update of its parameter shard, once per step
        self.memory = memory

    @cached_property
    def stages(self) -> tuple:
        """StageTime of each of its virtual stages, in pipeline order (built when asked: the
        bounds need only the rank's sums)."""
        return tuple(self._layout.stage_time(j) for j in self._layout.rank_stages(self.rank))
