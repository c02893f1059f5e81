"""`plan presets`: list the shipped model and cluster presets."""

from __future__ import annotations

import json

import click

from hardware_profiles import cluster_presets, load_cluster
from planner.cli import render
from planner.presets import derived_counts, load_model, model_presets


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def presets(as_json: bool) -> None:
    """List shipped model and cluster presets."""
    models = [load_model(name) for name in model_presets()]
    clusters = [load_cluster(name) for name in cluster_presets()]
    if as_json:
        click.echo(
            json.dumps(
                {
                    "models": [m.model_dump(mode="json") | derived_counts(m) for m in models],
                    "clusters": [c.model_dump(mode="json") for c in clusters],
                },
                indent=2,
            )
        )
        return
    render.presets(models, clusters)
