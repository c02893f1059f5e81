"""`plan estimate`: predict step time and per-GPU memory of one layout."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import click

from cost_models.estimate import estimate as run_estimate
from planner.cli import render
from planner.cli.common import (
    check_plan,
    make_job,
    make_plan,
    parse_int_list,
    resolve_target,
    target_options,
)
from planner.errors import UsageError
from planner.plan_file import read_plan_file
from planner.specs import PlanDocument, Recompute, Schedule


@click.command()
@target_options
@click.option("--global-batch", type=int, help="Sequences per optimizer step.")
@click.option("--tp", type=int, default=1, show_default=True, help="Tensor-parallel degree.")
@click.option("--pp", type=int, default=1, show_default=True, help="Pipeline-parallel degree.")
@click.option("--dp", type=int, default=None, help="Data-parallel degree [default: GPUs / (tp x pp)].")
@click.option("--vpp", type=int, default=1, show_default=True, help="Virtual stages per pipeline rank (interleaved schedule).")
@click.option("--micro-batch-size", type=int, default=1, show_default=True, help="Sequences per micro-batch.")
@click.option("--recompute", type=click.Choice([m.value for m in Recompute]), default=Recompute.none.value, show_default=True)
@click.option("--zero", type=click.IntRange(0, 3), default=0, show_default=True, help="ZeRO stage.")
@click.option("--sequence-parallel", is_flag=True, help="Megatron sequence parallelism (needs tp > 1).")
@click.option("--tp-comm-overlap", is_flag=True, help="Overlap TP communication with GEMMs (needs --sequence-parallel and --target megatron or torchtitan).")
@click.option(
    "--schedule",
    type=click.Choice([s.value for s in Schedule]),
    default=None,
    help="Pipeline schedule [default: 1f1b, interleaved-1f1b when --vpp > 1].",
)
@click.option("--layers-per-stage", default=None, help="Comma-separated layers of each (virtual) stage, e.g. 5,6,6,5.")
@click.option("--mesh-order", default="tp,dp,pp", show_default=True, help="Mesh axes from innermost (inside a node) to outermost.")
@click.option("--plan", "plan_file", type=click.Path(dir_okay=False), default=None, help="Re-estimate a plan file (from `plan solve -o` or `--json`).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (schema_version, plan, estimate, ...).")
def estimate(
    model_name, cluster_name, gpus, nodes, seq_len, precision, optimizer, no_flash_attention, stack, loss_kernel,
    global_batch, tp, pp, dp, vpp, micro_batch_size, recompute, zero, sequence_parallel, tp_comm_overlap, schedule,
    layers_per_stage, mesh_order, plan_file: Optional[str], as_json: bool,
) -> None:
    """Predict step time, throughput and per-GPU memory of one layout."""
    if plan_file:
        doc = read_plan_file(Path(plan_file))
        model, cluster, job, plan, gpus = doc.model, doc.cluster, doc.job, doc.plan, doc.num_gpus
    else:
        model, cluster, gpus = resolve_target(model_name, cluster_name, gpus, nodes)
        if global_batch is None:
            raise UsageError("--global-batch is required (sequences per optimizer step)")
        job = make_job(model, global_batch, seq_len, precision, optimizer, no_flash_attention, cluster, stack, loss_kernel)
        if tp < 1 or pp < 1 or (dp is not None and dp < 1) or micro_batch_size < 1:
            raise UsageError("--tp, --pp, --dp and --micro-batch-size must be positive")
        if dp is None:
            if gpus % (tp * pp):
                raise UsageError(
                    f"tp x pp = {tp} x {pp} = {tp * pp} does not divide the {gpus} GPUs; pick tp and pp whose product divides {gpus}"
                )
            dp = gpus // (tp * pp)
        if job.global_batch_size % (dp * micro_batch_size):
            raise UsageError(
                f"global batch {job.global_batch_size} is not divisible by dp x micro_batch_size = {dp} x {micro_batch_size} = {dp * micro_batch_size}"
            )
        plan = make_plan(
            dp=dp, tp=tp, pp=pp, vpp=vpp, micro_batch_size=micro_batch_size,
            num_micro_batches=job.global_batch_size // (dp * micro_batch_size),
            schedule=schedule or (Schedule.interleaved_1f1b if vpp > 1 else Schedule.one_f_one_b),
            recompute=recompute, zero_stage=zero, sequence_parallel=sequence_parallel, tp_comm_overlap=tp_comm_overlap,
            layers_per_stage=parse_int_list(layers_per_stage, "--layers-per-stage"),
            mesh_order=[a.strip() for a in mesh_order.split(",")],
        )
    check_plan(plan, model, job, gpus)
    est = run_estimate(model, cluster, job, plan)
    doc = PlanDocument(model=model, cluster=cluster, num_gpus=gpus, job=job, plan=plan, estimate=est)
    if as_json:
        click.echo(doc.model_dump_json(indent=2))
    else:
        render.estimate_report(doc)
