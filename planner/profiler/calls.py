"""What a collective call costs a training step beyond the alpha-beta fit, measured the way
`plan run` issues the calls.

The link sweep (links.py) times calls back to back, ranks in lockstep: the fit is a call's
transfer. A step issues its calls one at a time between pieces of compute, through a
framework: every call waits for the last rank to arrive and wakes the blocked ones (when
ranks share CPU cores, a scheduler time slice), DTensor redistributes around each TP
collective, FSDP2 copies parameters in and out around each gather and reduce-scatter, and on
a CPU it issues them synchronously, so none of their transfer hides behind compute. None of
that is in the fit, and a plan with many small calls (ZeRO-3: one gather and reduce-scatter
per layer; TP: four all-reduces per layer) pays it many times.

So the profile times a stack of a few blocks, forward and backward of one micro-batch, twice
in lockstep: as `plan run` executes it (the executor's own apply_* steps: DTensor TP over tp
ranks, or FSDP2 ZeRO-3 over all ranks) and as the profile's layer times count it (the same
local shapes, no communication). The difference is the stack's communication as it runs. The
cost model predicts that difference from the fits (TP collectives on the critical path;
ZeRO-3 gathers and reduce-scatters partly hidden behind compute); the call overhead of the
stack's collectives is the one value that, added to each call's latency, makes the model's
prediction equal the measurement (`fit_call_overhead`, a bisection: the prediction grows
with it). It lands in LinkTier.call_overhead_us and communication.GroupLink charges it once
per call.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cost_models.communication import GroupLink
from cost_models.tables import layer_costs
from cost_models.terms import DataParallel, Linear, dp_exposure
from planner.specs import DTYPE_BYTES, Axis, ClusterSpec, Collective, JobSpec, Layout, ModelSpec

if TYPE_CHECKING:  # torch is imported where it runs (stack_timings)
    from torch.distributed.device_mesh import DeviceMesh

STACK_LAYERS = 4  # blocks per timed stack: enough calls to average over, few enough to take seconds


@dataclass(frozen=True)
class StackTiming:
    """`layers` identical blocks, one micro-batch, forward + backward, slowest rank, median over
    repetitions; tp > 1: tensor-parallel over tp consecutive ranks (every group at once, as in
    a run); dp > 1: ZeRO-3 over dp ranks."""

    dp: int
    tp: int
    layers: int
    micro_batch_size: int
    seq_len: int
    plain_forward_s: float  # local shapes, no communication (what the profile's layer times count)
    plain_backward_s: float
    run_s: float  # as plan run executes it: framework wrapping and collectives

    @property
    def collectives(self) -> tuple[Collective, ...]:
        """The collectives whose calls the stack makes (and whose overhead it measures)."""
        if self.tp > 1:
            return (Collective.all_reduce,)
        return (Collective.all_gather, Collective.reduce_scatter)

    @property
    def group_size(self) -> int:
        return self.tp if self.tp > 1 else self.dp

    @property
    def measured_communication_s(self) -> float:
        return self.run_s - self.plain_forward_s - self.plain_backward_s


def modeled_communication(stack: StackTiming, cluster: ClusterSpec, model: ModelSpec, job: JobSpec) -> float:
    """The cost model's communication time for the stack: TP collectives of its layers
    (tables.layer_costs), or the exposed ZeRO-3 traffic of a rank holding them with the plain
    stack's compute as the window (terms.dp_exposure), per micro-batch."""
    link = GroupLink(cluster, stack.group_size, 1)
    if stack.tp > 1:
        lc = layer_costs(
            model, cluster, job, Layout(micro_batch_size=stack.micro_batch_size, tp=stack.tp), {Axis.tp: link}
        )
        return stack.layers * (lc.tp_forward + lc.tp_backward)
    e = DTYPE_BYTES[job.precision]
    params = layer_costs(model, cluster, job, Layout(micro_batch_size=stack.micro_batch_size), {Axis.tp: link}).params
    costs = tuple(
        link.coefficients(c) for c in (Collective.all_reduce, Collective.all_gather, Collective.reduce_scatter)
    )
    dp = DataParallel(stack.dp, 3, cluster.overlap_efficiency, e, params * e, costs)  # costs in DataParallel's order
    fwd, bwd = stack.plain_forward_s / stack.layers, stack.plain_backward_s / stack.layers
    exposure = dp_exposure(
        dp, Linear.per_layer(0.0, params), Linear.per_layer(0.0, fwd), Linear.per_layer(0.0, fwd + bwd)
    )
    return exposure.values((stack.layers, 0, 0))[0]


def with_call_overhead(cluster: ClusterSpec, stack: StackTiming, overhead_us: float) -> ClusterSpec:
    """`cluster` with `overhead_us` per call of the stack's collectives on the tier its group uses."""
    tier_name = "inter_node" if GroupLink(cluster, stack.group_size, 1).inter_node else "intra_node"
    tier = getattr(cluster, tier_name)
    overheads = dict(tier.call_overhead_us or {}) | {c: overhead_us for c in stack.collectives}
    return cluster.model_copy(update={tier_name: tier.model_copy(update={"call_overhead_us": overheads})})


def fit_call_overhead(cluster: ClusterSpec, model: ModelSpec, job: JobSpec, stack: StackTiming) -> float:
    """Overhead per call (microseconds, >= 0) with which the cost model predicts the stack's
    measured communication (0 when it already predicts as much or more)."""
    target = stack.measured_communication_s

    def predicted(us: float) -> float:
        return modeled_communication(stack, with_call_overhead(cluster, stack, us), model, job)

    if predicted(0.0) >= target:
        return 0.0
    lo, hi = 0.0, 1.0
    while predicted(hi) < target and hi < 1e9:
        lo, hi = hi, 2 * hi
    for _ in range(60):  # the prediction is nondecreasing in the overhead (piecewise linear)
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if predicted(mid) < target else (lo, mid)
    return (lo + hi) / 2


def fit_call_overheads(cluster: ClusterSpec, model: ModelSpec, job: JobSpec, stacks: list[StackTiming]) -> ClusterSpec:
    """`cluster` with the call overhead of every stack's collectives fitted (stacks measure
    disjoint collectives, so the order does not matter)."""
    out = cluster
    for stack in stacks:
        out = with_call_overhead(out, stack, fit_call_overhead(cluster, model, job, stack))
    return out


# --------------------------------------------------------------------------- measurement (workers)


def time_stacks(model: ModelSpec, device, micro_batch: int, seq_len: int, tp: int, timing) -> list[StackTiming]:
    """Every rank calls this: the TP stack over tp ranks (when tp > 1), the ZeRO-3 stack over
    all ranks, each beside its plain twin, repetitions interleaved so that all four see the
    same load (`timing`: profiler/compute.py:Timing). Returns the same list on every rank."""
    warmup, reps, sync, lockstep = timing.warmup, timing.reps, timing.sync, timing.lockstep
    import torch
    import torch.distributed as dist

    from planner.distributed.reference_model import Block, StageModule, build_model
    from planner.executor import parallelize as par
    from planner.profiler.compute import shard_block
    from planner.specs import Plan

    world = dist.get_world_size()
    k = min(STACK_LAYERS, model.num_layers)
    spec = model.model_copy(update={"num_layers": k})

    def stack(shard: int = 1) -> StageModule:
        s = StageModule(build_model(spec, seed=0), 0, k, is_first=False, is_last=False)
        for block in s.layers:
            assert isinstance(block, Block)  # a StageModule's layers
            shard_block(block, spec, shard)
        return s.to(device)

    def layout(dp: int, t: int, zero: int) -> tuple[Plan, DeviceMesh]:
        plan = Plan(
            dp=dp, tp=t, pp=1, micro_batch_size=micro_batch, num_micro_batches=1, zero_stage=zero, layers_per_stage=[k]
        )
        return plan, par.build_mesh(plan, device.type)

    variants: dict[str, torch.nn.Module] = {"plain": stack()}
    if world > 1:  # ZeRO-3 exactly as plan run wraps it (FSDP2 per block, then the root)
        plan, mesh = layout(world, 1, 3)
        variants["zero3"] = par.apply_data_parallel(stack(), plan, mesh)
    if tp > 1:  # TP exactly as plan run shards it, beside the profile's local shapes
        _, mesh = layout(world // tp, tp, 0)
        tp_stack = stack()
        par.apply_tensor_parallel(tp_stack, mesh["tp"], sequence_parallel=False)
        variants["tp"], variants["local"] = tp_stack, stack(tp)

    x0 = torch.randn(micro_batch, seq_len, model.hidden_size, device=device)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for rep in range(warmup + reps):
        for name, module in variants.items():
            x = x0.clone().requires_grad_()
            sync()
            lockstep.start()
            t0 = time.perf_counter()
            y = module(x)
            sync()
            t1 = time.perf_counter()
            y.backward(torch.ones_like(y))
            sync()
            t2 = time.perf_counter()
            fwd, bwd = lockstep.slowest([t1 - t0, t2 - t1])
            if rep >= warmup:
                times[name].append((fwd, bwd))

    def median(name: str, part: int) -> float:
        return statistics.median(t[part] for t in times[name])

    def total(name: str) -> float:
        return statistics.median(f + b for f, b in times[name])

    out = []
    if "zero3" in variants:
        out.append(
            StackTiming(world, 1, k, micro_batch, seq_len, median("plain", 0), median("plain", 1), total("zero3"))
        )
    if "tp" in variants:
        out.append(StackTiming(1, tp, k, micro_batch, seq_len, median("local", 0), median("local", 1), total("tp")))
    return out
