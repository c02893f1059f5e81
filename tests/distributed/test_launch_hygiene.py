"""What `plan run` and `plan profile` leave around them (gloo on CPU, 2 processes, every
subprocess time-bounded): workers import nothing from the current directory, one machine
listens on loopback only, SIGTERM stops everything and leaves no process and no temporary
file, and progress goes to stderr only when it is a terminal.

The command runs the way the `plan` console script runs it (a script whose directory, not
the current one, is first on sys.path), from a directory where `multiprocessing/`, `torch/`
and `planner/` would each leave a mark if imported. TMPDIR is a fresh directory, to see that
nothing is left in it. Processes are found by a marker in their environment (/proc/PID/environ).
"""

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import planner
from hardware_profiles import load_cluster
from planner.specs import JobSpec, ModelSpec, Plan

pytestmark = pytest.mark.distributed
pytest.importorskip("torch")

REPO = Path(planner.__file__).resolve().parents[1]
LAUNCH_TIMEOUT = 240  # seconds for one subprocess (start-up ~10 s on two busy cores)
PG_TIMEOUT = "30"  # process-group timeout inside the workers
STOP_WITHIN_S = 5.0  # from SIGTERM to the launcher's exit

MODEL = ModelSpec(
    name="tiny-gpt",
    num_layers=2,
    hidden_size=32,
    num_heads=2,
    vocab_size=128,
    max_seq_len=16,
    param_dtype="fp32",
    dropout=False,
)
JOB = JobSpec(global_batch_size=4, seq_len=16, precision="fp32")
PLAN = Plan(dp=2, tp=1, pp=1, micro_batch_size=2, num_micro_batches=1)
SHADOWED = ("multiprocessing", "torch", "planner")
USER_MODEL = """
import os
import torch.nn as nn

if os.environ.get("LOCAL_RANK") is not None:  # imported by a worker
    open(f"imported-by-worker-{os.getpid()}", "w").close()


def build():
    model = nn.Module()
    model.layers = nn.ModuleList([nn.Linear(768, 768)])
    return model
"""


@pytest.fixture
def place(tmp_path):
    """(launcher script, working directory full of shadows, empty TMPDIR)."""
    script = tmp_path / "bin" / "plan"
    script.parent.mkdir()
    script.write_text(
        "import sys\nfrom planner.cli.main import main\n\nif __name__ == '__main__':\n    sys.exit(main())\n"
    )
    cwd = tmp_path / "cwd"
    for name in SHADOWED:
        (cwd / name).mkdir(parents=True)
        (cwd / name / "__init__.py").write_text(
            "import os\n"
            f"open(os.path.join({str(cwd)!r}, 'SHADOW-{name}-IMPORTED'), 'w').close()\n"
            f"raise ImportError('the {name} of the current directory was imported')\n"
        )
    doc = {
        "schema_version": "1.0",
        "model": json.loads(MODEL.model_dump_json()),
        "cluster": json.loads(load_cluster("dgx-a100-80gb").model_dump_json()),
        "num_gpus": PLAN.world_size,
        "job": json.loads(JOB.model_dump_json()),
        "plan": json.loads(PLAN.model_dump_json()),
    }
    (cwd / "plan.json").write_text(json.dumps(doc))
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    return script, cwd, tmp


def _env(marker: str, tmp: Path, **extra) -> dict:
    env = dict(os.environ, PLAN_RUN_TEST_MARKER=marker, TMPDIR=str(tmp), **extra)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    for name in ("RANK", "PYTHONSAFEPATH", "GLOO_SOCKET_IFNAME"):  # nothing that would hide the point
        env.pop(name, None)
    return env


def _processes_with(marker: str) -> list[int]:
    needle = f"PLAN_RUN_TEST_MARKER={marker}".encode()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if needle in Path(f"/proc/{pid}/environ").read_bytes():
                found.append(int(pid))
        except OSError:
            continue
    return found


def _wait_for(condition, proc: subprocess.Popen, timeout_s: float = 90.0) -> None:
    deadline = time.time() + timeout_s
    while not condition():
        if proc.poll() is not None:
            pytest.fail(f"the command ended first (exit {proc.returncode}): {proc.stderr.read()[-3000:]}")
        assert time.time() < deadline, "timed out waiting for the run to get going"
        time.sleep(0.1)


def _nothing_left(marker: str, cwd: Path, tmp: Path, grace_s: float = 3.0) -> None:
    deadline = time.time() + grace_s
    while _processes_with(marker) and time.time() < deadline:
        time.sleep(0.1)
    assert _processes_with(marker) == [], "processes of the run were left behind"
    # torchinductor_<user> is torch's compilation cache, meant to outlive a run
    assert [p.name for p in tmp.iterdir() if not p.name.startswith("torchinductor_")] == [], "temporary files were left"
    assert not list(cwd.glob("SHADOW-*")), "a worker imported a package from the current directory"


def _listening(pids: list[int]) -> dict[int, list[str]]:
    """{pid: local addresses of its listening TCP sockets} from /proc/net/tcp{,6}."""
    listen = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            if fields[3] == "0A":  # TCP_LISTEN
                listen[fields[9]] = fields[1]
    out: dict[int, list[str]] = {}
    for pid in pids:
        try:
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            continue
        inodes = [link[len("socket:[") : -1] for link in links if link.startswith("socket:[")]
        out[pid] = [listen[i] for i in inodes if i in listen]
    return out


def _loopback(address: str) -> bool:
    """127.x.x.x, ::1 or ::ffff:127.x.x.x in /proc/net's hex notation."""
    host = address.split(":")[0]
    if len(host) == 8:
        return host.endswith("7F")  # little-endian IPv4: 127 is the last byte
    return (
        host == "00000000000000000000000001000000"
        or host.startswith("0000000000000000FFFF0000")
        and host.endswith("7F")
    )


def test_workers_import_nothing_from_the_current_directory(place):
    """From a directory holding `multiprocessing/`, `torch/` and `planner/` packages, a run
    succeeds and none of them is imported: not by the spawn bootstrap of the workers (which
    imports `multiprocessing` before any of our code), nor by the resource tracker, nor by
    the workers' own imports."""
    script, cwd, tmp = place
    marker = uuid.uuid4().hex
    res = subprocess.run(
        [
            sys.executable,
            str(script),
            "run",
            "plan.json",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--json",
            "--timeout",
            PG_TIMEOUT,
        ],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=LAUNCH_TIMEOUT,
        env=_env(marker, tmp),
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads(res.stdout)["verdict"] == "pass"
    _nothing_left(marker, cwd, tmp)


def test_one_machine_listens_on_loopback_only_and_sigterm_stops_the_run(place):
    """A single-node `plan run`: every listening socket of the launcher (the rendezvous
    store, the workers' store) and of the workers (gloo) is on 127.0.0.1. Then SIGTERM to
    the whole process group (as systemd or a container runtime sends it): exit 143 within
    seconds with one line, no process and no temporary file left."""
    script, cwd, tmp = place
    marker = uuid.uuid4().hex
    env = _env(marker, tmp, PLAN_RUN_FAIL_RANK="1", PLAN_RUN_FAIL_MODE="hang")  # rank 1 hangs in step 1
    proc = subprocess.Popen(
        [sys.executable, str(script), "run", "plan.json", "--timeout", PG_TIMEOUT],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        # the launcher's two stores, then each worker's gloo listener
        _wait_for(lambda: sum(len(a) > 0 for a in _listening(_processes_with(marker)).values()) >= 3, proc)
        time.sleep(1.0)
        listening = _listening(_processes_with(marker))
        assert len(listening.get(proc.pid, [])) >= 2, listening  # the rendezvous store and the workers' store
        assert all(_loopback(a) for addresses in listening.values() for a in addresses), listening
        sent = time.time()
        os.killpg(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert time.time() - sent < STOP_WITHIN_S, err
    assert proc.returncode == 143, err
    *progress, last = err.strip().splitlines()  # progress lines on stderr (not a terminal: plain), then the error
    assert last == "error: interrupted by SIGTERM; all workers stopped" and out == "", err
    assert all(line.startswith("plan run: ") for line in progress), err
    _nothing_left(marker, cwd, tmp)


def test_sigterm_stops_plan_profile_and_leaves_nothing(place):
    """`kill PID` of `plan profile` while its workers measure a --model-factory module of the
    current directory (which the workers do import: the directory is searched last, for
    that module): exit 143 within seconds with one error line, no profile written, no
    worker or resource tracker left, nothing left in TMPDIR (logs, progress file,
    semaphores would warn), and no shadowing package imported."""
    script, cwd, tmp = place
    (cwd / "usermodel.py").write_text(USER_MODEL)
    marker = uuid.uuid4().hex
    out_path = cwd / "profile.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            str(script),
            "profile",
            "--model",
            "gpt2-124m",
            "--model-factory",
            "usermodel:build",
            "--nproc-per-node",
            "2",
            "--seq-len",
            "128",
            "-o",
            str(out_path),
        ],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(marker, tmp),
        start_new_session=True,
    )
    try:
        _wait_for(lambda: len(list(cwd.glob("imported-by-worker-*"))) == 2, proc)
        time.sleep(1.0)  # measuring
        sent = time.time()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert time.time() - sent < STOP_WITHIN_S, err
    assert proc.returncode == 143, err
    *progress, last = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert last == "error: interrupted by SIGTERM; all workers stopped", err
    assert progress[0].startswith("plan profile: estimate before starting: about "), err
    assert all(line.startswith("plan profile: ") for line in progress), err
    assert out == "" and not out_path.exists()
    _nothing_left(marker, cwd, tmp)


def test_plan_run_progress_goes_to_a_terminal_stderr_and_json_stdout_stays_clean(place):
    """With stderr on a terminal, `plan run --json` shows the steps of the distributed run
    and then the single-process reference run there; stdout is one JSON object."""
    script, cwd, tmp = place
    marker = uuid.uuid4().hex
    leader, follower = pty.openpty()
    stdout = script.parent.parent / "stdout.txt"  # a file: the terminal is read until the end, a pipe could fill
    with open(stdout, "w") as sink:
        proc = subprocess.Popen(
            [
                sys.executable,
                str(script),
                "run",
                "plan.json",
                "--steps",
                "3",
                "--warmup",
                "1",
                "--json",
                "--timeout",
                PG_TIMEOUT,
            ],
            cwd=cwd,
            stdout=sink,
            stderr=follower,
            env=_env(marker, tmp, TERM="xterm", COLUMNS="200"),
            start_new_session=True,
        )
    os.close(follower)
    terminal = b""
    deadline = time.time() + LAUNCH_TIMEOUT
    try:
        while time.time() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:  # EIO: every writer closed the terminal
                    break
                if not chunk:
                    break
                terminal += chunk
            elif proc.poll() is not None:
                break
        proc.wait(timeout=60)
    finally:
        os.close(leader)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    shown = terminal.decode(errors="replace")
    assert proc.returncode == 0, shown[-3000:]
    assert json.loads(stdout.read_text())["verdict"] == "pass"  # stdout holds one JSON object and nothing else
    assert "distributed run on 2 ranks, step" in shown and "3/3" in shown, shown[-3000:]
    assert "single-process reference run" in shown, shown[-3000:]
    assert "plan run: estimate before starting: about " in shown and "plan run: done in " in shown, shown[-3000:]
    _nothing_left(marker, cwd, tmp)
