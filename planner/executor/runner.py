"""Run plans and build their reports: launch -> workers -> reference -> comparison.

`run_plans` takes several prepared cases and runs them in one launch (one process group,
a mesh per case): starting workers costs seconds of importing torch, a case a fraction of
that. `plan run` passes one case; the tests pass a batch.
"""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass
from statistics import median
from typing import Callable, Optional

from cost_models.estimate import estimate as predict
from cost_models.memory import GIB
from planner.errors import UsageError
from planner.executor.duration import usable_cores
from planner.executor.prepare import RunCase, check_world, fp8_problem
from planner.executor.verify import DEFAULT_TOLERANCE, Trajectory, compare, reference_runs
from planner.distributed.launch import LaunchSpec, core_slices, inside_launcher
from planner.specs import (
    ClusterSpec,
    MemoryBytes,
    RankMeasurement,
    RunReport,
    RunSettings,
    PipelineRankComparison,
    TimeComparison,
)


@dataclass(frozen=True)
class RunOptions:
    tolerance: float = DEFAULT_TOLERANCE
    timeout_s: float = 120.0  # process-group timeout
    backend: str = "auto"
    faults: tuple[Optional[str], ...] = ()  # per case, injected errors (planner.executor.train.FAULTS; tests only)


def launch_world(spec: LaunchSpec) -> tuple[int, str]:
    """World size of this launch and how it came about (for error messages)."""
    if inside_launcher():
        return int(os.environ["WORLD_SIZE"]), "WORLD_SIZE from the enclosing launcher"
    return spec.world_size, f"--nproc-per-node {spec.nproc_per_node} x --nnodes {spec.nnodes}"


def run_plans(
    cases: list[RunCase],
    clusters: list[ClusterSpec],
    spec: LaunchSpec,
    options: RunOptions = RunOptions(),
    plan_files: Optional[list[Optional[str]]] = None,
    progress: Optional[Callable[[int, int, str], None]] = None,
    say: Optional[Callable[[str], None]] = None,
) -> list[RunReport]:
    """Execute every case in one launch and report each against its reference. Raises
    UsageError before launching when a case does not fit the launch, PlannerError when a
    rank fails. `progress(done, total, message)` hears of each training step, then of each
    single-process reference run; `say(line)` of what makes the measurement doubtful
    (CPU ranks sharing cores, core_sharing)."""
    world, how = launch_world(spec)
    for case in cases:
        check_world(case.plan, world, how)
    backend, device = _backend(options.backend)
    if any(case.fp8 for case in cases):
        check_fp8(device)
    sharing = core_sharing(spec, backend)
    if sharing:
        (say or _stderr_line)(sharing)
    per_rank = _launch_workers(cases, spec, options, progress)
    results = per_rank[min(per_rank)]  # every rank returns every rank's results
    references: dict = {}
    reports = []
    distinct = len({_reference_key(case) for case in cases})
    for i, (case, result) in enumerate(zip(cases, results)):
        key = _reference_key(case)
        if key not in references:
            if progress is not None:
                progress(len(references), distinct, "single-process reference runs (float64 and fp32)")
            references[key] = reference_runs(case)
        exact, rounded, names = references[key]
        run = RunSettings(
            steps=case.steps,
            warmup_steps=case.warmup,
            seed=case.seed,
            learning_rate=case.learning_rate,
            world_size=world,
            nnodes=spec.nnodes,
            backend=backend,
            device=device,
            timeout_s=options.timeout_s,
            changes=list(case.notes),
            pinned=all(r.cores for r in result.ranks),
        )
        verification = compare(
            Trajectory(result.losses, result.grad_sq),
            exact,
            rounded,
            names,
            options.tolerance,
            layout_problem(case, result.ranks),
        )
        file = plan_files[i] if plan_files else None
        reports.append(build_report(case, clusters[i], run, result.ranks, verification, file))
    return reports


def _stderr_line(text: str) -> None:
    print(f"plan run: {text}", file=sys.stderr, flush=True)


def _reference_key(case: RunCase) -> tuple:
    """Cases with the same key share one single-process reference run."""
    return case.model.model_dump_json(), case.job.model_dump_json(), case.steps, case.seed, case.learning_rate


def layout_problem(case: RunCase, ranks: list[RankMeasurement]) -> Optional[str]:
    """Each rank must hold the layers of its virtual stages under the plan's split (a layer on
    the wrong stage computes the same function: only the split shows it)."""
    counts = case.plan.stage_layers(case.model.num_layers)
    for r in sorted(ranks, key=lambda r: r.rank):
        want = sum(counts[j] for j in r.virtual_stages)
        if r.layers != want:
            return (
                f"rank {r.rank} (pipeline rank {r.pp_rank}, stages {r.virtual_stages}) ran {r.layers} layers, "
                f"the plan's split {counts} gives it {want}"
            )
    return None


def _launch_workers(cases: list[RunCase], spec: LaunchSpec, options: RunOptions, progress) -> dict:
    """The distributed run; with `progress`, the first worker of the node reports each step
    through a temporary file (removed however the launch ends)."""
    from planner.distributed.launch import follow_progress, launch
    from planner.executor.train import WorkerSettings, run_worker

    path = None
    try:
        if progress is not None and not inside_launcher():
            fd, path = tempfile.mkstemp(prefix="plan-run-", suffix=".progress")
            os.close(fd)
        settings = WorkerSettings(
            backend=options.backend, timeout_s=options.timeout_s, progress_path=path, faults=options.faults
        )
        with follow_progress(path, progress):
            return launch(spec, run_worker, cases, settings, temporary=(path,) if path else ())
    finally:
        if path:
            os.unlink(path)


def core_sharing(spec: LaunchSpec, backend: str) -> Optional[str]:
    """'4 ranks share 2 cores: ...' where this launch's CPU ranks cannot each be pinned to a
    core of their own (planner/distributed/launch.py:own_cores); None where they can, on GPUs,
    and inside torchrun or Slurm (their binding)."""
    if backend != "gloo" or inside_launcher():
        return None
    cores, ranks = usable_cores(), spec.nproc_per_node
    if core_slices(range(cores), ranks) is not None:
        return None
    s = "s" if cores > 1 else ""
    return f"{ranks} ranks share {cores} core{s}: step times are noisy; use at most {cores} rank{s} here to measure"


def resolve_backend(requested: str, nproc_per_node: Optional[int] = None) -> str:
    """'auto' is nccl when this machine has CUDA, else gloo (as the workers decide). With nccl,
    each of the `nproc_per_node` workers of this machine needs a GPU of its own."""
    import torch

    if requested == "nccl" and not torch.cuda.is_available():
        raise UsageError("--backend nccl needs CUDA, and torch sees no GPU here; use --backend gloo")
    backend = requested if requested != "auto" else "nccl" if torch.cuda.is_available() else "gloo"
    gpus = torch.cuda.device_count() if backend == "nccl" else 0
    if backend == "nccl" and nproc_per_node is not None and nproc_per_node > gpus and not inside_launcher():
        raise UsageError(
            f"--nproc-per-node {nproc_per_node} with nccl needs a GPU per process, and this machine has {gpus}; "
            f"use --nproc-per-node {gpus} or fewer, or --backend gloo"
        )
    return backend


def check_fp8(device: str) -> None:
    """Refuse an FP8 plan where the device has no FP8 tensor cores (prepare.fp8_problem)."""
    import torch

    capability = name = None
    if device == "cuda":
        capability, name = torch.cuda.get_device_capability(), torch.cuda.get_device_name()
    problem = fp8_problem(device, capability, name)
    if problem:
        raise UsageError(problem)


def _backend(requested: str) -> tuple[str, str]:
    backend = resolve_backend(requested)
    return backend, "cuda" if backend == "nccl" else "cpu"


def build_report(
    case: RunCase,
    cluster: ClusterSpec,
    settings: RunSettings,
    ranks: list[RankMeasurement],
    verification,
    plan_file: Optional[str],
) -> RunReport:
    est = predict(case.model, cluster, case.job, case.plan)
    return RunReport(
        plan_file=plan_file,
        model=case.model,
        cluster=cluster,
        job=case.job,
        plan=case.plan,
        estimate=est,
        settings=settings,
        ranks=sorted(ranks, key=lambda r: r.rank),
        pipeline_ranks=rank_comparisons(est, ranks),
        time=time_comparison(est, case, ranks),
        verification=verification,
        verdict="pass" if verification.passed else "fail",
    )


def error_pct(predicted: float, measured: float) -> float:
    return 100.0 * (predicted - measured) / measured if measured else float("inf") if predicted else 0.0


def rank_comparisons(est, ranks: list[RankMeasurement]) -> list[PipelineRankComparison]:
    out = []
    for sm in est.memory_gib_per_pipeline_rank:
        mine = [r.memory for r in ranks if r.pp_rank == sm.pipeline_rank]
        measured = MemoryBytes(**{k: max(getattr(m, k) for m in mine) for k in MemoryBytes.model_fields})
        predicted = MemoryBytes(
            weights_bytes=sm.weights * GIB,
            gradients_bytes=sm.gradients * GIB,
            optimizer_states_bytes=sm.optimizer_states * GIB,
            activations_bytes=sm.activations * GIB,
        )
        out.append(
            PipelineRankComparison(
                pipeline_rank=sm.pipeline_rank,
                layers=sm.layers,
                predicted=predicted,
                predicted_not_measured_bytes=(sm.temporary + sm.overhead) * GIB,
                measured=measured,
                error_pct=error_pct(predicted.total_bytes, measured.total_bytes),
            )
        )
    return out


def slowest_rank_steps(ranks: list[RankMeasurement]) -> list[float]:
    """Each measured step's time: a step lasts as long as its slowest rank."""
    return [max(r.step_times_s[i] for r in ranks) for i in range(len(ranks[0].step_times_s))]


def time_comparison(est, case: RunCase, ranks: list[RankMeasurement]) -> TimeComparison:
    """The median over the measured steps of the slowest rank's time: robust to the one step
    that other work on the machine slowed (a mean moves with it)."""
    per_step = slowest_rank_steps(ranks)
    measured = median(per_step)
    tokens = case.job.global_batch_size * case.job.seq_len
    return TimeComparison(
        predicted_step_time_s=est.step_time_s,
        measured_step_time_s=measured,
        error_pct=error_pct(est.step_time_s, measured),
        predicted_tokens_per_s=est.tokens_per_s,
        measured_tokens_per_s=tokens / measured,
        measured_steps=len(per_step),
    )
