"""`plan export` and `plan solve --target` together: every plan a targeted search returns
exports cleanly; the unconstrained optimum (`--target generic`) a stack cannot express is
refused in one line naming the feature, and the targeted search finds the best plan the stack
can run (slower); a plan costed for another stack exports with a one-line note; a model a stack
cannot build leaves that stack's search empty, the reason in `plan solve`'s table."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from planner.stacks import EXPORT_STACKS as STACKS, rules, rules_table
from tests.paths import ROOT

pytestmark = pytest.mark.slow  # CONTRIBUTING.md: the quick tier leaves it out


def plan_cli(*args, check=True, env_columns=None):
    env = {**os.environ, "COLUMNS": str(env_columns)} if env_columns else None
    return subprocess.run(
        [sys.executable, "-m", "planner.cli.main", *args], capture_output=True, text=True, check=check, env=env
    )


SOLVES = {
    "llama3-8b-16-h100": [
        "--model",
        "llama3-8b",
        "--cluster",
        "dgx-h100-80gb",
        "--gpus",
        "16",
        "--global-batch",
        "64",
        "--seq-len",
        "4096",
    ],
    "llama3-70b-64-h100": [
        "--model",
        "llama3-70b",
        "--cluster",
        "dgx-h100-80gb",
        "--gpus",
        "64",
        "--global-batch",
        "256",
        "--seq-len",
        "4096",
    ],
}


@pytest.fixture(scope="module")
def solved(tmp_path_factory):
    out = {}
    d = tmp_path_factory.mktemp("targets")
    for name, args in SOLVES.items():
        for stack in ("generic", *STACKS):  # generic: the unconstrained optimum (no --target searches the stacks)
            path = d / f"{name}-{stack}.json"
            plan_cli("solve", *args, "--target", stack, "--top-k", "2", "-o", str(path))
            out[name, stack] = path
    return out


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("case", list(SOLVES))
def test_every_plan_a_targeted_search_returns_exports(solved, case, stack):
    path = solved[case, stack]
    doc = json.loads(path.read_text())
    for k in range(len(doc["alternatives"]) + 1):
        extra = ["--alternative", str(k)] if k else []
        res = plan_cli("export", str(path), "--to", stack, "--json", *extra, check=False)
        assert res.returncode == 0, res.stderr
        out = json.loads(res.stdout)
        assert out["stack"] == stack and out["text"]


def test_free_optimum_refused_and_targeted_one_slower(solved):
    """Llama 3 70B on 64 H100: the unconstrained optimum uses what DeepSpeed lacks; the export
    says so in one line (exit 2) and `--target deepspeed` finds a slower plan DeepSpeed can run."""
    free, targeted = solved["llama3-70b-64-h100", "generic"], solved["llama3-70b-64-h100", "deepspeed"]
    assert json.loads(free.read_text())["job"]["target"] == "generic"
    res = plan_cli("export", str(free), "--to", "deepspeed", check=False)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
    assert "deepspeed cannot run this plan" in res.stderr and "--target deepspeed" in res.stderr

    def fastest(path):
        doc = json.loads(path.read_text())
        return min([doc["estimate"]["step_time_s"]] + [a["estimate"]["step_time_s"] for a in doc["alternatives"]])

    # the same kernels (deepspeed's are generic PyTorch's): the targeted space is a subset
    assert fastest(targeted) > fastest(free)


def test_a_refusal_points_to_the_stacks_own_alternative(tmp_path):
    """A search of every stack (no --target) keeps each stack's best plan among the
    alternatives; exporting the recommendation to a stack that cannot run it names that one."""
    path = tmp_path / "all.json"
    plan_cli("solve", *SOLVES["llama3-70b-64-h100"], "-o", str(path))
    own = {e["target"]: e["alternative"] for e in json.loads(path.read_text())["stacks"]}
    refused = 0
    for stack in STACKS:
        res = plan_cli("export", str(path), "--to", stack, check=False)
        if res.returncode == 0:
            continue  # the recommendation is this stack's
        refused += 1
        k = own[stack]  # the plan `plan solve --target STACK` would recommend (the document's `stacks`)
        assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert res.stderr.rstrip().endswith(
            f"holds for {stack}, alternative {k}: `plan export {path} --to {stack} --alternative {k}`"
        ), res.stderr
        assert plan_cli("export", str(path), "--to", stack, "--alternative", str(k), check=False).returncode == 0
    assert refused >= 2  # megatron's plan is the recommendation here: the others refuse it


def test_export_writes_the_text_atomically(solved, tmp_path):
    out = tmp_path / "args.txt"
    res = plan_cli("export", str(solved["llama3-8b-16-h100", "megatron"]), "--to", "megatron", "-o", str(out))
    assert res.stdout == "" and out.read_text().startswith("--tensor-model-parallel-size")
    bad = plan_cli("export", str(solved["llama3-8b-16-h100", "megatron"]), "--to", "nemo", check=False)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_the_export_page_carries_the_rules_table():
    """The export page's table of what each stack expresses is generated from the Rules."""
    assert rules_table() in (ROOT / "docs" / "export.md").read_text()
    for stack in STACKS:
        assert rules(stack).stack == stack


def test_a_plan_costed_for_another_stack_exports_with_a_note(solved, tmp_path):
    """One line on stderr, exit 0: the stack the document costed the plan for (job.target, or
    the alternative's), the exporting stack's own prediction (what `plan estimate --plan P
    --target STACK` says) and that command; none for the stack it was costed for."""
    generic = tmp_path / "generic.json"  # plan estimate's default target is generic
    plan_cli(
        "estimate",
        "--model",
        "llama3-8b",
        "--cluster",
        "dgx-h100-80gb",
        "--gpus",
        "8",
        "--global-batch",
        "32",
        "--seq-len",
        "4096",
        "--tp",
        "2",
        "--sequence-parallel",
        "--zero",
        "1",
        "-o",
        str(generic),
    )
    res = plan_cli("export", str(generic), "--to", "megatron")
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 0 and len(lines) == 1 and res.stdout.startswith("--tensor-model-parallel-size")
    assert lines[0].startswith("note: this plan was costed for generic; megatron runs it with its own kernels: ")
    assert lines[0].endswith(f"(re-estimate with `plan estimate --plan {generic} --target megatron`)")
    again = json.loads(plan_cli("estimate", "--plan", str(generic), "--target", "megatron", "--json").stdout)
    assert f"{again['estimate']['step_time_s']:.3f} s a step predicted" in lines[0]
    titan = (
        tmp_path / "torchtitan.json"
    )  # accelerate: torchtitan's constants, a Hugging Face model's kernels (planner/stacks)
    plan_cli(
        "estimate",
        "--model",
        "llama3-8b",
        "--cluster",
        "dgx-h100-80gb",
        "--gpus",
        "8",
        "--global-batch",
        "32",
        "--seq-len",
        "4096",
        "--zero",
        "3",
        "--target",
        "torchtitan",
        "-o",
        str(titan),
    )
    other = plan_cli("export", str(titan), "--to", "accelerate").stderr
    again = json.loads(plan_cli("estimate", "--plan", str(titan), "--target", "accelerate", "--json").stdout)
    assert other.startswith(
        "note: this plan was costed for torchtitan; accelerate runs it with its own kernels: "
        f"{again['estimate']['step_time_s']:.3f} s a step predicted"
    ), other
    own = plan_cli("export", str(solved["llama3-8b-16-h100", "megatron"]), "--to", "megatron")
    assert own.returncode == 0 and own.stderr == ""
    doc = json.loads(solved["llama3-8b-16-h100", "megatron"].read_text())
    doc["alternatives"][0]["target"] = "torchtitan"  # as a search of every stack writes an alternative of another stack
    mixed = tmp_path / "mixed.json"
    mixed.write_text(json.dumps(doc))
    res = plan_cli("export", str(mixed), "--to", "megatron", "--alternative", "1", check=False)
    assert (
        res.stderr.startswith("note: this plan was costed for torchtitan; megatron")
        and "--alternative 1 --target megatron" in res.stderr
    )


GEMMA_2 = [
    "--model",
    str(ROOT / "tests" / "data" / "hf_configs" / "gemma-2-9b.json"),
    "--cluster",
    "dgx-h100-80gb",
    "--gpus",
    "64",
    "--global-batch",
    "256",
    "--seq-len",
    "4096",
]


def test_a_model_a_stack_cannot_build_leaves_its_search_empty(tmp_path):
    """Gemma 2 (GeGLU, four norms, windows on half the layers, soft-capped logits): neither
    Megatron nor torchtitan builds it; `plan solve` recommends a stack that does and names the
    field in the table; `--target megatron` and `plan export --to megatron` refuse in one line."""
    path = tmp_path / "gemma.json"
    res = plan_cli("solve", *GEMMA_2, "-o", str(path), env_columns=200)
    assert res.returncode == 0, res.stderr
    doc = json.loads(path.read_text())
    assert doc["job"]["target"] in ("deepspeed", "accelerate")
    reasons = {s["target"]: s["reason"] for s in doc["stacks"]}
    assert reasons["megatron"].startswith("megatron cannot build gemma-2-9b: activation geglu")
    assert "also norms_per_layer 4, logit_softcapping, sliding_window on 21 of 42 layers" in reasons["megatron"]
    assert reasons["torchtitan"].startswith("torchtitan cannot build gemma-2-9b: activation geglu")
    assert "none: megatron cannot build gemma-2-9b" in res.stdout and "none: torchtitan cannot build" in res.stdout
    for args in (["solve", *GEMMA_2, "--target", "megatron"], ["export", str(path), "--to", "megatron"]):
        refused = plan_cli(*args, check=False)
        assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        assert (
            "megatron cannot build gemma-2-9b: activation geglu" in refused.stderr and "Traceback" not in refused.stderr
        )


def test_no_pointer_where_the_file_holds_no_runnable_plan_for_the_stack(tmp_path):
    """Only the stack's refusal gets the pointer, and only to an alternative that reads as a
    plan: another error (an unreadable version) or a broken alternative keeps the plain line."""
    path = tmp_path / "all.json"
    plan_cli("solve", *SOLVES["llama3-70b-64-h100"], "-o", str(path))
    doc = json.loads(path.read_text())
    k = next(e["alternative"] for e in doc["stacks"] if e["target"] == "deepspeed")
    broken = tmp_path / "broken.json"
    doc["alternatives"][k - 1]["plan"] = None
    broken.write_text(json.dumps(doc))
    res = plan_cli("export", str(broken), "--to", "deepspeed", check=False)
    assert res.returncode == 2 and "deepspeed cannot run this plan" in res.stderr and "--alternative" not in res.stderr
    old = tmp_path / "old.json"
    old.write_text(json.dumps({**json.loads(path.read_text()), "schema_version": "0.9"}))
    res = plan_cli("export", str(old), "--to", "deepspeed", check=False)
    assert res.returncode == 2 and "not readable" in res.stderr and "--alternative" not in res.stderr
