"""`plan export`: a plan in the configuration format of the stack that will run it."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Optional

import click

from planner import api, stacks
from planner.cli import render
from planner.cli.estimate import does_not_fit
from planner.cli.types import ALTERNATIVE
from planner.datafile import check_output, read_mapping, write_atomic
from planner.errors import PlannerError, UsageError
from planner.plan_file import read_plan_file


@click.command("export")
@click.argument("plan_file", type=click.Path(dir_okay=False))
@click.option("--to", "stack", required=True, type=click.Choice(stacks.EXPORT_STACKS), help="The training stack.")
@click.option(
    "--alternative", type=ALTERNATIVE, default=None, help="Export alternative K of a `plan solve` document (1 = first)."
)
@click.option("--json", "as_json", is_flag=True, help="Print {stack, kind, data, text} as one JSON object.")
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False), help="Write the configuration (the text form) to this file."
)
def export(plan_file: str, stack: str, alternative: Optional[int], as_json: bool, output: Optional[str]) -> None:
    """Megatron-LM arguments, a DeepSpeed config, torchtitan overrides or an Accelerate config for a plan."""
    if output is not None:
        check_output(output, (plan_file,))
    try:
        out = api.export_plan(Path(plan_file), stack, alternative=alternative)
    except stacks.StackRefusal as e:
        k = None if alternative is not None else _alternative_for(Path(plan_file), stack)
        if k is None:
            raise
        raise UsageError(
            f"{e}; or export the plan this file holds for {stack}, alternative {k}: "
            f"`plan export {shlex.quote(plan_file)} --to {stack} --alternative {k}`"
        ) from None
    if output:
        write_atomic(output, out.text if out.text.endswith("\n") else out.text + "\n")
    if as_json:
        click.echo(json.dumps({"stack": out.stack, "kind": out.kind, "data": out.data, "text": out.text}, indent=2))
    elif not output:
        click.echo(render.printable(out.text.rstrip("\n"), lines=True))  # a name in a comment: no raw escape
    if output:
        render.note(f"{out.stack} {out.kind} written to {output}")
    path = Path(plan_file)
    again = (
        f"plan estimate --plan {path}" + (f" --alternative {alternative}" if alternative else "") + f" --target {stack}"
    )
    theirs = _as_stack_runs(path, alternative, stack)
    note = costed_for_another(path, alternative, stack, theirs, again)
    if note:
        render.note(note)
    if theirs is not None and not theirs.estimate.fits:  # still written (a user may mean to size it up), not in silence
        render.note(f"warning: {does_not_fit(theirs)}; the options named are `{again}`'s")


def _alternative_for(path: Path, stack: str) -> Optional[int]:
    """The alternative K >= 1 of a `plan solve` document that holds `stack`'s own plan (its
    `stacks` entry, schema 1.6), where it reads as a plan; None where there is none."""
    try:
        data, _ = read_mapping(path)
        entry = next((e for e in data.get("stacks") or () if isinstance(e, dict) and e.get("target") == stack), None)
        k = entry.get("alternative") if entry else None
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            return None
        read_plan_file(path, k)  # the command it suggests must run
        return k
    except (PlannerError, AttributeError, TypeError):
        return None


def _as_stack_runs(path: Path, alternative: Optional[int], stack: str):
    """The plan's document estimated as `stack` runs it (its kernels and overlap), once for
    both lines below; None where the stack's job cannot cost the plan as it stands."""
    try:
        return api.what_if(path, alternative=alternative, target=stack).document
    except PlannerError:
        return None


def costed_for_another(path: Path, alternative: Optional[int], stack: str, theirs, again: str) -> Optional[str]:
    """One line when the plan (job.target, or the alternative's target) was costed for another
    stack than `stack`: the stacks' kernels and overlap differ (planner/stacks), so the
    stack's own prediction (`theirs`: _as_stack_runs), and the command that gives all of it."""
    costed = read_plan_file(path, alternative).job.target.value  # read only: the estimates come when they differ
    if costed == stack:
        return None
    runs = f"{stack}'s own kernels change its prediction"  # no number where either estimate cannot be made
    try:
        ours = api.read_plan(path, alternative).estimate.step_time_s
    except PlannerError:
        ours = None
    if theirs is not None and ours is not None:
        t = theirs.estimate.step_time_s
        runs = (
            f"{stack} runs it with its own kernels: {t:.3f} s a step predicted, not {ours:.3f} s"
            if f"{t:.3f}" != f"{ours:.3f}"
            else f"{stack}'s kernels predict the same {ours:.3f} s a step"
        )
    return f"note: this plan was costed for {costed}; {runs} (re-estimate with `{again}`)"
