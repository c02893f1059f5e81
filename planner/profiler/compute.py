"""Compute measurements on one device: per-layer forward/backward time, saved-activation
bytes and FLOPs of the reference model's layer kinds, a GEMM sweep, copy bandwidth.

A TP-sharded layer is profiled by running one rank's local shapes on one device: the
block's projections are rebuilt with 1/tp of their output (column-parallel) or input
(row-parallel) features, so attention runs on heads/tp local heads, as DTensor's
ColwiseParallel/RowwiseParallel leave it.

Timings reproduce the conditions of a run: every rank runs each repetition at the same
moment (a barrier starts it), so a layer is timed while every other rank computes too, as
in a training step, where all ranks of a CPU rehearsal share the cores (4 ranks on 2 cores
each get half of one) and a step waits for its slowest rank. A repetition's time is the
slowest rank's (all-reduce MAX); the measurement is the median over repetitions, after
warm-up. Inputs are made before the clock starts.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
import time
from typing import Any, Callable, Literal

import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from cost_models.compute import head_flops_forward, layer_flops_forward
from planner.distributed.reference_model import Block, Embedding, Head, lm_loss, param_count
from planner.specs import DType, LayerMeasurement, MatmulPoint, ModelSpec

TORCH_DTYPES = {DType.fp32: torch.float32, DType.bf16: torch.bfloat16, DType.fp16: torch.float16}


def _cpu_sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _cpu_sdpa_backward_flops(
    grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs
) -> int:
    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


def flop_counter() -> FlopCounterMode:
    """FlopCounterMode that also counts CPU attention: SDPA dispatches to
    _scaled_dot_product_flash_attention_for_cpu (and _backward), which the registry lacks."""
    mapping: dict[Any, Callable[..., int]] = {}  # aten operator -> its FLOP count
    aten = torch.ops.aten
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
        mapping[aten._scaled_dot_product_flash_attention_for_cpu] = _cpu_sdpa_flops
        mapping[aten._scaled_dot_product_flash_attention_for_cpu_backward] = _cpu_sdpa_backward_flops
    return FlopCounterMode(display=False, custom_mapping=mapping)


def shard_block(block: Block, spec: ModelSpec, tp: int) -> Block:
    """Rebuild a block's projections with one TP rank's local shapes."""
    if tp == 1:
        return block
    h, d, f = spec.hidden_size, spec.head_dim, spec.ffn
    kv_local = max(1, spec.kv_heads // tp) * d
    bias = spec.linear_bias

    def lin(i: int, o: int, b: bool = bias) -> nn.Linear:
        return nn.Linear(i, o, bias=b)

    a = block.attn
    a.q, a.k, a.v, a.o = lin(h, h // tp), lin(h, kv_local), lin(h, kv_local), lin(h // tp, h)
    m = block.mlp
    if m.swiglu:
        m.gate, m.up, m.down = lin(h, f // tp), lin(h, f // tp), lin(f // tp, h)
    else:
        m.fc1, m.fc2 = lin(h, f // tp), lin(f // tp, h)
    return block


class SavedBytes:
    """Counts bytes saved for backward (unique storages) with saved_tensors_hooks; the
    module's own parameters (which autograd also saves) are not activations and are left out."""

    def __init__(self, module: nn.Module | None = None):
        self.storages: dict[int, int] = {}
        self.skip = {p.untyped_storage().data_ptr() for p in module.parameters()} if module is not None else set()

    def pack(self, t: torch.Tensor):
        try:
            st = t.untyped_storage()
            if st.data_ptr() in self.skip:
                return t
            self.storages[st.data_ptr()] = st.nbytes()
        except (RuntimeError, NotImplementedError):  # pragma: no cover - exotic tensors
            pass
        return t

    @staticmethod
    def unpack(t):
        return t

    @property
    def total(self) -> int:
        return sum(self.storages.values())


class Lockstep:
    """Runs repetitions on all ranks together: `start` lines the ranks up (barrier) before
    each repetition, `slowest` replaces each rank's repetition times by the slowest rank's.
    The default (no process group) is one process on its own."""

    def __init__(self, group=None, distributed: bool = False):
        self.group, self.distributed = group, distributed

    def start(self) -> None:
        if self.distributed:
            import torch.distributed as dist

            dist.barrier(group=self.group)

    def slowest(self, times: list[float]) -> list[float]:
        if not self.distributed:
            return times
        import torch.distributed as dist

        t = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return t.tolist()


ALONE = Lockstep()


@dataclass(frozen=True)
class Timing:
    """How a layer is timed: `warmup` untimed calls, then the median of `reps`, each started on
    every rank together (`lockstep`) between device syncs (`sync`); `progress` is told what is
    measured next."""

    warmup: int
    reps: int
    sync: Callable[[], None]
    progress: Callable[[str], None] = lambda s: None
    lockstep: Lockstep = ALONE


def _median_time(
    fn: Callable,
    reps: int,
    sync: Callable[[], None],
    lockstep: Lockstep = ALONE,
    prepare: Callable[[], object] | None = None,
) -> float:
    """Median over `reps` repetitions of fn(prepare()) (prepare runs before the clock
    starts), each repetition started on all ranks together and timed as the slowest rank's."""
    times = []
    for _ in range(reps):
        arg = prepare() if prepare is not None else None
        sync()
        lockstep.start()
        t = time.perf_counter()
        fn(arg) if prepare is not None else fn()
        sync()
        times.append(time.perf_counter() - t)
    return statistics.median(lockstep.slowest(times))


def measure_module(
    kind: Literal["block", "embedding", "head"],
    module: nn.Module,
    make_input: Callable[[], torch.Tensor],
    loss_of: Callable[[torch.Tensor], torch.Tensor],
    micro_batch: int,
    seq_len: int,
    tp: int,
    analytic: float,
    timing: Timing,
) -> LayerMeasurement:
    """Forward and backward time (medians), saved bytes and FLOPs of one module."""
    module.train()

    def fwd(x=None):
        return module(make_input() if x is None else x)

    def step(x=None):
        out = fwd(x)
        loss_of(out).backward()

    warmup, reps, sync, lockstep = timing.warmup, timing.reps, timing.sync, timing.lockstep
    for _ in range(warmup):
        step()
    # inputs are made outside the timed region (a layer of a model receives its input)
    forward = _median_time(fwd, reps, sync, lockstep, make_input)
    # backward alone: time forward+backward, subtract the forward median
    both = _median_time(step, reps, sync, lockstep, make_input)
    saved = SavedBytes(module)
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
        out = fwd()
    del out
    counter = flop_counter()
    with counter:
        out = fwd()
    flops = float(counter.get_total_flops())
    del out
    module.zero_grad(set_to_none=True)
    return LayerMeasurement(
        kind=kind,
        micro_batch_size=micro_batch,
        seq_len=seq_len,
        tp=tp,
        forward_s=forward,
        backward_s=max(both - forward, 0.0),
        activation_bytes=float(saved.total),
        flops_forward=flops,
        analytic_flops_forward=analytic,
        params=param_count(module),
    )


def profile_layers(
    spec: ModelSpec,
    dtype: DType,
    device: torch.device,
    micro_batches: list[int],
    seq_len: int,
    tps: list[int],
    timing: Timing,
) -> list[LayerMeasurement]:
    """Block (per TP shard), embedding and head+loss for every micro-batch size."""
    tdtype = TORCH_DTYPES[dtype]
    out: list[LayerMeasurement] = []
    torch.manual_seed(0)
    for b in micro_batches:
        tokens = torch.randint(0, spec.vocab_size, (b, seq_len), device=device)
        hidden = lambda: torch.randn(b, seq_len, spec.hidden_size, device=device, dtype=tdtype, requires_grad=True)  # noqa: E731
        for tp in tps:
            block = shard_block(Block(spec), spec, tp).to(device=device, dtype=tdtype)
            timing.progress(f"block b={b} tp={tp}")
            out.append(
                measure_module(
                    "block",
                    block,
                    hidden,
                    lambda y: y.float().pow(2).mean(),
                    b,
                    seq_len,
                    tp,
                    layer_flops_forward(spec, b, seq_len) / tp,
                    timing,
                )
            )
            del block
        emb = Embedding(spec).to(device=device, dtype=tdtype)
        timing.progress(f"embedding b={b}")
        out.append(
            measure_module(
                "embedding",
                emb,
                lambda: tokens,
                lambda y: y.float().pow(2).mean(),
                b,
                seq_len,
                1,
                0.0,
                timing,
            )
        )
        head = Head(spec).to(device=device, dtype=tdtype)
        targets = torch.randint(0, spec.vocab_size, (b, seq_len), device=device)
        timing.progress(f"head b={b}")
        out.append(
            measure_module(
                "head",
                head,
                hidden,
                lambda y: lm_loss(y, targets),
                b,
                seq_len,
                1,
                head_flops_forward(spec, b, seq_len),
                timing,
            )
        )
        del emb, head
    return out


def matmul_sweep(
    dtype: DType,
    device: torch.device,
    sizes: list[int],
    reps: int,
    sync: Callable[[], None],
    lockstep: Lockstep = ALONE,
) -> list[MatmulPoint]:
    tdtype = TORCH_DTYPES[dtype]
    points = []
    for n in sizes:
        a = torch.randn(n, n, device=device, dtype=tdtype)
        b = torch.randn(n, n, device=device, dtype=tdtype)
        for _ in range(2):
            a @ b
        # enough calls per timing that small GEMMs are not all timer overhead
        calls = max(1, int(2e8 / (2 * n**3)))

        def run():
            for _ in range(calls):
                a @ b

        t = _median_time(run, reps, sync, lockstep) / calls
        flops = 2.0 * n**3
        points.append(MatmulPoint(n=n, flops=flops, seconds=t, tflops=flops / t / 1e12))
    return points


def copy_bandwidth(
    device: torch.device, nbytes: int, reps: int, sync: Callable[[], None], lockstep: Lockstep = ALONE
) -> float:
    """GB/s of a large tensor copy (read + write counted)."""
    x = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    y = torch.empty_like(x)
    y.copy_(x)
    t = _median_time(lambda: y.copy_(x), reps, sync, lockstep)
    return 2 * x.numel() * 4 / t / 1e9


def load_factory(path: str) -> Callable[[], nn.Module]:
    """The user's model factory 'package.module:function' (named on the command line)."""
    import importlib

    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"--model-factory must be package.module:function, got {path!r}")
    fn = getattr(importlib.import_module(module_name), attr, None)
    if not callable(fn):
        raise ValueError(f"--model-factory {path!r}: {attr!r} is not a function of {module_name}")
    return fn


def profile_factory_blocks(
    factory: str,
    blocks_attr: str,
    spec: ModelSpec,
    dtype: DType,
    device: torch.device,
    micro_batches: list[int],
    seq_len: int,
    timing: Timing,
) -> list[LayerMeasurement]:
    """The first block of the user's model, unsharded: its input is (b, s, hidden_size)."""
    model = load_factory(factory)()
    blocks = getattr(model, blocks_attr, None)
    if blocks is None or len(blocks) == 0:
        raise ValueError(f"the model from {factory} has no non-empty list attribute {blocks_attr!r}")
    block = blocks[0].to(device=device, dtype=TORCH_DTYPES[dtype])
    out = []
    for b in micro_batches:
        timing.progress(f"user block b={b}")
        hidden = lambda: torch.randn(  # noqa: E731
            b, seq_len, spec.hidden_size, device=device, dtype=TORCH_DTYPES[dtype], requires_grad=True
        )
        out.append(
            measure_module(
                "block",
                block,
                hidden,
                lambda y: (y[0] if isinstance(y, tuple) else y).float().pow(2).mean(),
                b,
                seq_len,
                1,
                layer_flops_forward(spec, b, seq_len),
                timing,
            )
        )
    return out
