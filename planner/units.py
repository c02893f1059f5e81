"""How quantities read in a sentence (errors, titles): one place, so every message rounds alike."""


def gib(x: float) -> str:
    """A memory size in GiB: at most two decimals, no trailing zeros (95 % of an 11.77 GiB
    device is '11.18', not '11.1815')."""
    if 0 < abs(x) < 0.005:  # below what two decimals show: three significant digits, not '0'
        return f"{x:.3g}"
    return f"{x:.2f}".rstrip("0").rstrip(".")
