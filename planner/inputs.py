"""A request's values (GPUs, job, layout, --fix, a what-if) turned into checked specs.

The one place `plan estimate`, `plan solve` and the Python API (planner/api.py) build a
JobSpec, a Plan, a what-if of a plan file and a search space; a mistake is a UsageError in
one line naming the command-line option (`--global-batch`) that the API keyword of the same
name (`global_batch`) sets. Nothing here reads a file, prints or exits.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from dataclasses import fields as dataclass_fields
from typing import Any, Mapping, Optional, Sequence, TypedDict, Union

from pydantic import ValidationError

from cost_models.terms import MODES
from planner import specs
from planner.datafile import short_text
from planner.errors import UsageError
from planner.numerals import whole_number, whole_numbers
from planner.search.candidates import FIX_KEYS, SearchSpace
from planner.stacks import STACKS, validate_plan
from planner.specs import (
    MESH_AXES,
    Axis,
    ClusterSpec,
    JobSpec,
    ModelSpec,
    Plan,
    PlanError,
    DType,
    LossKernel,
    Optimizer,
    Recompute,
    Schedule,
    seq_problem,
    Target,
)
from planner.specs.job import STACK_FEATURES, ep_problem, tp_problem, world_size_problem

# Bounds on what is physically meaningful (GPUs, sequences per step, tokens), the same for
# options as for documents (planner/specs/base.py, where each is explained). Beyond them an input is a typo.
MAX_GPUS, MAX_GLOBAL_BATCH, MAX_SEQ_LEN = specs.MAX_GPUS, specs.MAX_GLOBAL_BATCH, specs.MAX_SEQ_LEN
# Without --seq-len a model trains at its maximum length, unless that is a long-context
# extension (Qwen2.5's 131,072, Llama 3.1's 131,072): then --seq-len is required.
DEFAULT_SEQ_LIMIT = 16384


def check_count(name: str, value: Optional[int], limit: int, what: str) -> None:
    """A positive count within `limit`, else a one-line usage error."""
    if value is None:
        return
    if value < 1:
        raise UsageError(f"{name} must be positive, got {value}")
    if value > limit:
        raise UsageError(f"{name} {value:,} is more than {limit:,} {what}; check the value")


def check_real(name: str, value: Optional[float], positive: bool = True) -> None:
    """A finite (positive) number, else a one-line usage error: nan and inf are refused."""
    if value is None:
        return
    if value != value or value in (float("inf"), float("-inf")):
        raise UsageError(f"{name} must be a finite number, got {value}")
    if positive and value <= 0:
        raise UsageError(f"{name} must be positive, got {value:g}")


def cluster_size(cluster: ClusterSpec, gpus: Optional[int], nodes: Optional[int], cluster_name: str) -> int:
    """The GPUs asked for (--gpus or --nodes), checked against the cluster."""
    if gpus is not None and nodes is not None:
        if gpus != nodes * cluster.gpus_per_node:
            raise UsageError(
                f"--gpus {gpus} disagrees with --nodes {nodes} x {cluster.gpus_per_node} GPUs per node = {nodes * cluster.gpus_per_node}; give one of them"
            )
    if gpus is None and nodes is None:
        raise UsageError("give the cluster size with --gpus N or --nodes N")
    if gpus is None:
        assert nodes is not None  # one of them is given (refused above otherwise)
        if nodes < 1:
            raise UsageError(f"--nodes must be at least 1, got {nodes}")
        gpus = nodes * cluster.gpus_per_node
    if gpus < 1:
        raise UsageError(f"--gpus must be at least 1, got {gpus}")
    if gpus > MAX_GPUS:
        raise UsageError(
            f"--gpus {gpus:,} is beyond any cluster ({MAX_GPUS:,} GPUs at most); give the GPUs you will train on"
        )
    check_profile_size(cluster, gpus, cluster_name)
    check_cluster_holds(cluster, gpus, "--gpus")
    return gpus


def check_cluster_holds(cluster: ClusterSpec, gpus: int, what: str) -> None:
    """`gpus` (named `what` in the message: --gpus, a document's num_gpus) is one node's share or
    whole nodes of `cluster`, and no more than its nodes hold."""
    if gpus > cluster.gpus_per_node and gpus % cluster.gpus_per_node:
        raise UsageError(
            f"{what} {gpus} is not a whole number of {cluster.name} nodes ({cluster.gpus_per_node} GPUs each); use a multiple of {cluster.gpus_per_node}"
        )
    if cluster.num_nodes is not None and gpus > cluster.num_nodes * cluster.gpus_per_node:
        raise UsageError(
            f"{cluster.name} has {cluster.num_nodes} nodes x {cluster.gpus_per_node} = {cluster.num_nodes * cluster.gpus_per_node} GPUs, "
            + (
                f"fewer than the {gpus} asked for"
                if what == "--gpus"
                else f"fewer than its {what} {gpus}; fix one of them"
            )
        )


def check_profile_size(cluster: ClusterSpec, gpus: int, where: str, backend: Optional[str] = None) -> None:
    """A measured profile plans for the world it measured: refuse another world size or backend."""
    m = cluster.measured
    if m is None:
        return
    env = m.environment
    if gpus != env.world_size:
        raise UsageError(
            f"{where} was measured on {env.world_size} ranks ({env.nnodes} node(s) x {env.nproc_per_node}), not {gpus}: "
            f"plan for --gpus {env.world_size}, or profile again with the world size you want"
        )
    if backend is not None and backend != env.backend:
        raise UsageError(
            f"{where} was measured with the {env.backend} backend, not {backend}: profile again with --backend {backend}"
        )


class JobOptions(TypedDict, total=False):
    """The job's keywords of the Python API (planner/api.py: estimate, what_if, solve), each the
    command-line option of the same name (`global_batch` is `--global-batch`; docs/glossary.md)."""

    global_batch: Optional[int]  # sequences per optimizer step
    seq_len: Optional[int]  # tokens per sequence [the model's maximum]
    precision: Optional[Union[DType, str]]  # [the model's]
    optimizer: Optional[Union[Optimizer, str]]  # [adam]
    flash_attention: Optional[bool]  # [True]
    target: Optional[Union[Target, str]]  # the stack that runs the plan [estimate: generic; solve: every stack]
    loss_kernel: Optional[Union[LossKernel, str]]  # [the stack's]
    moe_dispatcher: Optional[str]  # [alltoall]
    attention_kernel: Optional[str]  # [the stack's]
    grad_reduce_bf16: Optional[bool]  # [False]


class LayoutOptions(TypedDict, total=False):
    """A layout's keywords of estimate() and what_if(): Plan's fields (planner/specs/job.py:
    Layout) as `plan estimate` spells them (`zero` is zero_stage; docs/glossary.md). Left out
    (or None):
    dp the GPUs left by tp x pp x cp, the schedule interleaved with vpp > 1, the layers split
    as evenly as possible; the rest as the defaults below (estimate) or the plan's (what_if)."""

    tp: Optional[int]  # [1]
    pp: Optional[int]  # [1]
    dp: Optional[int]
    cp: Optional[int]  # [1]
    ep: Optional[int]  # [1]
    vpp: Optional[int]  # [1]
    micro_batch_size: Optional[int]  # [1]
    recompute: Optional[Union[Recompute, str]]  # [none]
    zero: Optional[int]  # [0]
    dp_shard: Optional[int]  # [all of dp: no replicas]
    sequence_parallel: Optional[bool]  # [False]
    fp8: Optional[bool]  # [False]
    tp_comm_overlap: Optional[bool]  # [False]
    recompute_norm_act: Optional[bool]  # [False]
    schedule: Optional[Union[Schedule, str]]
    layers_per_stage: Optional[Union[Sequence[int], str]]
    mesh_order: Optional[Union[Sequence[str], str]]  # [tp,dp,pp]


class WorldOptions(TypedDict, total=False):
    """How many GPUs: `gpus`, or `nodes` (x the cluster's GPUs per node)."""

    gpus: Optional[int]
    nodes: Optional[int]


class EstimateOptions(WorldOptions, JobOptions, LayoutOptions, total=False):
    """estimate()'s keywords (global_batch is required)."""


# estimate()'s layout where a keyword is left out (`plan estimate`'s option defaults)
LAYOUT_DEFAULTS: dict[str, Any] = {
    "tp": 1,
    "pp": 1,
    "dp": None,
    "cp": 1,
    "ep": 1,
    "vpp": 1,
    "micro_batch_size": 1,
    "recompute": "none",
    "zero": 0,
    "dp_shard": None,
    "sequence_parallel": False,
    "fp8": False,
    "tp_comm_overlap": False,
    "recompute_norm_act": False,
    "schedule": None,
    "layers_per_stage": None,
    "mesh_order": "tp,dp,pp",
}


def check_keywords(function: str, options: Mapping, allowed: type) -> None:
    """TypeError for a keyword `allowed` (a TypedDict) does not declare, as Python raises for a
    function's unknown keyword."""
    known = allowed.__required_keys__ | allowed.__optional_keys__  # type: ignore[attr-defined]
    for key in options:
        if key not in known:
            raise TypeError(f"{function}() got an unexpected keyword argument {key!r}")


def job_request(options: JobOptions, batch: Optional[int], target: str = "generic") -> JobRequest:
    """The JobRequest of the API's job keywords (among `options`, which may hold others), JobRequest's
    defaults where left out or None."""
    named = {f.name for f in dataclass_fields(JobRequest)} - {"global_batch_size"}  # `batch` is that
    given: dict[str, Any] = {k: v for k, v in options.items() if k in named and v is not None}
    return JobRequest(batch, **{"target": target, **given})


@dataclass(frozen=True)
class JobRequest:
    """The job as the API's keywords and the commands' options ask for it, named as JobSpec's
    fields, before make_job checks it and fills what is left out (seq_len: the model's; precision:
    the model's, or one the device has)."""

    global_batch_size: Optional[int]
    seq_len: Optional[int] = None
    precision: Optional[str] = None
    optimizer: str = "adam"
    flash_attention: bool = True
    target: str = "generic"
    loss_kernel: Optional[str] = None
    moe_dispatcher: str = "alltoall"
    attention_kernel: Optional[str] = None
    grad_reduce_bf16: bool = False

    @staticmethod
    def of(job: JobSpec) -> "JobRequest":
        """The request a job answers (its enums as their names)."""
        return JobRequest(
            **{
                f.name: getattr(getattr(job, f.name), "value", getattr(job, f.name))
                for f in dataclass_fields(JobRequest)
            }
        )


def make_job(model: ModelSpec, request: JobRequest, cluster: Optional[ClusterSpec] = None) -> JobSpec:
    """The JobSpec of a request, checked: UsageError naming the option to change."""
    global_batch, seq_len, precision = request.global_batch_size, request.seq_len, request.precision
    check_count("--global-batch", global_batch, MAX_GLOBAL_BATCH, "sequences per step")
    check_count("--seq-len", seq_len, MAX_SEQ_LEN, "tokens")
    if seq_len is None and model.max_seq_len > DEFAULT_SEQ_LIMIT:
        raise UsageError(
            f"{model.name} allows {model.max_seq_len:,} positions, more than a usual training length; give --seq-len "
            f"(e.g. --seq-len 4096 or 8192)"
        )
    seq = seq_len or model.max_seq_len
    problem = seq_problem(model, seq)  # the check Plan.validate_for makes, before any search
    if problem:
        raise UsageError(f"{problem}; give --seq-len {model.max_seq_len} or less")
    dtype = precision or model.param_dtype
    if cluster is not None:
        peaks = {k.value if hasattr(k, "value") else k for k in cluster.device.peak_tflops}
        name = dtype.value if hasattr(dtype, "value") else dtype
        if name not in peaks:
            if precision:
                raise UsageError(
                    f"{cluster.name} has no {name} throughput (it has {', '.join(sorted(peaks))}); pass --precision accordingly"
                )
            dtype = sorted(peaks)[0]  # e.g. a CPU profile measured in fp32
    # the names as given (strings): JobSpec's validation reads them into its enums or refuses them
    try:
        return JobSpec(**{**asdict(request), "seq_len": seq, "precision": dtype})
    except ValidationError as exc:
        raise UsageError(_first_error(exc)) from None


def make_plan(**fields) -> Plan:
    """Build a Plan from command-line values; a bad combination becomes a one-line UsageError."""
    try:
        return Plan(**fields)
    except ValidationError as exc:
        raise UsageError(_first_error(exc)) from None


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    msg = str(err["msg"]).removeprefix("Value error, ")
    loc = ".".join(str(p) for p in err["loc"])
    return f"{loc}: {msg}" if loc else msg


def check_plan(plan: Plan, model: ModelSpec, job: JobSpec, gpus: int, cluster: Optional[ClusterSpec] = None) -> None:
    """The one check of a layout against its model, job, GPUs and (given) the device, whether the
    layout is new (`plan estimate`, a what-if) or read from a document (check_document): the
    factors fit (Plan.validate_for), and the device has what the plan runs (its precision, FP8)."""
    try:
        validate_plan(plan, model, job, gpus)
    except PlanError as exc:
        raise UsageError(str(exc)) from None
    if cluster is None:
        return
    device = cluster.device
    if job.precision not in device.peak_tflops:
        have = ", ".join(sorted(getattr(k, "value", k) for k in device.peak_tflops))
        raise UsageError(
            f"{cluster.name} has no {job.precision.value} throughput (it has {have}); change the job's precision"
        )
    if plan.fp8 and device.fp8_peak_tflops is None:
        raise UsageError(
            f"fp8: {device.name} has no FP8 tensor cores ({specs.FP8_PARTS} do); drop fp8 or plan on a cluster with them"
        )


def check_document(doc, where: str = "") -> None:
    """What every command that reads a plan document checks before using it (`plan estimate
    --plan`, `show`, `export`, `run`, the API's read_plan / what_if / export_plan, all through
    planner/plan_file.py:read_plan_file or planner/api.py:_plan_input): the document as written
    is consistent, so no command re-derives what another refuses. `doc`: a PlanInput; `where`:
    the file, named before the message."""
    try:
        check_cluster_holds(doc.cluster, doc.num_gpus, "num_gpus")
        plan = doc.plan
        if world_size_problem(
            plan.dp, plan.cp, plan.tp, plan.pp, doc.num_gpus
        ):  # the document's count, not a cluster's
            product = plan.dp * plan.cp * plan.tp * plan.pp
            raise UsageError(
                f"num_gpus is {doc.num_gpus:,}, but the plan's layout (dp {plan.dp} x tp {plan.tp} x pp {plan.pp}"
                + (f" x cp {plan.cp}" if plan.cp > 1 else "")
                + f") runs on {product:,}; make them agree "
                "(re-create the plan with `plan solve -o`)"
            )
        check_plan(doc.plan, doc.model, doc.job, doc.num_gpus, doc.cluster)
    except UsageError as exc:
        raise UsageError(f"{where}: {exc}" if where else str(exc)) from None


def parse_int_list(text, what: str) -> Optional[list[int]]:
    """Comma-separated integers (or a list of them, as the API takes) as a list."""
    if text is None:
        return None
    if not isinstance(text, str):
        return list(text)  # Plan checks the items
    numbers = whole_numbers(text)  # ASCII digits only: '6,,6', '+6', '0_6', '٦' refused
    if numbers is None:
        raise UsageError(f"{what} must be comma-separated whole numbers, e.g. 5,6,6,5, got {text!r}")
    return numbers


def axis_names(items) -> Optional[list[str]]:
    """Axis names (or Axis members) as dp, tp and pp in some order, in any case; None where they
    are not (--mesh-order and --fix mesh_order both read with it)."""
    axes = [str(getattr(a, "value", a)).strip().lower() for a in items]
    return axes if sorted(axes) == sorted(a.value for a in MESH_AXES) else None


def mesh_axes(order) -> list[str]:
    """Mesh order as "tp,dp,pp" (the CLI's) or a sequence of axis names (the API's)."""
    items = order.split(",") if isinstance(order, str) else order
    axes = axis_names(items)
    if axes is None:
        shown = order if isinstance(order, str) else ",".join(str(getattr(a, "value", a)) for a in items)
        raise UsageError(
            f"--mesh-order {short_text(shown)!r}: give dp, tp and pp in some order, innermost (inside a node) first, "
            "e.g. tp,dp,pp"
        )
    return axes


# --------------------------------------------------------------------------- a new layout (plan estimate)


def check_degrees(given: dict) -> None:
    """Each layout number given (API keyword: value) is what its Plan field admits, checked
    before dp and the micro-batch count are computed from it (a tp of 0 divides by zero)."""
    for key, value in given.items():
        problem = None if value is None else specs.number_problem(Plan, PLAN_CHANGES.get(key, key), value)
        if problem:
            raise UsageError(f"--{key.replace('_', '-')}: {problem}")


def data_parallel(gpus: int, tp: int, pp: int, cp: int) -> int:
    """dp of `gpus` GPUs at these degrees; a UsageError naming them when they do not divide it."""
    if gpus % (tp * pp * cp):
        what, values = ("tp x pp x cp", f"{tp} x {pp} x {cp}") if cp > 1 else ("tp x pp", f"{tp} x {pp}")
        raise UsageError(
            f"{what} = {values} = {tp * pp * cp} does not divide the {gpus} GPUs; pick {what.replace(' x ', ' and ')} "
            f"whose product divides {gpus}"
        )
    return gpus // (tp * pp * cp)


def micro_batch_count(job: JobSpec, gpus: int, dp: int, tp: int, pp: int, cp: int, micro_batch_size: int) -> int:
    """The micro-batch count of a layout on `gpus` GPUs; a UsageError naming the degrees where they
    do not make the GPUs (first: they are the first thing to change), else the batch where dp x
    micro-batch does not divide it."""
    problem = world_size_problem(dp, cp, tp, pp, gpus)
    if problem:
        raise UsageError(problem)
    per = dp * micro_batch_size
    if job.global_batch_size % per:
        share = job.global_batch_size // dp if job.global_batch_size % dp == 0 else 0  # each replica's sequences
        smaller = max((m for m in range(1, min(micro_batch_size, share) + 1) if share % m == 0), default=None)
        ways = ([f"--micro-batch-size {smaller}"] if smaller else []) + (
            [f"a global batch that is a multiple of {per}"] if per <= MAX_GLOBAL_BATCH else []
        )
        raise UsageError(
            f"global batch {job.global_batch_size} is not divisible by dp x micro_batch_size = {dp} x {micro_batch_size} = {per}"
            + (f"; use {' or '.join(ways)}" if ways else "")
        )
    return job.global_batch_size // per


def new_layout(job: JobSpec, gpus: int, options: dict[str, Any]) -> Plan:
    """The Plan of `plan estimate`'s layout options (LayoutOptions, every key given: None where
    left out): dp from the GPUs left by tp x pp x cp unless given, the micro-batch count from the
    batch, the interleaved schedule with vpp > 1; the others taken as they are (recompute,
    zero, sequence_parallel, ...)."""
    fields = dict(options)
    zero_stage = fields.pop("zero")
    tp, pp, dp, cp, ep, vpp = (fields.pop(k) for k in ("tp", "pp", "dp", "cp", "ep", "vpp"))
    micro_batch_size, schedule = fields.pop("micro_batch_size"), fields.pop("schedule")
    layers_per_stage, mesh_order = fields.pop("layers_per_stage"), fields.pop("mesh_order")
    check_degrees(dict(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, vpp=vpp, micro_batch_size=micro_batch_size))
    check_degrees(dict(dp_shard=fields.get("dp_shard")))
    if dp is None:
        dp = data_parallel(gpus, tp, pp, cp)
    return make_plan(
        dp=dp,
        tp=tp,
        pp=pp,
        vpp=vpp,
        ep=ep,
        cp=cp,
        micro_batch_size=micro_batch_size,
        num_micro_batches=micro_batch_count(job, gpus, dp, tp, pp, cp, micro_batch_size),
        schedule=schedule or (Schedule.interleaved_1f1b if vpp > 1 else Schedule.one_f_one_b),
        layers_per_stage=parse_int_list(layers_per_stage, "--layers-per-stage"),
        mesh_order=mesh_axes(mesh_order),
        zero_stage=zero_stage,
        **fields,
    )


# --------------------------------------------------------------------------- a what-if (plan estimate --plan)

# Keywords of a what-if that change the job, and the JobSpec field each sets.
JOB_CHANGES = {
    "global_batch": "global_batch_size",
    "seq_len": "seq_len",
    "precision": "precision",
    "optimizer": "optimizer",
    "target": "target",
    "loss_kernel": "loss_kernel",
    "moe_dispatcher": "moe_dispatcher",
    "attention_kernel": "attention_kernel",
    "grad_reduce_bf16": "grad_reduce_bf16",
}
# ... that change the layout, and the Plan field each sets.
PLAN_CHANGES = {
    "tp": "tp",
    "pp": "pp",
    "dp": "dp",
    "ep": "ep",
    "cp": "cp",
    "fp8": "fp8",
    "vpp": "vpp",
    "micro_batch_size": "micro_batch_size",
    "recompute": "recompute",
    "zero": "zero_stage",
    "dp_shard": "dp_shard",
    "sequence_parallel": "sequence_parallel",
    "tp_comm_overlap": "tp_comm_overlap",
    "schedule": "schedule",
    "recompute_norm_act": "recompute_norm_act",
    "mesh_order": "mesh_order",
    "layers_per_stage": "layers_per_stage",
}


def what_if_job(model: ModelSpec, cluster: ClusterSpec, job: JobSpec, given: dict) -> tuple[JobSpec, list[str]]:
    """The job with the given JOB_CHANGES applied (checked as a new job is), and what changed."""
    updates = {field: given[key] for key, field in JOB_CHANGES.items() if key in given}
    if not updates:
        return job, []
    new_job = make_job(model, replace(JobRequest.of(job), **updates), cluster)

    def show(value) -> str:  # a job field left unset takes its stack's default (loss_kernel, attention_kernel)
        return "the stack's default" if value is None else _show(value)

    changes = [
        f"{k} {show(getattr(job, k))} -> {show(getattr(new_job, k))}"
        for k in updates
        if getattr(job, k) != getattr(new_job, k)
    ]
    return new_job, changes


def what_if_layout(plan: Plan, job: JobSpec, gpus: int, given: dict, world_given: bool) -> tuple[Plan, list[str]]:
    """`plan` with the given PLAN_CHANGES applied, for `job` on `gpus` GPUs, and what changed.
    Changing the GPUs, tp, pp, cp or the batch recomputes dp and the micro-batch count; a
    changed stage count drops the plan's layer split and per-stage recompute."""
    check_degrees({key: given[key] for key in PLAN_CHANGES if key in given})
    changes, fields = [], plan.model_dump()
    for key, field in PLAN_CHANGES.items():
        if key in given:
            value = given[key]
            if key == "mesh_order":
                value = mesh_axes(value)
            elif key == "layers_per_stage":
                value = parse_int_list(value, "--layers-per-stage")
            if fields[field] != value:
                changes.append(f"{field} {_show(fields[field])} -> {_show(value)}")
            fields[field] = value
    if fields["tp"] == 1 and "tp" in given:  # sequence parallelism and its overlap split over tp ranks
        for field in ("sequence_parallel", "tp_comm_overlap"):
            if fields[field] and field not in given:
                changes.append(f"{field} dropped (tp 1)")
                fields[field] = False
    if "target" in given:  # what only some stacks run, the plan's own where the new target has none
        for field in STACK_FEATURES:
            if fields[field] and field not in given and not getattr(STACKS[Target(job.target)], field):
                changes.append(f"{field} dropped ({Target(job.target).value} has none)")
                fields[field] = False
    if (world_given or given.keys() & {"tp", "pp", "cp"}) and "dp" not in given:
        fields["dp"] = data_parallel(gpus, fields["tp"], fields["pp"], fields["cp"])
    shard = fields.get("dp_shard")
    if (
        shard
        and "dp_shard" not in given
        and (fields["dp"] % shard or not fields["zero_stage"] or shard == fields["dp"])
    ):
        changes.append(f"dp_shard {shard} dropped (dp {fields['dp']}, zero {fields['zero_stage']}: one shard group)")
        fields["dp_shard"] = None
    fields["num_micro_batches"] = micro_batch_count(
        job, gpus, fields["dp"], fields["tp"], fields["pp"], fields["cp"], fields["micro_batch_size"]
    )
    if "vpp" in given and "schedule" not in given:
        schedule = Schedule.interleaved_1f1b if fields["vpp"] > 1 else Schedule.one_f_one_b
        if Schedule(fields["schedule"]) != schedule:
            changes.append(f"schedule {Schedule(fields['schedule']).value} -> {schedule.value} (vpp {fields['vpp']})")
        fields["schedule"] = schedule
    stages = fields["pp"] * fields["vpp"]
    for key in ("layers_per_stage", "stage_recompute"):
        if (
            fields.get(key) is not None
            and len(fields[key]) != stages
            and not (key == "layers_per_stage" and "layers_per_stage" in given)
        ):
            changes.append(f"{key} dropped ({len(fields[key])} stages -> {stages})")
            fields[key] = None
    if "recompute" in given:
        fields["stage_recompute"] = None
    elif fields.get("stage_recompute") is None and fields["recompute"] == "mixed":
        changes.append("recompute mixed -> none (the per-stage recompute was dropped; give --recompute to choose)")
        fields["recompute"] = "none"
    changes += [
        f"{k} {getattr(plan, k)} -> {fields[k]}" for k in ("dp", "num_micro_batches") if fields[k] != getattr(plan, k)
    ]
    return make_plan(**fields), changes


def _show(value) -> str:
    if isinstance(value, list):
        return ",".join(str(getattr(v, "value", v)) for v in value)
    return str(getattr(value, "value", value))


# --------------------------------------------------------------------------- a search space (plan solve)


def parse_fixes(fixes: tuple[str, ...]) -> tuple[dict, tuple]:
    fixed: dict[str, Any] = {}  # field -> its fixed value (an int, a bool, a tuple of Axis, a Schedule)
    modes: tuple[Recompute, ...] = MODES
    for item in fixes:
        key, sep, value = item.partition("=")
        if not sep or key not in FIX_KEYS:
            raise UsageError(
                f"--fix {short_text(item)!r}: expected KEY=VALUE with KEY one of {', '.join(sorted(FIX_KEYS))}"
            )
        field, kind = FIX_KEYS[key]
        before = fixed.get(field, modes if field == "recompute" and modes != MODES else None)
        try:
            if kind is int:
                n = whole_number(value)  # ASCII digits only: 'tp=+2', 'tp= 2' refused
                low, high = (0, 3) if field == "zero_stage" else (1, 2**20)
                if n is None or not low <= n <= high:
                    raise ValueError
                fixed[field] = n
            elif kind == "bool":
                if value.lower() not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
                    raise ValueError
                fixed[field] = value.lower() in ("true", "1", "yes", "on")
            elif kind == "axes":
                axes = axis_names(value.split(","))
                if axes is None:
                    raise ValueError
                fixed[field] = tuple(Axis(a) for a in axes)
            elif field == "schedule":
                fixed[field] = Schedule(value)
            else:
                if value == Recompute.mixed.value:
                    raise ValueError  # a mix is what the search decides; fix one mode
                modes = (Recompute(value),)
        except ValueError:
            allowed = (
                " (0 to 3)"
                if field == "zero_stage"
                else " (a whole number from 1 to 1,048,576)"
                if kind is int
                else " (true or false)"
                if kind == "bool"
                else " (dp, tp and pp in some order, e.g. tp,dp,pp)"
                if kind == "axes"
                else f" ({', '.join(x.value for x in Schedule)})"
                if field == "schedule"
                else f" ({', '.join(x.value for x in Recompute if x != Recompute.mixed)})"
            )
            raise UsageError(f"--fix {short_text(item)!r}: not a valid value for {key}{allowed}") from None
        after = fixed.get(field, modes if field == "recompute" else None)
        if before is not None and before != after:
            raise UsageError(f"--fix {short_text(item)!r} contradicts an earlier --fix of {key}; give each choice once")
    return fixed, modes


def refuse_model_fixes(model: ModelSpec, fixed: dict) -> None:
    """UsageError for a fixed degree that the model rules out on every layout: a tp its heads or
    FFN do not divide (specs tp_problem), an ep over a dense model or not dividing its experts
    (specs ep_problem, at a dp that carries any ep): said as such rather than as no layout found."""
    if fixed.get("tp", 1) > 1 and (why := tp_problem(model, fixed["tp"])):
        raise UsageError(f"--fix tp={fixed['tp']}: {why}; fix another tp or drop the fix")
    if fixed.get("ep", 1) > 1 and not model.is_moe:
        raise UsageError(f"--fix ep={fixed['ep']}: {model.name} has no experts (a dense model); drop the fix")
    if fixed.get("ep", 1) > 1 and (why := ep_problem(model, fixed["ep"], 1, fixed["ep"], True)):
        raise UsageError(f"--fix ep={fixed['ep']}: {why}; fix another ep or drop the fix")


def search_space(
    cluster: ClusterSpec,
    job: JobSpec,
    gpus: int,
    fixed: dict,
    modes: tuple,
    *,
    global_batch: Optional[int],
    micro_batch_size: Optional[int],
    micro_batches: Optional[int],
    allow_cross_node_tp: bool,
    fp8: bool,
) -> SearchSpace:
    """What `plan solve` searches: every layout of `gpus` GPUs less what --fix pins (`fixed`
    and the recompute `modes`, from parse_fixes)."""
    fixed_degrees = {k: fixed[k] for k in ("dp", "tp", "pp", "cp") if k in fixed}
    product = math.prod(fixed_degrees.values())
    if gpus % product:  # refused here, as `plan estimate` refuses it, not as "no layout" after the search
        named = " x ".join(f"{k} {v}" for k, v in fixed_degrees.items())
        what = f"{named} = {product:,}" if len(fixed_degrees) > 1 else f"{product:,}"
        raise UsageError(
            f"--fix {', '.join(f'{k}={v}' for k, v in fixed_degrees.items())}: {what} does not divide the "
            f"{gpus:,} GPUs; fix degrees whose product divides {gpus:,}"
        )
    if micro_batch_size is not None and micro_batch_size * (micro_batches or 1) > MAX_GLOBAL_BATCH:
        assert micro_batches is not None  # micro_batch_size alone is at most MAX_GLOBAL_BATCH (planner/api.py:solve)
        raise UsageError(
            f"--micro-batch-size {micro_batch_size} x --micro-batches {micro_batches} is "
            f"{micro_batch_size * micro_batches:,} sequences a replica, over the {MAX_GLOBAL_BATCH:,} a step may "
            "hold; give fewer micro-batches or a smaller micro-batch"
        )
    return SearchSpace(
        num_gpus=gpus,
        global_batch_size=global_batch,
        micro_batch_size=micro_batch_size,
        micro_batches=micro_batches,
        max_tp=gpus if allow_cross_node_tp else None,
        fixed=fixed,
        recompute_modes=modes,
        fp8=fp8_choices(fp8, fixed, cluster),
        cp_degrees=cp_degrees(job.seq_len, gpus, fixed.get("cp")),
        seq_len=job.seq_len,
    )


def fp8_choices(allowed: bool, fixed: dict, cluster: ClusterSpec) -> tuple:
    """FP8 GEMMs are a search choice only when asked for (`--fp8` or `--fix fp8=true`: they
    change the numerics) and the device has them."""
    want = allowed or fixed.get("fp8") is True
    if want and cluster.device.fp8_peak_tflops is None:
        flag = "--fp8" if allowed else "--fix fp8=true"
        raise UsageError(
            f"{flag}: {cluster.device.name} has no FP8 tensor cores ({specs.FP8_PARTS} do); drop it or plan on one of those"
        )
    return (False, True) if want else (False,)


# Context parallelism is searched for long sequences only: at 8,192 tokens or fewer the
# activations it divides are had as cheaply from TP with SP and recompute, and each CP rank
# should keep at least this many tokens of a sequence (Megatron's and torchtitan's long-context
# recipes shard 32k-128k sequences into chunks of 4k-16k).
CP_FROM_SEQ_LEN = 8192
CP_MIN_TOKENS_PER_RANK = 4096


def cp_degrees(seq_len: int, gpus: int, fixed: Optional[int]) -> tuple:
    """Context-parallel degrees the search tries: the fixed one, else 1 and, for sequences
    longer than CP_FROM_SEQ_LEN, each power of two up to the GPUs that leaves every rank at
    least CP_MIN_TOKENS_PER_RANK tokens in 2 x cp equal chunks."""
    if fixed is not None:
        return (fixed,)
    out, cp = [1], 2
    while (
        seq_len > CP_FROM_SEQ_LEN and cp <= gpus and seq_len // cp >= CP_MIN_TOKENS_PER_RANK and seq_len % (2 * cp) == 0
    ):
        out.append(cp)
        cp *= 2
    return tuple(out)
