"""Launch worker processes the way `torchrun` does, or run inside one that already did.

Uses torch.distributed's elastic launcher (`torch.distributed.launcher.api.elastic_launch`,
the machinery behind torchrun) with a c10d rendezvous: `--nproc-per-node` workers on this
machine, and for several machines `--nnodes N --node-rank R --rdzv-endpoint host:port`
(node 0 hosts the rendezvous). No restarts: a rank that raises or dies stops the whole run,
the launcher terminates the others and we report which rank failed and why. If the
environment already has RANK/WORLD_SIZE/LOCAL_RANK (a torchrun or Slurm job step), the
worker function runs in this process instead.
"""

from __future__ import annotations

import os
import socket
import tempfile
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Optional

from planner.errors import PlannerError, UsageError


@dataclass(frozen=True)
class LaunchSpec:
    nproc_per_node: int = 1
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: Optional[str] = None  # host:port; default a free port on localhost
    run_id: Optional[str] = None
    backend: str = "auto"  # "gloo", "nccl" or "auto" (nccl when CUDA is available)

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes


def inside_launcher() -> bool:
    """True in a process started by torchrun / Slurm with the distributed environment set."""
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

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    # The elastic agent logs every failure with a traceback; we report one line ourselves.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    try:
        from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs

        logs = DefaultLogsSpecs(log_dir=tempfile.mkdtemp(prefix="plan-launch-"))
    except ImportError:  # pragma: no cover - older torch
        logs = None
    endpoint = spec.rdzv_endpoint or f"127.0.0.1:{free_port()}"
    config = LaunchConfig(
        min_nodes=spec.nnodes,
        max_nodes=spec.nnodes,
        nproc_per_node=spec.nproc_per_node,
        run_id=spec.run_id or (uuid.uuid4().hex[:12] if spec.nnodes == 1 else "plan-run"),
        rdzv_endpoint=endpoint,
        rdzv_backend="c10d",
        rdzv_configs={"is_host": spec.node_rank == 0, "rank": spec.node_rank, "join_timeout": 120},
        max_restarts=0,
        monitor_interval=0.1,
        start_method="spawn",
        logs_specs=logs,
    )
    try:
        results = elastic_launch(config, entrypoint)(*args)
    except ChildFailedError as exc:
        raise PlannerError(_failure_message(exc)) from None
    base = spec.node_rank * spec.nproc_per_node
    return {base + int(k): v for k, v in results.items()}


def _failure_message(exc) -> str:
    """'rank R failed: <last line of its error>' for the first failed rank."""
    failures = getattr(exc, "failures", {}) or {}
    if not failures:
        return f"a worker failed: {exc}"
    rank, failure = min(failures.items())
    text = ""
    message = getattr(failure, "message", None)
    if isinstance(message, dict):
        text = str(message.get("message", "")).strip()
    elif message:
        text = str(message).strip()
    last = [line for line in text.splitlines() if line.strip()]
    detail = last[-1] if last else f"exit code {failure.exitcode}"
    if detail.startswith("<N/A>") or not last:
        detail = f"exit code {failure.exitcode}" + (" (killed by a signal)" if failure.exitcode < 0 else "")
    return f"rank {rank} failed: {detail}"


def init_process_group(backend: str = "auto", timeout_s: float = 120.0):
    """Initialise torch.distributed from the launcher's environment; returns (rank, world, device)."""
    from datetime import timedelta

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
