"""Hostile launches of `plan run` that start workers (issue 19, items 10-12): a peer that never
joins an enclosing launcher's world is named in one line (tests/hostile.py), and a launcher
killed with SIGKILL leaves no directory and no warning behind. The refusals before any launch
are tests/fuzz/test_hostile_run.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.fuzz import test_hostile_run as hostile_run
from tests.fuzz.test_hostile_run import _TORCHRUN
from tests.hostile import assert_refused_subprocess

plans = hostile_run.plans  # the fixture: plan files written by `plan estimate` (module-scoped)


@pytest.mark.distributed
def test_a_peer_that_never_joins_is_named(plans):
    """Inside an enclosing launcher (torchrun's variables) with WORLD_SIZE=2 and only rank 0:
    one line naming rank 1 and the timeout, after it."""
    from planner.distributed.launch import free_port

    env = dict(_TORCHRUN, MASTER_PORT=str(free_port()))
    line = assert_refused_subprocess(
        plans, ["run", "small.json", "--timeout", "5", "--steps", "2", "--warmup", "1"], 1, seconds=60, env=env
    )
    assert "rank 1 of WORLD_SIZE=2 never joined" in line and "5 s (--timeout)" in line


@pytest.mark.distributed
def test_sigkill_of_the_launcher_leaves_no_directory_and_no_warning(plans, tmp_path):
    """`kill -9` of `plan run` while its workers run: no plan-launch-* directory or progress file
    is left, and nothing (a leaked-semaphore warning) is printed after it."""
    env = {**os.environ, "TMPDIR": str(tmp_path), "PLAN_RUN_FAIL_RANK": "1", "PLAN_RUN_FAIL_MODE": "hang"}
    env.pop("RANK", None)
    err = tmp_path / "stderr"
    with err.open("w") as sink:
        p = subprocess.Popen(
            [sys.executable, "-m", "planner.cli.main", "run", "small.json", "--timeout", "30"],
            cwd=plans,
            stdout=subprocess.DEVNULL,
            stderr=sink,
            env=env,
            start_new_session=True,
        )
        deadline = time.time() + 120
        while not list(tmp_path.glob("plan-launch-*/*/*/*")) and time.time() < deadline:  # the workers' log files
            time.sleep(0.2)
        time.sleep(2)
        p.kill()
        p.wait(timeout=10)
        time.sleep(3)
    assert [x.name for x in tmp_path.iterdir() if x.name.startswith("plan-")] == []
    assert "leaked" not in err.read_text() and "Traceback" not in err.read_text(), err.read_text()
