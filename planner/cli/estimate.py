"""`plan estimate`: predict step time and per-GPU memory of one layout."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import click
from click.core import ParameterSource

from cost_models.estimate import estimate as run_estimate
from planner.cli import render
from hardware_profiles import load_cluster
from planner.cli.common import (
    check_plan,
    cluster_size,
    make_job,
    make_plan,
    parse_int_list,
    resolve_target,
    target_options,
)
from planner.datafile import check_output, write_atomic
from planner.errors import InfeasibleError, UsageError
from planner.plan_file import read_plan_file
from planner.specs import PlanDocument, Recompute, Schedule


@click.command()
@target_options
@click.option("--global-batch", type=int, help="Sequences per optimizer step.")
@click.option("--tp", type=int, default=1, show_default=True, help="Tensor-parallel degree.")
@click.option("--pp", type=int, default=1, show_default=True, help="Pipeline-parallel degree.")
@click.option("--dp", type=int, default=None, help="Data-parallel degree [default: GPUs / (tp x pp)].")
@click.option("--ep", type=int, default=1, show_default=True,
              help="Expert-parallel degree (mixture-of-experts models): experts split over ep ranks of tp x dp.")
@click.option("--vpp", type=int, default=1, show_default=True, help="Virtual stages per pipeline rank (interleaved schedule).")
@click.option("--micro-batch-size", type=int, default=1, show_default=True, help="Sequences per micro-batch.")
@click.option("--recompute", type=click.Choice([m.value for m in Recompute if m != Recompute.mixed]), default=Recompute.none.value, show_default=True)
@click.option("--zero", type=click.IntRange(0, 3), default=0, show_default=True, help="ZeRO stage.")
@click.option("--sequence-parallel", is_flag=True, help="Megatron sequence parallelism (needs tp > 1).")
@click.option("--cp", type=int, default=1, show_default=True,
              help="Context-parallel degree: each sequence split over cp ranks (ring attention).")
@click.option("--fp8", is_flag=True, help="GEMMs in FP8 (needs a device with FP8 tensor cores: H100, H200).")
@click.option("--tp-comm-overlap", is_flag=True, help="Overlap TP communication with GEMMs (needs --sequence-parallel and --target megatron or torchtitan).")
@click.option(
    "--schedule",
    type=click.Choice([s.value for s in Schedule]),
    default=None,
    help="Pipeline schedule [default: 1f1b, interleaved-1f1b when --vpp > 1].",
)
@click.option("--layers-per-stage", default=None, help="Comma-separated layers of each (virtual) stage, e.g. 5,6,6,5.")
@click.option("--mesh-order", default="tp,dp,pp", show_default=True, help="Mesh axes from innermost (inside a node) to outermost.")
@click.option("--plan", "plan_file", type=click.Path(dir_okay=False), default=None,
              help="Re-estimate a plan file (from `plan solve -o` or `--json`); layout options given with it are what-if changes.")
@click.option("--alternative", type=int, default=None, help="With --plan from `plan solve`: re-estimate its alternative K (1 = first).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (schema_version, plan, estimate, ...).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the JSON plan document to this file.")
@click.pass_context
def estimate(
    ctx, model_name, cluster_name, gpus, nodes, seq_len, precision, optimizer, no_flash_attention, stack, loss_kernel, moe_dispatcher,
    global_batch, tp, pp, dp, ep, cp, vpp, micro_batch_size, recompute, zero, sequence_parallel, fp8, tp_comm_overlap, schedule,
    layers_per_stage, mesh_order, plan_file: Optional[str], alternative: Optional[int], as_json: bool, output: Optional[str],
) -> None:
    """Predict step time, throughput and per-GPU memory of one layout."""
    if output is not None:
        check_output(output, (model_name, cluster_name, plan_file))
    given = {name for name in ctx.params if ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE}
    if alternative is not None and not plan_file:
        raise UsageError("--alternative K goes with --plan FILE (a `plan solve` document)")
    if plan_file:
        model, cluster, job, plan, gpus = what_if(Path(plan_file), alternative, given, ctx.params)
    else:
        model, cluster, gpus = resolve_target(model_name, cluster_name, gpus, nodes)
        if global_batch is None:
            raise UsageError("--global-batch is required (sequences per optimizer step)")
        job = make_job(model, global_batch, seq_len, precision, optimizer, no_flash_attention, cluster, stack, loss_kernel, moe_dispatcher)
        if tp < 1 or pp < 1 or cp < 1 or ep < 1 or (dp is not None and dp < 1) or micro_batch_size < 1:
            raise UsageError("--tp, --pp, --cp, --ep, --dp and --micro-batch-size must be positive")
        if dp is None:
            dp = _data_parallel(gpus, tp, pp, cp)
        if job.global_batch_size % (dp * micro_batch_size):
            raise UsageError(
                f"global batch {job.global_batch_size} is not divisible by dp x micro_batch_size = {dp} x {micro_batch_size} = {dp * micro_batch_size}"
            )
        plan = make_plan(
            dp=dp, tp=tp, pp=pp, vpp=vpp, ep=ep, fp8=fp8, cp=cp, micro_batch_size=micro_batch_size,
            num_micro_batches=job.global_batch_size // (dp * micro_batch_size),
            schedule=schedule or (Schedule.interleaved_1f1b if vpp > 1 else Schedule.one_f_one_b),
            recompute=recompute, zero_stage=zero, sequence_parallel=sequence_parallel, tp_comm_overlap=tp_comm_overlap,
            layers_per_stage=parse_int_list(layers_per_stage, "--layers-per-stage"),
            mesh_order=[a.strip() for a in mesh_order.split(",")],
        )
    check_plan(plan, model, job, gpus)
    est = run_estimate(model, cluster, job, plan)
    doc = PlanDocument(model=model, cluster=cluster, num_gpus=gpus, job=job, plan=plan, estimate=est)
    if output:
        write_atomic(output, doc.model_dump_json(indent=2) + "\n")
    if as_json:
        click.echo(doc.model_dump_json(indent=2))
    else:
        render.estimate_report(doc)
    if output:
        click.echo(f"plan written to {output}", err=True)
    if not est.fits:
        raise InfeasibleError(does_not_fit(est, doc.cluster.device.name))


def does_not_fit(est, device: str) -> str:
    """One line for a plan over its device's memory: which pipeline rank, by how much, and
    what would bring it under (the estimate and any -o file are still written: how far over
    is what a user sizing a layout wants to see)."""
    worst = max(est.memory_gib_per_pipeline_rank, key=lambda r: r.total)
    over = worst.total - est.memory_capacity_gib
    return (f"the plan does not fit: pipeline rank {worst.pipeline_rank} needs {worst.total:.1f} GiB per GPU, "
            f"{render.gib(over)} GiB over the device's {render.gib(est.memory_capacity_gib)} GiB ({device}); a higher --zero, "
            "--recompute selective or full, more --tp or --pp, or more GPUs would bring it down (`plan solve` finds the "
            "fastest layout that fits)")


# Options that change a plan file's layout or job (what-if), and the plan field each sets.
_PLAN_OPTIONS = {"tp": "tp", "pp": "pp", "dp": "dp", "ep": "ep", "cp": "cp", "fp8": "fp8", "vpp": "vpp", "micro_batch_size": "micro_batch_size",
                 "recompute": "recompute", "zero": "zero_stage", "sequence_parallel": "sequence_parallel",
                 "tp_comm_overlap": "tp_comm_overlap", "schedule": "schedule", "mesh_order": "mesh_order",
                 "layers_per_stage": "layers_per_stage"}
_JOB_OPTIONS = {"global_batch": "global_batch_size", "seq_len": "seq_len", "precision": "precision", "optimizer": "optimizer",
                "stack": "target", "loss_kernel": "loss_kernel", "moe_dispatcher": "moe_dispatcher"}


def _data_parallel(gpus: int, tp: int, pp: int, cp: int) -> int:
    """dp of `gpus` GPUs at these degrees; a UsageError naming them when they do not divide it."""
    if gpus % (tp * pp * cp):
        what, values = ("tp x pp x cp", f"{tp} x {pp} x {cp}") if cp > 1 else ("tp x pp", f"{tp} x {pp}")
        raise UsageError(
            f"{what} = {values} = {tp * pp * cp} does not divide the {gpus} GPUs; pick {what.replace(' x ', ' and ')} "
            f"whose product divides {gpus}"
        )
    return gpus // (tp * pp * cp)


def what_if(path: Path, alternative: Optional[int], given: set, params: dict):
    """A plan file (or its alternative K), with the layout and job options given on the
    command line applied; says on stderr what changed. Changing the GPUs, tp, pp or the batch
    recomputes dp and the micro-batch count; a changed stage count drops the file's layer split."""
    doc = read_plan_file(path, alternative)
    model, cluster, job, plan, gpus = doc.model, doc.cluster, doc.job, doc.plan, doc.num_gpus
    refused = given & {"model_name", "no_flash_attention"}
    if refused:
        raise UsageError(f"--plan re-estimates its own model; {', '.join('--' + n.replace('_', '-') for n in sorted(refused))} "
                         "cannot change it (start from --model instead)")
    changes = []
    if given & {"cluster_name", "gpus", "nodes"}:
        cluster2 = load_cluster(params["cluster_name"]) if "cluster_name" in given else cluster
        size = (params["gpus"], params["nodes"]) if given & {"gpus", "nodes"} else (gpus, None)
        gpus2 = cluster_size(cluster2, size[0], size[1], params["cluster_name"] or cluster2.name)
        if cluster2.name != cluster.name:
            changes.append(f"cluster {cluster.name} -> {cluster2.name}")
        if gpus2 != gpus:
            changes.append(f"GPUs {gpus} -> {gpus2}")
        cluster, gpus = cluster2, gpus2
    job_updates = {field: params[opt] for opt, field in _JOB_OPTIONS.items() if opt in given}
    if job_updates:
        new_job = make_job(model, job_updates.get("global_batch_size", job.global_batch_size), job_updates.get("seq_len", job.seq_len),
                           job_updates.get("precision", job.precision.value), job_updates.get("optimizer", job.optimizer.value),
                           not job.flash_attention, cluster, job_updates.get("target", job.target.value),
                           job_updates.get("loss_kernel", job.loss_kernel.value if job.loss_kernel else None),
                           job_updates.get("moe_dispatcher", job.moe_dispatcher))
        changes += [f"{k} {_show(getattr(job, k))} -> {_show(getattr(new_job, k))}" for k in job_updates
                    if getattr(job, k) != getattr(new_job, k)]
        job = new_job
    fields = plan.model_dump()
    for opt, field in _PLAN_OPTIONS.items():
        if opt in given:
            value = params[opt]
            if opt == "mesh_order":
                value = [a.strip() for a in value.split(",")]
            elif opt == "layers_per_stage":
                value = parse_int_list(value, "--layers-per-stage")
            if fields[field] != value:
                changes.append(f"{field} {_show(fields[field])} -> {_show(value)}")
            fields[field] = value
    if given & {"tp", "pp", "cp", "dp", "gpus", "nodes", "cluster_name"} and "dp" not in given:
        fields["dp"] = _data_parallel(gpus, fields["tp"], fields["pp"], fields["cp"])
    per = fields["dp"] * fields["micro_batch_size"]
    if job.global_batch_size % per:
        raise UsageError(f"global batch {job.global_batch_size} is not divisible by dp x micro_batch_size = {fields['dp']} x {fields['micro_batch_size']}")
    fields["num_micro_batches"] = job.global_batch_size // per
    if "vpp" in given and "schedule" not in given:
        fields["schedule"] = Schedule.interleaved_1f1b if fields["vpp"] > 1 else Schedule.one_f_one_b
    stages = fields["pp"] * fields["vpp"]
    for key in ("layers_per_stage", "stage_recompute"):
        if fields.get(key) is not None and len(fields[key]) != stages and not (key == "layers_per_stage" and "layers_per_stage" in given):
            changes.append(f"{key} dropped ({len(fields[key])} stages -> {stages})")
            fields[key] = None
    if "recompute" in given:
        fields["stage_recompute"] = None
    elif fields.get("stage_recompute") is None and fields["recompute"] == "mixed":
        changes.append("recompute mixed -> none (the per-stage recompute was dropped; give --recompute to choose)")
        fields["recompute"] = "none"
    for k in ("dp", "num_micro_batches"):
        if fields[k] != getattr(plan, k):
            changes.append(f"{k} {getattr(plan, k)} -> {fields[k]}")
    new_plan = make_plan(**fields)
    if changes:
        source = f"{path}" + (f" alternative {alternative}" if alternative else "")
        click.echo(f"changed from {source}: " + "; ".join(dict.fromkeys(changes)), err=True)
    return model, cluster, job, new_plan, gpus


def _show(value) -> str:
    if isinstance(value, list):
        return ",".join(str(getattr(v, "value", v)) for v in value)
    return str(getattr(value, "value", value))

