"""Progress of a real `plan run` launch (2 processes, stderr a pipe): a rehearsal of a dp 2 x tp 2
plan says its estimate first, then a line per phase and step, and the time it took. The
progress lines themselves, on fake clocks, are tests/unit/executor/test_progress.py."""

import json

import pytest

from planner.presets import load_model
from planner.specs import JobSpec, Plan


@pytest.mark.distributed
def test_rehearsal_runs_and_reports_progress_off_a_terminal(tmp_path):
    """A dp 2 x tp 2 plan of llama3-8b rehearsed on 2 processes (--rehearse-dp 1, --scale-heads 4:
    2 KV heads), stderr a pipe: the estimate comes first, then a line per phase and step, and
    the time it took; the report says what the rehearsal changed; verification passes."""
    from tests.run_helpers import PG_TIMEOUT, cli

    plan = Plan(dp=2, tp=2, pp=1, micro_batch_size=1, num_micro_batches=2, sequence_parallel=True, zero_stage=1)
    doc = {
        "schema_version": "1.0",
        "model": json.loads(load_model("llama3-8b").model_dump_json()),
        "cluster": json.loads(__import__("hardware_profiles").load_cluster("dgx-h100-80gb").model_dump_json()),
        "num_gpus": 4,
        "job": json.loads(JobSpec(global_batch_size=4, seq_len=2048).model_dump_json()),
        "plan": json.loads(plan.model_dump_json()),
    }
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    res = cli(
        "run",
        str(path),
        "--rehearse-dp",
        "1",
        "--scale-layers",
        "2",
        "--scale-hidden",
        "128",
        "--scale-heads",
        "4",
        "--scale-vocab",
        "256",
        "--scale-seq-len",
        "32",
        "--steps",
        "3",
        "--warmup",
        "1",
        "--timeout",
        PG_TIMEOUT,
        "--json",
    )
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads(res.stdout)
    assert (
        report["verdict"] == "pass"
        and report["settings"]["world_size"] == 2
        and report["job"]["global_batch_size"] == 2
    )
    assert (
        report["model"]["name"]
        == "llama3-8b scaled to 2 layers, hidden 128, 4 heads / 2 KV heads, vocabulary 256, sequence 32"
    )
    assert report["settings"]["changes"][0].startswith(
        "rehearsal world (--rehearse-dp 1): dp 1 x tp 2 x pp 1 = 2 processes"
    )
    err = res.stderr.splitlines()
    assert err[0].startswith("plan run: estimate before starting: about ") and "3 steps of ~" in err[0], res.stderr
    assert err[1].startswith("plan run: [0:00] 0/3 starting 2 workers")
    assert any("3/3 distributed run on 2 ranks, step" in ln for ln in err), res.stderr
    assert any("0/1 single-process reference runs" in ln for ln in err), res.stderr
    assert err[-1].startswith("plan run: done in ") and "before starting)" in err[-1], res.stderr
