"""Every cost of one candidate layout, stated once, per pipeline rank, as expressions linear in
that rank's layer counts per recompute mode.

A candidate (cost_models/tables.py:PipelineCosts) fixes everything but how many layers each
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
from functools import lru_cache
from typing import TYPE_CHECKING, Optional

from planner.specs import Collective, Recompute

from .communication import overlapped

if TYPE_CHECKING:  # pragma: no cover
    from .tables import PipelineCosts

MODES = (Recompute.none, Recompute.selective, Recompute.full)
GRADIENT_BUCKET_BYTES = 25 * 2**20  # PyTorch DDP's default bucket_cap_mb=25


@dataclass(frozen=True)
class Linear:
    """const + sum_i slope[i] x n_i, with n_i the layers under recompute mode MODES[i]."""

    const: float
    slope: tuple[float, float, float]

    def __call__(self, counts) -> float:
        s, n = self.slope, counts
        return self.const + s[0] * n[0] + s[1] * n[1] + s[2] * n[2]

    def __add__(self, other: "Linear") -> "Linear":
        return Linear(self.const + other.const, tuple(a + b for a, b in zip(self.slope, other.slope)))

    def __sub__(self, other: "Linear") -> "Linear":
        return Linear(self.const - other.const, tuple(a - b for a, b in zip(self.slope, other.slope)))

    def scaled(self, k: float) -> "Linear":
        return Linear(k * self.const, tuple(k * a for a in self.slope))

    def plus(self, c: float) -> "Linear":
        return Linear(self.const + c, self.slope)

    @staticmethod
    def per_layer(const: float, per_layer: float) -> "Linear":
        """The same slope for every recompute mode."""
        return Linear(const, (per_layer, per_layer, per_layer))


@dataclass(frozen=True)
class Hidden:
    """Communication `comm` that runs beside compute `window`, except a piece `edge` (the last
    gradient bucket, the first layer's gather) that can never hide, when a fraction
    `efficiency` of the rest actually hides (communication.overlapped):
        exposed = max((1 - eta) comm + eta edge,  comm - eta window).
    Gradient-bucket switch: when `bucket_bytes` (the rank's gradient bytes) is below one
    bucket, everything goes in that one last bucket and nothing hides: exposed = comm."""

    comm: Linear
    edge: float
    window: Linear
    efficiency: float
    bucket_bytes: Optional[Linear] = None

    def bucket_full(self, counts) -> bool:
        return self.bucket_bytes is None or self.bucket_bytes(counts) >= GRADIENT_BUCKET_BYTES

    def __call__(self, counts, bucket_full: Optional[bool] = None) -> float:
        comm = self.comm(counts)
        full = self.bucket_full(counts) if bucket_full is None else bucket_full
        return overlapped(comm, self.edge if full else comm, self.window(counts), self.efficiency)

    def never_hidden(self, counts, bucket_full: Optional[bool] = None) -> float:
        """What stays exposed however long the window: nondecreasing in the counts."""
        comm = self.comm(counts)
        full = self.bucket_full(counts) if bucket_full is None else bucket_full
        return overlapped(comm, self.edge if full else comm, float("inf"), self.efficiency)

    def window_piece(self) -> Linear:
        return self.comm - self.window.scaled(self.efficiency)

    def edge_piece(self, bucket_full: bool = True) -> Linear:
        """The piece that does not depend on the window (edge <= comm: every rank holds a layer)."""
        if not bucket_full:
            return self.comm
        return self.comm.scaled(1.0 - self.efficiency).plus(self.efficiency * self.edge)


@dataclass(frozen=True)
class Exposure:
    """Exposed data-parallel communication of one pipeline rank: per micro-batch (added to
    each of the rank's stages, 1/v each) and per step (after the pipeline drains), each the
    sum of its terms."""

    per_micro_batch: tuple
    per_step: tuple

    def values(self, counts) -> tuple[float, float]:
        return sum(t(counts) for t in self.per_micro_batch), sum(t(counts) for t in self.per_step)


NO_EXPOSURE = Exposure((), ())


@dataclass(frozen=True)
class StageTime:
    """One micro-batch through one virtual stage (forward + backward), by cause."""

    compute: Linear  # layers' forward + backward math, embedding / head and loss
    recompute: Linear  # extra forward of recomputed layers
    tp: Linear  # TP collectives on the critical path
    p2p: Linear  # pipeline sends (not overlapped)
    forward: Linear  # the forward part of compute + tp (the window ZeRO-3 gathers hide behind)

    @property
    def total(self) -> Linear:
        return self.compute + self.recompute + self.tp + self.p2p


@dataclass(frozen=True)
class RankMemory:
    """Peak memory of one pipeline rank, bytes: linear parts in the rank's summed counts,
    plus the largest transient buffer over its stages."""

    weights: Linear
    gradients: Linear
    optimizer: Linear
    activations: Linear  # in-flight micro-batches x saved bytes
    fixed: float  # framework overhead + gathered ZeRO-3 layers
    overhead: float  # the framework part of `fixed`
    temporary: tuple  # per stage of the rank: transient bytes (logits on the last stage)
    full_recompute_buffer: float  # one layer's activations, rebuilt in a stage with a fully recomputed layer

    @property
    def states(self) -> Linear:
        return self.weights + self.gradients + self.optimizer

    @property
    def linear(self) -> Linear:
        """Everything but the transient buffer."""
        return (self.states + self.activations).plus(self.fixed)

    def transient(self, stage_counts) -> float:
        """Largest transient buffer of the rank, given each of its stages' counts."""
        return max(
            [t + (self.full_recompute_buffer if c[2] else 0.0) for t, c in zip(self.temporary, stage_counts)] + [0.0]
        )


_DP_COLLECTIVES = (Collective.all_reduce, Collective.all_gather, Collective.reduce_scatter)


@dataclass(frozen=True)
class DataParallel:
    """What a rank's exposed data-parallel communication depends on besides its own counts
    (a value: equal settings of different layouts share their cached bounds)."""

    size: int
    zero_stage: int
    efficiency: float  # fraction of overlappable communication that hides (communication.overlapped)
    bytes_per_param: int  # gradients / gathered parameters on the wire
    first_gather: float  # seconds: ZeRO-3's all-gather of the first layer, never hidden
    costs: tuple  # (alpha s, beta s per byte) of all-reduce, all-gather, reduce-scatter on the DP link

    @staticmethod
    def of(pc: "PipelineCosts") -> "DataParallel":
        costs = _link_costs(pc.dp_link) if pc.dp > 1 else ((0.0, 0.0),) * len(_DP_COLLECTIVES)
        return DataParallel(pc.dp, pc.zero_stage, pc.overlap, pc.comm_bytes_per_param, pc.zero3_first_gather, costs)

    def collective(self, c: Collective, nbytes: Linear) -> Linear:
        alpha, beta = self.costs[_DP_COLLECTIVES.index(c)]
        return nbytes.scaled(beta).plus(alpha)

    def time(self, c: Collective, nbytes: float) -> float:
        alpha, beta = self.costs[_DP_COLLECTIVES.index(c)]
        return alpha + beta * nbytes


@lru_cache(maxsize=1 << 12)
def _link_costs(link) -> tuple:
    """(alpha, beta) of the DP collectives on one link (links are shared between layouts)."""
    return tuple(link.coefficients(c) for c in _DP_COLLECTIVES)


def dp_exposure(dp: DataParallel, params: Linear, forward: Linear, time: Linear) -> Exposure:
    """Exposed DP / ZeRO communication of a rank holding `params` parameters whose
    micro-batch takes `time`, `forward` of it in forward (all three linear in its counts).

    DDP: the bucketed gradient all-reduce overlaps the last micro-batch's backward, except
    the last bucket. ZeRO-1 (Megatron's distributed optimizer): gradients accumulate in a
    full buffer and are reduce-scattered once the same way; the parameter all-gather after
    the optimizer step is exposed. ZeRO-2 keeps only its gradient shard, so it
    reduce-scatters after every micro-batch's backward (DeepSpeed stage 2, FSDP
    SHARD_GRAD_OP) and gathers parameters once per step. ZeRO-3 / FSDP gathers every layer
    again in forward and in backward of every micro-batch and reduce-scatters its
    gradients; prefetching hides them behind the previous layer's compute, except the first
    layer's gather (Rajbhandari et al. 2020, sec. 5; PyTorch FSDP, Zhao et al. 2023, sec. 3.3)."""
    if dp.size <= 1:
        return NO_EXPOSURE
    eta = dp.efficiency
    grad_bytes = params.scaled(dp.bytes_per_param)
    backward = time - forward

    def bucketed(c: Collective) -> Hidden:
        return Hidden(dp.collective(c, grad_bytes), dp.time(c, GRADIENT_BUCKET_BYTES), backward, eta, grad_bytes)

    ag, rs = dp.collective(Collective.all_gather, grad_bytes), dp.collective(Collective.reduce_scatter, grad_bytes)
    if dp.zero_stage == 0:
        return Exposure((), (bucketed(Collective.all_reduce),))
    if dp.zero_stage == 1:
        return Exposure((), (bucketed(Collective.reduce_scatter), ag))
    if dp.zero_stage == 2:
        return Exposure((bucketed(Collective.reduce_scatter),), (ag,))
    first = dp.first_gather
    return Exposure((Hidden(ag, first, forward, eta), Hidden(ag + rs, first, backward, eta)), ())


class LayoutTerms:
    """The cost expressions of one candidate (everything fixed but the layer counts)."""

    def __init__(self, pc: "PipelineCosts"):
        self.pc = pc
        lc = pc.layer
        self.pp, self.vpp, self.num_stages = pc.pp, pc.vpp, pc.pp * pc.vpp
        self.num_layers = pc.num_layers
        # Per layer and micro-batch: forward + backward compute, TP collectives, and the extra
        # forward that each recompute mode reruns in backward.
        self.layer_compute = lc.forward + lc.backward
        self.layer_tp = lc.tp_forward + lc.tp_backward
        self.layer_forward = lc.forward + lc.tp_forward
        self.layer_recompute = tuple(lc.recompute)
        self.layer_params = lc.params
        self.data_parallel = DataParallel.of(pc)
        self._ranks: Optional[list] = None
        self._constants: dict = {}

    # ------------------------------------------------------------------ layout rules

    def rank_stages(self, r: int) -> range:
        """Virtual stages of pipeline rank r (stage j runs on rank j % pp)."""
        return range(r, self.num_stages, self.pp)

    def layer_range(self, r: int) -> tuple[int, int]:
        """Fewest and most layers rank r can hold: interleaved model chunks are equal
        (L / (pp v) layers each, Megatron-LM's rule); otherwise every stage holds >= 1."""
        L, P = self.num_layers, self.num_stages
        if self.vpp > 1:
            n = len(self.rank_stages(r)) * (L // P)
            return n, n
        return 1, L - P + 1

    @property
    def total_params(self) -> float:
        """Parameters of the whole model on one TP rank (before ZeRO)."""
        ec = self.pc.edge
        return self.num_layers * self.layer_params + ec.embedding_params + ec.head_params

    def stage_time_slope(self) -> tuple[float, float, float]:
        """Seconds per micro-batch one layer adds to its stage, per recompute mode."""
        a = self.layer_compute + self.layer_tp
        return tuple(a + rec for rec in self.layer_recompute)

    # ------------------------------------------------------------------ time

    def stage_constant(self, j: int) -> float:
        """What virtual stage j's micro-batch time carries besides its layers (embedding,
        head and loss, sends): the constant of :meth:`stage_time`'s total."""
        c = self._constants.get(j)
        if c is None:
            x = self.pc.stage_extras(j)
            c = self._constants[j] = x.compute + x.p2p
        return c

    def stage_time(self, j: int) -> StageTime:
        """One micro-batch through virtual stage j, excluding per-micro-batch DP exposure."""
        x = self.pc.stage_extras(j)
        return StageTime(
            compute=Linear.per_layer(x.compute, self.layer_compute),
            recompute=Linear(0.0, self.layer_recompute),
            tp=Linear.per_layer(0.0, self.layer_tp),
            p2p=Linear(x.p2p, (0.0, 0.0, 0.0)),
            forward=Linear.per_layer(x.forward, self.layer_forward),
        )

    def stage_constants_sum(self) -> float:
        """Sum over all virtual stages of what they carry besides layers, in O(1): the middle
        stages carry only their two sends each."""
        P = self.num_stages
        ends = self.stage_constant(0) + (self.stage_constant(P - 1) if P > 1 else 0.0)
        return ends + (P - 2) * self.stage_constant(1) if P > 2 else ends

    def rank_params(self, r: int) -> Linear:
        return Linear.per_layer(sum(self.pc.stage_extras(j).params for j in self.rank_stages(r)), self.layer_params)

    def optimizer_time(self, params: Linear) -> Linear:
        """The update of the local shard of `params`: memory-bound, once per step."""
        return params.scaled(self.pc.optimizer_seconds_per_param)

    # ------------------------------------------------------------------ data parallel

    def exposure(self, params: Linear, forward: Linear, time: Linear) -> Exposure:
        """Exposed DP / ZeRO communication of a rank of this layout (:func:`dp_exposure`)."""
        return dp_exposure(self.data_parallel, params, forward, time)

    # ------------------------------------------------------------------ memory

    def rank_memory(self, r: int) -> RankMemory:
        pc, stages = self.pc, self.rank_stages(r)
        xs = [pc.stage_extras(j) for j in stages]
        params = self.rank_params(r)
        w, g, o = (params.scaled(k) for k in pc.state_bytes_per_param)
        f = pc.in_flight[r]
        acts = Linear(f * sum(x.activation_bytes for x in xs), tuple(f * a for a in pc.layer.activation_bytes))
        return RankMemory(
            weights=w, gradients=g, optimizer=o, activations=acts,
            fixed=pc.overhead_bytes + pc.zero3_gather_bytes, overhead=pc.overhead_bytes,
            temporary=tuple(x.temporary_bytes for x in xs),
            full_recompute_buffer=pc.layer.activation_bytes[0],
        )

    # ------------------------------------------------------------------ per rank, all together

    def ranks(self) -> list["RankTerms"]:
        if self._ranks is None:
            self._ranks = [self._rank(r) for r in range(self.pp)]
        return self._ranks

    def _rank(self, r: int) -> "RankTerms":
        stages = tuple(self.stage_time(j) for j in self.rank_stages(r))
        # The rank's stages share their per-layer slopes: in the rank's summed counts, its
        # time is the sum of the stages' constants plus one slope.
        time = Linear(sum(s.total.const for s in stages), self.stage_time_slope())
        forward = Linear.per_layer(sum(s.forward.const for s in stages), self.layer_forward)
        params = self.rank_params(r)
        return RankTerms(
            rank=r, stages=stages, time=time, forward=forward, params=params,
            exposure=self.exposure(params, forward, time), optimizer=self.optimizer_time(params),
            memory=self.rank_memory(r),
        )


@dataclass(frozen=True)
class RankTerms:
    """Every cost expression of one pipeline rank (counts: the rank's summed counts, except
    `stages`, which take each stage's own)."""

    rank: int
    stages: tuple  # StageTime of each of its virtual stages, in pipeline order
    time: Linear  # one micro-batch through all its stages (sum of the stage totals)
    forward: Linear  # its forward part
    params: Linear
    exposure: Exposure
    optimizer: Linear
    memory: RankMemory
