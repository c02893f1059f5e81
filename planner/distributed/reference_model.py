"""The built-in GPT/Llama-style decoder that `plan profile` measures and `plan run` trains.

Built from any ModelSpec (preset or Hugging Face config.json). Projections are separate
nn.Linear modules (q, k, v, o; fc1/fc2 or gate/up/down) so that tensor parallelism can
shard them with DTensor's ColwiseParallel/RowwiseParallel; attention reshapes with the
*local* head count (`view(B, T, -1, head_dim)`), so a TP-sharded block runs unchanged.
Dropout is left out (p = 0) so that a distributed run can be checked against a
single-process one bit for bit up to reduction order.

A mixture-of-experts model (spec.is_moe) replaces the MLP of every layer from
spec.first_dense_layers on by an MoE block (see MoE): a router, top-k routed experts and
shared experts, dropless, so that expert parallelism (planner.executor.experts) computes the
same function as one process.

Context parallelism (planner.executor.context) sets `context` on the embedding and every
attention layer: the positions of the tokens this rank holds (learned positions and rotary
angles are those positions') and the attention of its queries against every rank's keys;
with `context` None the layer sees the whole sequence from position 0.

Each block has a `recompute` attribute: "none", "selective" (checkpoint the attention core:
QK^T, softmax, AV) or "full" (checkpoint the whole block), the per-layer choice a plan makes.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Callable, Optional, Protocol

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from planner.specs import Activation, ModelSpec, Recompute


class SequenceShard(Protocol):
    """What context parallelism gives the embedding and attention layers as their `context`
    (planner/executor/context.py:ContextParallel)."""

    @property
    def positions(self) -> torch.Tensor: ...

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...


# MoE.exchange (planner/executor/experts.py:Exchange): (copies, counts, compute) -> the experts' outputs
ExpertExchange = Callable[[torch.Tensor, torch.Tensor, Callable], torch.Tensor]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def make_norm(spec: ModelSpec, dim: int) -> nn.Module:
    return nn.LayerNorm(dim) if spec.norm == "layernorm" else RMSNorm(dim)


def rotary_tables(head_dim: int, seq_len: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv)
    return angles.cos(), angles.sin()


def apply_rotary(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor | None = None
) -> torch.Tensor:
    # x: (B, heads, T, head_dim); rotate pairs (even, odd) by the angles of positions 0..T-1 or `positions`
    x1, x2 = x[..., 0::2], x[..., 1::2]
    if positions is None:
        c, s = cos[: x.shape[-2]].to(x.dtype), sin[: x.shape[-2]].to(x.dtype)
    else:
        c, s = cos[positions].to(x.dtype), sin[positions].to(x.dtype)
    return torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)


class Attention(nn.Module):
    cos: torch.Tensor  # the rotary tables, buffers registered with a rotary embedding
    sin: torch.Tensor

    def __init__(self, spec: ModelSpec):
        super().__init__()
        h, d = spec.hidden_size, spec.head_dim
        self.head_dim = d
        self.rotary = not spec.learned_position_embeddings
        bias = spec.linear_bias
        self.q = nn.Linear(h, spec.num_heads * d, bias=bias)
        self.k = nn.Linear(h, spec.kv_heads * d, bias=bias)
        self.v = nn.Linear(h, spec.kv_heads * d, bias=bias)
        self.o = nn.Linear(spec.num_heads * d, h, bias=bias)
        self.recompute_core = False
        self.context: Optional[SequenceShard] = None  # context parallelism (planner.executor.context.ContextParallel)
        if self.rotary:
            cos, sin = rotary_tables(d, spec.max_seq_len)
            self.register_buffer("cos", cos, persistent=False)
            self.register_buffer("sin", sin, persistent=False)

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if k.shape[1] != q.shape[1]:  # grouped-query attention: share each KV head
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        if self.context is not None:
            return self.context.attention(q, k, v)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        d = self.head_dim
        q = self.q(x).view(B, T, -1, d).transpose(1, 2)  # local heads under TP
        k = self.k(x).view(B, T, -1, d).transpose(1, 2)
        v = self.v(x).view(B, T, -1, d).transpose(1, 2)
        if self.rotary:
            pos = None if self.context is None else self.context.positions
            q, k = apply_rotary(q, self.cos, self.sin, pos), apply_rotary(k, self.cos, self.sin, pos)
        if self.recompute_core and self.training:
            y = checkpoint(self.core, q, k, v, use_reentrant=False)
        else:
            y = self.core(q, k, v)
        return self.o(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    """The dense MLP (width spec.ffn), or an expert's (width given): fc1, GELU, fc2; or a gated
    unit down(act(gate x) * up x), act SiLU (SwiGLU) or tanh-approximated GELU (GeGLU, Gemma)."""

    def __init__(self, spec: ModelSpec, width: int | None = None):
        super().__init__()
        h, f, bias = spec.hidden_size, width or spec.ffn, spec.linear_bias
        self.swiglu = (
            spec.gated
        )  # gate, up, down (SwiGLU or GeGLU): the name executor/parallelize.py and profiler/compute.py read
        self.act = F.silu if spec.activation == Activation.swiglu else partial(F.gelu, approximate="tanh")
        if self.swiglu:
            self.gate = nn.Linear(h, f, bias=bias)
            self.up = nn.Linear(h, f, bias=bias)
            self.down = nn.Linear(f, h, bias=bias)
        else:
            self.fc1 = nn.Linear(h, f, bias=bias)
            self.fc2 = nn.Linear(f, h, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.swiglu:
            return self.down(self.act(self.gate(x)) * self.up(x))
        return self.fc2(self.act(self.fc1(x)))


class MoE(nn.Module):
    """Mixture-of-experts MLP: router (h -> E linear, no bias), top-k routed experts, shared experts.

    Routing as Mixtral (Jiang et al. 2024, and Hugging Face's MixtralSparseMoeBlock): a
    token's weights are the softmax over its k largest router logits (the same as softmax
    over all E, then renormalised over the top k). Every token reaches all its k experts
    (dropless: no capacity factor, no token dropped, no auxiliary loss), so the function is
    the same whichever way experts are placed. Shared experts are one MLP of
    num_shared_experts x moe_ffn width that every token goes through, added to the output
    (DeepSeekMoE's formulation; the cost model counts them alike).

    Experts are a ModuleList of E MLPs of width moe_ffn. Expert parallelism keeps a slice
    of them (`first_expert` is the index of experts[0]) and sets `exchange`, which sends
    each token copy to the rank holding its expert and brings the result back
    (planner.executor.experts.Exchange); with `exchange` None every expert is here.
    """

    def __init__(self, spec: ModelSpec):
        super().__init__()
        assert spec.num_experts is not None and spec.experts_per_token is not None  # a MoE model's (ModelSpec._shapes)
        h, self.num_experts, self.top_k = spec.hidden_size, spec.num_experts, spec.experts_per_token
        self.router = nn.Linear(h, self.num_experts, bias=False)
        self.experts = nn.ModuleList(MLP(spec, spec.moe_ffn) for _ in range(self.num_experts))
        self.shared = MLP(spec, spec.num_shared_experts * spec.moe_ffn) if spec.num_shared_experts else None
        self.first_expert = 0
        self.exchange: Optional[ExpertExchange] = None

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights, expert ids), both (tokens, k): softmax over each token's top-k logits."""
        top, ids = self.router(x).topk(self.top_k, dim=-1)
        return F.softmax(top, dim=-1), ids

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        weights, ids = self.route(x)
        # Token copies (one per chosen expert) grouped by expert id, token order kept within one.
        order = ids.reshape(-1).argsort(stable=True)
        counts = torch.bincount(ids.reshape(-1), minlength=self.num_experts)
        copies = x[order // self.top_k]
        if self.exchange is None:
            y = self.compute(copies, counts)
        else:
            y = self.exchange(copies, counts, self.compute)
        y = y[order.argsort()].view(x.shape[0], self.top_k, -1)  # back to (token, choice)
        out = (weights.unsqueeze(-1) * y).sum(1)
        if self.shared is not None:
            out = out + self.shared(x)
        return out.view(shape)

    def compute(self, copies: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Experts held here on their token copies: `copies` grouped by expert, counts[i]
        rows for self.experts[i]."""
        parts = copies.split(counts.tolist())
        return torch.cat([expert(part) for expert, part in zip(self.experts, parts, strict=True)])


class Block(nn.Module):
    def __init__(self, spec: ModelSpec, moe: bool = False):
        super().__init__()
        self.norm1 = make_norm(spec, spec.hidden_size)
        self.attn = Attention(spec)
        self.norm2 = make_norm(spec, spec.hidden_size)
        self.mlp = MoE(spec) if moe else MLP(spec)
        self.recompute = Recompute.none

    def set_recompute(self, mode: Recompute) -> None:
        self.recompute = Recompute(mode)
        self.attn.recompute_core = self.recompute == Recompute.selective

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recompute == Recompute.full and self.training:
            return checkpoint(self._forward, x, use_reentrant=False)
        return self._forward(x)


class Embedding(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.tok = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.pos = nn.Embedding(spec.max_seq_len, spec.hidden_size) if spec.learned_position_embeddings else None
        self.context: Optional[SequenceShard] = None  # context parallelism: the positions of the tokens this rank holds

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens)
        if self.pos is not None:
            pos = (
                torch.arange(tokens.shape[1], device=tokens.device) if self.context is None else self.context.positions
            )
            x = x + self.pos(pos)
        return x


class Head(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.norm = make_norm(spec, spec.hidden_size)
        self.output = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output(self.norm(x))


class ReferenceModel(nn.Module):
    """Embedding -> blocks -> final norm -> LM head; returns logits."""

    def __init__(self, spec: ModelSpec, tie: bool | None = None):
        super().__init__()
        self.spec = spec
        self.embed = Embedding(spec)
        self.layers = nn.ModuleList(
            Block(spec, moe=spec.is_moe and i >= spec.first_dense_layers) for i in range(spec.num_layers)
        )
        self.head = Head(spec)
        if spec.tied_embeddings if tie is None else tie:
            self.head.output.weight = self.embed.tok.weight
        self.apply(_init)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def _init(m: nn.Module) -> None:
    # GPT-2 style: N(0, 0.02) weights, zero biases; deterministic under torch.manual_seed.
    if isinstance(m, (nn.Linear, nn.Embedding)):
        nn.init.normal_(m.weight, mean=0.0, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)


def build_model(spec: ModelSpec, seed: int = 0, tie: bool | None = None) -> ReferenceModel:
    torch.manual_seed(seed)
    return ReferenceModel(spec, tie=tie)


class StageModule(nn.Module):
    """One pipeline stage of a ReferenceModel: the embedding on the first, a contiguous run
    of blocks, the final norm and head on the last; returns one tensor."""

    def __init__(self, model: ReferenceModel, first: int, last: int, is_first: bool, is_last: bool):
        super().__init__()
        self.embed = model.embed if is_first else None
        self.layers = nn.ModuleList(model.layers[first:last])
        self.head = model.head if is_last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        if self.head is not None:
            x = self.head(x)
        return x


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy, in fp32 at least (float64 logits stay float64: the
    verifier's exact reference)."""
    if logits.dtype != torch.float64:
        logits = logits.float()
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def synthetic_batch(
    spec: ModelSpec, batch: int, seq_len: int, seed: int, step: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and next-token targets, the same on every rank for a (seed, step)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    data = torch.randint(0, spec.vocab_size, (batch, seq_len + 1), generator=g)
    return data[:, :-1].contiguous(), data[:, 1:].contiguous()


def param_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


__all__ = [
    "ReferenceModel",
    "StageModule",
    "Block",
    "MoE",
    "build_model",
    "lm_loss",
    "synthetic_batch",
    "param_count",
    "math",
]
