"""`plan run`'s report: RunReport and its parts (RankMeasurement, MemoryBytes, PipelineRankComparison,
TimeComparison, Verification, RunSettings)."""

from __future__ import annotations

from typing import Optional

from pydantic import ConfigDict, Field

from planner.specs.base import SCHEMA_VERSION, _Spec
from planner.specs.cluster import ClusterSpec
from planner.specs.estimate import Estimate, _ReadsV1_0
from planner.specs.job import JobSpec, Plan
from planner.specs.model import ModelSpec


# ----- run report
# `plan run`: a plan executed with torch.distributed, checked against a single-process run
# of the same model, seed and batch, with predicted against measured time and memory.


class MemoryBytes(_Spec):
    """Memory of one rank (or the largest rank of a pipeline stage) by kind, in bytes.
    What is counted and how: planner/executor/memory.py and RankMeasurement.memory_method."""

    weights_bytes: float = Field(
        description="Parameters held (local shards; FSDP's gathered parameters while in place)."
    )
    gradients_bytes: float = Field(description="Gradients held after the step's last backward.")
    optimizer_states_bytes: float = Field(description="Optimizer state held (Adam: step, first and second moments).")
    activations_bytes: float = Field(description="Peak of tensors saved for backward over all in-flight micro-batches.")

    @property
    def total_bytes(self) -> float:
        return self.weights_bytes + self.gradients_bytes + self.optimizer_states_bytes + self.activations_bytes


class RankMeasurement(_Spec):
    """What one rank measured."""

    rank: int = Field(description="Global rank.")
    dp_rank: int = Field(description="Coordinate on the data-parallel axis.")
    tp_rank: int = Field(description="Coordinate on the tensor-parallel axis.")
    pp_rank: int = Field(description="Coordinate on the pipeline axis.")
    virtual_stages: list[int] = Field(description="Virtual pipeline stages this rank ran (several with interleaving).")
    layers: int = Field(description="Transformer layers on this rank.")
    step_times_s: list[float] = Field(
        description="This rank's time of every measured step (after warm-up): forward, backward, gradient sync and optimizer, without the verification's norm."
    )
    memory: MemoryBytes = Field(
        description="Counted memory by kind, largest over the warm-up steps (every step when there is no warm-up)."
    )
    peak_memory_bytes: float = Field(
        description="CUDA: the allocator's peak over all steps; CPU: the sum of the counted kinds."
    )
    memory_method: str = Field(description="How memory was measured on this device.")
    cores: list[int] = Field(
        default_factory=list,
        description="The CPU cores this rank was pinned to, its own (no other rank of its machine ran there; "
        "os.sched_getaffinity of its threads, read back after the steps); empty where it was not pinned: ranks "
        "outnumbering the machine's cores, GPU ranks, ranks of torchrun or Slurm (which bind their own). (schema 1.15)",
    )


class PipelineRankComparison(_ReadsV1_0):
    """Predicted against measured memory of one pipeline rank."""

    V1_0_NAMES = {"stage": "pipeline_rank"}

    pipeline_rank: int = Field(description="Pipeline rank.")
    layers: int = Field(description="Transformer layers on this pipeline rank.")
    predicted: MemoryBytes = Field(description="The cost model's weights, gradients, optimizer states and activations.")
    predicted_not_measured_bytes: float = Field(
        description="Predicted temporary buffers and framework overhead, which the CPU count leaves out."
    )
    measured: MemoryBytes = Field(
        description="The largest measurement among the ranks of this pipeline rank, per kind."
    )
    error_pct: float = Field(description="(predicted - measured) / measured of the counted total, percent.")


class TimeComparison(_Spec):
    """Predicted against measured step time."""

    predicted_step_time_s: float = Field(
        description="The cost model's step time for the model that ran, on the plan file's cluster."
    )
    measured_step_time_s: float = Field(
        description="Median over measured steps of the slowest rank's step time (median: one step slowed by "
        "other work on the machine does not move it)."
    )
    error_pct: float = Field(description="(predicted - measured) / measured, percent.")
    predicted_tokens_per_s: float = Field(description="Predicted tokens per second of the whole run.")
    measured_tokens_per_s: float = Field(description="Global batch x sequence length / measured step time.")
    measured_steps: int = Field(description="Steps timed (after warm-up).")


class Verification(_Spec):
    """The distributed run against a single-process reference in float64
    (planner/executor/verify.py): at step 0 within `tolerance`; later, within `tolerance` plus
    `sensitivity` times the drift that fp32 rounding alone produces, measured as the same
    reference run in fp32 against the float64 one."""

    model_config = ConfigDict(**{**_Spec.model_config, "allow_inf_nan": True})  # a diverged run reports NaN losses

    passed: bool = Field(
        description="The layout is the plan's, every step's loss and gradient norm and step 0's per-parameter gradient norms are within what is allowed."
    )
    tolerance: float = Field(
        description="Relative difference allowed at step 0 (the same weights on both sides), and the floor of every later step's allowance."
    )
    sensitivity: float = Field(
        default=0.0,
        description="Multiple of the fp32 reference's drift allowed on top of the tolerance after step 0. (schema 1.5)",
    )
    losses: list[float] = Field(description="Mean loss over the global batch at every step, distributed run.")
    reference_losses: list[float] = Field(description="The same from one process with the whole batch, in float64.")
    grad_norms: list[float] = Field(
        description="Global gradient norm at every step (all shards and stages), distributed run."
    )
    reference_grad_norms: list[float] = Field(description="The same from the single-process reference (float64).")
    fp32_reference_losses: list[float] = Field(
        default_factory=list, description="The reference's losses run in fp32. (schema 1.5)"
    )
    fp32_reference_grad_norms: list[float] = Field(
        default_factory=list, description="The reference's gradient norms run in fp32."
    )
    reference_drift_losses: list[float] = Field(
        default_factory=list,
        description="Relative loss difference of the fp32 reference from the float64 one, every step: what rounding alone does.",
    )
    reference_drift_grad_norms: list[float] = Field(
        default_factory=list, description="The same for the global gradient norm."
    )
    allowed_loss_rel_error: list[float] = Field(
        default_factory=list, description="Relative loss difference allowed at every step."
    )
    allowed_grad_norm_rel_error: list[float] = Field(
        default_factory=list, description="Relative gradient-norm difference allowed at every step."
    )
    max_loss_rel_error: float = Field(description="Largest relative loss difference over the steps.")
    max_grad_norm_rel_error: float = Field(description="Largest relative gradient-norm difference over the steps.")
    parameters_checked: int = Field(
        default=0,
        description="Parameters whose gradient norm was compared one by one at step 0 (the same weights on both sides). (schema 1.5)",
    )
    max_param_grad_rel_error: float = Field(
        default=0.0,
        description="Largest relative difference of one parameter's gradient norm at step 0 (relative to the larger of its own and 1e-3 x the global norm).",
    )
    allowed_param_grad_rel_error: float = Field(
        default=0.0, description="What step 0 allows one parameter's gradient norm."
    )
    worst_parameter: Optional[str] = Field(default=None, description="The parameter of that largest difference.")
    message: str = Field(description="One line: what matched, or the first step that did not.")


class RunSettings(_Spec):
    """How the run was made."""

    steps: int = Field(description="Optimizer steps run (warm-up included) and compared with the reference.")
    warmup_steps: int = Field(description="First steps left out of the timing.")
    seed: int = Field(description="Seed of the weights and of the synthetic token data.")
    learning_rate: float = Field(description="Adam learning rate.")
    world_size: int = Field(description="Processes (ranks).")
    nnodes: int = Field(description="Launcher processes (machines).")
    backend: str = Field(description="torch.distributed backend: gloo (CPU) or nccl (CUDA).")
    device: str = Field(description="Device type of the ranks.")
    timeout_s: float = Field(description="Process-group timeout.")
    pinned: bool = Field(
        default=False,
        description="Every rank ran on CPU cores of its own (RankMeasurement.cores): false where CPU ranks "
        "outnumbered the cores and shared them (step times are then noisy), on GPUs, and in reports from before "
        "schema 1.15. (schema 1.15)",
    )
    changes: list[str] = Field(
        description="How what ran differs from the plan file (scaled model, untied embeddings, fp32, ...)."
    )


class RunReport(_ReadsV1_0):
    """`plan run -o report.json`: the plan as it ran, the measurements per rank, the
    reference losses and the verdict."""

    V1_0_NAMES = {"stages": "pipeline_ranks"}

    schema_version: str = Field(default=SCHEMA_VERSION, description="Version of this document format (major.minor).")
    plan_file: Optional[str] = Field(default=None, description="The plan file that was run.")
    model: ModelSpec = Field(description="The model that ran (after --scale-* options).")
    cluster: ClusterSpec = Field(description="The hardware profile of the plan file, used for the predictions.")
    job: JobSpec = Field(description="The job that ran.")
    plan: Plan = Field(description="The layout that ran.")
    estimate: Estimate = Field(description="The cost model's prediction for what ran.")
    settings: RunSettings = Field(description="Steps, seed, launch and what was changed from the plan file.")
    ranks: list[RankMeasurement] = Field(description="Measurements of every rank.")
    pipeline_ranks: list[PipelineRankComparison] = Field(
        description="Predicted against measured memory per pipeline rank."
    )
    time: TimeComparison = Field(description="Predicted against measured step time and throughput.")
    verification: Verification = Field(description="Losses and gradient norms against the single-process reference.")
    verdict: str = Field(description="'pass' when verification passed, else 'fail'.")
