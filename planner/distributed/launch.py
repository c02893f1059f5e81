"""Launch worker processes the way `torchrun` does, or run inside one that already did.

Uses torch.distributed's elastic launcher (`torch.distributed.launcher.api.elastic_launch`,
the machinery behind torchrun) with a c10d rendezvous: `--nproc-per-node` workers on this
machine, and for several machines `--nnodes N --node-rank R --rdzv-endpoint host:port`
(node 0 hosts the rendezvous). No restarts: a rank that raises or dies stops the whole run,
the agent terminates the others (SIGTERM, then SIGKILL) and we report which rank failed and
why, in one line. Ctrl-C or SIGTERM to the launcher stops every worker the same way and
raises `Interrupted` (workers do not see Ctrl-C themselves: see _ctrl_c_stops_workers).

Workers' stdout and stderr go to log files (so `--json` keeps stdout clean); the log
directory is removed after a successful run and named in the error after a failed one,
with the failed rank's traceback written beside the logs.

If the environment already has RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT (a
torchrun job), or a Slurm job step with several tasks plus MASTER_ADDR/MASTER_PORT (each
task one rank), the worker function runs in this process instead.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import tempfile
import threading
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Optional

from planner._pdeath import LAUNCHER_PID, die_with_parent
from planner.errors import PlannerError, UsageError

# Errors a rank reports because another rank went away first: not the root cause.
_SECONDARY = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "timed out", "Timed out", "SIGTERM", "Signal 15")


class Interrupted(PlannerError):
    """The launcher was interrupted (Ctrl-C / SIGTERM); all workers were stopped."""

    exit_code = 130


@dataclass(frozen=True)
class LaunchSpec:
    nproc_per_node: int = 1
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: Optional[str] = None  # host:port; default a free port on localhost
    run_id: Optional[str] = None
    backend: str = "auto"  # "gloo", "nccl" or "auto" (nccl when CUDA is available)
    join_timeout_s: int = 120  # how long a node waits for the others at the rendezvous

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes


def _slurm_environment() -> None:
    """Inside a Slurm step with several tasks (srun), each task is one rank: map Slurm's
    variables to torch's. MASTER_ADDR/MASTER_PORT must come from the job script."""
    if "RANK" in os.environ or int(os.environ.get("SLURM_NTASKS", "1")) < 2:
        return
    if not all(k in os.environ for k in ("SLURM_PROCID", "SLURM_LOCALID", "MASTER_ADDR", "MASTER_PORT")):
        return
    os.environ.setdefault("RANK", os.environ["SLURM_PROCID"])
    os.environ.setdefault("WORLD_SIZE", os.environ["SLURM_NTASKS"])
    os.environ.setdefault("LOCAL_RANK", os.environ["SLURM_LOCALID"])


def inside_launcher() -> bool:
    """True in a process started by torchrun / Slurm with the distributed environment set."""
    _slurm_environment()
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def validate(spec: LaunchSpec) -> None:
    if spec.nproc_per_node < 1 or spec.nnodes < 1:
        raise UsageError(f"--nproc-per-node and --nnodes must be at least 1, got {spec.nproc_per_node} and {spec.nnodes}")
    if not 0 <= spec.node_rank < spec.nnodes:
        raise UsageError(f"--node-rank {spec.node_rank} must be in [0, {spec.nnodes - 1}] for --nnodes {spec.nnodes}")
    if spec.nnodes > 1 and not spec.rdzv_endpoint:
        raise UsageError("several nodes need --rdzv-endpoint host:port (the same on every node; node 0 hosts it)")
    if spec.rdzv_endpoint:
        host, sep, port = spec.rdzv_endpoint.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise UsageError(f"--rdzv-endpoint must be host:port, got {spec.rdzv_endpoint!r}")


def launch(spec: LaunchSpec, entrypoint: Callable[..., Any], *args: Any) -> dict[int, Any]:
    """Run `entrypoint(*args)` on every rank; returns {global rank: return value} for this
    node's ranks. `entrypoint` must be a module-level function (workers are spawned)."""
    validate(spec)
    if inside_launcher():
        return {int(os.environ["RANK"]): entrypoint(*args)}
    import logging

    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    # The elastic agent and torch.multiprocessing log every failure and termination with
    # tracebacks; we report one line ourselves.
    # torch's elastic loggers set their own levels, so each one is silenced by name.
    prefixes = ("torch.distributed.elastic", "torch.multiprocessing", "torch.distributed.launcher")
    for name in [*prefixes, *logging.root.manager.loggerDict]:
        if name.startswith(prefixes):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    log_dir = tempfile.mkdtemp(prefix="plan-launch-")
    config = LaunchConfig(
        min_nodes=spec.nnodes,
        max_nodes=spec.nnodes,
        nproc_per_node=spec.nproc_per_node,
        run_id=spec.run_id or (uuid.uuid4().hex[:12] if spec.nnodes == 1 else "plan-run"),
        rdzv_endpoint=spec.rdzv_endpoint or f"127.0.0.1:{free_port()}",
        rdzv_backend="c10d",
        rdzv_configs={"is_host": spec.node_rank == 0, "rank": spec.node_rank, "join_timeout": spec.join_timeout_s},
        max_restarts=0,
        monitor_interval=0.1,
        start_method="spawn",
        logs_specs=DefaultLogsSpecs(log_dir=log_dir, redirects=Std.ALL),
        signals_to_handle="SIGTERM,SIGHUP,SIGQUIT",  # SIGINT: see _ctrl_c_stops_workers
    )
    handlers = _signal_handlers()
    ctrl_c: dict = {}
    os.environ[LAUNCHER_PID] = str(os.getpid())
    try:
        with _ctrl_c_stops_workers(ctrl_c):
            results = elastic_launch(config, entrypoint)(*args)
    except ChildFailedError as exc:
        local = range(spec.node_rank * spec.nproc_per_node, (spec.node_rank + 1) * spec.nproc_per_node)
        raise PlannerError(_failure_message(exc, log_dir, local)) from None
    except SignalException as exc:
        how = "Ctrl-C" if ctrl_c else f"signal {exc.sigval.name}"
        raise Interrupted(f"interrupted by {how}; all workers stopped (logs: {log_dir})") from None
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted by Ctrl-C; all workers stopped (logs: {log_dir})") from None
    except Exception as exc:  # rendezvous and agent errors: one line, not a traceback
        detail = str(exc).strip().splitlines()
        raise PlannerError(f"launch failed: {type(exc).__name__}: {detail[0] if detail else ''} (logs: {log_dir})") from None
    finally:
        os.environ.pop(LAUNCHER_PID, None)
        _restore(handlers)  # the agent's handlers turn a later Ctrl-C into its SignalException
    shutil.rmtree(log_dir, ignore_errors=True)
    # The agent keys results by global rank already.
    return {int(k): v for k, v in results.items()}


@contextmanager
def _ctrl_c_stops_workers(seen: dict):
    """A terminal's Ctrl-C reaches its whole process group, workers included, and a worker
    still importing torch would die of it with a KeyboardInterrupt traceback. SIG_IGN is
    the one disposition a child keeps through exec (and then Python installs no SIGINT
    handler), so SIGINT is ignored while the agent spawns the workers (we wrap the agent's
    `start_processes` for that moment). The launcher turns its own Ctrl-C into a SIGTERM to
    itself, which the agent handles by stopping every worker with SIGTERM."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    from torch.distributed.elastic.agent.server import local_elastic_agent as agent

    def on_ctrl_c(_signum, _frame):
        seen["ctrl_c"] = True
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):  # the agent is not running yet
            raise KeyboardInterrupt
        os.kill(os.getpid(), signal.SIGTERM)

    spawn = getattr(agent, "start_processes", None)

    def spawn_ignoring_ctrl_c(*args, **kwargs):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            return spawn(*args, **kwargs)
        finally:
            signal.signal(signal.SIGINT, on_ctrl_c)

    previous = signal.signal(signal.SIGINT, on_ctrl_c)
    if spawn is not None:
        agent.start_processes = spawn_ignoring_ctrl_c
    try:
        yield
    finally:
        if spawn is not None:
            agent.start_processes = spawn
        signal.signal(signal.SIGINT, previous)


def _signal_handlers() -> dict:
    names = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")
    return {getattr(signal, n): signal.getsignal(getattr(signal, n)) for n in names if hasattr(signal, n)}


def _restore(handlers: dict) -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    for sig, handler in handlers.items():
        if handler is not None:
            signal.signal(sig, handler)


def _failure_text(failure) -> str:
    message = getattr(failure, "message", None)
    if isinstance(message, dict):
        message = message.get("message", "")
    lines = [line for line in str(message or "").splitlines() if line.strip()]
    if not lines or lines[-1].startswith("To enable traceback") or lines[-1].startswith("<N/A>"):
        code = failure.exitcode
        return f"exit code {code}" + (" (killed by a signal)" if code < 0 else "")
    # gloo prefixes its errors with the source file: "[/path/pair.cc:78] Timed out ..."
    return re.sub(r"\[[^\]]*\.(cc|cpp|h):\d+\] ", "", lines[-1].strip())


def root_cause(failures: dict) -> tuple[int, Any]:
    """The failure that started it: earliest, and among those of the same second one that
    is not a peer noticing the others' death (connection closed, timeout, SIGTERM)."""

    def key(item):
        rank, failure = item
        text = _failure_text(failure)
        return (getattr(failure, "timestamp", 0), any(s in text for s in _SECONDARY), rank)

    return min(failures.items(), key=key)


def _failure_message(exc, log_dir: str, local_ranks=()) -> str:
    """'rank R failed: <last line of its error> (logs: DIR)'; when R only timed out waiting,
    the ranks of this node that never failed are named: they stopped answering."""
    failures = getattr(exc, "failures", {}) or {}
    if not failures:
        return f"a worker failed: {exc} (logs: {log_dir})"
    rank, failure = root_cause(failures)
    silent = [r for r in local_ranks if r not in failures]
    if silent and "imed out" in _failure_text(failure):
        which = ", ".join(map(str, silent))
        return (f"rank{'s' if len(silent) > 1 else ''} {which} stopped answering: rank {rank} failed: "
                f"{_failure_text(failure)} (logs: {log_dir})")
    callstack = (getattr(failure, "error_file_data", None) or {}).get("message", {})
    if isinstance(callstack, dict) and callstack.get("extraInfo", {}).get("py_callstack"):
        with open(os.path.join(log_dir, f"rank{rank}-traceback.txt"), "w") as f:
            f.write(callstack["extraInfo"]["py_callstack"])
    others = sorted(r for r in failures if r != rank)
    also = f"; ranks {', '.join(map(str, others))} stopped after it" if others else ""
    return f"rank {rank} failed: {_failure_text(failure)}{also} (logs: {log_dir})"


def init_process_group(backend: str = "auto", timeout_s: float = 120.0):
    """Initialise torch.distributed from the launcher's environment; returns (rank, world, device)."""
    from datetime import timedelta

    die_with_parent()
    import torch
    import torch.distributed as dist

    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    local = int(os.environ.get("LOCAL_RANK", 0))
    if backend == "nccl":
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size(), device


__all__ = ["LaunchSpec", "Interrupted", "launch", "inside_launcher", "init_process_group", "free_port", "validate"]
