"""The Python API (issue 18, item 11; planner/api.py): each function returns what the command's
`--json` prints for the same inputs, raises the CLI's named errors with its messages, prints
nothing and never exits; plan files round-trip; every public function is typed and its
docstring's example runs; docs/api.md's code runs and prints what it shows. Also the default
stack search under a short --time-limit (planner/search/stacks.py)."""

from __future__ import annotations

import doctest
import importlib
import inspect
import json
import re
import subprocess
import sys
import time
import typing
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

import planner
from planner import api
from planner.cli.main import cli
from planner.errors import InfeasibleError, PlannerError, UsageError
from planner.specs import ModelSpec, PlanDocument, SolveDocument, Target

from tests.unit.search.test_solver import SMALL, tiny_cluster
from tests.paths import ROOT

FUNCTIONS = [getattr(api, name) for name in api.__all__ if inspect.isfunction(getattr(api, name))]
H100_8 = dict(model="llama3-8b", cluster="dgx-h100-80gb", gpus=8, global_batch=32, seq_len=4096)


def cli_run(*args: str) -> SimpleNamespace:
    res = CliRunner().invoke(cli, list(args))
    return SimpleNamespace(code=res.exit_code, stdout=res.stdout, stderr=res.stderr)


def cli_json(*args: str, code: int = 0) -> dict:
    res = cli_run(*args, "--json")
    assert res.code == code, res.stderr
    return json.loads(res.stdout)


def options(**kw) -> list[str]:
    """Keywords as the command line spells them: global_batch=32 -> --global-batch 32; True -> the flag."""
    out = []
    for key, value in kw.items():
        flag = "--" + key.replace("_", "-")
        out += [flag] if value is True else [flag, str(value)]
    return out


def without_times(doc: dict) -> dict:
    """A solve document less its wall times, the one thing two runs of a search differ in."""
    doc = json.loads(json.dumps(doc))
    doc["search"].pop("solve_time_s")
    for stack in doc["stacks"]:
        if stack["search"]:
            stack["search"].pop("solve_time_s")
    return doc


# --------------------------------------------------------------------------- against the CLI


@pytest.mark.parametrize(
    "layout",
    [
        dict(tp=2, zero=1),
        dict(
            tp=2,
            pp=2,
            vpp=2,
            sequence_parallel=True,
            recompute="selective",
            layers_per_stage="8,8,8,8",
            mesh_order="tp,pp,dp",
            target="megatron",
            tp_comm_overlap=True,
        ),
        dict(pp=2, micro_batch_size=2, schedule="gpipe", recompute="full", precision="fp16", optimizer="sgd"),
        dict(gpus=2, pp=2),  # over its memory: the CLI prints the document and exits 1, the API returns it
    ],
    ids=["tp-zero", "megatron-interleaved", "gpipe-fp16", "does-not-fit"],
)
def test_estimate_is_the_cli_json(layout):
    fits = "gpus" not in layout
    inputs = {**H100_8, **({} if fits else {"cluster": "dgx-a100-40gb"}), **layout}
    doc = api.estimate(**inputs)
    assert doc.model_dump(mode="json") == cli_json("estimate", *options(**inputs), code=0 if fits else 1)
    assert doc.estimate.fits is fits


def test_estimate_takes_lists_objects_and_nodes_as_the_cli_takes_strings():
    model, cluster = api.load_model("llama3-8b"), api.load_cluster("dgx-h100-80gb")
    by_text = api.estimate(
        "llama3-8b",
        "dgx-h100-80gb",
        gpus=16,
        global_batch=32,
        seq_len=4096,
        pp=4,
        layers_per_stage="7,9,9,7",
        mesh_order="tp,pp,dp",
    )
    by_objects = api.estimate(
        model,
        cluster,
        nodes=2,
        global_batch=32,
        seq_len=4096,
        pp=4,
        layers_per_stage=[7, 9, 9, 7],
        mesh_order=["tp", "pp", "dp"],
    )
    assert by_objects == by_text
    assert by_objects.plan.layers_per_stage == [7, 9, 9, 7]


def test_what_if_is_the_cli_what_if(tmp_path):
    base = api.estimate(**H100_8, tp=2, zero=1)
    path = tmp_path / "base.json"
    api.write_plan(base, path)
    change = dict(tp=4, cluster="dgx-a100-80gb", recompute="full", global_batch=64)
    res = cli_run("estimate", "--plan", str(path), *options(**change), "--json")
    assert res.code == 0, res.stderr
    got = api.what_if(path, **change)
    assert got.document.model_dump(mode="json") == json.loads(res.stdout)
    assert res.stderr.strip() == f"changed from {path}: " + "; ".join(got.changes)
    assert got.changes[:2] == ("cluster dgx-h100-80gb -> dgx-a100-80gb", "global_batch_size 32 -> 64")
    assert api.what_if(base, **change) == got  # a document in memory as its file
    assert api.what_if(base).changes == () and api.what_if(base).document == base


def test_a_what_if_to_tp_1_drops_sequence_parallelism_and_says_so():
    """Sequence parallelism splits over the tp ranks: a what-if to tp 1 of such a plan drops it
    (and its overlap) instead of refusing the layout, which no option could then turn off."""
    base = api.estimate(**H100_8, tp=2, sequence_parallel=True, tp_comm_overlap=True, target="megatron")
    assert base.plan.sequence_parallel and base.plan.tp_comm_overlap
    got = api.what_if(base, tp=1)
    assert not got.document.plan.sequence_parallel and not got.document.plan.tp_comm_overlap
    assert got.changes[:3] == ("tp 2 -> 1", "sequence_parallel dropped (tp 1)", "tp_comm_overlap dropped (tp 1)")
    assert api.what_if(base, tp=4).document.plan.sequence_parallel


def test_a_what_if_to_a_target_without_tp_overlap_drops_it_and_says_so():
    """A target that lacks the plan's TP overlap (or norm/activation recompute): dropped with a
    note, not refused with "drop it", which no option of `plan estimate --plan` can do."""
    base = api.estimate(**H100_8, tp=2, sequence_parallel=True, tp_comm_overlap=True, target="megatron")
    for target in ("deepspeed", "generic"):
        got = api.what_if(base, target=target)
        assert not got.document.plan.tp_comm_overlap and got.document.plan.sequence_parallel
        assert got.changes == (f"target megatron -> {target}", f"tp_comm_overlap dropped ({target} has none)")
    assert api.what_if(base, target="torchtitan").document.plan.tp_comm_overlap  # torchtitan has it: kept


def test_a_what_if_of_vpp_says_the_schedule_it_changes():
    base = api.estimate("gpt2-124m", "dgx-h100-80gb", gpus=8, global_batch=64, pp=2, schedule="gpipe")
    got = api.what_if(base, vpp=3)
    assert got.document.plan.schedule.value == "interleaved-1f1b"
    assert "schedule gpipe -> interleaved-1f1b (vpp 3)" in got.changes


@pytest.mark.slow
def test_solve_is_the_cli_json():
    """Every stack (the default) and one target with pins: --fix strings or a mapping."""
    inputs = dict(gpus=16, global_batch=64, seq_len=2048)
    doc = api.solve("gpt3-1.3b", "dgx-a100-80gb", **inputs)
    assert isinstance(doc, SolveDocument) and doc.stacks
    assert without_times(doc.model_dump(mode="json")) == without_times(
        cli_json("solve", *options(model="gpt3-1.3b", cluster="dgx-a100-80gb", **inputs))
    )
    pinned = api.solve("gpt3-1.3b", "dgx-a100-80gb", **inputs, target="megatron", fixes={"tp": 2, "sp": True}, top_k=1)
    assert pinned.plan.tp == 2 and pinned.plan.sequence_parallel and pinned.job.target == Target.megatron
    by_strings = api.solve(
        "gpt3-1.3b", "dgx-a100-80gb", **inputs, target="megatron", fixes=["tp=2", "sp=true"], top_k=1
    )
    assert by_strings.model_copy(update={"search": pinned.search}) == pinned
    want = cli_json(
        "solve",
        *options(model="gpt3-1.3b", cluster="dgx-a100-80gb", **inputs, target="megatron", top_k=1),
        "--fix",
        "tp=2",
        "--fix",
        "sp=true",
    )
    assert without_times(pinned.model_dump(mode="json")) == without_times(want)


def test_read_plan_and_export_plan_are_the_cli_on_an_alternative(tmp_path):
    doc = api.solve("gpt3-1.3b", "dgx-a100-80gb", gpus=16, global_batch=64, seq_len=2048)
    path = tmp_path / "solve.json"
    api.write_plan(doc, path)
    assert api.read_plan(path, alternative=1).model_dump(mode="json") == cli_json(
        "estimate", "--plan", str(path), "--alternative", "1"
    )
    stack = doc.alternatives[0].target.value
    out = api.export_plan(path, stack, alternative=1)
    assert {"stack": out.stack, "kind": out.kind, "data": out.data, "text": out.text} == cli_json(
        "export", str(path), "--to", stack, "--alternative", "1"
    )
    assert api.export_plan(doc, stack, alternative=1) == out  # the document in memory
    assert api.export_plan(doc, doc.job.target.value) == api.export_plan(path, doc.job.target.value)


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "call, cli_args, kind",
    [
        (
            lambda: api.load_model("gpt-5"),
            ["estimate", "--model", "gpt-5", "--cluster", "dgx-h100-80gb", "--gpus", "8"],
            UsageError,
        ),
        (lambda: api.estimate(**H100_8, tp=3), ["estimate", *options(**H100_8, tp=3)], UsageError),
        (
            lambda: api.solve("gpt3-1.3b", "dgx-a100-80gb", gpus=16, global_batch=64, fixes={"zero": 7}),
            [
                "solve",
                *options(model="gpt3-1.3b", cluster="dgx-a100-80gb", gpus=16, global_batch=64),
                "--fix",
                "zero=7",
            ],
            UsageError,
        ),
        (
            lambda: api.solve("gpt3-175b", "dgx-a100-80gb", gpus=8, global_batch=16, seq_len=2048),
            ["solve", *options(model="gpt3-175b", cluster="dgx-a100-80gb", gpus=8, global_batch=16, seq_len=2048)],
            InfeasibleError,
        ),
        (lambda: api.export_plan(api.estimate(**H100_8, pp=2, schedule="gpipe"), "megatron"), None, UsageError),
    ],
    ids=["unknown-preset", "tp-not-dividing", "bad-fix", "nothing-fits", "stack-cannot-run"],
)
def test_errors_are_the_clis_named_errors_and_messages(call, cli_args, kind, capsys):
    with pytest.raises(kind) as err:
        call()
    assert isinstance(err.value, PlannerError)
    assert capsys.readouterr() == ("", "")  # the API prints nothing (and raises, never exits)
    if cli_args is not None:
        res = cli_run(*cli_args)
        assert res.code == kind.exit_code and res.stderr.strip() == f"error: {err.value}"


def test_a_plan_over_its_memory_is_returned_not_raised():
    doc = api.estimate("llama3-8b", "dgx-a100-40gb", gpus=2, global_batch=8, seq_len=2048, pp=2)
    assert not doc.estimate.fits
    assert max(r.total for r in doc.estimate.memory_gib_per_pipeline_rank) > doc.estimate.memory_capacity_gib


def test_an_alternative_a_document_lacks_is_a_usage_error():
    doc = api.estimate(**H100_8)
    with pytest.raises(UsageError, match="no alternatives"):
        api.what_if(doc, alternative=1)
    solved = api.solve("gpt3-1.3b", "dgx-a100-80gb", gpus=16, global_batch=64, seq_len=2048, top_k=1)
    with pytest.raises(UsageError, match=f"alternatives 1 to {len(solved.alternatives)}"):
        api.export_plan(solved, "megatron", alternative=len(solved.alternatives) + 1)


def test_an_alternative_without_its_plan_is_named_not_the_file(tmp_path):
    """The document's own plan is there: an alternative lacking one is that alternative's fault
    (it read "not a plan file, missing plan")."""
    solved = api.solve("gpt3-1.3b", "dgx-a100-80gb", gpus=16, global_batch=64, seq_len=2048, top_k=1)
    path = tmp_path / "solve.json"
    path.write_text(json.dumps({**solved.model_dump(mode="json"), "alternatives": [{}, []]}))
    for k, why in ((1, "alternative 1 is malformed: it has no plan"), (2, "alternative 2 is malformed")):
        with pytest.raises(UsageError) as err:
            api.what_if(path, alternative=k)
        assert str(err.value) == f"{path}: {why}"


# --------------------------------------------------------------------------- files


def test_write_plan_writes_what_minus_o_writes_and_read_plan_reads_it_back(tmp_path):
    doc = api.estimate(**H100_8, tp=2, pp=2, sequence_parallel=True, recompute="selective")
    ours, theirs = tmp_path / "api.json", tmp_path / "cli.json"
    api.write_plan(doc, ours)
    res = cli_run(
        "estimate", *options(**H100_8, tp=2, pp=2, sequence_parallel=True, recompute="selective"), "-o", str(theirs)
    )
    assert res.code == 0, res.stderr
    assert ours.read_bytes() == theirs.read_bytes()
    assert api.read_plan(ours) == doc
    solved = api.solve("gpt3-1.3b", "dgx-a100-80gb", gpus=16, global_batch=64, seq_len=2048)
    api.write_plan(solved, ours)  # replaces the file
    again = api.read_plan(ours)
    assert type(again) is PlanDocument and (again.plan, again.job, again.estimate) == (
        solved.plan,
        solved.job,
        solved.estimate,
    )
    assert SolveDocument.model_validate_json(ours.read_text()) == solved
    with pytest.raises(UsageError, match="it is a directory"):
        api.write_plan(doc, tmp_path)


def test_load_model_and_cluster_take_objects_names_and_paths(tmp_path):
    model = api.load_model("gpt2-124m")
    assert api.load_model(model) is model
    spec = tmp_path / "tiny.json"
    spec.write_text(
        ModelSpec(
            name="tiny", num_layers=2, hidden_size=64, num_heads=2, vocab_size=100, max_seq_len=64
        ).model_dump_json()
    )
    assert api.load_model(spec).name == "tiny" and api.load_model(str(spec)) == api.load_model(spec)
    cluster = api.load_cluster("dgx-a100-80gb")
    assert api.load_cluster(cluster) is cluster and api.load_cluster(cluster.name) == cluster


# --------------------------------------------------------------------------- the sweep a script writes


@pytest.mark.slow
def test_a_sweep_over_gpu_counts_in_one_process():
    """What scripting a sweep meant parsing `--json` for: each count solved in-process, the
    recommendation a plan of that many GPUs that some stack runs, faster with more GPUs."""
    model, cluster = api.load_model("llama3-8b"), api.load_cluster("dgx-h100-80gb")
    docs = {gpus: api.solve(model, cluster, gpus=gpus, global_batch=256, seq_len=4096) for gpus in (8, 16, 32, 64)}
    for gpus, doc in docs.items():
        assert doc.num_gpus == doc.plan.world_size == gpus and doc.estimate.fits
        assert doc.job.target.value in ("megatron", "deepspeed", "torchtitan", "accelerate")
        api.export_plan(doc, doc.job.target.value)  # the stack named runs it
    rates = [doc.estimate.tokens_per_s for doc in docs.values()]
    assert rates == sorted(rates) and rates[-1] > 4 * rates[0]


@pytest.mark.slow
def test_the_docs_page_runs_and_prints_what_it_shows(tmp_path, monkeypatch, capsys):
    """docs/api.md: every python block run in order in one namespace; a block followed by a
    plain block prints exactly that."""
    monkeypatch.chdir(tmp_path)
    text = (ROOT / "docs" / "api.md").read_text()
    blocks = re.findall(r"```(\w*)\n(.*?)```", text, re.S)
    namespace: dict = {}
    ran = 0
    for k, (lang, code) in enumerate(blocks):
        if lang != "python":
            continue
        exec(compile(code, f"docs/api.md block {k}", "exec"), namespace)
        ran += 1
        printed = capsys.readouterr().out
        if k + 1 < len(blocks) and blocks[k + 1][0] == "":
            assert printed == blocks[k + 1][1]
    assert ran >= 4 and (tmp_path / "plan.json").exists()


# --------------------------------------------------------------------------- typed, documented, exported


@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda f: f.__name__)
def test_each_function_is_typed_and_documented_with_an_example(fn):
    hints = typing.get_type_hints(fn)
    params = inspect.signature(fn).parameters
    assert set(params) <= set(hints) and "return" in hints, fn.__name__
    assert ">>> " in (fn.__doc__ or ""), fn.__name__


def test_the_examples_in_the_docstrings_run():
    result = doctest.testmod(api, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= len(FUNCTIONS) and result.failed == 0


def test_the_package_exports_the_api_without_loading_it_on_import():
    for name in api.__all__:
        assert name in planner.__all__ and getattr(planner, name) is getattr(api, name)
    importlib.import_module("planner.export.megatron")  # binds planner.stacks, no name of the API
    assert planner.export_plan is api.export_plan
    assert planner.UsageError is UsageError and planner.InfeasibleError is InfeasibleError
    code = "import sys, planner; print('planner.api' in sys.modules, 'planner.search.solve' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.split() == ["False", "False"]


# --------------------------------------------------------------------------- --time-limit over the stacks


def test_a_stack_that_outlasts_the_time_limit_leaves_the_others_plans(monkeypatch):
    """The widest stack's enumeration and bounds can outlast a short limit before its first
    plan (gpt3-175b on 1,024 A100s: megatron's 0.9 s against --time-limit 0.5): searched last,
    it takes only what the others left, and their plans are the answer, not proven, and with no
    bound on their gap: megatron's plans, never bounded, may be any faster (the gap used to be
    taken over the searched stacks' bounds only, and read 0 %)."""
    from planner.search import stacks
    from planner.search.deadline import Deadline

    search, clock, offset = stacks.solve, time.perf_counter, [0.0]
    monkeypatch.setattr(stacks, "time", SimpleNamespace(perf_counter=lambda: clock() + offset[0]))

    def megatron_outlasts_the_limit(
        model, cluster, job, space, limit, top_k, time_limit, solver, layouts=None, deadline=None
    ):
        if job.target == Target.megatron:
            offset[0] += 60.0  # the whole limit and more, before its first ILP
            deadline = Deadline.after(0.0)
        return search(model, cluster, job, space, limit, top_k, time_limit, solver, layouts=layouts, deadline=deadline)

    monkeypatch.setattr(stacks, "solve", megatron_outlasts_the_limit)
    doc = api.solve(SMALL, tiny_cluster(1.5), gpus=4, global_batch=2, seq_len=2048, time_limit=30.0)
    assert doc.job.target != Target.megatron and not doc.search.optimal and doc.search.optimality_gap == 1
    reasons = {s.target: s.reason for s in doc.stacks}
    assert reasons[Target.megatron] == "no plan found within its share of --time-limit"
    assert sum(s.alternative is not None for s in doc.stacks) == 3


def test_the_gap_line_says_when_nothing_bounds_it():
    from planner.cli.render import _gap

    assert _gap(0.05) == "within 5% of the optimum" and _gap(1.0).startswith("no bound on how far from the optimum")


def test_the_issues_short_time_limit_returns_a_plan():
    """Issue 18's case: exit 1 "no plan found within --time-limit 0.5 s" before."""
    res = cli_run(
        "solve",
        *options(
            model="gpt3-175b", cluster="dgx-a100-80gb", gpus=1024, global_batch=1536, seq_len=2048, time_limit=0.5
        ),
        "--json",
    )
    assert res.code == 0, res.stderr
    doc = SolveDocument.model_validate_json(res.stdout)
    assert doc.plan.world_size == 1024 and doc.estimate.fits
    unproven = [s for s in doc.stacks if s.search is not None and not s.search.optimal]
    assert doc.search.optimal == (not unproven)  # proven only where every stack's search finished


def test_the_stacks_are_searched_narrowest_first():
    """stacks.SEARCH_ORDER: ascending in candidates on the issue's case (its comment gives the counts)."""
    from dataclasses import replace

    from planner.search.candidates import SearchSpace, enumerate_candidates, enumerate_layouts
    from planner.search.stacks import SEARCH_ORDER, STACK_TARGETS, target_space
    from planner.specs import JobSpec

    model, cluster = api.load_model("gpt3-175b"), api.load_cluster("dgx-a100-80gb")
    base = SearchSpace(num_gpus=1024, global_batch_size=1536, seq_len=2048)
    layouts = enumerate_layouts(model, cluster, replace(base, tp_comm_overlap=(False, True)))
    count = {}
    for target in SEARCH_ORDER:
        job = JobSpec(global_batch_size=1536, seq_len=2048, target=target)
        count[target] = len(enumerate_candidates(model, cluster, target_space(base, model, job), layouts)[0])
    assert set(SEARCH_ORDER) == set(STACK_TARGETS)
    assert list(count.values()) == sorted(count.values())


@pytest.mark.parametrize(
    "fix, check",
    [
        ("schedule=gpipe", lambda p: p.schedule.value == "gpipe"),
        ("mesh_order=tp,pp,dp", lambda p: [a.value for a in p.mesh_order] == ["tp", "pp", "dp"]),
        ("zero=1", lambda p: p.zero_stage == 1 and p.dp == 1),
    ],
)
def test_a_fixed_choice_is_searched_even_where_another_dominates_it(fix, check):
    """GPipe (1F1B is as fast with fewer activations), ZeRO on dp 1 and a dominated mesh order
    never win, so the search skips them, but not when --fix asks for them (found by fuzzing:
    'no layout is valid')."""
    fixes = [fix, "pp=2"] + (["dp=1"] if fix.startswith("zero") else [])
    doc = api.solve("gpt2-124m", "dgx-h100-80gb", gpus=8, global_batch=64, target="generic", top_k=0, fixes=fixes)
    assert check(doc.plan), doc.plan


def test_a_limit_far_below_any_layout_says_how_many_times_over():
    from planner.errors import InfeasibleError

    with pytest.raises(InfeasibleError, match=r"\de\+30 times the limit") as exc:
        api.solve("gpt2-124m", "dgx-h100-80gb", gpus=8, global_batch=16, max_memory_gib=1e-30, top_k=0)
    assert "%" not in str(exc.value)
