"""Numbers as a person types them in an option: ASCII digits and nothing else.

Python's int() and float() take more than anyone means by a count: any Unicode decimal digit
('٦' is 6), underscores between digits ('0_6', PEP 515), a leading '+', surrounding whitespace,
and for float() 'nan', 'inf' and 'infinity' (the Python documentation of int() and float()).
Every number typed into `plan` is read here instead (planner/cli/types.py for the options,
planner/inputs.py for --fix and the API's text lists), so '+6', '0_6', ' 6', '6,,6' and '٦'
are refused alike wherever they enter. Nothing here knows a bound; the callers say which
values are allowed.
"""

from __future__ import annotations

import math
import re
from typing import Optional

# [0-9], never \d: in a str pattern \d matches every Unicode decimal digit (the `re` docs).
_WHOLE = re.compile(r"[0-9]+")
_DECIMAL = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
# Digits past which a number is beyond every bound checked anywhere (the largest is 2^20
# GPUs); int() of a longer text is not attempted (Python refuses past 4,300 digits).
_MAX_DIGITS = 30
TOO_LARGE = 10**_MAX_DIGITS


def whole_number(text: str) -> Optional[int]:
    """`text` as an int when it is ASCII digits and nothing else (no sign), else None. A number
    of more than 30 digits reads as 10^30, beyond every bound, so the caller's range check
    refuses it."""
    if not isinstance(text, str) or not _WHOLE.fullmatch(text):
        return None
    return TOO_LARGE if len(text) > _MAX_DIGITS else int(text)


def whole_numbers(text: str) -> Optional[list[int]]:
    """Comma-separated whole numbers ('5,6,6,5'; spaces around a comma allowed) as a list, or
    None when any piece is empty or not a whole number."""
    if not isinstance(text, str):
        return None
    pieces = [whole_number(piece.strip(" ")) for piece in text.split(",")]
    numbers = [n for n in pieces if n is not None]
    return None if len(numbers) != len(pieces) else numbers


def decimal_number(text: str) -> Optional[float]:
    """`text` as a finite float when it is a plain decimal ('2', '0.5', '.5', '1e3', '-1'), else
    None ('nan', 'inf', '1e999', '1_0', ' 2', '٢' among them)."""
    if not isinstance(text, str) or len(text) > 64 or not _DECIMAL.fullmatch(text):
        return None
    value = float(text)
    return value if math.isfinite(value) else None
