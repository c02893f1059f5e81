"""`plan size`'s document: SizeDocument and its SizePoint."""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from planner.specs.base import MAX_GLOBAL_BATCH, MAX_GPUS, MAX_SEQ_LEN, SCHEMA_VERSION, Integer, Real, _Spec
from planner.specs.job import Plan
from planner.specs.model import ModelSpec


class SizePoint(_Spec):
    """One (cluster, GPU count) of `plan size`, solved as `plan solve` does (planner/size.py)."""

    cluster: str = Field(description="The cluster as given to --clusters (a preset name or a profile path).")
    device: str = Field(description="Its device.")
    gpus: Integer(1, MAX_GPUS) = Field(description="GPUs priced: the count asked for, rounded to whole nodes.")
    gpus_asked: Integer(1, MAX_GPUS) = Field(description="The count of --gpus this point stands for.")
    feasible: bool = Field(description="A layout fits; else `reason` says why not.")
    reason: Optional[str] = Field(default=None, description="Why no plan, one word: memory, batch, time or layout.")
    detail: Optional[str] = Field(
        default=None, description="Why no plan, as `plan solve` says it (by how much it misses, what would fit)."
    )
    target: Optional[str] = Field(
        default=None, description="The stack whose plan this is (the best one runs without --target)."
    )
    plan: Optional[Plan] = Field(default=None, description="The recommended layout.")
    optimal: Optional[bool] = Field(
        default=None, description="The search proved it optimal (else a time limit stopped it)."
    )
    step_time_s: Optional[Real(0, 1e9, "s", open_lo=True)] = Field(default=None, description="Predicted step time.")
    step_time_interval_s: Optional[tuple[float, float]] = Field(
        default=None, description="Its interval (the plan's coverage)."
    )
    mfu: Optional[Real(0, 1)] = Field(default=None, description="Model FLOPs utilization.")
    peak_memory_gib: Optional[Real(0, 2**20, "GiB")] = Field(default=None, description="Peak memory per GPU.")
    days: Optional[Real(0, 1e12, "days")] = Field(default=None, description="Time to train: steps x step time.")
    days_interval: Optional[tuple[float, float]] = Field(
        default=None, description="The same over the step time's interval."
    )
    gpu_hours: Optional[Real(0, 1e18, "GPU-hours")] = Field(default=None, description="GPUs x time to train.")
    price_per_gpu_hour: Optional[Real(0, 1000)] = Field(default=None, description="--price for this cluster, if given.")
    cost: Optional[Real(0, 1e21)] = Field(default=None, description="GPU-hours x price, where priced.")
    on_front: bool = Field(
        default=False,
        description="No other point is both no slower and no dearer (GPU-hours, or cost when every cluster is priced), one strictly.",
    )
    scaling_efficiency: Optional[Real(0, 1e6)] = Field(
        default=None,
        description="Speed-up over this cluster's previous feasible count, divided by the GPU ratio (1 = perfect).",
    )
    stops_paying: bool = Field(
        default=False,
        description="scaling_efficiency below the document's min_scaling: adding GPUs stopped paying here.",
    )
    within_deadline: Optional[bool] = Field(
        default=None, description="days <= deadline_days, where a deadline was given."
    )
    within_budget: Optional[bool] = Field(
        default=None, description="cost <= budget, where a budget was given and the point is priced."
    )


class SizeDocument(_Spec):
    """`plan size --json` / `-o`: time to train and GPU-hours over clusters and GPU counts. (schema 1.8)"""

    schema_version: str = Field(default=SCHEMA_VERSION, description="Version of this document format (major.minor).")
    model: ModelSpec = Field(description="The model sized.")
    tokens: Real(1, 1e18) = Field(description="Tokens to train on (--tokens).")
    global_batch_size: Integer(1, MAX_GLOBAL_BATCH) = Field(description="Sequences per step.")
    seq_len: Integer(1, MAX_SEQ_LEN) = Field(description="Tokens per sequence.")
    steps: Integer(1, 10**15) = Field(description="Optimizer steps: tokens / (global batch x sequence), rounded up.")
    target: Optional[str] = Field(default=None, description="--target, or None: every stack searched at each point.")
    prices: dict[str, float] = Field(default_factory=dict, description="Price per GPU-hour per cluster (--price).")
    deadline_days: Optional[float] = Field(default=None, description="--deadline, days.")
    budget: Optional[float] = Field(default=None, description="--budget, in the prices' currency.")
    min_scaling: Real(0, 1) = Field(
        description="Scaling efficiency under which adding GPUs is said to stop paying (--min-scaling)."
    )
    front_axis: str = Field(
        description="What the front trades against time: 'gpu_hours', or 'cost' when every cluster is priced."
    )
    points: list[SizePoint] = Field(description="Every point, clusters in the order given, GPU counts ascending.")
    wall_time_s: Real(0, 1e9, "s") = Field(description="Seconds the sweep took.")
