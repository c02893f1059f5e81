"""What the install hints tell a user works: the distribution is not PyPI's "planner" (another
project), and every `pip install` a message or the README suggests names something that exists:
an extra this project defines, installed from a clone ('.[extra]'), or a package by its own name."""

from __future__ import annotations

import re
import sys

import pytest

from planner.errors import PlannerError
from tests.paths import ROOT


if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
EXTRAS = set(PROJECT["optional-dependencies"])
# pip install '<target>[<extras>]' or "<target>[<extras>]"
WITH_EXTRAS = re.compile(r"""pip\s+install\s+(?:-e\s+)?['"]([^'"\[\s]+)\[([a-z,]+)\]['"]""")


def _texts() -> dict[str, str]:
    files = [
        *ROOT.glob("planner/**/*.py"),
        *ROOT.glob("cost_models/*.py"),
        *ROOT.glob("hardware_profiles/*.py"),
        ROOT / "README.md",
        *ROOT.glob("docs/*.md"),
        ROOT / ".ci" / "run",
    ]
    return {str(f.relative_to(ROOT)): f.read_text() for f in files}


def test_the_distribution_is_not_pypis_planner():
    """PyPI's `planner` 0.5.1 is "a real-time best-first planning algorithm": a hint naming it
    installs that. The command and the import package keep their names."""
    assert PROJECT["name"] != "planner"
    assert PROJECT["scripts"]["plan"] == "planner.cli.main:main"


@pytest.mark.parametrize("name,text", list(_texts().items()))
def test_every_install_hint_names_an_extra_that_exists_from_a_clone(name, text):
    for target, extras in WITH_EXTRAS.findall(text):
        assert target in (".", PROJECT["name"]), f"{name}: pip install {target}[{extras}] names another distribution"
        assert target == ".", f"{name}: {PROJECT['name']} is not published on PyPI; install from a clone: '.[{extras}]'"
        assert set(extras.split(",")) <= EXTRAS, f"{name}: extras {extras} not all in pyproject's {sorted(EXTRAS)}"


def test_the_missing_matplotlib_message_says_what_works(monkeypatch):
    import importlib.util

    from planner import draw

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "matplotlib" else real(n, *a))
    with pytest.raises(PlannerError) as e:
        draw.require_matplotlib()
    assert "pip install 'matplotlib" in str(e.value) and "'.[plot]'" in str(e.value)


def test_the_missing_torch_message_gives_the_cpu_build(monkeypatch):
    import importlib.util

    from planner.cli.common import require_torch

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "torch" else real(n, *a))
    with pytest.raises(PlannerError) as e:
        require_torch("run")
    assert "torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in str(e.value)
    assert "planner[" not in str(e.value)


def _readme_commands() -> list[str]:
    """The two commands of the README's quick start, in order."""
    readme = (ROOT / "README.md").read_text()
    start = readme.index("## Quick start")
    quick = readme[start : readme.index("\n## ", start)]
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", quick, re.S)]


def test_ci_runs_the_readmes_test_command_step_by_step():
    """One set of commands: every step of the README's test command is a line of .ci/run (pip's
    -q aside), in the same order, and .ci/run installs nothing the README leaves out but the linters
    and the documentation site's builder."""
    main, tests = _readme_commands()
    assert main.endswith(
        "plan solve --model gpt3-175b --cluster dgx-a100-80gb --gpus 1024 --global-batch 1536 --seq-len 2048"
    )
    steps = [step.strip() for step in tests.split("&&")]
    assert steps[:2] == ["python3 -m venv .venv", ". .venv/bin/activate"] and steps[-1] == "python -m pytest -q"
    ci = [
        line.replace(" -q ", " ").strip()
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    where = [ci.index(step) for step in steps[2:]]  # each step is a line of .ci/run ...
    assert where == sorted(where)  # ... in the README's order
    installs = [line for line in ci if " install " in line and "--upgrade pip" not in line]
    assert [line for line in installs if line not in steps] == [
        "pip install -e '.[lint]' -c .ci/constraints.txt",
        "pip install -e '.[docs]' -c .ci/constraints.txt",
    ]
