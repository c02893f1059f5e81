"""The per-rank entrypoint of `plan run`: lay the plan out, train K steps, measure.

`run_worker(cases, settings)` runs several plans one after another in one process group
(a mesh per plan), which saves the seconds each launch spends importing torch. Every rank
returns every rank's results (gathered), so each node's launcher can report the whole run.

Every step reports the loss and each parameter's squared gradient norm (all shards and
stages summed, in the order of the single-process model's parameters: planner.executor.verify
compares them one by one).

Fault injection, for tests only:
- Rank failures (environment, read by the worker): PLAN_RUN_FAIL_RANK=r makes rank r fail at
  the start of step PLAN_RUN_FAIL_STEP (default 1) in the way PLAN_RUN_FAIL_MODE says: "raise"
  (an exception, the default), "exit" (the process dies with exit code 3) or "hang" (it stops
  answering; the others time out).
- Wrong arithmetic (WorkerSettings.faults, one entry per case; benchmarks/verifier_sweep.py and
  tests/distributed/test_verify_runs.py check that the verifier catches each): see FAULTS.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

from torch.distributed.elastic.multiprocessing.errors import record

from planner.executor.prepare import RunCase
from planner.specs import MemoryBytes, RankMeasurement

if TYPE_CHECKING:  # imported where a plan is laid out (_lay_out)
    import torch

    from planner.executor.context import ContextParallel
    from planner.executor.experts import ExpertParallel
    from planner.executor.parallelize import RankPlace


# Injected errors, each one a bug a parallel layout can have (the verifier must catch all):
FAULTS = {
    "drop-grad-shard": "the last rank's gradient of one parameter (its shard, or its replica) is lost before the step",
    "grad-scale": "gradients are summed over the replicas instead of averaged (x dp x cp, or x 2 with one replica)",
    "wrong-stage": "one layer runs on the neighbouring pipeline stage (the split between stages 0 and 1 is off by one)",
    "micro-batch": "micro-batches are read one late: the step's first is never seen, the last is read twice",
}


@dataclass(frozen=True)
class WorkerSettings:
    backend: str = "auto"  # gloo on CPU, nccl on CUDA
    timeout_s: float = 120.0  # process-group timeout: a rank that stops answering fails the others after this
    progress_path: Optional[str] = None  # where the node's first worker reports each step (launch.report_progress)
    faults: tuple[Optional[str], ...] = ()  # per case: a FAULTS key to inject (tests only), or None


@dataclass(frozen=True)
class CaseResult:
    """One plan's outcome, identical on every rank after the gather."""

    losses: list[float]  # mean loss over the global batch, every step
    grad_sq: list[list[float]]  # every step: each parameter's squared gradient norm, all shards and stages
    ranks: list[RankMeasurement]

    @property
    def grad_norms(self) -> list[float]:
        """Global gradient norm (all parameters) of every step."""
        return [math.sqrt(sum(step)) for step in self.grad_sq]


@record
def run_worker(cases: list[RunCase], settings: WorkerSettings) -> list[CaseResult]:
    """Entrypoint of every rank (module level: workers are spawned)."""
    import torch
    import torch.distributed as dist

    from planner.distributed.launch import init_process_group, own_cores, process_cores, report_progress

    warnings.filterwarnings("ignore", category=UserWarning)  # torch's experimental-API notices
    warnings.filterwarnings("ignore", category=FutureWarning)
    _, _, device = init_process_group(settings.backend, settings.timeout_s)
    # CPU ranks: each on cores of its own, as many threads as it has cores; ranks that
    # outnumber the cores share them, one thread each (GPU ranks: the device is theirs).
    cores = own_cores() if device.type == "cpu" else None
    torch.set_num_threads(len(cores) if cores else 1)
    total, done = sum(case.steps for case in cases), 0
    path = settings.progress_path if int(os.environ.get("LOCAL_RANK", 0)) == 0 else None

    def step_done() -> None:
        nonlocal done
        done += 1
        report_progress(path, done, total, f"distributed run on {dist.get_world_size()} ranks, step")

    try:
        results = []
        for i, case in enumerate(cases):
            fault = settings.faults[i] if i < len(settings.faults) else None
            losses, grad_sq, mine = train_case(case, device, step_done, fault)
            mine = mine.model_copy(update={"cores": process_cores() if cores else []})  # read back, every thread
            everyone: list = [None] * dist.get_world_size()
            dist.all_gather_object(everyone, mine)
            results.append(CaseResult(losses, grad_sq, everyone))
        dist.barrier()
        return results
    finally:
        dist.destroy_process_group()


def _maybe_fail(step: int) -> None:
    rank = os.environ.get("PLAN_RUN_FAIL_RANK")
    if (
        rank is None
        or int(rank) != int(os.environ.get("RANK", -1))
        or step != int(os.environ.get("PLAN_RUN_FAIL_STEP", 1))
    ):
        return
    mode = os.environ.get("PLAN_RUN_FAIL_MODE", "raise")
    if mode == "exit":
        os._exit(3)
    if mode == "hang":
        while True:
            time.sleep(60)
    raise RuntimeError(f"injected failure at step {step} (PLAN_RUN_FAIL_RANK={rank})")


@dataclass
class _Layout:
    """One plan laid out on this rank: what a step runs and what the verifier reads."""

    where: RankPlace
    wrapped: dict  # virtual stage -> its (data-parallel wrapped) module
    optimizer: Any  # a torch optimizer, or planner/executor/experts.py:OptimizerSet
    step_fn: Callable
    context: Optional[ContextParallel]
    experts: Optional[ExpertParallel]
    blocks: list  # this rank's transformer blocks
    names: list[str]  # the single-process model's parameter names (every rank has all of them)
    slots: list[tuple[int, torch.nn.Parameter]]  # (index in names, parameter) of each parameter this rank holds


def _lay_out(case: RunCase, device, fault: Optional[str]) -> _Layout:
    """planner.executor.parallelize's steps, in their order, for one plan on this rank."""
    from planner.executor import parallelize as par
    from planner.executor.context import apply_context_parallel
    from planner.executor.experts import apply_expert_parallel
    from planner.distributed.reference_model import build_model

    plan, spec = case.plan, case.model
    mesh = par.build_mesh(plan, device.type)
    where = par.place(mesh, plan)
    model = build_model(spec, seed=case.seed, tie=case.tie).to(device)
    names = _tag_modules(model)
    split = _misplaced(plan, spec.num_layers) if fault == "wrong-stage" else plan
    stages = par.split_pipeline(model, split, where.stages)
    del model  # layers of other stages go with it
    context = apply_context_parallel(stages, plan, mesh, case.job.seq_len, device)  # None unless cp > 1
    experts = apply_expert_parallel(stages, plan, mesh)  # None unless ep > 1
    if plan.tp > 1:
        for stage in stages.values():
            par.apply_tensor_parallel(stage, mesh["tp"], plan.sequence_parallel)
    par.apply_recompute(stages, split, spec.num_layers)
    blocks = [b for s in stages.values() for b in s.layers]
    wrapped = {j: par.apply_data_parallel(s, plan, mesh, experts) for j, s in stages.items()}
    optimizer = par.build_optimizer(wrapped.values(), plan, mesh, case.learning_rate, experts)
    step_fn = _pipeline_step(wrapped, case, mesh, device) if plan.pp > 1 else _local_step(wrapped[0], plan)
    if experts is not None:
        step_fn = _then(step_fn, experts.reduce_gradients)  # the experts' own gradient reduction, timed with the step
    return _Layout(where, wrapped, optimizer, step_fn, context, experts, blocks, names, _slots(wrapped.values(), names))


def train_case(
    case: RunCase, device, step_done: Callable[[], None] = lambda: None, fault: Optional[str] = None
) -> tuple[list[float], list[list[float]], RankMeasurement]:
    """Build, parallelize and train one plan on this rank; returns the losses and the
    per-parameter squared gradient norms (both global) of every step and this rank's
    measurements. `step_done()` after each step; `fault` injects one of FAULTS."""
    import torch.distributed as dist

    from planner.executor.memory import MemoryMeter

    plan = case.plan
    lay = _lay_out(case, device, fault)
    meter = MemoryMeter(list(lay.wrapped.values()), lay.optimizer, device)
    if plan.dp * plan.cp > 1 and plan.zero_stage >= 2:  # FSDP2 gathers parameters in forward: sample them there
        meter.watch_blocks(lay.blocks)

    losses, grad_sq, times = [], [], []
    meter.start()
    for step in range(case.steps):
        _maybe_fail(step)
        timed = step >= case.warmup
        # Memory is counted on the warm-up steps (same shapes as every step): its hooks cost
        # 3-8% of a small model's step, so timed steps run without them (unless no warm-up).
        meter.counting = not timed or case.warmup == 0
        tokens, targets = _replica_batch(case, step, lay.where.dp, device, fault == "micro-batch")
        if lay.context is not None:  # this rank's chunks of every sequence
            tokens, targets = lay.context.split(tokens), lay.context.split(targets)
        meter.activations.begin_step()
        dist.barrier()
        t0 = _now(device)
        with meter.activations.hooks() if meter.counting else contextlib.nullcontext():
            local_loss = lay.step_fn(tokens, targets)
        t1 = _now(device)
        _inject(fault, lay.slots, plan, step)
        meter.sample_gradients()
        loss, squares = _global_loss_and_squares(local_loss, lay, plan, device)
        t2 = _now(device)
        lay.optimizer.step()
        lay.optimizer.zero_grad(set_to_none=True)
        if timed:
            times.append(t1 - t0 + _now(device) - t2)
        meter.sample_optimizer()
        meter.sample_weights()
        losses.append(loss)
        grad_sq.append(squares)
        step_done()
    return losses, grad_sq, _measurement(case, lay.where, times, meter, lay.blocks)


def _tag_modules(model) -> list[str]:
    """Mark every module with its name in the single-process model (the wrappers keep the
    modules, not always their parameter objects) and return the model's parameter names, in
    the reference's order (a tied weight once, under its first name)."""
    for name, module in model.named_modules():
        module._reference_name = name
    return [name for name, _ in model.named_parameters()]


def _slots(modules, names: list[str]) -> list[tuple[int, torch.nn.Parameter]]:
    """(index in `names`, parameter) of every parameter this rank holds, each once."""
    index = {name: i for i, name in enumerate(names)}
    seen, out = set(), []
    for top in modules:
        for module in top.modules():
            prefix = getattr(module, "_reference_name", None)
            if prefix is None:
                continue
            for pname, p in module.named_parameters(recurse=False):
                if id(p) in seen:
                    continue
                seen.add(id(p))
                key = f"{prefix}.{pname}" if prefix else pname
                if key not in index:
                    raise RuntimeError(f"parameter {key} is not one of the single-process model's")
                out.append((index[key], p))
    held = {id(p) for top in modules for p in top.parameters()}
    if held != seen:
        raise RuntimeError(
            f"{len(held - seen)} of this rank's parameters belong to no module of the single-process model"
        )
    return out


def _misplaced(plan, num_layers: int):
    """The plan with one layer moved across the boundary of stages 0 and 1 (fault 'wrong-stage')."""
    counts = plan.stage_layers(num_layers)
    if len(counts) < 2:
        raise RuntimeError("fault 'wrong-stage' needs two pipeline stages")
    give, take = (1, 0) if counts[1] > 1 else (0, 1)
    counts[give] -= 1
    counts[take] += 1
    return plan.model_copy(update={"layers_per_stage": counts, "stage_recompute": None})


def _inject(fault: Optional[str], slots, plan, step: int) -> None:
    """Faults that corrupt gradients, after backward and before the norm and the step."""
    import torch.distributed as dist

    from planner.executor.memory import local

    held = [(i, p) for i, p in slots if p.grad is not None]
    if fault == "grad-scale":
        for _, p in held:
            local(p.grad).mul_(max(2, plan.dp * plan.cp))
    elif fault == "drop-grad-shard" and dist.get_rank() == dist.get_world_size() - 1 and held:
        _, p = held[(step * 7 + len(held) // 2) % len(held)]  # a different parameter each step
        local(p.grad).zero_()


def _now(device) -> float:
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)
    return time.perf_counter()


def _replica_batch(case: RunCase, step: int, dp_rank: int, device, one_late: bool = False):
    """This data-parallel replica's slice of the step's global batch (the reference sees all
    of it). `one_late`: fault 'micro-batch', every micro-batch read from the next one's place."""
    import torch

    from planner.distributed.reference_model import synthetic_batch

    plan = case.plan
    tokens, targets = synthetic_batch(case.model, case.job.global_batch_size, case.job.seq_len, case.seed, step)
    mbs, per_replica = plan.micro_batch_size, plan.micro_batch_size * plan.num_micro_batches
    rows = torch.arange(dp_rank * per_replica, (dp_rank + 1) * per_replica)
    if one_late:
        rows = torch.clamp(rows + mbs, max=len(tokens) - 1)
    return tokens[rows].to(device), targets[rows].to(device)


def _local_step(module, plan):
    """pp = 1: gradient accumulation over the plan's micro-batches, each loss scaled by 1/m
    so the gradient is that of the replica's mean loss. DDP and replicate synchronise only on
    the last micro-batch (as the cost model assumes); ZeRO-2/3 reduce-scatter after every
    micro-batch (they keep only gradient shards)."""
    from planner.distributed.reference_model import lm_loss

    m, mbs = plan.num_micro_batches, plan.micro_batch_size

    def sync(last: bool):
        if hasattr(module, "no_sync"):  # DDP
            return contextlib.nullcontext() if last else module.no_sync()
        if hasattr(module, "set_requires_gradient_sync") and plan.zero_stage < 2:  # composable replicate
            module.set_requires_gradient_sync(last)
        return contextlib.nullcontext()

    def step(tokens, targets):
        total = 0.0
        for i in range(m):
            part = slice(i * mbs, (i + 1) * mbs)
            with sync(i == m - 1):
                loss = lm_loss(module(tokens[part]), targets[part])
                (loss / m).backward()
            total += loss.item()
        return total / m

    return step


def _then(step, after: Callable[[], None]):
    def both(tokens, targets):
        loss = step(tokens, targets)
        after()
        return loss

    return both


def _pipeline_step(stages, case: RunCase, mesh, device):
    """pp > 1: one schedule step; the first stage's rank feeds tokens, the last one's targets
    and collects the micro-batch losses."""
    from planner.executor.parallelize import build_schedule
    from planner.distributed.reference_model import lm_loss

    plan = case.plan
    schedule = build_schedule(stages, plan, mesh, device, lm_loss, case.model, case.job.seq_len)
    first, last = 0 in stages, plan.virtual_stages - 1 in stages

    def step(tokens, targets):
        losses: list = []
        args = (tokens,) if first else ()
        kwargs = {"target": targets, "losses": losses} if last else {}
        schedule.step(*args, **kwargs)
        return sum(x.item() for x in losses) / len(losses) if last else None

    return step


def _global_loss_and_squares(local_loss, lay: _Layout, plan, device) -> tuple[float, list[float]]:
    """One all-reduce over the world: the mean loss over dp x cp ranks (the last stage's tp
    ranks all hold it; with context parallelism each rank's loss is the mean over as many
    tokens) and each parameter's squared gradient norm, each shard counted once (see
    shard_share; an expert-parallel parameter is one of ep distinct slices)."""
    import torch
    import torch.distributed as dist

    from planner.executor.memory import local

    holders = plan.dp * plan.cp * plan.tp  # ranks holding one pipeline stage
    both = torch.zeros(1 + len(lay.names), dtype=torch.float64)
    both[0] = 0.0 if local_loss is None else local_loss / holders
    for i, p in lay.slots:
        if p.grad is not None:
            grad = _settled(p.grad)
            share = shard_share(grad, holders) * (plan.ep if lay.experts is not None and lay.experts.holds(p) else 1)
            both[1 + i] += local(grad).detach().double().pow(2).sum().cpu() * share
    both = both.to(device)
    dist.all_reduce(both)
    values = both.cpu().tolist()
    return values[0], values[1:]


def _settled(grad):
    """A gradient with its pending sums done: a replicated parameter used on sequence
    shards (SP norms) gets a Partial gradient, each rank holding its shards' part; the
    optimizer's DTensor ops reduce it when they read it, and so must the norm."""
    placements = getattr(grad, "placements", ())
    if not any(p.is_partial() for p in placements):
        return grad
    from torch.distributed.tensor import Replicate

    return grad.redistribute(placements=[Replicate() if p.is_partial() else p for p in placements])


def shard_share(grad, holders: int) -> float:
    """Fraction of a rank's local squared sum that belongs in the global sum: the `holders`
    ranks of a stage hold n distinct shards (n = product of the sharded mesh dimensions),
    each held by holders / n of them."""
    placements = getattr(grad, "placements", None)
    if placements is None:
        return 1.0 / holders
    distinct = 1
    for dim, pl in enumerate(placements):
        if not pl.is_replicate():  # Shard, or FSDP2's _StridedShard under TP (is_shard() says False)
            distinct *= grad.device_mesh.size(dim)
    return distinct / holders


def _measurement(case: RunCase, where, times: list[float], meter, blocks) -> RankMeasurement:
    import torch.distributed as dist

    return RankMeasurement(
        rank=dist.get_rank(),
        dp_rank=where.dp,
        tp_rank=where.tp,
        pp_rank=where.pp,
        virtual_stages=list(where.stages),
        layers=len(blocks),
        step_times_s=times,
        memory=MemoryBytes(
            weights_bytes=meter.weights,
            gradients_bytes=meter.gradients,
            optimizer_states_bytes=meter.optimizer_states,
            activations_bytes=meter.activations.peak,
        ),
        peak_memory_bytes=meter.peak_bytes(),
        memory_method=meter.method,
    )
