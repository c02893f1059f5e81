"""The real executor: each trial is `plan run` of the layout, as a user would run it.

One `plan run PLAN --json -o REPORT` per trial, in a session of its own: on this machine's
CPU or GPU ranks (its own elastic launch), or with `srun` (one task per rank; inside a Slurm
allocation, or asked for with launcher="srun"), MASTER_ADDR/MASTER_PORT exported as `plan
run` reads them in a Slurm step. `plan run` already verifies the steps against one process,
measures step time (the slowest rank's, every timed step: the trial keeps them all, and
their median is its step time) and memory per rank, and stops its workers cleanly on
SIGTERM; so this module only launches, waits, and reads the report:
- a trial that outlives `timeout_s` gets SIGTERM (its workers stopped by `plan run`), then
  SIGKILL after a grace, and is recorded as "timeout";
- the tuner interrupted (Ctrl-C, SIGTERM) does the same before it re-raises, and the child
  carries a parent-death signal (SIGTERM) so that even a tuner killed with SIGKILL leaves no
  `plan run` behind (its workers die with it: planner/_pdeath.py);
- out of memory: a rank's measured peak above `memory_limit_gib` (CPU ranks have no device
  allocator to fail; on CUDA the allocator's own error, "out of memory", counts too);
- anything else that ends without a report (a rank's exception, a refusal) is "failed" with
  `plan run`'s one line.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from cost_models.estimate import estimate as predict
from cost_models.memory import GIB
from planner.errors import UsageError
from planner.executor.runner import slowest_rank_steps
from planner.specs import PlanDocument, RunReport
from planner.tune.executors import Measurement, Trial
from planner.tune.journal import Ran

GRACE_S = 20.0  # after SIGTERM, how long `plan run` gets to stop its workers before SIGKILL
SCALES = ("layers", "hidden", "heads", "vocab", "seq_len")

# Sets a parent-death signal (SIGTERM) and then becomes `plan run`: a tuner that dies, even by
# SIGKILL, takes its trial with it. PR_SET_PDEATHSIG (1) survives execve; a parent gone before
# the call is caught by comparing the parent's pid.
_GUARD = (
    "import ctypes, os, sys; ctypes.CDLL(None, use_errno=True).prctl(1, 15, 0, 0, 0); "
    "os.getppid() == int(sys.argv[1]) or os._exit(143); os.execv(sys.executable, [sys.executable] + sys.argv[2:])"
)


def slurm_allocation() -> bool:
    """Inside a Slurm allocation (salloc / sbatch): trials are launched with srun."""
    return bool(os.environ.get("SLURM_JOB_ID"))


@dataclass
class RunExecutor:
    steps: int = 4  # training steps per trial, warm-up included
    warmup: int = 2
    timeout_s: float = 600.0  # per trial, wall clock
    memory_limit_gib: Optional[float] = None  # per rank; None: no limit beyond the machine's
    scale: dict = field(default_factory=dict)  # `plan run --scale-*`: {"layers": 2, "seq_len": 64, ...}
    launcher: str = "auto"  # "local", "srun", or "auto": srun inside a Slurm allocation
    process_group_timeout_s: float = 120.0
    workdir: Optional[Path] = None  # where plan files and reports go (default: a temporary directory)

    def __post_init__(self) -> None:
        unknown = set(self.scale) - set(SCALES)
        if unknown:
            raise UsageError(f"unknown scale {sorted(unknown)[0]!r}; give {', '.join(SCALES)}")
        if self.launcher not in ("auto", "local", "srun"):
            raise UsageError(f"--launcher {self.launcher}: give auto, local or srun")
        if self.uses_srun() and shutil.which("srun") is None:
            raise UsageError("--launcher srun: no `srun` on PATH (is Slurm installed here?); use --launcher local")

    def uses_srun(self) -> bool:
        return self.launcher == "srun" or (self.launcher == "auto" and slurm_allocation())

    def describe(self) -> dict:
        return {
            "executor": "plan run",
            "launcher": "srun" if self.uses_srun() else "local",
            "steps": self.steps,
            "warmup": self.warmup,
            "timeout_s": self.timeout_s,
            "memory_limit_gib": self.memory_limit_gib,
            "scale": dict(self.scale),
        }

    def measure(self, trial: Trial) -> Measurement:
        start = time.monotonic()
        directory = Path(tempfile.mkdtemp(prefix=f"plan-tune-{trial.index}-", dir=self.workdir))
        try:
            plan_path, report_path, log_path = directory / "plan.json", directory / "report.json", directory / "run.log"
            doc = PlanDocument(
                model=trial.model,
                cluster=trial.cluster,
                num_gpus=trial.num_gpus,
                job=trial.job,
                plan=trial.plan,
                estimate=predict(trial.model, trial.cluster, trial.job, trial.plan),
            )
            plan_path.write_text(doc.model_dump_json(indent=2))
            status = self._run(self._command(trial, plan_path, report_path), log_path)
            result = self._result(status, report_path, log_path, trial)
            return Measurement(**{**result, "wall_s": time.monotonic() - start})
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    def _command(self, trial: Trial, plan_path: Path, report_path: Path) -> list[str]:
        run = [
            sys.executable,
            "-m",
            "planner.cli.main",
            "run",
            str(plan_path),
            "--steps",
            str(self.steps),
            "--warmup",
            str(self.warmup),
            "--timeout",
            f"{self.process_group_timeout_s:g}",
            "-o",
            str(report_path),
        ]
        for name, value in self.scale.items():
            run += [f"--scale-{name.replace('_', '-')}", str(value)]
        if self.uses_srun():  # one task per rank; `plan run` maps SLURM_PROCID etc. to torch's variables
            return ["srun", "--ntasks", str(trial.num_gpus), "--export=ALL", "--kill-on-bad-exit=1"] + run
        return run + ["--nproc-per-node", str(trial.num_gpus), "--backend", "gloo" if self._cpu() else "auto"]

    @staticmethod
    def _cpu() -> bool:
        try:
            import torch

            return not torch.cuda.is_available()
        except ImportError:
            return True

    def _environment(self) -> dict:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # the tuner's own planner, wherever it came from
        if self.uses_srun():
            from planner.distributed.launch import free_port

            env.setdefault("MASTER_ADDR", "127.0.0.1" if not slurm_allocation() else _first_node())
            env["MASTER_PORT"] = str(free_port())
        return env

    def _run(self, command: list[str], log_path: Path) -> str:
        """Run to the end ("done") or the timeout ("timeout"); interrupted: stop it, re-raise."""
        with open(log_path, "wb") as log:
            child = subprocess.Popen(
                [sys.executable, "-c", _GUARD, str(os.getpid())] + _argv(command),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=self._environment(),
                start_new_session=True,
            )
            try:
                child.wait(timeout=self.timeout_s)
                return "done"
            except subprocess.TimeoutExpired:
                _stop(child)
                return "timeout"
            except BaseException:
                _stop(child)
                raise

    def _result(self, status: str, report_path: Path, log_path: Path, trial: Trial) -> dict:
        if status == "timeout":
            return {"status": "timeout", "detail": f"no result within {self.timeout_s:g} s; stopped"}
        last = _last_error(log_path)
        if not report_path.exists():
            kind = "oom" if "out of memory" in last.lower() else "failed"
            return {"status": kind, "detail": last or "plan run ended without a report"}
        report = RunReport.model_validate(json.loads(report_path.read_text()))
        peak = max(r.peak_memory_bytes for r in report.ranks) / GIB
        ran = Ran(model=report.model, job=report.job, plan=report.plan, num_gpus=trial.num_gpus)
        # every timed step of the slowest rank, and their median (the report's: runner.time_comparison)
        timing = {"step_time_s": report.time.measured_step_time_s, "steps_s": tuple(slowest_rank_steps(report.ranks))}
        if self.memory_limit_gib is not None and peak > self.memory_limit_gib:
            return {
                "status": "oom",
                "peak_memory_gib": peak,
                **timing,
                "ran": ran,
                "detail": f"a rank peaked at {peak:.4g} GiB, over the limit of {self.memory_limit_gib:.4g} GiB",
            }
        if not report.verification.passed:
            return {
                "status": "failed",
                **timing,
                "peak_memory_gib": peak,
                "ran": ran,
                "detail": f"verification failed: {report.verification.message}",
            }
        return {"status": "ok", **timing, "peak_memory_gib": peak, "ran": ran}


def _argv(command: list[str]) -> list[str]:
    """The guard execs the interpreter with these arguments: the command without its program
    when that is this interpreter, else the program run through `-c` exec (srun)."""
    if command[0] == sys.executable:
        return command[1:]
    return ["-c", "import os, sys; os.execvp(sys.argv[1], sys.argv[1:])"] + command


def _stop(child: subprocess.Popen) -> None:
    """SIGTERM to the trial's session (plan run stops its workers), SIGKILL after GRACE_S."""
    for sig, wait in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            return
        try:
            child.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _last_error(log_path: Path) -> str:
    """`plan run`'s one line ("error: ..."), or the log's last line."""
    try:
        lines = [line.strip() for line in log_path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    errors = [line for line in lines if line.startswith("error:")]
    return (errors[-1] if errors else lines[-1] if lines else "")[:300]


def _first_node() -> str:
    """The allocation's first host (rank 0 of every trial runs there)."""
    nodes = os.environ.get("SLURM_JOB_NODELIST", "")
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodes], capture_output=True, text=True, timeout=10)
        first = out.stdout.split()
        return first[0] if first else "127.0.0.1"
    except (OSError, subprocess.TimeoutExpired):
        return "127.0.0.1"
