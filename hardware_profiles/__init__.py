"""Shipped hardware presets (presets/*.json) and the loader shared with measured profiles."""

from __future__ import annotations

from pathlib import Path

from planner.datafile import load_named, parse_spec
from planner.specs import ClusterSpec
from planner.stacks import stack_constants

PRESET_DIR = Path(__file__).parent / "presets"

# Presets of devices that no fitted run of benchmarks/data was measured on (B200, GB200, B300,
# GB300, MI300X, MI325X, MI355X; the Blackwell runs recorded since check them, held out of every
# fit): their figures are datasheet peaks and public microbenchmarks, and the software
# constants (sustained fraction, kernel gap, overlap) fitted on A100/H100 runs are taken for
# them as they are, which nothing has checked. Their intervals are the calibrated
# ones widened: each relative half-width's log (the interval is multiplicative) times
# UNCALIBRATED_WIDENING, in the preset's `uncertainty` and in its own `stack_constants`
# entries (which replace the shipped "*" ones). benchmarks/fidelity_published.py --write
# keeps them so when it refits.
UNCALIBRATED = frozenset({"dgx-b200", "gb200-nvl72", "dgx-b300", "gb300-nvl72", "mi300x", "mi325x", "mi355x"})
UNCALIBRATED_WIDENING = 1.5
_HALF_WIDTHS = ("relative", "compute", "communication")


def widened(uncertainty: dict, factor: float = UNCALIBRATED_WIDENING) -> dict:
    """An Uncertainty (as its JSON dict) with each half-width r turned into (1 + r)^factor - 1."""
    return {
        k: round((1 + v) ** factor - 1, 4) if k in _HALF_WIDTHS and v is not None else v for k, v in uncertainty.items()
    }


def uncalibrated_reason(device_name: str) -> str:
    """What an estimate on an uncalibrated device says of its interval (Uncertainty.widened_for)."""
    return (
        f"no published run on {device_name}: the constants of the A100/H100 runs, "
        f"log half-width x{UNCALIBRATED_WIDENING:g}"
    )


def uncalibrated_entry(entry: dict, device_name: str) -> dict:
    """A stack's shipped constants entry (JSON dict, the "*" one) as an uncalibrated preset of
    `device_name` carries it: the same constants, the interval widened, the provenance saying so."""
    out = dict(entry)
    if entry.get("uncertainty") is not None:
        out["uncertainty"] = {**widened(entry["uncertainty"]), "widened_for": uncalibrated_reason(device_name)}
    out["provenance"] = (
        f'uncalibrated on {device_name}: the constants fitted for any device ("*") on A100/H100 runs, '
        f"taken as they are; interval widened (log half-width x{UNCALIBRATED_WIDENING:g}). "
        f"Fitted: {entry.get('provenance') or 'unknown'}"
    )
    return out


def cluster_presets() -> dict[str, Path]:
    return {p.stem: p for p in sorted(PRESET_DIR.glob("*.json"))}


def _parse(data: dict, path: Path, text: str) -> ClusterSpec:
    return parse_spec(ClusterSpec, data, path, text)


def load_cluster(name_or_path: str) -> ClusterSpec:
    """A cluster preset by name, or a hardware profile file (preset-shaped or from `plan profile`).
    A preset takes each training stack's shipped constants for its device (planner/stacks/<stack>/
    constants.json) where it states none of its own for that stack; so does a file that is a
    preset as shipped (the preset file itself, or an unedited copy: the same numbers by name or by
    path); any other file is read as written."""
    presets = cluster_presets()
    cluster = load_named(name_or_path, "cluster", presets, _parse)
    if name_or_path in presets or _is_shipped(cluster, presets):
        return with_shipped_stack_constants(cluster)
    return cluster


def _is_shipped(cluster: ClusterSpec, presets: dict[str, Path]) -> bool:
    """Whether `cluster` (read from a file) is the shipped preset of its name, unedited."""
    path = presets.get(cluster.name)
    return path is not None and load_named(cluster.name, "cluster", presets, _parse) == cluster


def with_shipped_stack_constants(cluster: ClusterSpec) -> ClusterSpec:
    """`cluster` with the stacks' shipped constants for its device added, its own kept."""
    shipped = {t: k for t, k in stack_constants(cluster.device.name).items() if t not in cluster.stack_constants}
    if not shipped:
        return cluster
    return cluster.model_copy(update={"stack_constants": {**cluster.stack_constants, **shipped}})
