"""Plans that training stacks run: `plan export PLAN --to STACK`.

One module per stack (megatron.py, deepspeed.py, torchtitan.py, accelerate.py), each a small
pure function from a Plan (+ model, job) to the stack's own format, plus what the stack can
express, stated once as a `Rules` (planner/export/rules.py): `plan export` refuses a plan that
breaks a rule in one line naming the feature, and `plan solve --target STACK` searches only the
layouts the rules allow (planner/search/candidates.py and ilp.py read the same Rules). Beyond the
Rules each module has model_problems(model) (architecture fields its configuration cannot
express: the stack is not searched at all), layout_problems(layout, model, job) (what it cannot
run of a layout: the search's per-candidate filter, reading only fields a search Candidate and
a Plan share) and problems(plan, model, job) (those and what depends on the layer split).
"""

from __future__ import annotations

import inspect
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


def export(stack: str, plan, model, job, num_gpus: int, gpus_per_node: int | None = None) -> Export:
    """The stack's configuration for `plan`; UsageError naming the first feature the stack
    cannot express (and suggesting `plan solve --target`). `gpus_per_node`: the cluster's, for
    stacks whose configuration names the node count (accelerate)."""
    mod = stack_module(stack)
    refusal = model_refusal(stack, model)
    if refusal:
        raise UsageError(refusal)
    problems = mod.RULES.plan_problems(plan, model) + mod.problems(plan, model, job)
    if problems:
        raise UsageError(
            f"{stack} cannot run this plan: {problems[0]}"
            + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
            + f"; re-plan with `plan solve ... --target {stack}`, which searches only what {stack} can express"
        )
    if "gpus_per_node" in inspect.signature(mod.export).parameters:
        return mod.export(plan, model, job, num_gpus, gpus_per_node=gpus_per_node)
    return mod.export(plan, model, job, num_gpus)


def model_refusal(stack: str, model) -> str | None:
    """One line when the stack cannot build the model whatever the plan (its exporter's
    model_problems: an architecture field its configuration cannot express), naming the first
    field and why, the others by name, and the stacks that can; else None. `plan export` and
    the search of that stack (planner/search/stacks.py:target_space) both say it."""
    problems = stack_module(stack).model_problems(model)
    if not problems:
        return None
    others = [s for s in STACKS if s != stack and not stack_module(s).model_problems(model)]
    return (f"{stack} cannot build {model.name}: {problems[0]}"
            + (f"; also {', '.join(p.split(' (')[0] for p in problems[1:])}" if problems[1:] else "")
            + (f"; {', '.join(others)} can (`plan solve --target {others[0]}`)" if others else "; no stack here can"))


def rules_table() -> str:
    """The README's table of what each stack can express, from the Rules themselves
    (tests/test_export_rules.py checks that the README carries exactly this)."""
    split = {"free": "any split", "first_last": "first and last stage may differ", "even": "even only"}
    recompute = {"per_stage": "any mix per stage", "same_per_stage": "same count of full layers in every stage, or all selective",
                 "uniform": "one mode for every layer"}
    rows = ["| stack | ZeRO | ZeRO with pp > 1 | ZeRO with tp > 1 | pp | schedules | interleaved | SP | TP overlap | EP | CP | FP8 | "
            "mesh order (innermost first) | layers per stage | recompute |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for stack in STACKS:
        r = rules(stack)
        orders = " or ".join(",".join(a.value for a in o) for o in r.mesh_orders) if r.mesh_orders else "any"
        cells = [
            stack, _stages(r.zero_stages), _stages(r.zero_stages_with_pp), _stages(r.zero_stages_with_tp),
            "no" if r.max_pp == 1 else "yes", ", ".join(s.value for s in r.schedules) if r.max_pp != 1 else "-",
            "yes" if r.interleaved and r.max_pp != 1 else "no", "yes" if r.sequence_parallel else "no",
            "yes" if r.tp_comm_overlap else "no", "no" if r.max_ep == 1 else "yes", "no" if r.max_cp == 1 else "yes",
            "yes" if r.fp8 else "no", orders, split[r.split], recompute[r.recompute],
        ]
        rows.append("| " + " | ".join(cells) + " |")
    notes = [f"- **{stack}**: " + "; ".join(f"{k}: {v}" for k, v in rules(stack).notes.items()) for stack in STACKS if rules(stack).notes]
    return "\n".join(rows + [""] + notes) + "\n"


def _stages(stages: tuple) -> str:
    return ", ".join(str(s) for s in stages) if stages else "none"


__all__ = ["STACKS", "Export", "Rules", "export", "model_refusal", "rules", "rules_table", "stack_module"]
