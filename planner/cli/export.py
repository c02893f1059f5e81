"""`plan export`: a plan in the configuration format of the stack that will run it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import click

from planner import api, export as exporters
from planner.datafile import check_output, write_atomic


@click.command("export")
@click.argument("plan_file", type=click.Path(dir_okay=False))
@click.option("--to", "stack", required=True, type=click.Choice(exporters.STACKS), help="The training stack.")
@click.option("--alternative", type=int, default=None, help="Export alternative K of a `plan solve` document (1 = first).")
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
        click.echo(out.text.rstrip("\n"))
    if output:
        click.echo(f"{out.stack} {out.kind} written to {output}", err=True)
