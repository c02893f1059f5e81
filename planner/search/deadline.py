"""When the search must stop: the wall clock of --time-limit and the signals that end `plan solve`.

A :class:`Deadline` is one wall-clock promise for a whole `plan solve` (parsing, enumeration,
bounds, MILPs, decoding): every loop that can run long polls it, each MILP gets the time left
(planner/search/ilp.py) and a solver callback that stops it when the clock runs out, and work
that grows with the model (counting layouts, bounding a 10^5-layer split) is bounded or polled.
When it expires, :class:`OutOfTime` unwinds to the search loop, which answers with the best plan
so far and its proven gap, or with no plan (planner/api.py says so in one line).

:func:`stop_on_signals` makes Ctrl-C, SIGTERM and SIGHUP end the command within a fraction of a
second wherever it is: in Python code the handler raises `Interrupted` (exit 130, 143, 129) at
once; inside a MILP (a C call that holds this thread) the handler only records the signal, the
solver's interrupt callback sees it and stops, and `Interrupted` is raised as the call returns
(:func:`solver_running`). A CBC subprocess is stopped with it (ilp.py).
"""

from __future__ import annotations

import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Literal, Optional, cast

from planner.errors import Interrupted

STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


class OutOfTime(Exception):
    """The deadline passed in the middle of a step (an internal signal, caught by the search)."""


# With no plan found when the limit comes, the search goes on for up to this long for a first
# one: an answer a moment late beats none (issue 18's `plan solve --time-limit 0.5`, gpt3-175b on
# 1,024 A100s, has its first plan after ~0.7 s on the 2-core development machine), and the
# command still ends within the limit plus 1 s.
FIRST_PLAN_GRACE_S = 0.5


@dataclass(frozen=True)
class Deadline:
    """A moment on time.perf_counter's clock (monotonic, system-wide; None: no limit), and how
    much later work towards a first plan may stop (:meth:`before_first_plan`)."""

    end: Optional[float] = None
    grace: float = 0.0

    @staticmethod
    def after(seconds: Optional[float], grace: float = 0.0) -> "Deadline":
        return Deadline(None if seconds is None else time.perf_counter() + seconds, grace)

    def left(self) -> Optional[float]:
        """Seconds left (never below 0), or None without a limit."""
        return None if self.end is None else max(0.0, self.end - time.perf_counter())

    def expired(self) -> bool:
        return self.end is not None and time.perf_counter() >= self.end

    def check(self) -> None:
        """Raise OutOfTime once the deadline has passed."""
        if self.expired():
            raise OutOfTime()

    def sooner(self, seconds: Optional[float]) -> "Deadline":
        """This deadline, or `seconds` from now if that comes first (the grace ends where it did)."""
        if seconds is None:
            return self
        end = time.perf_counter() + seconds
        if self.end is None:
            return Deadline(end)
        return Deadline(min(end, self.end), max(0.0, self.end + self.grace - min(end, self.end)))

    def before_first_plan(self) -> "Deadline":
        """The deadline of work while there is no plan yet: the grace later."""
        return self if self.end is None or not self.grace else Deadline(self.end + self.grace)

    def without_grace(self) -> "Deadline":
        return Deadline(self.end)


NO_DEADLINE = Deadline()


def polled(items, deadline: Deadline, every: int = 256):
    """Iterate `items`, checking the deadline every `every` items (a clock read costs ~50 ns,
    the loops this wraps ~10 µs an item)."""
    if deadline.end is None:
        yield from items
        return
    for k, item in enumerate(items):
        if k % every == 0:
            deadline.check()
        yield item


# The signals stop_on_signals() caught while a solver held the main thread, oldest first.
_pending: list[int] = []
_in_solver = threading.local()


def stop_requested() -> bool:
    """Whether a stop signal came while a solver ran (its interrupt callback asks this)."""
    return bool(_pending)


def _interrupted(signum: int) -> Interrupted:
    name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
    return Interrupted(f"interrupted by {name}", signum)


def _on_signal(signum, _frame) -> None:
    # False outside solver_running; inside it, the `cancel` solver_running was given
    cancel = cast("Literal[False] | Optional[Callable[[], None]]", getattr(_in_solver, "cancel", False))
    if cancel is False:
        raise _interrupted(signum)
    _pending.append(signum)  # solver_running() raises it when the solver returns
    if cancel is not None:
        cancel()


@contextmanager
def stop_on_signals():
    """For the time of `plan solve`: Ctrl-C, SIGTERM and SIGHUP raise Interrupted (one line,
    exit 128 + the signal's number) as soon as Python runs again, and stop a running MILP.
    Only in the main thread (where Python delivers signals); the previous handlers come back."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    _pending.clear()
    for sig in STOP_SIGNALS:
        signal.signal(sig, _on_signal)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        _pending.clear()


@contextmanager
def solver_running(cancel: Optional[Callable[[], None]] = None):
    """Around a solver call that holds the main thread: a stop signal is recorded instead of
    raised inside it (an exception cannot cross the solver's C++ frames: HiGHS swallows it and
    reports the run unsolved; the solver's callback asks stop_requested()), `cancel` is called
    to end a solver that has no callback (kill a subprocess), and Interrupted is raised when the
    call returns or unwinds. Without stop_on_signals (the Python API), Python's own Ctrl-C is
    deferred the same way and raised as KeyboardInterrupt."""
    outer = getattr(_in_solver, "cancel", False)
    own_ctrl_c = (
        outer is False
        and threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    )
    _in_solver.cancel = cancel
    if own_ctrl_c:
        signal.signal(signal.SIGINT, _on_signal)
    try:
        yield
    finally:
        if own_ctrl_c:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        _in_solver.cancel = outer
        if _pending and outer is False:
            signum = _pending[0]
            if own_ctrl_c:
                _pending.clear()
                raise KeyboardInterrupt
            raise _interrupted(signum)
