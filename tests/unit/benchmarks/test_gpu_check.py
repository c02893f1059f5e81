"""benchmarks/gpu_check.sh, which cannot run without a GPU: every `plan` command line in it is
one the CLI takes (each option by its name, each literal value by its type, each value-taking
option with a value), it is valid bash, and without nvidia-smi it stops at once with one line."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import click
import pytest

from planner.cli.main import cli

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "gpu_check.sh"
SHELL_OPERATORS = ("|", "||", "&&", ";", ">", ">>", "<", "2>", "2>&1", "&")


def shell_lines(text: str) -> list[str]:
    """The script's logical lines: continuations joined; comment lines and here-documents
    (the model file, the summary's Python) left out."""
    lines: list[str] = []
    pending, heredoc = "", None
    for raw in text.splitlines():
        if heredoc is not None:
            heredoc = None if raw.strip() == heredoc else heredoc
            continue
        if raw.lstrip().startswith("#"):
            continue
        marker = re.search(r"<<-?\s*'?(\w+)'?", raw)
        if marker:
            heredoc = marker.group(1)
        if raw.endswith("\\"):
            pending += raw[:-1] + " "
            continue
        lines.append(pending + raw)
        pending = ""
    return lines


def plan_invocations(text: str) -> list[tuple[str, list[str]]]:
    """(subcommand, its arguments) of every `plan SUBCOMMAND ...` in the script."""
    found = []
    for line in shell_lines(text):
        if not re.search(r"(^|\s)plan\s+\w", line):
            continue
        tokens = shlex.split(line, comments=True)
        for i, token in enumerate(tokens[:-1]):
            if token == "plan" and tokens[i + 1] in cli.commands:
                args = []
                for arg in tokens[i + 2 :]:
                    if arg in SHELL_OPERATORS or arg.startswith((">", "2>")):
                        break
                    args.append(arg)
                found.append((tokens[i + 1], args))
    return found


def problems(name: str, args: list[str]) -> list[str]:
    """What `plan NAME` would refuse in `args`: unknown options, a missing value, a literal value
    its type does not take, or another count of positional arguments. Shell variables ($OUT/...)
    stand for values and are not converted."""
    command = cli.commands[name]
    ctx = click.Context(command)
    options = {opt: p for p in command.params if isinstance(p, click.Option) for opt in p.opts + p.secondary_opts}
    positional = [p for p in command.params if isinstance(p, click.Argument)]
    found, given, i = [], 0, 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("-"):
            given += 1
            i += 1
            continue
        option, has_value, value = arg.partition("=")
        param = options.get(option)
        if param is None:  # and its value, if one follows, is not counted as a positional argument
            found.append(f"plan {name}: no option {option}")
            i += 1 if has_value or i + 1 == len(args) or args[i + 1].startswith("-") else 2
            continue
        if param.is_flag or param.count:
            i += 1
            continue
        if not has_value:
            i += 1
            value = args[i] if i < len(args) else ""
        if not value or value.startswith("--"):
            found.append(f"plan {name} {option}: no value")
        elif "$" not in value:
            try:
                param.type.convert(value, param, ctx)
            except click.BadParameter as exc:
                found.append(f"plan {name} {option} {value}: {exc.message}")
        i += 1
    if given != len(positional):
        found.append(f"plan {name}: {given} positional arguments, the command takes {len(positional)}")
    return found


def test_every_plan_command_in_the_script_is_one_the_cli_takes():
    invocations = plan_invocations(SCRIPT.read_text())
    assert sorted(name for name, _ in invocations) == ["estimate", "profile", "run", "tune"], invocations
    assert [p for name, args in invocations for p in problems(name, args)] == []


def test_the_check_fails_on_a_renamed_option_or_a_wrong_value():
    """The checker itself can fail: an option the command lacks, a choice it does not offer,
    a number that is not one, a value left out, a positional argument too many."""
    assert problems("run", ["$OUT/plan.json", "--step", "6"]) == ["plan run: no option --step"]
    assert problems("run", ["$OUT/plan.json", "--backend", "mpi"])[0].startswith("plan run --backend mpi:")
    assert problems("tune", ["--trials", "six"])[0].startswith("plan tune --trials six:")
    assert problems("tune", ["--journal", "--json"]) == ["plan tune --journal: no value"]
    assert problems("run", ["a.json", "b.json"]) == ["plan run: 2 positional arguments, the command takes 1"]
    assert problems("run", ["$OUT/plan.json", "--steps=6", "--json"]) == []


def test_the_script_is_valid_bash_and_strict():
    text = SCRIPT.read_text()
    assert "set -euo pipefail" in text
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_without_nvidia_smi_it_stops_with_one_line(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    res = subprocess.run(
        [shutil.which("bash"), str(SCRIPT), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env={"PATH": str(empty)},
        timeout=30,
    )
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and "nvidia-smi" in res.stderr and res.stdout == ""
    assert not (tmp_path / "out").exists()
