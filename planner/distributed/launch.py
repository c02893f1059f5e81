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

CPU workers may own their cores (own_cores: each pinned to a disjoint slice of the launcher's
cores, where there are at least as many as workers; `plan run`'s workers call it), so that
ranks do not preempt each other and step times repeat.

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
import sys
import tempfile
import threading
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from planner._pdeath import LAUNCHER, die_with_parent, in_a_worker, launcher_value
from planner.errors import Interrupted, PlannerError, UsageError

# Errors a rank reports because another rank went away first: not the root cause.
_SECONDARY = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "timed out",
    "Timed out",
    "SIGTERM",
    "Signal 15",
)


LOOPBACK = "127.0.0.1"
_LOOPBACK_RENDEZVOUS = "plan-loopback"  # our name for torch's c10d rendezvous kept on loopback


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
    if "RANK" in os.environ or not all(
        k in os.environ for k in ("SLURM_PROCID", "SLURM_LOCALID", "MASTER_ADDR", "MASTER_PORT")
    ):
        return  # not a Slurm step this maps (then none of its variables is read)
    tasks = os.environ.get("SLURM_NTASKS", "1")
    if not _whole(tasks):
        raise UsageError(
            f"SLURM_NTASKS={tasks!r} is not a number of tasks: run inside `srun`, which sets it, or unset it"
        )
    if int(tasks) < 2:
        return
    os.environ.setdefault("RANK", os.environ["SLURM_PROCID"])
    os.environ.setdefault("WORLD_SIZE", tasks)
    os.environ.setdefault("LOCAL_RANK", os.environ["SLURM_LOCALID"])


_ENCLOSING = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def _whole(text: str, digits: int = 9) -> bool:
    """`text` is a whole number written in at most `digits` ASCII digits."""
    return text.isascii() and text.isdigit() and len(text) <= digits


def inside_launcher() -> bool:
    """True in a process started by torchrun / Slurm with the distributed environment set.
    Its variables are checked here, where they are first read: a value torch could not use
    is one line naming the variable (UsageError), never a traceback from inside torch."""
    _slurm_environment()
    if not all(k in os.environ for k in _ENCLOSING):
        return False
    problem = enclosing_problem({k: os.environ[k] for k in (*_ENCLOSING, "LOCAL_WORLD_SIZE") if k in os.environ})
    if problem:
        raise UsageError(
            f"{problem} (set by the enclosing launcher, torchrun or Slurm; unset it to let plan launch its own workers)"
        )
    return True


def enclosing_problem(env: dict) -> Optional[str]:
    """What of an enclosing launcher's variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT) torch.distributed cannot start from, or None."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        if name in env and not _whole(env[name], 7):
            return f"{name}={env[name]!r} is not a whole number"
    world = int(env["WORLD_SIZE"])
    if not 1 <= world <= MAX_WORLD:
        return f"WORLD_SIZE={world} must be between 1 and {MAX_WORLD:,}"
    if int(env["RANK"]) >= world:
        return f"RANK={int(env['RANK'])} must be below WORLD_SIZE={world}"
    local_world = int(env.get("LOCAL_WORLD_SIZE", world))
    if not int(env["LOCAL_RANK"]) < local_world <= world:
        return f"LOCAL_RANK={int(env['LOCAL_RANK'])} must be below LOCAL_WORLD_SIZE={local_world}, at most WORLD_SIZE={world}"
    return endpoint_problem(f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}", "MASTER_ADDR:MASTER_PORT")


def local_processes() -> int:
    """Processes of this launch on this machine: LOCAL_WORLD_SIZE inside an enclosing
    launcher that sets it (torchrun does), else 1 (this process)."""
    value = os.environ.get("LOCAL_WORLD_SIZE", "1") if inside_launcher() else "1"
    return int(value) if _whole(value, 7) and int(value) > 0 else 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


# The most processes one launch starts (the planner's own bound on a cluster, planner/specs/base.py:MAX_GPUS).
MAX_WORLD = 2**20
# A host name (letters, digits, dots, hyphens; underscores as some resolvers allow) or an IPv6 address in brackets.
_HOST = re.compile(r"[A-Za-z0-9._-]{1,253}|\[[0-9A-Fa-f:.]{2,45}\]")


def endpoint_problem(endpoint: str, option: str = "--rdzv-endpoint") -> Optional[str]:
    """Why `endpoint` is not host:port with a port a TCP socket can listen on (1-65535), or None."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not _HOST.fullmatch(host) or not (port.isascii() and port.isdigit() and len(port) <= 5):
        return f"{option} must be host:port (a host name or [IPv6 address], a port 1-65535), got {endpoint!r}"
    if not 1 <= int(port) <= 65535:
        return f"{option} {endpoint!r}: the port must be in 1-65535, got {int(port)}"
    return None


def validate(spec: LaunchSpec) -> None:
    if spec.nproc_per_node < 1 or spec.nnodes < 1:
        raise UsageError(
            f"--nproc-per-node and --nnodes must be at least 1, got {spec.nproc_per_node} and {spec.nnodes}"
        )
    if spec.nproc_per_node > MAX_WORLD or spec.nnodes > MAX_WORLD or spec.world_size > MAX_WORLD:
        raise UsageError(
            f"--nproc-per-node {spec.nproc_per_node} x --nnodes {spec.nnodes} is more processes than any "
            f"cluster has (at most {MAX_WORLD:,})"
        )
    if not 0 <= spec.node_rank < spec.nnodes:
        raise UsageError(f"--node-rank {spec.node_rank} must be in [0, {spec.nnodes - 1}] for --nnodes {spec.nnodes}")
    if spec.nnodes > 1 and not spec.rdzv_endpoint:
        raise UsageError("several nodes need --rdzv-endpoint host:port (the same on every node; node 0 hosts it)")
    if spec.rdzv_endpoint is not None:
        problem = endpoint_problem(spec.rdzv_endpoint)
        if problem:
            raise UsageError(problem)


def launch(
    spec: LaunchSpec, entrypoint: Callable[..., Any], *args: Any, temporary: tuple[str, ...] = ()
) -> dict[int, Any]:
    """Run `entrypoint(*args)` on every rank; returns {global rank: return value} for this
    node's ranks. `entrypoint` must be a module-level function (workers are spawned).
    `temporary`: files the caller made for this launch (progress files), removed by the
    reaper if this process is killed before the caller removes them."""
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
    reaper = Reaper((log_dir, *temporary))
    endpoint = f"{LOOPBACK}:0" if one_node else spec.rdzv_endpoint
    assert endpoint is not None  # several nodes have one (validate)
    try:
        config = LaunchConfig(
            min_nodes=spec.nnodes,
            max_nodes=spec.nnodes,
            nproc_per_node=spec.nproc_per_node,
            run_id=spec.run_id or (uuid.uuid4().hex[:12] if spec.nnodes == 1 else "plan-run"),
            # One machine: port 0, the loopback store picks a free one (no race with another run).
            rdzv_endpoint=endpoint,
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
        raise PlannerError(
            f"launch failed: {type(exc).__name__}: {detail[0] if detail else ''} (logs: {log_dir})"
        ) from None
    finally:
        _restore(handlers)  # the agent's handlers turn a later Ctrl-C into its SignalException
        if not keep_logs:
            shutil.rmtree(log_dir, ignore_errors=True)
        reaper.close()
    # The agent keys results by global rank already.
    return {int(k): v for k, v in results.items()}


# The reaper: a small process that removes a launch's temporary files and directories if the
# launcher is killed with SIGKILL (no `finally` runs then; its workers die with it, see
# planner/_pdeath.py). It reads the paths on its stdin, and at end of file removes those not
# released since: the launcher releases them all when the launch is over (its own `finally`
# and the callers' remove what is temporary, a failed run keeps its logs), so only the kernel
# closing the pipe of a dead launcher leaves any. Why a process rather than sweeping stale
# directories at the next run: nothing is left behind even if plan never runs again, and logs
# a failed run kept (and named in its error) are never swept.
_REAPER = r"""
import os, shutil, sys
paths = {}
for line in sys.stdin.buffer:
    op, path = line[:1], os.fsdecode(bytes.fromhex(line[1:].decode().strip()))
    if op == b"+":
        paths[path] = True
    else:
        paths.pop(path, None)
for path in paths:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.unlink(path)
"""


class Reaper:
    """Removes `paths` if this process dies before close() (see _REAPER); best effort: where
    no process can be started, nothing changes but that."""

    def __init__(self, paths: tuple[str, ...]):
        import subprocess

        self._paths = paths
        self._proc: Optional[subprocess.Popen[bytes]]
        try:  # -I -S: no user site, no environment variables, nothing from the current directory
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _REAPER],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )  # a terminal's Ctrl-C or hang-up is not for it
            self._send("+", paths)
        except OSError:
            self._proc = None

    def _send(self, op: str, paths: tuple[str, ...]) -> None:
        assert self._proc is not None and self._proc.stdin is not None  # started, with stdin=PIPE
        for path in paths:
            self._proc.stdin.write(op.encode() + os.fsencode(path).hex().encode() + b"\n")
        self._proc.stdin.flush()

    def close(self) -> None:
        """The launch is over and this process lives on: its paths are its own again; the
        reaper exits without removing anything."""
        if self._proc is None:
            return
        import subprocess

        assert self._proc.stdin is not None  # stdin=PIPE
        try:
            self._send("-", self._paths)
            self._proc.stdin.close()
            self._proc.wait(timeout=5)
        except (OSError, ValueError):
            pass
        except subprocess.TimeoutExpired:  # stuck: it must not outlive the launch
            self._proc.kill()


@contextmanager
def _worker_environment(one_node: bool):
    """What the workers inherit through the environment, for the time of the launch:
    - LAUNCHER: they die with this process (planner/_pdeath.py);
    - PYTHONSAFEPATH: the spawn bootstrap (`python -c "from multiprocessing.spawn import
      ..."`, and the resource tracker's alike) would put '' (the current directory) first
      on sys.path and import `multiprocessing` from there before any of our code runs;
      multiprocessing then sets the worker's sys.path to the launcher's, nothing more
      (Python 3.11+; 3.10 ignores the variable);
    - GLOO_SOCKET_IFNAME (one machine, unless set): gloo listens on loopback, not on the
      address the host name resolves to;
    - PYTHONWARNINGS, for multiprocessing's resource tracker (started here, so that it has
      it): the semaphores of a launcher killed with SIGKILL are the tracker's to unlink, which
      it does, with a warning per kind that they "appear to be leaked"; not said."""
    quiet = "ignore::UserWarning:multiprocessing.resource_tracker"
    values = {
        LAUNCHER: launcher_value(),
        "PYTHONSAFEPATH": "1",
        "PYTHONWARNINGS": ",".join(w for w in (os.environ.get("PYTHONWARNINGS"), quiet) if w),
    }
    if one_node and "GLOO_SOCKET_IFNAME" not in os.environ and os.path.exists("/sys/class/net/lo"):
        values["GLOO_SOCKET_IFNAME"] = "lo"
    names = [*values, "TORCHELASTIC_SIGNALS_TO_HANDLE"]  # the agent sets the last one for itself
    saved = {k: os.environ.get(k) for k in names}
    os.environ.update(values)
    try:
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()
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
    return dist.TCPStore(
        LOOPBACK,
        port,
        is_master=True,
        multi_tenant=True,
        master_listen_fd=sock.detach(),
        timeout=timedelta(seconds=timeout_s),
    )


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
        return (
            f"rank{'s' if len(silent) > 1 else ''} {which} stopped answering: rank {rank} failed: "
            f"{_failure_text(failure)} (logs: {log_dir})"
        )
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
        if in_a_worker():  # ours: the agent's rendezvous has already gathered every worker
            dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
        else:
            _join_enclosing(backend, timeout_s)
    return dist.get_rank(), dist.get_world_size(), device


def core_slices(cores: Sequence[int], ranks: int) -> Optional[list[tuple[int, ...]]]:
    """Cores of their own for `ranks` processes of one machine: rank i gets the i-th of
    `ranks` disjoint contiguous slices of the sorted `cores`, len(cores) // ranks each (the
    remainder is left idle, for the launcher); None where there are fewer cores than ranks
    (then they share them)."""
    if ranks < 1 or len(cores) < ranks:
        return None
    ordered, width = sorted(cores), len(cores) // ranks
    return [tuple(ordered[i * width : (i + 1) * width]) for i in range(ranks)]


def own_cores() -> Optional[tuple[int, ...]]:
    """Pin this worker to its slice of the cores its launcher may use (core_slices by
    LOCAL_RANK of LOCAL_WORLD_SIZE; every worker of a launch inherits the launcher's
    affinity, so the slices are disjoint); the cores pinned to, or None where the ranks
    outnumber the cores. CPU ranks that share cores are preempted by each other at random,
    which is step-time noise of tens of percent. Only in workers a `plan` launcher started:
    torchrun and Slurm (srun --cpu-bind) bind their own tasks."""
    if not in_a_worker() or not hasattr(os, "sched_setaffinity"):
        return None
    local, count = int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    slices = core_slices(list(os.sched_getaffinity(0)), count)
    if slices is None:
        return None
    # Every thread of the process, not only this one: an affinity is per thread on Linux, and
    # gloo's threads started with the process group (the threads started later inherit it).
    for thread in _threads():
        try:
            os.sched_setaffinity(thread, slices[local])
        except ProcessLookupError:  # ended meanwhile
            continue
    return slices[local]


def process_cores() -> list[int]:
    """The cores any thread of this process may run on (the union of their affinities)."""
    cores: set[int] = set()
    for thread in _threads():
        try:
            cores |= os.sched_getaffinity(thread)
        except ProcessLookupError:
            continue
    return sorted(cores)


def _threads() -> list[int]:
    """This process's thread ids (Linux: /proc/self/task), else this thread only (0)."""
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [0]


def _join_enclosing(backend: str, timeout_s: float) -> None:
    """Start the process group inside torchrun / Slurm once every rank has checked in: each
    sets its key in the job's store (rank 0 hosts it, or torchrun's agent does) and waits up
    to --timeout for the others'. A rank that never came is named in one line (torch's own
    wait says only how many joined, in a long traceback)."""
    from datetime import timedelta

    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    where = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} (MASTER_ADDR:MASTER_PORT)"
    hosts = rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
    timeout = timedelta(seconds=timeout_s)
    with _native_stderr_silenced():
        store = _joined_store(dist, rank, world, hosts, timeout, where)
    dist.init_process_group(
        backend, store=dist.PrefixStore("default_pg", store), rank=rank, world_size=world, timeout=timeout
    )


def _joined_store(dist, rank: int, world: int, hosts: bool, timeout, where: str):
    """The job's store once every rank has set its key in it (see _join_enclosing)."""
    timeout_s = timeout.total_seconds()
    try:
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            world,
            is_master=hosts,
            timeout=timeout,
            wait_for_workers=False,
            multi_tenant=True,
        )
    except (RuntimeError, OSError) as exc:  # torch's DistError is a RuntimeError
        raise PlannerError(
            f"rank {rank} could not {'open' if hosts else 'reach'} the job's store at {where} within "
            f"{timeout_s:g} s (--timeout): {_first_line(exc)}"
        ) from None
    keys = [f"plan-joined/{r}" for r in range(world)]
    store.set(keys[rank], "1")
    try:
        store.wait(keys, timeout)
    except (RuntimeError, OSError):
        raise PlannerError(
            f"{_missing(store, keys)} of WORLD_SIZE={world} never joined: rank {rank} waited {timeout_s:g} s "
            f"(--timeout) at {where}; start every rank, or give the enclosing launcher the world "
            "that runs"
        ) from None
    return store


@contextmanager
def _native_stderr_silenced():
    """torch's C++ store logs its retries and time-outs, with stack frames, straight to file
    descriptor 2; a failure here is reported in one line instead (PlannerError)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no stderr to protect
        yield
        return
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    os.close(null)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _missing(store, keys: list[str]) -> str:
    """'rank 1' / 'ranks 1, 3' / 'ranks 1, 2, ... (12 in all)': the ranks whose key is not in the store."""
    try:
        missing = [r for r, key in enumerate(keys) if not store.check([key])]
    except (RuntimeError, OSError):
        return "some ranks"
    if not missing:
        return "some ranks"
    shown = ", ".join(map(str, missing[:8])) + (f", ... ({len(missing)} in all)" if len(missing) > 8 else "")
    return f"rank{'s' if len(missing) > 1 else ''} {shown}"


def _first_line(exc: BaseException) -> str:
    """The first line of an error, without gloo's / c10d's source-file prefix."""
    lines = str(exc).strip().splitlines()
    return re.sub(r"\[[^\]]*\.(cc|cpp|h):\d+\] ", "", lines[0]) if lines else type(exc).__name__


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


__all__ = [
    "LaunchSpec",
    "Interrupted",
    "launch",
    "inside_launcher",
    "init_process_group",
    "core_slices",
    "own_cores",
    "process_cores",
    "free_port",
    "validate",
    "signals_interrupt",
    "report_progress",
    "follow_progress",
]
