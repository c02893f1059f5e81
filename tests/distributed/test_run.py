"""`plan run` on real torch.distributed processes (gloo, CPU), each compared with one process.

The layouts run in two launches (2 and 4 processes), several plans per launch, because
starting a worker costs seconds of importing torch. Every launch is a subprocess with a
timeout and a short process-group timeout, so a hang fails the test instead of blocking
the suite. Process leaks are looked for with a marker in the environment of everything the
command starts (/proc/PID/environ).
"""

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from hardware_profiles import load_cluster
from planner.distributed.launch import free_port
from planner.specs import JobSpec, ModelSpec, Plan, StageRecompute

pytestmark = pytest.mark.distributed
pytest.importorskip("torch")

LAUNCH_TIMEOUT = 240  # seconds for one subprocess (start-up ~10 s, a batch of plans ~60 s)
PG_TIMEOUT = "30"  # process-group timeout inside the workers

GPT = ModelSpec(
    name="tiny-gpt",
    num_layers=8,
    hidden_size=64,
    num_heads=4,
    vocab_size=256,
    max_seq_len=32,
    param_dtype="fp32",
    dropout=False,
)
LLAMA = ModelSpec(
    name="tiny-llama",
    num_layers=8,
    hidden_size=64,
    num_heads=4,
    num_kv_heads=2,
    vocab_size=256,
    max_seq_len=32,
    activation="swiglu",
    learned_position_embeddings=False,
    linear_bias=False,
    norm="rmsnorm",
    dropout=False,
    tied_embeddings=True,
    param_dtype="fp32",
)
JOB = JobSpec(global_batch_size=8, seq_len=32, precision="fp32")


def _plan(**kw) -> Plan:
    base = dict(dp=1, tp=1, pp=1, micro_batch_size=1)
    p = base | kw
    p.setdefault("num_micro_batches", JOB.global_batch_size // (p["dp"] * p["micro_batch_size"]))
    return Plan(**p)


# name -> (model, plan). Each runs 3 steps and must match the single-process reference.
TWO_PROCESSES = {
    "dp2 ddp accumulate": (GPT, _plan(dp=2, micro_batch_size=2)),
    "dp2 zero1": (GPT, _plan(dp=2, micro_batch_size=2, zero_stage=1)),
    "dp2 zero2": (GPT, _plan(dp=2, micro_batch_size=2, zero_stage=2)),
    "dp2 zero3 llama tied": (LLAMA, _plan(dp=2, micro_batch_size=2, zero_stage=3)),
    "dp2 recompute full": (GPT, _plan(dp=2, micro_batch_size=4, recompute="full")),
    "tp2": (GPT, _plan(tp=2, micro_batch_size=4)),
    "tp2 sp llama tied": (LLAMA, _plan(tp=2, micro_batch_size=4, sequence_parallel=True)),
    "pp2 gpipe uneven": (GPT, _plan(pp=2, micro_batch_size=2, schedule="gpipe", layers_per_stage=[2, 6])),
    "pp2 1f1b mixed recompute": (
        GPT,
        _plan(
            pp=2,
            micro_batch_size=2,
            layers_per_stage=[3, 5],
            stage_recompute=[StageRecompute(none=1, selective=1, full=1), StageRecompute(none=3, selective=2)],
        ),
    ),
    "pp2 interleaved llama": (LLAMA, _plan(pp=2, vpp=2, micro_batch_size=2, schedule="interleaved-1f1b")),
}
FOUR_PROCESSES = {
    "dp2 x pp2 zero1": (GPT, _plan(dp=2, pp=2, zero_stage=1)),
    "dp2 x pp2 zero3 pp outermost": (GPT, _plan(dp=2, pp=2, zero_stage=3, mesh_order=["dp", "pp", "tp"])),
    "dp2 x tp2 replicate": (GPT, _plan(dp=2, tp=2, micro_batch_size=2)),
    "dp2 x tp2 zero1 sp, dp innermost": (
        GPT,
        _plan(dp=2, tp=2, micro_batch_size=2, zero_stage=1, sequence_parallel=True, mesh_order=["dp", "tp", "pp"]),
    ),
    "dp2 x tp2 zero3 sp llama": (LLAMA, _plan(dp=2, tp=2, micro_batch_size=2, zero_stage=3, sequence_parallel=True)),
    "tp2 x pp2 sp selective": (
        GPT,
        _plan(tp=2, pp=2, micro_batch_size=2, sequence_parallel=True, recompute="selective"),
    ),
    "pp4 1f1b uneven": (GPT, _plan(pp=4, micro_batch_size=2, layers_per_stage=[1, 3, 3, 1])),
    "pp4 gpipe": (LLAMA, _plan(pp=4, micro_batch_size=2, schedule="gpipe")),
}


def _marker_env(marker: str, **extra) -> dict:
    env = dict(os.environ, PLAN_RUN_TEST_MARKER=marker, **extra)
    env.pop("RANK", None)  # never look like the inside of a torchrun job
    return env


def _processes_with(marker: str) -> list[int]:
    """PIDs whose environment carries the marker (the command and everything it started)."""
    found = []
    needle = f"PLAN_RUN_TEST_MARKER={marker}".encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if needle in Path(f"/proc/{pid}/environ").read_bytes():
                found.append(int(pid))
        except OSError:
            continue
    return found


def _no_leftovers(marker: str, grace_s: float = 10.0) -> None:
    deadline = time.time() + grace_s
    while _processes_with(marker) and time.time() < deadline:
        time.sleep(0.2)
    assert _processes_with(marker) == [], "worker processes were left behind"


def _run_batch(tmp_path: Path, cases: dict, nproc: int) -> dict:
    items = [
        {
            "model": json.loads(m.model_dump_json()),
            "job": json.loads(JOB.model_dump_json()),
            "plan": json.loads(p.model_dump_json()),
            "steps": 3,
            "warmup": 1,
        }
        for m, p in cases.values()
    ]
    src, out = tmp_path / "cases.json", tmp_path / "reports.json"
    src.write_text(json.dumps(items))
    marker = uuid.uuid4().hex
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "planner.executor.batch",
            str(src),
            str(out),
            "--nproc-per-node",
            str(nproc),
            "--timeout",
            PG_TIMEOUT,
        ],
        capture_output=True,
        text=True,
        timeout=LAUNCH_TIMEOUT,
        env=_marker_env(marker),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    _no_leftovers(marker)
    return dict(zip(cases, json.loads(out.read_text())))


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    return _run_batch(tmp_path_factory.mktemp("two"), TWO_PROCESSES, 2)


@pytest.fixture(scope="module")
def four(tmp_path_factory):
    return _run_batch(tmp_path_factory.mktemp("four"), FOUR_PROCESSES, 4)


def _check_matches_reference(report: dict) -> None:
    v = report["verification"]
    assert report["verdict"] == "pass", v["message"]
    assert len(v["losses"]) == 3 and v["max_loss_rel_error"] <= 1e-5 and v["max_grad_norm_rel_error"] <= 1e-5
    # the run trained: Adam moved the weights, so the loss changed between steps
    assert v["losses"][0] != v["losses"][-1]


@pytest.mark.parametrize("name", list(TWO_PROCESSES))
def test_two_processes_match_reference(two, name):
    _check_matches_reference(two[name])


@pytest.mark.parametrize("name", list(FOUR_PROCESSES))
def test_four_processes_match_reference(four, name):
    _check_matches_reference(four[name])


def _stage0(report: dict) -> dict:
    return max((r for r in report["ranks"] if r["pp_rank"] == 0), key=lambda r: r["peak_memory_bytes"])["memory"]


def test_zero_stages_shard_what_they_should(two):
    """ZeRO-1 halves the optimizer state of DDP at dp=2, ZeRO-2 also the gradients,
    ZeRO-3 also the parameters at rest (FSDP2's gathered ones come and go)."""
    ddp, z1, z2 = (_stage0(two[k]) for k in ("dp2 ddp accumulate", "dp2 zero1", "dp2 zero2"))
    assert z1["optimizer_states_bytes"] == pytest.approx(ddp["optimizer_states_bytes"] / 2, rel=0.1)
    assert z1["gradients_bytes"] == ddp["gradients_bytes"]
    assert z2["gradients_bytes"] == pytest.approx(ddp["gradients_bytes"] / 2, rel=0.05)
    assert z2["optimizer_states_bytes"] == pytest.approx(ddp["optimizer_states_bytes"] / 2, rel=0.05)


def test_recompute_and_pipeline_memory_follow_the_cost_model(two, four):
    """Where the count covers everything the cost model does (no FSDP buffers), measured
    memory per stage is within 5% of the prediction: saved activations under full
    recompute, the in-flight micro-batches of GPipe / 1F1B on uneven stages."""
    for report in (
        two["dp2 recompute full"],
        two["pp2 gpipe uneven"],
        two["pp2 1f1b mixed recompute"],
        four["pp4 1f1b uneven"],
    ):
        for rank in report["pipeline_ranks"]:
            assert abs(rank["error_pct"]) < 5, (report["plan"], rank)
    full, none = (
        two["dp2 recompute full"]["pipeline_ranks"][0]["measured"],
        two["dp2 ddp accumulate"]["pipeline_ranks"][0]["measured"],
    )
    assert (
        full["activations_bytes"] < none["activations_bytes"] / 4
    )  # micro-batch 4 keeps less than micro-batch 2 would


def test_mesh_order_places_ranks(two, four):
    """mesh_order lists axes innermost first: with tp innermost ranks 0,1 share a TP group;
    with dp innermost ranks 0,1 are data-parallel peers."""
    tp_inner = {r["rank"]: (r["dp_rank"], r["tp_rank"]) for r in four["dp2 x tp2 replicate"]["ranks"]}
    dp_inner = {r["rank"]: (r["dp_rank"], r["tp_rank"]) for r in four["dp2 x tp2 zero1 sp, dp innermost"]["ranks"]}
    assert tp_inner == {0: (0, 0), 1: (0, 1), 2: (1, 0), 3: (1, 1)}
    assert dp_inner == {0: (0, 0), 1: (1, 0), 2: (0, 1), 3: (1, 1)}
    pp_outer = {r["rank"]: r["pp_rank"] for r in four["dp2 x pp2 zero3 pp outermost"]["ranks"]}
    assert pp_outer == {0: 0, 1: 0, 2: 1, 3: 1}  # mesh_order dp, pp, tp: dp varies fastest, then pp
    interleaved = {r["pp_rank"]: r["virtual_stages"] for r in two["pp2 interleaved llama"]["ranks"]}
    assert interleaved == {0: [0, 2], 1: [1, 3]}


# --------------------------------------------------------------------------- the command


def _plan_file(tmp_path: Path, model: ModelSpec, plan: Plan) -> Path:
    doc = {
        "schema_version": "1.0",
        "model": json.loads(model.model_dump_json()),
        "cluster": json.loads(load_cluster("dgx-a100-80gb").model_dump_json()),
        "num_gpus": plan.world_size,
        "job": json.loads(JOB.model_dump_json()),
        "plan": json.loads(plan.model_dump_json()),
    }
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    return path


def _plan_run(*args, env=None, **kw):
    return subprocess.run(
        [sys.executable, "-m", "planner.cli.main", "run", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=LAUNCH_TIMEOUT,
        env=env,
        **kw,
    )


@pytest.mark.parametrize(
    "mode, timeout, words",
    [
        ("raise", PG_TIMEOUT, "error: rank 1 failed: RuntimeError: injected failure at step 1"),
        ("exit", PG_TIMEOUT, "error: rank 1 failed: exit code 3"),
        # a rank that hangs: the others fail after the process-group timeout, the silent one is named
        ("hang", "8", "error: rank 1 stopped answering: rank 0 failed: RuntimeError: Timed out waiting 8000ms"),
    ],
)
def test_a_failing_rank_stops_everything_with_one_line(tmp_path, mode, timeout, words):
    path = _plan_file(tmp_path, GPT, _plan(pp=2, micro_batch_size=2))
    marker = uuid.uuid4().hex
    env = _marker_env(marker, PLAN_RUN_FAIL_RANK="1", PLAN_RUN_FAIL_MODE=mode)
    start = time.time()
    res = _plan_run(path, "--steps", "4", "--timeout", timeout, env=env)
    assert res.returncode == 1, res.stderr
    lines = res.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("error:")]
    assert errors == [lines[-1]] and lines[-1].startswith(words), res.stderr  # progress lines, then one error line
    assert all(line.startswith("plan run: ") for line in lines[:-1]), res.stderr
    assert "Traceback" not in res.stderr and res.stdout == ""
    assert time.time() - start < float(timeout) + 30  # stopped within the timeout, plus start-up
    _no_leftovers(marker)
    logs = lines[-1].rsplit("(logs: ", 1)[1].rstrip(")")
    # kept for the user, under the temporary directory (tests: pytest's, tests/conftest.py)
    assert Path(logs).resolve().is_relative_to(Path(os.environ["TMPDIR"]).resolve())
    if mode == "raise":
        assert "injected failure" in (Path(logs) / "rank1-traceback.txt").read_text()


@pytest.mark.parametrize("wait_s", [0.5, 4.0])
def test_ctrl_c_stops_every_worker(tmp_path, wait_s):
    """Ctrl-C as a terminal sends it: SIGINT to the whole process group, launcher and
    workers, while workers are still starting (0.5 s) and while they train (4 s)."""
    path = _plan_file(tmp_path, GPT, _plan(dp=2, micro_batch_size=2))
    marker = uuid.uuid4().hex
    # rank 1 hangs, so the run is still going when the signal comes
    env = _marker_env(marker, PLAN_RUN_FAIL_RANK="1", PLAN_RUN_FAIL_MODE="hang")
    proc = subprocess.Popen(
        [sys.executable, "-m", "planner.cli.main", "run", str(path), "--timeout", PG_TIMEOUT],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    deadline = time.time() + 60
    while len(_processes_with(marker)) < 3 and time.time() < deadline:  # launcher + 2 workers
        time.sleep(0.1)
    time.sleep(wait_s)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    lines = err.strip().splitlines()  # progress lines, then one error line
    assert (
        lines[-1].startswith("error: interrupted by Ctrl-C") and sum(line.startswith("error:") for line in lines) == 1
    ), err
    assert all(line.startswith("plan run: ") for line in lines[:-1]), err
    assert out == ""
    _no_leftovers(marker)


def test_ctrl_c_stops_plan_profile_within_seconds(tmp_path):
    """`plan profile` launches from a thread (its progress bar holds the main one): Ctrl-C to
    the process group while the workers measure stops everything, exits 130 with one line,
    writes no profile and leaves no process behind."""
    marker = uuid.uuid4().hex
    out_path = tmp_path / "profile.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "planner.cli.main",
            "profile",
            "--model",
            "gpt2-124m",
            "--nproc-per-node",
            "2",
            "--seq-len",
            "128",
            "-o",
            str(out_path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_marker_env(marker),
        start_new_session=True,
    )
    deadline = time.time() + 60
    while len(_processes_with(marker)) < 3 and time.time() < deadline:  # launcher + 2 workers
        time.sleep(0.1)
    time.sleep(3.0)  # measuring
    sent = time.time()
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert time.time() - sent < 5.0
    assert proc.returncode == 130, err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert lines[-1].startswith("error: interrupted by Ctrl-C") and "Traceback" not in err, err
    assert not out_path.exists()
    _no_leftovers(marker)


@pytest.mark.parametrize("wait_s", [0.3, 2.0])
def test_sigkill_of_the_launcher_leaves_no_worker(tmp_path, wait_s):
    """`kill -9` of `plan run` (no chance to clean up), while the workers start (0.3 s) and
    once they run (2 s): the workers die with it (parent-death signal, set before they import
    anything heavy; one that starts after the launcher died exits at once, once the interpreter
    reaches that check, which on a loaded 2-core machine can take seconds), and with them the
    resource tracker: nothing of the run survives 10 s."""
    path = _plan_file(tmp_path, GPT, _plan(dp=2, micro_batch_size=2))
    marker = uuid.uuid4().hex
    env = _marker_env(marker, PLAN_RUN_FAIL_RANK="1", PLAN_RUN_FAIL_MODE="hang")
    proc = subprocess.Popen(
        [sys.executable, "-m", "planner.cli.main", "run", str(path), "--timeout", PG_TIMEOUT],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    deadline = time.time() + 60
    while len(_processes_with(marker)) < 3 and time.time() < deadline:  # launcher + 2 workers
        time.sleep(0.1)
    time.sleep(wait_s)
    proc.kill()
    proc.wait(timeout=10)
    _no_leftovers(marker)


def test_two_nodes_on_one_machine(tmp_path):
    """Two launchers with --nnodes 2 rendezvous on localhost (one rank each): both verify,
    node 0 prints JSON and writes -o, node 1 prints the tables."""
    path = _plan_file(tmp_path, GPT, _plan(dp=2, micro_batch_size=2, zero_stage=1))
    endpoint = f"127.0.0.1:{free_port()}"
    marker = uuid.uuid4().hex
    common = [
        "--nnodes",
        "2",
        "--rdzv-endpoint",
        endpoint,
        "--nproc-per-node",
        "1",
        "--steps",
        "3",
        "--warmup",
        "1",
        "--timeout",
        PG_TIMEOUT,
    ]
    out = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "planner.cli.main", "run", str(path), *common]
    node0 = subprocess.Popen(
        [*cmd, "--node-rank", "0", "--json", "-o", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_marker_env(marker),
    )
    node1 = subprocess.Popen(
        [*cmd, "--node-rank", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_marker_env(marker)
    )
    out0, err0 = node0.communicate(timeout=LAUNCH_TIMEOUT)
    out1, err1 = node1.communicate(timeout=LAUNCH_TIMEOUT)
    assert node0.returncode == 0, err0[-2000:]
    assert node1.returncode == 0, err1[-2000:]
    report = json.loads(out0)  # stdout is only JSON
    assert report == json.loads(out.read_text())
    assert report["verdict"] == "pass" and report["settings"]["nnodes"] == 2 and report["settings"]["world_size"] == 2
    assert sorted(r["rank"] for r in report["ranks"]) == [0, 1]
    assert "Verification against one process: PASS" in out1 and "Memory per pipeline rank" in out1
    _no_leftovers(marker)


def test_inside_torchrun(tmp_path):
    """`torchrun --nproc-per-node 2 -m planner.cli.main run plan.json`: every process is a
    rank, rank 0 reports."""
    path = _plan_file(tmp_path, GPT, _plan(tp=2, micro_batch_size=4))
    marker = uuid.uuid4().hex
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--master-port",
            str(free_port()),
            "-m",
            "planner.cli.main",
            "run",
            str(path),
            "--steps",
            "3",
            "--warmup",
            "1",
            "--json",
            "--timeout",
            PG_TIMEOUT,
        ],
        capture_output=True,
        text=True,
        timeout=LAUNCH_TIMEOUT,
        env=_marker_env(marker),
    )
    assert res.returncode == 0, res.stderr[-2000:]
    report = json.loads(res.stdout)
    assert report["verdict"] == "pass" and report["settings"]["world_size"] == 2
    _no_leftovers(marker)


def test_a_run_that_misses_the_reference_exits_1_with_its_report(tmp_path):
    """The check can fail: with a tolerance below fp32 rounding, the data-parallel run (whose
    averaging sums in another order) no longer passes; the JSON report says why, exit 1."""
    path = _plan_file(tmp_path, GPT, _plan(dp=2, micro_batch_size=2))
    res = _plan_run(
        path,
        "--steps",
        "2",
        "--warmup",
        "1",
        "--tolerance",
        "1e-300",
        "--json",
        "--timeout",
        PG_TIMEOUT,
        env=_marker_env(uuid.uuid4().hex),
    )
    assert res.returncode == 1, res.stderr
    report = json.loads(res.stdout)
    assert report["verdict"] == "fail" and not report["verification"]["passed"]
    lines = res.stderr.strip().splitlines()
    assert (
        lines[-1].startswith("error: verification failed: step ")
        and sum(line.startswith("error:") for line in lines) == 1
    )
