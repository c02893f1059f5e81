"""`plan solve`: search every layout (of every stack, or of --target's) and recommend the fastest that fits."""

from __future__ import annotations

from typing import Optional

import click

from planner.cli import render
from planner.cli.common import MAX_GLOBAL_BATCH, check_count, check_real, make_job, resolve_target, solve_target_options
from planner.datafile import check_output, write_atomic
from planner.errors import InfeasibleError, UsageError
from planner.search.candidates import SearchSpace
from planner.search.solve import infeasibility, solve as run_search
from planner.search.stacks import solve_stacks, stacks_infeasibility, target_space
from planner.search.report import solve_document
from cost_models.terms import MODES
from planner.specs import Axis, Recompute, Schedule, Target, memory_limit_gib

_FIX_KEYS = {
    "dp": ("dp", int), "tp": ("tp", int), "pp": ("pp", int), "vpp": ("vpp", int), "ep": ("ep", int), "cp": ("cp", int),
    "mbs": ("micro_batch_size", int), "micro_batch_size": ("micro_batch_size", int),
    "zero": ("zero_stage", int), "zero_stage": ("zero_stage", int),
    "sp": ("sequence_parallel", "bool"), "sequence_parallel": ("sequence_parallel", "bool"),
    "schedule": ("schedule", str), "mesh_order": ("mesh_order", "axes"), "recompute": ("recompute", str),
    "tp_comm_overlap": ("tp_comm_overlap", "bool"), "fp8": ("fp8", "bool"),
}


def parse_fixes(fixes: tuple[str, ...]) -> tuple[dict, tuple]:
    fixed, modes = {}, MODES
    for item in fixes:
        key, sep, value = item.partition("=")
        if not sep or key not in _FIX_KEYS:
            raise UsageError(f"--fix {item!r}: expected KEY=VALUE with KEY one of {', '.join(sorted(_FIX_KEYS))}")
        field, kind = _FIX_KEYS[key]
        before = fixed.get(field, modes if field == "recompute" and modes != MODES else None)
        try:
            if kind is int:
                n = int(value)
                low, high = (0, 3) if field == "zero_stage" else (1, 2**20)
                if not low <= n <= high:
                    raise ValueError
                fixed[field] = n
            elif kind == "bool":
                if value.lower() not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
                    raise ValueError
                fixed[field] = value.lower() in ("true", "1", "yes", "on")
            elif kind == "axes":
                axes = tuple(Axis(a.strip()) for a in value.split(","))
                if sorted(a.value for a in axes) != ["dp", "pp", "tp"]:
                    raise ValueError
                fixed[field] = axes
            elif field == "schedule":
                fixed[field] = Schedule(value)
            else:
                if value == Recompute.mixed.value:
                    raise ValueError  # a mix is what the search decides; fix one mode
                modes = (Recompute(value),)
        except ValueError:
            allowed = " (0 to 3)" if field == "zero_stage" else " (a positive integer)" if kind is int else ""
            raise UsageError(f"--fix {item!r}: {value!r} is not a valid value for {key}{allowed}") from None
        after = fixed.get(field, modes if field == "recompute" else None)
        if before is not None and before != after:
            raise UsageError(f"--fix {item!r} contradicts an earlier --fix of {key}; give each choice once")
    return fixed, modes


@click.command()
@solve_target_options
@click.option("--global-batch", type=int, help="Sequences per optimizer step (fixes the batch).")
@click.option("--micro-batch-size", type=int, help="Sequences per micro-batch per replica, when the batch is not fixed.")
@click.option("--micro-batches", type=int, help="Micro-batches per step with --micro-batch-size [default: 3 x pipeline stages].")
@click.option("--top-k", type=int, default=3, show_default=True,
              help="Alternatives to report (0: none; without --target each other stack's best is listed too).")
@click.option("--fix", "fixes", multiple=True, help="Pin a choice, e.g. --fix tp=8 --fix pp=4 (dp tp pp vpp ep cp mbs zero sp schedule mesh_order recompute tp_comm_overlap fp8).")
@click.option("--max-memory-gib", type=float, help="Memory limit per GPU [default: 95% of the device's, a 5% headroom].")
@click.option("--allow-cross-node-tp", is_flag=True, help="Let tensor parallelism span nodes.")
@click.option("--fp8", is_flag=True, help="Let the search run GEMMs in FP8 where it is faster (devices with FP8: H100, H200).")
@click.option("--time-limit", type=float, help="Seconds (shared by the stacks without --target); return the best plan so far, marked as not proven optimal.")
@click.option("--solver", type=click.Choice(["highs", "cbc"]), default=None, help="MILP solver [default: highs if installed].")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the JSON plan document to this file.")
def solve(
    model_name, cluster_name, gpus, nodes, seq_len, precision, optimizer, no_flash_attention, stack, loss_kernel, moe_dispatcher,
    global_batch, micro_batch_size, micro_batches, top_k, fixes, max_memory_gib, allow_cross_node_tp, fp8,
    time_limit, solver, as_json: bool, output: Optional[str],
) -> None:
    """Search every layout (dp, tp, pp, interleaving, micro-batching, layer split, per-stage
    recompute, ZeRO, sequence parallel, mesh order) for the fastest that fits; without
    --target, on each training stack, recommending the best plan a stack runs."""
    if output is not None:
        check_output(output, (model_name, cluster_name))
    model, cluster, gpus = resolve_target(model_name, cluster_name, gpus, nodes)
    if (global_batch is None) == (micro_batch_size is None):
        raise UsageError("give either --global-batch B or --micro-batch-size b (with optional --micro-batches N)")
    if micro_batches is not None and micro_batch_size is None:
        raise UsageError("--micro-batches goes with --micro-batch-size (with --global-batch the count follows from the batch)")
    check_count("--global-batch", global_batch, MAX_GLOBAL_BATCH, "sequences per step")
    check_count("--micro-batch-size", micro_batch_size, MAX_GLOBAL_BATCH, "sequences")
    check_count("--micro-batches", micro_batches, MAX_GLOBAL_BATCH, "micro-batches")
    check_count("--top-k", top_k + 1, 1001, "alternatives")
    check_real("--max-memory-gib", max_memory_gib)
    check_real("--time-limit", time_limit)
    fixed, modes = parse_fixes(fixes)
    job = make_job(model, global_batch or micro_batch_size, seq_len, precision, optimizer, no_flash_attention, cluster,
                   stack or Target.generic.value, loss_kernel, moe_dispatcher)
    base = SearchSpace(
        num_gpus=gpus, global_batch_size=global_batch, micro_batch_size=micro_batch_size, micro_batches=micro_batches,
        max_tp=gpus if allow_cross_node_tp else None, fixed=fixed, recompute_modes=modes,
        fp8=_fp8_choices(fp8, fixed, cluster), cp_degrees=cp_degrees(job.seq_len, gpus, fixed.get("cp")), seq_len=job.seq_len,
    )
    limit = memory_limit_gib(cluster, max_memory_gib)
    if stack is None:  # every stack, each with its own job and rules
        result = solve_stacks(model, cluster, job, base, memory_limit_gib=limit, top_k=top_k, time_limit=time_limit, solver=solver)
    else:  # a named stack searches only what it can express (planner/export); generic everything
        space = target_space(base, model, job)
        result = run_search(model, cluster, job, space, memory_limit_gib=limit, top_k=top_k, time_limit=time_limit, solver=solver)
    if result.best is None:
        if not result.stats.optimal:
            raise InfeasibleError(f"no plan found within --time-limit {time_limit:g} s; allow more time")
        raise stacks_infeasibility(model, cluster, result.stacks, limit) if stack is None else infeasibility(model, cluster, job, space, limit)
    doc = solve_document(model, cluster, gpus, result)
    text = doc.model_dump_json(indent=2)
    if output:
        write_atomic(output, text + "\n")
    if as_json:
        click.echo(text)
    else:
        render.solve_report(doc, limit)
        if output:
            render.console.print(f"plan written to {output}")


def _fp8_choices(allowed: bool, fixed: dict, cluster) -> tuple:
    """FP8 GEMMs are a search choice only when asked for (`--fp8` or `--fix fp8=true`: they
    change the numerics) and the device has them."""
    want = allowed or fixed.get("fp8") is True
    if want and cluster.device.fp8_peak_tflops is None:
        raise UsageError(f"--fp8: {cluster.device.name} has no FP8 tensor cores (H100 and H200 do)")
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
    while seq_len > CP_FROM_SEQ_LEN and cp <= gpus and seq_len // cp >= CP_MIN_TOKENS_PER_RANK and seq_len % (2 * cp) == 0:
        out.append(cp)
        cp *= 2
    return tuple(out)
