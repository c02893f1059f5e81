"""Inputs people type every day: a Hugging Face model directory or hub id, an 80-column
terminal, alternatives that differ only in what the one-line summary leaves out, a partial
preset name. Bad input ends in one line on stderr and exit 2."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner
from rich.console import Console

from planner.cli import render
from planner.cli.main import cli
from planner.errors import UsageError
from planner.presets import load_model
from planner.specs import SolveDocument, StageRecompute

LLAMA_HF = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": 4,
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "intermediate_size": 512,
    "vocab_size": 1000,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "bfloat16",
}
EST = ["estimate", "--cluster", "dgx-a100-80gb", "--gpus", "8", "--global-batch", "8", "--seq-len", "512"]
REV_A, REV_B = "a" * 40, "b" * 40


def _snapshot(cache, repo_id: str, revision: str, config: dict | None, main: bool = False):
    """One revision of a repository laid out as huggingface_hub writes it: the file in blobs/,
    a symlink to it in snapshots/REV/, and refs/main naming REV when `main`."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / revision
    snap.mkdir(parents=True, exist_ok=True)
    if config is not None:
        data = json.dumps(config).encode()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(exist_ok=True)
        blob.write_bytes(data)
        (snap / "config.json").symlink_to(os.path.relpath(blob, snap))
    if main:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(revision)
    return snap


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """An empty cache in $HF_HUB_CACHE, and the working directory elsewhere."""
    cache = tmp_path / "hub"
    cache.mkdir()
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return cache


def _error(args: list[str]) -> str:
    """Run the CLI; it must fail with exit 2 and exactly one 'error:' line on stderr."""
    r = CliRunner().invoke(cli, args)
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:"), (r.exit_code, r.stderr, r.exception)
    return lines[0]


# ----- 1. Hugging Face model directories and hub ids


def test_a_model_directory_reads_its_config_json(tmp_path):
    d = tmp_path / "Tiny-Llama"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(LLAMA_HF))
    m = load_model(str(d))
    assert (m.name, m.num_layers) == ("Tiny-Llama", 4)
    assert load_model(str(d) + "/") == m
    sub = d / "sub"
    sub.mkdir()
    assert load_model(str(sub / "..")).name == "Tiny-Llama"


def test_a_directory_without_config_json_is_one_line(hub):
    (hub.parent / "work" / "weights").mkdir()
    assert "weights is a directory without a config.json" in _error(EST + ["--model", "weights"])


def test_a_hub_id_is_read_from_the_cache_at_refs_main(hub):
    # refs/main names the older snapshot: it wins over the newer one, and the source says which.
    _snapshot(hub, "meta-llama/Tiny", REV_A, {**LLAMA_HF, "num_hidden_layers": 6}, main=True)
    newer = _snapshot(hub, "meta-llama/Tiny", REV_B, {**LLAMA_HF, "num_hidden_layers": 8})
    os.utime(newer, (2e9, 2e9))
    m = load_model("meta-llama/Tiny")
    assert (m.name, m.num_layers) == ("meta-llama/Tiny", 6)
    assert f"revision {REV_A} (refs/main)" in m.source and "Hugging Face config.json (llama style)" in m.source
    snapshot_config = hub / "models--meta-llama--Tiny" / "snapshots" / REV_A / "config.json"
    assert (
        load_model(str(snapshot_config)).name == "meta-llama/Tiny"
    )  # a symlink into blobs/, named after its repository
    r = CliRunner().invoke(cli, EST + ["--model", "meta-llama/Tiny"])
    assert r.exit_code == 0 and f"revision {REV_A} (refs/main)" in r.output


def test_without_refs_main_the_newest_snapshot_is_taken_and_named(hub):
    old = _snapshot(hub, "org/Tiny", REV_A, {**LLAMA_HF, "num_hidden_layers": 6})
    new = _snapshot(hub, "org/Tiny", REV_B, {**LLAMA_HF, "num_hidden_layers": 8})
    os.utime(old, (2e9, 2e9))
    os.utime(new, (1e9, 1e9))
    m = load_model("org/Tiny")
    assert m.num_layers == 6 and f"revision {REV_A} (the newest of 2 snapshots, there is no refs/main)" in m.source
    (hub / "models--org--Tiny" / "snapshots" / REV_B).rename(hub / "elsewhere")
    assert "(the only snapshot)" in load_model("org/Tiny").source


@pytest.mark.parametrize(
    "env, where",
    [
        ({"HF_HUB_CACHE": "{tmp}/a"}, "a"),
        ({"HF_HOME": "{tmp}/b"}, "b/hub"),
        ({"XDG_CACHE_HOME": "{tmp}/c"}, "c/huggingface/hub"),
        ({"HOME": "{tmp}/d"}, "d/.cache/huggingface/hub"),
    ],
)
def test_the_cache_is_found_where_huggingface_hub_puts_it(tmp_path, monkeypatch, env, where):
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value.format(tmp=tmp_path))
    monkeypatch.chdir(tmp_path)
    _snapshot(tmp_path / where, "org/Tiny", REV_A, LLAMA_HF, main=True)
    assert load_model("org/Tiny").num_layers == 4


def test_a_hub_id_not_in_the_cache_says_where_it_looked_and_how_to_fetch(hub):
    line = _error(EST + ["--model", "meta-llama/Llama-3.1-8B"])
    assert f"looked in {hub}" in line
    assert "huggingface-cli download meta-llama/Llama-3.1-8B config.json" in line and "path of its config.json" in line


def test_a_cached_repository_without_config_json_says_how_to_fetch(hub):
    _snapshot(hub, "org/Weights", REV_A, None, main=True)
    assert "huggingface-cli download org/Weights config.json" in _error(EST + ["--model", "org/Weights"])


def test_a_bare_name_finds_the_one_cached_repository_and_refuses_two(hub):
    _snapshot(hub, "org-a/Tiny", REV_A, LLAMA_HF, main=True)
    assert load_model("Tiny").name == "org-a/Tiny"
    assert load_model("org-a/tiny").name == "org-a/Tiny"  # hub ids are case-insensitive
    _snapshot(hub, "org-b/Tiny", REV_A, LLAMA_HF, main=True)
    line = _error(EST + ["--model", "Tiny"])
    assert "Tiny is ambiguous" in line and "org-a/Tiny, org-b/Tiny" in line


def test_a_preset_and_an_existing_path_win_over_the_cache(hub):
    _snapshot(hub, "llama3-8b", REV_A, LLAMA_HF, main=True)  # an org-less hub id spelled like a preset
    assert load_model("llama3-8b").num_layers == 32
    _snapshot(hub, "org/Tiny", REV_A, LLAMA_HF, main=True)
    local = hub.parent / "work" / "org" / "Tiny"
    local.mkdir(parents=True)
    (local / "config.json").write_text(json.dumps({**LLAMA_HF, "num_hidden_layers": 2}))
    assert load_model("org/Tiny").num_layers == 2


def test_a_cached_config_gets_the_same_checks_as_a_file(hub):
    _snapshot(
        hub,
        "org/Mixtral",
        REV_A,
        {**LLAMA_HF, "model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2},
        main=True,
    )
    mixtral = load_model("org/Mixtral")  # planned as a mixture of experts, as the same config.json in a file is
    assert (mixtral.num_experts, mixtral.experts_per_token) == (8, 2) and "mixtral style" in mixtral.source
    _snapshot(hub, "org/Bad", REV_A, LLAMA_HF)
    (hub / "models--org--Bad" / "refs").mkdir()
    (hub / "models--org--Bad" / "refs" / "main").write_text("../../../../etc")  # never followed as a path
    assert "is not a commit hash" in _error(EST + ["--model", "org/Bad"])
    _snapshot(hub, "org/Broken", REV_A, {}, main=True)
    (hub / "models--org--Broken" / "snapshots" / REV_A / "config.json").unlink()
    (hub / "models--org--Broken" / "snapshots" / REV_A / "config.json").write_text('{"num_hidden_layers": 4,')
    assert "malformed JSON" in _error(EST + ["--model", "org/Broken"])


def test_odd_model_names_stay_one_line(hub):
    with pytest.raises(UsageError, match="unknown model preset"):
        load_model("x" * 5000)  # too long for the file system: not a path, not a hub id
    assert "did you mean llama2-70b, llama3-70b?" in _error(EST + ["--model", "70b"])


# ----- 2. An 80-column terminal


def _plan_at_80_columns(args: list[str]) -> str:
    """The installed CLI in a subprocess, as a terminal of 80 columns runs it."""
    env = {**os.environ, "COLUMNS": "80"}
    r = subprocess.run(
        [sys.executable, "-m", "planner.cli.main", *args], capture_output=True, text=True, env=env, timeout=300
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    "args",
    [
        [
            "solve",
            "--model",
            "llama3-70b",
            "--cluster",
            "dgx-a100-80gb",
            "--gpus",
            "64",
            "--global-batch",
            "512",
            "--seq-len",
            "4096",
        ],
        [
            "estimate",
            "--model",
            "llama3-70b",
            "--cluster",
            "dgx-h100-80gb",
            "--gpus",
            "64",
            "--global-batch",
            "512",
            "--seq-len",
            "4096",
            "--tp",
            "8",
            "--pp",
            "4",
            "--vpp",
            "5",
            "--recompute",
            "selective",
        ],
        ["presets"],
    ],
    ids=["solve", "estimate", "presets"],
)
def test_80_columns_keep_names_whole_and_cut_nothing(args):
    out = _plan_at_80_columns(args)
    names = [args[i + 1] for i, a in enumerate(args) if a in ("--model", "--cluster")] or [
        "gpt-neox-20b",
        "llama3-405b",
        "dgx-a100-80gb",
        "dgx-h100-80gb",
        "H100-SXM5-80GB",
    ]
    for name in names:
        assert name in out
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "…" not in out  # rich's mark of a cut cell


# ----- 3. Alternatives that differ only in mesh order, layer split or recompute per stage


def _render(doc: SolveDocument, monkeypatch) -> str:
    monkeypatch.setattr(render, "console", Console(record=True, width=400, highlight=False, file=io.StringIO()))
    render.solve_report(doc, 76.0)
    return render.console.export_text()


def _layout_cells(text: str) -> list[str]:
    """The layout column of the Alternatives table (one line per row at this width)."""
    table = text[text.index("Alternatives") :].splitlines()
    rows = [line.split("│") for line in table if line.startswith("│") and line.split("│")[1].strip().isdigit()]
    return [row[2].strip() for row in rows]


@pytest.fixture(scope="module")
def mesh_twins() -> SolveDocument:
    """A real solve whose one alternative differs from the recommended plan only in mesh order."""
    args = [
        "solve",
        "--model",
        "gpt3-1.3b",
        "--cluster",
        "dgx-a100-80gb",
        "--gpus",
        "16",
        "--global-batch",
        "64",
        "--top-k",
        "3",
        "--target",
        "generic",
        "--json",
        *[x for fix in ("tp=2", "pp=2", "mbs=1", "zero=1", "vpp=1", "sp=true", "dp_shard=4") for x in ("--fix", fix)],
    ]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    return SolveDocument.model_validate_json(r.stdout)


def test_a_real_solve_names_the_mesh_order_that_tells_twins_apart(mesh_twins, monkeypatch):
    best, alt = mesh_twins.plan, mesh_twins.alternatives[0].plan
    assert render.plan_summary(best) == render.plan_summary(alt) and best.mesh_order != alt.mesh_order
    text = _render(mesh_twins, monkeypatch)
    assert "sp mesh=tp,dp,pp; global batch" in text  # the recommended line
    assert _layout_cells(text)[0].endswith("sp mesh=tp,pp,dp")


def test_alternatives_differing_in_split_or_recompute_render_distinct_rows(mesh_twins, monkeypatch):
    base = mesh_twins.alternatives[0]
    twins = [
        base,
        base.model_copy(update={"plan": base.plan.model_copy(update={"layers_per_stage": [12, 12]})}),
        base.model_copy(
            update={
                "plan": base.plan.model_copy(
                    update={
                        "layers_per_stage": [12, 12],
                        "stage_recompute": [StageRecompute(none=10, full=2), StageRecompute(none=12)],
                    }
                )
            }
        ),
        base.model_copy(
            update={
                "plan": base.plan.model_copy(
                    update={
                        "layers_per_stage": [12, 12],
                        "stage_recompute": [StageRecompute(none=12), StageRecompute(none=10, full=2)],
                    }
                )
            }
        ),
    ]
    doc = mesh_twins.model_copy(update={"alternatives": twins})
    cells = _layout_cells(_render(doc, monkeypatch))
    assert len(cells) == 4 and len(set(cells)) == 4, cells
    assert "split=13,11" in cells[0] and "split=12,12" in cells[1]
    assert "recompute per stage=10/0/2 12/0/0" in cells[2] and "recompute per stage=12/0/0 10/0/2" in cells[3]
    assert not any("recompute per stage" in c for c in cells[:2])  # one mode for every layer: the summary says it


def test_alternatives_that_differ_visibly_get_no_details(monkeypatch):
    r = CliRunner().invoke(
        cli,
        [
            "solve",
            "--model",
            "gpt3-1.3b",
            "--cluster",
            "dgx-a100-80gb",
            "--gpus",
            "16",
            "--global-batch",
            "64",
            "--target",
            "generic",
            "--json",
        ],
    )  # one stack: without --target two stacks may share a layout
    doc = SolveDocument.model_validate_json(r.stdout)
    summaries = [render.plan_summary(p) for p in [doc.plan] + [a.plan for a in doc.alternatives]]
    assert len(set(summaries)) == len(summaries)
    text = _render(doc, monkeypatch)
    assert "mesh=" not in text and "split=" not in text


# ----- 4. A partial preset name


def test_a_partial_cluster_name_suggests_the_preset():
    line = _error(["solve", "--model", "gpt2-124m", "--cluster", "h100", "--gpus", "8", "--global-batch", "8"])
    assert "did you mean dgx-h100-80gb?" in line
