"""Every schema of the planner, defined once.

Model, cluster (hardware profile), training job, plan and estimate are pydantic models
with ``extra="forbid"`` and a description on every field. JSON/YAML in and out goes
through them; a measured profile (``plan profile``) and a shipped preset are the same
:class:`ClusterSpec`.

Units: time in seconds unless a field name says otherwise (``_us`` microseconds),
bandwidth in GB/s (1e9 bytes/s), memory capacity in GiB (2**30 bytes), throughput in
TFLOP/s (1e12 FLOP/s).
"""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass
from enum import Enum
from typing import Annotated, ClassVar, Optional

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

# 1.1: a pipeline rank is called so (`pipeline_rank`, `memory_gib_per_pipeline_rank`,
# `bottleneck_pipeline_rank`, `pipeline_ranks`); "stage" means a virtual pipeline stage only.
# Readers still accept the 1.0 names (_renamed below).
# 1.6: `plan solve` without --target searches every stack: SolveDocument.stacks, tie_rule and
# Alternative.target (planner/search/stacks.py); read without them, alternatives are job.target's.
# 1.7: ClusterSpec.stack_constants: each training stack's own fitted constants (StackConstants),
# which the cost model reads for a job's target (ClusterSpec.for_target); read without, none.
# 1.8: SizeDocument, `plan size --json`; the other documents are unchanged.
SCHEMA_VERSION = "1.8"


# ----- numbers
# Every number a document holds is a JSON number of the field's kind within bounds that mean
# something physically: beyond them a value is a typo or an attack, and refused in one line
# naming the range, before it can overflow to infinity in the cost model (a bandwidth of 1e-300
# GB/s gives steps of 1e300 s; a width of 10**309 is no float at all). The bounds:
MAX_GPUS = 2**20  # the largest clusters built have ~10^5 GPUs
MAX_GLOBAL_BATCH = 10**8  # no optimizer step holds 10^8 sequences
MAX_SEQ_LEN = 10**8  # no context is 10^8 tokens
MAX_VOCAB = 10**8  # vocabularies are ~10^5 tokens
MAX_LAYERS = 100_000  # the deepest published transformers have ~10^2-10^3 layers
MAX_COUNT = 100_000  # heads, KV heads, experts, top-k: the most published are ~10^2-10^3
MAX_WIDTH = 10**7  # hidden and MLP widths: the widest published are ~10^5
MAX_TFLOPS = 1e6  # TFLOP/s of one device: an H100 has ~2e3 (FP8)
MIN_TFLOPS = 1e-6  # 1 MFLOP/s: a slower "device" is a unit mistake
MAX_GIB = 1e6  # no device has 10^6 GiB of memory (an H200 has 141)
MAX_GBPS = 1e6  # no memory or link moves 10^6 GB/s (HBM3e: ~5e3, NVLink 5: 1.8e3)
MIN_GBPS = 1e-3  # 1 MB/s: a slower link is a unit mistake
MIN_FRACTION = 1e-4  # an efficiency or fraction of peak below 0.01% is a unit mistake
MAX_US = 1e7  # a latency or overhead of 10 s per call is a stuck machine, not a figure
MAX_SECONDS = 1e4  # one measured layer, GEMM or collective call longer than ~3 hours
MIN_SECONDS = 1e-12  # a picosecond: below any kernel or call
MAX_FLOPS = 1e30  # FLOPs of one GEMM or layer pass (a 10^7-wide square GEMM is 2e21)
MAX_BYTES = 1e18  # an exabyte
INT_LIMIT = 2**63  # what an int64 holds: no count of a document is larger


@dataclass(frozen=True)
class _Bounds:
    """The range of a bounded number (what its one-line refusal states)."""

    kind: type  # int or float
    lo: float
    hi: float
    open_lo: bool = False
    open_hi: bool = False
    unit: str = ""

    def range_text(self) -> str:
        lo = f"above {_num(self.lo)}" if self.open_lo else f"at least {_num(self.lo)}"
        hi = f"below {_num(self.hi)}" if self.open_hi else f"at most {_num(self.hi)}"
        what = "an integer" if self.kind is int else "a number"
        return f"{what} {lo} and {hi}{' ' + self.unit if self.unit else ''}"

    def check(self, value):
        integer = isinstance(value, numbers.Integral) and not isinstance(value, bool)
        real = integer or (isinstance(value, numbers.Real) and not isinstance(value, bool))
        if not (integer if self.kind is int else real):
            raise PydanticCustomError("number_type", "must be {range}, got {got}", {"range": self.range_text(), "got": _shown(value)})
        if not integer and not math.isfinite(value):
            raise PydanticCustomError("finite_number", "must be {range}, got {got}", {"range": self.range_text(), "got": _shown(value)})
        low = value <= self.lo if self.open_lo else value < self.lo
        high = value >= self.hi if self.open_hi else value > self.hi
        if low or high:  # int against float compares exactly, without converting: 10**400 > 1e6
            raise PydanticCustomError("number_range", "must be {range}, got {got}", {"range": self.range_text(), "got": _shown(value)})
        return int(value) if self.kind is int else float(value)


def _num(x: float) -> str:
    if float(x).is_integer() and abs(x) < 1e13:
        return f"{int(x):,}"
    return f"{x:g}"


def _shown(value) -> str:
    """A refused value as a message shows it: short, never the thousands of digits of a huge int."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**15:
        return f"an integer of {len(str(abs(value))) if value.bit_length() < 10_000 else 'thousands of'} digits"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def Integer(lo: int, hi: int, unit: str = ""):
    """An integer field within [lo, hi]: a JSON integer, never a bool, a string or a float."""
    bounds = _Bounds(int, lo, hi, unit=unit)
    return Annotated[int, Field(ge=lo, le=hi), BeforeValidator(bounds.check), bounds]


def Real(lo: float, hi: float, unit: str = "", *, open_lo: bool = False, open_hi: bool = False):
    """A finite real field within lo..hi (open_lo / open_hi: the bound itself excluded): a JSON
    number (an integer is read as a float), never a bool or a string."""
    bounds = _Bounds(float, lo, hi, open_lo, open_hi, unit)
    limits = Field(**{"gt" if open_lo else "ge": lo, "lt" if open_hi else "le": hi})
    return Annotated[float, limits, BeforeValidator(bounds.check), bounds]


Fraction = Real(MIN_FRACTION, 1)  # an efficiency or fraction of peak


def number_problem(spec: type[BaseModel], field: str, value) -> Optional[str]:
    """Why `value` cannot be the bounded number `field` of `spec`, as its refusal says it (e.g.
    "must be an integer at least 1 and at most 1,048,576, got 0"), or None: for values checked
    before any arithmetic is done with them (a layout's degrees, planner/inputs.py)."""
    info = spec.model_fields.get(field)
    bounds = next((m for m in info.metadata if isinstance(m, _Bounds)), None) if info else None
    if bounds is None:
        return None
    try:
        bounds.check(value)
    except PydanticCustomError as exc:
        return exc.message()
    return None


class _Spec(BaseModel):
    """Every spec: unknown fields refused, numbers finite (no NaN / infinity), and every value of
    its field's kind: a `true`, "12" or 2.5 where a count belongs is refused, not read as 1 or 12;
    a 1 or "false" where a yes/no belongs is refused, not read as true. Bounded fields (Integer,
    Real) check themselves and state their range; the rest are checked by kind here."""

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=(), allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _values_of_their_kind(cls, value, info):
        field = cls.model_fields.get(info.field_name) if info.field_name else None
        if isinstance(value, str) and info.field_name and info.field_name.endswith("name") and _CONTROL.search(value):
            # a name is printed in titles, tables and error lines: a newline or an escape
            # sequence in it would break or restyle them
            raise PydanticCustomError("strict_type", "a name may not hold control characters (newlines, escapes), got {shown}",
                                      {"shown": _shown(value)})
        if field is None or any(isinstance(m, _Bounds) for m in field.metadata):
            return value
        kind = _plain_kind(field.annotation)
        if kind is None or value is None:
            return value
        plain, listed = kind
        items = (value if isinstance(value, list) else ()) if listed else (value,)  # a list's other shapes: pydantic's
        for item in items:
            problem = _kind_problem(plain, item)
            if problem:
                raise PydanticCustomError("strict_type", problem, {})
        return value


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _refused(message: str) -> PydanticCustomError:
    """A validator's refusal whose message is shown as it is (no "Value error, " before it)."""
    return PydanticCustomError("spec", message, {})  # no context: braces in the message stay as they are


def _plain_kind(annotation) -> Optional[tuple[type, bool]]:
    """(bool, int or float; whether a list of them) for a field of that plain type, Optional or
    not; None for anything else (models, enums, strings, bounded numbers)."""
    args = [a for a in getattr(annotation, "__args__", ()) if a is not type(None)]
    if getattr(annotation, "__origin__", None) is list and len(args) == 1 and args[0] in (bool, int, float):
        return args[0], True
    if annotation in (bool, int, float):
        return annotation, False
    if len(args) == 1 and args[0] in (bool, int, float) and type(None) in annotation.__args__:
        return args[0], False
    return None


def _kind_problem(kind: type, value) -> Optional[str]:
    """Why `value` is not a `kind` (bool, int, float) as JSON spells one, or None."""
    if kind is bool:
        return None if isinstance(value, bool) else f"must be true or false, got {_shown(value)}"
    if isinstance(value, bool) or isinstance(value, str) or (kind is int and isinstance(value, float)):
        return f"must be {'an integer' if kind is int else 'a number'}, got {_shown(value)}"
    if isinstance(value, int) and (abs(value) >= INT_LIMIT if kind is int else abs(value) > 1e308):
        return f"must be {'an integer' if kind is int else 'a number'} below {2**63 if kind is int else 1e308:g}, got {_shown(value)}"
    return None


# --------------------------------------------------------------------------- enums


class Activation(str, Enum):
    """MLP flavour: GELU (two matrices, h -> f -> h), or a gated linear unit of three (gate, up,
    down: down(act(gate x) * up x)) whose gate goes through SiLU (SwiGLU: Llama, Mistral, Qwen)
    or tanh-approximated GELU (GeGLU: Gemma). The two gated ones cost the same: the same GEMMs
    and one elementwise activation (Shazeer 2020, "GLU Variants Improve Transformer")."""

    gelu = "gelu"
    swiglu = "swiglu"
    geglu = "geglu"


class DType(str, Enum):
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"


DTYPE_BYTES = {DType.fp32: 4, DType.bf16: 2, DType.fp16: 2}


class Optimizer(str, Enum):
    adam = "adam"
    sgd = "sgd"


class Target(str, Enum):
    """The training stack a plan will run on: its kernels, overlap and what it can express are
    stated in planner/stacks/<value>/."""

    generic = "generic"  # PyTorch eager: FlashAttention-2 through SDPA, no TP overlap
    megatron = "megatron"  # Megatron-Core / NeMo with Transformer Engine: cuDNN fused attention, TP comm overlap
    deepspeed = "deepspeed"
    torchtitan = "torchtitan"
    accelerate = "accelerate"  # Hugging Face Accelerate with FSDP2 (and its ParallelismConfig TP)


# The fused-attention kernels a device table (DeviceSpec.attention) may list, each stack running
# one (planner/stacks: Stack.attention_kernel): FlashAttention-2 (through SDPA) and Transformer
# Engine's cuDNN attention.
ATTENTION_KERNELS = ("flash2", "cudnn")


class LossKernel(str, Enum):
    """How the cross-entropy over the vocabulary is computed, which sets what the loss holds
    per logit (cost_models/memory.py:loss_bytes_per_logit)."""

    eager = "eager"  # PyTorch eager: logits upcast to fp32, log-softmax saved, fp32 gradient
    vocab_parallel = "vocab-parallel"  # Megatron's fused vocab-parallel cross-entropy: fp32 softmax in place
    fused = "fused"  # a fused kernel (flash-attn's cross_entropy, llm-foundry's default): 16-bit logits, in-kernel softmax


class Schedule(str, Enum):
    """Pipeline schedule (Narayanan et al. 2021, sec. 2.2)."""

    gpipe = "gpipe"
    one_f_one_b = "1f1b"
    interleaved_1f1b = "interleaved-1f1b"


class Recompute(str, Enum):
    """Activation recomputation (Korthikanti et al. 2022).

    none: keep every activation; selective: recompute only the core attention
    (QK^T, softmax, dropout, AV); full: keep only each layer's input and rerun its forward
    during backward.
    """

    none = "none"
    selective = "selective"
    full = "full"
    mixed = "mixed"  # layers under different modes: Plan.stage_recompute says which (schema 1.3)


class Axis(str, Enum):
    """Mesh axes. Glossary: dp = data parallel (replicas of the model, each on a slice of
    the batch); tp = tensor parallel (each weight matrix split across GPUs); pp = pipeline
    parallel (consecutive layers on different GPUs)."""

    dp = "dp"
    tp = "tp"
    pp = "pp"


class Collective(str, Enum):
    all_reduce = "all_reduce"
    all_gather = "all_gather"
    reduce_scatter = "reduce_scatter"
    p2p = "p2p"


# --------------------------------------------------------------------------- model


class ModelSpec(_Spec):
    """A decoder-only transformer (GPT / Llama family)."""

    name: str = Field(description="Model name, e.g. 'gpt3-175b'.")
    num_layers: Integer(1, MAX_LAYERS) = Field(description="Number of transformer layers (blocks).")
    hidden_size: Integer(1, MAX_WIDTH) = Field(description="Model width h.")
    num_heads: Integer(1, MAX_COUNT) = Field(description="Attention (query) heads a.")
    attention_head_dim: Optional[Integer(1, MAX_WIDTH)] = Field(
        default=None,
        description="Width of one attention head when it is not hidden_size / num_heads (Qwen3, GPT-OSS: the query and "
        "output projections are then h x (heads x head_dim)); None: hidden_size / num_heads (schema 1.4).",
    )
    num_kv_heads: Optional[Integer(1, MAX_COUNT)] = Field(
        default=None, description="Key/value heads for grouped-query attention; None means equal to num_heads (MHA)."
    )
    ffn_hidden_size: Optional[Integer(1, MAX_WIDTH)] = Field(
        default=None, description="MLP inner width f; None means 4*h (GPT convention)."
    )
    vocab_size: Integer(1, MAX_VOCAB) = Field(description="Vocabulary size V (padded, as the embedding table is allocated).")
    max_seq_len: Integer(1, MAX_SEQ_LEN) = Field(description="Context length the model was trained with (learned position table size).")
    activation: Activation = Field(
        default=Activation.gelu,
        description="MLP flavour: 'gelu' (2 matrices), 'swiglu' or 'geglu' (3 matrices: gate, up, down; 'geglu' schema 1.6).",
    )
    tied_embeddings: bool = Field(default=False, description="Input embedding and LM head share one matrix.")
    learned_position_embeddings: bool = Field(
        default=True, description="A learned position table of max_seq_len x h (GPT); False for rotary (Llama)."
    )
    linear_bias: bool = Field(default=True, description="Linear layers carry biases (GPT yes, Llama no).")
    norm: str = Field(default="layernorm", description="'layernorm' (weight+bias) or 'rmsnorm' (weight only).")
    norms_per_layer: Integer(2, 4) = Field(
        default=2,
        description="Norms of width h in a layer: 2 (before attention and before the MLP; OLMo 2 normalises their outputs "
        "instead, at the same cost), 4 (Gemma 2 and 3: before and after each). Each keeps its input for backward. (schema 1.6)",
    )
    qk_norm: bool = Field(
        default=False, description="Queries and keys are normalised per head before attention (Qwen3, Gemma 3, OLMo 2). (schema 1.6)"
    )
    sliding_window: Optional[Integer(1, MAX_SEQ_LEN)] = Field(
        default=None,
        description="Keys a query attends to in the sliding-window layers (Mistral 7B v0.1: 4096); None: full causal attention. (schema 1.6)",
    )
    sliding_window_layers: Integer(0, MAX_LAYERS) = Field(
        default=0,
        description="How many layers attend within sliding_window (Gemma 2: every other one); 0 without a window.",
    )
    logit_softcapping: bool = Field(
        default=False, description="The logits are soft-capped, c tanh(logits / c), before the loss (Gemma 2). (schema 1.6)"
    )
    dropout: bool = Field(
        default=True,
        description="Dropout after attention and MLP (stores 1-byte masks, Korthikanti et al.); Llama-style models train without.",
    )
    param_dtype: DType = Field(
        default=DType.bf16,
        description="Training precision when the job names none (16-bit mixed precision: bf16). A Hugging Face config's "
        "torch_dtype is the checkpoint's storage dtype, not this: such a model trains in bf16 unless told otherwise.",
    )
    num_experts: Optional[Integer(2, MAX_COUNT)] = Field(
        default=None,
        description="Mixture-of-experts: routed experts per MoE layer; None for a dense model (schema 1.4).",
    )
    experts_per_token: Optional[Integer(1, MAX_COUNT)] = Field(default=None, description="Routed experts each token goes to (top-k).")
    moe_ffn_hidden_size: Optional[Integer(1, MAX_WIDTH)] = Field(default=None, description="Inner width of one expert's MLP; None means ffn_hidden_size.")
    num_shared_experts: Integer(0, 1_000) = Field(default=0, description="Experts every token goes to besides the routed ones (DeepSeek).")
    first_dense_layers: Integer(0, MAX_LAYERS) = Field(
        default=0, description="The first k layers have a dense MLP of ffn_hidden_size instead of experts (DeepSeek-V3: 3)."
    )
    source: Optional[str] = Field(default=None, description="Where the numbers come from (paper, config file).")

    @field_validator("norm")
    @classmethod
    def _norm_kind(cls, v: str) -> str:
        if v not in ("layernorm", "rmsnorm"):
            raise ValueError(f"norm must be 'layernorm' or 'rmsnorm', not {v!r}")
        return v

    @model_validator(mode="after")
    def _shapes(self) -> "ModelSpec":
        if self.attention_head_dim is None and self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
        if self.num_heads % self.kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not divisible by num_kv_heads {self.kv_heads}")
        if self.num_experts is None:
            if self.experts_per_token or self.moe_ffn_hidden_size or self.num_shared_experts or self.first_dense_layers:
                raise ValueError("experts_per_token, moe_ffn_hidden_size, num_shared_experts and first_dense_layers need num_experts")
        else:
            if self.experts_per_token is None or self.experts_per_token > self.num_experts:
                raise ValueError(f"a mixture-of-experts model needs experts_per_token between 1 and num_experts ({self.num_experts})")
            if self.first_dense_layers >= self.num_layers:
                raise ValueError(f"first_dense_layers {self.first_dense_layers} leaves no MoE layer of {self.num_layers}")
        if self.sliding_window is None and self.sliding_window_layers:
            raise ValueError("sliding_window_layers needs sliding_window")
        if self.sliding_window is not None and not 0 < self.sliding_window_layers <= self.num_layers:
            raise ValueError(f"sliding_window needs sliding_window_layers between 1 and num_layers ({self.num_layers})")
        return self

    @property
    def gated(self) -> bool:
        """The MLP is a gated linear unit: gate, up and down matrices (SwiGLU, GeGLU)."""
        return Activation(self.activation) != Activation.gelu

    @property
    def is_moe(self) -> bool:
        return self.num_experts is not None

    @property
    def moe_ffn(self) -> int:
        """One expert's MLP width."""
        return self.moe_ffn_hidden_size or self.ffn

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def ffn(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def head_dim(self) -> int:
        return self.attention_head_dim or self.hidden_size // self.num_heads

    @property
    def q_width(self) -> int:
        """Width of the queries (and of the attention output before its projection): heads x head_dim."""
        return self.num_heads * self.head_dim


# --------------------------------------------------------------------------- hardware


class EfficiencyPoint(_Spec):
    """One point of the achievable-matmul-efficiency curve."""

    gemm_flops: Real(0, MAX_FLOPS, 'FLOPs', open_lo=True) = Field(description="FLOPs of one GEMM call (2*m*n*k).")
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
    k_overhead: Real(0, MAX_WIDTH) = Field(default=64, description="Per-tile prologue/epilogue, in equivalent k elements.")
    wave_tail: Real(0, 1) = Field(default=0.25, description="Average idle fraction of the last wave, in waves.")
    max_efficiency: Fraction = Field(description="Best achievable fraction of peak of a large, aligned GEMM (measured, e.g. MAMF).")
    fp8_max_efficiency: Optional[Fraction] = Field(
        default=None, description="The same for FP8 GEMMs, as a fraction of DeviceSpec.fp8_peak_tflops (schema 1.4)."
    )


class AttentionEfficiency(_Spec):
    """Achieved fraction of peak of the fused attention kernel (FlashAttention-style)."""

    forward: Fraction = Field(description="Forward kernel, FLOPs executed / (peak x time).")
    backward: Fraction = Field(description="Backward kernel (2.5x the forward FLOPs: it recomputes the scores).")


class DeviceSpec(_Spec):
    """One accelerator."""

    name: str = Field(description="Device name, e.g. 'A100-SXM4-80GB'.")
    peak_tflops: dict[DType, Real(MIN_TFLOPS, MAX_TFLOPS, 'TFLOP/s')] = Field(min_length=1, description="Peak dense (no sparsity) TFLOP/s per compute dtype.")
    fp8_peak_tflops: Optional[Real(MIN_TFLOPS, MAX_TFLOPS, 'TFLOP/s')] = Field(
        default=None,
        description="Peak dense FP8 tensor-core TFLOP/s (H100/H200, B200/GB200, MI300X and later); None: the device has no FP8 GEMMs (schema 1.4).",
    )

    memory_gib: Real(1e-3, MAX_GIB, 'GiB') = Field(description="Device memory capacity in GiB.")
    memory_bandwidth_gbps: Real(MIN_GBPS, MAX_GBPS, 'GB/s') = Field(description="Peak memory bandwidth in GB/s.")
    memory_bandwidth_efficiency: Fraction = Field(
        default=0.8, description="Achieved fraction of memory bandwidth by element-wise kernels (norms, activations, softmax)."
    )
    matmul_efficiency: Optional[list[EfficiencyPoint]] = Field(
        default=None, min_length=1,
        description="Achievable GEMM efficiency versus GEMM size (measured square GEMMs); interpolated linearly in "
        "log10(FLOPs), clamped at the ends. Used where `gemm` (the shape model) is not given; one of the two is required.",
    )
    framework_overhead_gib: Real(0, MAX_GIB, 'GiB') = Field(
        default=2.0, description="Memory per device that is not model state: CUDA context, communicator buffers, allocator fragmentation."
    )
    gemm: Optional[GemmModel] = Field(
        default=None, description="Shape-aware GEMM model; None: GEMMs follow matmul_efficiency by FLOPs (measured CPU profiles)."
    )
    attention: Optional[dict[str, AttentionEfficiency]] = Field(
        default=None,
        description="Fused attention kernel efficiency by kernel ('flash2': FlashAttention-2; 'cudnn': cuDNN / "
        "FlashAttention-3 class, as Transformer Engine runs it); None: attention runs as GEMMs. A table needs 'flash2', the "
        "kernel every stack but megatron runs; without 'cudnn', megatron's attention is costed at flash2's efficiency.",
    )
    kernel_overhead_us: Real(0, MAX_US, 'microseconds') = Field(
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
                raise _refused("attention needs a 'flash2' entry (FlashAttention-2's forward and backward efficiency, the kernel "
                                 "every target but megatron runs), or leave attention out to cost attention as GEMMs")
        if self.fp8_peak_tflops is not None and (self.gemm is None or self.gemm.fp8_max_efficiency is None):
            raise _refused("fp8_peak_tflops needs gemm.fp8_max_efficiency (the fraction of it an FP8 GEMM achieves), or leave "
                             "fp8_peak_tflops out for a device without FP8 GEMMs")
        return self


class CollectiveFit(_Spec):
    """Alpha-beta model of one collective on one link tier: time = latency + volume / bandwidth.

    ``bandwidth_gbps`` is the *bus* bandwidth in the NCCL-tests sense, so the volume is the
    per-rank ring volume: 2(n-1)/n x bytes for all-reduce, (n-1)/n x bytes for all-gather and
    reduce-scatter (bytes = the full, unsharded buffer), bytes for point-to-point.
    """

    collective: Collective = Field(description="Collective kind.")
    group_size: Optional[Integer(1, MAX_GPUS)] = Field(
        default=None, description="Group size this fit was measured at; None means it applies to any size."
    )
    latency_us: Real(0, MAX_US, 'microseconds') = Field(description="Fixed cost per call (alpha), microseconds.")
    bandwidth_gbps: Real(MIN_GBPS, MAX_GBPS, 'GB/s') = Field(description="Bus bandwidth (1/beta), GB/s.")


class LinkTier(_Spec):
    """One level of the network: inside a node (NVLink/NVSwitch) or across nodes (InfiniBand)."""

    name: str = Field(description="What the link is, e.g. 'NVLink3 via NVSwitch'.")
    collectives: list[CollectiveFit] = Field(min_length=1, description="Alpha-beta fits per collective (and optionally per group size).")
    hop_latency_us: Optional[Real(0, MAX_US, 'microseconds')] = Field(
        default=None,
        description="Latency of one ring step over this link (the presets take NCCL's LL128 figures); a ring collective over n ranks pays "
        "one per step (n-1 for all-gather / reduce-scatter, 2(n-1) for all-reduce). None: latency_us covers the whole call "
        "(fits measured at one group size).",
    )
    tree_hop_latency_us: Optional[Real(0, MAX_US, 'microseconds')] = Field(
        default=None, description="Latency of one level of NCCL's tree all-reduce over this link; None: no tree algorithm."
    )
    call_overhead_us: Optional[dict[Collective, Real(0, MAX_US, 'microseconds')]] = Field(
        default=None,
        description="Per collective, microseconds added to every call's latency for what a call costs a training step beyond the "
        "fits (which time calls back to back): the ranks meeting (a call waits for the last rank and wakes the blocked ones; on "
        "shared CPU cores, scheduler time slices), the framework's host work around the call (DTensor redistribution, FSDP2 "
        "copy-in / copy-out), and, where the framework issues the call synchronously, the transfer time the overlap model counts "
        "as hidden. Measured by `plan profile`: the value with which the cost model reproduces a few blocks timed as `plan run` "
        "executes them (planner/profiler/calls.py). None or a missing collective: 0 (the GPU presets: the host runs ahead).",
    )

    def fit(self, collective: Collective, group_size: int) -> CollectiveFit:
        """The fit for this collective: exact group size, else a size-free fit, else the nearest size."""
        exact = generic = nearest = None
        for f in self.collectives:
            if f.collective != collective:
                continue
            if f.group_size == group_size:
                exact = f
            elif f.group_size is None:
                generic = f
            elif nearest is None or abs(math.log(f.group_size / group_size)) < abs(math.log(nearest.group_size / group_size)):
                nearest = f
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


class LayerMeasurement(_Spec):
    """Measured cost of one layer kind at one shape, one micro-batch, on one device."""

    kind: str = Field(description="'block' (transformer layer), 'embedding' or 'head' (final norm, LM head and loss).")
    micro_batch_size: Integer(1, MAX_GLOBAL_BATCH) = Field(description="Sequences per micro-batch.")
    seq_len: Integer(1, MAX_SEQ_LEN) = Field(description="Tokens per sequence.")
    tp: Integer(1, MAX_GPUS) = Field(description="Tensor-parallel shard measured (the local shapes of one rank, run on one device).")
    forward_s: Real(0, MAX_SECONDS, 's') = Field(description="Median forward time, seconds.")
    backward_s: Real(0, MAX_SECONDS, 's') = Field(description="Median backward time, seconds.")
    activation_bytes: Real(0, MAX_BYTES, 'bytes') = Field(description="Bytes saved for backward by the forward (unique storages).")
    flops_forward: Real(0, MAX_FLOPS, 'FLOPs') = Field(description="Forward FLOPs counted by torch.utils.flop_counter.")
    analytic_flops_forward: Real(0, MAX_FLOPS, 'FLOPs') = Field(description="The cost model's forward FLOPs for the same shape.")
    params: Integer(0, INT_LIMIT - 1) = Field(description="Parameters of the measured (sharded) module.")


class MatmulPoint(_Spec):
    """One point of the GEMM sweep."""

    n: Integer(1, MAX_WIDTH) = Field(description="Square GEMM size n (n x n times n x n).")
    flops: Real(0, MAX_FLOPS, 'FLOPs', open_lo=True) = Field(description="2 n^3.")
    seconds: Real(MIN_SECONDS, MAX_SECONDS, 's') = Field(description="Median time of one GEMM.")
    tflops: Real(0, MAX_TFLOPS, 'TFLOP/s', open_lo=True) = Field(description="Achieved TFLOP/s.")


class TimedPoint(_Spec):
    """One timed collective call."""

    nbytes: Integer(1, INT_LIMIT - 1) = Field(description="Size of the full buffer, bytes.")
    seconds: Real(MIN_SECONDS, MAX_SECONDS, 's') = Field(description="Median over repetitions of the slowest rank's time.")


class CollectiveSweep(_Spec):
    """A collective timed over message sizes on one group shape, and its alpha-beta fit."""

    collective: Collective = Field(description="Collective kind.")
    group_size: Integer(1, MAX_GPUS) = Field(description="Ranks in the group.")
    inter_node: bool = Field(description="The group spans nodes.")
    points: list[TimedPoint] = Field(min_length=2, description="Timed sizes.")
    latency_us: Real(0, MAX_US, 'microseconds') = Field(description="Fitted alpha, microseconds.")
    bandwidth_gbps: Real(MIN_GBPS, MAX_GBPS, 'GB/s') = Field(description="Fitted bus bandwidth, GB/s.")
    max_relative_error: Real(0, MAX_GIB) = Field(description="Largest |fit - measured| / measured over the points.")


class MeasuredProfile(_Spec):
    """What `plan profile` measured, beside the preset-shaped hardware numbers."""

    environment: ProfileEnvironment = Field(description="Where and how it was measured.")
    model: ModelSpec = Field(description="The model whose layers were measured; the cost model uses the layer times only for this model.")
    layers: list[LayerMeasurement] = Field(description="Per layer kind, micro-batch size and TP shard.")
    matmul: list[MatmulPoint] = Field(description="GEMM sweep behind the efficiency curve.")
    memory_bandwidth_gbps: Real(MIN_GBPS, MAX_GBPS, 'GB/s') = Field(description="Measured copy bandwidth, GB/s.")
    collectives: list[CollectiveSweep] = Field(description="Timed collectives and their fits.")


class Uncertainty(_Spec):
    """How far a prediction may be off: the cross-validated error of the cost model on the
    published runs (benchmarks/fidelity_published.py writes it)."""

    relative: Real(0, 1_000) = Field(description="Relative half-width of the interval: step time x/ (1 + relative).")
    coverage: Real(0, 1, open_lo=True, open_hi=True) = Field(description="Fraction of held-out published runs inside the interval.")
    compute: Optional[Real(0, 1_000)] = Field(
        default=None,
        description="Per term: relative half-width of the time spent computing (compute, recompute, pipeline bubble, optimizer). "
        "With `communication`, a plan's interval is x/ exp(sqrt((f_c ln(1 + compute))^2 + (f_m ln(1 + communication))^2)), "
        "f_c and f_m the shares of its step time; None: `relative` for every plan.",
    )
    communication: Optional[Real(0, 1_000)] = Field(
        default=None, description="Per term: relative half-width of the exposed communication (TP, pipeline sends, DP)."
    )

    def log_halfwidth(self, compute_share: float, communication_share: float) -> float:
        """ln of the interval's factor for a step with these shares of compute and communication."""
        if self.compute is None or self.communication is None:
            return math.log1p(self.relative)
        return math.hypot(compute_share * math.log1p(self.compute), communication_share * math.log1p(self.communication))


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
    uncertainty: Optional[Uncertainty] = Field(
        default=None, description="Out-of-group error of this stack's predictions (None: the cluster's)."
    )
    provenance: Optional[str] = Field(default=None, description="What the constants were fitted on, when and how.")


class ClusterSpec(_Spec):
    """A cluster of identical nodes: the hardware profile every command reads.

    Shipped presets (hardware_profiles/presets/*.json) and profiles measured by
    ``plan profile`` share this schema.
    """

    name: str = Field(description="Cluster name, e.g. 'dgx-a100-80gb'.")
    device: DeviceSpec = Field(description="The accelerator in every slot.")
    gpus_per_node: Integer(1, 4096) = Field(description="Accelerators per node.")
    num_nodes: Optional[Integer(1, MAX_GPUS)] = Field(
        default=None, description="Nodes available; None means as many as a command asks for (a preset of one node type)."
    )
    scaleup_domain_gpus: Optional[Integer(1, MAX_GPUS)] = Field(
        default=None,
        description="GPUs that share the intra_node link (the scale-up domain, e.g. 72 on a GB200 NVL72 rack of 18 hosts "
        "of 4), a whole number of nodes; None: one node. Groups inside a domain take intra_node's figures, groups "
        "across domains inter_node's. (schema 1.8)",
    )
    intra_node: LinkTier = Field(description="Link between GPUs of one scale-up domain (a node unless scaleup_domain_gpus says more).")
    inter_node: LinkTier = Field(description="Link between scale-up domains, per GPU (one NIC per GPU on DGX).")
    overlap_efficiency: Real(0, 1) = Field(
        default=1.0,
        description="Fraction of the data-parallel communication that can hide behind compute: 1 where collectives run on their own engines (NCCL on GPUs); `plan profile` measures it.",
    )
    source: Optional[str] = Field(default=None, description="Where each number comes from.")
    uncertainty: Optional[Uncertainty] = Field(
        default=None, description="Cross-validated error of predictions on this preset's kind of hardware; None: unknown."
    )
    measured: Optional[MeasuredProfile] = Field(
        default=None, description="Per-layer measurements, sweeps and environment written by `plan profile` (None for presets)."
    )
    stack_constants: dict[Target, StackConstants] = Field(
        default_factory=dict,
        description="Per training stack (JobSpec.target): the software's constants on this cluster, fitted to that stack's runs; "
        "a stack without an entry uses the device's and the cluster's own figures. (schema 1.7)",
    )

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
                k.sustained_fraction, k.kernel_overhead_us, k.overlap_efficiency) and (k.uncertainty is None or k.uncertainty == self.uncertainty):
            return self
        dev = dev.model_copy(update={"sustained_fraction": k.sustained_fraction, "kernel_overhead_us": k.kernel_overhead_us})
        update = {"device": dev, "overlap_efficiency": k.overlap_efficiency}
        if k.uncertainty is not None:
            update["uncertainty"] = k.uncertainty
        return self.model_copy(update=update)

    @model_validator(mode="after")
    def _domain_of_whole_nodes(self) -> "ClusterSpec":
        d = self.scaleup_domain_gpus
        if d is not None and d % self.gpus_per_node:
            raise ValueError(f"scaleup_domain_gpus {d} is not a whole number of nodes of {self.gpus_per_node} GPUs")
        return self

    @model_validator(mode="after")
    def _tiers_complete(self) -> "ClusterSpec":
        for tier in (self.intra_node, self.inter_node):
            for c in Collective:
                try:
                    tier.fit(c, 2)
                except KeyError:
                    raise ValueError(f"link tier {tier.name!r} has no fit for {c.value}; every tier needs all of "
                                     f"{', '.join(x.value for x in Collective)}") from None
        return self


# --------------------------------------------------------------------------- job


class JobSpec(_Spec):
    """The training job: what must be computed per optimizer step."""

    global_batch_size: Integer(1, MAX_GLOBAL_BATCH) = Field(description="Sequences per optimizer step, summed over data-parallel replicas.")
    seq_len: Integer(1, MAX_SEQ_LEN) = Field(description="Tokens per sequence.")
    precision: DType = Field(default=DType.bf16, description="Compute dtype (bf16/fp16 = mixed precision with fp32 master weights).")
    optimizer: Optimizer = Field(default=Optimizer.adam, description="Optimizer; Adam keeps two fp32 moments per parameter.")
    target: Target = Field(
        default=Target.generic,
        description="Training stack the plan will run on: selects its kernels (fused attention) and overlap features.",
    )
    flash_attention: bool = Field(
        default=True,
        description="Fused attention kernel (FlashAttention / SDPA): no s x s score matrix is stored; False reproduces Korthikanti et al.'s unfused accounting.",
    )
    moe_dispatcher: str = Field(
        default="alltoall",
        description="How MoE tokens reach their experts across nodes: 'alltoall' (one copy per routed expert: Megatron's "
        "alltoall dispatcher, torchtitan) or 'deepep' (DeepEP: one copy per destination node, fanned out over NVLink "
        "there) (schema 1.4).",
    )
    loss_kernel: Optional[LossKernel] = Field(
        default=None,
        description="Cross-entropy implementation (what the loss keeps per logit); None: the target's (megatron: vocab-parallel, others: eager).",
    )

    @field_validator("moe_dispatcher")
    @classmethod
    def _dispatcher_kind(cls, v: str) -> str:
        if v not in ("alltoall", "deepep"):
            raise ValueError(f"moe_dispatcher must be 'alltoall' or 'deepep', not {v!r}")
        return v


# --------------------------------------------------------------------------- plan


class StageRecompute(_Spec):
    """How many layers of one pipeline stage run under each recompute mode (Megatron-style partial recompute)."""

    none: Integer(0, MAX_LAYERS) = Field(default=0, description="Layers that keep all activations.")
    selective: Integer(0, MAX_LAYERS) = Field(default=0, description="Layers that recompute only the core attention.")
    full: Integer(0, MAX_LAYERS) = Field(default=0, description="Layers that keep only their input and rerun the forward in backward.")

    @property
    def layers(self) -> int:
        return self.none + self.selective + self.full


class PlanError(ValueError):
    """A plan that cannot be laid out; the message names the factor to change."""


class Plan(_Spec):
    """A parallel layout of one training job on one cluster."""

    dp: Integer(1, MAX_GPUS) = Field(description="Data-parallel degree (model replicas).")
    cp: Integer(1, MAX_GPUS) = Field(
        default=1,
        description="Context-parallel degree: each sequence split over cp ranks (ring attention: keys/values passed around "
        "the ring, load-balanced causal chunks); cp sits inside the dp axis of mesh_order (ranks tp, then cp, then dp); "
        "weights are replicated over dp x cp, which gradients are reduced and ZeRO shards over (schema 1.4).",
    )
    fp8: bool = Field(
        default=False,
        description="GEMMs in FP8 (Transformer Engine / torchao style: E4M3 forward, E5M2 gradients, per-tensor scales), "
        "attention, norms and communication in the job's 16-bit precision; needs a device with FP8 (schema 1.4).",
    )
    ep: Integer(1, MAX_GPUS) = Field(
        default=1,
        description="Expert-parallel degree (mixture-of-experts): each MoE layer's experts are split over ep ranks of the "
        "tp x dp block (Megatron-Core's parallel folding with expert-TP 1); ep divides tp x dp and the expert count (schema 1.4).",
    )
    tp: Integer(1, MAX_GPUS) = Field(description="Tensor-parallel degree (each weight matrix split this many ways).")
    pp: Integer(1, MAX_GPUS) = Field(description="Pipeline-parallel degree (pipeline ranks).")
    vpp: Integer(1, MAX_LAYERS) = Field(default=1, description="Virtual pipeline stages (model chunks) per pipeline rank; >1 only with the interleaved schedule.")
    micro_batch_size: Integer(1, MAX_GLOBAL_BATCH) = Field(description="Sequences per micro-batch per data-parallel replica.")
    num_micro_batches: Integer(1, MAX_GLOBAL_BATCH) = Field(description="Micro-batches per optimizer step per replica (gradient accumulation).")
    schedule: Schedule = Field(default=Schedule.one_f_one_b, description="Pipeline schedule.")
    recompute: Recompute = Field(
        default=Recompute.none,
        description="Recompute mode of every layer; 'mixed' when stage_recompute puts layers under different modes. With "
        "stage_recompute it must agree with it (the one mode used, or 'mixed'); left out, it is derived from it.",
    )
    stage_recompute: Optional[list[StageRecompute]] = Field(
        default=None, description="Per virtual stage, how many layers run under each recompute mode (none, selective, full)."
    )
    zero_stage: Integer(0, 3) = Field(default=0, description="ZeRO stage: 1 shards optimizer states, 2 also gradients, 3 also parameters (FSDP).")
    sequence_parallel: bool = Field(default=False, description="Megatron sequence parallelism: norms/dropout sharded over the TP group.")
    tp_comm_overlap: bool = Field(
        default=False,
        description="Overlap TP all-gathers / reduce-scatters with the GEMMs beside them (Megatron --tp-comm-overlap, torchtitan async "
        "TP): needs sequence parallelism and a target that has it; costs communication buffers.",
    )
    layers_per_stage: Optional[list[Integer(0, MAX_LAYERS)]] = Field(
        default=None,
        description="Transformer layers of each virtual stage in pipeline order (length pp*vpp; virtual stage j runs on pipeline rank j % pp); None = as even as possible.",
    )
    mesh_order: list[Axis] = Field(
        default=[Axis.tp, Axis.dp, Axis.pp],
        description="Mesh axes from innermost (consecutive ranks, inside a node) to outermost.",
    )

    @property
    def world_size(self) -> int:
        return self.dp * self.cp * self.tp * self.pp

    @property
    def virtual_stages(self) -> int:
        return self.pp * self.vpp

    @model_validator(mode="before")
    @classmethod
    def _derive_recompute(cls, data):
        """`recompute` left out next to `stage_recompute`: the mode every layer uses, or mixed."""
        if isinstance(data, dict) and data.get("stage_recompute") and "recompute" not in data:
            modes = {m for r in data["stage_recompute"] for m, k in _recompute_items(r) if k}
            data = {**data, "recompute": modes.pop() if len(modes) == 1 else Recompute.mixed.value}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> "Plan":
        if self.stage_recompute is None and self.recompute == Recompute.mixed:
            raise PlanError("recompute 'mixed' needs stage_recompute (how many layers of each stage run under each mode)")
        if self.stage_recompute is not None:
            used = [m for m in ("none", "selective", "full") if any(getattr(r, m) for r in self.stage_recompute)]
            want = used[0] if len(used) == 1 else Recompute.mixed.value
            if self.recompute.value != want:
                raise PlanError(
                    f"recompute says {self.recompute.value!r} but stage_recompute puts layers under {', '.join(used) or 'no mode'}; "
                    f"set recompute to {want!r} or leave it out"
                )
        if sorted(a.value for a in self.mesh_order) != ["dp", "pp", "tp"]:
            raise PlanError(f"mesh_order must name dp, tp and pp once each, got {[a.value for a in self.mesh_order]}")
        if self.vpp > 1 and self.schedule != Schedule.interleaved_1f1b:
            raise PlanError(f"vpp={self.vpp} needs schedule 'interleaved-1f1b', not {self.schedule.value!r}")
        if self.schedule == Schedule.interleaved_1f1b and self.pp == 1:
            raise PlanError("the interleaved schedule needs pp > 1")
        if self.sequence_parallel and self.tp == 1:
            raise PlanError("sequence_parallel needs tp > 1")
        if self.tp_comm_overlap and not self.sequence_parallel:
            raise PlanError("tp_comm_overlap needs sequence_parallel (and tp > 1): the overlap pipelines its all-gathers and reduce-scatters")
        if self.layers_per_stage is not None:
            if len(self.layers_per_stage) != self.virtual_stages:
                raise PlanError(
                    f"layers_per_stage has {len(self.layers_per_stage)} entries but pp x vpp = {self.pp} x {self.vpp} = {self.virtual_stages}"
                )
            if min(self.layers_per_stage) < 1:
                raise PlanError(f"every pipeline stage needs at least one layer, got layers_per_stage={self.layers_per_stage}")
        if self.stage_recompute is not None:
            if len(self.stage_recompute) != self.virtual_stages:
                raise PlanError(f"stage_recompute has {len(self.stage_recompute)} entries but pp x vpp = {self.virtual_stages}")
            if self.layers_per_stage is not None:
                for j, (n, r) in enumerate(zip(self.layers_per_stage, self.stage_recompute)):
                    if r.layers != n:
                        raise PlanError(f"stage {j}: stage_recompute counts {r.layers} layers but layers_per_stage says {n}")
        return self

    def stage_layers(self, num_layers: int) -> list[int]:
        """Layers per virtual stage: the explicit split, or the default as-even-as-possible one
        (extra layers go to middle stages: the first carries the embedding, the last the LM head)."""
        if self.layers_per_stage is not None:
            return list(self.layers_per_stage)
        return even_split(num_layers, self.virtual_stages)

    def stage_recompute_counts(self, num_layers: int) -> list[StageRecompute]:
        if self.stage_recompute is not None:
            return list(self.stage_recompute)
        mode = self.recompute.value
        return [StageRecompute.model_construct(**{"none": 0, "selective": 0, "full": 0, mode: n}) for n in self.stage_layers(num_layers)]

    def validate_for(self, model: ModelSpec, job: JobSpec, num_gpus: Optional[int] = None) -> None:
        """Check the plan against a model, job and GPU count; raise PlanError naming the factor to change."""
        if num_gpus is not None and self.world_size != num_gpus:
            names, values = ("dp x cp x tp x pp", f"{self.dp} x {self.cp} x {self.tp} x {self.pp}") if self.cp > 1 else (
                "dp x tp x pp", f"{self.dp} x {self.tp} x {self.pp}")
            raise PlanError(
                f"{names} = {values} = {self.world_size}, but the cluster has {num_gpus} GPUs; "
                f"change {names.replace(' x ', ', ')} so that their product is {num_gpus}"
            )
        problem = tp_problem(model, self.tp)
        if problem:
            raise PlanError(problem)
        if model.num_layers < self.virtual_stages:
            raise PlanError(
                f"{model.name} has {model.num_layers} layers, fewer than pp x vpp = {self.pp} x {self.vpp} = {self.virtual_stages} pipeline stages"
            )
        if self.layers_per_stage is not None and sum(self.layers_per_stage) != model.num_layers:
            raise PlanError(f"layers_per_stage sums to {sum(self.layers_per_stage)} but {model.name} has {model.num_layers} layers")
        if self.stage_recompute is not None and sum(r.layers for r in self.stage_recompute) != model.num_layers:
            raise PlanError(f"stage_recompute counts {sum(r.layers for r in self.stage_recompute)} layers but {model.name} has {model.num_layers}")
        per_step = self.dp * self.micro_batch_size * self.num_micro_batches
        if per_step != job.global_batch_size:
            raise PlanError(
                f"dp x micro_batch_size x micro_batches = {self.dp} x {self.micro_batch_size} x {self.num_micro_batches} = {per_step}, "
                f"but the global batch is {job.global_batch_size}"
            )
        if self.schedule == Schedule.interleaved_1f1b and self.num_micro_batches % self.pp:
            raise PlanError(
                f"the interleaved schedule needs micro-batches ({self.num_micro_batches}) to be a multiple of pp ({self.pp})"
            )
        if self.tp_comm_overlap:
            from planner.stacks import STACKS  # imported here: planner.stacks imports this module

            if not STACKS[Target(job.target)].tp_comm_overlap:
                overlapping = " or ".join(s.name for s in STACKS.values() if s.tp_comm_overlap)
                raise PlanError(f"tp_comm_overlap is not available in target {Target(job.target).value}; use --target {overlapping}, or drop it")
        problem = seq_problem(model, job.seq_len)
        if problem:
            raise PlanError(problem)
        problem = ep_problem(model, self.dp * self.cp, self.tp, self.ep, self.sequence_parallel)
        if problem:
            raise PlanError(problem)
        problem = cp_problem(self.cp, self.tp, self.sequence_parallel, job)
        if problem:
            raise PlanError(problem)
        if model.first_dense_layers and self.stage_layers(model.num_layers)[0] < model.first_dense_layers:
            raise PlanError(
                f"the first pipeline stage holds {self.stage_layers(model.num_layers)[0]} layers, fewer than the "
                f"{model.first_dense_layers} dense layers {model.name} starts with; give it at least that many"
            )


def _recompute_items(r) -> list:
    """(mode, layers) pairs of a StageRecompute or its dict form."""
    if isinstance(r, dict):
        return [(m, r.get(m, 0)) for m in ("none", "selective", "full")]
    return [(m, getattr(r, m, 0)) for m in ("none", "selective", "full")]


def cp_problem(cp: int, tp: int, sequence_parallel: bool, job: JobSpec) -> Optional[str]:
    """Why context parallelism `cp` cannot split this job's sequences, or None."""
    if cp == 1:
        return None
    if job.seq_len % (2 * cp):
        return (f"cp={cp}: the sequence ({job.seq_len} tokens) must split into 2 x cp = {2 * cp} equal chunks "
                "(causal load balancing gives each rank one early and one late chunk)")
    if not job.flash_attention:
        return f"cp={cp} needs a fused attention kernel (ring attention runs blockwise); drop --no-flash-attention"
    if sequence_parallel and (job.seq_len // cp) % tp:
        return f"cp={cp}: each rank's {job.seq_len // cp} tokens do not split over tp={tp} for sequence parallelism"
    return None


def ep_problem(model: ModelSpec, dp: int, tp: int, ep: int, sequence_parallel: bool) -> Optional[str]:
    """Why expert parallelism `ep` cannot split this model's experts over the layout, or None."""
    if not model.is_moe:
        return f"ep={ep}: {model.name} has no experts (a dense model); use ep=1" if ep > 1 else None
    if model.num_experts % ep:
        return f"ep={ep} does not divide the {model.num_experts} experts of {model.name}"
    if (tp * dp) % ep:
        return f"ep={ep} does not divide tp x dp = {tp} x {dp}: expert-parallel groups are carved from those ranks"
    if tp > 1 and not sequence_parallel:
        return "a mixture-of-experts layer with tp > 1 needs sequence_parallel (each TP rank dispatches its sequence shard)"
    return None


def tp_problem(model: ModelSpec, tp: int) -> Optional[str]:
    """Why `tp` cannot shard this model's heads and FFN (Megatron's column/row split), or None."""
    if model.num_heads % tp:
        return f"tp={tp} does not divide the {model.num_heads} attention heads of {model.name}"
    if model.kv_heads % tp and tp % model.kv_heads:
        return f"tp={tp} and the {model.kv_heads} KV heads of {model.name} do not divide each other"
    if model.ffn % tp:
        return f"tp={tp} does not divide the FFN width {model.ffn} of {model.name}"
    return None


def seq_problem(model: ModelSpec, seq_len: int) -> Optional[str]:
    """Why this model cannot train on `seq_len` tokens (beyond its learned position table), or None."""
    if model.learned_position_embeddings and seq_len > model.max_seq_len:
        return f"seq_len {seq_len} exceeds the {model.max_seq_len} learned positions of {model.name}"
    return None


MEMORY_HEADROOM = 0.05  # of device memory that `plan solve` leaves free unless told otherwise


def memory_limit_gib(cluster: "ClusterSpec", requested_gib: Optional[float] = None) -> float:
    """The per-GPU memory a plan may use: the device's less a 5% headroom (what the estimate
    cannot see: allocator fragmentation peaks, workspaces of kernels chosen at run time), or
    what the user asks, up to the whole device."""
    cap = cluster.device.memory_gib
    return min(requested_gib, cap) if requested_gib else cap * (1.0 - MEMORY_HEADROOM)


def even_split(total: int, parts: int) -> list[int]:
    """Split `total` items into `parts` counts differing by at most one, extras to the middle."""
    base, extra = divmod(total, parts)
    counts = [base] * parts
    # Hand the remainder out from the centre outwards.
    order = sorted(range(parts), key=lambda i: (abs(i - (parts - 1) / 2), i))
    for i in order[:extra]:
        counts[i] += 1
    return counts


# --------------------------------------------------------------------------- estimate


class TimeBreakdown(_Spec):
    """Where the step time goes, on the pipeline rank that bounds the step; sums to step_time_s."""

    compute: float = Field(description="Forward and backward math of all micro-batches (GEMMs and memory-bound kernels).")
    recompute: float = Field(description="Extra forward work of activation recomputation.")
    pipeline_bubble: float = Field(description="Idle time while the pipeline fills and drains.")
    tp_communication: float = Field(description="Tensor-parallel all-reduce / all-gather / reduce-scatter, on the critical path.")
    pp_communication: float = Field(description="Point-to-point sends between pipeline stages.")
    dp_communication_exposed: float = Field(description="Data-parallel (or ZeRO) communication not hidden behind compute.")
    optimizer: float = Field(description="Optimizer step (memory-bound update of the local parameter shard).")


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
    temporary: float = Field(description="Transient buffers: logits and loss, gathered ZeRO-3 parameters, communication buckets.")
    overhead: float = Field(description="Framework overhead from the hardware profile.")
    total: float = Field(description="Sum of the above.")


class Estimate(_ReadsV1_0):
    """Predicted time and memory of one plan."""

    V1_0_NAMES = {"memory_gib_per_stage": "memory_gib_per_pipeline_rank", "bottleneck_stage": "bottleneck_pipeline_rank"}

    step_time_s: float = Field(description="Predicted time of one optimizer step.")
    time_breakdown_s: TimeBreakdown = Field(description="Step time split by cause.")
    tokens_per_s: float = Field(description="Training throughput of the whole cluster, tokens per second.")
    model_tflops_per_gpu: float = Field(description="Model FLOPs (no recompute) per GPU per second, TFLOP/s.")
    hardware_tflops_per_gpu: float = Field(description="FLOPs actually executed (with recompute) per GPU per second, TFLOP/s.")
    mfu: float = Field(description="Model FLOPs utilisation: model TFLOP/s over peak dense TFLOP/s.")
    peak_memory_gib: float = Field(description="Largest per-GPU memory over pipeline ranks.")
    memory_capacity_gib: float = Field(description="Device memory of the cluster's GPUs.")
    fits: bool = Field(description="peak_memory_gib <= memory_capacity_gib.")
    memory_gib_per_pipeline_rank: list[PipelineRankMemory] = Field(description="Memory breakdown of every pipeline rank.")
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
    time_uncertainty_s: Optional[TimeBreakdown] = Field(
        default=None,
        description="Per term of time_breakdown_s, how far it may be off (+/- seconds, the cluster's per-term relative "
        "half-width times the term); the step's interval combines them in quadrature.",
    )


# --------------------------------------------------------------------------- documents


class PlanDocument(_Spec):
    """The versioned plan file: everything needed to re-estimate or run the plan.

    Written by `plan estimate --json` and `plan solve -o`; read back by `plan estimate --plan`
    and `plan run`. Other training stacks can read `plan` for the layout (see README).
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
    global_batch_size: Integer(1, MAX_GLOBAL_BATCH) = Field(description="Sequences per step of this layout (differs between layouts only when the job fixes the micro-batch, not the batch).")
    estimate: Estimate = Field(description="Its predicted time and memory.")
    target: Optional[Target] = Field(
        default=None,
        description="The stack it was searched and costed for, which runs it (`plan export --alternative K --to` it); "
        "None in documents before 1.6: the document's job.target. (schema 1.6)",
    )


class SearchReport(_Spec):
    """How `plan solve` searched."""

    candidates_considered: int = Field(description="Layouts enumerated (dp, tp, pp, vpp, micro-batch, schedule, ZeRO, SP, mesh order), rejected ones included.")
    layouts_represented_log10: float = Field(description="log10 of the layouts covered once every layer split and per-stage recompute count (the ILP's choices) is counted.")
    infeasible: dict[str, int] = Field(description="Candidates that cannot run, by reason: divisibility (of heads, layers, batch), memory (no split fits).")
    skipped: dict[str, int] = Field(default_factory=dict, description="Candidates that could run but were not searched, by reason: dominated (another candidate is as fast with no more memory), tp_across_nodes (without --allow-cross-node-tp), excluded_by_fix, not_expressible_in_target (--target).")
    pruned_by_bound: int = Field(description="Candidates never solved because their lower bound could not beat the plans found.")
    refined_bounds: int = Field(description="Candidates whose memory-aware lower bound was computed.")
    ilp_candidates: int = Field(description="Candidates that entered an integer program.")
    ilps_solved: int = Field(description="Integer programs solved.")
    solver: str = Field(description="MILP solver used through PuLP ('highs' or 'cbc').")
    solve_time_s: float = Field(description="Wall time of the search.")
    optimal: bool = Field(description="True when the plan is proven optimal for the search space; False after --time-limit.")
    optimality_gap: float = Field(default=0.0, description="Proven bound on how far the plan may be from the optimum: (its time per token - the least lower bound left) / its time per token; 0 when optimal.")


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
    search: Optional[SearchReport] = Field(default=None, description="Its search; None where it was not searched (a --fix it cannot honour).")


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

    memory_bottleneck: str = Field(description="Which stage and which part of memory is closest to the limit, and what relieves it.")
    compute_bottleneck: str = Field(description="Where the step time goes.")
    communication: list[LinkVolume] = Field(description="Per parallel dimension: volume per step and the link it rides.")


class SolveDocument(PlanDocument):
    """`plan solve --json` / `-o`: a plan document plus the alternatives and the search."""

    alternatives: list[Alternative] = Field(
        description="The next-best layouts, best first; without --target those of every stack, and each stack's own best."
    )
    search: SearchReport = Field(description="Search statistics (without --target summed over the stacks, solve_time_s the whole search's).")
    explanation: Explanation = Field(description="Bottlenecks and communication of the chosen plan.")
    stacks: list[StackAnswer] = Field(
        default_factory=list,
        description="Without --target: every stack searched, its best first; the plan is the best any stack runs and job.target "
        "names that stack. Empty after --target. (schema 1.6)",
    )
    tie_rule: Optional[TieBreak] = Field(
        default=None, description="Set when the tie rule recommended the plan over faster alternatives; None when it is the fastest predicted. (schema 1.6)"
    )


# ----- run report
# `plan run`: a plan executed with torch.distributed, checked against a single-process run
# of the same model, seed and batch, with predicted against measured time and memory.


class MemoryBytes(_Spec):
    """Memory of one rank (or the largest rank of a pipeline stage) by kind, in bytes.
    What is counted and how: planner/executor/memory.py and RankMeasurement.memory_method."""

    weights_bytes: float = Field(description="Parameters held (local shards; FSDP's gathered parameters while in place).")
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
    step_times_s: list[float] = Field(description="This rank's time of every measured step (after warm-up): forward, backward, gradient sync and optimizer, without the verification's norm.")
    memory: MemoryBytes = Field(description="Counted memory by kind, largest over the warm-up steps (every step when there is no warm-up).")
    peak_memory_bytes: float = Field(description="CUDA: the allocator's peak over all steps; CPU: the sum of the counted kinds.")
    memory_method: str = Field(description="How memory was measured on this device.")


class PipelineRankComparison(_ReadsV1_0):
    """Predicted against measured memory of one pipeline rank."""

    V1_0_NAMES = {"stage": "pipeline_rank"}

    pipeline_rank: int = Field(description="Pipeline rank.")
    layers: int = Field(description="Transformer layers on this pipeline rank.")
    predicted: MemoryBytes = Field(description="The cost model's weights, gradients, optimizer states and activations.")
    predicted_not_measured_bytes: float = Field(description="Predicted temporary buffers and framework overhead, which the CPU count leaves out.")
    measured: MemoryBytes = Field(description="The largest measurement among the ranks of this pipeline rank, per kind.")
    error_pct: float = Field(description="(predicted - measured) / measured of the counted total, percent.")


class TimeComparison(_Spec):
    """Predicted against measured step time."""

    predicted_step_time_s: float = Field(description="The cost model's step time for the model that ran, on the plan file's cluster.")
    measured_step_time_s: float = Field(description="Mean over measured steps of the slowest rank's step time.")
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

    passed: bool = Field(description="The layout is the plan's, every step's loss and gradient norm and step 0's per-parameter gradient norms are within what is allowed.")
    tolerance: float = Field(description="Relative difference allowed at step 0 (the same weights on both sides), and the floor of every later step's allowance.")
    sensitivity: float = Field(default=0.0, description="Multiple of the fp32 reference's drift allowed on top of the tolerance after step 0. (schema 1.5)")
    losses: list[float] = Field(description="Mean loss over the global batch at every step, distributed run.")
    reference_losses: list[float] = Field(description="The same from one process with the whole batch, in float64.")
    grad_norms: list[float] = Field(description="Global gradient norm at every step (all shards and stages), distributed run.")
    reference_grad_norms: list[float] = Field(description="The same from the single-process reference (float64).")
    fp32_reference_losses: list[float] = Field(default_factory=list, description="The reference's losses run in fp32. (schema 1.5)")
    fp32_reference_grad_norms: list[float] = Field(default_factory=list, description="The reference's gradient norms run in fp32.")
    reference_drift_losses: list[float] = Field(default_factory=list, description="Relative loss difference of the fp32 reference from the float64 one, every step: what rounding alone does.")
    reference_drift_grad_norms: list[float] = Field(default_factory=list, description="The same for the global gradient norm.")
    allowed_loss_rel_error: list[float] = Field(default_factory=list, description="Relative loss difference allowed at every step.")
    allowed_grad_norm_rel_error: list[float] = Field(default_factory=list, description="Relative gradient-norm difference allowed at every step.")
    max_loss_rel_error: float = Field(description="Largest relative loss difference over the steps.")
    max_grad_norm_rel_error: float = Field(description="Largest relative gradient-norm difference over the steps.")
    parameters_checked: int = Field(default=0, description="Parameters whose gradient norm was compared one by one at step 0 (the same weights on both sides). (schema 1.5)")
    max_param_grad_rel_error: float = Field(default=0.0, description="Largest relative difference of one parameter's gradient norm at step 0 (relative to the larger of its own and 1e-3 x the global norm).")
    allowed_param_grad_rel_error: float = Field(default=0.0, description="What step 0 allows one parameter's gradient norm.")
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
    changes: list[str] = Field(description="How what ran differs from the plan file (scaled model, untied embeddings, fp32, ...).")


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
    pipeline_ranks: list[PipelineRankComparison] = Field(description="Predicted against measured memory per pipeline rank.")
    time: TimeComparison = Field(description="Predicted against measured step time and throughput.")
    verification: Verification = Field(description="Losses and gradient norms against the single-process reference.")
    verdict: str = Field(description="'pass' when verification passed, else 'fail'.")


class SizePoint(_Spec):
    """One (cluster, GPU count) of `plan size`, solved as `plan solve` does (planner/size.py)."""

    cluster: str = Field(description="The cluster as given to --clusters (a preset name or a profile path).")
    device: str = Field(description="Its device.")
    gpus: Integer(1, MAX_GPUS) = Field(description="GPUs priced: the count asked for, rounded to whole nodes.")
    gpus_asked: Integer(1, MAX_GPUS) = Field(description="The count of --gpus this point stands for.")
    feasible: bool = Field(description="A layout fits; else `reason` says why not.")
    reason: Optional[str] = Field(default=None, description="Why no plan, one word: memory, batch, time or layout.")
    target: Optional[str] = Field(default=None, description="The stack whose plan this is (the best one runs without --target).")
    plan: Optional[Plan] = Field(default=None, description="The recommended layout.")
    optimal: Optional[bool] = Field(default=None, description="The search proved it optimal (else a time limit stopped it).")
    step_time_s: Optional[Real(0, 1e9, "s", open_lo=True)] = Field(default=None, description="Predicted step time.")
    step_time_interval_s: Optional[tuple[float, float]] = Field(default=None, description="Its interval (the plan's coverage).")
    mfu: Optional[Real(0, 1)] = Field(default=None, description="Model FLOPs utilization.")
    peak_memory_gib: Optional[Real(0, 2**20, "GiB")] = Field(default=None, description="Peak memory per GPU.")
    days: Optional[Real(0, 1e12, "days")] = Field(default=None, description="Time to train: steps x step time.")
    days_interval: Optional[tuple[float, float]] = Field(default=None, description="The same over the step time's interval.")
    gpu_hours: Optional[Real(0, 1e18, "GPU-hours")] = Field(default=None, description="GPUs x time to train.")
    price_per_gpu_hour: Optional[Real(0, 1000)] = Field(default=None, description="--price for this cluster, if given.")
    cost: Optional[Real(0, 1e21)] = Field(default=None, description="GPU-hours x price, where priced.")
    on_front: bool = Field(default=False, description="No other point is both no slower and no dearer (GPU-hours, or cost when every cluster is priced), one strictly.")
    scaling_efficiency: Optional[Real(0, 1e6)] = Field(
        default=None, description="Speed-up over this cluster's previous feasible count, divided by the GPU ratio (1 = perfect).")
    stops_paying: bool = Field(default=False, description="scaling_efficiency below the document's min_scaling: adding GPUs stopped paying here.")
    within_deadline: Optional[bool] = Field(default=None, description="days <= deadline_days, where a deadline was given.")
    within_budget: Optional[bool] = Field(default=None, description="cost <= budget, where a budget was given and the point is priced.")


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
    min_scaling: Real(0, 1) = Field(description="Scaling efficiency under which adding GPUs is said to stop paying (--min-scaling).")
    front_axis: str = Field(description="What the front trades against time: 'gpu_hours', or 'cost' when every cluster is priced.")
    points: list[SizePoint] = Field(description="Every point, clusters in the order given, GPU counts ascending.")
    wall_time_s: Real(0, 1e9, "s") = Field(description="Seconds the sweep took.")
