"""The two error tiers a user sees.

UsageError (exit 2): the request is malformed: unknown preset, unreadable file, a layout
whose factors do not fit. InfeasibleError (exit 1): the request is well formed but nothing
satisfies it (the model fits nowhere). Both carry a one-line message that says what to
change. Internal invariants are checked separately and surface as ordinary exceptions.
"""


class PlannerError(Exception):
    exit_code = 1


class UsageError(PlannerError):
    exit_code = 2


class InfeasibleError(PlannerError):
    exit_code = 1


class MemoryMiss(InfeasibleError):
    """No layout fits in the memory limit (as opposed to no valid layout at all)."""
