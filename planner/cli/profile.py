"""`plan profile`: measure this cluster and the model's layers; `--show` prints a profile."""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path
from typing import Optional

import click

from planner.cli import render
from planner.cli.common import require_torch
from planner.datafile import check_output, write_atomic
from planner.errors import PlannerError, UsageError
from planner.distributed.launch import Interrupted, LaunchSpec, inside_launcher, launch, validate
from planner.presets import load_model


@click.command()
@click.option("--model", "model_name", default="gpt2-124m", show_default=True,
              help="Model whose layers to measure: preset name, spec file or Hugging Face config.json.")
@click.option("--model-factory", default=None, help="Your own model: package.module:function returning an nn.Module.")
@click.option("--blocks-attr", default="layers", show_default=True, help="With --model-factory: the attribute holding its blocks.")
@click.option("--seq-len", type=int, default=None, help="Sequence length to measure [default: the model's].")
@click.option("--micro-batch-sizes", default=None, help="Comma-separated micro-batch sizes [default: 1 (quick) or 1,2,4].")
@click.option("--nproc-per-node", type=int, default=1, show_default=True, help="Ranks (GPUs, or CPU processes) per node.")
@click.option("--nnodes", type=int, default=1, show_default=True)
@click.option("--node-rank", type=int, default=0, show_default=True)
@click.option("--rdzv-endpoint", default=None, help="host:port of node 0, for several nodes.")
@click.option("--backend", type=click.Choice(["auto", "gloo", "nccl"]), default="auto", show_default=True)
@click.option("--quick", is_flag=True, help="Fewer sizes and repetitions (about a minute on 2 CPU processes).")
@click.option("--name", default=None, help="Name of the profile [default: measured-<host>].")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Where to write the profile JSON.")
@click.option("--show", "show_path", type=click.Path(dir_okay=False), default=None, help="Print a profile as tables instead.")
def profile(model_name, model_factory, blocks_attr, seq_len, micro_batch_sizes, nproc_per_node, nnodes, node_rank,
            rdzv_endpoint, backend, quick, name, output: Optional[str], show_path: Optional[str]) -> None:
    """Measure per-layer compute and the links of this cluster; write a hardware profile."""
    if show_path:
        from hardware_profiles import load_cluster

        if not Path(show_path).exists():
            raise UsageError(f"profile {show_path} does not exist")
        render.profile_report(load_cluster(show_path))
        return
    if not output:
        raise UsageError("give -o profile.json (where to write the profile), or --show profile.json")
    model = load_model(model_name)
    seq = seq_len if seq_len is not None else model.max_seq_len
    if seq < 1 or (model.learned_position_embeddings and seq > model.max_seq_len):
        raise UsageError(f"--seq-len {seq} must be between 1 and the model's {model.max_seq_len} positions")
    try:
        mbs = tuple(int(x) for x in (micro_batch_sizes or ("1" if quick else "1,2,4")).split(","))
    except ValueError:
        raise UsageError(f"--micro-batch-sizes must be comma-separated integers, got {micro_batch_sizes!r}") from None
    if not mbs or min(mbs) < 1:
        raise UsageError("--micro-batch-sizes must be positive")
    spec = LaunchSpec(nproc_per_node=nproc_per_node, nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint, backend=backend)
    validate(spec)
    check_output(output, (model_name, show_path))
    if model_factory:
        from planner.profiler.compute import load_factory

        try:
            load_factory(model_factory)
        except (ImportError, ValueError) as exc:
            raise UsageError(f"--model-factory: {exc}") from None

    require_torch("profile")
    from planner.profiler.profile import ProfileRequest, assemble

    progress_file = tempfile.NamedTemporaryFile(prefix="plan-profile-", suffix=".log", delete=False)
    progress_file.close()
    req = ProfileRequest(
        model=model, seq_len=seq, micro_batches=mbs, quick=quick, backend=backend,
        progress_path=None if inside_launcher() else progress_file.name, model_factory=model_factory, blocks_attr=blocks_attr,
    )
    try:
        results = _launch_with_progress(spec, req, progress_file.name)
    finally:
        os.unlink(progress_file.name)
    rank0 = results.get(0)
    if rank0 is None:  # another node: rank 0 writes the profile
        click.echo(f"node {node_rank}: measurements sent to node 0", err=True)
        return
    cluster = assemble(rank0, name or f"measured-{rank0['env'].hostname}", model)
    write_atomic(output, cluster.model_dump_json(indent=2) + "\n")
    render.profile_report(cluster)
    render.console.print(f"profile written to {output}")


def _launch_with_progress(spec: LaunchSpec, req, progress_path: str) -> dict:
    """Run the workers in a thread; render rank 0's progress lines as a rich progress bar."""
    from planner.profiler.profile import profile_worker

    if inside_launcher():
        return launch(spec, profile_worker, req)
    box: dict = {}

    def run():
        try:
            box["result"] = launch(spec, profile_worker, req)
        except BaseException as exc:  # re-raised in the main thread
            box["error"] = exc

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    try:
        with render.progress_bar("measuring") as bar:
            task = bar.add_task("starting workers", total=None)
            while worker.is_alive():
                worker.join(0.25)
                line = _last_line(progress_path)
                if line:
                    done, _, message = line.partition(" ")
                    n, _, total = done.partition("/")
                    if n.isdigit() and total.isdigit():
                        bar.update(task, completed=int(n), total=int(total), description=message)
    except KeyboardInterrupt:
        # The launch runs in this thread's shadow (the progress bar needs the main thread), so
        # the agent cannot see Ctrl-C: stop the workers here. They also die with this process
        # (planner/_pdeath.py), which exits right after with 130.
        _stop_workers()
        raise Interrupted("interrupted by Ctrl-C; all workers stopped, nothing written") from None
    if "error" in box:
        err = box["error"]
        if isinstance(err, PlannerError):
            raise err
        raise PlannerError(f"profiling failed: {err}") from None
    return box["result"]


def _stop_workers() -> None:
    """SIGTERM to this process's children (the workers), then SIGKILL to whatever is left after 1 s."""
    import signal
    import time

    children = _children(os.getpid())
    for pid in children:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    deadline = time.time() + 1.0
    while time.time() < deadline and any(_alive(p) for p in children):
        time.sleep(0.05)
    for pid in children:
        if _alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def _children(pid: int) -> list[int]:
    """Worker processes started by any thread of `pid` (Linux /proc), not multiprocessing's
    resource tracker, which cleans up and exits by itself once this process is gone."""
    out = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids = [int(x) for x in f.read().split()]
        except OSError:
            continue
        for kid in kids:
            try:
                with open(f"/proc/{kid}/cmdline", "rb") as f:
                    if b"resource_tracker" in f.read():
                        continue
            except OSError:
                continue
            out.append(kid)
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][:1] not in ("Z", "X")
    except OSError:
        return False


def _last_line(path: str) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read()[-400:].decode(errors="replace").strip().splitlines()
        return data[-1] if data else ""
    except OSError:
        return ""

