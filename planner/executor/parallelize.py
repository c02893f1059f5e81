"""Lay a plan onto torch.distributed: short ordered steps that read only the plan.

    build_mesh -> split_pipeline -> apply_context_parallel (context.py) -> apply_expert_parallel (experts.py)
               -> apply_tensor_parallel -> apply_recompute -> apply_data_parallel -> build_optimizer
               -> build_schedule

Every rank builds the full model from the same seed (so it equals the single-process
reference bit for bit), keeps its pipeline stages and shards them. Why this order:
- The pipeline split comes first so a rank shards only the layers it keeps.
- Context parallelism only marks the embedding and attention layers (positions, ring
  attention): it changes no parameter, so any order before the wrappers would do; data
  parallelism then spans dp x cp (replica_mesh), every rank of which holds the same weights.
- Expert parallelism (experts.py) before data parallelism: DDP must be told which
  parameters differ between ranks (each keeps its own experts), and ZeRO-1 shards the
  experts' optimizer state over their own group.
- Tensor parallelism before data parallelism: FSDP2 must see the TP DTensors to shard
  them a second time over dp (2-D parameters); DDP cannot wrap DTensors at all, so with
  tp > 1 ZeRO-0/1 use composable `replicate` (FSDP2's replicated sibling) instead.
- Hybrid sharding (Plan.dp_shard) splits the mesh's dp dimension in two, replicas outside
  the shard group (shard_mesh): ZeRO-2/3 are FSDP2 on the 2-D (replicas, shard group) mesh,
  which is HSDP; ZeRO-1 averages gradients over all of dp x cp like ZeRO-0 and shards the
  optimizer state within the shard group.
- Recompute is a per-block flag read in forward; setting it before FSDP2 replaces the
  block classes keeps the flag where the blocks' code reads it.
- PipelineStage wraps the data-parallel module last, so the schedule drives DDP's
  no_sync / FSDP2's gradient sync across micro-batches itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    ParallelStyle,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from planner.distributed.reference_model import MLP, Block, ReferenceModel, StageModule
from planner.executor.experts import ExpertParallel, OptimizerSet, expert_parameter_names
from planner.specs import ModelSpec, Plan, Recompute, Schedule


@dataclass(frozen=True)
class RankPlace:
    """Where this rank sits on the mesh."""

    dp: int
    tp: int
    pp: int
    stages: tuple[int, ...]  # virtual pipeline stages this rank runs
    cp: int = 0  # position in the context-parallel group


REPLICAS = "dp_cp"  # the flattened dp x cp dimension of a mesh with context parallelism
SHARD_GROUP = "dp_shard_cp"  # the flattened dp_shard x cp dimension (hybrid sharding with context parallelism)


def hybrid(plan: Plan) -> bool:
    """ZeRO shards within groups of dp_shard x cp ranks, replicated dp / dp_shard times."""
    return plan.layout.replicas > 1


def dp_dims(plan: Plan) -> list[tuple[str, int]]:
    """(name, degree) of the mesh dimensions that make up dp x cp, outermost first: dp, or
    dp_replicate x dp_shard with hybrid sharding (a replica's shard group is dp_shard
    consecutive dp ranks, torchtitan's names), then cp (placement's layout: cp innermost)."""
    layout = plan.layout
    dims = [("dp_replicate", layout.replicas), ("dp_shard", layout.shard_dp)] if hybrid(plan) else [("dp", plan.dp)]
    return dims + ([("cp", plan.cp)] if plan.cp > 1 else [])


def mesh_dims(plan: Plan) -> list[tuple[str, int]]:
    """(name, degree) of each mesh dimension, outermost first: the plan's mesh_order lists axes
    innermost first (consecutive ranks) and init_device_mesh's last dimension varies fastest,
    so reversed; the dp axis is dp_dims (with cp right inside dp: planner/pictures.py:placement's layout)."""
    degree = {"tp": plan.tp, "pp": plan.pp}
    dims: list[tuple[str, int]] = []
    for axis in reversed(plan.mesh_order):
        dims += dp_dims(plan) if axis.value == "dp" else [(axis.value, degree[axis.value])]
    return dims


def build_mesh(plan: Plan, device_type: str) -> DeviceMesh:
    """A 3-D mesh (a dimension more for each of context parallelism and hybrid sharding; the
    dimensions of dp x cp and of a shard group also flattened: replica_mesh, shard_mesh)."""
    names, sizes = zip(*mesh_dims(plan))
    mesh = init_device_mesh(device_type, sizes, mesh_dim_names=names)
    replica_mesh(mesh, plan)  # the flattened groups are made now, by every rank together
    shard_mesh(mesh, plan)
    return mesh


def _flat(mesh: DeviceMesh, names: list[str], flat_name: str) -> DeviceMesh:
    """The named dimensions as one: flattened once, then the root mesh's copy (torch 2.13
    warns that slicing a flattened dimension out of the root will go)."""
    return mesh[names[0]] if len(names) == 1 else mesh[tuple(names)]._flatten(flat_name)


def replica_mesh(mesh: DeviceMesh, plan: Plan) -> DeviceMesh:
    """The ranks holding the same weights, over which gradients are averaged: dp, or dp x cp
    with context parallelism."""
    return _flat(mesh, [name for name, _ in dp_dims(plan)], REPLICAS if plan.cp > 1 else "dp")


def shard_mesh(mesh: DeviceMesh, plan: Plan) -> DeviceMesh:
    """The ranks over which ZeRO shards the model states: the replica mesh, or with hybrid
    sharding the dp_shard x cp innermost of its ranks (a shard group)."""
    if not hybrid(plan):
        return replica_mesh(mesh, plan)
    return _flat(mesh, ["dp_shard", "cp"] if plan.cp > 1 else ["dp_shard"], SHARD_GROUP)


def fsdp_mesh(mesh: DeviceMesh, plan: Plan) -> DeviceMesh:
    """FSDP2's mesh: 1-D (shard over every replica), or (replicas, shard group) for hybrid
    sharding, which fully_shard runs as HSDP: it shards over the last dimension, replicates
    over the first (reduce-scatter in the group, then all-reduce across the replicas)."""
    if not hybrid(plan):
        return replica_mesh(mesh, plan)
    return DeviceMesh._concatenate([mesh["dp_replicate"], shard_mesh(mesh, plan)])


def place(mesh: DeviceMesh, plan: Plan) -> RankPlace:
    tp, pp = (mesh[a].get_local_rank() for a in ("tp", "pp"))
    if hybrid(plan):
        dp = mesh["dp_replicate"].get_local_rank() * plan.layout.shard_dp + mesh["dp_shard"].get_local_rank()
    else:
        dp = mesh["dp"].get_local_rank()
    cp = mesh["cp"].get_local_rank() if plan.cp > 1 else 0
    return RankPlace(dp, tp, pp, tuple(j for j in range(plan.virtual_stages) if j % plan.pp == pp), cp)


def stage_bounds(plan: Plan, num_layers: int) -> list[tuple[int, int]]:
    """[first, last) layer of every virtual stage, in pipeline order."""
    bounds, start = [], 0
    for n in plan.stage_layers(num_layers):
        bounds.append((start, start + n))
        start += n
    return bounds


def split_pipeline(model: ReferenceModel, plan: Plan, stages: tuple[int, ...]) -> dict[int, StageModule]:
    """This rank's virtual stages with the plan's exact layer split (stage j on rank j % pp;
    interleaved ranks hold several). The embedding goes to stage 0, the head to the last."""
    bounds, last = stage_bounds(plan, model.spec.num_layers), plan.virtual_stages - 1
    return {j: StageModule(model, *bounds[j], is_first=j == 0, is_last=j == last) for j in stages}


def _block_tp_plan(block: nn.Module, sequence_parallel: bool) -> dict:
    """Megatron's layout: q, k, v and the first MLP matrices column-parallel (heads and FFN
    split), the output projections row-parallel (one all-reduce each, or a reduce-scatter to
    sequence shards with SP, where the norms then run on sequence shards)."""
    mlp = block.mlp
    assert isinstance(mlp, MLP)  # plan run refuses TP in MoE layers (planner/executor/prepare.py)
    cols = ["mlp.gate", "mlp.up"] if mlp.swiglu else ["mlp.fc1"]
    row_mlp = "mlp.down" if mlp.swiglu else "mlp.fc2"
    out = Shard(1) if sequence_parallel else Replicate()
    tp_plan: dict[str, ParallelStyle] = {name: ColwiseParallel() for name in ("attn.q", "attn.k", "attn.v", *cols)}
    tp_plan["attn.o"] = RowwiseParallel(output_layouts=out)
    tp_plan[row_mlp] = RowwiseParallel(output_layouts=out)
    if sequence_parallel:
        # use_local_output=True: the blocks' code works on plain tensors (seen with torch 2.13
        # on CPU: with the default False the first block fails with "mixed torch.Tensor and DTensor").
        gather = PrepareModuleInput(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=True
        )
        tp_plan.update({"norm1": SequenceParallel(), "norm2": SequenceParallel(), "attn": gather, "mlp": gather})
    return tp_plan


def apply_tensor_parallel(stage: StageModule, tp_mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """Shard every block, the embedding (vocabulary rows) and the LM head (vocabulary
    columns, logits gathered so the loss sees all of them) over the TP group."""
    for block in stage.layers:
        parallelize_module(block, tp_mesh, _block_tp_plan(block, sequence_parallel))
    tied = stage.embed is not None and stage.head is not None and stage.head.output.weight is stage.embed.tok.weight
    if stage.embed is not None:
        parallelize_module(
            stage.embed, tp_mesh, {"tok": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())}
        )
        if sequence_parallel:
            # Token + position embeddings are summed replicated, then each rank keeps its
            # sequence shard (a slice; its backward all-gathers the gradient).
            parallelize_module(
                stage.embed,
                tp_mesh,
                PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(1), use_local_output=True),
            )
    if stage.head is not None:
        head_plan: dict[str, ParallelStyle] = {
            "output": ColwiseParallel(
                input_layouts=Shard(1) if sequence_parallel else Replicate(), output_layouts=Replicate()
            )
        }
        if sequence_parallel:
            head_plan["norm"] = SequenceParallel()
        parallelize_module(stage.head, tp_mesh, head_plan)
    if tied:
        assert stage.head is not None and stage.embed is not None  # `tied` says both are here
        # Both shard the vocabulary dimension (Shard(0)) on the same mesh: share one DTensor.
        stage.head.output.weight = stage.embed.tok.weight


def recompute_modes(counts) -> list[Recompute]:
    """Per layer of a stage, in order: full first, then selective, then none (Megatron's
    'block' method recomputes the first layers of a stage). Memory and time do not depend
    on the order within a stage; the cost model counts layers per mode."""
    return [Recompute.full] * counts.full + [Recompute.selective] * counts.selective + [Recompute.none] * counts.none


def apply_recompute(stages: dict[int, StageModule], plan: Plan, num_layers: int) -> None:
    counts = plan.stage_recompute_counts(num_layers)
    for j, stage in stages.items():
        for block, mode in zip(stage.layers, recompute_modes(counts[j]), strict=True):
            assert isinstance(block, Block)  # a StageModule's layers
            block.set_recompute(mode)


def apply_data_parallel(
    stage: StageModule, plan: Plan, mesh: DeviceMesh, experts: ExpertParallel | None = None
) -> nn.Module:
    """ZeRO-0/1: replicated parameters and gradients (DDP; composable replicate with tp > 1);
    ZeRO-1's optimizer-state sharding is in build_optimizer. ZeRO-2: FSDP2 keeping the
    gathered parameters from forward to backward (reshard_after_forward=False); ZeRO-3: FSDP2
    regathering per block. FSDP2 goes per block, then on the stage (the root). Expert-parallel
    parameters are left out of DDP (ExpertParallel.reduce_gradients reduces them). All of it
    over dp x cp with context parallelism (replica_mesh); with hybrid sharding FSDP2 shards
    within the shard group and replicates across the groups (fsdp_mesh: HSDP)."""
    if plan.dp * plan.cp == 1:
        return stage
    if plan.zero_stage >= 2:
        from torch.distributed.fsdp import fully_shard

        reshard, sharded = plan.zero_stage == 3, fsdp_mesh(mesh, plan)
        for block in stage.layers:
            fully_shard(block, mesh=sharded, reshard_after_forward=reshard)
        fully_shard(stage, mesh=sharded, reshard_after_forward=reshard)
        return stage
    dp_mesh = replica_mesh(mesh, plan)
    if plan.tp == 1:
        from torch.nn.parallel import DistributedDataParallel

        if experts is not None:
            # DDP's (private, since torch 1.8) way to leave parameters alone: no broadcast from
            # rank 0 at construction, no gradient all-reduce.
            DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
                stage, expert_parameter_names(stage, experts)
            )
        # Buffers (rotary tables) are constants: nothing to broadcast each forward.
        return DistributedDataParallel(stage, process_group=dp_mesh.get_group(), broadcast_buffers=False)
    from torch.distributed._composable.replicate_with_fsdp import replicate

    replicate(stage, mesh=dp_mesh)
    return stage


def unique_parameters(modules) -> list[nn.Parameter]:
    seen, out = set(), []
    for m in modules:
        for p in m.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
    return out


def build_optimizer(modules, plan: Plan, mesh: DeviceMesh, lr: float, experts: ExpertParallel | None = None):
    """Adam. ZeRO-1 shards its state over dp: each dp rank updates a share of the
    parameters, then broadcasts them (ZeroRedundancyOptimizer; with tp > 1 our DTensor-aware
    equivalent, zero.py, because ZeroRedundancyOptimizer cannot broadcast DTensors).
    ZeRO-2/3 shard it already: FSDP2's parameters are the shards. With expert parallelism,
    ZeRO-1 shards the expert parameters' state over their expert-data-parallel group only
    (the dp ranks holding the same experts). Over dp x cp with context parallelism, within
    the shard group with hybrid sharding (shard_mesh: every replica of the group updates its
    copy alike, from gradients averaged over all of dp x cp)."""
    params = unique_parameters(modules)
    sharded = shard_mesh(mesh, plan)
    group = sharded.get_group()
    if plan.zero_stage == 1 and sharded.size() > 1 and experts is not None:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        dense = [p for p in params if not experts.holds(p)]
        parts: list[torch.optim.Optimizer] = [
            ZeroRedundancyOptimizer(dense, optimizer_class=torch.optim.Adam, process_group=group, lr=lr)
        ]
        if experts.edp_group is None:
            parts.append(torch.optim.Adam(experts.params, lr=lr))
        else:
            parts.append(
                ZeroRedundancyOptimizer(
                    experts.params, optimizer_class=torch.optim.Adam, process_group=experts.edp_group, lr=lr
                )
            )
        return OptimizerSet(parts)
    if plan.zero_stage == 1 and sharded.size() > 1:
        if plan.tp > 1:
            from planner.executor.zero import ShardedStateOptimizer

            return ShardedStateOptimizer(params, group, lr)
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.Adam, process_group=group, lr=lr)
    return torch.optim.Adam(params, lr=lr)


def stage_io(
    j: int, plan: Plan, spec: ModelSpec, seq_len: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Example input and output of virtual stage j for one micro-batch: token ids into the
    first, logits out of the last, hidden states between (sequence shards with SP); a rank
    holds s / cp tokens of every sequence with context parallelism."""
    b, last = plan.micro_batch_size, plan.virtual_stages - 1
    seq_len //= plan.cp
    hidden = torch.empty(b, seq_len // plan.tp if plan.sequence_parallel else seq_len, spec.hidden_size, device=device)
    # A received hidden state needs a gradient (sent back to the previous stage); token ids do not.
    inp = torch.zeros(b, seq_len, dtype=torch.long, device=device) if j == 0 else hidden.clone().requires_grad_()
    out = torch.empty(b, seq_len, spec.vocab_size, device=device) if j == last else hidden
    return inp, out


def build_schedule(
    stages: dict[int, nn.Module],
    plan: Plan,
    mesh: DeviceMesh,
    device: torch.device,
    loss_fn,
    spec: ModelSpec,
    seq_len: int,
):
    """torch.distributed.pipelining with the plan's schedule and micro-batch count; the
    schedule averages gradients over micro-batches (scale_grads), so they equal the
    gradient of the mean loss over the replica's batch. Stage shapes are given, so the
    first step runs no shape-inference forward (slower, and on the first stage it kept a
    graph of saved tensors alive)."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    group = mesh["pp"].get_group()
    pipe: list[Any] = []  # PipelineStages, which the schedules type as torch's private _PipelineStageBase
    for j, mod in sorted(stages.items()):
        inp, out = stage_io(j, plan, spec, seq_len, device)
        in_grad = None if j == 0 else torch.empty_like(inp)
        out_grad = None if j == plan.virtual_stages - 1 else torch.empty_like(out)
        pipe.append(
            PipelineStage(
                mod,
                j,
                plan.virtual_stages,
                device,
                input_args=inp,
                output_args=out,
                input_grads=in_grad,
                output_grads=out_grad,
                group=group,
            )
        )
    m = plan.num_micro_batches
    if plan.schedule == Schedule.interleaved_1f1b:
        return ScheduleInterleaved1F1B(pipe, m, loss_fn=loss_fn)
    cls = ScheduleGPipe if plan.schedule == Schedule.gpipe else Schedule1F1B
    return cls(pipe[0], m, loss_fn=loss_fn)
