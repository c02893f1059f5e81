"""The cost tables of one candidate layout, as data: what one layer (LayerCosts), the first and
last stages (EdgeCosts, StageExtras) and the links cost per micro-batch on one GPU, and the whole
layout's (LayoutTables). cost_models/tables.py builds them; cost_models/terms.py reads them into
linear expressions. Data only, so both can import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Optional

from planner.specs import Collective, Uncertainty

from .communication import GroupLink


@dataclass(frozen=True)
class LayerCosts:
    """One transformer layer, one micro-batch, one GPU of a (micro-batch, tp, sp) choice."""

    forward: float  # compute seconds
    backward: float
    tp_forward: float  # TP collectives on the critical path
    tp_backward: float
    recompute: tuple  # extra backward seconds (compute + comm) per mode (none, selective, full)
    activation_bytes: tuple  # bytes kept per micro-batch per mode (none, selective, full)
    params: int  # parameters on this GPU (TP-sharded, before ZeRO), routed experts included
    flops_forward: float  # whole layer (unsharded), for model FLOPs
    recompute_flops: tuple  # extra FLOPs per mode, whole layer
    expert_params: int = 0  # of `params`, the routed experts (sharded by ZeRO over the expert-DP group)


@dataclass(frozen=True)
class StageExtras:
    """What virtual stage j carries besides its layers, per micro-batch."""

    compute: float  # embedding / head and loss, forward + backward
    forward: float  # the forward part of `compute`
    p2p: float  # pipeline sends
    params: float
    activation_bytes: float
    temporary_bytes: float  # logits on the last stage
    expert_params: float = 0.0  # of `params`, routed experts (multi-token prediction's): ZeRO over expert-DP

    @property
    def constant(self) -> float:
        """Seconds per micro-batch besides the layers: compute + sends."""
        return self.compute + self.p2p


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
    head_expert_params: int = 0  # of head_params, routed experts (multi-token prediction's layers)

    def stage(self, first: bool, last: bool) -> "StageExtras":
        """What a virtual stage carries besides its layers: the first the embedding, the last
        the LM head and loss; each receives an activation and sends one forward, and the
        reverse backward, except at the ends (sends are not overlapped with compute).
        Cached: every layout with these edge costs shares the three kinds of stage."""
        return self._stages[(first, last)]

    def stage_constants(self, num_stages: int) -> tuple[float, float, float]:
        """(first, last, sum over all) of compute + sends of the stages of a pipeline of
        `num_stages` virtual stages besides their layers: the middle ones carry only their
        sends. Cached per pipeline length."""
        c = self._constants.get(num_stages)
        if c is None:
            P = num_stages
            if P == 1:
                first = last = total = self.stage(True, True).constant
            else:
                first, last = self.stage(True, False).constant, self.stage(False, True).constant
                total = first + last + (P - 2) * self.stage(False, False).constant
            c = self._constants[num_stages] = (first, last, total)
        return c

    @cached_property
    def _constants(self) -> dict:
        return {}

    @cached_property
    def _stages(self) -> dict:
        out = {}
        for first in (True, False):
            for last in (True, False):
                comp = fwd = params = acts = temp = expert = 0.0
                if first:
                    comp += self.embedding_forward + self.embedding_backward
                    fwd += self.embedding_forward
                    params += self.embedding_params
                    acts += self.embedding_activation_bytes
                if last:
                    comp += self.head_forward + self.head_backward
                    fwd += self.head_forward
                    params += self.head_params
                    expert = self.head_expert_params
                    acts += self.head_activation_bytes
                    temp = self.logits_temporary_bytes
                out[(first, last)] = StageExtras(
                    comp, fwd, self.p2p * ((not last) + (not first)), params, acts, temp, expert
                )
        return out


@dataclass(eq=False)
class LayoutTables:
    """Everything needed to cost any layer split and recompute choice of one layout: the
    coefficient tables that cost_models/terms.py turns into expressions (tables.py:PipelineCosts
    adds the expressions themselves). Never changed after
    construction (not frozen only because the search builds one per candidate, and a frozen
    dataclass's construction costs three times as much)."""

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
    zero3_gather_bytes: float  # one layer's parameters live beside the shards (memory.live_layer_bytes_per_param)
    comm_buffer_bytes: float  # TP-overlap communication buffers and the stack's gradient-reduction buckets
    tokens_per_step: int
    model_flops_per_step: float
    memory_capacity_gib: float
    peak_flops: float
    uncertainty: Optional[Uncertainty] = None  # the cluster's cross-validated step-time error
    gpipe: bool = False  # all forwards, then all backwards (cost_models/pipeline.py:gpipe_time)
    expert_state_bytes_per_param: tuple = ()  # (weights, gradients, optimizer) of routed experts after ZeRO over expert-DP
    first_stage_min_layers: int = 1  # a MoE model's first dense layers live on the first stage
    zero3_reduce_calls_per_layer: float = (
        1.0  # reduce-scatter calls per layer per micro-batch (ZeRO-3; terms.dp_exposure)
    )
    step_overhead_s: float = 0.0  # the stack's host time per optimizer step (StackConstants.step_overhead_s)
    # ZeRO 0-1 gradient reduction as the stack runs it (Stack.gradient_reduce; terms.dp_exposure)
    gradient_reduce_hidden: bool = True
    gradient_reduce: Collective = Collective.reduce_scatter
    # Hybrid sharding (Layout.dp_shard): ZeRO's group is `shard_size` ranks (dp_shard x cp) on
    # dp_link, and the gradient shards are all-reduced across its replicas on replica_link
    shard_size: int = 0  # 0: all of dp x cp
    replica_link: Optional[GroupLink] = None
    # collectives as the stack issues them (tables.dp_calls; terms.DataParallel)
    zero3_gathers_per_layer: float = 1.0
    reduce_bucket_bytes: float = 0.0
    grad_wire_scale: float = 1.0

    @property
    def num_stages(self) -> int:
        return self.pp * self.vpp

    @property
    def uneven_chunks(self) -> bool:
        """Interleaved model chunks of L // (pp v) layers and one more (cost_models/pipeline.py:
        priced as if each were as slow as the slowest)."""
        return self.vpp > 1 and self.num_layers % self.num_stages != 0

    def stage_extras(self, j: int) -> StageExtras:
        return self.edge.stage(j == 0, j == self.num_stages - 1)
