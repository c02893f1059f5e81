"""`plan solve`: search every layout (of every stack, or of --target's) and recommend the fastest that fits."""

from __future__ import annotations

from typing import Optional

import click

from planner import api
from planner.errors import MemoryMiss, UsageError
from planner.cli import render
from planner.cli.common import api_keywords, require_names, solve_target_options
from planner.cli.types import MEMORY_GIB, SECONDS, SEQUENCES, TOP_K
from planner.datafile import check_output
from planner.inputs import cp_degrees  # noqa: F401 (benchmarks/solve_scaling.py imports it from here)
from planner.search.deadline import stop_on_signals
from planner.search.stacks import tuned_refusal, tuned_search_note
from planner.specs import FP8_PARTS, memory_limit_gib


@click.command()
@solve_target_options
@click.option("--global-batch", type=SEQUENCES, help="Sequences per optimizer step (fixes the batch).")
@click.option(
    "--micro-batch-size", type=SEQUENCES, help="Sequences per micro-batch per replica, when the batch is not fixed."
)
@click.option(
    "--micro-batches",
    type=SEQUENCES,
    help="Micro-batches per step with --micro-batch-size [default: 3 x pipeline stages].",
)
@click.option(
    "--top-k",
    type=TOP_K,
    default=3,
    show_default=True,
    help="Alternatives to report (0: none; without --target each other stack's best is listed too).",
)
@click.option(
    "--fix",
    "fixes",
    multiple=True,
    help="Pin a choice, e.g. --fix tp=8 --fix pp=4 (dp tp pp vpp ep cp mbs zero dp_shard sp schedule mesh_order recompute tp_comm_overlap recompute_norm_act fp8).",
)
@click.option(
    "--max-memory-gib", type=MEMORY_GIB, help="Memory limit per GPU [default: 95% of the device's, a 5% headroom]."
)
@click.option("--allow-cross-node-tp", is_flag=True, help="Let tensor parallelism span nodes.")
@click.option(
    "--fp8", is_flag=True, help=f"Let the search run GEMMs in FP8 where it is faster (devices with FP8: {FP8_PARTS})."
)
@click.option(
    "--time-limit",
    type=SECONDS,
    help="Seconds (shared by the stacks without --target); return the best plan so far, marked as not proven optimal.",
)
@click.option(
    "--solver", type=click.Choice(["highs", "cbc"]), default=None, help="MILP solver [default: highs if installed]."
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the JSON plan document to this file.")
@stop_on_signals()  # Ctrl-C, SIGTERM, SIGHUP: stop within a moment, even inside a MILP; one line, exit 130 / 143 / 129
def solve(model_name, cluster_name, as_json: bool, output: Optional[str], **options) -> None:
    """Search every layout (dp, tp, pp, interleaving, micro-batching, layer split, per-stage
    recompute, ZeRO, sequence parallel, mesh order) for the fastest that fits; without
    --target, on each training stack, recommending the best plan a stack runs."""
    require_names(model_name, cluster_name)
    model = model_name
    if output is not None:  # after reading the inputs (a model directory's config.json), before any work
        model = api.load_model(model_name)
        api.load_cluster(cluster_name)
        check_output(output)
    tuned = tuned_stacks_note(cluster_name, options["stack"])
    try:
        doc = api.solve(model, cluster_name, **api_keywords(options))
    except MemoryMiss as exc:  # said beside the miss it changed
        max_memory_gib = options["max_memory_gib"]
        capped = _capped(max_memory_gib, api.load_cluster(cluster_name).device.memory_gib) if max_memory_gib else None
        if capped:
            raise MemoryMiss(f"{exc} ({capped})") from None
        raise
    if output:
        api.write_plan(doc, output)
    max_memory_gib = options["max_memory_gib"]
    capped = _capped(max_memory_gib, doc.cluster.device.memory_gib)
    if capped:
        render.note(f"note: {capped}")
    if tuned:
        render.note(f"note: {tuned}")
    if as_json:
        click.echo(doc.model_dump_json(indent=2))
    else:
        render.solve_report(doc, memory_limit_gib(doc.cluster, max_memory_gib))
    if output:  # on stderr, with --json too
        render.note(f"plan written to {output}")


def tuned_stacks_note(cluster_name: str, target: Optional[str]) -> Optional[str]:
    """On a profile `plan tune` wrote: UsageError for a --target it was not tuned for; without
    --target, the line saying that only its tuned stacks are searched. None on another cluster."""
    cluster = api.load_cluster(cluster_name)
    if target is None:
        return tuned_search_note(cluster, cluster_name)
    refusal = tuned_refusal(cluster, target, cluster_name)
    if refusal:
        raise UsageError(refusal)
    return None


def _capped(max_memory_gib: Optional[float], capacity: float) -> Optional[str]:
    """What a --max-memory-gib above the device's memory became (memory_limit_gib plans to the
    whole device), or None where it was not above it."""
    if max_memory_gib and max_memory_gib > capacity:
        return f"--max-memory-gib {max_memory_gib:g} is more than the device's {capacity:g} GiB: planned to the whole device"
    return None
