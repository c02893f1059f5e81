"""The value types of every command's options: text becomes a value here, or one usage line
that quotes what was given and says what is allowed ("Invalid value for '--top-k': -5 is out
of range; give a whole number from 0 to 1,000").

click's INT and FLOAT call int() and float(), which take Unicode digits, underscores, signs,
spaces, 'nan' and 'inf' (planner/numerals.py says why that matters); these types read the
ASCII text only, then check the bounds docs/input-safety.md promises (at most 2^20 GPUs, 10^8 sequences
per step or tokens per sequence: planner/inputs.py's MAX_*). Commands name a type below
instead of `type=int` / `type=float`, so a new option inherits the check.
"""

from __future__ import annotations

from typing import Any, Optional

import click

from planner.inputs import MAX_GLOBAL_BATCH, MAX_GPUS, MAX_SEQ_LEN
from planner.numerals import decimal_number, whole_number, whole_numbers


def _given(value: Any) -> str:
    """The text as given, quoted unless it looks like a number, cut to a readable length."""
    text = str(value)
    shown = text if decimal_number(text) is not None else repr(text)
    return shown if len(shown) <= 40 else shown[:37] + "..."


def _number(x: float) -> str:
    """A bound as a sentence writes it: 10,000,000, 0.5."""
    return f"{x:,.0f}" if x == int(x) else f"{x:g}"


class Whole(click.ParamType):
    """A whole number from `low` to `high`, in ASCII digits ('+6', '0_6', ' 6', '٦' refused)."""

    name = "integer"

    def __init__(self, low: int, high: int) -> None:
        self.low, self.high = low, high

    def allowed(self) -> str:
        return f"give a whole number from {self.low:,} to {self.high:,}"

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Optional[click.Context]) -> int:
        n = value if isinstance(value, int) and not isinstance(value, bool) else whole_number(value)
        if n is None or not self.low <= n <= self.high:
            negative = isinstance(value, str) and value.startswith("-") and whole_number(value[1:]) is not None
            problem = "is out of range" if n is not None or negative else "is not a whole number"
            self.fail(f"{_given(value)} {problem}; {self.allowed()}", param, ctx)
        return n


class WholeList(click.ParamType):
    """Comma-separated whole numbers from `low` to `high` ('5,6,6,5'), as a list."""

    name = "list"

    def __init__(self, low: int, high: int) -> None:
        self.low, self.high = low, high

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Optional[click.Context]) -> list[int]:
        if isinstance(value, list):
            return value
        numbers = whole_numbers(value)
        allowed = f"give comma-separated whole numbers from {self.low:,} to {self.high:,}, e.g. 5,6,6,5"
        if numbers is None:
            self.fail(f"{_given(value)} is not a list of whole numbers; {allowed}", param, ctx)
        if not all(self.low <= n <= self.high for n in numbers):
            self.fail(f"{_given(value)} holds a number out of range; {allowed}", param, ctx)
        return numbers


class Real(click.ParamType):
    """A finite decimal number above `low` (or at it, with `low_allowed`) and at most `high`:
    '2', '0.5', '1e3' ('nan', 'inf', '1_0', ' 2' refused)."""

    name = "number"

    def __init__(self, low: float, high: float, low_allowed: bool = False) -> None:
        self.low, self.high, self.low_allowed = low, high, low_allowed

    def allowed(self) -> str:
        low, high = _number(self.low), _number(self.high)
        return f"give a number {'from' if self.low_allowed else 'above'} {low} {'to' if self.low_allowed else 'and at most'} {high}"

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Optional[click.Context]) -> float:
        x = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else decimal_number(value)
        if x is None:
            self.fail(f"{_given(value)} is not a finite number; {self.allowed()}", param, ctx)
        if not (self.low <= x if self.low_allowed else self.low < x) or x > self.high:
            self.fail(f"{_given(value)} is out of range; {self.allowed()}", param, ctx)
        return x


class Span(click.ParamType):
    """`A-B` (or one number `A`) of whole numbers from 0, A <= B, as (A, B)."""

    name = "A-B"

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Optional[click.Context]) -> tuple[int, int]:
        if isinstance(value, tuple):
            return value
        option = f"{param.opts[0]} " if param is not None else ""
        first, dash, last = str(value).partition("-")
        a, b = whole_number(first.strip(" ")), whole_number(last.strip(" ") if dash else first.strip(" "))
        if a is None or b is None or b >= 10**18:  # the plan's own count is checked once it is read
            self.fail(
                f"{_given(value)}: give a range A-B of numbers from 0 (or one number), e.g. {option}0-3", param, ctx
            )
        if a > b:
            self.fail(
                f"{_given(value)}: the range runs backwards; give A-B with A <= B, e.g. {option}{b}-{a}", param, ctx
            )
        return a, b


# The types the commands use. Degrees and counts of GPUs: at most MAX_GPUS (2^20, docs/input-safety.md);
# sequences: MAX_GLOBAL_BATCH (10^8); tokens: MAX_SEQ_LEN (10^8).
GPUS = Whole(1, MAX_GPUS)  # --gpus, --nodes, --nproc-per-node, --nnodes, --rehearse-dp
DEGREE = Whole(1, MAX_GPUS)  # --tp, --pp, --dp, --cp, --ep, --vpp
SEQUENCES = Whole(1, MAX_GLOBAL_BATCH)  # --global-batch, --micro-batch-size, --micro-batches
TOKENS = Whole(1, MAX_SEQ_LEN)  # --seq-len
ZERO_STAGE = Whole(0, 3)  # --zero
TOP_K = Whole(0, 1000)  # --top-k (planner/api.py:solve's bound)
ALTERNATIVE = Whole(1, MAX_GPUS)  # --alternative K (planner/plan_file.py checks the document has it)
LAYERS = WholeList(1, MAX_SEQ_LEN)  # --layers-per-stage (the Plan checks they sum to the model's layers)
SECONDS = Real(0, 10**7)  # --time-limit, --timeout: above 0, at most about 16 weeks
MEMORY_GIB = Real(0, 2**20)  # --max-memory-gib: above 0, at most 1 PiB per GPU
RANGE = Span()  # `plan show --micro-batches` / `--ranks`
