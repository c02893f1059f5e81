"""`plan size` (planner/size.py, planner/cli/size.py): every point is `plan solve`'s answer turned
into days and GPU-hours by the stated formulas; the front is exactly the non-dominated points
(checked against every pair); scaling efficiency, whole nodes, refusals in one line, the
document against its schema, the picture."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from planner import api
from planner.errors import UsageError
from planner.size import SizeRequest, parse_gpu_counts, parse_prices, parse_tokens, reason_of, sweep, whole_nodes
from planner.specs import SizeDocument

pytestmark = pytest.mark.slow  # CONTRIBUTING.md: the quick tier leaves it out

PLAN = [sys.executable, "-m", "planner.cli.main"]
CLUSTERS = ("dgx-a100-80gb", "dgx-h100-80gb")


@pytest.fixture(scope="module")
def doc() -> SizeDocument:
    model = api.load_model("llama3-8b")
    prices = {"dgx-a100-80gb": 1.5, "dgx-h100-80gb": 2.5}
    request = SizeRequest(model, 1e12, 256, 4096, target="megatron", prices=prices, deadline_days=60, min_scaling=0.9)
    return sweep(request, [(n, api.load_cluster(n)) for n in CLUSTERS], [8, 16, 64])


def test_tokens_counts_and_prices_are_read_or_refused():
    assert parse_tokens("15T") == 15e12 and parse_tokens("300B") == 3e11 and parse_tokens("2.5e12") == 2.5e12
    assert parse_gpu_counts("256..8192") == [256, 512, 1024, 2048, 4096, 8192]
    assert parse_gpu_counts("1024,256,1024") == [256, 1024] and parse_gpu_counts("64") == [64]
    assert parse_prices(["a=2.5"], ["a", "b"]) == {"a": 2.5}
    for bad in ("15X", "", "0", "1e30", "-3T"):
        with pytest.raises(UsageError, match="--tokens"):
            parse_tokens(bad)
    for bad in ("8192..256", "0..8", "a,b", "", "256..", "1.5"):
        with pytest.raises(UsageError, match="--gpus"):
            parse_gpu_counts(bad)
    for bad in (["c=2"], ["a=0"], ["a=nan"], ["a"], ["=2"], ["a=2", "a=3"]):
        with pytest.raises(UsageError, match="--price"):
            parse_prices(bad, ["a", "b"])


def test_counts_round_to_whole_nodes():
    assert [whole_nodes(n, 8) for n in (4, 8, 12, 13, 256)] == [4, 8, 16, 16, 256]
    assert [whole_nodes(n, 72) for n in (256, 512, 1024)] == [288, 504, 1008]  # 3.56, 7.11, 14.2 racks


def test_counts_rounding_to_one_point_are_said_and_tokens_read_in_their_unit():
    r = subprocess.run(
        [
            *PLAN,
            "size",
            "--model",
            "llama3-8b",
            "--clusters",
            "dgx-h100-80gb",
            "--gpus",
            "8,9,10,16",
            "--tokens",
            "2P",
            "--global-batch",
            "64",
            "--seq-len",
            "4096",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert "plan size: dgx-h100-80gb: 8, 9 and 10 GPUs round to 8 (whole nodes of 8): one point" in r.stderr
    assert r.stdout.startswith("llama3-8b: 2P tokens = ")  # not '2e+03T'


def test_each_point_is_plan_solves_answer_in_days_and_gpu_hours(doc):
    steps = math.ceil(1e12 / (256 * 4096))
    assert doc.steps == steps and len(doc.points) == 6
    for p in doc.points:
        assert p.feasible, p
        ref = api.solve("llama3-8b", p.cluster, gpus=p.gpus, global_batch=256, seq_len=4096, target="megatron", top_k=0)
        assert p.plan == ref.plan and p.step_time_s == ref.estimate.step_time_s
        assert p.days == pytest.approx(steps * p.step_time_s / 86400, rel=1e-12)
        assert p.gpu_hours == pytest.approx(p.gpus * steps * p.step_time_s / 3600, rel=1e-12)
        assert p.cost == pytest.approx(p.gpu_hours * doc.prices[p.cluster], rel=1e-12)
        assert p.days_interval[0] <= p.days <= p.days_interval[1]
        assert p.within_deadline == (p.days <= 60)


def test_the_front_is_exactly_the_non_dominated_points(doc):
    assert doc.front_axis == "cost"  # every cluster priced
    ok = [p for p in doc.points if p.feasible]
    for p in ok:
        dominated = any(
            q.days <= p.days and q.cost <= p.cost and (q.days < p.days or q.cost < p.cost) for q in ok if q is not p
        )
        assert p.on_front == (not dominated), p
    assert any(p.on_front for p in ok)


def test_scaling_efficiency_is_the_speed_up_per_gpu_ratio(doc):
    for name in CLUSTERS:
        ps = sorted((p for p in doc.points if p.cluster == name), key=lambda p: p.gpus)
        assert ps[0].scaling_efficiency is None and not ps[0].stops_paying
        for prev, p in zip(ps, ps[1:]):
            assert p.scaling_efficiency == pytest.approx(
                (prev.step_time_s / p.step_time_s) * prev.gpus / p.gpus, rel=1e-12
            )
            assert p.stops_paying == (p.scaling_efficiency < 0.9)


def test_a_point_where_nothing_fits_says_memory():
    model = api.load_model("gpt3-175b")
    request = SizeRequest(model, 3e11, 1536, 2048, target="megatron")
    d = sweep(request, [("dgx-a100-40gb", api.load_cluster("dgx-a100-40gb"))], [8, 1024])
    small, large = d.points
    assert (
        (small.feasible, small.reason, small.on_front) == (False, "memory", False) and large.feasible and large.on_front
    )
    assert reason_of(UsageError("global batch 8 cannot be split over dp 16")) == "batch"
    from planner.cli.render import size_summary

    assert "1 of 2 points has no plan (memory: no layout fits)" in size_summary(d)  # the reasons the points have, only


def test_json_matches_the_document_and_the_picture_is_drawn(tmp_path):
    pytest.importorskip("matplotlib")
    out, pic = tmp_path / "size.json", tmp_path / "front.svg"
    r = subprocess.run(
        [
            *PLAN,
            "size",
            "--model",
            "llama3-8b",
            "--clusters",
            "dgx-h100-80gb",
            "--gpus",
            "8..16",
            "--tokens",
            "1T",
            "--global-batch",
            "256",
            "--seq-len",
            "4096",
            "--target",
            "megatron",
            "--json",
            "-o",
            str(out),
            "--picture",
            str(pic),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    printed = SizeDocument.model_validate_json(r.stdout)
    assert SizeDocument.model_validate_json(out.read_text()).points == printed.points
    assert [p.gpus for p in printed.points] == [8, 16]
    svg = pic.read_text()
    assert "days to train" in svg and "dgx-h100-80gb" in svg
    assert r.stderr.splitlines() == [f"document written to {out}", f"picture written to {pic}"]


def test_with_no_point_the_picture_says_so_and_nothing_else_reaches_stderr(tmp_path):
    """Every point without a plan: the document and a picture that says so are written, the
    error is the last line, and matplotlib's warning of an empty legend is not printed."""
    pytest.importorskip("matplotlib")
    out, pic = tmp_path / "size.json", tmp_path / "front.svg"
    r = subprocess.run(
        [
            *PLAN,
            "size",
            "--model",
            "llama3-70b",
            "--clusters",
            "dgx-a100-40gb",
            "--gpus",
            "8",
            "--tokens",
            "1T",
            "--global-batch",
            "8",
            "--seq-len",
            "8192",
            "-o",
            str(out),
            "--picture",
            str(pic),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert r.returncode == 1
    lines = r.stderr.splitlines()
    assert lines[:2] == [f"document written to {out}", f"picture written to {pic}"] and len(lines) == 3, lines
    assert lines[2].startswith("error: no point has a plan")
    assert "no point has a plan" in pic.read_text()


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--tokens", "15X"], "--tokens"),
        (["--gpus", "8192..256"], "the range runs backwards; give FIRST..LAST with FIRST <= LAST, e.g. 256..8192"),
        (["--clusters", "dgx-h100-80gb,,"], "distinct"),  # an empty name, as --gpus 8,,16 is refused
        (["--price", "dgx-h200=2"], "not one of --clusters"),
        (["--budget", "1000"], "--budget needs prices"),
        (["--clusters", "dgx-h100-80gb,dgx-h100-80gb"], "distinct"),
        (["--deadline", "soon"], "--deadline"),
        (["--picture", "front.gif"], ".svg or .png"),
        (["--model", "gpt2-124m"], "--seq-len 1024 or less"),  # wrong at every count: one error, not a row per point
    ],
)
def test_bad_inputs_are_one_line(tmp_path, args, needle):
    base = {
        "--model": "llama3-8b",
        "--clusters": "dgx-h100-80gb",
        "--gpus": "8",
        "--tokens": "1T",
        "--global-batch": "64",
        "--seq-len": "4096",
    }
    for i in range(0, len(args), 2):
        base[args[i]] = args[i + 1]
    r = subprocess.run(
        [*PLAN, "size", *[x for kv in base.items() for x in kv]], capture_output=True, text=True, cwd=tmp_path
    )
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.stderr
    assert not list(tmp_path.iterdir())


def test_the_size_schema_is_published():
    from planner.cli.schema import schema_text

    schema = json.loads(schema_text("size"))
    assert schema["$id"].startswith("planner/size-") and "points" in schema["properties"]


def test_nothing_fitting_anywhere_is_one_line_saying_by_how_much(tmp_path):
    r = subprocess.run(
        [
            *PLAN,
            "size",
            "--model",
            "gpt3-175b",
            "--clusters",
            "dgx-a100-40gb",
            "--gpus",
            "8,16",
            "--tokens",
            "300B",
            "--global-batch",
            "1536",
            "--seq-len",
            "2048",
            "--target",
            "megatron",
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1, r.stderr
    assert (
        lines[0].startswith("error: no point has a plan; at 16 GPUs of dgx-a100-40gb: no layout fits")
        and "over" in lines[0]
    )
    doc = SizeDocument.model_validate_json(r.stdout)  # the document still printed: every point and why
    assert [p.reason for p in doc.points] == ["memory", "memory"] and all("GiB" in p.detail for p in doc.points)


def test_the_budget_line_names_the_cheapest_point_when_none_is_within(doc):
    """Every point priced but over --budget: the line says the cheapest and what it costs, not
    "no priced point" (which is for a sweep without prices)."""
    from planner.cli.render import size_summary

    cheapest = min((p for p in doc.points if p.feasible), key=lambda p: p.cost)
    over = doc.model_copy(
        update={
            "budget": cheapest.cost / 2,
            "points": [p.model_copy(update={"within_budget": False}) for p in doc.points],
        }
    )
    line = next(x for x in size_summary(over) if x.startswith("within $"))
    assert line == (
        f"within ${cheapest.cost / 2:,.0f}: no point; the cheapest priced one is {cheapest.gpus:,} x {cheapest.cluster}, "
        f"${cheapest.cost:,.0f} in " + line.rsplit(" in ", 1)[1]
    )
    unpriced = over.model_copy(
        update={"front_axis": "gpu_hours", "points": [p.model_copy(update={"cost": None}) for p in over.points]}
    )
    assert next(x for x in size_summary(unpriced) if x.startswith("within $")).endswith("no priced point")


def test_the_summary_counts_points_in_words(doc):
    from planner.cli.render import size_summary

    one = doc.model_copy(update={"points": doc.points[:1], "deadline_days": None, "budget": 0.4})
    lines = size_summary(one)
    assert lines[-1].startswith("1 point solved in ") and "within $0.40: " in "\n".join(lines)
