"""One name per concept: a layout's fields are declared once (planner.specs.Layout, and Plan's
of the same names), and every other spelling of them (`plan estimate`'s options, the API's
keywords, `--fix` keys) is one docs/glossary.md lists and the code accepts."""

from __future__ import annotations

import dataclasses
import re

from planner.cli.estimate import estimate as estimate_command
from planner.inputs import EstimateOptions, LayoutOptions
from planner.search.candidates import FIX_KEYS
from planner.specs import MESH_AXES, Axis, Layout, Plan, Recompute, Schedule
from tests.paths import ROOT

LAYOUT_FIELDS = [f.name for f in dataclasses.fields(Layout)]


def glossary_rows() -> dict[str, tuple[str, str, set[str]]]:
    """docs/glossary.md's table of a layout's fields: field -> (option, keyword, --fix keys)."""
    text = (ROOT / "docs" / "glossary.md").read_text()
    table = text[text.index("## A layout's fields") :].split("\n\n")[1]
    rows = {}
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        names = [re.findall(r"`([^`]+)`", c) for c in cells]
        field, option, keyword, fixes = names[0][0], names[2], names[3], set(names[4])
        rows[field] = (option[0] if option else "", keyword[0] if keyword else "", fixes)
    return rows


def test_every_layout_field_is_a_plan_field_and_a_plan_has_its_layout():
    assert set(LAYOUT_FIELDS) <= set(Plan.model_fields)
    layout = Layout(
        dp=2, tp=4, pp=2, vpp=2, micro_batch_size=2, num_micro_batches=4, schedule=Schedule.interleaved_1f1b
    )
    layout = dataclasses.replace(layout, zero_stage=1, sequence_parallel=True, tp_comm_overlap=True, ep=2, cp=2)
    assert layout.plan(recompute=Recompute.selective).layout == layout
    assert Plan(dp=1, tp=1, pp=1, micro_batch_size=1, num_micro_batches=1).layout == Layout()


def test_the_glossary_lists_every_layout_field_with_each_spelling_the_code_takes():
    rows = glossary_rows()
    assert sorted(rows) == sorted(LAYOUT_FIELDS)
    options = {opt for p in estimate_command.params for opt in p.opts}
    keywords = EstimateOptions.__optional_keys__
    for field, (option, keyword, fixes) in rows.items():
        if field == "num_micro_batches":  # follows from the batch: no option of its own
            assert (option, keyword, fixes) == ("", "", set())
            continue
        assert option in options, (field, option)
        assert keyword in LayoutOptions.__optional_keys__ and keyword in keywords, (field, keyword)
        assert {k for k, (f, _) in FIX_KEYS.items() if f == field} == fixes, field


def test_every_spelling_the_code_takes_is_in_the_glossary():
    rows = glossary_rows()
    keywords = {keyword for _, keyword, _ in rows.values()} - {""}
    fixes = set().union(*(f for _, _, f in rows.values()))
    plan_only = {"recompute", "layers_per_stage"}  # a Plan's, beyond its Layout (the glossary's paragraph below)
    assert set(LayoutOptions.__optional_keys__) - plan_only == keywords
    assert set(FIX_KEYS) - {"recompute"} == fixes


def test_every_parallel_degree_is_an_axis():
    degrees = {f for f in LAYOUT_FIELDS if f in ("dp", "tp", "pp", "cp", "ep")}
    assert {a.value for a in Axis} == degrees == {"dp", "tp", "pp", "cp", "ep"}
    assert MESH_AXES == (Axis.dp, Axis.tp, Axis.pp)
