"""Ctrl-C while `plan` is still loading its modules (most of its first second, before the guard
of planner/cli/main.py is in place): the guard's line and exit code, "error: interrupted" and
130, instead of a KeyboardInterrupt traceback through the imports.

A hook on sys.excepthook, which Python calls only for an exception nothing caught, so no signal
handler is replaced. planner/__init__.py holds it while the package loads (its first import,
kept free of everything but the standard library's os and sys) and releases it after, so a
program that imports planner keeps its own tracebacks; planner/cli/main.py holds it for the
whole command. What comes before any of this (the interpreter starting, its site packages)
is Python's own.
"""

from __future__ import annotations

import os
import sys

_previous = sys.excepthook


def _interrupted(value) -> bool:
    """Whether an uncaught exception is, or was caused by, a Ctrl-C. pydantic-core builds a
    model's validators in its compiled core, which reports a KeyboardInterrupt that lands there
    (a Ctrl-C while planner/specs loads) as a SchemaError whose text names it."""
    seen = set()
    while value is not None and id(value) not in seen:
        seen.add(id(value))
        if isinstance(value, KeyboardInterrupt):
            return True
        if type(value).__name__ == "SchemaError" and "KeyboardInterrupt" in str(value):
            return True
        value = value.__cause__ or value.__context__
    return False


def _quietly(kind, value, traceback) -> None:
    if issubclass(kind, KeyboardInterrupt) or _interrupted(value):
        try:
            sys.stderr.write("\nerror: interrupted\n")  # the blank line ends the terminal's ^C, as click's does
            sys.stderr.flush()
        finally:
            os._exit(130)
    _previous(kind, value, traceback)


def hold() -> None:
    """From now on an uncaught Ctrl-C ends the process with one line and exit 130."""
    sys.excepthook = _quietly


def release() -> None:
    """Python's own handling again (unless another hook has been installed since)."""
    if sys.excepthook is _quietly:
        sys.excepthook = _previous
