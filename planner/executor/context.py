"""Context parallelism: each sequence split over the cp ranks of a context-parallel group.

Layout. cp sits innermost inside the plan's dp axis (planner/pictures.py:placement): the mesh
is (..., dp, cp, ...) in the plan's axis order, so the dp x cp ranks holding one replica's
model shard are neighbours along that axis, and cp varies fastest among them. Weights are
replicated over dp x cp; gradients are averaged and ZeRO shards over the flattened dp x cp
dimension (parallelize.replica_mesh); the batch is split over dp only.

Chunking (load-balanced causal attention, as Megatron-Core and torchtitan do it). The
sequence of s tokens is cut into 2 cp chunks of s / (2 cp); CP rank i holds chunks i and
2cp - 1 - i, in that order: one early chunk (few keys before it) and one late chunk (many),
so every rank does the same causal attention work. Token ids, targets and positions (the
learned position table or the rotary angles) are those of the held chunks. Each rank's loss
is the mean over its s / cp tokens of every sequence; every rank holds as many, so the mean
of the ranks' losses over dp x cp is the mean over the global batch, and averaging gradients
over dp x cp gives the gradient of that mean (the attention's backward sends each key/value
gradient to the rank that owns the key/value, see RingAttention).

Attention (ring attention, Liu et al. 2023, "Ring Attention with Blockwise Transformers for
Near-Infinite Context", blockwise softmax as FlashAttention, Dao et al. 2022): each rank keeps
its queries, and the K/V blocks travel round the ring (rank i sends to i + 1 and receives
from i - 1 with point-to-point batch_isend_irecv, which gloo runs), cp - 1 hops; each block's
partial attention is merged into a running output with its log-sum-exp. The causal mask
compares true positions (a key at or before its query), so it is right across chunks. Backward
walks the ring again with the key/value gradients travelling beside their blocks; after the
last hop they reach their owners. Blocks run as plain matrix products in fp32 (the
verification's precision), not a fused kernel: the run checks the arithmetic, the cost model
prices the fused ring.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh

from planner.distributed.reference_model import Attention, Embedding
from planner.specs import Plan


def chunk_positions(seq_len: int, cp: int, cp_rank: int) -> torch.Tensor:
    """Positions (token indices) CP rank `cp_rank` holds: chunks cp_rank and 2cp-1-cp_rank of 2cp."""
    c = seq_len // (2 * cp)
    first, second = cp_rank * c, (2 * cp - 1 - cp_rank) * c
    return torch.cat([torch.arange(first, first + c), torch.arange(second, second + c)])


@dataclass
class ContextParallel:
    """This rank's place in its CP group: what the embedding and attention layers read."""

    group: dist.ProcessGroup  # the CP process group
    size: int  # cp
    rank: int  # position in the CP group
    seq_len: int  # the whole sequence
    device: torch.device
    _positions: dict = field(default_factory=dict)

    def positions_of(self, cp_rank: int) -> torch.Tensor:
        if cp_rank not in self._positions:
            self._positions[cp_rank] = chunk_positions(self.seq_len, self.size, cp_rank).to(self.device)
        return self._positions[cp_rank]

    @property
    def positions(self) -> torch.Tensor:
        return self.positions_of(self.rank)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's tokens of a (batch, seq_len, ...) tensor."""
        return x[:, self.positions]

    def peer(self, offset: int) -> int:
        """Global rank of the CP rank `offset` steps along the ring."""
        return dist.get_global_rank(self.group, (self.rank + offset) % self.size)

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal attention of this rank's queries against every rank's keys; q, k, v are
        (batch, heads, s / cp, head_dim) with as many heads each (KV heads already shared)."""
        return RingAttention.apply(q, k, v, self)


def _exchange(ctx: ContextParallel, send: torch.Tensor) -> tuple[torch.Tensor, list]:
    """Start sending `send` to the next rank of the ring and receiving the previous rank's."""
    recv = torch.empty_like(send)
    ops = [dist.P2POp(dist.isend, send, ctx.peer(1), ctx.group), dist.P2POp(dist.irecv, recv, ctx.peer(-1), ctx.group)]
    return recv, dist.batch_isend_irecv(ops)


def _wait(works: list) -> None:
    for w in works:
        w.wait()


def _scores(q, k, q_pos, k_pos, scale):
    """Scaled scores of a block with the causal mask by true position (-inf where the key is later)."""
    s = torch.matmul(q, k.transpose(-2, -1)) * scale
    return s.masked_fill(k_pos[None, :] > q_pos[:, None], float("-inf"))


class RingAttention(torch.autograd.Function):
    """See the module docstring. Saves q, k, v, the output and its log-sum-exp per query."""

    @staticmethod
    def forward(fctx, q, k, v, ctx: ContextParallel):
        scale, q_pos = 1.0 / math.sqrt(q.shape[-1]), ctx.positions
        kv = torch.stack([k, v]).contiguous()
        out, lse = None, None
        for t in range(ctx.size):  # t = 0: this rank's own block, where every query sees itself
            works: list = []
            if t < ctx.size - 1:
                nxt, works = _exchange(ctx, kv)
            s = _scores(q, kv[0], q_pos, ctx.positions_of((ctx.rank - t) % ctx.size), scale)
            block_lse = torch.logsumexp(s, dim=-1)  # -inf for a query that sees no key of this block
            p = torch.exp(s - torch.where(torch.isinf(block_lse), 0.0, block_lse).unsqueeze(-1))
            block_out = torch.matmul(p, kv[1])
            if out is None:
                out, lse = block_out, block_lse
            else:
                assert lse is not None  # set with out
                new = torch.logaddexp(lse, block_lse)
                out = out * torch.exp(lse - new).unsqueeze(-1) + block_out * torch.exp(block_lse - new).unsqueeze(-1)
                lse = new
            _wait(works)
            if works:
                kv = nxt
        fctx.save_for_backward(q, k, v, out, lse)
        fctx.ring = ctx
        return out

    @staticmethod
    def backward(fctx, dout):
        q, k, v, out, lse = fctx.saved_tensors
        ctx: ContextParallel = fctx.ring
        scale, q_pos = 1.0 / math.sqrt(q.shape[-1]), ctx.positions
        dout = dout.contiguous()
        delta = (dout * out).sum(-1, keepdim=True)  # FlashAttention's D = rowsum(dO * O)
        dq = torch.zeros_like(q)
        kv = torch.stack([k, v]).contiguous()
        dkv = torch.zeros_like(kv)
        for t in range(ctx.size):
            s = _scores(q, kv[0], q_pos, ctx.positions_of((ctx.rank - t) % ctx.size), scale)
            p = torch.exp(s - lse.unsqueeze(-1))  # the softmax's share of this block (0 where masked)
            dp = torch.matmul(dout, kv[1].transpose(-2, -1))
            ds = p * (dp - delta) * scale
            dq += torch.matmul(ds, kv[0])
            dkv[0] += torch.matmul(ds.transpose(-2, -1), q)
            dkv[1] += torch.matmul(p.transpose(-2, -1), dout)
            if t < ctx.size - 1:  # the block moves on with the gradients gathered so far
                both, works = _exchange(ctx, torch.cat([kv, dkv]))
                _wait(works)
                kv, dkv = both[:2], both[2:]
        # After cp - 1 hops this rank holds block rank + 1 with every rank's gradient: home it goes.
        mine, works = _exchange(ctx, dkv)
        _wait(works)
        return dq, mine[0], mine[1], None


def context_group(mesh: DeviceMesh, plan: Plan):
    """(CP process group, position in it) of this rank; None when cp = 1."""
    if plan.cp == 1:
        return None
    cp_mesh = mesh["cp"]
    return cp_mesh.get_group(), cp_mesh.get_local_rank()


def apply_context_parallel(
    stages: Mapping[int, nn.Module], plan: Plan, mesh: DeviceMesh, seq_len: int, device: torch.device
) -> ContextParallel | None:
    """Give every embedding and attention layer of this rank's stages the CP layout; None when cp = 1."""
    if plan.cp == 1:
        return None
    group, cp_rank = context_group(mesh, plan)
    ctx = ContextParallel(group, plan.cp, cp_rank, seq_len, device)
    for stage in stages.values():
        for module in stage.modules():
            if isinstance(module, (Attention, Embedding)):
                module.context = ctx
    return ctx
