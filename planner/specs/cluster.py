"""The hardware profile: ClusterSpec, its DeviceSpec (GEMM and attention efficiency tables), link
tiers and their collective fits, Uncertainty, StackConstants, MeasuredProfile (`plan profile`), and
memory_limit_gib, the memory a plan may use on a cluster."""

from __future__ import annotations

import math
from enum import Enum
from typing import Literal, Optional

from pydantic import Field, field_validator, model_validator

from planner.specs.base import (
    INT_LIMIT,
    MAX_BYTES,
    MAX_FLOPS,
    MAX_GIB,
    MAX_GBPS,
    MAX_GLOBAL_BATCH,
    MAX_GPUS,
    MAX_SECONDS,
    MAX_SEQ_LEN,
    MAX_TFLOPS,
    MAX_US,
    MAX_WIDTH,
    MIN_GBPS,
    MIN_SECONDS,
    MIN_TFLOPS,
    Fraction,
    Integer,
    Real,
    _refused,
    _Spec,
)
from planner.specs.job import ATTENTION_KERNELS, Target
from planner.specs.model import DType, ModelSpec


# --------------------------------------------------------------------------- enums


class Collective(str, Enum):
    all_reduce = "all_reduce"
    all_gather = "all_gather"
    reduce_scatter = "reduce_scatter"
    p2p = "p2p"
    # 1.13: measured by `plan profile` (torch's all_to_all_single, every rank a distinct piece to
    # every other), optional in a tier; without it the cost model prices the MoE all-to-all from
    # the other fits (cost_models/tables.py:all_to_all_time)
    all_to_all = "all_to_all"


# The collectives every link tier fits (all_to_all is optional: the presets have no public figure)
REQUIRED_COLLECTIVES = (Collective.all_reduce, Collective.all_gather, Collective.reduce_scatter, Collective.p2p)


# --------------------------------------------------------------------------- hardware


class EfficiencyPoint(_Spec):
    """One point of the achievable-matmul-efficiency curve."""

    gemm_flops: Real(0, MAX_FLOPS, "FLOPs", open_lo=True) = Field(description="FLOPs of one GEMM call (2*m*n*k).")
    efficiency: Fraction = Field(description="Achieved fraction of peak dense throughput at that size.")


class GemmModel(_Spec):
    """How a GEMM of shape (m, n, k) runs: output tiles spread over the SMs in waves, each
    tile streaming k (plus a fixed prologue/epilogue worth `k_overhead`) at the best
    achievable rate. Efficiency = max_efficiency x (tiles/SMs) / max(1, tiles/SMs + wave_tail)
    x k / (k + k_overhead) (wave and tile quantisation, NVIDIA's "Matrix multiplication
    background" guide), and never faster than streaming the operands from memory."""

    sm_count: Integer(1, 100_000) = Field(description="Streaming multiprocessors (A100: 108, H100 SXM: 132).")
    tile_m: Integer(1, 4096) = Field(default=128, description="Output tile rows of the typical large-GEMM kernel.")
    tile_n: Integer(1, 4096) = Field(default=128, description="Output tile columns.")
    k_overhead: Real(0, MAX_WIDTH) = Field(
        default=64, description="Per-tile prologue/epilogue, in equivalent k elements."
    )
    wave_tail: Real(0, 1) = Field(default=0.25, description="Average idle fraction of the last wave, in waves.")
    max_efficiency: Fraction = Field(
        description="Best achievable fraction of peak of a large, aligned GEMM (measured, e.g. MAMF)."
    )
    fp8_max_efficiency: Optional[Fraction] = Field(
        default=None, description="The same for FP8 GEMMs, as a fraction of DeviceSpec.fp8_peak_tflops (schema 1.4)."
    )


class AttentionEfficiency(_Spec):
    """Achieved fraction of peak of the fused attention kernel (FlashAttention-style)."""

    forward: Fraction = Field(description="Forward kernel, FLOPs executed / (peak x time).")
    backward: Fraction = Field(description="Backward kernel (2.5x the forward FLOPs: it recomputes the scores).")


# The parts with FP8 tensor-core GEMMs among the presets, as the messages and help name them.
FP8_PARTS = "H100/H200, B200/GB200, B300/GB300, MI300X/MI325X/MI355X"


class DeviceSpec(_Spec):
    """One accelerator."""

    name: str = Field(description="Device name, e.g. 'A100-SXM4-80GB'.")
    peak_tflops: dict[DType, Real(MIN_TFLOPS, MAX_TFLOPS, "TFLOP/s")] = Field(
        min_length=1, description="Peak dense (no sparsity) TFLOP/s per compute dtype."
    )
    fp8_peak_tflops: Optional[Real(MIN_TFLOPS, MAX_TFLOPS, "TFLOP/s")] = Field(
        default=None,
        description=f"Peak dense FP8 tensor-core TFLOP/s ({FP8_PARTS}); None: the device has no FP8 GEMMs (schema 1.4).",
    )

    memory_gib: Real(1e-3, MAX_GIB, "GiB") = Field(description="Device memory capacity in GiB.")
    memory_bandwidth_gbps: Real(MIN_GBPS, MAX_GBPS, "GB/s") = Field(description="Peak memory bandwidth in GB/s.")
    memory_bandwidth_efficiency: Fraction = Field(
        default=0.8,
        description="Achieved fraction of memory bandwidth by element-wise kernels (norms, activations, softmax).",
    )
    matmul_efficiency: Optional[list[EfficiencyPoint]] = Field(
        default=None,
        min_length=1,
        description="Achievable GEMM efficiency versus GEMM size (measured square GEMMs); interpolated linearly in "
        "log10(FLOPs), clamped at the ends. Used where `gemm` (the shape model) is not given; one of the two is required.",
    )
    framework_overhead_gib: Real(0, MAX_GIB, "GiB") = Field(
        default=2.0,
        description="Memory per device that is not model state: CUDA context, communicator buffers, allocator fragmentation.",
    )
    gemm: Optional[GemmModel] = Field(
        default=None,
        description="Shape-aware GEMM model; None: GEMMs follow matmul_efficiency by FLOPs (measured CPU profiles).",
    )
    attention: Optional[dict[str, AttentionEfficiency]] = Field(
        default=None,
        description="Fused attention kernel efficiency by kernel ('flash2': FlashAttention-2; 'cudnn': cuDNN / "
        "FlashAttention-3 class, as Transformer Engine runs it); None: attention runs as GEMMs. A table needs 'flash2', the "
        "kernel every stack but megatron runs; without 'cudnn', megatron's attention is costed at flash2's efficiency.",
    )
    kernel_overhead_us: Real(0, MAX_US, "microseconds") = Field(
        default=0.0, description="Gap per launched kernel in a training loop (launch, dependency wait), microseconds."
    )
    sustained_fraction: Fraction = Field(
        default=1.0,
        description="Throughput a training loop sustains relative to microbenchmarks (clocks under sustained power, "
        "synchronisation): multiplies GEMM and attention rates. Fitted by benchmarks/fidelity_published.py.",
    )

    @field_validator("matmul_efficiency")
    @classmethod
    def _sorted(cls, v: Optional[list[EfficiencyPoint]]) -> Optional[list[EfficiencyPoint]]:
        return sorted(v, key=lambda p: p.gemm_flops) if v is not None else None

    @model_validator(mode="after")
    def _has_gemm_model(self) -> "DeviceSpec":
        if self.gemm is None and self.matmul_efficiency is None:
            raise ValueError("the device needs `gemm` (shape model) or `matmul_efficiency` (measured curve)")
        return self

    @model_validator(mode="after")
    def _tables_the_cost_model_reads(self) -> "DeviceSpec":
        """What the cost model looks up is there: a fused-attention table has flash2 (the kernel
        of every target but megatron, and megatron's fallback) and no kernel it does not know;
        FP8 peaks come with the FP8 GEMM efficiency that prices them (cost_models/compute.py)."""
        if self.attention is not None:
            unknown = sorted(set(self.attention) - set(ATTENTION_KERNELS))
            if unknown:
                raise _refused(f"attention: unknown kernel {unknown[0]!r}; the kernels are 'flash2' and 'cudnn'")
            if "flash2" not in self.attention:
                raise _refused(
                    "attention needs a 'flash2' entry (FlashAttention-2's forward and backward efficiency, the kernel "
                    "every target but megatron runs), or leave attention out to cost attention as GEMMs"
                )
        if self.framework_overhead_gib >= self.memory_gib:
            raise _refused(
                f"framework_overhead_gib {self.framework_overhead_gib:g} is not below memory_gib {self.memory_gib:g}: "
                "nothing would be left for the model; give the memory the framework itself takes (CUDA context, "
                "buffers: about 2 GiB on a GPU)"
            )
        if self.fp8_peak_tflops is not None and (self.gemm is None or self.gemm.fp8_max_efficiency is None):
            raise _refused(
                "fp8_peak_tflops needs gemm.fp8_max_efficiency (the fraction of it an FP8 GEMM achieves), or leave "
                "fp8_peak_tflops out for a device without FP8 GEMMs"
            )
        return self


class CollectiveFit(_Spec):
    """Alpha-beta model of one collective on one link tier: time = latency + volume / bandwidth.

    ``bandwidth_gbps`` is the *bus* bandwidth in the NCCL-tests sense, so the volume is the
    per-rank ring volume: 2(n-1)/n x bytes for all-reduce, (n-1)/n x bytes for all-gather and
    reduce-scatter (bytes = the full, unsharded buffer), bytes for point-to-point, and (n-1)/n x
    bytes for all-to-all (bytes = a rank's whole send buffer, its own piece included).
    """

    collective: Collective = Field(description="Collective kind.")
    group_size: Optional[Integer(1, MAX_GPUS)] = Field(
        default=None, description="Group size this fit was measured at; None means it applies to any size."
    )
    latency_us: Real(0, MAX_US, "microseconds") = Field(description="Fixed cost per call (alpha), microseconds.")
    bandwidth_gbps: Real(MIN_GBPS, MAX_GBPS, "GB/s") = Field(description="Bus bandwidth (1/beta), GB/s.")


class LinkTier(_Spec):
    """One level of the network: inside a node (NVLink/NVSwitch) or across nodes (InfiniBand)."""

    name: str = Field(description="What the link is, e.g. 'NVLink3 via NVSwitch'.")
    collectives: list[CollectiveFit] = Field(
        min_length=1, description="Alpha-beta fits per collective (and optionally per group size)."
    )
    hop_latency_us: Optional[Real(0, MAX_US, "microseconds")] = Field(
        default=None,
        description="Latency of one ring step over this link (the presets take NCCL's LL128 figures); a ring collective over n ranks pays "
        "one per step (n-1 for all-gather / reduce-scatter, 2(n-1) for all-reduce). None: latency_us covers the whole call "
        "(fits measured at one group size).",
    )
    tree_hop_latency_us: Optional[Real(0, MAX_US, "microseconds")] = Field(
        default=None,
        description="Latency of one level of NCCL's tree all-reduce over this link; None: no tree algorithm.",
    )
    call_overhead_us: Optional[dict[Collective, Real(0, MAX_US, "microseconds")]] = Field(
        default=None,
        description="Per collective, microseconds added to every call's latency for what a call costs a training step beyond the "
        "fits (which time calls back to back): the ranks meeting (a call waits for the last rank and wakes the blocked ones; on "
        "shared CPU cores, scheduler time slices), the framework's host work around the call (DTensor redistribution, FSDP2 "
        "copy-in / copy-out), and, where the framework issues the call synchronously, the transfer time the overlap model counts "
        "as hidden. Measured by `plan profile`: the value with which the cost model reproduces a few blocks timed as `plan run` "
        "executes them (planner/profiler/calls.py). None or a missing collective: 0 (the GPU presets: the host runs ahead).",
    )

    @model_validator(mode="after")
    def _one_fit_per_size(self) -> "LinkTier":
        """A second fit of a collective at the same group size would be one the cost model
        silently ignores (fit() takes one): refused."""
        seen = set()
        for f in self.collectives:
            key = (f.collective, f.group_size)
            if key in seen:
                size = "any group size" if f.group_size is None else f"group size {f.group_size}"
                raise _refused(f"collectives: two fits of {f.collective.value} at {size}; keep one")
            seen.add(key)
        return self

    def call_overhead(self, collective: Collective) -> Optional[float]:
        """call_overhead_us of `collective`, None where the tier has none. The all-to-all, whose
        overhead `plan profile` does not time, takes the all-gather's: the same ranks meeting and
        host work around a call, and what a MoE exchange paid before a profile measured it."""
        overheads = self.call_overhead_us or {}
        if collective == Collective.all_to_all and collective not in overheads:
            collective = Collective.all_gather
        return overheads.get(collective)

    def has(self, collective: Collective) -> bool:
        """Whether this tier fits `collective` at any group size."""
        return any(f.collective == collective for f in self.collectives)

    def fit(self, collective: Collective, group_size: int) -> CollectiveFit:
        """The fit for this collective: exact group size, else a size-free fit, else the nearest size."""
        exact = generic = nearest = None
        nearest_gap = math.inf  # nearest's |log(its group size / group_size)|
        for f in self.collectives:
            if f.collective != collective:
                continue
            if f.group_size == group_size:
                exact = f
            elif f.group_size is None:
                generic = f
            elif nearest is None or abs(math.log(f.group_size / group_size)) < nearest_gap:
                nearest, nearest_gap = f, abs(math.log(f.group_size / group_size))
        found = exact or generic or nearest
        if found is None:
            raise KeyError(f"link tier {self.name!r} has no fit for {collective.value}")
        return found


class ProfileEnvironment(_Spec):
    """Where and how a profile was measured."""

    torch_version: str = Field(description="torch.__version__ of the workers.")
    backend: str = Field(description="Process-group backend the links were timed on ('gloo', 'nccl').")
    device_type: str = Field(description="'cpu' or 'cuda'.")
    device_name: str = Field(description="Device model as reported by the system.")
    dtype: DType = Field(description="Compute dtype of the layer and matmul measurements.")
    world_size: Integer(1, MAX_GPUS) = Field(description="Ranks that took part (nproc_per_node x nnodes).")
    nproc_per_node: Integer(1, MAX_GPUS) = Field(description="Ranks per node.")
    nnodes: Integer(1, MAX_GPUS) = Field(description="Nodes.")
    date: str = Field(description="UTC date and time of the measurement (ISO 8601).")
    hostname: str = Field(description="Host of rank 0.")
    quick: bool = Field(description="Measured with --quick (fewer sizes and repetitions).")

    @model_validator(mode="after")
    def _world(self) -> "ProfileEnvironment":
        if self.world_size != self.nproc_per_node * self.nnodes:
            raise _refused(
                f"world_size {self.world_size} is not nproc_per_node x nnodes = {self.nproc_per_node} x {self.nnodes}"
            )
        return self


class LayerMeasurement(_Spec):
    """Measured cost of one layer kind at one shape, one micro-batch, on one device."""

    kind: Literal["block", "embedding", "head"] = Field(
        description="'block' (transformer layer), 'embedding' or 'head' (final norm, LM head and loss)."
    )
    micro_batch_size: Integer(1, MAX_GLOBAL_BATCH) = Field(description="Sequences per micro-batch.")
    seq_len: Integer(1, MAX_SEQ_LEN) = Field(description="Tokens per sequence.")
    tp: Integer(1, MAX_GPUS) = Field(
        description="Tensor-parallel shard measured (the local shapes of one rank, run on one device)."
    )
    forward_s: Real(0, MAX_SECONDS, "s") = Field(description="Median forward time, seconds.")
    backward_s: Real(0, MAX_SECONDS, "s") = Field(description="Median backward time, seconds.")
    activation_bytes: Real(0, MAX_BYTES, "bytes") = Field(
        description="Bytes saved for backward by the forward (unique storages)."
    )
    flops_forward: Real(0, MAX_FLOPS, "FLOPs") = Field(description="Forward FLOPs counted by torch.utils.flop_counter.")
    analytic_flops_forward: Real(0, MAX_FLOPS, "FLOPs") = Field(
        description="The cost model's forward FLOPs for the same shape."
    )
    params: Integer(0, INT_LIMIT - 1) = Field(description="Parameters of the measured (sharded) module.")

    @model_validator(mode="after")
    def _a_block_takes_time(self) -> "LayerMeasurement":
        # (its backward, timed as forward + backward less the forward, may read 0 on a tiny layer: noise)
        if self.kind == "block" and self.forward_s <= 0:
            raise _refused(
                "a block's forward_s must be above 0 (a transformer layer takes time); re-measure with `plan profile`"
            )
        return self


class MatmulPoint(_Spec):
    """One point of the GEMM sweep."""

    n: Integer(1, MAX_WIDTH) = Field(description="Square GEMM size n (n x n times n x n).")
    flops: Real(0, MAX_FLOPS, "FLOPs", open_lo=True) = Field(description="2 n^3.")
    seconds: Real(MIN_SECONDS, MAX_SECONDS, "s") = Field(description="Median time of one GEMM.")
    tflops: Real(0, MAX_TFLOPS, "TFLOP/s", open_lo=True) = Field(description="Achieved TFLOP/s.")


class TimedPoint(_Spec):
    """One timed collective call."""

    nbytes: Integer(1, INT_LIMIT - 1) = Field(description="Size of the full buffer, bytes.")
    seconds: Real(MIN_SECONDS, MAX_SECONDS, "s") = Field(
        description="Median over repetitions of the slowest rank's time."
    )


class CollectiveSweep(_Spec):
    """A collective timed over message sizes on one group shape, and its alpha-beta fit."""

    collective: Collective = Field(description="Collective kind.")
    group_size: Integer(1, MAX_GPUS) = Field(description="Ranks in the group.")
    inter_node: bool = Field(description="The group spans nodes.")
    points: list[TimedPoint] = Field(min_length=2, description="Timed sizes.")
    latency_us: Real(0, MAX_US, "microseconds") = Field(description="Fitted alpha, microseconds.")
    bandwidth_gbps: Real(MIN_GBPS, MAX_GBPS, "GB/s") = Field(description="Fitted bus bandwidth, GB/s.")
    max_relative_error: Real(0, MAX_GIB) = Field(description="Largest |fit - measured| / measured over the points.")


class MeasuredProfile(_Spec):
    """What `plan profile` measured, beside the preset-shaped hardware numbers."""

    environment: ProfileEnvironment = Field(description="Where and how it was measured.")
    model: ModelSpec = Field(
        description="The model whose layers were measured; the cost model uses the layer times only for this model."
    )
    layers: list[LayerMeasurement] = Field(description="Per layer kind, micro-batch size and TP shard.")
    matmul: list[MatmulPoint] = Field(description="GEMM sweep behind the efficiency curve.")
    memory_bandwidth_gbps: Real(MIN_GBPS, MAX_GBPS, "GB/s") = Field(description="Measured copy bandwidth, GB/s.")
    collectives: list[CollectiveSweep] = Field(description="Timed collectives and their fits.")

    @model_validator(mode="after")
    def _one_measurement_per_shape(self) -> "MeasuredProfile":
        seen = set()
        for x in self.layers:
            key = (x.kind, x.micro_batch_size, x.seq_len, x.tp)
            if key in seen:
                raise _refused(
                    f"layers: two measurements of the {x.kind} at micro-batch {x.micro_batch_size}, sequence "
                    f"{x.seq_len}, tp {x.tp}; keep one"
                )
            seen.add(key)
        return self


class Uncertainty(_Spec):
    """How far a prediction may be off: the cross-validated error of the cost model on the
    published runs (benchmarks/fidelity_published.py writes it)."""

    relative: Real(0, 1_000) = Field(description="Relative half-width of the interval: step time x/ (1 + relative).")
    coverage: Real(0, 1, open_lo=True, open_hi=True) = Field(
        description="Fraction of held-out published runs inside the interval."
    )
    compute: Optional[Real(0, 1_000)] = Field(
        default=None,
        description="Per term: relative half-width of the time spent computing (compute, recompute, pipeline bubble, optimizer). "
        "With `communication`, a plan's interval is x/ exp(sqrt((f_c ln(1 + compute))^2 + (f_m ln(1 + communication))^2)), "
        "f_c and f_m the shares of its step time; None: `relative` for every plan.",
    )
    communication: Optional[Real(0, 1_000)] = Field(
        default=None, description="Per term: relative half-width of the exposed communication (TP, pipeline sends, DP)."
    )
    calibrated_gpus: Optional[Integer(1, MAX_GPUS)] = Field(
        default=None,
        description="GPUs of the largest run the interval was fitted on: a plan on more has its log half-width widened "
        "by `extrapolation` per doubling beyond (schema 1.15).",
    )
    calibrated_shard: Optional[Integer(1, MAX_GPUS)] = Field(
        default=None,
        description="Ranks of the largest ZeRO / FSDP shard group among those runs: a plan sharding its model states "
        "over more is widened the same way (schema 1.15).",
    )
    extrapolation: Real(0, 10) = Field(
        default=0.5,
        description="Growth of the log half-width per doubling beyond the calibrated region (benchmarks/"
        "fidelity_published.py checks it on each source left out).",
    )
    widened_for: Optional[str] = Field(
        default=None,
        description="Why these half-widths are already widened (an uncalibrated device: its stack's constants taken as "
        "they are), said with every estimate.",
    )

    def widening(self, gpus: int, shard: int) -> tuple[float, list[str]]:
        """The factor on the log half-width of a plan on `gpus` GPUs sharding its model states over
        `shard` ranks (0: none), and a line per reason: each doubling beyond the calibrated region
        adds `extrapolation` (compounded over both)."""
        factor, why = 1.0, [self.widened_for] if self.widened_for else []
        for n, most, what in (
            (gpus, self.calibrated_gpus, "GPUs, beyond the {:,} of the largest calibrated run"),
            (shard, self.calibrated_shard, "ranks per ZeRO shard group, beyond the {:,} of the calibrated runs"),
        ):
            if most and n > most:
                f = 1 + self.extrapolation * math.log2(n / most)
                factor *= f
                why.append(f"{n:,} {what.format(most)} (x{f:.2f})")
        return factor, why

    def log_halfwidth(self, compute_share: float, communication_share: float) -> float:
        """ln of the interval's factor for a step with these shares of compute and communication."""
        if self.compute is None or self.communication is None:
            return math.log1p(self.relative)
        return math.hypot(
            compute_share * math.log1p(self.compute), communication_share * math.log1p(self.communication)
        )


# How planner/tune/output.py:tuned_profile's provenance begins: what marks the tuned profiles
# written before StackConstants.tuned.
TUNE_PROVENANCE = "plan tune,"


class StackConstants(_Spec):
    """The constants that are properties of the software a plan runs on, not of the hardware:
    how fast one training stack's kernels run on this cluster's device, fitted to that stack's
    own published runs (benchmarks/fidelity_published.py) or to trials measured by `plan tune`.
    On a cluster that has an entry for a plan's stack (JobSpec.target) they replace the device's
    and the cluster's own figures (ClusterSpec.for_target)."""

    sustained_fraction: Real(0, 1, open_lo=True) = Field(
        description="Throughput the stack's training loop sustains relative to the device's microbenchmarks (multiplies GEMM and attention rates)."
    )
    kernel_overhead_us: Real(0, 10_000, "us") = Field(
        description="Gap per modelled operator between kernels (launches, casts and copies around it), microseconds."
    )
    overlap_efficiency: Real(0, 1) = Field(
        description="Fraction of overlapped communication that is free (1 - the slowdown compute suffers beside a collective)."
    )
    step_overhead_s: Real(0, 60, "s") = Field(
        default=0.0,
        description="Time per optimizer step the GPUs wait on the training loop's host work (the optimizer's launches, gradient "
        "clipping, metrics and logging, the next batch), seconds; added once per step (schema 1.12; read without it, 0).",
    )
    uncertainty: Optional[Uncertainty] = Field(
        default=None, description="Out-of-group error of this stack's predictions (None: the cluster's)."
    )
    provenance: Optional[str] = Field(default=None, description="What the constants were fitted on, when and how.")
    tuned: bool = Field(
        default=False,
        description="Whether `plan tune` fitted these constants to trials of this stack measured on this cluster "
        "(provenance says which): a profile with a tuned stack plans for its tuned stacks only (`plan solve` without "
        "--target searches those; a --target of another stack is refused). (schema 1.15; read without it, true where "
        "provenance begins 'plan tune', as in the tuned profiles written before it.)",
    )

    @model_validator(mode="before")
    @classmethod
    def _tuned_from_provenance(cls, data):
        """A profile tuned before the field: its tuned entries are those `plan tune` wrote."""
        provenance = data.get("provenance") if isinstance(data, dict) else None
        if isinstance(provenance, str) and provenance.startswith(TUNE_PROVENANCE) and "tuned" not in data:
            return {**data, "tuned": True}
        return data


class Spine(_Spec):
    """The scale-out network's second level where it is oversubscribed: leaf switches each
    serving `nodes_per_leaf` nodes at full bandwidth, joined by spine switches whose uplinks
    carry 1 / `oversubscription` of what the leaf's nodes can send. (Added December 2026;
    absent: a non-blocking fat tree, as NVIDIA's DGX SuperPOD reference designs are.)"""

    nodes_per_leaf: Integer(1, MAX_GPUS) = Field(
        description="Nodes under one leaf (one scalable unit of a rail-optimised design: e.g. 32 DGX nodes), at full bandwidth."
    )
    oversubscription: Real(1, 64) = Field(
        description="Leaf downlink bandwidth over uplink bandwidth (1: non-blocking; 2: a 2:1 taper)."
    )


class ClusterSpec(_Spec):
    """A cluster of identical nodes: the hardware profile every command reads.

    Shipped presets (hardware_profiles/presets/*.json) and profiles measured by
    ``plan profile`` share this schema.
    """

    name: str = Field(description="Cluster name, e.g. 'dgx-a100-80gb'.")
    device: DeviceSpec = Field(description="The accelerator in every slot.")
    gpus_per_node: Integer(1, 4096) = Field(description="Accelerators per node.")
    num_nodes: Optional[Integer(1, MAX_GPUS)] = Field(
        default=None,
        description="Nodes available; None means as many as a command asks for (a preset of one node type).",
    )
    scaleup_domain_gpus: Optional[Integer(1, MAX_GPUS)] = Field(
        default=None,
        description="GPUs that share the intra_node link (the scale-up domain, e.g. 72 on a GB200 NVL72 rack of 18 hosts "
        "of 4), a whole number of nodes; None: one node. Groups inside a domain take intra_node's figures, groups "
        "across domains inter_node's. (schema 1.8)",
    )
    spine: Optional[Spine] = Field(
        default=None,
        description="An oversubscribed spine above the scale-out network's leaves; None: non-blocking. It slows the "
        "traffic that crosses leaves all at once (an all-to-all over more nodes than a leaf serves), not rings, whose "
        "one flow per leaf boundary the uplinks carry at full speed (cost_models/tables.py:all_to_all_time).",
    )
    intra_node: LinkTier = Field(
        description="Link between GPUs of one scale-up domain (a node unless scaleup_domain_gpus says more)."
    )
    inter_node: LinkTier = Field(description="Link between scale-up domains, per GPU (one NIC per GPU on DGX).")
    overlap_efficiency: Real(0, 1) = Field(
        default=1.0,
        description="Fraction of the data-parallel communication that can hide behind compute: 1 where collectives run on their own engines (NCCL on GPUs); `plan profile` measures it.",
    )
    source: Optional[str] = Field(default=None, description="Where each number comes from.")
    uncertainty: Optional[Uncertainty] = Field(
        default=None,
        description="Cross-validated error of predictions on this preset's kind of hardware; None: unknown.",
    )
    measured: Optional[MeasuredProfile] = Field(
        default=None,
        description="Per-layer measurements, sweeps and environment written by `plan profile` (None for presets).",
    )
    stack_constants: dict[Target, StackConstants] = Field(
        default_factory=dict,
        description="Per training stack (JobSpec.target): the software's constants on this cluster, fitted to that stack's runs; "
        "a stack without an entry uses the device's and the cluster's own figures. (schema 1.7)",
    )

    @property
    def tuned_stacks(self) -> tuple[Target, ...]:
        """The stacks `plan tune` fitted this cluster's constants for (StackConstants.tuned), in
        Target's order; () for a preset or a measured profile no tune has refit."""
        return tuple(t for t in Target if t in self.stack_constants and self.stack_constants[t].tuned)

    @property
    def domain_gpus(self) -> int:
        """GPUs on the fast link: the scale-up domain (scaleup_domain_gpus), else one node."""
        return self.scaleup_domain_gpus or self.gpus_per_node

    def for_target(self, target: "Target | str") -> "ClusterSpec":
        """This cluster as the cost model sees it under `target`: the stack's constants (if it
        has an entry) in place of the device's sustained fraction and kernel gap and the
        cluster's overlap efficiency and uncertainty. Idempotent."""
        k = self.stack_constants.get(Target(target))
        if k is None:
            return self
        dev = self.device
        if (dev.sustained_fraction, dev.kernel_overhead_us, self.overlap_efficiency) == (
            k.sustained_fraction,
            k.kernel_overhead_us,
            k.overlap_efficiency,
        ) and (k.uncertainty is None or k.uncertainty == self.uncertainty):
            return self
        dev = dev.model_copy(
            update={"sustained_fraction": k.sustained_fraction, "kernel_overhead_us": k.kernel_overhead_us}
        )
        update = {"device": dev, "overlap_efficiency": k.overlap_efficiency}
        if k.uncertainty is not None:
            update["uncertainty"] = k.uncertainty
        return self.model_copy(update=update)

    def step_overhead_s(self, target: "Target | str") -> float:
        """The host time per optimizer step of `target`'s training loop on this cluster
        (StackConstants.step_overhead_s; 0 for a stack without an entry)."""
        k = self.stack_constants.get(Target(target))
        return k.step_overhead_s if k is not None else 0.0

    @model_validator(mode="after")
    def _domain_of_whole_nodes(self) -> "ClusterSpec":
        d = self.scaleup_domain_gpus
        if d is not None and d % self.gpus_per_node:
            raise ValueError(f"scaleup_domain_gpus {d} is not a whole number of nodes of {self.gpus_per_node} GPUs")
        return self

    @model_validator(mode="after")
    def _tiers_complete(self) -> "ClusterSpec":
        for tier in (self.intra_node, self.inter_node):
            for c in REQUIRED_COLLECTIVES:
                if not tier.has(c):
                    raise ValueError(
                        f"link tier {tier.name!r} has no fit for {c.value}; every tier needs all of "
                        f"{', '.join(x.value for x in REQUIRED_COLLECTIVES)} ({Collective.all_to_all.value} "
                        "is optional)"
                    )
        return self


# Of device memory that `plan solve` leaves free unless told otherwise. Set from measured
# residuals: against four published Megatron-Bridge peaks (benchmarks/memory_vs_stacks.py) our
# peak is 1.0% under on average and at most 3.0% under; 5% covers the largest with a margin,
# and the rest of the stacks' own estimators agree with ours to within 1.7% explained.
MEMORY_HEADROOM = 0.05


def memory_limit_gib(cluster: "ClusterSpec", requested_gib: Optional[float] = None) -> float:
    """The per-GPU memory a plan may use: the device's less a 5% headroom (what the estimate
    cannot see: allocator fragmentation peaks, workspaces of kernels chosen at run time), or
    what the user asks, up to the whole device."""
    cap = cluster.device.memory_gib
    return min(requested_gib, cap) if requested_gib else cap * (1.0 - MEMORY_HEADROOM)
