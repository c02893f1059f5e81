"""`plan estimate` and `plan presets` end to end: output shape, exit codes, one-line errors."""

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from planner.cli.main import cli

GPT3 = [
    "estimate",
    "--model",
    "gpt3-175b",
    "--cluster",
    "dgx-a100-80gb",
    "--gpus",
    "1024",
    "--global-batch",
    "1536",
    "--seq-len",
    "2048",
    "--tp",
    "8",
    "--pp",
    "16",
    "--micro-batch-size",
    "1",
    "--recompute",
    "full",
]


def run(args):
    return CliRunner().invoke(cli, args)


def test_gpt3_json_has_documented_keys():
    res = run(GPT3 + ["--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert set(doc) >= {"schema_version", "plan", "estimate"}
    est = doc["estimate"]
    for key in (
        "step_time_s",
        "tokens_per_s",
        "model_tflops_per_gpu",
        "hardware_tflops_per_gpu",
        "mfu",
        "peak_memory_gib",
        "memory_gib_per_pipeline_rank",
        "time_breakdown_s",
    ):
        assert key in est
    assert doc["plan"]["dp"] == 8 and doc["plan"]["num_micro_batches"] == 192
    assert len(est["memory_gib_per_pipeline_rank"]) == 16
    assert sum(est["time_breakdown_s"].values()) == pytest.approx(est["step_time_s"], rel=1e-9)
    # tokens/s is the global batch over the step time
    assert est["tokens_per_s"] == pytest.approx(1536 * 2048 / est["step_time_s"])
    # full recompute: hardware FLOPs exceed model FLOPs by about a third (4 forwards instead of 3)
    assert 1.2 < est["hardware_tflops_per_gpu"] / est["model_tflops_per_gpu"] < 1.34


def test_json_stdout_is_only_json():
    out = subprocess.run([sys.executable, "-m", "planner.cli.main", *GPT3, "--json"], capture_output=True, text=True)
    assert out.returncode == 0
    json.loads(out.stdout)


def test_table_output_mentions_breakdowns():
    res = run(GPT3)
    assert res.exit_code == 0
    for word in ("pipeline bubble", "tp communication", "activations", "optimizer", "MFU"):
        assert word in res.output


def test_plan_file_round_trip(tmp_path):
    first = json.loads(run(GPT3 + ["--json"]).output)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(first))
    again = json.loads(run(["estimate", "--plan", str(path), "--json"]).output)
    assert again["estimate"] == first["estimate"]


@pytest.mark.parametrize(
    "change, message",
    [
        (["--model", "gpt3-175"], "did you mean gpt3-175b"),
        (["--pp", "12"], "tp x pp = 8 x 12 = 96 does not divide the 1024 GPUs"),
        (["--dp", "4"], "dp x tp x pp = 4 x 8 x 16 = 512, but the cluster has 1024 GPUs"),
        # degrees that do not make the GPUs, at a batch dp does not divide either: the degrees are named, not the batch
        (["--dp", "3"], "dp x tp x pp = 3 x 8 x 16 = 384, but the cluster has 1024 GPUs"),
        (["--tp", "64", "--pp", "16"], "tp=64 does not divide the 96 attention heads"),
        (["--micro-batch-size", "5"], "not divisible by dp x micro_batch_size = 8 x 5 = 40"),
        (["--cluster", "dgx-a100"], "unknown cluster preset"),
        (["--vpp", "2", "--schedule", "gpipe"], "vpp=2 needs schedule 'interleaved-1f1b'"),
        (["--global-batch", "1540"], "global batch 1540 is not divisible by dp x micro_batch_size"),
    ],
)
def test_bad_input_is_one_line_exit_2(change, message):
    args = list(GPT3)
    for i in range(0, len(change), 2):
        if change[i] in args:
            args[args.index(change[i]) + 1] = change[i + 1]
        else:
            args += change[i : i + 2]
    res = run(args)
    assert res.exit_code == 2, res.output
    assert message in res.output
    assert "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1


def test_truncated_plan_file_is_refused(tmp_path):
    text = run(GPT3 + ["--json"]).output
    path = tmp_path / "plan.json"
    path.write_text(text[: len(text) // 2])
    res = run(["estimate", "--plan", str(path)])
    assert res.exit_code == 2 and "malformed JSON" in res.output


def test_presets_lists_models_and_clusters():
    res = run(["presets", "--json"])
    data = json.loads(res.output)
    assert {m["name"] for m in data["models"]} >= {"gpt3-175b", "llama3-405b", "bloom-176b"}
    assert {c["name"] for c in data["clusters"]} == {
        "dgx-a100-40gb",
        "dgx-a100-80gb",
        "dgx-h100-80gb",
        "dgx-h200",
        "dgx-b200",
        "gb200-nvl72",
        "dgx-b300",
        "gb300-nvl72",
        "mi300x",
        "mi325x",
        "mi355x",
    }
