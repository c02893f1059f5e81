"""What the install hints tell a user works: the distribution is not PyPI's "planner" (another
project), and every `pip install` a message or the README suggests names something that exists:
an extra this project defines, installed from a clone ('.[extra]'), or a package by its own name."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from planner.errors import PlannerError

ROOT = Path(__file__).resolve().parents[1]

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
EXTRAS = set(PROJECT["optional-dependencies"])
# pip install '<target>[<extras>]' or "<target>[<extras>]"
WITH_EXTRAS = re.compile(r"""pip\s+install\s+(?:-e\s+)?['"]([^'"\[\s]+)\[([a-z,]+)\]['"]""")


def _texts() -> dict[str, str]:
    files = [*ROOT.glob("planner/**/*.py"), *ROOT.glob("cost_models/*.py"), *ROOT.glob("hardware_profiles/*.py"),
             ROOT / "README.md", *ROOT.glob("docs/*.md"), ROOT / ".ci" / "run"]
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
