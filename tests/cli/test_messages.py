"""A new user's first hour (issue 18's smaller stumbles): a plan that does not fit says so in a
line and exits 1 (a new layout and a what-if alike), `-o` confirms what it wrote, predicted
against measured reads as one ratio, and memory sizes in sentences are rounded."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from planner.cli.render import gib, prediction_verdict
from tests.paths import ROOT

pytestmark = pytest.mark.slow  # CONTRIBUTING.md: the quick tier leaves it out

OVER = [
    "--model",
    "llama3-8b",
    "--cluster",
    "dgx-a100-40gb",
    "--gpus",
    "2",
    "--global-batch",
    "8",
    "--seq-len",
    "2048",
    "--pp",
    "2",
]


def plan(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "planner.cli.main", *args], capture_output=True, text=True, timeout=120, **kw
    )


def test_a_plan_that_does_not_fit_says_by_how_much_and_exits_1(tmp_path):
    out = tmp_path / "over.json"
    res = plan("estimate", *OVER, "-o", str(out))
    assert res.returncode == 1, res.stderr
    *first, last = res.stderr.strip().splitlines()
    assert (
        last.startswith("error: the plan does not fit: pipeline rank ") and "GiB over the device's 40 GiB (A100" in last
    )
    assert "DOES NOT FIT" in res.stdout  # the estimate is still shown ...
    assert first == [f"plan written to {out}"]  # ... and written, which -o confirms before the error
    doc = json.loads(out.read_text())  # how far over is the point
    assert doc["estimate"]["fits"] is False
    assert "Traceback" not in res.stderr
    js = plan("estimate", *OVER, "--json")
    assert js.returncode == 1 and json.loads(js.stdout)["estimate"]["fits"] is False


def test_a_what_if_that_stops_fitting_exits_like_a_new_layout(tmp_path):
    base = tmp_path / "base.json"
    fitting = [a if a != "2" else "8" for a in OVER[:6]] + OVER[6:]  # 8 GPUs: dp 4 x pp 2
    ok = plan("estimate", *fitting, "--zero", "3", "--recompute", "full", "-o", str(base))
    assert ok.returncode == 0, ok.stderr
    res = plan("estimate", "--plan", str(base), "--recompute", "none", "--zero", "0")
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()  # the error alone (issue 19, item 12): the report shows the layout
    assert len(lines) == 1 and lines[0].startswith("error: the plan does not fit"), lines


OVER4 = OVER[:5] + ["4"] + OVER[6:]  # dp 2: ZeRO has ranks to shard over


@pytest.mark.parametrize(
    "args, suggested, not_suggested",
    [
        (OVER, ["--recompute selective or full"], ["--zero"]),  # dp 1: nothing for ZeRO to shard over
        (OVER4, ["a higher --zero", "--recompute selective or full"], []),
        (OVER4 + ["--recompute", "selective"], ["a higher --zero", "--recompute full"], ["selective or full"]),
        (
            ["--model", "llama3-70b"] + OVER4[2:] + ["--recompute", "full", "--zero", "3"],
            ["more --tp or --pp"],
            ["--zero", "--recompute"],
        ),
    ],
)
def test_does_not_fit_names_only_the_steps_the_plan_has_not_taken(args, suggested, not_suggested):
    res = plan("estimate", *args)
    assert res.returncode == 1
    ways = res.stderr.strip().splitlines()[-1].split("GiB (")[-1]  # the remedies, after the device's name
    assert all(s in ways for s in suggested) and not any(s in ways for s in not_suggested), ways


def test_does_not_fit_counts_partly_recomputed_stages_as_a_step_not_taken(tmp_path):
    """stage_recompute with one full layer of 16 a stage: the other 15 keep their activations,
    so full recompute is still a way down."""
    doc = tmp_path / "over.json"
    assert plan("estimate", *OVER4, "-o", str(doc)).returncode == 1
    data = json.loads(doc.read_text())
    data["plan"].update(recompute="mixed", stage_recompute=[{"none": 15, "full": 1}, {"none": 15, "full": 1}])
    doc.write_text(json.dumps(data))
    res = plan("estimate", "--plan", str(doc))
    assert res.returncode == 1 and "--recompute full" in res.stderr.strip().splitlines()[-1], res.stderr


def test_exporting_a_plan_that_does_not_fit_warns(tmp_path):
    """The configuration is still written (a user may mean to size it up), with the estimate's
    line on stderr; a plan that fits exports without it."""
    over, cfg = tmp_path / "over.json", tmp_path / "args.sh"
    assert plan("estimate", *OVER, "-o", str(over)).returncode == 1
    res = plan("export", str(over), "--to", "megatron", "-o", str(cfg))
    assert res.returncode == 0 and cfg.read_text()
    assert "warning: the plan does not fit: pipeline rank" in res.stderr, res.stderr
    assert f"the options named are `plan estimate --plan {over} --target megatron`'s" in res.stderr
    fits = tmp_path / "fits.json"
    assert (
        plan(
            "estimate",
            "--model",
            "gpt2-124m",
            "--cluster",
            "dgx-a100-40gb",
            "--gpus",
            "2",
            "--global-batch",
            "8",
            "--seq-len",
            "1024",
            "-o",
            str(fits),
        ).returncode
        == 0
    )
    res = plan("export", str(fits), "--to", "megatron")
    assert res.returncode == 0 and "does not fit" not in res.stderr, res.stderr


def test_nothing_fits_names_a_memory_limit_the_user_set_and_no_micro_batch_the_search_tried():
    res = plan(
        "solve",
        "--model",
        "llama3-8b",
        "--cluster",
        "dgx-a100-80gb",
        "--gpus",
        "8",
        "--global-batch",
        "8",
        "--seq-len",
        "2048",
        "--max-memory-gib",
        "5",
    )
    assert res.returncode == 1
    line = res.stderr.strip().splitlines()[-1]
    assert "a higher --max-memory-gib (the device's own limit is 76 GiB)" in line, line
    assert "micro-batch size 1" not in line  # with the batch fixed, the least memory was found over every micro-batch
    res = plan(
        "solve",
        "--model",
        "llama3-70b",
        "--cluster",
        "dgx-a100-40gb",
        "--gpus",
        "8",
        "--micro-batch-size",
        "4",
        "--seq-len",
        "8192",
    )
    line = res.stderr.strip().splitlines()[-1]
    assert res.returncode == 1 and "micro-batch size 1" in line and "--max-memory-gib" not in line, line


def test_output_files_are_confirmed(tmp_path):
    out = tmp_path / "p.json"
    res = plan(
        "estimate",
        "--model",
        "llama3-8b",
        "--cluster",
        "dgx-h100-80gb",
        "--gpus",
        "8",
        "--global-batch",
        "32",
        "--tp",
        "8",
        "-o",
        str(out),
    )
    assert res.returncode == 0 and f"plan written to {out}" in res.stderr
    cfg = tmp_path / "args.sh"
    res = plan("export", str(out), "--to", "megatron", "-o", str(cfg))
    assert res.returncode == 0, res.stderr
    assert f"written to {cfg}" in res.stderr and cfg.read_text()
    # plan solve says it on stderr too, not in its table on stdout (a pipe of the table stays the table)
    solved = tmp_path / "s.json"
    res = plan(
        "solve",
        "--model",
        "llama3-8b",
        "--cluster",
        "dgx-h100-80gb",
        "--gpus",
        "8",
        "--global-batch",
        "32",
        "--seq-len",
        "2048",
        "-o",
        str(solved),
    )
    assert res.returncode == 0 and f"plan written to {solved}" in res.stderr and "written to" not in res.stdout


@pytest.mark.parametrize(
    "predicted, measured, words",
    [
        (0.34, 1.0, "2.94x too fast"),
        (3.0, 1.0, "3.00x too slow"),
        (1.0, 1.001, "matches"),
    ],
)
def test_predicted_against_measured_is_one_ratio(predicted, measured, words):
    """A step predicted at 0.34x its measured time is a throughput predicted at 2.9x: the same
    error, said once, instead of '-66 %' beside '+194 %'."""
    assert words in prediction_verdict(predicted, measured)


def test_memory_in_a_sentence_is_rounded():
    assert gib(0.95 * 11.77) == "11.18" and gib(76.0) == "76" and gib(40.5) == "40.5"


def test_a_file_that_is_not_a_plan_is_named_so(tmp_path):
    """A model spec (or any document without schema_version and a plan's parts) handed to a
    command that reads plans: "not a plan file", not "schema_version (missing) is not readable"."""
    spec = tmp_path / "m.json"
    spec.write_text(json.dumps({"name": "m", "num_layers": 2, "hidden_size": 64, "num_heads": 4, "vocab_size": 128}))
    for args in (["show", str(spec)], ["estimate", "--plan", str(spec)], ["export", str(spec), "--to", "megatron"]):
        res = plan(*args)
        assert res.returncode == 2 and res.stderr.strip() == (
            f"error: {spec}: not a plan file, missing schema_version, model, cluster, num_gpus, job, plan (plan files are "
            "what `plan solve -o` and `plan estimate -o` write)"
        ), (args, res.stderr)


def test_documents_with_a_plans_header_but_not_its_parts_and_empty_files(tmp_path):
    """A `plan size` document (schema_version and a model, no plan), an empty schema_version, and
    empty or null files: each named for what it is, in one line."""
    size = tmp_path / "size.json"
    size.write_text(json.dumps({"schema_version": "1.13", "model": {"name": "m"}, "points": []}))
    res = plan("show", str(size))
    assert res.returncode == 2 and res.stderr.strip() == (
        f"error: {size}: not a plan file, missing cluster, num_gpus, job, plan (plan files are what `plan solve -o` and "
        "`plan estimate -o` write)"
    ), res.stderr
    blank = tmp_path / "blank.json"
    blank.write_text(
        json.dumps({"schema_version": "", **{k: 1 for k in ("model", "cluster", "num_gpus", "job", "plan")}})
    )
    assert plan("show", str(blank)).stderr.startswith(
        f"error: {blank}: schema_version '' is not readable by this planner"
    )
    for text, what in (
        ("", "empty"),
        ("# nothing yet\n", "empty"),
        ("---\n", "empty"),
        ("%YAML 1.2\n--- # none yet\n", "empty"),
        ("null\n", "null"),
    ):
        spec = tmp_path / "m.yaml"
        spec.write_text(text)
        res = plan("estimate", "--model", str(spec), "--cluster", "dgx-h100-80gb", "--gpus", "8", "--global-batch", "8")
        assert res.returncode == 2 and res.stderr.strip() == f"error: {spec}: {what}; expected a mapping of fields", (
            res.stderr
        )


def test_a_memory_limit_over_the_device_is_said_to_be_capped():
    res = plan(
        "solve",
        "--model",
        "gpt3-1.3b",
        "--cluster",
        "dgx-a100-80gb",
        "--gpus",
        "8",
        "--global-batch",
        "64",
        "--max-memory-gib",
        "500",
        "--top-k",
        "0",
        "--json",
    )
    assert res.returncode == 0, res.stderr
    assert res.stderr.splitlines() == [
        "note: --max-memory-gib 500 is more than the device's 80 GiB: planned to the whole device"
    ]
    assert (
        plan(
            "solve",
            "--model",
            "gpt3-1.3b",
            "--cluster",
            "dgx-a100-80gb",
            "--gpus",
            "8",
            "--global-batch",
            "64",
            "--max-memory-gib",
            "60",
            "--top-k",
            "0",
            "--json",
        ).stderr
        == ""
    )


def test_a_missing_file_named_like_a_preset_points_to_the_preset():
    res = plan(
        "estimate", "--model", "llama3-8b.yaml", "--cluster", "dgx-h100-80gb", "--gpus", "8", "--global-batch", "8"
    )
    assert res.returncode == 2
    assert res.stderr.strip() == (
        "error: model file llama3-8b.yaml does not exist; there is a model preset named llama3-8b "
        "(give the name, not a file)"
    )
    res = plan(
        "estimate", "--model", "llama3-8b", "--cluster", "no/dgx-h100-80gb.json", "--gpus", "8", "--global-batch", "8"
    )
    assert (
        res.stderr.strip() == "error: cluster file no/dgx-h100-80gb.json does not exist"
    )  # a path elsewhere: no guess


@pytest.mark.parametrize(
    "fix,target,why",
    [
        ("zero=1", "torchtitan", "ZeRO stage 1 (torchtitan has stages 0, 2, 3)"),
        ("schedule=gpipe", "megatron", "schedule gpipe (megatron has 1f1b, interleaved-1f1b)"),
        ("pp=2", "accelerate", "pipeline parallelism pp=2 (accelerate has none)"),
    ],
)
def test_a_fix_the_target_stack_cannot_express_says_what_it_has(fix, target, why):
    res = plan(
        "solve",
        "--model",
        "llama3-8b",
        "--cluster",
        "dgx-h100-80gb",
        "--gpus",
        "16",
        "--global-batch",
        "64",
        "--fix",
        fix,
        "--target",
        target,
    )
    assert res.returncode == 2
    assert res.stderr.strip() == f"error: --fix {fix}: {why}; change or drop the fix, or plan for another --target"


def test_a_spec_with_several_problems_names_them_all_in_one_line(tmp_path):
    spec = tmp_path / "typo.json"
    spec.write_text(
        json.dumps(
            {
                "name": "m",
                "num_layers": 2,
                "hidden_size": 64,
                "num_heads": 4,
                "vocab_size": 128,
                "activaton": "gelu",
                "ffn": 3,
            }
        )
    )
    res = plan("estimate", "--model", str(spec), "--cluster", "dgx-h100-80gb", "--gpus", "8", "--global-batch", "8")
    assert res.returncode == 2
    assert (
        res.stderr.strip()
        == f"error: {spec}:1: field 'activaton': unknown field (also 'ffn' unknown, 'max_seq_len' missing)"
    )
    empty = tmp_path / "empty.json"
    empty.write_text("{}")
    res = plan("estimate", "--model", str(empty), "--cluster", "dgx-h100-80gb", "--gpus", "8", "--global-batch", "8")
    assert res.stderr.strip().endswith(
        "(also 'num_layers' missing, 'hidden_size' missing, 'num_heads' missing, 'vocab_size' missing and 1 more)"
    ), res.stderr


def test_an_entry_of_plan_presets_json_reads_back_as_a_model_spec(tmp_path):
    """`plan presets --json` adds each model's parameter counts; an entry saved as a spec reads
    back as the preset (the counts checked against the spec, not taken as fields), and a count
    that is not the spec's is refused naming it."""
    from planner import api

    res = plan("presets", "--json")
    entries = json.loads(res.stdout)["models"]
    for entry in entries:
        path = tmp_path / f"{entry['name']}.json"
        path.write_text(json.dumps(entry))
        assert api.load_model(str(path)) == api.load_model(entry["name"]), entry["name"]
    bad = {**entries[0], "parameters": entries[0]["parameters"] + 1}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    res = plan("estimate", "--model", str(path), "--cluster", "dgx-h100-80gb", "--gpus", "8", "--global-batch", "8")
    assert res.returncode == 2 and res.stderr.startswith(
        f"error: {path}: parameters {bad['parameters']} is not this spec's ("
    ), res.stderr
    assert "Traceback" not in res.stderr


def test_fixes_that_rule_out_every_stack_are_a_usage_error_and_a_pipeline_free_stack_takes_1f1b(tmp_path):
    base = ["solve", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--gpus", "16", "--global-batch", "256"]
    res = plan(*base, "--fix", "zero=1", "--fix", "schedule=gpipe")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert res.stderr.startswith(
        "error: no stack can run these --fix choices: --fix schedule=gpipe: schedule gpipe (megatron has"
    )
    assert res.stderr.rstrip().endswith("; change or drop them, or plan with --target generic")
    # accelerate has no pipeline: every plan it runs is 1f1b at pp 1, which --fix may name
    out = tmp_path / "a.json"
    res = plan(*base, "--target", "accelerate", "--fix", "schedule=1f1b", "--top-k", "0", "--json", "-o", str(out))
    assert res.returncode == 0 and json.loads(res.stdout)["plan"]["schedule"] == "1f1b", res.stderr
    assert res.stderr.splitlines() == [f"plan written to {out}"]  # -o confirmed with --json too


@pytest.mark.parametrize(
    "args,error",
    [
        # Megatron divides the query groups over TP: qwen3-30b-a3b's 4 KV heads refuse tp 8 (it used to be searched and exported)
        (
            ["--model", "qwen3-30b-a3b", "--gpus", "16", "--seq-len", "4096", "--fix", "tp=8", "--target", "megatron"],
            "error: no layout megatron can run has --fix tp=8: tp=8 over the 4 KV heads of qwen3-30b-a3b (Megatron divides the query "
            "groups over TP, never replicates them), and other reasons; change or drop it, or plan for another --target",
        ),
        (
            ["--model", "mixtral-8x7b", "--gpus", "16", "--fix", "ep=16"],
            "error: --fix ep=16: ep=16 does not divide the 8 experts of mixtral-8x7b; fix another ep or drop the fix",
        ),
        (
            ["--model", "llama3-8b", "--gpus", "16", "--fix", "ep=2"],
            "error: --fix ep=2: llama3-8b has no experts (a dense model); drop the fix",
        ),
        (
            ["--model", "llama3-8b", "--gpus", "3", "--fix", "tp=3"],
            "error: --fix tp=3: tp=3 does not divide the 32 attention heads of llama3-8b; fix another tp or drop the fix",
        ),
        # tp=1 with sequence parallelism clashes by itself: no word of --allow-cross-node-tp
        (
            ["--model", "llama3-8b", "--gpus", "16", "--fix", "sp=true", "--fix", "tp=1"],
            "error: no layout of the search space is valid with --fix sp=true and --fix tp=1 together (llama3-8b on 16 GPUs has layouts "
            "without any one of them); change or drop one",
        ),
    ],
)
def test_a_fix_no_layout_can_honour_names_the_rule(args, error):
    res = plan(
        "solve",
        "--cluster",
        "dgx-a100-80gb",
        "--global-batch",
        "64",
        *(["--seq-len", "2048"] if "--seq-len" not in args else []),
        *args,
    )
    assert res.returncode in (1, 2) and res.stderr.strip() == error, res.stderr


def test_megatron_refuses_to_export_tp_over_fewer_kv_heads(tmp_path):
    """A generic plan of qwen3-30b-a3b at tp 8 (its 4 KV heads replicated, as the generic cost model
    allows): Megatron-Core's attention divides the query groups by tp and asserts on a remainder."""
    out = tmp_path / "p.json"
    res = plan(
        "solve",
        "--model",
        "qwen3-30b-a3b",
        "--cluster",
        "dgx-h100-80gb",
        "--gpus",
        "16",
        "--global-batch",
        "64",
        "--seq-len",
        "4096",
        "--fix",
        "tp=8",
        "--fix",
        "zero=1",
        "--fix",
        "pp=1",
        "--target",
        "generic",
        "-o",
        str(out),
    )
    assert res.returncode == 0, res.stderr
    res = plan("export", str(out), "--to", "megatron")  # pp 1: the KV heads are its one problem
    assert (
        res.returncode == 2
        and "tp=8 over the 4 KV heads of qwen3-30b-a3b (Megatron divides the query groups" in res.stderr
    )


def test_names_from_a_cluster_file_are_printed_as_written_never_as_markup(tmp_path):
    """A cluster or device name with rich markup in it ([link=...] would write an OSC 8 hyperlink
    escape to a colour terminal; [red] would vanish) is printed as text by every command that
    shows it."""
    import os

    doc = json.loads((ROOT / "hardware_profiles/presets/dgx-a100-80gb.json").read_text())
    doc.update(name="[link=http://example.invalid]click[/link]")
    doc["device"]["name"] = "[red]A100"
    path = tmp_path / "c.json"
    path.write_text(json.dumps(doc))
    env = dict(os.environ, FORCE_COLOR="1")
    doc["intra_node"]["name"] = "[link=http://example.invalid]NVL[/link]"
    path.write_text(json.dumps(doc))
    for args in (
        ["estimate", "--model", "llama3-8b", "--cluster", str(path), "--gpus", "8", "--global-batch", "8", "--tp", "8"],
        ["solve", "--model", "llama3-8b", "--cluster", str(path), "--gpus", "8", "--global-batch", "8", "--top-k", "0"],
        ["profile", "--show", str(path)],
        [
            "size",
            "--model",
            "llama3-8b",
            "--clusters",
            str(path),
            "--gpus",
            "8",
            "--tokens",
            "1B",
            "--global-batch",
            "64",
            "--seq-len",
            "2048",
        ],
    ):
        res = plan(*args, env=env)
        assert res.returncode == 0, res.stderr
        assert "\x1b]8;" not in res.stdout, args  # no hyperlink escape
        if args[0] != "size":  # (size names a cluster by what --clusters gave)
            assert "[link=http://example.invalid]click[/link]" in res.stdout and "[red]A100" in res.stdout, args


def test_a_plan_document_at_odds_with_itself_names_its_own_fields(tmp_path):
    """num_gpus edited under a layout: the document's count is named (not 'the cluster has');
    stage_recompute given as lists: the fields a stage takes, not a class name."""
    out = tmp_path / "p.json"
    assert (
        plan(
            "solve",
            "--model",
            "llama3-8b",
            "--cluster",
            "dgx-a100-80gb",
            "--gpus",
            "16",
            "--global-batch",
            "64",
            "--seq-len",
            "2048",
            "--fix",
            "tp=2",
            "--fix",
            "pp=1",
            "-o",
            str(out),
        ).returncode
        == 0
    )
    doc = json.loads(out.read_text())
    bad = tmp_path / "gpus.json"
    bad.write_text(json.dumps({**doc, "num_gpus": 8}))
    res = plan("export", str(bad), "--to", "megatron")
    assert res.returncode == 2 and res.stderr.strip() == (
        f"error: {bad}: num_gpus is 8, but the plan's layout (dp 8 x tp 2 x pp 1) runs on 16; make them agree (re-create the plan "
        "with `plan solve -o`)"
    ), res.stderr
    bad = tmp_path / "stages.json"
    bad.write_text(json.dumps({**doc, "plan": {**doc["plan"], "stage_recompute": [[32, 0, 0]]}}))
    res = plan("show", str(bad))
    assert (
        res.returncode == 2
        and "field 'plan.stage_recompute.0': expected a mapping of fields (none, selective, full), got [32, 0, 0]"
        in res.stderr
    ), res.stderr
    # a preset's name where its spec belongs: the spec's required fields, not all of its 37
    bad = tmp_path / "model.json"
    bad.write_text(json.dumps({**doc, "model": "llama3-8b"}))
    res = plan("show", str(bad))
    assert (
        res.returncode == 2
        and "field 'model': expected a mapping of fields (name, num_layers, hidden_size, num_heads, "
        "vocab_size, max_seq_len and 31 optional), got 'llama3-8b'"
        in res.stderr
    ), res.stderr


@pytest.mark.parametrize(
    "args,start",
    [
        # a mesh order stretching a tp of 2 across nodes: the hint stays (it solves with --allow-cross-node-tp)
        (
            [
                "--model",
                "llama3-8b",
                "--cluster",
                "dgx-a100-80gb",
                "--gpus",
                "16",
                "--seq-len",
                "2048",
                "--fix",
                "tp=2",
                "--fix",
                "pp=1",
                "--fix",
                "mesh_order=dp,tp,pp",
                "--target",
                "generic",
            ],
            "error: no layout of the search space is valid with --fix mesh_order",
        ),
        # deepspeed runs no layout of 6 GPUs at all: not the harmless fix's fault
        (
            [
                "--model",
                "llama3-8b",
                "--cluster",
                "dgx-h100-80gb",
                "--gpus",
                "6",
                "--seq-len",
                "2048",
                "--target",
                "deepspeed",
                "--fix",
                "mbs=1",
            ],
            "error: no layout of the search space is valid for llama3-8b on 6 GPUs",
        ),
        # the reason the nearest layouts share (pp=1 ones fail on sequence parallelism alone), not the first check's
        (
            [
                "--model",
                "qwen3-30b-a3b",
                "--cluster",
                "dgx-h100-80gb",
                "--gpus",
                "16",
                "--seq-len",
                "4096",
                "--target",
                "deepspeed",
                "--fix",
                "tp=2",
            ],
            "error: no layout deepspeed can run has --fix tp=2: sequence parallelism (deepspeed has none); change or drop it",
        ),
        # without --target: every stack's reason, and generic, which runs it
        (
            [
                "--model",
                "qwen3-30b-a3b",
                "--cluster",
                "dgx-h100-80gb",
                "--gpus",
                "16",
                "--seq-len",
                "4096",
                "--fix",
                "tp=8",
            ],
            "error: no stack can run --fix tp=8: megatron: tp=8 over the 4 KV heads",
        ),
        # three stacks refuse the fixes before searching, the fourth runs none of the layouts with them (a tied model's
        # pipeline): every stack's reason, where the one searched stack's was all it said
        (
            [
                "--model",
                "gpt3-1.3b",
                "--cluster",
                "dgx-a100-80gb",
                "--gpus",
                "16",
                "--fix",
                "pp=2",
                "--fix",
                "schedule=gpipe",
            ],
            "error: no stack can run --fix pp=2 and --fix schedule=gpipe: megatron: --fix schedule=gpipe: schedule gpipe (megatron has",
        ),
        # a clash of two fixes that generic refuses too: named both, and no --target generic advice
        (
            [
                "--model",
                "mixtral-8x7b",
                "--cluster",
                "dgx-h100-80gb",
                "--gpus",
                "16",
                "--seq-len",
                "4096",
                "--fix",
                "recompute=full",
                "--fix",
                "recompute_norm_act=true",
                "--target",
                "megatron",
            ],
            "error: --fix recompute_norm_act=true with --fix recompute=full: a fully recomputed layer reruns its whole forward already; "
            "drop one of the fixes",
        ),
    ],
)
def test_a_refused_fix_is_blamed_only_for_what_it_rules_out(args, start):
    res = plan("solve", "--global-batch", "64", *args)
    assert res.returncode in (1, 2) and len(res.stderr.strip().splitlines()) == 1 and res.stderr.startswith(start), (
        res.stderr
    )
    if "--fix mesh_order" in start:
        assert res.stderr.rstrip().endswith("(or --allow-cross-node-tp: tp may not leave a node)")
    if "no stack can run" in start:
        assert "; deepspeed: " in res.stderr and res.stderr.rstrip().endswith("or plan with --target generic")


def test_a_fuzz_of_every_command_found_these_lines_wanting(tmp_path):
    """Each said what the user typed and what to do: the option's own name, not a field's or
    another option's; a hint that works; the cap said beside a miss it changed."""
    doc = tmp_path / "p.json"
    assert (
        plan(
            "solve",
            "--model",
            "llama3-8b",
            "--cluster",
            "dgx-a100-80gb",
            "--gpus",
            "16",
            "--global-batch",
            "64",
            "--seq-len",
            "2048",
            "-o",
            str(doc),
        ).returncode
        == 0
    )
    est = [
        "estimate",
        "--model",
        "llama3-8b",
        "--cluster",
        "dgx-h100-80gb",
        "--gpus",
        "16",
        "--global-batch",
        "64",
        "--seq-len",
        "2048",
    ]
    cases = [
        (
            est + ["--mesh-order", "ep,tp,dp,pp"],
            2,
            "--mesh-order 'ep,tp,dp,pp': give dp, tp and pp in some order, innermost (inside a node) first, e.g. tp,dp,pp",
        ),
        (
            est + ["--micro-batch-size", "3"],
            2,
            "global batch 64 is not divisible by dp x micro_batch_size = 16 x 3 = 48; use --micro-batch-size 2 or a global batch that "
            "is a multiple of 48",
        ),
        (
            ["solve", *est[1:], "--fix", "fp8=true", "--cluster", "dgx-a100-80gb"],
            2,
            "--fix fp8=true: A100-SXM4-80GB has no FP8",
        ),
        (
            ["show", str(doc), "--memory", str(tmp_path / ".svg")],
            2,
            f"give the picture a name before its extension, e.g. {tmp_path / 'memory.svg'}",
        ),
        (
            ["show", str(doc), "--memory", "svg"],
            2,
            "--memory svg: the picture's format comes from the extension; use .svg or .png",
        ),
        (
            ["solve", *est[1:], "--fix", "mesh_order=TP,DP"],
            2,
            "--fix 'mesh_order=TP,DP': not a valid value for mesh_order",
        ),
        (["run", str(doc), "--nnodes", "0"], 2, "--nnodes must be at least 1, got 0"),
        (
            ["profile", "--model", "gpt2-124m", "--micro-batch-sizes", "", "-o", str(tmp_path / "prof.json")],
            2,
            "--micro-batch-sizes must be comma-separated whole numbers",
        ),
        (
            ["profile", "--model-factory", "foo", "-o", str(tmp_path / "prof.json")],
            2,
            "--model-factory must be package.module:function, got 'foo'",
        ),
        (
            [
                "solve",
                "--model",
                "llama3-70b",
                "--cluster",
                "dgx-h100-80gb",
                "--gpus",
                "8",
                "--global-batch",
                "64",
                "--seq-len",
                "4096",
                "--max-memory-gib",
                "1000",
            ],
            1,
            "(--max-memory-gib 1000 is more than the device's 79.6 GiB: planned to the whole device)",
        ),
    ]
    for args, code, needle in cases:
        res = plan(*args)
        assert res.returncode == code and res.stderr.count("\n") == 1 and needle in res.stderr, (args, res.stderr)
    res = plan("estimate", "--plan", str(doc), "--loss-kernel", "fused")  # a job field the plan left to its stack
    assert res.returncode == 0 and f"changed from {doc}: loss_kernel the stack's default -> fused" in res.stderr, (
        res.stderr
    )
    assert not (tmp_path / "prof.json").exists()
