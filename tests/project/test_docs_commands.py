"""Every `plan` command the docs and the README quote with its options is one `plan` takes: each
is parsed by the command line itself (an option renamed, a value out of its choices or range
fails here), and each `plan estimate` and `plan solve` of shipped presets is run. The README's tour runs whole
in tests/project/test_readme.py; the commands that need torch or a cluster (run, profile, tune)
are run by the tests of their own pages' features."""

from __future__ import annotations

import re
import shlex

import click
import pytest
from click.testing import CliRunner

from planner.cli.main import cli
from tests.paths import ROOT

# a command given whole names its inputs: a model, or a plan, profile or journal file (a mention
# of an option in prose, `plan solve -o`, does not)
COMPLETE = re.compile(r"--model \S|\S\.jsonl?\b")
PLACEHOLDER = re.compile(r"\.\.\.|\||\[|\(|\b[A-Z]{2,}\b|PLAN\.json|\b(?:FILE|N|K|M|C|B)\b")


def quoted_commands() -> list[tuple[str, list[str]]]:
    """(page, argv) of every complete `plan SUBCOMMAND --option ...` in a code block or in
    backticks, `&&`-chains split; synopses with placeholders (NAME, ..., [--x]) and mentions of
    an option in prose left out."""
    found = []
    for path in sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]:
        text = path.read_text()
        lines = []
        for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
            lines += re.sub(r"\\\n\s*", " ", block).splitlines()
        prose = re.sub(r"```.*?```", "", text, flags=re.S).replace("\n", " ")
        lines += re.findall(r"`(plan [^`]+)`", prose)
        for line in lines:
            for part in line.strip().removeprefix("$ ").split("&&"):
                part = re.split(r"\s\d?>", part.strip())[0]  # a shell redirection is the shell's
                if not part.startswith("plan ") or PLACEHOLDER.search(part) or not COMPLETE.search(part):
                    continue
                argv = shlex.split(part, comments=True)
                if len(argv) < 3 or argv[1] not in cli.commands:
                    continue
                found.append((path.name, argv[1:]))
    return found


COMMANDS = quoted_commands()


def test_the_docs_quote_commands_of_every_kind():
    assert len(COMMANDS) >= 25
    assert {argv[0] for _, argv in COMMANDS} >= {
        "estimate",
        "solve",
        "show",
        "export",
        "size",
        "run",
        "profile",
        "tune",
    }


@pytest.mark.parametrize("page,argv", COMMANDS, ids=[f"{p}:{' '.join(a)[:60]}" for p, a in COMMANDS])
def test_each_quoted_command_parses(page, argv):
    command = cli.commands[argv[0]]
    with click.Context(cli, info_name="plan") as parent:
        try:
            command.make_context(argv[0], argv[1:], parent=parent)
        except click.ClickException as exc:
            pytest.fail(f"{page}: `plan {' '.join(argv)}`: {exc.format_message()}")


def _of_presets(argv: list[str]) -> bool:
    """A command whose model and cluster are shipped presets (not a file the page made)."""
    named = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("--model", "--cluster")]
    return bool(named) and not any(n.endswith((".json", ".yaml")) for n in named)


RUNNABLE = [(p, a) for p, a in COMMANDS if a[0] in ("estimate", "solve") and "--plan" not in a and _of_presets(a)]


@pytest.mark.slow
@pytest.mark.parametrize("page,argv", RUNNABLE, ids=[f"{p}:{' '.join(a)[:60]}" for p, a in RUNNABLE])
def test_each_quoted_estimate_and_solve_runs(page, argv, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where its -o writes
    result = CliRunner().invoke(cli, [*argv, "--json"])
    assert result.exit_code in (0, 1), f"{page}: `plan {' '.join(argv)}`: {result.output[-500:]}"  # 1: over memory
    assert '"estimate"' in result.output, f"{page}: `plan {' '.join(argv)}`: {result.output[-500:]}"


def test_the_docs_name_no_commit():
    """Measurements say what they measured, not which commit: a revision is named by what it
    changed (a hash means nothing to a reader of the site, and a rebase breaks it)."""
    hexes = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
    for path in sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md", ROOT / "CONTRIBUTING.md"]:
        assert not hexes.findall(path.read_text()), path.name
