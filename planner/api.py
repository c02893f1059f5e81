"""The Python API: what `plan estimate`, `plan solve` and `plan export` do, and plan files, as functions.

    import planner

    doc = planner.solve("llama3-8b", "dgx-h100-80gb", gpus=16, global_batch=64, seq_len=4096)
    print(doc.plan.tp, doc.plan.pp, doc.estimate.step_time_s)
    planner.write_plan(doc, "plan.json")  # what `plan solve ... -o plan.json` writes

The commands call these same functions (planner/cli/estimate.py, solve.py, export.py) and add
only option parsing, rendering and exit codes, so a result equals the document `--json` prints
for the same inputs (planner/specs/plan_document.py: PlanDocument, SolveDocument). Each keyword is the option
of the same name (`global_batch` is `--global-batch`). A model or cluster is a ModelSpec /
ClusterSpec, or what --model / --cluster take: a preset name (`plan presets`) or a file.

Errors are raised, never printed: UsageError for a malformed request (an unknown preset, a
layout whose factors do not divide the GPUs; the CLI's exit 2) and InfeasibleError when nothing
satisfies a well-formed one (no layout fits; exit 1), both PlannerError (planner/errors.py),
with the CLI's one-line message, which names options as the command line spells them. A plan
over its memory is no error: estimate() and what_if() return it with `estimate.fits` False
(how far over is what a user sizing a layout wants; `plan estimate` prints it, then exits 1).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

from typing_extensions import Unpack

from cost_models.estimate import estimate as cost_estimate
from hardware_profiles import load_cluster as load_cluster_named
from planner import stacks
from planner.datafile import write_atomic
from planner.errors import InfeasibleError, UsageError
from planner.inputs import (
    LAYOUT_DEFAULTS,
    MAX_GLOBAL_BATCH,
    EstimateOptions,
    JobOptions,
    LayoutOptions,
    WorldOptions,
    check_keywords,
    job_request,
    check_count,
    check_document,
    check_plan,
    check_real,
    cluster_size,
    make_job,
    new_layout,
    parse_fixes,
    refuse_model_fixes,
    search_space,
    what_if_job,
    what_if_layout,
)
from planner.plan_file import PlanInput, read_plan_file
from planner.presets import load_model as load_model_named
from planner.search.deadline import FIRST_PLAN_GRACE_S, Deadline
from planner.search.report import solve_document
from planner.search.candidates import fix_items
from planner.search.solve import infeasibility, solve as search_one
from planner.search.stacks import solve_stacks, stacks_infeasibility, target_space
from planner.stacks import Export
from planner.specs import (
    ClusterSpec,
    JobSpec,
    ModelSpec,
    Plan,
    PlanDocument,
    SolveDocument,
    Target,
    memory_limit_gib,
)

__all__ = [
    "EstimateOptions",
    "SolveOptions",
    "WhatIf",
    "WhatIfOptions",
    "estimate",
    "export_plan",
    "load_cluster",
    "load_model",
    "read_plan",
    "solve",
    "what_if",
    "write_plan",
]

PathLike = Union[str, os.PathLike]
ModelLike = Union[ModelSpec, PathLike]  # a ModelSpec, or a preset name or file as --model takes
ClusterLike = Union[ClusterSpec, PathLike]  # a ClusterSpec, or a preset name or profile file as --cluster takes
PlanSource = Union[PlanDocument, PathLike]  # a document (estimate(), solve()), or a plan file's path
FixValue = Union[int, bool, str, Sequence[str]]


def load_model(model: ModelLike) -> ModelSpec:
    """A model: a ModelSpec as it is, else what --model takes: a preset name, a .json/.yaml
    spec, a Hugging Face config.json or model directory, or a hub id (ORG/NAME) whose
    config.json is in the local Hugging Face cache (nothing is downloaded). UsageError for an
    unknown name (with the close matches) or a file that is no model.

    >>> load_model("llama3-8b").num_layers
    32
    """
    return model if isinstance(model, ModelSpec) else load_model_named(os.fspath(model))


def load_cluster(cluster: ClusterLike) -> ClusterSpec:
    """A cluster: a ClusterSpec as it is, else what --cluster takes: a preset name, or a
    hardware profile .json/.yaml (a preset's shape, or `plan profile`'s). UsageError as load_model.

    >>> load_cluster("dgx-h100-80gb").gpus_per_node
    8
    """
    return cluster if isinstance(cluster, ClusterSpec) else load_cluster_named(os.fspath(cluster))


def estimate(model: ModelLike, cluster: ClusterLike, **options: Unpack[EstimateOptions]) -> PlanDocument:
    """`plan estimate`: the predicted step time and per-GPU memory of one layout, as the
    document `plan estimate --json` prints. The keywords (planner/inputs.py: EstimateOptions,
    `plan estimate`'s options of the same names): the GPUs, `gpus` or `nodes` (x the cluster's
    GPUs per node); the job (`global_batch` required); the layout (tp, pp, zero, ...). dp defaults to GPUs / (tp x pp x cp), seq_len to the model's maximum, the
    schedule to 1f1b (interleaved-1f1b with vpp > 1), precision to the model's. A plan over its
    memory is returned, not raised: its `estimate.fits` is False.

    >>> doc = estimate("llama3-8b", "dgx-h100-80gb", gpus=8, global_batch=32, seq_len=4096, tp=2, zero=1)
    >>> doc.plan.dp, doc.plan.num_micro_batches, doc.estimate.fits
    (4, 8, True)
    """
    check_keywords("estimate", options, EstimateOptions)
    spec, hardware = load_model(model), load_cluster(cluster)
    n = cluster_size(hardware, options.get("gpus"), options.get("nodes"), _named(cluster, hardware))
    global_batch = options.get("global_batch")
    if global_batch is None:
        raise UsageError("--global-batch is required (sequences per optimizer step)")
    job = make_job(spec, job_request(options, global_batch), hardware)
    given: dict[str, Any] = {k: v for k, v in options.items() if v is not None}
    layout = {k: given.get(k, default) for k, default in LAYOUT_DEFAULTS.items()}
    plan = new_layout(job, n, layout)
    return _estimated(spec, hardware, n, job, plan)


@dataclass(frozen=True)
class WhatIf:
    """A plan estimated again with changes (what_if()), and what changed."""

    document: PlanDocument  # as `plan estimate --plan FILE [changes] --json` prints it
    changes: tuple[
        str, ...
    ]  # one phrase each, in order, e.g. "tp 2 -> 4", "dp 4 -> 2": also what followed from a change


class WhatIfOptions(JobOptions, LayoutOptions, total=False):
    """what_if()'s keywords: the job's and the layout's (planner/inputs.py), the world's, and
    which alternative of a `plan solve` document to start from."""

    alternative: Optional[int]
    cluster: Optional[ClusterLike]
    gpus: Optional[int]
    nodes: Optional[int]


def what_if(plan: PlanSource, **options: Unpack[WhatIfOptions]) -> WhatIf:
    """`plan estimate --plan`: a plan (a document, or a plan file's path; `alternative` K >= 1:
    the K-th alternative of a `plan solve` document) estimated again with the keywords given
    (not None) changed, as estimate() takes them (WhatIfOptions); the model stays the plan's. Changing the
    GPUs, tp, pp, cp or the batch recomputes dp and the micro-batch count; a changed stage
    count drops the plan's layer split.

    >>> base = estimate("llama3-8b", "dgx-h100-80gb", gpus=8, global_batch=32, seq_len=4096, tp=2)
    >>> changed = what_if(base, tp=4)
    >>> changed.changes
    ('tp 2 -> 4', 'dp 4 -> 2', 'num_micro_batches 8 -> 16')
    >>> changed.document.plan.dp
    2
    """
    check_keywords("what_if", options, WhatIfOptions)
    given: dict[str, Any] = {k: v for k, v in options.items() if k != "alternative" and v is not None}
    alternative, cluster = options.get("alternative"), options.get("cluster")
    gpus, nodes = options.get("gpus"), options.get("nodes")
    base = _plan_input(plan, alternative)
    hardware, n, changes = base.cluster, base.num_gpus, []
    world = given.keys() & {"cluster", "gpus", "nodes"}
    if world:
        hardware = load_cluster(cluster) if cluster is not None else base.cluster
        size: tuple[Optional[int], Optional[int]] = (
            (gpus, nodes) if world & {"gpus", "nodes"} else (base.num_gpus, None)
        )
        n = cluster_size(hardware, *size, _named(cluster, hardware) if cluster is not None else hardware.name)
        if hardware.name != base.cluster.name:
            changes.append(f"cluster {base.cluster.name} -> {hardware.name}")
        if n != base.num_gpus:
            changes.append(f"GPUs {base.num_gpus} -> {n}")
    job, job_changes = what_if_job(base.model, hardware, base.job, given)
    layout, layout_changes = what_if_layout(base.plan, job, n, given, bool(world))
    document = _estimated(base.model, hardware, n, job, layout)
    return WhatIf(document, tuple(dict.fromkeys(changes + job_changes + layout_changes)))


class SolveOptions(WorldOptions, JobOptions, total=False):
    """solve()'s keywords: the GPUs and the job's (planner/inputs.py), the batch as micro-batches
    (`micro_batch_size` and `micro_batches`, instead of `global_batch`), and the search's:
    `plan solve`'s options of the same names. planner/tune/journal.py stores them in a journal."""

    micro_batch_size: Optional[int]
    micro_batches: Optional[int]
    top_k: Optional[int]  # [3] alternatives
    fixes: Optional[Union[Mapping[str, FixValue], Sequence[str]]]  # --fix: {"tp": 8, "sp": True} or ["tp=8", "sp=true"]
    max_memory_gib: Optional[float]  # [the device's, less the headroom]
    allow_cross_node_tp: Optional[bool]  # [False]
    fp8: Optional[bool]  # [False]: FP8 GEMMs may be chosen
    time_limit: Optional[float]  # seconds
    solver: Optional[str]  # [HiGHS]


# solve()'s keywords left out (target None: every stack)
SOLVE_DEFAULTS: dict[str, Any] = dict.fromkeys(SolveOptions.__optional_keys__) | {
    "top_k": 3,
    "fixes": (),
    "allow_cross_node_tp": False,
    "fp8": False,
}


def solve(model: ModelLike, cluster: ClusterLike, **options: Unpack[SolveOptions]) -> SolveDocument:
    """`plan solve`: the fastest layout that fits, as the document `plan solve --json` prints.
    Give `global_batch`, or `micro_batch_size` (and optionally `micro_batches`). Without
    `target` every stack (megatron, deepspeed, torchtitan, accelerate) is searched, each as it
    runs, and the best plan one runs is recommended (planner/search/stacks.py); a target
    searches only what it can express ("generic": everything, as PyTorch eager). `fixes` pins
    choices as --fix does: {"tp": 8, "sp": True} or ["tp=8", "sp=true"]. `time_limit` (seconds)
    returns the best plan found so far, `search.optimal` False. InfeasibleError when no
    layout fits, saying by how much and what would help.

    >>> doc = solve("gpt2-124m", "dgx-a100-80gb", gpus=8, global_batch=64, seq_len=1024, target="megatron")
    >>> doc.job.target.value, doc.plan.world_size, doc.search.optimal
    ('megatron', 8, True)
    """
    # one wall clock for the whole call, reading the inputs included (and a grace for a first plan)
    check_keywords("solve", options, SolveOptions)
    o: dict[str, Any] = SOLVE_DEFAULTS | {k: v for k, v in options.items() if v is not None}
    global_batch, micro_batch_size, micro_batches = o["global_batch"], o["micro_batch_size"], o["micro_batches"]
    top_k, max_memory_gib, time_limit, target = o["top_k"], o["max_memory_gib"], o["time_limit"], o["target"]
    deadline = Deadline.after(time_limit, FIRST_PLAN_GRACE_S)
    spec, hardware = load_model(model), load_cluster(cluster)
    n = cluster_size(hardware, o["gpus"], o["nodes"], _named(cluster, hardware))
    if (global_batch is None) == (micro_batch_size is None):
        raise UsageError("give either --global-batch B or --micro-batch-size b (with optional --micro-batches N)")
    if micro_batches is not None and micro_batch_size is None:
        raise UsageError(
            "--micro-batches goes with --micro-batch-size (with --global-batch the count follows from the batch)"
        )
    check_count("--global-batch", global_batch, MAX_GLOBAL_BATCH, "sequences per step")
    check_count("--micro-batch-size", micro_batch_size, MAX_GLOBAL_BATCH, "sequences")
    check_count("--micro-batches", micro_batches, MAX_GLOBAL_BATCH, "micro-batches")
    if not 0 <= top_k <= 1000:  # 0: no alternatives
        raise UsageError(f"--top-k {top_k} is out of range; give a whole number from 0 to 1,000")
    check_real("--max-memory-gib", max_memory_gib)
    check_real("--time-limit", time_limit)
    fixed, modes = parse_fixes(fix_items(o["fixes"]))
    batch = global_batch or micro_batch_size
    assert batch is not None  # one of them is given (refused above otherwise)
    job = make_job(spec, job_request(options, batch, Target.generic.value), hardware)
    space = search_space(
        hardware,
        job,
        n,
        fixed,
        modes,
        global_batch=global_batch,
        micro_batch_size=micro_batch_size,
        micro_batches=micro_batches,
        allow_cross_node_tp=o["allow_cross_node_tp"],
        fp8=o["fp8"],
    )
    refuse_model_fixes(spec, fixed)
    limit = memory_limit_gib(hardware, max_memory_gib)
    if target is None:  # every stack, each with its own job and rules
        result = solve_stacks(
            spec, hardware, job, space, memory_limit_gib=limit, top_k=top_k, solver=o["solver"], deadline=deadline
        )
    else:  # a named stack searches only what it can express (planner/stacks); generic everything
        space = target_space(space, spec, job)
        result = search_one(
            spec, hardware, job, space, memory_limit_gib=limit, top_k=top_k, solver=o["solver"], deadline=deadline
        )
    if result.best is None:
        if not result.stats.optimal:
            raise InfeasibleError(
                f"no plan found within --time-limit {time_limit:g} s; allow more time, or narrow the search "
                "(--target STACK, --fix)"
            )
        if target is None:
            raise stacks_infeasibility(spec, hardware, result.stacks, limit, deadline)
        raise infeasibility(spec, hardware, job, space, limit, deadline=deadline)
    return solve_document(spec, hardware, n, result)


def read_plan(path: PathLike, alternative: Optional[int] = None) -> PlanDocument:
    """The plan of a plan file (`plan estimate -o` / `--json`, `plan solve -o`, write_plan()),
    or (`alternative` K >= 1) the K-th alternative of a `plan solve` document, estimated by
    this planner as `plan estimate --plan PATH [--alternative K] --json` prints it: a file's
    estimate is an output of the planner that wrote it, so it is computed again; its
    alternatives and search are not read. UsageError for a file that is no plan, of another
    schema major version, or whose plan does not suit its model.

    >>> import pathlib, tempfile
    >>> doc = estimate("llama3-8b", "dgx-h100-80gb", gpus=8, global_batch=32, seq_len=4096, tp=2)
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "plan.json"
    >>> write_plan(doc, path)
    >>> read_plan(path) == doc
    True
    """
    return what_if(path, alternative=alternative).document


def write_plan(doc: PlanDocument, path: PathLike) -> None:
    """Write a document as `-o` does: indented JSON, atomically (a temporary file renamed, so
    never half-written; planner/datafile.py:write_atomic). UsageError for a path that cannot be
    written (a directory, a missing directory); PlannerError for an OS error (disk full).

    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "plan.json"
    >>> write_plan(estimate("gpt2-124m", "dgx-a100-80gb", gpus=8, global_batch=64, seq_len=1024), path)
    >>> read_plan(path).num_gpus
    8
    """
    write_atomic(path, doc.model_dump_json(indent=2) + "\n")


def export_plan(plan: PlanSource, stack: str, *, alternative: Optional[int] = None) -> Export:
    """`plan export --to STACK`: a plan (a document or a plan file's path; `alternative` K >= 1
    of a `plan solve` document) in the configuration of a training stack (megatron, deepspeed,
    torchtitan, accelerate): an Export with `text` (what `plan export` prints) and `data` (the
    same, structured). UsageError naming the first feature the stack cannot express.

    >>> doc = estimate("gpt2-124m", "dgx-a100-80gb", gpus=8, global_batch=64, seq_len=1024, zero=1)
    >>> export_plan(doc, "deepspeed").data["zero_optimization"]["stage"]
    1
    """
    base = _plan_input(plan, alternative)  # checked as every command checks a plan document
    return stacks.export(stack, base.plan, base.model, base.job, base.num_gpus, base.cluster.gpus_per_node)


# --------------------------------------------------------------------------- helpers


def _estimated(model: ModelSpec, cluster: ClusterSpec, gpus: int, job: JobSpec, plan: Plan) -> PlanDocument:
    """The plan checked against its model and GPUs, and costed."""
    check_plan(plan, model, job, gpus, cluster)
    return PlanDocument(
        model=model,
        cluster=cluster,
        num_gpus=gpus,
        job=job,
        plan=plan,
        estimate=cost_estimate(model, cluster, job, plan),
    )


def _named(given: ClusterLike, cluster: ClusterSpec) -> str:
    """What messages call the cluster: the name or path given, else the spec's name."""
    return cluster.name if isinstance(given, ClusterSpec) else os.fspath(given)


def _plan_input(source: PlanSource, alternative: Optional[int]) -> PlanInput:
    """What a command reads of a plan: from a file (planner/plan_file.py:read_plan_file), or
    the same parts of a document in memory (its alternative K as that function picks one)."""
    if not isinstance(source, PlanDocument):
        return read_plan_file(Path(source), alternative)
    plan, job = source.plan, source.job
    if alternative is not None:
        alternatives = getattr(source, "alternatives", [])
        if not alternatives:
            raise UsageError("the document has no alternatives (only `plan solve` documents do); drop alternative")
        if not 1 <= alternative <= len(alternatives):
            raise UsageError(f"alternative {alternative}: the document has alternatives 1 to {len(alternatives)}")
        chosen = alternatives[alternative - 1]
        plan = chosen.plan
        job = job.model_copy(
            update={"global_batch_size": chosen.global_batch_size, "target": chosen.target or job.target}
        )
    doc = PlanInput(model=source.model, cluster=source.cluster, num_gpus=source.num_gpus, job=job, plan=plan)
    check_document(doc)  # the check read_plan_file makes of a file
    return doc
