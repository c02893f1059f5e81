"""Reading plan files (`plan solve -o`, `plan estimate --json`) back in: data only."""

from __future__ import annotations

from pathlib import Path

from planner.datafile import missing as no_file_at, parse_spec, read_mapping
from planner.errors import UsageError
from planner.inputs import check_document
from planner.specs import MAX_GPUS, SCHEMA_VERSION, ClusterSpec, Integer, JobSpec, ModelSpec, Plan
from pydantic import BaseModel, ConfigDict


class PlanInput(BaseModel):
    """The parts of a plan document a command needs; extra keys (estimate, alternatives,
    search) are ignored because they are outputs, recomputed on read."""

    model_config = ConfigDict(frozen=True, protected_namespaces=())
    model: ModelSpec
    cluster: ClusterSpec
    num_gpus: Integer(1, MAX_GPUS)  # type: ignore[valid-type]  # pydantic's bounded int (planner/specs/base.py)
    job: JobSpec
    plan: Plan


def read_plan_file(path: Path, alternative: int | None = None) -> PlanInput:
    """The plan of a plan document, or (`alternative` K >= 1) the K-th alternative of a
    `plan solve` document, with that alternative's global batch."""
    if no_file_at(path):
        raise UsageError(f"plan file {path} does not exist")
    data, text = read_mapping(path)
    raw = data.get("schema_version")
    if raw is not None and not isinstance(raw, str):  # 1.10 as a number reads 1.1
        raise UsageError(
            f'{path}: schema_version is {raw!r}, not a string; write it quoted, as "{SCHEMA_VERSION}" '
            "(a number cannot tell 1.1 from 1.10)"
        )
    version = raw or ""
    parts = ("model", "cluster", "num_gpus", "job", "plan")
    if not raw and any(data.get(k) is None for k in parts):  # a model, profile, export, size document...
        _not_a_plan(path, ["schema_version"] + [k for k in parts if data.get(k) is None])
    if version.split(".")[0] != SCHEMA_VERSION.split(".")[0]:
        shown = "(missing)" if raw is None else repr(version)
        raise UsageError(
            f"{path}: schema_version {shown} is not readable by this planner (schema {SCHEMA_VERSION}); re-create the plan"
        )
    fields = {k: data.get(k) for k in parts}
    if alternative is not None:
        alts = data.get("alternatives")
        if not isinstance(alts, list) or not alts:
            raise UsageError(f"{path}: has no alternatives (only `plan solve` documents do); drop --alternative")
        if not 1 <= alternative <= len(alts):
            raise UsageError(f"--alternative {alternative}: {path} has alternatives 1 to {len(alts)}")
        alt = alts[alternative - 1]
        if not isinstance(alt, dict) or not isinstance(fields["job"], dict):
            raise UsageError(f"{path}: alternative {alternative} is malformed")
        if alt.get("plan") is None:  # not "not a plan file": the document's own plan is there
            raise UsageError(f"{path}: alternative {alternative} is malformed: it has no plan")
        fields["plan"] = alt.get("plan")
        if alt.get("global_batch_size") is not None:
            fields["job"] = {**fields["job"], "global_batch_size": alt["global_batch_size"]}
        if alt.get("target") is not None:  # 1.6: the stack it was costed for (before: the document's)
            fields["job"] = {**fields["job"], "target": alt["target"]}
    if _older(version, (1, 3)) and isinstance(fields["plan"], dict) and fields["plan"].get("stage_recompute"):
        # before 1.3 `recompute` could contradict stage_recompute (which won): derive it again
        fields["plan"] = {k: v for k, v in fields["plan"].items() if k != "recompute"}
    missing = [k for k, v in fields.items() if v is None]
    if missing:
        _not_a_plan(path, missing)
    doc = parse_spec(PlanInput, fields, path, text)
    check_document(doc, str(path))  # one validation for every command that reads a plan (planner/inputs.py)
    return doc


def _not_a_plan(path: Path, missing: list[str]) -> None:
    raise UsageError(
        f"{path}: not a plan file, missing {', '.join(missing)} (plan files are what `plan solve -o` and "
        "`plan estimate -o` write)"
    )


def _older(version: str, than: tuple) -> bool:
    try:
        return tuple(int(x) for x in version.split(".")[:2]) < than
    except ValueError:
        return False
