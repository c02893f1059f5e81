"""Workers die with their launcher (kept import-free: planner/__init__.py calls it first thing
in a worker, before pydantic or torch load)."""

from __future__ import annotations

import os
import signal
import sys

LAUNCHER_PID = "PLAN_LAUNCHER_PID"  # set for its workers by planner/distributed/launch.py:_worker_environment


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this worker when the process that started it dies (Linux
    prctl PR_SET_PDEATHSIG): a launcher killed with SIGKILL leaves no worker behind (and
    so no resource tracker waiting on them). If the launcher is already gone (it died while
    this worker started), exit now."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    parent = int(os.environ.get(LAUNCHER_PID) or os.getppid())
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:
        os._exit(1)


def in_a_worker() -> bool:
    """This process was started by a `plan` launcher (it is not the launcher itself)."""
    pid = os.environ.get(LAUNCHER_PID)
    return bool(pid) and pid != str(os.getpid())
