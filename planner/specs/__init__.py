"""Every schema of the planner, defined once: pydantic models with ``extra="forbid"`` and a
description on every field, one module per document.

    base.py           SCHEMA_VERSION, bounded numbers (Integer, Real, Fraction, MAX_*), _Spec
    model.py          ModelSpec and its enums (Activation, DType)
    job.py            JobSpec, Plan, their enums (Target, Schedule, Recompute, Axis, ...), layout rules
    cluster.py        ClusterSpec: DeviceSpec, LinkTier, Uncertainty, StackConstants, MeasuredProfile
    estimate.py       Estimate, TimeBreakdown, PipelineRankMemory; _ReadsV1_0 (1.0 names)
    plan_document.py  PlanDocument, SolveDocument and their parts
    run_report.py     RunReport (`plan run`) and its parts
    size_document.py  SizeDocument (`plan size`)

Every name is imported from here: ``from planner.specs import ClusterSpec``.

Units: time in seconds unless a field name says otherwise (``_us`` microseconds),
bandwidth in GB/s (1e9 bytes/s), memory capacity in GiB (2**30 bytes), throughput in
TFLOP/s (1e12 FLOP/s).
"""

from planner.specs.base import (
    Fraction, INT_LIMIT, Integer, MAX_BYTES, MAX_COUNT, MAX_FLOPS, MAX_GBPS, MAX_GIB, MAX_GLOBAL_BATCH,
    MAX_GPUS, MAX_LAYERS, MAX_SECONDS, MAX_SEQ_LEN, MAX_TFLOPS, MAX_US, MAX_VOCAB, MAX_WIDTH, MIN_FRACTION,
    MIN_GBPS, MIN_SECONDS, MIN_TFLOPS, Real, SCHEMA_VERSION, number_problem,
)
from planner.specs.model import Activation, DTYPE_BYTES, DType, ModelSpec, RopeScaling
from planner.specs.job import (
    Axis, JobSpec, LossKernel, Optimizer, Plan, PlanError, Recompute, Schedule, StageRecompute, Target,
    cp_problem, ep_problem, even_split, seq_problem, tp_problem,
)
from planner.specs.cluster import (
    ATTENTION_KERNELS, AttentionEfficiency, ClusterSpec, Collective, CollectiveFit, CollectiveSweep, REQUIRED_COLLECTIVES,
    DeviceSpec, EfficiencyPoint, FP8_PARTS, GemmModel, LayerMeasurement, LinkTier, MEMORY_HEADROOM, MatmulPoint,
    MeasuredProfile, ProfileEnvironment, Spine, StackConstants, TimedPoint, Uncertainty, memory_limit_gib,
)
from planner.specs.estimate import Estimate, PipelineRankMemory, TimeBreakdown
from planner.specs.plan_document import (
    Alternative, Explanation, LinkVolume, PlanDocument, SearchReport, SolveDocument, StackAnswer, TieBreak,
)
from planner.specs.run_report import (
    MemoryBytes, PipelineRankComparison, RankMeasurement, RunReport, RunSettings, TimeComparison,
    Verification,
)
from planner.specs.size_document import SizeDocument, SizePoint

__all__ = [  # every name the modules define but their private helpers
    "Fraction", "INT_LIMIT", "Integer", "MAX_BYTES", "MAX_COUNT", "MAX_FLOPS", "MAX_GBPS", "MAX_GIB",
    "MAX_GLOBAL_BATCH", "MAX_GPUS", "MAX_LAYERS", "MAX_SECONDS", "MAX_SEQ_LEN", "MAX_TFLOPS", "MAX_US",
    "MAX_VOCAB", "MAX_WIDTH", "MIN_FRACTION", "MIN_GBPS", "MIN_SECONDS", "MIN_TFLOPS", "Real",
    "SCHEMA_VERSION", "number_problem", "Activation", "DTYPE_BYTES", "DType", "ModelSpec", "RopeScaling", "Axis", "JobSpec",
    "LossKernel", "Optimizer", "Plan", "PlanError", "Recompute", "Schedule", "StageRecompute", "Target",
    "cp_problem", "ep_problem", "even_split", "seq_problem", "tp_problem", "ATTENTION_KERNELS",
    "AttentionEfficiency", "ClusterSpec", "Collective", "CollectiveFit", "REQUIRED_COLLECTIVES", "CollectiveSweep", "DeviceSpec",
    "EfficiencyPoint", "GemmModel", "LayerMeasurement", "LinkTier", "MEMORY_HEADROOM", "MatmulPoint",
    "MeasuredProfile", "ProfileEnvironment", "Spine", "FP8_PARTS", "StackConstants", "TimedPoint", "Uncertainty",
    "memory_limit_gib", "Estimate", "PipelineRankMemory", "TimeBreakdown", "Alternative", "Explanation",
    "LinkVolume", "PlanDocument", "SearchReport", "SolveDocument", "StackAnswer", "TieBreak", "MemoryBytes",
    "PipelineRankComparison", "RankMeasurement", "RunReport", "RunSettings", "TimeComparison", "Verification",
    "SizeDocument", "SizePoint",
]
