"""`plan schema`: the JSON Schema of the documents `plan` writes, generated from their
pydantic models (planner/specs/), so the published format cannot drift from the code.
The checked-in copies under schemas/ are compared with these by tests/unit/specs/test_schema.py."""

from __future__ import annotations

import json

import click
from pydantic import BaseModel

from planner.specs import SCHEMA_VERSION, PlanDocument, RunReport, SizeDocument, SolveDocument

DOCUMENTS: dict[str, tuple[type[BaseModel], str]] = {
    "plan": (PlanDocument, "`plan estimate --json` / `-o`: model, cluster, job, plan and its estimate"),
    "solve": (
        SolveDocument,
        "`plan solve --json` / `-o`: a plan document plus alternatives, search statistics and the explanation",
    ),
    "run-report": (
        RunReport,
        "`plan run --json` / `-o`: predicted against measured, and the verification against one process",
    ),
    "size": (
        SizeDocument,
        "`plan size --json` / `-o`: time to train and GPU-hours over clusters and GPU counts, and the front",
    ),
}


def document_schema(name: str) -> dict:
    model, what = DOCUMENTS[name]
    schema = model.model_json_schema(mode="serialization")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"planner/{name}-{SCHEMA_VERSION}.json",
        "description": f"{what}. schema_version {SCHEMA_VERSION}: readers accept every 1.x document; a minor version only "
        "adds optional fields or values, a major version changes or removes one (docs/plan-format.md).",
        **schema,
    }


def schema_text(name: str) -> str:
    return json.dumps(document_schema(name), indent=2, sort_keys=True) + "\n"


@click.command("schema")
@click.argument("document", type=click.Choice(list(DOCUMENTS)), default="plan")
@click.option(
    "--json", "as_json", is_flag=True, help="Accepted as every command takes it: the schema is JSON either way."
)
def schema(document: str, as_json: bool) -> None:
    """Print the JSON Schema of a document `plan` writes (plan, solve, run-report or size)."""
    click.echo(schema_text(document), nl=False)
