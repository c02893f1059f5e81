"""The plan file and `plan solve`'s document: PlanDocument, SolveDocument and what SolveDocument holds
(Alternative, SearchReport, TieBreak, StackAnswer, Explanation, LinkVolume)."""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from planner.specs.base import MAX_GLOBAL_BATCH, MAX_GPUS, SCHEMA_VERSION, Integer, _Spec
from planner.specs.cluster import ClusterSpec
from planner.specs.estimate import Estimate
from planner.specs.job import Axis, JobSpec, Plan, Target
from planner.specs.model import ModelSpec


# --------------------------------------------------------------------------- documents


class PlanDocument(_Spec):
    """The versioned plan file: everything needed to re-estimate or run the plan.

    Written by `plan estimate --json` and `plan solve -o`; read back by `plan estimate --plan`
    and `plan run`. Other training stacks can read `plan` for the layout (docs/plan-format.md).
    """

    schema_version: str = Field(default=SCHEMA_VERSION, description="Version of this document format (major.minor).")
    model: ModelSpec = Field(description="The model the plan is for.")
    cluster: ClusterSpec = Field(description="The hardware profile the plan was costed on.")
    num_gpus: Integer(1, MAX_GPUS) = Field(description="GPUs the plan uses (dp x tp x pp).")
    job: JobSpec = Field(description="The training job.")
    plan: Plan = Field(description="The layout.")
    estimate: Estimate = Field(description="Predicted time and memory of the layout.")


class Alternative(_Spec):
    """A runner-up layout of `plan solve`."""

    plan: Plan = Field(description="The layout.")
    global_batch_size: Integer(1, MAX_GLOBAL_BATCH) = Field(
        description="Sequences per step of this layout (differs between layouts only when the job fixes the micro-batch, not the batch)."
    )
    estimate: Estimate = Field(description="Its predicted time and memory.")
    target: Optional[Target] = Field(
        default=None,
        description="The stack it was searched and costed for, which runs it (`plan export --alternative K --to` it); "
        "None in documents before 1.6: the document's job.target. (schema 1.6)",
    )


class SearchReport(_Spec):
    """How `plan solve` searched."""

    candidates_considered: int = Field(
        description="Layouts enumerated (dp, tp, pp, vpp, micro-batch, schedule, ZeRO, SP, mesh order), rejected ones included."
    )
    layouts_represented_log10: float = Field(
        description="log10 of the layouts covered once every layer split and per-stage recompute count (the ILP's choices) is counted."
    )
    infeasible: dict[str, int] = Field(
        description="Candidates that cannot run, by reason: divisibility (of heads, layers, batch), memory (no split fits)."
    )
    skipped: dict[str, int] = Field(
        default_factory=dict,
        description="Candidates that could run but were not searched, by reason: dominated (another candidate is as fast with no more memory), tp_across_nodes (without --allow-cross-node-tp), excluded_by_fix, not_expressible_in_target (--target).",
    )
    pruned_by_bound: int = Field(
        description="Candidates never solved because their lower bound could not beat the plans found."
    )
    refined_bounds: int = Field(description="Candidates whose memory-aware lower bound was computed.")
    ilp_candidates: int = Field(description="Candidates that entered an integer program.")
    ilps_solved: int = Field(description="Integer programs solved.")
    solver: str = Field(description="MILP solver used through PuLP ('highs' or 'cbc').")
    solve_time_s: float = Field(description="Wall time of the search.")
    optimal: bool = Field(
        description="True when the plan is proven optimal for the search space; False after --time-limit."
    )
    optimality_gap: float = Field(
        default=0.0,
        description="Proven bound on how far the plan may be from the optimum: (its time per token - the least lower bound left) / its time per token; 0 when optimal, 1 when nothing bounds it (a search the time limit cut before it bounded its layouts).",
    )


class TieBreak(_Spec):
    """Why the recommended plan is not the fastest predicted one (planner/search/solve.py:break_ties)."""

    faster_alternatives: list[int] = Field(
        description="Alternatives (1 = the first) predicted faster than the plan: their intervals overlap its, and end higher."
    )
    rule: str = Field(description="The tie rule, in one sentence.")


class StackAnswer(_Spec):
    """One stack's own answer, in a `plan solve` without --target (which searches every stack)."""

    target: Target = Field(description="The stack.")
    alternative: Optional[int] = Field(
        description="Where this document holds the plan `plan solve --target` this stack would recommend: 0 the document's "
        "own plan, K alternative K (`plan export --alternative K`); None when the stack has none (see reason)."
    )
    reason: Optional[str] = Field(default=None, description="Why the stack has no plan.")
    search: Optional[SearchReport] = Field(
        default=None, description="Its search; None where it was not searched (a --fix it cannot honour)."
    )


class LinkVolume(_Spec):
    """Traffic of one parallel dimension of the chosen plan."""

    axis: Axis = Field(description="Mesh axis.")
    degree: int = Field(description="Group size.")
    link: str = Field(description="What the group communicates over.")
    inter_node: bool = Field(description="The group spans nodes.")
    bandwidth_gbps: float = Field(description="Bus bandwidth of its main collective on that link, GB/s.")
    gib_per_gpu_per_step: float = Field(description="Bytes each GPU sends per step for this dimension, GiB.")


class Explanation(_Spec):
    """Why the chosen plan looks the way it does."""

    memory_bottleneck: str = Field(
        description="Which stage and which part of memory is closest to the limit, and what relieves it."
    )
    compute_bottleneck: str = Field(description="Where the step time goes.")
    communication: list[LinkVolume] = Field(
        description="Per parallel dimension: volume per step and the link it rides."
    )


class SolveDocument(PlanDocument):
    """`plan solve --json` / `-o`: a plan document plus the alternatives and the search."""

    alternatives: list[Alternative] = Field(
        description="The next-best layouts, best first; without --target those of every stack, and each stack's own best."
    )
    search: SearchReport = Field(
        description="Search statistics (without --target summed over the stacks, solve_time_s the whole search's)."
    )
    explanation: Explanation = Field(description="Bottlenecks and communication of the chosen plan.")
    stacks: list[StackAnswer] = Field(
        default_factory=list,
        description="Without --target: every stack searched, its best first; the plan is the best any stack runs and job.target "
        "names that stack. Empty after --target. (schema 1.6)",
    )
    tie_rule: Optional[TieBreak] = Field(
        default=None,
        description="Set when the tie rule recommended the plan over faster alternatives; None when it is the fastest predicted. (schema 1.6)",
    )
