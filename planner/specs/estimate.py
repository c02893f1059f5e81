"""The estimate of one plan: Estimate, TimeBreakdown, PipelineRankMemory, and _ReadsV1_0, which reads
the 1.0 names of these and of the run report's fields."""

from __future__ import annotations

from typing import ClassVar, Optional

from pydantic import Field, model_validator

from planner.specs.base import _Spec


class TimeBreakdown(_Spec):
    """Where the step time goes, on the pipeline rank that bounds the step; sums to step_time_s."""

    compute: float = Field(
        description="Forward and backward math of all micro-batches (GEMMs and memory-bound kernels)."
    )
    recompute: float = Field(description="Extra forward work of activation recomputation.")
    pipeline_bubble: float = Field(description="Idle time while the pipeline fills and drains.")
    tp_communication: float = Field(
        description="Tensor-parallel all-reduce / all-gather / reduce-scatter, on the critical path."
    )
    pp_communication: float = Field(description="Point-to-point sends between pipeline stages.")
    dp_communication_exposed: float = Field(
        description="Data-parallel (or ZeRO) communication not hidden behind compute."
    )
    optimizer: float = Field(
        description="Optimizer step (memory-bound update of the local parameter shard) and the stack's host time per step (StackConstants.step_overhead_s)."
    )


class _ReadsV1_0(_Spec):
    """A schema some of whose fields had other names in 1.0 documents (V1_0_NAMES: old to
    new); such documents are read with the current names."""

    V1_0_NAMES: ClassVar[dict] = {}

    @model_validator(mode="before")
    @classmethod
    def _read_v1_0(cls, data):
        if isinstance(data, dict) and any(k in data for k in cls.V1_0_NAMES):
            return {cls.V1_0_NAMES.get(k, k): v for k, v in data.items()}
        return data


class PipelineRankMemory(_ReadsV1_0):
    """Peak memory of one pipeline rank, GiB."""

    V1_0_NAMES = {"stage": "pipeline_rank"}

    pipeline_rank: int = Field(description="Pipeline rank (0 = first).")
    layers: int = Field(description="Transformer layers on this rank.")
    weights: float = Field(description="Parameters held by this GPU (compute copy).")
    gradients: float = Field(description="Gradients held by this GPU.")
    optimizer_states: float = Field(description="fp32 master weights and optimizer moments held by this GPU.")
    activations: float = Field(description="Activations saved for backward, over all in-flight micro-batches.")
    temporary: float = Field(
        description="Transient buffers: logits and loss, gathered ZeRO-3 parameters, communication buckets."
    )
    overhead: float = Field(description="Framework overhead from the hardware profile.")
    total: float = Field(description="Sum of the above.")


class Estimate(_ReadsV1_0):
    """Predicted time and memory of one plan."""

    V1_0_NAMES = {
        "memory_gib_per_stage": "memory_gib_per_pipeline_rank",
        "bottleneck_stage": "bottleneck_pipeline_rank",
    }

    step_time_s: float = Field(description="Predicted time of one optimizer step.")
    time_breakdown_s: TimeBreakdown = Field(description="Step time split by cause.")
    tokens_per_s: float = Field(description="Training throughput of the whole cluster, tokens per second.")
    model_tflops_per_gpu: float = Field(description="Model FLOPs (no recompute) per GPU per second, TFLOP/s.")
    hardware_tflops_per_gpu: float = Field(
        description="FLOPs actually executed (with recompute) per GPU per second, TFLOP/s."
    )
    mfu: float = Field(description="Model FLOPs utilisation: model TFLOP/s over peak dense TFLOP/s.")
    peak_memory_gib: float = Field(description="Largest per-GPU memory over pipeline ranks.")
    memory_capacity_gib: float = Field(description="Device memory of the cluster's GPUs.")
    fits: bool = Field(description="peak_memory_gib <= memory_capacity_gib.")
    memory_gib_per_pipeline_rank: list[PipelineRankMemory] = Field(
        description="Memory breakdown of every pipeline rank."
    )
    bottleneck_pipeline_rank: int = Field(description="Pipeline rank whose work bounds the step.")
    model_flops_per_step: float = Field(description="Model FLOPs of one optimizer step, whole cluster.")
    step_time_interval_s: Optional[list[float]] = Field(
        default=None,
        description="[low, high] step time: the prediction x/ (1 + the cluster's cross-validated relative error); "
        "None where the cluster states no uncertainty (measured profiles).",
    )
    interval_coverage: Optional[float] = Field(
        default=None, description="Fraction of held-out published runs whose step time fell inside such an interval."
    )
    interval_widened: Optional[list[str]] = Field(
        default=None,
        description="Why the interval is wider than the calibrated one, each with its factor on the log half-width: a "
        "device without runs of the stack, more GPUs or a larger ZeRO shard group than any calibrated run "
        "(Uncertainty.widening); None where none applies (schema 1.15).",
    )
    time_uncertainty_s: Optional[TimeBreakdown] = Field(
        default=None,
        description="Per term of time_breakdown_s, how far it may be off (+/- seconds, the cluster's per-term relative "
        "half-width times the term); the step's interval combines them in quadrature.",
    )
