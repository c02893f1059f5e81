"""`plan tune` with the real executor (`plan run` of each trial on 2 CPU ranks, gloo), as a user
runs it: an out-of-memory trial is recorded and the tune goes on; SIGTERM in the middle of a
trial leaves the journal whole and no process behind; --resume runs nothing that finished;
and a trial launched with `srun` on the local Slurm (.ci/slurm starts one; skipped without).
Every command is a subprocess with a timeout. Each trial costs ~15 s on an idle 2-core
machine (mostly starting workers), several times that under load."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.distributed

TINY = {
    "name": "tiny-gpt",
    "num_layers": 2,
    "hidden_size": 64,
    "num_heads": 4,
    "vocab_size": 256,
    "max_seq_len": 32,
    "dropout": False,
    "source": "tests/distributed/test_tune_run.py",
}
# The first trial is the prior's fastest layout, dp 2 without ZeRO (tiny-gpt on two ranks: a rank
# holds 2.60 MiB of weights, gradients, Adam's moments and activations as `plan run` counts them);
# the other layouts shard something and need at most 2.2 MiB, so this limit puts only that one
# out of memory.
LIMIT_GIB = str(2.4 / 1024)


def _tune_args(tmp_path: Path, *extra: str) -> list[str]:
    model = tmp_path / "tiny.json"
    model.write_text(json.dumps(TINY))
    return [
        sys.executable,
        "-m",
        "planner.cli.main",
        "tune",
        "--model",
        str(model),
        "--cluster",
        "dgx-a100-80gb",
        "--gpus",
        "2",
        "--global-batch",
        "4",
        "--seq-len",
        "32",
        "--precision",
        "fp32",
        "--fix",
        "recompute=none",
        "--fix",
        "sp=false",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--trial-timeout",
        "300",
        *extra,
    ]


def _descendants(pid: int) -> set[int]:
    """Every process below `pid` (children, grandchildren, ...), from /proc."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _trial_lines(journal: Path) -> list[dict]:
    if not journal.exists():
        return []
    return [json.loads(line) for line in journal.read_text().splitlines()[1:] if line.strip()]


def test_out_of_memory_then_sigterm_then_resume(tmp_path):
    journal = tmp_path / "tune.jsonl"
    tuner = subprocess.Popen(
        _tune_args(tmp_path, "--trials", "3", "--journal", str(journal), "--trial-memory-gib", LIMIT_GIB),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        deadline = time.monotonic() + 500
        while len(_trial_lines(journal)) < 2 and tuner.poll() is None and time.monotonic() < deadline:
            time.sleep(1)
        time.sleep(4)  # the third trial's `plan run` and its workers are starting
        below = _descendants(tuner.pid)
        assert tuner.poll() is None and below, "the tuner ended before its third trial"
        tuner.send_signal(signal.SIGTERM)
        _, err = tuner.communicate(timeout=60)
    finally:
        if tuner.poll() is None:
            tuner.kill()
    assert tuner.returncode == 143, err
    assert err.strip().splitlines()[-1].startswith("error: interrupted by SIGTERM"), err
    time.sleep(2)
    assert not [p for p in below if _alive(p)], "a trial's process outlived the tuner"
    before = journal.read_text()
    trials = _trial_lines(journal)
    assert [t["status"] for t in trials][:1] == ["oom"] and len(trials) == 2, trials
    assert "over the limit" in trials[0]["detail"] and trials[1]["status"] == "ok"  # recorded, and the tune went on

    resumed = subprocess.run(
        [
            sys.executable,
            "-m",
            "planner.cli.main",
            "tune",
            "--resume",
            str(journal),
            "--trials",
            "3",
            "--trial-memory-gib",
            LIMIT_GIB,
            "--json",
            "-o",
            str(tmp_path / "tuned.json"),
            "--plan-out",
            str(tmp_path / "plan.json"),
        ],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=tmp_path,
    )
    assert resumed.returncode == 0, resumed.stderr
    after = _trial_lines(journal)
    assert journal.read_text().startswith(before)  # the finished trials' lines untouched
    assert len(after) == 3 and len({t["key"] for t in after}) == 3  # one new trial, none run twice
    out = json.loads(resumed.stdout)
    assert [t["index"] for t in out["trials"]] == [0, 1, 2] and out["best"]["index"] in (1, 2)
    tuned = json.loads((tmp_path / "tuned.json").read_text())
    assert "plan tune" in tuned["stack_constants"]["generic"]["provenance"]
    assert tuned["device"]["framework_overhead_gib"] > 2.0  # the out-of-memory trial taught the memory model
    check = subprocess.run(
        [sys.executable, "-m", "planner.cli.main", "export", str(tmp_path / "plan.json"), "--to", "torchtitan"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode in (0, 2) and check.stderr.count("\n") <= 1, check.stderr  # a plan file export reads


def test_a_tune_whose_every_trial_failed_exits_1(tmp_path):
    """One trial, out of memory (the limit above): the table shows it, and the tune ends with one
    error line and exit 1, where it said "nothing measured" and exited 0; no tuned profile (it
    would be fitted to nothing) and no plan are written."""
    journal = tmp_path / "tune.jsonl"
    res = subprocess.run(
        _tune_args(
            tmp_path,
            "--trials",
            "1",
            "--journal",
            str(journal),
            "--trial-memory-gib",
            LIMIT_GIB,
            "-o",
            "tuned.json",
            "--plan-out",
            "plan.json",
        ),
        capture_output=True,
        text=True,
        timeout=400,
        cwd=tmp_path,
    )
    assert res.returncode == 1, res.stderr
    assert res.stderr.strip().splitlines()[-1] == (
        f"error: no trial ran to the end, so nothing was written; each one's error is in the journal {journal}"
    )
    assert [t["status"] for t in _trial_lines(journal)] == ["oom"]
    assert (
        "written to" not in res.stderr
        and not (tmp_path / "tuned.json").exists()
        and not (tmp_path / "plan.json").exists()
    )


def _slurm_up() -> str:
    if not shutil.which("srun") or not shutil.which("sinfo"):
        return "no srun/sinfo on PATH (.ci/slurm starts a one-node Slurm as root)"
    try:
        states = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "sinfo did not answer"
    return "" if "idle" in states or "mix" in states else f"no idle Slurm node (sinfo: {states.strip() or 'nothing'})"


@pytest.mark.skipif(bool(_slurm_up()), reason=_slurm_up() or "slurm is up")
def test_trials_launch_with_srun(tmp_path):
    journal = tmp_path / "tune.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    res = subprocess.run(
        _tune_args(tmp_path, "--trials", "1", "--launcher", "srun", "--journal", str(journal), "--json"),
        capture_output=True,
        text=True,
        timeout=400,
        cwd=tmp_path,
        env=env,
    )
    assert res.returncode == 0, res.stderr
    head = json.loads(journal.read_text().splitlines()[0])
    assert head["run"]["launcher"] == "srun"
    trials = _trial_lines(journal)
    assert len(trials) == 1 and trials[0]["status"] == "ok" and trials[0]["step_time_s"] > 0, trials
