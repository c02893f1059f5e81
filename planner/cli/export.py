"""`plan export`: a plan in the configuration format of the stack that will run it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import click

from planner import api, stacks
from planner.cli import render
from planner.cli.estimate import does_not_fit
from planner.cli.types import ALTERNATIVE
from planner.datafile import check_output, write_atomic
from planner.errors import PlannerError
from planner.plan_file import read_plan_file


@click.command("export")
@click.argument("plan_file", type=click.Path(dir_okay=False))
@click.option("--to", "stack", required=True, type=click.Choice(stacks.EXPORT_STACKS), help="The training stack.")
@click.option("--alternative", type=ALTERNATIVE, default=None, help="Export alternative K of a `plan solve` document (1 = first).")
@click.option("--json", "as_json", is_flag=True, help="Print {stack, kind, data, text} as one JSON object.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the configuration (the text form) to this file.")
def export(plan_file: str, stack: str, alternative: Optional[int], as_json: bool, output: Optional[str]) -> None:
    """Megatron-LM arguments, a DeepSpeed config, torchtitan overrides or an Accelerate config for a plan."""
    if output is not None:
        check_output(output, (plan_file,))
    out = api.export_plan(Path(plan_file), stack, alternative=alternative)
    if output:
        write_atomic(output, out.text if out.text.endswith("\n") else out.text + "\n")
    if as_json:
        click.echo(json.dumps({"stack": out.stack, "kind": out.kind, "data": out.data, "text": out.text}, indent=2))
    elif not output:
        click.echo(render.printable(out.text.rstrip("\n"), lines=True))  # a name in a comment: no raw escape
    if output:
        render.note(f"{out.stack} {out.kind} written to {output}")
    note = costed_for_another(Path(plan_file), alternative, stack)
    if note:
        render.note(note)
    over = _over_memory(Path(plan_file), alternative, stack)
    if over:
        again = f"plan estimate --plan {plan_file}" + (f" --alternative {alternative}" if alternative else "") + f" --target {stack}"
        render.note(f"warning: {over}; the options named are `{again}`'s")


def _over_memory(path: Path, alternative: Optional[int], stack: str) -> Optional[str]:
    """The estimate's "does not fit" line for the plan as `stack` runs it, else None: the
    configuration is still written (a user may mean to size it up), but not in silence."""
    try:
        doc = api.what_if(path, alternative=alternative, target=stack).document
    except PlannerError:  # the stack's job cannot cost this plan as it stands: costed_for_another said so
        return None
    return None if doc.estimate.fits else does_not_fit(doc)


def costed_for_another(path: Path, alternative: Optional[int], stack: str) -> Optional[str]:
    """One line when the plan (job.target, or the alternative's target) was costed for another
    stack than `stack`: the stacks' kernels and overlap differ (planner/stacks), so the
    stack's own prediction, and the command that gives all of it."""
    costed = read_plan_file(path, alternative).job.target.value  # read only: the estimates come when they differ
    if costed == stack:
        return None
    again = f"plan estimate --plan {path}" + (f" --alternative {alternative}" if alternative else "") + f" --target {stack}"
    try:
        ours = api.read_plan(path, alternative).estimate.step_time_s
        theirs = api.what_if(path, alternative=alternative, target=stack).document.estimate.step_time_s
        runs = (f"{stack} runs it with its own kernels: {theirs:.3f} s a step predicted, not {ours:.3f} s" if f"{theirs:.3f}" != f"{ours:.3f}"
                else f"{stack}'s kernels predict the same {ours:.3f} s a step")
    except PlannerError:  # the stack's job cannot cost this plan as it stands: say so without a number
        runs = f"{stack}'s own kernels change its prediction"
    return f"note: this plan was costed for {costed}; {runs} (re-estimate with `{again}`)"
