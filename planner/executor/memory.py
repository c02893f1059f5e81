"""Memory of one rank during training: what is counted, and how.

Counted on the warm-up steps (every step has the same shapes; the hooks would slow the
timed steps by 3-8% on a small model), on every step when there is no warm-up.

CUDA: the caching allocator's peak (`torch.cuda.max_memory_allocated`), reset before the
measured steps; the breakdown below is reported beside it.

CPU has no allocator statistics, so we count bytes of live tensors, each storage once
(views and tensors sharing a storage are not double counted); for a DTensor, its local
shard:
- weights: every parameter reachable from the rank's stage modules and its optimizer,
  sampled after each block's forward and at the end of the step, the largest kept. FSDP2
  swaps all-gathered (unsharded) parameters in during forward; those that are still in
  place when sampled are counted (ZeRO-2 keeps them until backward ends; ZeRO-3 frees
  them after each block, so only its shards and the root's unsharded ones are seen).
- gradients: `.grad` of those parameters after the last backward of the step (before
  the optimizer step). DDP's separate bucket buffers are not counted.
- optimizer states: tensors in the optimizer's `state` (Adam: step, exp_avg, exp_avg_sq)
  after the step; with ZeRO-1/2/3 only this rank's shard exists.
- activations: the peak over the step of tensors autograd saved for backward, tracked with
  `torch.autograd.graph.saved_tensors_hooks` (a tensor counts from the moment it is saved
  until autograd releases it after its backward), above what was still saved when the
  step began (nothing, unless something kept a graph alive across steps). Parameters saved by an op (a linear
  layer's weight) are excluded: they are weights. Under full recompute only each block's
  input is saved (checkpoint's own hooks take over inside); tensors rebuilt during
  recomputation, autograd's transient buffers, communication buffers and the logits'
  gradient are not counted (the cost model calls these "temporary").
"""

from __future__ import annotations

from typing import Iterable, Optional

import torch
import torch.nn as nn

CPU_METHOD = (
    "cpu: live tensor bytes, each storage once: parameters (largest seen), gradients after backward, optimizer state, "
    "peak of tensors saved for backward (saved_tensors_hooks); no allocator, temporaries or communication buffers"
)
CUDA_METHOD = "cuda: torch.cuda.max_memory_allocated (allocator peak); breakdown counted as on CPU"


def local(t: torch.Tensor) -> torch.Tensor:
    """The tensor that owns memory on this rank: a DTensor's local shard, else itself."""
    inner = getattr(t, "_local_tensor", None)
    return inner if inner is not None else t


def _storage(t: torch.Tensor) -> tuple[int, int] | None:
    """(data pointer, bytes) of the storage behind `t`. Wrapper subclasses (DTensor, the
    asynchronous result of a functional collective) own no storage: look inside them."""
    if t.device.type == "meta":
        return None
    flatten = getattr(t, "__tensor_flatten__", None)
    if flatten is not None:
        inner = [x for x in (getattr(t, n) for n in flatten()[0]) if isinstance(x, torch.Tensor)]
        return _storage(inner[0]) if len(inner) == 1 else None
    s = t.untyped_storage()
    return s.data_ptr(), s.nbytes()


def distinct_bytes(tensors: Iterable[Optional[torch.Tensor]]) -> int:
    """Bytes of the distinct storages behind `tensors` (freed storages count 0)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None:
            continue
        key = _storage(t)
        if key is not None and key[1] > 0:
            seen[key[0]] = key[1]
    return sum(seen.values())


def optimizer_tensors(optimizer) -> list[torch.Tensor]:
    inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer wraps a local one
    return [v for state in inner.state.values() for v in state.values() if isinstance(v, torch.Tensor)]


def optimizer_params(optimizer) -> list[torch.Tensor]:
    inner = getattr(optimizer, "optim", optimizer)
    return [p for g in inner.param_groups for p in g["params"]]


def _is_parameter(t: torch.Tensor) -> bool:
    while t._base is not None:  # a view of a parameter (e.g. weight.t() saved by linear)
        t = t._base
    return isinstance(t, nn.Parameter)


class _Saved:
    """What autograd keeps in place of a saved tensor; releasing it ends the count."""

    __slots__ = ("tensor", "key", "tracker")

    def __init__(self, tensor: torch.Tensor, key, tracker: "ActivationTracker"):
        self.tensor, self.key, self.tracker = tensor, key, tracker

    def __del__(self):
        self.tracker._release(self.key)


class ActivationTracker:
    """Live and peak bytes of tensors saved for backward (each storage counted once)."""

    def __init__(self):
        self.live = 0
        self.peak = 0  # largest (live - base) seen
        self.base = 0  # live bytes when the step began: saved tensors that outlived an earlier step
        self._refs: dict[int, list[int]] = {}  # storage pointer -> [references, bytes]

    def _pack(self, t: torch.Tensor):
        if _is_parameter(t):
            return t
        key = _storage(t)
        if key is None:
            return t
        ptr, nbytes = key
        ref = self._refs.get(ptr)
        if ref is None:
            self._refs[ptr] = [1, nbytes]
            self.live += nbytes
            self.peak = max(self.peak, self.live - self.base)
        else:
            ref[0] += 1
        return _Saved(t, ptr, self)

    @staticmethod
    def _unpack(obj):
        return obj.tensor if isinstance(obj, _Saved) else obj

    def _release(self, ptr: int) -> None:
        ref = self._refs.get(ptr)
        if ref is None:
            return
        ref[0] -= 1
        if ref[0] == 0:
            self.live -= ref[1]
            del self._refs[ptr]

    def begin_step(self) -> None:
        self.base = self.live

    def reset_peak(self) -> None:
        self.peak = 0

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)


class MemoryMeter:
    """Weights, gradients, optimizer states and activations of one rank (see module doc)."""

    def __init__(self, modules: list[nn.Module], optimizer, device: torch.device):
        self.modules, self.optimizer, self.device = modules, optimizer, device
        self.activations = ActivationTracker()
        self.weights = self.gradients = self.optimizer_states = 0
        self.counting = True  # off during timed steps (see train.py)

    def _params(self) -> list[torch.Tensor]:
        mine = [p for m in self.modules for p in m.parameters()]
        return mine + optimizer_params(self.optimizer)

    def sample_weights(self, *_args) -> None:
        if self.counting:
            self.weights = max(self.weights, distinct_bytes(self._params()))

    def sample_gradients(self) -> None:
        if self.counting:
            self.gradients = max(self.gradients, distinct_bytes(p.grad for p in self._params()))

    def sample_optimizer(self) -> None:
        if self.counting:
            self.optimizer_states = max(self.optimizer_states, distinct_bytes(optimizer_tensors(self.optimizer)))

    def watch_blocks(self, blocks: list[nn.Module]) -> None:
        """Sample parameters after every block's forward (FSDP's gathered ones included)."""
        for b in blocks:  # the hooks stay for the run; `counting` turns them off
            b.register_forward_hook(self.sample_weights)

    def start(self) -> None:
        """Before the first step."""
        self.weights = self.gradients = self.optimizer_states = 0
        self.activations.reset_peak()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def peak_bytes(self) -> int:
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        return self.weights + self.gradients + self.optimizer_states + self.activations.peak

    @property
    def method(self) -> str:
        return CUDA_METHOD if self.device.type == "cuda" else CPU_METHOD
