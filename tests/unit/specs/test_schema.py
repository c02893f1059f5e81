"""The published document format: schemas/ equals what the code generates, documents validate
against it, older 1.x documents still read, and a plan's recompute never contradicts its
per-stage recompute."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from planner.cli.schema import DOCUMENTS, schema_text
from planner.plan_file import read_plan_file
from planner.specs import Plan, Recompute, StageRecompute
from tests.paths import ROOT


@pytest.mark.parametrize("name", list(DOCUMENTS))
def test_checked_in_schema_is_the_generated_one(name):
    """Regenerate with: for d in plan solve run-report size; do plan schema $d > schemas/$d.schema.json; done"""
    assert (ROOT / "schemas" / f"{name}.schema.json").read_text() == schema_text(name)


def test_plan_schema_command_prints_it():
    out = subprocess.run(
        [sys.executable, "-m", "planner.cli.main", "schema", "solve"], capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout)["title"] == "SolveDocument"


@pytest.mark.slow
def test_a_solve_document_validates_against_its_schema(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    out = tmp_path / "p.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "planner.cli.main",
            "solve",
            "--model",
            "gpt3-1.3b",
            "--cluster",
            "dgx-a100-80gb",
            "--gpus",
            "16",
            "--global-batch",
            "64",
            "-o",
            str(out),
        ],
        check=True,
        capture_output=True,
    )
    doc = json.loads(out.read_text())
    jsonschema.validate(doc, json.loads(schema_text("solve")))
    doc["plan"]["tp"] = "eight"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, json.loads(schema_text("solve")))


def _mixed():
    return [StageRecompute(none=2, full=1), StageRecompute(none=3)]


def test_recompute_never_contradicts_stage_recompute():
    base = dict(dp=1, tp=1, pp=2, micro_batch_size=1, num_micro_batches=4, layers_per_stage=[3, 3])
    assert Plan(**base, stage_recompute=_mixed()).recompute == Recompute.mixed  # derived when left out
    assert Plan(**base, stage_recompute=_mixed(), recompute="mixed").recompute == Recompute.mixed
    uniform = [StageRecompute(full=3), StageRecompute(full=3)]
    assert Plan(**base, stage_recompute=uniform).recompute == Recompute.full
    for wrong, stages in (("none", _mixed()), ("full", _mixed()), ("none", uniform), ("mixed", uniform)):
        with pytest.raises(ValueError, match="stage_recompute"):
            Plan(**base, stage_recompute=stages, recompute=wrong)
    with pytest.raises(ValueError, match="mixed' needs stage_recompute"):
        Plan(**base, recompute="mixed")


@pytest.mark.slow
def test_an_older_document_with_a_contradiction_reads_with_the_mode_derived(tmp_path):
    """Before 1.3 a solve could write recompute 'none' beside mixed per-stage counts (which won):
    such documents still read, their recompute derived again."""
    plan = Plan(
        dp=1,
        tp=1,
        pp=2,
        micro_batch_size=1,
        num_micro_batches=4,
        layers_per_stage=[12, 12],
        stage_recompute=[StageRecompute(none=10, full=2), StageRecompute(none=12)],
    )
    doc = subprocess.run(
        [
            sys.executable,
            "-m",
            "planner.cli.main",
            "estimate",
            "--model",
            "gpt3-1.3b",
            "--cluster",
            "dgx-a100-80gb",
            "--gpus",
            "2",
            "--global-batch",
            "4",
            "--pp",
            "2",
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    data = json.loads(doc.stdout)
    data["schema_version"] = "1.2"
    data["plan"] = {**plan.model_dump(mode="json"), "recompute": "none"}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    assert read_plan_file(path).plan.recompute == Recompute.mixed
    data["schema_version"] = "1.3"
    path.write_text(json.dumps(data))
    res = subprocess.run(
        [sys.executable, "-m", "planner.cli.main", "estimate", "--plan", str(path)], capture_output=True, text=True
    )
    assert res.returncode == 2 and "stage_recompute" in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_solve_writes_mixed_for_a_mixed_plan():
    from planner.specs import Layout
    from planner.search.solve import decode
    from planner.specs import Axis, Schedule

    c = Layout(1, 1, 2, 1, 1, 4, Schedule.one_f_one_b, 0, False, (Axis.tp, Axis.dp, Axis.pp))
    assert decode(c, [(2, 0, 1), (3, 0, 0)]).recompute == Recompute.mixed
    assert decode(c, [(0, 0, 3), (0, 0, 3)]).recompute == Recompute.full


def test_plan_schema_takes_json_as_every_command_does():
    out = subprocess.run(
        [sys.executable, "-m", "planner.cli.main", "schema", "size", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout == schema_text("size")
