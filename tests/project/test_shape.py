"""The shape of the product code: no function in planner/, cost_models/ or hardware_profiles/
over 80 lines or 10 parameters (a layout travels as one planner.specs.Layout, a request as one
object or one typed set of keywords, not as flat parameters)."""

from __future__ import annotations

import ast

from tests.paths import ROOT

MAX_LINES, MAX_PARAMS = 80, 10


def functions():
    for package in ("planner", "cost_models", "hardware_profiles"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    a = node.args
                    params = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)
                    params -= bool(a.args) and a.args[0].arg in ("self", "cls")
                    yield str(path.relative_to(ROOT)), node.name, node.end_lineno - node.lineno + 1, params


def test_no_function_is_too_long_or_takes_too_many_parameters():
    over = sorted(
        (f, name, lines, params) for f, name, lines, params in functions() if lines > MAX_LINES or params > MAX_PARAMS
    )
    assert not over, f"over {MAX_LINES} lines or {MAX_PARAMS} parameters (file, function, lines, parameters): {over}"


def test_the_walk_sees_every_function_and_counts_as_stated():
    """The limits hold for what the walk finds: it finds the product's functions, and counts
    a signature's parameters (bar self) and a body's lines as written."""
    found = {(f, name): (lines, params) for f, name, lines, params in functions()}
    assert len(found) > 1000
    assert found[("cost_models/tables.py", "layout_costs")][1] == 8  # model, cluster, job, layout, 4 caches
    assert found[("planner/api.py", "solve")][1] == 3  # model, cluster, **options
