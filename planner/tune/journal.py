"""The tune's journal: JSON lines, a header with the request, then one record per finished trial.

Each record is appended as one line in one write, flushed and fsync'ed before the tuner goes
on, so a trial that ended is on disk whatever happens next. A tuner killed in the middle of
a write leaves at most a torn last line: reading the journal again (`plan tune --resume`)
warns, cuts that line off, and continues; a trial that was running when the tuner stopped
has no record and is measured again. Damage anywhere but the last line is refused.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Callable, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from planner.datafile import read_input
from planner.errors import PlannerError, UsageError
from planner.specs import ClusterSpec, JobSpec, ModelSpec, Plan

JOURNAL_VERSION = 1
# The largest journal --resume reads: a header (a model and a cluster, each at most
# datafile.MAX_SPEC_BYTES) and tens of thousands of trials of a few kB each
MAX_JOURNAL_BYTES = 256 * 2**20


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())


class TuneHeader(_Record):
    """The first line: what is tuned, so that --resume needs nothing else."""

    kind: Literal["tune"] = "tune"
    version: int = Field(default=JOURNAL_VERSION, description="Journal format version.")
    model: ModelSpec = Field(description="The model searched.")
    cluster: ClusterSpec = Field(description="The prior: the cluster (preset or profile) the tune started from.")
    gpus: int = Field(strict=True, description="GPUs (ranks) of the slice every trial runs on.")  # not true, not 2.0
    solve: dict = Field(description="The search's keywords (planner.api.solve), JSON values only.")
    run: dict = Field(default_factory=dict, description="How trials run (the executor's settings).")
    started_at: str = Field(description="When the tune started, UTC ISO 8601.")

    @field_validator("version")
    @classmethod
    def _known_version(cls, v: int) -> int:
        if v != JOURNAL_VERSION:
            raise ValueError(f"journal version {v}: this planner reads version {JOURNAL_VERSION}")
        return v

    @field_validator("solve")
    @classmethod
    def _search_keywords(cls, v: dict) -> dict:
        problem = _solve_problem(v)
        if problem:
            raise ValueError(problem)
        return v


# The search's keywords a header may hold (planner/api.py:SolveOptions, less gpus and top_k,
# which the tune sets), each with the JSON kinds it takes: a damaged or hand-edited header is
# refused in one line, before the search sees a string where a count belongs.
# tests/unit/tune/test_tune.py checks these are SolveOptions' keys, so that one added there is added here.
_COUNT, _NUMBER, _TEXT, _FLAG = (int,), (int, float), (str,), (bool,)
SOLVE_KEYWORDS = {
    "global_batch": _COUNT,
    "micro_batch_size": _COUNT,
    "micro_batches": _COUNT,
    "seq_len": _COUNT,
    "nodes": _COUNT,
    "max_memory_gib": _NUMBER,
    "time_limit": _NUMBER,
    "target": _TEXT,
    "precision": _TEXT,
    "optimizer": _TEXT,
    "loss_kernel": _TEXT,
    "moe_dispatcher": _TEXT,
    "attention_kernel": _TEXT,
    "solver": _TEXT,
    "allow_cross_node_tp": _FLAG,
    "fp8": _FLAG,
    "flash_attention": _FLAG,
    "grad_reduce_bf16": _FLAG,
    "fixes": (list,),
}


def _solve_problem(solve: dict) -> Optional[str]:
    """What is wrong with a header's search keywords, or None."""
    for key, value in solve.items():
        kinds = SOLVE_KEYWORDS.get(key)
        if kinds is None:
            return f"unknown search option {key!r}"
        if value is None:
            continue
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
            return f"{key} is {value!r}"
        if isinstance(value, float) and not math.isfinite(value):
            return f"{key} is {value!r}"
        if key == "fixes" and isinstance(value, list) and not all(isinstance(x, str) for x in value):
            return f"fixes holds {value!r}, not CHOICE=VALUE strings"
    return None


class Ran(_Record):
    """What a trial actually ran (after the executor's --scale-* / rehearsal changes): the
    refit predicts this, not the layout as searched."""

    model: ModelSpec
    job: JobSpec
    plan: Plan
    num_gpus: int


class TrialRecord(_Record):
    """One finished trial."""

    kind: Literal["trial"] = "trial"
    index: int = Field(description="0, 1, ... in the order run.")
    key: str = Field(description="The layout's identity (planner/tune/loop.py:layout_key).")
    label: str = Field(description="The layout in a few words.")
    plan: Plan = Field(description="The layout as the search returned it.")
    job: JobSpec = Field(description="Its job (the batch differs between layouts only when the micro-batch is fixed).")
    why: str = Field(description="Why it was chosen (the choice rule's reason).")
    predicted_s: float = Field(description="Its predicted step time when chosen.")
    interval_s: list[float] = Field(description="Its predicted interval when chosen, [low, high], seconds.")
    predicted_peak_gib: float = Field(description="Its predicted peak memory per rank when chosen, GiB.")
    status: Literal["ok", "oom", "failed", "timeout"] = Field(
        description="ok: measured; oom: out of memory; failed; timeout."
    )
    step_time_s: Optional[float] = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="Measured step time: the slowest rank's per step, median over the timed steps.",
    )
    steps_s: list[float] = Field(
        default_factory=list,
        max_length=100_000,
        description="Every timed step (after warm-up), the slowest rank's time, seconds, in order.",
    )
    repeat_of: Optional[int] = Field(
        default=None,
        ge=0,
        description="A repeat: the index of this layout's first trial (the tune measures a layout again to "
        "tell it from a close contender and to measure the noise).",
    )
    peak_memory_gib: Optional[float] = Field(
        default=None, ge=0, allow_inf_nan=False, description="Measured peak memory, the largest of any rank, GiB."
    )
    detail: str = Field(default="", description="The failure's or the out-of-memory's one line, or notes.")
    ran: Optional[Ran] = Field(
        default=None, description="What ran, where it differs from the search's (scaled); None: as searched."
    )
    wall_s: float = Field(ge=0, allow_inf_nan=False, description="Wall time of the trial, seconds.")
    finished_at: str = Field(description="When it ended, UTC ISO 8601.")

    @field_validator("steps_s")
    @classmethod
    def _positive_steps(cls, v: list[float]) -> list[float]:
        if not all(math.isfinite(x) and x > 0 for x in v):
            raise ValueError("every timed step is a positive number of seconds")
        return v

    @model_validator(mode="after")
    def _measured_when_ok(self) -> "TrialRecord":
        if self.status == "ok" and self.step_time_s is None:
            raise ValueError("a trial that ran (status ok) has its step time")
        if self.repeat_of is not None and self.repeat_of >= self.index:
            raise ValueError("a repeat names an earlier trial")
        return self


def append(path: Path, record: _Record) -> None:
    """Append one record as one line: one write, flushed and fsync'ed."""
    line = (record.model_dump_json() + "\n").encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise PlannerError(f"cannot write the journal {path}: {exc.strerror or exc}") from None


def check_new(path: Path) -> None:
    """A new journal's path: an existing file is refused (use --resume), never overwritten."""
    if path.exists():
        raise UsageError(f"the journal {path} exists: continue it with --resume {path}, or give another --journal")


def start(path: Path, header: TuneHeader) -> None:
    """A new journal holding the header (check_new first)."""
    check_new(path)
    append(path, header)


def read(
    path: Path,
    warn: Callable[[str], None],
    check: Callable[[TuneHeader], None] = lambda head: None,
) -> tuple[TuneHeader, list[TrialRecord]]:
    """The header and the finished trials. A torn last line (the tuner killed while writing
    it: no newline at its end) is cut off with a warning, once the header has passed `check`;
    anything else unreadable is refused in one line, the file left as it was."""
    data = read_input(path, MAX_JOURNAL_BYTES, "journal")  # a regular file only: no FIFO, no /dev/zero
    lines = data.split(b"\n")
    complete, tail = lines[:-1], lines[-1]  # tail: what follows the last newline ('' when whole)
    header: Optional[TuneHeader] = None
    trials: list[TrialRecord] = []
    for number, line in enumerate(complete, 1):
        record = _parse(line)
        if record is None or isinstance(record, TuneHeader) != (number == 1):
            if number == 1:
                why = _header_problem(line)
                raise UsageError(f"{path} is not a `plan tune` journal (its first line is no tune header{why})")
            raise UsageError(
                f"the journal {path} is damaged at line {number} (not a trial record); "
                "only a torn last line can be repaired"
            )
        if isinstance(record, TuneHeader):  # the first line's
            header = record
        else:
            trials.append(record)
    if header is None:
        raise UsageError(f"{path} is not a `plan tune` journal (it has no complete first line)")
    seen: dict[str, tuple[int, int]] = {}  # key: (line, index) of the layout's first trial
    for number, trial in enumerate(trials, 2):
        first = seen.get(trial.key)
        # a layout runs again only as a repeat naming its first trial: else the file was edited or spliced
        if (first is None) != (trial.repeat_of is None) or (first is not None and trial.repeat_of != first[1]):
            why = (
                f"holds layout {trial.label} twice (lines {first[0]} and {number}) without marking the second a repeat"
                if first is not None and trial.repeat_of is None
                else f"has a repeat at line {number} that names no earlier trial of its layout"
            )
            raise UsageError(f"the journal {path} {why}; it was edited or spliced")
        seen.setdefault(trial.key, (number, trial.index))
    check(header)
    if tail:  # every record ends with a newline in the same write: without one it was torn
        warn(
            f"the journal's last line was cut off (the tuner stopped while writing it); ignoring it: {len(tail)} bytes"
        )
        try:
            os.truncate(path, len(data) - len(tail))
        except OSError as exc:
            raise PlannerError(f"cannot repair the journal {path}: {exc.strerror or exc}") from None
    return header, trials


def _header_problem(line: bytes) -> str:
    """Why a first line that says it is a header is not one (': ...'), else ''."""
    try:
        obj = json.loads(line)
        if isinstance(obj, dict) and obj.get("kind") == "tune":
            TuneHeader.model_validate(obj)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first.get("loc", ()))
        return f": {where}: {first.get('msg', '')}".replace("Value error, ", "")
    except (ValueError, RecursionError):
        pass
    return ""


def _parse(line: bytes) -> Optional[TuneHeader | TrialRecord]:
    try:
        obj = json.loads(line)
        kind = obj.get("kind") if isinstance(obj, dict) else None
        if kind == "tune":
            return TuneHeader.model_validate(obj)
        if kind == "trial":
            return TrialRecord.model_validate(obj)
    except (ValueError, ValidationError, RecursionError):  # RecursionError: JSON nested past the parser's depth
        pass
    return None
