"""Launch worker processes the way `torchrun` does, or run inside one that already did.

Uses torch.distributed's elastic launcher (`torch.distributed.launcher.api.elastic_launch`,
the machinery behind torchrun) with a c10d rendezvous: `--nproc-per-node` workers on this
machine, and for several machines `--nnodes N --node-rank R --rdzv-endpoint host:port`
(node 0 hosts the rendezvous). No restarts: a rank that raises or dies stops the whole run,
the agent terminates the others (SIGTERM, then SIGKILL) and we report which rank failed and
why, in one line. Ctrl-C, SIGTERM or SIGHUP to the launcher stops every worker the same way
and raises `Interrupted` (workers do not see Ctrl-C themselves: see _ctrl_c_stops_workers).

Workers' stdout and stderr go to log files (so `--json` keeps stdout clean); the log
directory is removed after a successful or interrupted run and named in the error after a
failed one, with the failed rank's traceback written beside the logs.

Hygiene of the workers (see _worker_environment): they import from the launcher's import
path only (the spawn bootstrap `python -c ...` would otherwise put the current directory
first, so a `multiprocessing/` or `torch/` folder there would be imported by every worker),
and on one machine everything listens on 127.0.0.1 only (see _loopback_rendezvous).

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


LOOPBACK = "127.0.0.1"
_LOOPBACK_RENDEZVOUS = "plan-loopback"  # our name for torch's c10d rendezvous kept on loopback


class Interrupted(PlannerError):
    """The launcher was interrupted (Ctrl-C, SIGTERM, SIGHUP); all workers were stopped.
    The exit code is the shell's for a process the signal ended: 128 + its number
    (130 for Ctrl-C, 143 for SIGTERM)."""

    def __init__(self, message: str, signum: int = signal.SIGINT):
        super().__init__(message)
        self.exit_code = 128 + int(signum)


def _signal_name(signum: int) -> str:
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


@contextmanager
def signals_interrupt():
    """SIGTERM and SIGHUP raise `Interrupted` in this (main) thread instead of killing the
    process where it stands, so `finally` blocks remove temporary files and the command ends
    with one line and exit code 143 (129). Inside the launch the agent's own handlers take
    over and stop the workers first. Not inside torchrun or Slurm: there the enclosing
    launcher owns this process's lifetime."""
    if threading.current_thread() is not threading.main_thread() or inside_launcher():
        yield
        return

    def interrupt(signum, _frame):
        raise Interrupted(f"interrupted by {_signal_name(signum)}", signum)

    handlers = _signal_handlers()
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupt)
    try:
        yield
    finally:
        _restore(handlers)


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
        s.bind((LOOPBACK, 0))
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
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    # The elastic agent and torch.multiprocessing log every failure and termination with
    # tracebacks; we report one line ourselves.
    # torch's elastic loggers set their own levels, so each one is silenced by name.
    prefixes = ("torch.distributed.elastic", "torch.multiprocessing", "torch.distributed.launcher")
    for name in [*prefixes, *logging.root.manager.loggerDict]:
        if name.startswith(prefixes):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    rendezvous_handler_registry.register(_LOOPBACK_RENDEZVOUS, _loopback_rendezvous)  # idempotent
    one_node = spec.nnodes == 1 and not spec.rdzv_endpoint
    handlers = _signal_handlers()
    ctrl_c: dict = {}
    keep_logs = False  # only a failure names its logs; success and interruption remove them
    log_dir = tempfile.mkdtemp(prefix="plan-launch-")
    try:
        config = LaunchConfig(
            min_nodes=spec.nnodes,
            max_nodes=spec.nnodes,
            nproc_per_node=spec.nproc_per_node,
            run_id=spec.run_id or (uuid.uuid4().hex[:12] if spec.nnodes == 1 else "plan-run"),
            # One machine: port 0, the loopback store picks a free one (no race with another run).
            rdzv_endpoint=f"{LOOPBACK}:0" if one_node else spec.rdzv_endpoint,
            rdzv_backend=_LOOPBACK_RENDEZVOUS if one_node else "c10d",
            rdzv_configs={"is_host": spec.node_rank == 0, "rank": spec.node_rank, "join_timeout": spec.join_timeout_s},
            local_addr=LOOPBACK if one_node else None,  # becomes the workers' MASTER_ADDR
            max_restarts=0,
            monitor_interval=0.1,
            start_method="spawn",
            logs_specs=DefaultLogsSpecs(log_dir=log_dir, redirects=Std.ALL),
            signals_to_handle="SIGTERM,SIGHUP,SIGQUIT",  # SIGINT: see _ctrl_c_stops_workers
        )
        with _worker_environment(one_node), _ctrl_c_stops_workers(ctrl_c):
            results = elastic_launch(config, entrypoint)(*args)
    except ChildFailedError as exc:
        keep_logs = True
        local = range(spec.node_rank * spec.nproc_per_node, (spec.node_rank + 1) * spec.nproc_per_node)
        raise PlannerError(_failure_message(exc, log_dir, local)) from None
    except SignalException as exc:
        signum = signal.SIGINT if ctrl_c else exc.sigval
        raise Interrupted(f"interrupted by {_signal_name(signum)}; all workers stopped", signum) from None
    except KeyboardInterrupt:
        raise Interrupted("interrupted by Ctrl-C; all workers stopped") from None
    except Interrupted:  # signals_interrupt's, before the agent had its handlers: no worker yet
        raise
    except Exception as exc:  # rendezvous and agent errors: one line, not a traceback
        keep_logs = True
        detail = str(exc).strip().splitlines()
        raise PlannerError(f"launch failed: {type(exc).__name__}: {detail[0] if detail else ''} (logs: {log_dir})") from None
    finally:
        _restore(handlers)  # the agent's handlers turn a later Ctrl-C into its SignalException
        if not keep_logs:
            shutil.rmtree(log_dir, ignore_errors=True)
    # The agent keys results by global rank already.
    return {int(k): v for k, v in results.items()}


@contextmanager
def _worker_environment(one_node: bool):
    """What the workers inherit through the environment, for the time of the launch:
    - LAUNCHER_PID: they die with this process (planner/_pdeath.py);
    - PYTHONSAFEPATH: the spawn bootstrap (`python -c "from multiprocessing.spawn import
      ..."`, and the resource tracker's alike) would put '' (the current directory) first
      on sys.path and import `multiprocessing` from there before any of our code runs;
      multiprocessing then sets the worker's sys.path to the launcher's, nothing more
      (Python 3.11+; 3.10 ignores the variable);
    - GLOO_SOCKET_IFNAME (one machine, unless set): gloo listens on loopback, not on the
      address the host name resolves to."""
    values = {LAUNCHER_PID: str(os.getpid()), "PYTHONSAFEPATH": "1"}
    if one_node and "GLOO_SOCKET_IFNAME" not in os.environ and os.path.exists("/sys/class/net/lo"):
        values["GLOO_SOCKET_IFNAME"] = "lo"
    names = [*values, "TORCHELASTIC_SIGNALS_TO_HANDLE"]  # the agent sets the last one for itself
    saved = {k: os.environ.get(k) for k in names}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _loopback_store(port: int, timeout_s: int = 60):
    """A TCPStore server listening on 127.0.0.1 only. Given any host name, TCPStore listens
    on every interface ('::'); a socket bound here and handed over (master_listen_fd, which
    the store then owns) is how to narrow it."""
    from datetime import timedelta

    import torch.distributed as dist

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((LOOPBACK, port))
        sock.listen(socket.SOMAXCONN)
        port = sock.getsockname()[1]
    except OSError:
        sock.close()
        raise
    return dist.TCPStore(LOOPBACK, port, is_master=True, multi_tenant=True, master_listen_fd=sock.detach(),
                         timeout=timedelta(seconds=timeout_s))


def _loopback_rendezvous(params):
    """torch's c10d rendezvous handler (`create_handler`, the one torchrun uses) for a single
    machine, with both of its stores on loopback: the rendezvous store, and the store the
    workers' process group starts from (MASTER_ADDR/MASTER_PORT; the agent creates it in
    `_create_tcp_store_server`, replaced here)."""
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    class Backend(C10dRendezvousBackend):
        @property
        def name(self) -> str:  # the registry checks that the handler reports the name it was asked for
            return _LOOPBACK_RENDEZVOUS

    _, port = parse_rendezvous_endpoint(params.endpoint, default_port=0)
    store = _loopback_store(port, params.get_as_int("read_timeout", 60))
    handler = create_handler(store, Backend(store, params.run_id), params)
    # torch makes the workers' store in this method; this handler's makes it on loopback (setattr:
    # an assignment would read as an unused attribute to vulture, which cannot see torch call it)
    setattr(handler, "_create_tcp_store_server", lambda _addr, _port: _loopback_store(0))  # noqa: B010
    return handler


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

    before = signal.getsignal(signal.SIGTERM)

    def on_ctrl_c(_signum, _frame):
        seen["ctrl_c"] = True
        if signal.getsignal(signal.SIGTERM) is before:  # the agent is not running yet
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


def report_progress(path: Optional[str], done: int, total: int, message: str) -> None:
    """A worker's progress line, 'done/total message', appended to a file its launcher
    follows (follow_progress). The first worker of each node writes (LOCAL_RANK 0), so
    every node's launcher shows its own; planner/profiler/profile.py:Progress writes alike."""
    if path:
        with open(path, "a") as f:
            f.write(f"{done}/{total} {message}\n")


def _last_progress(path: str) -> Optional[tuple[int, int, str]]:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 400))
            lines = f.read().decode(errors="replace").strip().splitlines()
    except OSError:
        return None
    done, _, message = (lines[-1] if lines else "").partition(" ")
    n, _, total = done.partition("/")
    return (int(n), int(total), message) if n.isdigit() and total.isdigit() else None


@contextmanager
def follow_progress(path: Optional[str], update: Optional[Callable[[int, int, str], None]], interval_s: float = 0.25):
    """While the launch holds this (main) thread, a daemon thread reads the last line of
    `path` every `interval_s` and calls update(done, total, message) when it changes; once
    more when the launch is over, so a run shorter than the interval still shows its end."""
    if not path or update is None:
        yield
        return
    stop = threading.Event()

    def follow():
        seen, over = None, False
        while not over:
            over = stop.wait(interval_s)
            line = _last_progress(path)
            if line is not None and line != seen:
                seen = line
                update(*line)

    thread = threading.Thread(target=follow, name="plan-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=2 * interval_s + 1)


__all__ = ["LaunchSpec", "Interrupted", "launch", "inside_launcher", "init_process_group", "free_port", "validate",
           "signals_interrupt", "report_progress", "follow_progress"]
