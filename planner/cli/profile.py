"""`plan profile`: measure this cluster and the model's layers; `--show` prints a profile."""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile
from typing import Optional

import click

from planner.cli import render
from planner.cli.common import require_torch
from planner.datafile import check_output, missing, write_atomic
from planner.errors import UsageError
from planner.executor.duration import ItemClock
from planner.distributed.launch import LaunchSpec, follow_progress, inside_launcher, launch, signals_interrupt, validate
from planner.executor.prepare import check_cpu_ranks, check_profile_memory, gpu_absent, host_memory_bytes
from planner.presets import load_model
from planner.specs import MAX_GLOBAL_BATCH, MAX_SEQ_LEN


@click.command()
@click.option(
    "--model",
    "model_name",
    default="gpt2-124m",
    show_default=True,
    help="Model whose layers to measure: preset name, spec file or Hugging Face config.json.",
)
@click.option(
    "--model-factory",
    default=None,
    help="Your own model: package.module:function returning an nn.Module (also looked for in the current directory, after everything installed).",
)
@click.option(
    "--blocks-attr", default="layers", show_default=True, help="With --model-factory: the attribute holding its blocks."
)
@click.option("--seq-len", type=int, default=None, help="Sequence length to measure [default: the model's].")
@click.option(
    "--micro-batch-sizes", default=None, help="Comma-separated micro-batch sizes [default: 1 (quick) or 1,2,4]."
)
@click.option(
    "--nproc-per-node", type=int, default=1, show_default=True, help="Ranks (GPUs, or CPU processes) per node."
)
@click.option("--nnodes", type=int, default=1, show_default=True)
@click.option("--node-rank", type=int, default=0, show_default=True)
@click.option("--rdzv-endpoint", default=None, help="host:port of node 0, for several nodes.")
@click.option("--backend", type=click.Choice(["auto", "gloo", "nccl"]), default="auto", show_default=True)
@click.option(
    "--quick",
    is_flag=True,
    help="Fewer sizes and repetitions: GPT-2 124M at 1,024 tokens on 2 CPU processes took 2 min "
    "on an idle 2-core machine, 2.5-3 min beside other work (without --quick, its own estimate says ~27 min); every run "
    "prints its estimate first.",
)
@click.option("--name", default=None, help="Name of the profile [default: measured-<host>].")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Where to write the profile JSON.")
@click.option(
    "--show", "show_path", type=click.Path(dir_okay=False), default=None, help="Print a profile as tables instead."
)
@signals_interrupt()  # SIGTERM / SIGHUP: workers stopped, temporary files removed, one line, exit 143 / 129
def profile(model_name, output: Optional[str], show_path: Optional[str], **o) -> None:
    """Measure per-layer compute and the links of this cluster; write a hardware profile."""
    if show_path is not None:
        from hardware_profiles import load_cluster

        if output is not None:  # measuring is what writes; --show only prints
            raise UsageError("--show prints a profile and writes no file: drop -o (or drop --show to measure one)")
        if missing(show_path):
            raise UsageError(f"profile {show_path} does not exist")
        render.profile_report(load_cluster(show_path))
        return
    if not output:
        raise UsageError("give -o profile.json (where to write the profile), or --show profile.json")
    model = load_model(model_name)
    seq_len, quick, backend, model_factory = o["seq_len"], o["quick"], o["backend"], o["model_factory"]
    seq = seq_len if seq_len is not None else model.max_seq_len
    most = model.max_seq_len if model.learned_position_embeddings else MAX_SEQ_LEN
    if not 1 <= seq <= most:
        positions = " (the model's learned positions)" if model.learned_position_embeddings else ""
        raise UsageError(
            f"--seq-len must be between 1 and {most:,}{positions}, got {seq if abs(seq) < 10**20 else 'more'}"
        )
    sizes = o["micro_batch_sizes"]
    mbs = _micro_batch_sizes(sizes if sizes is not None else ("1" if quick else "1,2,4"))
    launch = ("nproc_per_node", "nnodes", "node_rank", "rdzv_endpoint")
    spec = LaunchSpec(**{k: o[k] for k in launch}, backend=backend)
    validate(spec)
    require_torch("profile")  # installed (not loaded yet): said before what this machine would hold
    _check_this_machine(model, mbs, seq, spec)
    check_output(output, (model_name, show_path))
    if model_factory:
        _factory_importable_from_cwd(model_factory)

    require_torch("profile")
    from planner.executor.runner import resolve_backend
    from planner.profiler.profile import ProfileRequest, assemble

    resolve_backend(backend, spec.nproc_per_node)  # --backend nccl where torch sees no GPU, or too few

    progress_path = None
    try:
        fd, progress_path = tempfile.mkstemp(prefix="plan-profile-", suffix=".log")
        os.close(fd)
        req = ProfileRequest(
            model=model,
            seq_len=seq,
            micro_batches=mbs,
            quick=quick,
            backend=backend,
            progress_path=None if inside_launcher() else progress_path,
            model_factory=model_factory,
            blocks_attr=o["blocks_attr"],
        )
        results = _launch_with_progress(spec, req, progress_path)
    finally:
        if progress_path:
            os.unlink(progress_path)
    rank0 = results.get(0)
    if rank0 is None:  # another node: rank 0 writes the profile
        click.echo(f"node {o['node_rank']}: measurements sent to node 0", err=True)
        return
    cluster = assemble(rank0, o["name"] or f"measured-{rank0['env'].hostname}", model)
    write_atomic(output, cluster.model_dump_json(indent=2) + "\n")
    render.profile_report(cluster)
    render.note(f"profile written to {output}")


def _launch_with_progress(spec: LaunchSpec, req, progress_path: str) -> dict:
    """Launch from this (main) thread, so that Ctrl-C and SIGTERM stop the workers the way
    `plan run`'s do (planner/distributed/launch.py); rank 0's progress lines drive a rich
    progress bar from a helper thread."""
    from planner.profiler.profile import START_S, profile_worker

    if inside_launcher():
        return launch(spec, profile_worker, req, temporary=(progress_path,))
    items, estimate = _estimate(spec, req)
    with render.ProgressLines(
        "plan profile:", sys.stderr.isatty(), left=ItemClock(items, render.duration).update
    ) as lines:
        lines.say(f"estimate before starting: {estimate}")
        lines.update(0, 0, f"starting {spec.nproc_per_node} worker{'s' if spec.nproc_per_node > 1 else ''}")
        with follow_progress(progress_path, lines.update):
            results = launch(spec, profile_worker, req, temporary=(progress_path,))
        lines.say(f"measured in {render.duration(lines.elapsed())} (estimated {render.duration(START_S + sum(items))})")
        return results


def _estimate(spec: LaunchSpec, req) -> tuple[list[float], str]:
    """Each reported item's estimated seconds (planner/profiler/profile.py:work_items) at the
    GEMM rate of one core here, measured now, and the estimate in words."""
    from planner.executor.duration import core_gemm_rates, usable_cores
    from planner.profiler.profile import _tp_shards, describe_work, work_items

    fp32, _ = core_gemm_rates()
    items = work_items(
        req, _tp_shards(req.model, spec.nproc_per_node), spec.world_size, spec.nproc_per_node, fp32, usable_cores()
    )
    return [s for _, s in items], describe_work(items, fp32, render.duration)


# The most micro-batch sizes one profile measures (each is a full pass over the layers).
MAX_SIZES = 16


def _micro_batch_sizes(text: str) -> tuple[int, ...]:
    """'1,2,4' -> (1, 2, 4): ASCII digits only, each between 1 and the planner's largest batch."""
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isascii() and p.isdigit() and len(p) <= 9 for p in parts):
        raise UsageError(
            f"--micro-batch-sizes must be comma-separated whole numbers (1-{MAX_GLOBAL_BATCH:,}), got {text!r}"
        )
    sizes = tuple(int(p) for p in parts)
    if not all(1 <= b <= MAX_GLOBAL_BATCH for b in sizes) or len(sizes) > MAX_SIZES:
        raise UsageError(
            f"--micro-batch-sizes must be at most {MAX_SIZES} sizes, each 1-{MAX_GLOBAL_BATCH:,}, got {text!r}"
        )
    return sizes


def _check_this_machine(model, micro_batches: tuple[int, ...], seq_len: int, spec: LaunchSpec) -> None:
    """Before torch loads: --backend nccl on a machine with no GPU device, and where the ranks
    are CPU processes, how many and whether their measurements fit in memory."""
    if inside_launcher():
        return
    if spec.backend == "nccl" and gpu_absent():
        raise UsageError(
            "--backend nccl needs a GPU, and this machine has none (no /dev/nvidia* or /dev/kfd); use --backend gloo"
        )
    if spec.backend == "gloo" or (spec.backend == "auto" and gpu_absent()):
        check_cpu_ranks(spec.nproc_per_node)
        check_profile_memory(model, micro_batches, seq_len, spec.nproc_per_node, host_memory_bytes())


def _factory_importable_from_cwd(model_factory: str) -> None:
    """With --model-factory the current directory is appended to the import path, so the
    module named there may live in it; searched after everything installed, it shadows
    nothing. The workers start with this process's import path: they find it too."""
    from planner.profiler.compute import load_factory

    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)
    out, bytecode = io.StringIO(), sys.dont_write_bytecode
    sys.dont_write_bytecode = True  # no __pycache__ left in the user's directory by a check
    try:
        with (
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(out),
        ):  # what it prints at import: not ours to show
            load_factory(model_factory)
    except (ImportError, ValueError) as exc:
        why = _one_line(exc)  # load_factory's own messages name the option already
        raise UsageError(why if why.startswith("--model-factory") else f"--model-factory: {why}") from None
    except SystemExit as exc:  # the module called sys.exit() while it was imported
        raise UsageError(f"--model-factory {model_factory!r}: importing it called sys.exit({exc.code!r})") from None
    except Exception as exc:  # whatever the user's module raises at import: its fault, said in one line
        raise UsageError(
            f"--model-factory {model_factory!r}: importing it raised {type(exc).__name__}: {_one_line(exc)}"
        ) from None
    finally:
        sys.dont_write_bytecode = bytecode


def _one_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else "(no message)"
