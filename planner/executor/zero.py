"""ZeRO-1 for tensor-parallel (DTensor) parameters.

torch.distributed.optim.ZeroRedundancyOptimizer shards optimizer state over the
data-parallel group, but it broadcasts parameters with `c10d.broadcast_`, which has no
DTensor sharding strategy (torch 2.13: "Operator c10d.broadcast_.default does not have a
sharding strategy registered"), so it cannot take TP-sharded parameters. This does the same
thing on the local shards: every parameter gets one owner among the dp ranks (greedy by
size, largest first, like ZeroRedundancyOptimizer), only the owner keeps Adam state and
updates it, and each owner then broadcasts its updated parameters to the other dp ranks
in one flat buffer. Gradients are all-reduced in full beforehand (ZeRO-1 shards only the
optimizer state).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from planner.executor.memory import local


class ShardedStateOptimizer:
    """Adam whose state lives on one dp rank per parameter; see the module docstring."""

    def __init__(self, params: list[torch.nn.Parameter], group, lr: float):
        self.params, self.group = params, group
        size, me = dist.get_world_size(group), dist.get_rank(group)
        loads, self.owner = [0] * size, {}
        for p in sorted(params, key=lambda p: -local(p).numel()):
            r = min(range(size), key=loads.__getitem__)
            self.owner[id(p)] = r
            loads[r] += local(p).numel()
        mine = [p for p in params if self.owner[id(p)] == me]
        self.optim = torch.optim.Adam(mine, lr=lr) if mine else None

    @property
    def state(self):
        return self.optim.state if self.optim else {}

    @property
    def param_groups(self):
        return self.optim.param_groups if self.optim else []

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        if self.optim is not None:
            self.optim.step()
        for r in range(dist.get_world_size(self.group)):
            owned = [local(p) for p in self.params if self.owner[id(p)] == r]
            if not owned:
                continue
            flat = torch.cat([t.reshape(-1) for t in owned])
            dist.broadcast(flat, src=dist.get_global_rank(self.group, r), group=self.group)
            offset = 0
            for t in owned:
                t.copy_(flat[offset : offset + t.numel()].view_as(t))
                offset += t.numel()
