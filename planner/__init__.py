"""planner: plan, estimate, profile and run distributed training layouts.

The Python API (planner/api.py, docs/api.md): load_model, load_cluster, estimate, what_if,
solve, read_plan, write_plan, export_plan, their keywords (EstimateOptions, WhatIfOptions,
SolveOptions), and the errors they raise (UsageError,
InfeasibleError, both PlannerError).
"""

from planner import _interrupt

_interrupt.hold()  # Ctrl-C while the package loads: one line, not a traceback (released at the end)

from planner._pdeath import die_with_parent, in_a_worker  # noqa: E402

if in_a_worker():  # a worker of `plan run` / `plan profile`: die with the launcher, from the start
    die_with_parent()

from planner.errors import InfeasibleError, PlannerError, UsageError  # noqa: E402

__version__ = "0.1.0"
_API = (
    "EstimateOptions",
    "SolveOptions",
    "WhatIf",
    "WhatIfOptions",
    "estimate",
    "export_plan",
    "load_cluster",
    "load_model",
    "read_plan",
    "solve",
    "what_if",
    "write_plan",
)
__all__ = ["SCHEMA_VERSION", "InfeasibleError", "PlannerError", "UsageError", "__version__", *_API]
del die_with_parent, in_a_worker
_interrupt.release()


def __getattr__(name: str):
    """The API's names, imported on first use: `import planner` (and every `plan` command,
    each worker of `plan run`) then does not load the cost model and the search."""
    if name in _API:
        from planner import api

        return getattr(api, name)
    if name == "SCHEMA_VERSION":  # loads pydantic: `import planner` stays light for planner/cli/main.py's Ctrl-C hook
        from planner.specs import SCHEMA_VERSION

        return SCHEMA_VERSION
    raise AttributeError(f"module 'planner' has no attribute {name!r}")
