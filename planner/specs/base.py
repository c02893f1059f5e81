"""The base of every schema: the schema version, bounded numbers (Integer, Real, Fraction and the
MAX_* / MIN_* bounds), and _Spec, the model every spec derives from, with the checks all share."""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass
from typing import Annotated, Any, Optional

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError


# 1.1: a pipeline rank is called so (`pipeline_rank`, `memory_gib_per_pipeline_rank`,
# `bottleneck_pipeline_rank`, `pipeline_ranks`); "stage" means a virtual pipeline stage only.
# Readers still accept the 1.0 names (_ReadsV1_0, planner/specs/estimate.py).
# 1.6: `plan solve` without --target searches every stack: SolveDocument.stacks, tie_rule and
# Alternative.target (planner/search/stacks.py); read without them, alternatives are job.target's.
# 1.7: ClusterSpec.stack_constants: each training stack's own fitted constants (StackConstants),
# which the cost model reads for a job's target (ClusterSpec.for_target); read without, none.
# 1.8: SizeDocument, `plan size --json`; the other documents are unchanged.
# 1.9: ModelSpec's multi-head latent attention (kv_lora_rank, q_lora_rank, qk_rope_head_dim,
# v_head_dim); read without them, attention is standard.
# 1.10: ModelSpec.glu_limit (a clamped gated MLP) and rope_attention_factor (YaRN's scale on the
# rotary embedding); read without them, no clamp and a factor of 1.
# 1.11: Plan.recompute_norm_act (the norms' and the experts' activation outputs recomputed in
# backward, Megatron-Core's recompute modules layernorm and moe_act); read without it, kept.
# 1.12: StackConstants.step_overhead_s (a stack's host time per optimizer step); read without it, 0.
# 1.13: the collective all_to_all, a link tier's optional measured fit of it (plan profile).
# 1.14: ModelSpec.rope_theta, rope_scaling (Llama 3.1's) and qkv_bias (Qwen2's q/k/v biases), which
# exports write; read without them, theta 10,000, no scaling, no q/k/v biases. JobSpec.grad_reduce_bf16.
# (Each version is also in CHANGELOG.md, which is what users read.)
SCHEMA_VERSION = "1.15"


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
            raise PydanticCustomError(
                "number_type", "must be {range}, got {got}", {"range": self.range_text(), "got": _shown(value)}
            )
        if not integer and not math.isfinite(value):
            raise PydanticCustomError(
                "finite_number", "must be {range}, got {got}", {"range": self.range_text(), "got": _shown(value)}
            )
        low = value <= self.lo if self.open_lo else value < self.lo
        high = value >= self.hi if self.open_hi else value > self.hi
        if low or high:  # int against float compares exactly, without converting: 10**400 > 1e6
            raise PydanticCustomError(
                "number_range", "must be {range}, got {got}", {"range": self.range_text(), "got": _shown(value)}
            )
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
    comparisons: dict[str, Any] = {"gt" if open_lo else "ge": lo, "lt" if open_hi else "le": hi}
    limits = Field(**comparisons)
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
            raise PydanticCustomError(
                "strict_type",
                "a name may not hold control characters (newlines, escapes), got {shown}",
                {"shown": _shown(value)},
            )
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
