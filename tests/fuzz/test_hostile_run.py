"""`plan run` and `plan profile` validate everything before any work starts (issue 19, items 5,
10-12): generated option values and environments each get one line and exit 2 (tests/hostile.py),
in well under the time allowed, and no launch directory appears; the single-process
reference's memory is counted before launch; a worker is only what a launcher really started;
SIGTERM outside a command's own handlers is one line and 143. What launches workers (a peer
that never joins, a launcher killed with SIGKILL) is tests/distributed/test_hostile_launch.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.distributed.launch import endpoint_problem, enclosing_problem
from planner.executor.prepare import RANKS_PER_CORE, SEED_LIMIT, TIMEOUT_RANGE_S, gpu_absent, reference_bytes
from tests.hostile import assert_refused

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
CORES = os.cpu_count() or 1


def _estimate(directory: Path, name: str, *args: str) -> Path:
    """A plan file written by `plan estimate ... -o` (as a user makes one)."""
    out = directory / name
    r = subprocess.run(
        [sys.executable, "-m", "planner.cli.main", "estimate", *args, "--precision", "fp32", "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("plans")
    common = ["--model", "gpt2-124m", "--cluster", "dgx-a100-80gb", "--gpus", "2", "--dp", "2"]
    _estimate(d, "small.json", *common, "--global-batch", "4", "--seq-len", "128")
    # fits two ranks easily, but its reference takes all 256 x 512 tokens at once, in float64: ~300 GiB
    _estimate(d, "big_reference.json", *common, "--global-batch", "256", "--seq-len", "512")
    return d


def _launch_dirs() -> set:
    return set(Path(tempfile.gettempdir()).glob("plan-launch-*"))


def _refused(directory: Path, args: list[str], **kw) -> str:
    before = _launch_dirs()
    line = assert_refused(directory, args, 2, **kw)
    assert _launch_dirs() == before
    return line


# --------------------------------------------------------------------------- options


@pytest.mark.slow
@FAST
@given(seed=st.one_of(st.integers(max_value=-1), st.integers(min_value=SEED_LIMIT, max_value=10**300)))
def test_seeds_out_of_range(plans, seed):
    assert "--seed" in _refused(plans, ["run", "small.json", "--seed", str(seed)])


@FAST
@given(
    timeout=st.one_of(
        st.floats(min_value=-1e308, max_value=TIMEOUT_RANGE_S[0], exclude_max=True),
        st.floats(min_value=TIMEOUT_RANGE_S[1], exclude_min=True, allow_infinity=True),
        st.just(float("nan")),
    )
)
def test_timeouts_out_of_range(plans, timeout):
    assert "--timeout" in _refused(plans, ["run", "small.json", "--timeout", repr(timeout)])


_HOSTS = st.sampled_from(
    ["host", "127.0.0.1", "[::1]", "node-0.cluster", "", "a b", "[zz]", "h\x00", "ħost", "x" * 300]
)
_PORTS = st.one_of(
    st.integers(-10, 0).map(str),
    st.integers(65536, 10**30).map(str),
    st.text(max_size=6),
    st.sampled_from(["", "٦٦", "+80", "8_0", " 80", "0x50", "1e3"]),
)


@FAST
@given(host=_HOSTS, sep=st.sampled_from([":", "", "::"]), port=_PORTS)
def test_rendezvous_endpoints(plans, host, sep, port):
    endpoint = f"{host}{sep}{port}"
    if endpoint_problem(endpoint) is None:  # a well-formed one (a generated port in range): not this test's
        return
    if "\x00" in endpoint:  # no argument vector can carry it
        return
    for command in (["run", "small.json"], ["profile", "-o", "p.json"]):
        assert "--rdzv-endpoint" in _refused(plans, [*command, "--rdzv-endpoint", endpoint])


def test_good_endpoints_pass_the_check():
    for endpoint in ("127.0.0.1:29500", "node-0.cluster:1", "[::1]:65535", "host_1:80"):
        assert endpoint_problem(endpoint) is None, endpoint


@FAST
@given(extra=st.integers(1, 1000))
def test_more_cpu_processes_than_cores_carry(plans, extra):
    n = RANKS_PER_CORE * CORES + extra
    if not gpu_absent():
        pytest.skip("with a GPU, --backend auto is nccl")
    assert "cores" in _refused(plans, ["run", "small.json", "--rehearse-dp", str(n), "--nproc-per-node", str(n)])
    assert "cores" in _refused(plans, ["profile", "--nproc-per-node", str(n), "-o", "p.json"])


@FAST
@given(sizes=st.lists(st.one_of(st.integers(-5, 0), st.integers(10**6, 10**12)), min_size=1, max_size=3))
def test_profile_micro_batch_sizes_that_cannot_run(plans, sizes):
    line = _refused(plans, ["profile", "--micro-batch-sizes", ",".join(map(str, [1, *sizes])), "-o", "p.json"])
    assert "--micro-batch-sizes" in line or "memory" in line or "GiB" in line


@FAST
@given(seq=st.one_of(st.integers(max_value=0), st.integers(10**6, 10**30)))
def test_profile_sequence_lengths_that_cannot_run(plans, seq):
    for model in ("gpt2-124m", "llama3-8b"):  # learned positions, and rotary (no table to bound it)
        _refused(plans, ["profile", "--model", model, "--seq-len", str(seq), "-o", "p.json"])


def test_profile_nccl_without_a_gpu(plans):
    if not gpu_absent():
        pytest.skip("this machine has a GPU")
    assert "nccl" in _refused(plans, ["profile", "--backend", "nccl", "-o", "p.json"])


@pytest.mark.parametrize(
    "body, words",
    [
        ("raise RuntimeError('boom at import')", "raised RuntimeError: boom at import"),
        ("import sys\nprint('chatter')\nsys.exit(3)", "called sys.exit(3)"),
        ("1 / 0", "ZeroDivisionError"),
        ("def make(:\n", "SyntaxError"),
    ],
)
def test_a_model_factory_that_fails_at_import(tmp_path, body, words):
    module = f"factory_{abs(hash(body)) % 10**8}"
    (tmp_path / f"{module}.py").write_text(body + "\n")
    line = assert_refused(tmp_path, ["profile", "--model-factory", f"{module}:make", "-o", "p.json"], 2)
    assert words in line and not (tmp_path / "__pycache__").exists()


# --------------------------------------------------------------------------- the reference run's memory


def test_the_reference_run_that_does_not_fit_is_refused_before_launch(plans):
    start = time.monotonic()
    line = _refused(plans, ["run", "big_reference.json"])
    assert time.monotonic() - start < 5  # before torch loads
    assert "reference run" in line and "float64" in line and "GiB more than" in line and "--scale-seq-len" in line


def test_reference_bytes_against_a_measured_peak(plans):
    """A 2-layer, 256-wide GPT with a 1,024-token vocabulary on 256 x 512 tokens: its float64
    reference run peaked at 11.7 GiB resident (measured, one thread; planner/executor/prepare.py)."""
    from planner.executor.prepare import Rehearsal, prepare_case
    from planner.plan_file import read_plan_file

    doc = read_plan_file(plans / "big_reference.json")
    case = prepare_case(
        doc.model, doc.job, doc.plan, Rehearsal(layers=2, hidden=256, heads=4, vocab=1024), steps=2, warmup=1
    )
    assert reference_bytes(case.model, case.job) / 2**30 == pytest.approx(11.7, rel=0.1)


@pytest.mark.parametrize("gib", [4, 8, 64])
def test_each_hint_fits(plans, gib):
    """Every --scale-* / --rehearse-dp the refusal names makes a run whose reference fits (at
    4 GiB no single one does: GPT-2's float64 weights, gradients and moments alone take 3.7)."""
    from dataclasses import replace

    from planner.errors import UsageError
    from planner.executor.prepare import USABLE_MEMORY, Rehearsal, check_reference_memory, prepare_case
    from planner.plan_file import read_plan_file

    doc = read_plan_file(plans / "big_reference.json")
    case = prepare_case(doc.model, doc.job, doc.plan, Rehearsal(), steps=2, warmup=1)
    with pytest.raises(UsageError) as refusal:
        check_reference_memory(case, Rehearsal(), gib * 2**30)
    if gib == 4:
        assert str(refusal.value).endswith(
            "rehearse a smaller model with --scale-layers/--scale-hidden/--scale-vocab and a shorter --scale-seq-len"
        )
        return
    hints = str(refusal.value).split("rehearse with ")[1].split(" or ")
    assert hints and all(h.startswith("--") for h in hints), str(refusal.value)
    fields = {"--scale-layers": "layers", "--scale-seq-len": "seq_len", "--scale-vocab": "vocab", "--rehearse-dp": "dp"}
    for hint in hints:
        option, value = hint.split()
        smaller = prepare_case(
            doc.model, doc.job, doc.plan, replace(Rehearsal(), **{fields[option]: int(value)}), steps=2, warmup=1
        )
        assert reference_bytes(smaller.model, smaller.job) <= USABLE_MEMORY * gib * 2**30, hint


# --------------------------------------------------------------------------- the environment


_JUNK = st.one_of(
    st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=8),
    st.integers(-(10**30), 10**30).map(str),
)


@FAST
@given(value=_JUNK)
def test_plan_launcher_pid_from_anyone_is_ignored(value):
    """PLAN_LAUNCHER_PID (any value) and a PLAN_LAUNCHER not of the form PID:START do not make a
    command a worker."""
    from planner import _pdeath

    saved = dict(os.environ)
    try:
        os.environ["PLAN_LAUNCHER_PID"] = value
        os.environ.pop(_pdeath.LAUNCHER, None)
        assert not _pdeath.in_a_worker()
        if ":" not in value:
            os.environ[_pdeath.LAUNCHER] = value
            assert not _pdeath.in_a_worker()
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_a_worker_is_what_its_launcher_started(monkeypatch):
    from planner import _pdeath

    parent = os.getppid()
    monkeypatch.setenv(_pdeath.LAUNCHER, f"{parent}:{_pdeath.start_time(parent)}")
    assert _pdeath.in_a_worker()  # the named process is alive and is this one's parent
    monkeypatch.setenv(_pdeath.LAUNCHER, f"1:{_pdeath.start_time(1)}")
    assert not _pdeath.in_a_worker() or parent == 1  # alive, not the parent: started below a worker


@pytest.mark.slow
@pytest.mark.parametrize(
    "env",
    [{"PLAN_LAUNCHER_PID": "12345"}, {"PLAN_LAUNCHER_PID": "abc"}, {"PLAN_LAUNCHER": "12345"}, {"SLURM_NTASKS": "two"}],
)
def test_stray_launcher_variables_leave_commands_alone(tmp_path, env):
    r = subprocess.run(
        [sys.executable, "-m", "planner.cli.main", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )
    assert r.returncode == 0 and r.stderr == "", r.stderr


_SLURM = {"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
_TORCHRUN = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


@FAST
@given(
    name=st.sampled_from(
        ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT", "MASTER_ADDR", "SLURM_NTASKS"]
    ),
    value=_JUNK,
)
def test_an_enclosing_launchers_variables_are_checked_first(plans, name, value):
    env = dict(_SLURM, SLURM_NTASKS="2") if name == "SLURM_NTASKS" else dict(_TORCHRUN)
    env[name] = value
    if name != "SLURM_NTASKS" and enclosing_problem(env) is None:
        return  # a value torch can start from
    if name == "SLURM_NTASKS" and value.isascii() and value.isdigit():
        return
    saved = dict(os.environ)
    try:
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
            os.environ.pop(k, None)
        os.environ.update(env)
        for command in (["run", "small.json"], ["profile", "-o", "p.json"]):
            assert name.split("_")[0] in _refused(plans, command)
    finally:
        os.environ.clear()
        os.environ.update(saved)


# --------------------------------------------------------------------------- signals and leftovers


@pytest.mark.slow
def test_sigterm_while_loading_is_one_line_and_143(plans):
    for wait_s in (0.3, 0.8):
        p = subprocess.Popen(
            [sys.executable, "-m", "planner.cli.main", "run", "small.json"],
            cwd=plans,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(wait_s)
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
        assert p.returncode == 143 and err == "error: interrupted by SIGTERM\n", (wait_s, p.returncode, err)


def test_sigterm_after_the_work_keeps_the_output_and_says_so():
    """After a command's own handlers are gone (its report printed, the interpreter exiting)."""
    code = (
        "from planner._pdeath import end_in_one_line; end_in_one_line(); import os, signal, time; print('report'); "
        "os.kill(os.getpid(), signal.SIGTERM); time.sleep(10)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert (r.returncode, r.stdout, r.stderr) == (143, "report\n", "error: interrupted by SIGTERM\n")


@pytest.mark.slow
def test_a_worker_keeps_the_default_sigterm():
    """A spawned worker imports the launcher's main module (planner/cli/main.py) again; its
    launcher stops it with SIGTERM, which must end it silently (no "error:" line of its own)."""
    from planner import _pdeath

    env = {
        **os.environ,
        _pdeath.LAUNCHER: f"{os.getpid()}:{_pdeath.start_time(os.getpid())}",
    }  # this process: its parent
    code = "import signal, planner.cli.main; print(signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert r.stdout == "True\n", r.stderr


def test_the_reaper_removes_a_killed_launchers_files(tmp_path):
    """A process that holds a Reaper and dies by SIGKILL: its directory and file go within a
    second; one that closes it normally keeps them (its own to remove or keep)."""
    for kill in (True, False):
        d, f = tmp_path / f"plan-launch-{kill}", tmp_path / f"plan-run-{kill}.progress"
        d.mkdir()
        (d / "rank0.log").write_text("log")
        f.write_text("1/2")
        code = (
            f"import os, signal; from planner.distributed.launch import Reaper; r = Reaper(({str(d)!r}, {str(f)!r})); "
            + ("os.kill(os.getpid(), signal.SIGKILL)" if kill else "r.close()")
        )
        subprocess.run([sys.executable, "-c", code], timeout=30)
        deadline = time.time() + 5
        while kill and (d.exists() or f.exists()) and time.time() < deadline:
            time.sleep(0.05)
        assert d.exists() != kill and f.exists() != kill, kill


def test_nothing_here_writes_json_to_stdout_on_refusal(plans):
    """A refused run with --json prints nothing on stdout (only the line on stderr)."""
    from click.testing import CliRunner

    from planner.cli.main import cli

    cwd = os.getcwd()
    os.chdir(plans)
    try:
        r = CliRunner().invoke(cli, ["run", "small.json", "--json", "--seed", "-1"])
    finally:
        os.chdir(cwd)
    assert r.exit_code == 2 and r.stdout == "" and json.dumps(r.stderr).count("error:") == 1
