"""Plans that training stacks run: `plan export PLAN --to STACK`.

One module per stack (megatron.py, deepspeed.py, torchtitan.py, accelerate.py), each a small
pure function from a Plan (+ model, job) to the stack's own format, plus what the stack can
express, stated once as a `Rules` (planner/export/rules.py): `plan export` refuses a plan that
breaks a rule in one line naming the feature, and `plan solve --target STACK` searches only the
layouts the rules allow (planner/search/candidates.py and ilp.py read the same Rules).
"""

from __future__ import annotations

from importlib import import_module

from planner.errors import UsageError
from planner.export.rules import Export, Rules

STACKS = ("megatron", "deepspeed", "torchtitan", "accelerate")


def stack_module(stack: str):
    if stack not in STACKS:
        raise UsageError(f"--to {stack!r}: choose one of {', '.join(STACKS)}")
    return import_module(f"planner.export.{stack}")


def rules(stack: str) -> Rules:
    return stack_module(stack).RULES


def export(stack: str, plan, model, job, num_gpus: int) -> Export:
    """The stack's configuration for `plan`; UsageError naming the first feature the stack
    cannot express (and suggesting `plan solve --target`)."""
    mod = stack_module(stack)
    problems = mod.RULES.plan_problems(plan, model) + mod.problems(plan, model, job)
    if problems:
        raise UsageError(
            f"{stack} cannot run this plan: {problems[0]}"
            + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
            + f"; re-plan with `plan solve ... --target {stack}`, which searches only what {stack} can express"
        )
    return mod.export(plan, model, job, num_gpus)


__all__ = ["STACKS", "Export", "Rules", "export", "rules", "stack_module"]
