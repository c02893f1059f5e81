"""planner: plan, estimate, profile and run distributed training layouts."""

from planner.specs import SCHEMA_VERSION

__version__ = "0.1.0"
__all__ = ["SCHEMA_VERSION", "__version__"]
