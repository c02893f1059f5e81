"""What a tune leaves behind: the tuned profile (a ClusterSpec, as every command reads) and
the winner as a plan document (`plan export`, `plan run` and `plan show` read it)."""

from __future__ import annotations

import math
from typing import Optional

from cost_models.estimate import estimate as predict
from cost_models.fit import NAMES, with_constants
from planner.inputs import check_plan
from planner.specs import ClusterSpec, PlanDocument, Target
from planner.tune.loop import TuneResult
from planner.tune.refit import profile_uncertainty


def slice_nodes(result: TuneResult) -> int:
    return math.ceil(result.request.gpus / result.request.cluster.gpus_per_node)


def tuned_profile(result: TuneResult, when: str) -> ClusterSpec:
    """The prior cluster with the refit constants of the tuned stack, marked tuned, their
    provenance (which trials, when, which stack, the slice) and the interval for jobs beyond the
    slice; the memory overhead the trials taught, if any."""
    request, fit = result.request, result.refit
    ran = [r for r in result.records if r.status == "ok"]
    one_node = slice_nodes(result) == 1
    values = ", ".join(f"{n} {v:.4g}" for n, v in zip(NAMES, fit.constants))
    host = request.cluster.step_overhead_s(request.target)
    if host:  # not refit: the prior's (StackConstants.step_overhead_s), kept
        values += f", step_overhead_s {host:.4g} (the prior's, kept)"
    scaled = {
        r.ran.model.num_layers
        for r in ran
        if r.ran is not None and _shape(r.ran.model, r.ran.job) != _shape(request.model, r.job)
    }
    provenance = (
        f"plan tune, {when}: fitted by cost_models/fit.py to {len(ran)} measured trials (journal indices "
        f"{', '.join(str(r.index) for r in ran) or 'none'}) of {request.model.name} on a slice of {request.gpus} ranks "
        f"({slice_nodes(result)} node{'s' if not one_node else ''}) of {request.cluster.name}, stack {request.target}"
        + (f", model scaled to {sorted(scaled)} layers" if scaled else "")
        + f"; {values}; the interval x/ {math.exp(fit.log_halfwidth):.3f} on the slice"
        + ("; communication keeps the prior's width (the slice ran no inter-node ring)" if one_node else "")
    )
    base = request.cluster
    if fit.overhead_gib != base.device.framework_overhead_gib:
        base = base.model_copy(
            update={"device": base.device.model_copy(update={"framework_overhead_gib": fit.overhead_gib})}
        )
        provenance += f"; framework_overhead_gib {fit.overhead_gib:.4g} from out-of-memory trials"
    profile = with_constants(
        base,
        request.target,
        fit.constants,
        provenance=provenance,
        uncertainty=profile_uncertainty(request.cluster, request.target, fit, one_node),
    )
    return mark_tuned(profile, Target(request.target))


def mark_tuned(cluster: ClusterSpec, target: Target) -> ClusterSpec:
    """`cluster` with `target`'s constants marked as tuned (StackConstants.tuned): `plan solve`
    then plans for its tuned stacks only, those of an earlier tune of another stack included."""
    entry = cluster.stack_constants[target].model_copy(update={"tuned": True})
    return cluster.model_copy(update={"stack_constants": {**cluster.stack_constants, target: entry}})


def _shape(model, job) -> tuple:
    """What --scale-* changes: a trial ran the searched model unless one of these differs."""
    return model.num_layers, model.hidden_size, model.num_heads, model.vocab_size, job.seq_len


def winner_document(result: TuneResult, profile: ClusterSpec) -> Optional[PlanDocument]:
    """The measured best as a plan document on the tuned profile (None when nothing ran)."""
    if result.best is None:
        return None
    r, request = result.best, result.request
    check_plan(r.plan, request.model, r.job, request.gpus, profile)
    return PlanDocument(
        model=request.model,
        cluster=profile,
        num_gpus=request.gpus,
        job=r.job,
        plan=r.plan,
        estimate=predict(request.model, profile, r.job, r.plan),
    )
