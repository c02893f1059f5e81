"""`plan solve` stops when told (issue 19, item 4; planner/search/deadline.py).

- --time-limit is a wall-clock promise for the whole command: generated requests (seeded) over
  models with 10^5 layers, DeepSeek-V3 on 8,192 GPUs and other large searches, each with a limit
  of 0.2-2 s, end within the limit plus 1 s (plus the interpreter's start-up, measured here) with
  a plan and its gap, or one line saying no plan was found in the time.
- Ctrl-C, SIGTERM and SIGHUP at a random moment of a long search, a MILP included, end it within
  1.5 s: exit 130 / 143 / 129, exactly one line on stderr, no solver process left, no -o file, no
  temporary file.

Start-up allowance: `python -c "import planner.cli.main"` (the interpreter starting, importing
the CLI and exiting: about 1 s on an idle 2-core machine, 2-4 s under load) is timed just before
each timed run and added to its limit: the promise covers the command once it runs.
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from planner import api
from planner.errors import Interrupted
from planner.search.bounds import _kth_time_bisected, _kth_time_merged, _Rank
from planner.specs import Layout
from planner.search.candidates import CostTables
from planner.search.deadline import NO_DEADLINE, Deadline, stop_on_signals
from planner.search import ilp
from planner.search.ilp import attempt_candidate
from planner.search.solve import layouts_represented, layouts_represented_log10
from planner.specs import Axis, JobSpec, Schedule, memory_limit_gib

PROMISE_S = 1.0  # --time-limit plus this (issue 19)
STOP_S = 1.5  # a stop signal to exit (the interpreter's exit alone takes 0.3 s idle, 1.3 s at load 7 on 2 cores)
STOP_LINE_S = 1.0  # a stop signal to the error line: the search stopped
DEEP = {
    "name": "deep",
    "num_layers": 100_000,
    "hidden_size": 256,
    "num_heads": 4,
    "vocab_size": 1000,
    "max_seq_len": 512,
}


def startup_s() -> float:
    """The interpreter's start-up and exit with the CLI imported, measured just before the run
    it allows for (on this 2-core machine shared with other work it varies from 1 to 4 s)."""
    start = time.monotonic()
    subprocess.run([sys.executable, "-c", "import planner.cli.main"], check=True)
    return time.monotonic() - start


def _run(args: list[str], cwd: Path, seconds: float) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "planner.cli.main", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=seconds + 60,
        env={**os.environ, "COLUMNS": "100", "TMPDIR": str(cwd / "tmp")},
    )
    return r, time.monotonic() - start


# --------------------------------------------------------------------------- the layout count


@settings(max_examples=40, deadline=None)
@given(stages=st.integers(1, 40), layers=st.integers(1, 400), interleaved=st.booleans())
def test_the_layout_count_in_floating_point_is_the_exact_counts_logarithm(stages, layers, interleaved):
    """The search reports log10 of the layouts it covers without forming the count (10^5 digits
    for 10^5 layers, seconds per stage count as a bignum)."""
    equal = interleaved and layers % stages == 0
    exact = layouts_represented(stages, layers, equal)
    got = layouts_represented_log10(stages, layers, equal)
    assert got == -math.inf if exact == 0 else got == pytest.approx(math.log10(exact), abs=1e-9)


def test_the_layout_count_of_100000_layers_is_quick():
    start = time.perf_counter()
    got = layouts_represented_log10(4096, 100_000)
    assert time.perf_counter() - start < 0.5 and 10_000 < got < 100_000


_rank = st.builds(
    lambda K, c, q, rho, nmin, extra: _Rank(
        K, c, q, 0.0, rho, nmin, math.inf if extra is None else float(nmin + extra)
    ),
    K=st.floats(0, 1),
    c=st.floats(-1e9, 1e8),
    q=st.sampled_from([0.0, 1e3, 3.7e5]),
    rho=st.floats(0, 1e-6),
    nmin=st.integers(1, 4),
    extra=st.none() | st.integers(0, 3000),
)


@settings(max_examples=40, deadline=None)
@given(ranks=st.lists(_rank, min_size=1, max_size=8), a=st.floats(0, 1e-2), share=st.floats(0.01, 1))
def test_the_bisected_slowest_rank_time_is_the_merges(ranks, a, share):
    """bounds.py: for 10^5 layers the refined bound bisects on tau instead of merging the ranks'
    times on a heap (0.4 s a candidate); the value is the same float."""

    def time_at(rk, n):
        need = rk.c + rk.q * n
        return rk.K + a * n + (rk.rho * need if need > 0 else 0.0)

    room = sum(min(rk.nhi, 10**4) - rk.nmin for rk in ranks)
    assume(room >= 1)  # the caller's check: the ranks can hold the layers
    more = max(1, int(share * min(room, 20_000)))
    bisected = _kth_time_bisected(ranks, time_at, more, NO_DEADLINE)
    assert bisected is None or bisected == _kth_time_merged(ranks, time_at, more, NO_DEADLINE)


# --------------------------------------------------------------------------- --time-limit


def _request(rng: random.Random, directory: Path) -> list[str]:
    """A large search: 10^5 layers, DeepSeek-V3 on 8,192 H100s, GPT-3 on 16,384 A100s, Llama 3
    405B on 4,096 H200s; any target, either solver."""
    (directory / "deep.json").write_text(json.dumps(DEEP))
    gpus = rng.choice([512, 1024, 4096])
    model = rng.choice(
        [
            [
                "--model",
                "deep.json",
                "--cluster",
                "dgx-h100-80gb",
                "--gpus",
                str(gpus),
                "--global-batch",
                str(gpus),
                "--seq-len",
                "512",
            ],
            [
                "--model",
                "deepseek-v3",
                "--cluster",
                "dgx-h100-80gb",
                "--gpus",
                "8192",
                "--global-batch",
                "8192",
                "--seq-len",
                "4096",
            ],
            [
                "--model",
                "gpt3-175b",
                "--cluster",
                "dgx-a100-80gb",
                "--gpus",
                "16384",
                "--global-batch",
                "4096",
                "--seq-len",
                "2048",
            ],
            [
                "--model",
                "llama3-405b",
                "--cluster",
                "dgx-h200",
                "--gpus",
                "4096",
                "--global-batch",
                "2048",
                "--seq-len",
                "8192",
            ],
        ]
    )
    target = rng.choice([[], [], ["--target", "generic"], ["--target", "megatron"]])
    solver = ["--solver", "cbc"] if rng.random() < 0.25 else []
    return [*model, *target, *solver, "--time-limit", f"{rng.uniform(0.2, 2.0):.2f}"]


def _assert_answer_or_one_line(r: subprocess.CompletedProcess, args: list[str]) -> None:
    """Exit 0 with a plan (its gap stated when not proven), or one error line, exit 1."""
    if r.returncode == 0:
        doc = json.loads(r.stdout)
        assert doc["plan"]["dp"] * doc["plan"]["tp"] * doc["plan"]["pp"] > 0
        assert doc["search"]["optimal"] or 0 <= doc["search"]["optimality_gap"] <= 1, (
            args
        )  # 1: a search cut before any bound
    else:
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: "), (args, r.returncode, r.stderr)
        assert "Traceback" not in r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(5))
def test_a_time_limit_holds_for_the_whole_command(tmp_path, seed):
    rng = random.Random(seed)
    args = ["solve", *_request(rng, tmp_path), "--json", "-o", "plan.json"]
    (tmp_path / "tmp").mkdir()
    limit, allowance = float(args[args.index("--time-limit") + 1]), startup_s()
    r, took = _run(args, tmp_path, limit)
    assert took <= limit + PROMISE_S + allowance, (args, f"{took:.2f} s", f"start-up {allowance:.2f} s")
    _assert_answer_or_one_line(r, args)
    assert (tmp_path / "plan.json").exists() == (r.returncode == 0)
    assert not any((tmp_path / "tmp").iterdir())  # no solver's temporary file left


@pytest.mark.slow
def test_the_issues_100000_layers_with_time_limit_5(tmp_path):
    """Issue 19: past 120 s before (the layout count as a bignum for every candidate)."""
    (tmp_path / "tmp").mkdir()
    (tmp_path / "deep.json").write_text(json.dumps(DEEP))
    args = [
        "solve",
        "--model",
        "deep.json",
        "--cluster",
        "dgx-h100-80gb",
        "--gpus",
        "1024",
        "--global-batch",
        "1024",
        "--seq-len",
        "512",
        "--time-limit",
        "5",
        "--json",
    ]
    allowance = startup_s()
    r, took = _run(args, tmp_path, 5.0)
    assert took <= 5.0 + PROMISE_S + allowance, (f"{took:.2f} s", f"start-up {allowance:.2f} s")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["plan"]["pp"] >= 1


# --------------------------------------------------------------------------- signals inside a MILP


def _hard_milp(monkeypatch):
    """DeepSeek-V3 on 8,192 H100s, dp 512 x tp 2 x pp 8, under a memory limit 6 GiB below the
    preset's: a MILP HiGHS does not prove in 10 s without the ranks' integer floors
    (planner/search/bounds.py:rank_time_floors, issue 22: the slowest rank's row and each rank's
    rows): the tests run it without them. (At the preset's own limit it became a 1 s MILP once a
    Megatron MoE layer's kernels were counted per local expert, and at 4 GiB below once its
    multi-head latent attention was: how hard a MILP is moves with the cost tables, so the limit
    is chosen to keep this one hard: 20 s and more here, where 5 and 7 GiB below take 5.5 and 0.2 s.)"""
    monkeypatch.setattr(ilp, "rank_time_floors", lambda *args, **kwargs: None)
    model, cluster = api.load_model("deepseek-v3"), api.load_cluster("dgx-h100-80gb")
    cand = Layout(
        dp=512,
        tp=2,
        pp=8,
        vpp=1,
        micro_batch_size=1,
        num_micro_batches=16,
        schedule=Schedule.one_f_one_b,
        zero_stage=1,
        sequence_parallel=True,
        mesh_order=(Axis.tp, Axis.dp, Axis.pp),
        ep=8,
    )
    pc = CostTables(model, cluster, JobSpec(global_batch_size=8192, seq_len=4096)).pipeline(cand)
    return cand, pc, memory_limit_gib(cluster) - 6.0


def _children() -> set[int]:
    """This process's children: what a test started before the MILP (a launcher's resource
    tracker, say) is left out by comparing with the set taken at its start."""
    return {int(p) for t in Path("/proc/self/task").glob("*/children") for p in t.read_text().split()}


@pytest.mark.slow
@pytest.mark.parametrize("solver,sig", [("highs", signal.SIGTERM), ("cbc", signal.SIGHUP), ("highs", signal.SIGINT)])
def test_a_signal_stops_a_running_milp(solver, sig, monkeypatch):
    """The issue's case: Ctrl-C was not seen until the MILP ended (150 s and more)."""
    cand, pc, limit = _hard_milp(monkeypatch)
    before = _children()  # children of earlier tests, alive whatever the MILP does
    sent = []
    seen = set()

    def send():
        seen.update(_children() - before)
        sent.append(time.monotonic())
        os.kill(os.getpid(), sig)

    timer = threading.Timer(1.0, send)
    try:  # a MILP that ends first must not leave the signal to land in pytest later
        with pytest.raises(Interrupted) as caught, stop_on_signals():
            timer.start()
            attempt_candidate(cand, pc, limit, solver, 60.0)
    finally:
        timer.cancel()
    took = time.monotonic() - sent[0]
    assert caught.value.exit_code == 128 + sig and took < STOP_S, f"{took:.2f} s"
    assert (solver == "cbc") == bool(seen)  # CBC was running, and is gone
    assert not (seen & _children()) and not any(Path(f"/proc/{pid}").exists() and _is_running(pid) for pid in seen)


@pytest.mark.slow
def test_ctrl_c_inside_a_milp_reaches_a_python_caller(monkeypatch):
    """planner.api users have Python's own Ctrl-C: raised inside HiGHS's callback it would be
    swallowed (the run reported unsolved, the search going on); it comes out as KeyboardInterrupt."""
    cand, pc, limit = _hard_milp(monkeypatch)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    timer = threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    start = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            attempt_candidate(cand, pc, limit, "highs", 60.0)
    finally:
        timer.cancel()
    assert time.monotonic() - start < 1.0 + STOP_S
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def _is_running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] not in ("Z", "X")
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("solver", ["highs", "cbc"])
def test_the_deadline_stops_a_running_milp(solver, monkeypatch):
    cand, pc, limit = _hard_milp(monkeypatch)
    before = _children()  # children of earlier tests, alive whatever the MILP does
    start = time.monotonic()
    sol = attempt_candidate(cand, pc, limit, solver, deadline=Deadline.after(1.0)).solution
    assert time.monotonic() - start < 1.0 + 0.5
    assert sol is None or not sol.proven
    assert not _children() - before


# --------------------------------------------------------------------------- signals at random moments


@pytest.mark.slow
@pytest.mark.parametrize("sig,solver", [(signal.SIGINT, "highs"), (signal.SIGTERM, "cbc"), (signal.SIGHUP, "highs")])
def test_a_signal_at_a_random_moment_stops_a_long_search(tmp_path, sig, solver):
    """A signal 0.3-3 s into the search, after the interpreter's start-up (timed just before;
    a signal while it is still loading is planner/cli/main.py's part): in the enumeration, the
    bounds or a MILP."""
    delay = startup_s() + random.Random(f"signal {int(sig)}").uniform(0.3, 3.0)
    (tmp_path / "tmp").mkdir()
    # searches that last well past the latest signal (3 s + start-up) with each solver: BLOOM 176B on
    # 2,240 H100 with 30 alternatives, ~52 s on this machine with HiGHS, more than 20 s with CBC (the
    # searches used before closed within 2-4 s once issue 22's floors and symmetry rows came, and
    # CBC's without alternatives within 2.5 s once issue 43's constants came)
    job = [
        "--model",
        "bloom-176b",
        "--cluster",
        "dgx-h100-80gb",
        "--gpus",
        "2240",
        "--global-batch",
        "8192",
        "--seq-len",
        "2048",
    ]
    args = [
        "solve",
        *job,
        "--target",
        "generic",
        "--solver",
        solver,
        "--top-k",
        "30",
        "-o",
        "plan.json",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "planner.cli.main", *args],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp_path / "tmp")},
    )
    try:
        time.sleep(delay)
        kids = {int(p) for t in Path(f"/proc/{proc.pid}/task").glob("*/children") for p in t.read_text().split()}
        sent = time.monotonic()
        proc.send_signal(sig)
        first = proc.stderr.readline()
        said = time.monotonic() - sent  # the search stopped; the interpreter's own exit follows
        out, err = proc.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + sig and said < STOP_LINE_S and took < STOP_S, (
        sig,
        solver,
        proc.returncode,
        f"{said:.2f} s",
        f"{took:.2f} s",
        first + err,
    )
    assert first.startswith("error: interrupted") and not err.strip(), first + err
    assert not any(_is_running(pid) for pid in kids), kids  # no CBC left behind
    assert not (tmp_path / "plan.json").exists() and not any((tmp_path / "tmp").iterdir())
