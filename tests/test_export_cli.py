"""`plan export` and `plan solve --target` together: every plan a targeted search returns
exports cleanly; a free optimum a stack cannot express is refused in one line naming the
feature, and the targeted search finds the best plan the stack can run (slower)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from planner.export import STACKS, rules, rules_table
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def plan_cli(*args, check=True):
    return subprocess.run([sys.executable, "-m", "planner.cli.main", *args], capture_output=True, text=True, check=check)


SOLVES = {
    "llama3-8b-16-h100": ["--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--gpus", "16", "--global-batch", "64", "--seq-len", "4096"],
    "llama3-70b-64-h100": ["--model", "llama3-70b", "--cluster", "dgx-h100-80gb", "--gpus", "64", "--global-batch", "256", "--seq-len", "4096"],
}


@pytest.fixture(scope="module")
def solved(tmp_path_factory):
    out = {}
    d = tmp_path_factory.mktemp("targets")
    for name, args in SOLVES.items():
        for stack in (None, *STACKS):
            path = d / f"{name}-{stack or 'free'}.json"
            plan_cli("solve", *args, *(["--target", stack] if stack else []), "--top-k", "2", "-o", str(path))
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
    """Llama 3 70B on 64 H100: the free optimum uses what DeepSpeed lacks; the export says so
    in one line (exit 2) and `--target deepspeed` finds a slower plan DeepSpeed can run."""
    free, targeted = solved["llama3-70b-64-h100", None], solved["llama3-70b-64-h100", "deepspeed"]
    res = plan_cli("export", str(free), "--to", "deepspeed", check=False)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
    assert "deepspeed cannot run this plan" in res.stderr and "--target deepspeed" in res.stderr
    def fastest(path):
        doc = json.loads(path.read_text())
        return min([doc["estimate"]["step_time_s"]] + [a["estimate"]["step_time_s"] for a in doc["alternatives"]])

    # the same kernels (deepspeed's are generic PyTorch's): the targeted space is a subset
    assert fastest(targeted) > fastest(free)


def test_export_writes_the_text_atomically(solved, tmp_path):
    out = tmp_path / "args.txt"
    res = plan_cli("export", str(solved["llama3-8b-16-h100", "megatron"]), "--to", "megatron", "-o", str(out))
    assert res.stdout == "" and out.read_text().startswith("--tensor-model-parallel-size")
    bad = plan_cli("export", str(solved["llama3-8b-16-h100", "megatron"]), "--to", "nemo", check=False)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_readme_carries_the_rules_table():
    """The README's table of what each stack expresses is generated from the Rules."""
    assert rules_table() in (ROOT / "README.md").read_text()
    for stack in STACKS:
        assert rules(stack).stack == stack
