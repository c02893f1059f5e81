"""Shipped hardware presets (presets/*.json) and the loader shared with measured profiles."""

from __future__ import annotations

from pathlib import Path

from planner.datafile import load_named, parse_spec
from planner.specs import ClusterSpec

PRESET_DIR = Path(__file__).parent / "presets"


def cluster_presets() -> dict[str, Path]:
    return {p.stem: p for p in sorted(PRESET_DIR.glob("*.json"))}


def _parse(data: dict, path: Path, text: str) -> ClusterSpec:
    return parse_spec(ClusterSpec, data, path, text)


def load_cluster(name_or_path: str) -> ClusterSpec:
    """A cluster preset by name, or a hardware profile file (preset-shaped or from `plan profile`)."""
    return load_named(name_or_path, "cluster", cluster_presets(), _parse)
