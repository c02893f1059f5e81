"""The README's quick tour runs as written: each command of its block, in order, in one
directory, exits 0 (the pictures need the plot extra)."""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys

import pytest

from tests.paths import ROOT


def tour() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## A quick tour\n\n```bash\n(.*?)```", text, re.S)
    assert block, "the README has no quick-tour block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_the_readme_is_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300


@pytest.mark.slow
def test_the_quick_tour_runs(tmp_path):
    if importlib.util.find_spec("matplotlib") is None:
        pytest.skip("plan show's pictures need the plot extra: pip install '.[plot]'")
    commands = tour()
    assert [shlex.split(c)[:2] for c in commands] == [
        ["plan", "solve"],
        ["plan", "show"],
        ["plan", "export"],
        ["plan", "estimate"],
        ["plan", "size"],
    ]
    for command in commands:
        argv = shlex.split(command)
        res = subprocess.run(
            [sys.executable, "-m", "planner.cli.main", *argv[1:]],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert res.returncode == 0, (command, res.stderr)
    assert (tmp_path / "plan.json").exists() and (tmp_path / "t.png").exists()


def test_the_python_api_example_runs(capsys):
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## Python API\n\n```python\n(.*?)```", text, re.S)
    assert block, "the README has no Python API block"
    exec(compile(block.group(1), "README.md Python API", "exec"), {})
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[0] in ("megatron", "deepspeed", "torchtitan", "accelerate")
