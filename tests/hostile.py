"""What every hostile input must get, whichever test file generates it (tests/fuzz/test_bad_inputs.py's
corpus and the generated classes of tests/fuzz/test_hostile_*.py): exit 1 or 2 as stated, exactly one
line on stderr starting with "error:", no traceback, no file in the directory created or changed,
done within the time allowed."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

from click.testing import CliRunner

from planner.cli.main import cli

TIME_ALLOWED_S = 10.0  # per input (issue 19); a --time-limit adds itself plus 1 s


def snapshot(d: Path) -> dict:
    """Every path under `d` with the hash of its bytes (links by their target, never followed)."""
    out = {}
    for p in sorted(d.rglob("*")):
        if p.is_symlink():
            out[str(p.relative_to(d))] = "-> " + os.readlink(p)
        elif p.is_file():
            out[str(p.relative_to(d))] = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            out[str(p.relative_to(d))] = "other"
    return out


def assert_refused(
    directory: Path,
    args: list[str],
    code: int | tuple[int, ...] = (1, 2),
    name: str = "",
    seconds: float = TIME_ALLOWED_S,
) -> str:
    """Run `plan ARGS` in-process from `directory`; check the promise; return the error line."""
    codes = (code,) if isinstance(code, int) else code
    before = snapshot(directory)
    cwd = os.getcwd()
    os.chdir(directory)
    try:
        start = time.monotonic()
        r = CliRunner().invoke(cli, args)
        took = time.monotonic() - start
    finally:
        os.chdir(cwd)
    err = r.stderr.strip().splitlines()
    assert r.exit_code in codes, (name, args, r.exit_code, r.output, r.exception)
    assert not isinstance(r.exception, Exception) or isinstance(r.exception, SystemExit), (name, repr(r.exception))
    assert len(err) == 1 and err[0].startswith("error: "), (name, args, r.stderr)
    assert "Traceback" not in r.output, (name, r.output)
    assert took <= seconds, (name, args, f"{took:.1f} s")
    assert snapshot(directory) == before, (name, args)
    return err[0]


def assert_refused_subprocess(
    directory: Path,
    args: list[str],
    code: int | tuple[int, ...] = (1, 2),
    seconds: float = TIME_ALLOWED_S,
    env: dict | None = None,
    **kw,
) -> str:
    """The same through a real process (signals, file descriptors, the environment)."""
    codes = (code,) if isinstance(code, int) else code
    before = snapshot(directory)
    start = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "planner.cli.main", *args],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=seconds + 30,
        env={**os.environ, "COLUMNS": "100", **(env or {})},
        **kw,
    )
    took = time.monotonic() - start
    assert r.returncode in codes, (args, r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.stderr, (args, r.stderr)
    assert took <= seconds + 3, (args, f"{took:.1f} s")  # plus interpreter start-up
    assert snapshot(directory) == before, args
    return lines[0]
