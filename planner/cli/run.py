"""`plan run`: execute a plan with torch.distributed, verify it, compare with the prediction."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import Optional

import click

from planner.cli import render
from planner.cli.common import check_plan, check_profile_size, check_real, require_torch
from planner.datafile import check_output, write_atomic
from planner.errors import PlannerError, UsageError
from planner.executor.prepare import (
    Rehearsal,
    check_host_memory,
    check_reference_memory,
    check_seed,
    check_timeout,
    check_world,
    gpu_absent,
    host_memory_bytes,
    prepare_case,
)
from planner.executor.runner import RunOptions, check_fp8, launch_world, resolve_backend, run_plans
from planner.executor.verify import DEFAULT_TOLERANCE
from planner.distributed.launch import (
    Interrupted,
    LaunchSpec,
    inside_launcher,
    local_processes,
    signals_interrupt,
    validate,
)
from planner.plan_file import read_plan_file
from planner.specs import RunReport


@click.command()
@click.argument("plan_file", type=click.Path(dir_okay=False))
@click.option(
    "--nproc-per-node",
    type=int,
    default=None,
    help="Workers on this machine [default: the plan's dp x tp x pp / --nnodes].",
)
@click.option("--nnodes", type=int, default=1, show_default=True, help="Machines (one `plan run` each).")
@click.option(
    "--node-rank", type=int, default=0, show_default=True, help="This machine's rank; node 0 hosts the rendezvous."
)
@click.option("--rdzv-endpoint", default=None, help="host:port of the rendezvous (node 0), the same on every node.")
@click.option(
    "--steps", type=int, default=5, show_default=True, help="Training steps (warm-up included), each verified."
)
@click.option("--warmup", type=int, default=2, show_default=True, help="First steps left out of the timing.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the weights and the synthetic tokens.")
@click.option("--lr", type=float, default=1e-3, show_default=True, help="Adam learning rate.")
@click.option(
    "--scale-layers", type=int, help="Rehearse with this many layers (the layer split is kept in proportion)."
)
@click.option("--scale-hidden", type=int, help="Rehearse with this hidden size (FFN scaled alike).")
@click.option("--scale-heads", type=int, help="Rehearse with this many attention heads (KV ratio kept).")
@click.option("--scale-vocab", type=int, help="Rehearse with this vocabulary size.")
@click.option("--scale-seq-len", type=int, help="Rehearse with this sequence length.")
@click.option(
    "--rehearse-dp",
    type=int,
    help="Rehearse on fewer processes: the plan's layout with this many data-parallel "
    "replicas (tp, pp, cp, ep and the rest kept; the global batch scaled so each replica keeps its micro-batches).",
)
@click.option(
    "--tolerance",
    type=float,
    default=DEFAULT_TOLERANCE,
    show_default=True,
    help="Relative difference allowed against the reference (fp32).",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=float,
    default=120.0,
    show_default=True,
    help="Process-group timeout, seconds: a rank that stops answering fails the run after this.",
)
@click.option(
    "--backend",
    type=click.Choice(["auto", "gloo", "nccl"]),
    default="auto",
    show_default=True,
    help="auto: nccl with CUDA, else gloo.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the JSON report to this file.")
@signals_interrupt()  # SIGTERM / SIGHUP: workers stopped, temporary files removed, one line, exit 143 / 129
def run(plan_file: str, as_json: bool, output: Optional[str], **options) -> None:
    """Train a few steps of PLAN_FILE's layout with torch.distributed, check every loss and
    gradient norm against one process, and compare time and memory with the prediction."""
    if output is not None:
        check_output(output, (plan_file,))
    try:
        report = _execute(plan_file, options)
    except KeyboardInterrupt:  # Ctrl-C outside the launch (imports, the reference run)
        raise Interrupted("interrupted by Ctrl-C") from None
    if inside_launcher() and int(os.environ["RANK"]) != 0:
        if not report.verification.passed:
            raise PlannerError(f"verification failed: {report.verification.message}")
        return  # inside torchrun/Slurm, rank 0 reports
    if output:
        write_atomic(output, report.model_dump_json(indent=2) + "\n")
    if as_json:
        click.echo(report.model_dump_json(indent=2))
    else:
        render.run_report(report)
    if not report.verification.passed:
        raise PlannerError(f"verification failed: {report.verification.message}")


def _execute(plan_file: str, o: dict) -> RunReport:
    """Refuse what cannot run (before any worker starts), launch, verify, report. `o`: the
    command's options (the launch's, the steps', the rehearsal's --scale-*)."""
    lr, tolerance, timeout_s, seed, nnodes = o["lr"], o["tolerance"], o["timeout_s"], o["seed"], o["nnodes"]
    scales = ("scale_layers", "scale_hidden", "scale_heads", "scale_vocab", "scale_seq_len", "rehearse_dp")
    rehearsal = Rehearsal(*(o[k] for k in scales))
    doc = read_plan_file(Path(plan_file))
    check_plan(doc.plan, doc.model, doc.job, doc.num_gpus)  # the same validation as `plan estimate --plan`
    check_real("--lr", lr)
    check_real("--tolerance", tolerance)
    check_real("--timeout", timeout_s)
    if tolerance <= 0:
        raise UsageError("--tolerance must be positive")
    check_timeout(timeout_s)
    check_seed(seed)
    case = prepare_case(
        doc.model, doc.job, doc.plan, rehearsal, steps=o["steps"], warmup=o["warmup"], seed=seed, learning_rate=lr
    )
    nproc_per_node = o["nproc_per_node"]
    if nproc_per_node is None:  # the plan's world, or the rehearsal's (--rehearse-dp)
        if nnodes < 1:
            raise UsageError(f"--nnodes must be at least 1, got {nnodes}")
        if case.plan.world_size % nnodes:
            raise UsageError(
                f"the plan's {case.plan.world_size} ranks do not split over --nnodes {nnodes}; give --nproc-per-node"
            )
        nproc_per_node = case.plan.world_size // nnodes
    spec = LaunchSpec(nproc_per_node, nnodes, o["node_rank"], o["rdzv_endpoint"])
    validate(spec)  # launch() checks it too, but only after the estimate would have been printed
    world, how = launch_world(spec)
    check_world(case.plan, world, how)
    check_profile_size(doc.cluster, world, plan_file)  # a profile predicts only the world it measured
    require_torch("run")  # installed (not loaded yet): said before what this machine would hold
    ranks_checked = _check_this_machine(case, rehearsal, doc.cluster, o["backend"], nproc_per_node)
    # Everything above refuses a bad request in a fraction of a second; torch (seconds) only now.
    _import_torch()
    backend = resolve_backend(o["backend"], nproc_per_node)
    check_profile_size(doc.cluster, world, plan_file, backend)
    if backend == "gloo" and not inside_launcher() and not ranks_checked:
        check_host_memory(case, doc.cluster, nproc_per_node, host_memory_bytes())
    if case.fp8:  # run_plans refuses it too, but only after the estimate would have been printed
        check_fp8("cuda" if backend == "nccl" else "cpu")
    with _progress(case, doc.cluster, backend, world) as progress:
        options = RunOptions(tolerance, timeout_s, backend)
        return run_plans([case], [doc.cluster], spec, options, [plan_file], progress)[0]


def _check_this_machine(case, rehearsal: Rehearsal, cluster, backend: str, nproc_per_node: int) -> bool:
    """What this machine must hold, checked before torch loads: the single-process reference
    run (on the CPU whatever the backend; one a process inside torchrun / Slurm) and, where
    the ranks are CPU processes, how many and their memory. True when the ranks were checked."""
    available = host_memory_bytes()
    on_cpu = not inside_launcher() and (backend == "gloo" or (backend == "auto" and gpu_absent()))
    if on_cpu:
        check_host_memory(case, cluster, nproc_per_node, available)
    check_reference_memory(case, rehearsal, available, local_processes())
    return on_cpu


@contextlib.contextmanager
def _progress(case, cluster, backend: str, world: int):
    """Progress on stderr (never on stdout, so --json stays clean): first an estimate of the
    whole run (planner/executor/duration.py), then a bar on a terminal or plain lines
    elsewhere: workers starting, the distributed run's steps, the single-process reference
    runs, each with the time left; at the end the time it took."""
    if inside_launcher():  # rank 0 of torchrun / Slurm reports; the enclosing launcher shows its progress
        yield None
        return
    from planner.executor.duration import RunClock, core_gemm_rates, estimate_run

    est = estimate_run(case, core_gemm_rates(), cluster if backend == "nccl" else None)
    clock = RunClock(est, render.duration)
    with render.ProgressLines("plan run:", sys.stderr.isatty(), left=clock.update) as lines:
        lines.say(f"estimate before starting: {est.describe(render.duration)}")
        lines.update(0, case.steps, f"starting {world} worker{'s' if world > 1 else ''}")
        yield lines.update
        lines.say(
            f"done in {render.duration(lines.elapsed())} (estimated {render.duration(est.total_s)} before starting)"
        )


def _import_torch() -> None:
    """Import torch with Ctrl-C deferred to the end of the import: an import interrupted
    half-way leaves numpy/torch broken (a RecursionError at their next use, not a clean exit)."""
    require_torch("run")
    pressed: list = []
    previous = signal.signal(signal.SIGINT, lambda *_: pressed.append(True))
    try:
        import torch  # noqa: F401
    finally:
        signal.signal(signal.SIGINT, previous)
    if pressed:
        raise KeyboardInterrupt
