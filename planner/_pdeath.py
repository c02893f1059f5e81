"""Workers die with their launcher (kept import-free: planner/__init__.py calls it first thing
in a worker, before pydantic or torch load).

A worker knows its launcher from one environment variable, PLAN_LAUNCHER = "PID:START": the
launcher's process id and its start time (field 22 of /proc/PID/stat, clock ticks since boot),
which together name one process for the machine's uptime (a pid alone is reused). Anything
else in the variable, or a PLAN_LAUNCHER_PID left over from older versions or set by hand, is
not a launcher: the process is an ordinary `plan` command. Of a well-formed value:
- that process alive and this one's parent: a worker, which dies with it (die_with_parent);
- that process alive but not the parent: a process started below a worker (it inherited the
  variable), not a worker itself;
- that process gone: the launcher died while this worker started; it exits at once, with
  one line on stderr (its log file).
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Optional

LAUNCHER = "PLAN_LAUNCHER"  # set for its workers by planner/distributed/launch.py:_worker_environment


def start_time(pid: int) -> Optional[str]:
    """When process `pid` started (clock ticks since boot, /proc/PID/stat field 22), or None
    when there is no such process (or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat.rsplit(b")", 1)[-1].split()  # after the command name, which may hold spaces: field 3 on
    return fields[19].decode() if len(fields) > 19 else None


def launcher_value() -> str:
    """PLAN_LAUNCHER's value for the workers of this process."""
    pid = os.getpid()
    return f"{pid}:{start_time(pid) or 0}"


def _launcher() -> Optional[tuple[int, str]]:
    """(pid, start time) from a well-formed PLAN_LAUNCHER naming another process, or None."""
    pid, sep, start = os.environ.get(LAUNCHER, "").partition(":")
    if not (sep and pid.isascii() and pid.isdigit() and start.isascii() and start.isdigit()):
        return None
    if not 0 < int(pid) < 2**31 or int(pid) == os.getpid():
        return None
    return int(pid), start


def _launcher_gone(pid: int, start: str) -> bool:
    if start != "0":
        return start_time(pid) != start
    try:  # its start time was unknown to the launcher itself (no /proc): whether the pid is alive
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, another user's
        return False
    return False


def in_a_worker() -> bool:
    """This process was started by a `plan` launcher: its parent is the launcher the
    environment names, or that launcher has died (see the module docstring)."""
    found = _launcher()
    if found is None:
        return False
    pid, start = found
    return os.getppid() == pid or _launcher_gone(pid, start)


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when the process that started it dies (Linux
    prctl PR_SET_PDEATHSIG): a launcher killed with SIGKILL leaves no worker behind (and
    so no resource tracker waiting on them). If the launcher is already gone (it died while
    this worker started), exit now."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    found = _launcher() if in_a_worker() else None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if found is not None and os.getppid() != found[0]:  # its launcher is not its parent any more: gone
        try:  # a worker's stderr is its log file; anywhere else this is the one line a command ends with
            os.write(
                2,
                f"error: the plan launcher that started this process (pid {found[0]}, {LAUNCHER} in the "
                "environment) has exited\n".encode(),
            )
        except OSError:
            pass
        os._exit(1)


def end_in_one_line() -> None:
    """For `plan` itself (planner/cli/main.py calls this first): SIGTERM and SIGHUP, where
    nothing else handles them (while the modules load, before a command's own handlers,
    planner/distributed/launch.py:signals_interrupt, and after them, as the interpreter
    exits), end the process with one line and the shell's exit code, 128 + the signal's
    number (143, 129), not silently. There is nothing to stop or remove first then: the
    command's own handlers do that while it works. A signal set to be ignored (nohup's
    SIGHUP) stays ignored. Not in a worker: a spawned worker imports the launcher's main module
    (planner/cli/main.py) again, and its launcher stops it with SIGTERM, which must end it
    silently, as the default does."""
    if in_a_worker():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        try:
            if signal.getsignal(sig) == signal.SIG_DFL:
                signal.signal(sig, _end)
        except (ValueError, OSError):  # not the main thread, or no such signal here
            return


def _end(signum: int, _frame) -> None:
    try:
        sys.stdout.flush()  # what the command printed before it (a report, when its work is done)
    except Exception:  # a write this signal interrupted, a closed or broken stdout: nothing more to say
        pass
    try:
        os.write(2, f"error: interrupted by {signal.Signals(signum).name}\n".encode())
    except OSError:
        pass
    os._exit(128 + signum)
