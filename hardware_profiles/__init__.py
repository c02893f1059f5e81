"""Shipped hardware presets (presets/*.json) and the loader shared with measured profiles."""

from __future__ import annotations

from pathlib import Path

from planner.datafile import load_named, parse_spec
from planner.specs import ClusterSpec
from planner.stacks import stack_constants

PRESET_DIR = Path(__file__).parent / "presets"


def cluster_presets() -> dict[str, Path]:
    return {p.stem: p for p in sorted(PRESET_DIR.glob("*.json"))}


def _parse(data: dict, path: Path, text: str) -> ClusterSpec:
    return parse_spec(ClusterSpec, data, path, text)


def load_cluster(name_or_path: str) -> ClusterSpec:
    """A cluster preset by name, or a hardware profile file (preset-shaped or from `plan profile`).
    A preset takes each training stack's shipped constants for its device (planner/stacks/<stack>/
    constants.json) where it states none of its own for that stack; a file is read as written."""
    presets = cluster_presets()
    cluster = load_named(name_or_path, "cluster", presets, _parse)
    return with_shipped_stack_constants(cluster) if name_or_path in presets else cluster


def with_shipped_stack_constants(cluster: ClusterSpec) -> ClusterSpec:
    """`cluster` with the stacks' shipped constants for its device added, its own kept."""
    shipped = {t: k for t, k in stack_constants(cluster.device.name).items() if t not in cluster.stack_constants}
    if not shipped:
        return cluster
    return cluster.model_copy(update={"stack_constants": {**cluster.stack_constants, **shipped}})
