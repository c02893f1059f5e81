"""The two error tiers a user sees.

UsageError (exit 2): the request is malformed: unknown preset, unreadable file, a layout
whose factors do not fit. InfeasibleError (exit 1): the request is well formed but nothing
satisfies it (the model fits nowhere). Both carry a one-line message that says what to
change. Interrupted (128 + the signal) ends a command a signal stopped. Internal invariants are checked separately and surface as ordinary exceptions.
"""

import signal


class PlannerError(Exception):
    exit_code = 1


class UsageError(PlannerError):
    exit_code = 2


class InfeasibleError(PlannerError):
    exit_code = 1


class MemoryMiss(InfeasibleError):
    """No layout fits in the memory limit (as opposed to no valid layout at all)."""


class Interrupted(PlannerError):
    """A command was interrupted (Ctrl-C, SIGTERM, SIGHUP); a launcher stopped its workers first.
    The exit code is the shell's for a process the signal ended: 128 + its number
    (130 for Ctrl-C, 143 for SIGTERM)."""

    def __init__(self, message: str, signum: int = signal.SIGINT):
        super().__init__(message)
        self.exit_code = 128 + int(signum)
