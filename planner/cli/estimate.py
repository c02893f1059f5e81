"""`plan estimate`: predict step time and per-GPU memory of one layout."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import click
from click.core import ParameterSource

from planner import api
from planner.cli import render
from planner.cli.common import api_keywords, require_names, target_options
from planner.cli.types import ALTERNATIVE, DEGREE, LAYERS, SEQUENCES, ZERO_STAGE
from planner.datafile import check_output
from planner.errors import InfeasibleError, UsageError
from planner.plan_file import read_plan_file
from planner.search.stacks import tuned_refusal
from planner.specs import FP8_PARTS, Recompute, Schedule


@click.command()
@target_options
@click.option("--global-batch", type=SEQUENCES, help="Sequences per optimizer step.")
@click.option("--tp", type=DEGREE, default=1, show_default=True, help="Tensor-parallel degree.")
@click.option("--pp", type=DEGREE, default=1, show_default=True, help="Pipeline-parallel degree.")
@click.option("--dp", type=DEGREE, default=None, help="Data-parallel degree [default: GPUs / (tp x pp)].")
@click.option(
    "--ep",
    type=DEGREE,
    default=1,
    show_default=True,
    help="Expert-parallel degree (mixture-of-experts models): experts split over ep ranks of tp x dp.",
)
@click.option(
    "--vpp", type=DEGREE, default=1, show_default=True, help="Virtual stages per pipeline rank (interleaved schedule)."
)
@click.option("--micro-batch-size", type=SEQUENCES, default=1, show_default=True, help="Sequences per micro-batch.")
@click.option(
    "--recompute",
    type=click.Choice([m.value for m in Recompute if m != Recompute.mixed]),
    default=Recompute.none.value,
    show_default=True,
)
@click.option("--zero", type=ZERO_STAGE, default=0, show_default=True, help="ZeRO stage.")
@click.option(
    "--dp-shard",
    type=DEGREE,
    default=None,
    help="Hybrid sharding: dp ranks per ZeRO shard group, replicated dp / N times (divides dp; needs --zero 1-3) "
    "[all of dp].",
)
@click.option("--sequence-parallel", is_flag=True, help="Megatron sequence parallelism (needs tp > 1).")
@click.option(
    "--cp",
    type=DEGREE,
    default=1,
    show_default=True,
    help="Context-parallel degree: each sequence split over cp ranks (ring attention).",
)
@click.option("--fp8", is_flag=True, help=f"GEMMs in FP8 (needs a device with FP8 tensor cores: {FP8_PARTS}).")
@click.option(
    "--tp-comm-overlap",
    is_flag=True,
    help="Overlap TP communication with GEMMs (needs --sequence-parallel and --target megatron or torchtitan).",
)
@click.option(
    "--recompute-norm-act/--keep-norm-act",
    default=False,
    help="Recompute the separate norms' and the MoE experts' activation outputs in backward instead of keeping them "
    "(--target megatron: --recompute-modules layernorm moe_act; not with --recompute full).",
)
@click.option(
    "--schedule",
    type=click.Choice([s.value for s in Schedule]),
    default=None,
    help="Pipeline schedule [default: 1f1b, interleaved-1f1b when --vpp > 1].",
)
@click.option(
    "--layers-per-stage",
    type=LAYERS,
    default=None,
    help="Comma-separated layers of each (virtual) stage, e.g. 5,6,6,5.",
)
@click.option(
    "--mesh-order", default="tp,dp,pp", show_default=True, help="Mesh axes from innermost (inside a node) to outermost."
)
@click.option(
    "--plan",
    "plan_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Re-estimate a plan file (from `plan solve -o` or `--json`); layout options given with it are what-if changes.",
)
@click.option(
    "--alternative",
    type=ALTERNATIVE,
    default=None,
    help="With --plan from `plan solve`: re-estimate its alternative K (1 = first).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (schema_version, plan, estimate, ...).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the JSON plan document to this file.")
@click.pass_context
def estimate(
    ctx,
    model_name: Optional[str],
    cluster_name: Optional[str],
    plan_file: Optional[str],
    alternative: Optional[int],
    as_json: bool,
    output: Optional[str],
    **options,
) -> None:
    """Predict step time, throughput and per-GPU memory of one layout."""
    model = model_name
    given = {name for name in ctx.params if ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE}
    if alternative is not None and not plan_file:
        raise UsageError("--alternative K goes with --plan FILE (a `plan solve` document)")
    if not plan_file:
        require_names(model_name, cluster_name)
    if output is not None:  # after reading the inputs (a model directory's config.json), before any work
        model = _read_inputs(plan_file, alternative, model_name, cluster_name)
        check_output(output, (plan_file,))
    changed = None  # with --plan: what the options changed, said only when the estimate stands
    tuned = None  # the stack a tuned profile chose where --target was not given
    if plan_file:
        doc, changed = _what_if(plan_file, alternative, given, ctx.params)
        _refuse_untuned(doc, cluster_name or f"{plan_file}'s cluster {doc.cluster.name}")
    else:
        assert model is not None and cluster_name is not None  # require_names above
        tuned = _tuned_target(cluster_name, options["stack"], "stack" in given)
        doc = api.estimate(model, cluster_name, **api_keywords({**options, "stack": tuned or options["stack"]}))
    if output:
        api.write_plan(doc, output)
    if as_json:
        click.echo(doc.model_dump_json(indent=2))
    else:
        render.estimate_report(doc)
    if not doc.estimate.fits:  # one line on stderr, the error (the report above shows the layout)
        if output:  # written all the same (docs/estimate.md): said before the error
            render.note(f"plan written to {output}")
        raise InfeasibleError(does_not_fit(doc))
    if changed:
        render.note(changed)
    if tuned:
        render.note(f"note: costed for --target {tuned}, the stack {cluster_name} was tuned for")
    if output:
        render.note(f"plan written to {output}")


def _tuned_target(cluster_name: str, target: str, given: bool) -> Optional[str]:
    """On a profile `plan tune` wrote (ClusterSpec.tuned_stacks), the stack to cost for where
    --target was not given and the default is not tuned: its one tuned stack (None: the
    default, or the --target given, stands). UsageError for a --target it was not tuned for,
    or where it was tuned for several stacks none of which is the default."""
    cluster = api.load_cluster(cluster_name)
    tuned = cluster.tuned_stacks
    if given or not tuned or target in tuned:
        refusal = tuned_refusal(cluster, target, cluster_name)
        if refusal:
            raise UsageError(refusal)
        return None
    if len(tuned) > 1:
        raise UsageError(f"{tuned_refusal(cluster, target, cluster_name)} (--target is {target} by default)")
    return tuned[0].value


def _refuse_untuned(doc, name: str) -> None:
    """UsageError for a re-estimate whose target its tuned cluster was not tuned for."""
    refusal = tuned_refusal(doc.cluster, doc.job.target, name)
    if refusal:
        raise UsageError(refusal)


def _read_inputs(
    plan_file: Optional[str], alternative: Optional[int], model_name: Optional[str], cluster_name: Optional[str]
):
    """Read the files the command will (recorded by planner/datafile.py:read_input for
    check_output); the model read, for the estimate to use, or the name as given with --plan."""
    if plan_file:
        read_plan_file(Path(plan_file), alternative)
    if cluster_name:
        api.load_cluster(cluster_name)
    if plan_file:
        return model_name
    assert model_name is not None  # required without a plan file (require_names)
    return api.load_model(model_name)


def _norm_act_would_help(doc) -> bool:
    """Whether --recompute-norm-act is a way down for this plan: the plan does not use it, no
    layer is fully recomputed, and its target has it and it frees memory for this model."""
    from planner import stacks
    from planner.search.stacks import norm_act_frees_memory

    return (
        not doc.plan.recompute_norm_act
        and not doc.plan.stage_recompute_has_full()
        and norm_act_frees_memory(doc.model, stacks.get(doc.job.target))
    )


def does_not_fit(doc) -> str:
    """One line for a plan over its device's memory: which pipeline rank, by how much, and
    what would bring it under, naming only the steps this plan has not taken (the estimate and
    any -o file are still written: how far over is what a user sizing a layout wants to see)."""
    est, plan = doc.estimate, doc.plan
    worst = max(est.memory_gib_per_pipeline_rank, key=lambda r: r.total)
    over = worst.total - est.memory_capacity_gib
    ways = []
    if plan.zero_stage < 3 and plan.dp * plan.cp > 1:  # ZeRO shards over dp x cp ranks: none to shard over at 1
        ways.append("a higher --zero")
    if plan.dp_shard:  # hybrid: a larger shard group holds less per rank
        ways.append(f"a larger --dp-shard (up to {plan.dp})")
    every_layer_full = all(r.full == r.layers for r in plan.stage_recompute_counts(doc.model.num_layers))
    if plan.recompute_norm_act:  # refused with full recompute (Plan.validate_for): selective is the step left
        if plan.recompute == Recompute.none:
            ways.append("--recompute selective")
    elif not every_layer_full:
        ways.append("--recompute selective or full" if plan.recompute == Recompute.none else "--recompute full")
    if _norm_act_would_help(doc):
        ways.append("--recompute-norm-act")
    ways.append("more --tp or --pp, or more GPUs")
    return (
        f"the plan does not fit: pipeline rank {worst.pipeline_rank} needs {worst.total:.1f} GiB per GPU, "
        f"{render.gib(over)} GiB over the device's {render.gib(est.memory_capacity_gib)} GiB ({doc.cluster.device.name}); "
        f"{', '.join(ways)} would bring it down (`plan solve` finds the fastest layout that fits)"
    )


# With --plan: options that would change the plan's model (refused), options that change
# nothing, and the keyword of planner/api.py:what_if that an option of another name sets.
_REFUSED = ("model_name", "no_flash_attention")
_OPTION = {"model_name": "--model"}  # a parameter whose option is named otherwise
_NOT_CHANGES = {"plan_file", "alternative", "as_json", "output", *_REFUSED}
_RENAMED = {"cluster_name": "cluster", "stack": "target"}


def _what_if(plan_file: str, alternative: Optional[int], given: set, params: dict):
    """The plan file (or its alternative K) with the options given on the command line
    changed (planner/api.py:what_if), and a line saying what changed (None: nothing)."""
    refused = given & set(_REFUSED)
    if refused:
        raise UsageError(
            f"--plan re-estimates its own model; {', '.join(_OPTION.get(n, '--' + n.replace('_', '-')) for n in sorted(refused))} "
            "cannot change it (start from --model instead)"
        )
    changes = {_RENAMED.get(name, name): params[name] for name in given - _NOT_CHANGES}
    result = api.what_if(Path(plan_file), alternative=alternative, **changes)
    if not result.changes:
        return result.document, None
    source = f"{Path(plan_file)}" + (f" alternative {alternative}" if alternative else "")
    return result.document, f"changed from {source}: " + "; ".join(result.changes)
