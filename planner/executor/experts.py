"""Expert parallelism: each rank keeps num_experts / ep experts of every MoE layer.

Layout (tp = 1; "parallel folding" with expert-TP 1, the expert groups carved from the dp
ranks of one pipeline rank). Along the dp axis, consecutive dp ranks form an expert-parallel
(EP) group: dp ranks g*ep .. g*ep + ep - 1 exchange tokens, and the one at position
i = dp_rank % ep holds experts i*E/ep .. (i+1)*E/ep - 1. The expert-data-parallel (EDP)
group is the dp ranks holding the same experts, i, i + ep, i + 2ep, ...: dp / ep of them.
This is Megatron-Core's default order (EP inside DP): with tp = 1 and the default mesh order,
the ranks that exchange tokens are neighbours (one node on a real cluster).
With context parallelism, read dp as the dp x cp ranks (cp innermost): each holds its own
tokens and routes them like a replica would.

Forward of an MoE layer on an EP group (MoE.forward in the reference model does the routing):
every rank sorts its token copies by expert, tells every other rank how many it sends to
each of that rank's experts (an all-to-all of counts), sends them (all-to-all of the hidden
states: the dispatch), runs its experts on what arrived, and sends the results back (the
combine). Both hidden-state all-to-alls are differentiable: backward is the reverse
all-to-all (AllToAll below). Dropless routing sends every copy, so the uneven split sizes
change every micro-batch.

Gradients: an expert's gradient collects the loss of every replica of its EP group (through
the combine's backward), and replicas of the other EP groups reach the same experts on the
EDP group. The mean loss over dp replicas therefore needs the sum over the EDP group divided
by dp (reduce_gradients); DDP ignores expert parameters (it would average them with ranks
holding other experts) and keeps the router, attention and shared experts as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh

from planner.distributed.reference_model import MoE, StageModule
from planner.specs import Plan


class AllToAll(torch.autograd.Function):
    """all_to_all_single along dim 0 with uneven splits; backward sends the gradients back
    the way the rows came (the same collective with the split sizes swapped)."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor, receive: list[int], send: list[int], group) -> torch.Tensor:
        ctx.receive, ctx.send, ctx.group = receive, send, group
        return _all_to_all(rows, receive, send, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _all_to_all(grad, ctx.send, ctx.receive, ctx.group), None, None, None


def _all_to_all(rows: torch.Tensor, receive: list[int], send: list[int], group) -> torch.Tensor:
    out = rows.new_empty((sum(receive), *rows.shape[1:]))
    dist.all_to_all_single(out, rows.contiguous(), receive, send, group=group)
    return out


class Exchange:
    """MoE.exchange for one EP group: dispatch token copies to the ranks holding their
    experts, compute there, combine the results back in the caller's order."""

    def __init__(self, group, size: int):
        self.group, self.size = group, size

    def __call__(self, copies: torch.Tensor, counts: torch.Tensor, compute) -> torch.Tensor:
        """`copies` grouped by expert id, counts[e] of them for expert e (all E experts);
        `compute(rows, local_counts)` runs this rank's experts on rows grouped by local expert."""
        local = counts.numel() // self.size
        arriving = torch.empty_like(counts)
        dist.all_to_all_single(arriving, counts, group=self.group)  # E/ep counts to each rank
        arriving = arriving.view(self.size, local)  # [source rank, local expert]
        send = counts.view(self.size, local).sum(1).tolist()
        receive = arriving.sum(1).tolist()
        rows = AllToAll.apply(copies, receive, send, self.group)  # by source rank, then local expert
        expert_of_row = (
            torch.arange(local, device=counts.device).repeat(self.size).repeat_interleave(arriving.reshape(-1))
        )
        by_expert = expert_of_row.argsort(stable=True)
        out = compute(rows[by_expert], arriving.sum(0))
        return AllToAll.apply(out[by_expert.argsort()], send, receive, self.group)


@dataclass
class ExpertParallel:
    """This rank's share of expert parallelism (see the module docstring)."""

    replicas: int  # ranks the loss is averaged over: dp, or dp x cp (each holds s / cp tokens of its sequences)
    edp_group: object  # ranks holding the same experts; None when it is this rank alone
    params: list[nn.Parameter] = field(default_factory=list)  # expert parameters of this rank's stages
    _ids: set = field(default_factory=set)

    def add(self, params) -> None:
        for p in params:
            self.params.append(p)
            self._ids.add(id(p))

    def holds(self, p: torch.Tensor) -> bool:
        return id(p) in self._ids

    @torch.no_grad()
    def reduce_gradients(self) -> None:
        """After the step's backward: sum each expert gradient over the EDP group, then
        divide by the replicas (see the module docstring). A missing gradient counts as zero,
        so every rank of the group reduces the same buffer."""
        grads = []
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        if self.edp_group is not None:
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=self.edp_group)
            offset = 0
            for g in grads:
                g.copy_(flat[offset : offset + g.numel()].view_as(g))
                offset += g.numel()
        for g in grads:
            g.div_(self.replicas)


def expert_groups(mesh: DeviceMesh, plan: Plan) -> tuple[object, object, int]:
    """(EP group, EDP group or None, position in the EP group) of this rank. Every rank
    creates every group, in the same order (torch.distributed.new_group's rule). With context
    parallelism the groups are carved from the dp x cp ranks (cp innermost), as the plan's
    rules (Plan.validate_for: ep divides tp x dp x cp) count them."""
    assert mesh.mesh_dim_names is not None  # planner/executor/parallelize.py:build_mesh names every dimension
    names = list(mesh.mesh_dim_names)
    axes = [names.index(a) for a in ("dp", "cp") if a in names]
    replicas = plan.dp * plan.cp
    table = (
        mesh.mesh.movedim(axes, list(range(-len(axes), 0))).reshape(-1, replicas).tolist()
    )  # a row: one dp x cp group's ranks
    me, ep = dist.get_rank(), plan.ep
    mine: dict = {}
    for row in table:
        for g in range(replicas // ep):
            ranks = row[g * ep : (g + 1) * ep]
            group = dist.new_group(ranks)
            if me in ranks:
                mine["ep"], mine["position"] = group, ranks.index(me)
        for i in range(ep):
            ranks = row[i::ep]
            group = dist.new_group(ranks) if len(ranks) > 1 else None
            if me in ranks:
                mine["edp"] = group
    return mine["ep"], mine["edp"], mine["position"]


def apply_expert_parallel(stages: dict[int, StageModule], plan: Plan, mesh: DeviceMesh) -> ExpertParallel | None:
    """Keep this rank's slice of every MoE layer's experts and give the layer its exchange;
    None when ep = 1 (every rank holds every expert: ordinary replicated parameters)."""
    if plan.ep == 1:
        return None
    ep_group, edp_group, position = expert_groups(mesh, plan)
    layout = ExpertParallel(plan.dp * plan.cp, edp_group)
    for stage in stages.values():
        for block in stage.layers:
            if isinstance(block.mlp, MoE):
                moe = block.mlp
                per_rank = moe.num_experts // plan.ep
                moe.first_expert = position * per_rank
                moe.experts = nn.ModuleList(moe.experts[moe.first_expert : moe.first_expert + per_rank])
                moe.exchange = Exchange(ep_group, plan.ep)
                layout.add(moe.experts.parameters())
    return layout


def expert_parameter_names(module: nn.Module, experts: ExpertParallel) -> list[str]:
    """Qualified names of the expert parameters in `module` (what DDP is told to ignore)."""
    return [name for name, p in module.named_parameters() if experts.holds(p)]


class OptimizerSet:
    """Several optimizers stepped as one (ZeRO-1 with experts: the dense parameters' state
    sharded over dp, the experts' over their EDP group). `state` and `param_groups` are
    this rank's, as memory.py reads them."""

    def __init__(self, optimizers: list):
        self.optimizers = optimizers

    @property
    def state(self) -> dict:
        merged: dict = {}
        for o in self.optimizers:
            merged.update(getattr(o, "optim", o).state)
        return merged

    @property
    def param_groups(self) -> list:
        return [g for o in self.optimizers for g in getattr(o, "optim", o).param_groups]

    def step(self) -> None:
        for o in self.optimizers:
            o.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)
