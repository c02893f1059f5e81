"""CPU ranks own their cores: `plan run` on 2 gloo processes pins each to a core of its own
where the machine lets it have 2 (each rank reports os.sched_getaffinity read back during its
steps), and where it has fewer cores than ranks pins none, says so in one line and records it
in the report. Each launch is a subprocess with a timeout. The slicing itself:
tests/unit/executor/test_cores.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hardware_profiles import load_cluster
from planner.specs import JobSpec, ModelSpec, Plan

pytestmark = pytest.mark.distributed
pytest.importorskip("torch")

LAUNCH_TIMEOUT = 240  # seconds for one subprocess (start-up ~10 s, 3 steps of a tiny model, the reference)
PG_TIMEOUT = "30"  # process-group timeout inside the workers
CORES = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []

TINY = ModelSpec(
    name="tiny-gpt",
    num_layers=2,
    hidden_size=64,
    num_heads=4,
    vocab_size=256,
    max_seq_len=32,
    param_dtype="fp32",
    dropout=False,
)
JOB = JobSpec(global_batch_size=4, seq_len=32, precision="fp32")
PLAN = Plan(dp=2, tp=1, pp=1, micro_batch_size=2, num_micro_batches=1)


def _plan_file(tmp_path: Path) -> Path:
    doc = {
        "schema_version": "1.0",
        "model": json.loads(TINY.model_dump_json()),
        "cluster": json.loads(load_cluster("dgx-a100-80gb").model_dump_json()),
        "num_gpus": 2,
        "job": json.loads(JOB.model_dump_json()),
        "plan": json.loads(PLAN.model_dump_json()),
    }
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    return path


def _plan_run(tmp_path: Path, cores: list[int]) -> subprocess.CompletedProcess:
    """`plan run --json` of the dp 2 plan on 2 gloo processes, the launcher allowed only `cores`."""
    env = dict(os.environ)
    env.pop("RANK", None)  # never look like the inside of a torchrun job
    return subprocess.run(
        [sys.executable, "-m", "planner.cli.main", "run", str(_plan_file(tmp_path)), "--backend", "gloo"]
        + ["--steps", "3", "--warmup", "1", "--timeout", PG_TIMEOUT, "--json"],
        capture_output=True,
        text=True,
        timeout=LAUNCH_TIMEOUT,
        env=env,
        preexec_fn=lambda: os.sched_setaffinity(0, cores),
    )


@pytest.mark.skipif(len(CORES) < 2, reason="needs 2 usable cores")
def test_two_ranks_on_two_cores_each_own_one(tmp_path):
    res = _plan_run(tmp_path, CORES[:2])
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads(res.stdout)
    ranks = {r["rank"]: r["cores"] for r in report["ranks"]}
    assert ranks == {0: [CORES[0]], 1: [CORES[1]]}, ranks  # rank i: the i-th core, read back in the rank
    assert report["settings"]["pinned"] is True
    assert "share" not in res.stderr, res.stderr


@pytest.mark.skipif(len(CORES) < 1, reason="needs os.sched_getaffinity")
def test_two_ranks_on_one_core_share_it_and_say_so(tmp_path):
    res = _plan_run(tmp_path, CORES[:1])
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads(res.stdout)
    assert [r["cores"] for r in report["ranks"]] == [[], []] and report["settings"]["pinned"] is False
    said = [ln for ln in res.stderr.splitlines() if "share" in ln]
    assert said == ["plan run: 2 ranks share 1 core: step times are noisy; use at most 1 rank here to measure"], (
        res.stderr
    )
