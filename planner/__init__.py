"""planner: plan, estimate, profile and run distributed training layouts."""

from planner._pdeath import die_with_parent, in_a_worker

if in_a_worker():  # a worker of `plan run` / `plan profile`: die with the launcher, from the start
    die_with_parent()

from planner.specs import SCHEMA_VERSION

__version__ = "0.1.0"
__all__ = ["SCHEMA_VERSION", "__version__"]
del die_with_parent, in_a_worker
