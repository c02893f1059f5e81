"""Training stacks, one folder each: all the planner knows of a stack, in one place.

`--target STACK` says which stack runs a plan, `plan export --to STACK` writes its
configuration. A stack is a folder planner/stacks/<name>/, `name` a value of
planner/specs/job.py:Target, holding:

- `__init__.py`: `STACK`, a stack.py:Stack that states what the stack runs, each a plain
  attribute: `attention_kernel` (the device table's fused-attention entry, read by
  cost_models/compute.py and tables.py), `loss_kernel` (its cross-entropy, cost_models/compute.py:
  loss_kernel), `tp_comm_overlap` (whether it has Plan.tp_comm_overlap: `plan solve` tries it,
  validate_plan refuses it elsewhere), `zero3` (how it shards ZeRO-3: "deepspeed", "fsdp2" or
  "none") and `kernels` (stack.py:Kernels, the kernels a layer of its code launches, operator
  by operator: what it fuses shows as fewer); and where its other facts are:
- `rules.py`: `RULES`, what it can express as data (stack.py:Rules), and `model_problems(model)`,
  `layout_problems(layout, model, job)` and `problems(plan, model, job)` for what a Rules cannot
  state. `plan export` refuses a plan that breaks either, in one line naming the feature;
  `plan solve --target STACK` searches only what both allow (planner/search/stacks.py:
  target_space hands them to candidates.py and RULES to ilp.py); rules_table() is docs/export.md's
  table of them. A stack with model_problems is not searched at all (model_refusal).
- its exporter, planner/export/<name>.py (named by `Stack.exporter`):
  `export(plan, model, job, num_gpus[, gpus_per_node]) -> Export`, the stack's own
  configuration, and `read_back(data)`, the plan's fields read from it again (the tests' round
  trip). It sits a layer above (it may import cost_models) and is imported only to export.
- `constants.json`: the stack's fitted constants per device, `{DeviceSpec.name or "*":
  {StackConstants fields}}`, a device's own entry before "*". A shipped hardware preset of that
  device takes them for each stack it has no entry of its own for (hardware_profiles/__init__.py:
  load_cluster; a profile file is read as written); the cost model then reads them for a job of
  that stack (ClusterSpec.for_target). `{}` or no file: the device's and cluster's own figures.

`generic` (PyTorch eager as `plan run` executes it) has only `__init__.py` and `constants.json`:
no Rules (it searches every layout the cost model prices) and no exporter.

Adding a stack is adding its folder, its exporter and its name to Target (the schema's vocabulary of
`--target`; a minor schema version). The registry below imports a folder per Target value, in
Target's order; nothing else lists stacks. `plan export` enters here too (export(),
EXPORT_STACKS): dispatching to a stack's exporter is a few lines over the registry.

Imports: this package, each folder's `__init__.py` and `rules.py` import only planner.specs and
planner.errors, never cost_models, torch or an exporter: the cost model reads stacks without a
cycle (.importlinter states it).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Optional
from importlib import import_module
from pathlib import Path

from planner.errors import PlannerError, UsageError
from planner.specs import JobSpec, ModelSpec, Plan, PlanError, StackConstants, Target
from planner.specs.job import STACK_FEATURES
from planner.stacks.stack import Export, Rules, Stack

STACKS: dict[Target, Stack] = {t: import_module(f"planner.stacks.{t.value}").STACK for t in Target}
EXPORT_STACKS = tuple(s.name for s in STACKS.values() if s.exporter is not None)  # what `plan export --to` writes


def get(target: Target | str) -> Stack:
    """The stack `target` names (a Target or its value); UsageError naming the stacks if none."""
    try:
        return STACKS[Target(target)]
    except ValueError:
        raise UsageError(f"unknown stack {target!r}: choose one of {', '.join(t.value for t in STACKS)}") from None


def having(feature: str) -> str:
    """The stacks whose Stack has `feature` (a bool field: tp_comm_overlap, recompute_norm_act), for
    a refusal's "use --target ..."."""
    return " or ".join(s.name for s in STACKS.values() if getattr(s, feature))


def validate_plan(plan: Plan, model: ModelSpec, job: JobSpec, num_gpus: Optional[int] = None) -> None:
    """Plan.validate_for, after refusing what only some stacks run (STACK_FEATURES) where the job's
    target has none: PlanError naming the stacks that have it."""
    for feature in STACK_FEATURES:
        if getattr(plan, feature) and not getattr(STACKS[Target(job.target)], feature):
            raise PlanError(
                f"{feature} is not available in target {Target(job.target).value}; use --target "
                f"{having(feature)}, or drop it"
            )
    plan.validate_for(model, job, num_gpus)


def rules(stack: Target | str) -> Optional[Rules]:
    """What an exportable stack can express (generic has no Rules: None)."""
    return get(stack).rules


class StackRefusal(UsageError):
    """The stack cannot express the plan (stacks.export): what `plan export` can point past, to
    the stack's own plan in a `plan solve` document."""


def export(stack: str, plan, model, job, num_gpus: int, gpus_per_node: int | None = None) -> Export:
    """The stack's configuration for `plan`; UsageError naming the first feature the stack
    cannot express (and suggesting `plan solve --target`). `gpus_per_node`: the cluster's, for
    stacks whose configuration names the node count (accelerate)."""
    if stack not in EXPORT_STACKS:
        raise UsageError(f"--to {stack!r}: choose one of {', '.join(EXPORT_STACKS)}")
    s = get(stack)
    refusal = model_refusal(stack, model)
    if refusal:
        raise UsageError(refusal)
    assert s.rules is not None  # every exportable stack has Rules
    problems = s.rules.plan_problems(plan, model) + s.problems(plan, model, job)
    if problems:
        raise StackRefusal(
            f"{stack} cannot run this plan: {problems[0]}"
            + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
            + f"; re-plan with `plan solve ... --target {stack}`, which searches only what {stack} can express"
        )
    return s.export(plan, model, job, num_gpus, gpus_per_node)


def model_refusal(stack: Target | str, model: ModelSpec) -> str | None:
    """One line when the stack cannot build the model whatever the plan (its model_problems:
    an architecture field its configuration cannot express), naming the first field and why,
    the others by name, and the stacks that can; else None. `plan export` and the search of
    that stack (planner/search/stacks.py:target_space) both say it."""
    s = get(stack)
    problems = s.model_problems(model)
    if not problems:
        return None
    name = s.name
    others = [o for o in EXPORT_STACKS if o != name and not get(o).model_problems(model)]
    return (
        f"{name} cannot build {model.name}: {problems[0]}"
        + (f"; also {', '.join(p.split(' (')[0] for p in problems[1:])}" if problems[1:] else "")
        + (f"; {', '.join(others)} can (`plan solve --target {others[0]}`)" if others else "; no stack here can")
    )


def stack_constants(device_name: str) -> dict[Target, StackConstants]:
    """Every stack's shipped constants for a device: its constants.json entry for `device_name`
    (DeviceSpec.name), else its entry for "*"; a stack with neither is left out."""
    out = {}
    for target in STACKS:
        entries = _constants_file(target.value)
        entry = entries.get(device_name, entries.get("*"))
        if entry is not None:
            out[target] = entry
    return out


@lru_cache(maxsize=None)
def _constants_file(name: str) -> dict[str, StackConstants]:
    path = Path(__file__).parent / name / "constants.json"
    return read_constants(path) if path.is_file() else {}


def read_constants(path: Path) -> dict[str, StackConstants]:
    """A constants.json, validated. One that does not validate is the planner's fault (the
    files ship with it): PlannerError naming the file, line and field."""
    from pydantic import TypeAdapter, ValidationError

    from planner.datafile import read_mapping, validation_message

    data, text = read_mapping(path)
    try:
        return TypeAdapter(dict[str, StackConstants]).validate_python(data)
    except ValidationError as exc:
        raise PlannerError(validation_message(exc, path, text)) from None


def rules_table() -> str:
    """docs/export.md's table of what each stack can express, from the Rules themselves
    (tests/cli/test_export.py checks that the page carries exactly this)."""
    split = {"free": "any split", "first_last": "first and last stage may differ", "even": "even only"}
    recompute = {
        "per_stage": "any mix per stage",
        "same_per_stage": "same count of full layers in every stage, or all selective",
        "uniform": "one mode for every layer",
    }
    rows = [
        "| stack | ZeRO | ZeRO with pp > 1 | ZeRO with tp > 1 | hybrid sharding (ZeRO) | pp | schedules | interleaved | SP | TP overlap | EP | CP | FP8 | "
        "mesh order (innermost first) | layers per stage | recompute | norm/act recompute |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for stack in EXPORT_STACKS:
        r = rules(stack)
        assert r is not None  # every exportable stack has Rules
        orders = " or ".join(",".join(a.value for a in o) for o in r.mesh_orders) if r.mesh_orders else "any"
        cells = [
            stack,
            _stages(r.zero_stages),
            _stages(r.zero_stages_with_pp),
            _stages(r.zero_stages_with_tp),
            _stages(r.hybrid_zero_stages) if r.hybrid_zero_stages else "no",
            "no" if r.max_pp == 1 else "yes",
            ", ".join(s.value for s in r.schedules) if r.max_pp != 1 else "-",
            "yes" if r.interleaved and r.max_pp != 1 else "no",
            "yes" if r.sequence_parallel else "no",
            "yes" if r.tp_comm_overlap else "no",
            "no" if r.max_ep == 1 else "yes",
            "no" if r.max_cp == 1 else "yes",
            "yes" if r.fp8 else "no",
            orders,
            split[r.split],
            recompute[r.recompute],
            "yes" if r.recompute_norm_act else "no",
        ]
        rows.append("| " + " | ".join(cells) + " |")
        if r.notes:
            notes.append(f"- **{stack}**: " + "; ".join(f"{k}: {v}" for k, v in r.notes.items()))
    return "\n".join(rows + [""] + notes) + "\n"


def _stages(stages: tuple) -> str:
    return ", ".join(str(s) for s in stages) if stages else "none"


__all__ = [
    "EXPORT_STACKS",
    "STACKS",
    "Export",
    "Rules",
    "Stack",
    "export",
    "get",
    "having",
    "model_refusal",
    "rules",
    "rules_table",
    "stack_constants",
]
