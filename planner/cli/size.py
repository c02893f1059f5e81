"""`plan size`: how many GPUs, of which cluster, for a token budget: every (cluster, GPU count)
solved as `plan solve` does, time to train against GPU-hours (or cost) and the Pareto front
(planner/size.py)."""

from __future__ import annotations

import re
from dataclasses import replace
import sys
from pathlib import Path
from typing import Optional

import click

from planner import api
from planner.cli import render
from planner.cli.common import SOLVE_TARGET, check_picture_files
from planner.cli.types import SECONDS, SEQUENCES, TOKENS, Real
from planner.datafile import write_atomic
from planner.errors import InfeasibleError, UsageError
from planner.search.deadline import stop_on_signals
from planner.size import SizeRequest, parse_gpu_counts, parse_prices, parse_tokens, sweep, whole_nodes

MONEY = Real(0, 1e15)  # --budget


def parse_days(text: str) -> float:
    """'30', '30d', '6w' -> days."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([dw]?)\s*", text or "")
    days = float(m[1]) * (7 if m[2] == "w" else 1) if m else 0.0
    if not m or not 0 < days <= 10**6:
        raise UsageError(f"--deadline {text!r}: give days, e.g. 90 or 90d (or weeks: 12w)")
    return days


@click.command()
@click.option(
    "--model", "model_name", required=True, help="Model preset name, or a .json/.yaml spec or Hugging Face config."
)
@click.option(
    "--clusters", required=True, help="Comma-separated cluster presets (or profile files), e.g. dgx-h100-80gb,dgx-h200."
)
@click.option(
    "--gpus",
    "gpu_counts",
    required=True,
    help="GPU counts: FIRST..LAST doubling (256..8192) or a list (256,1024,4096).",
)
@click.option("--tokens", required=True, help="Tokens to train on, e.g. 15T, 300B, 2.5e12.")
@click.option("--global-batch", type=SEQUENCES, required=True, help="Sequences per optimizer step.")
@click.option("--seq-len", type=TOKENS, required=True, help="Tokens per sequence.")
@SOLVE_TARGET
@click.option(
    "--price",
    "prices",
    multiple=True,
    help="CLUSTER=PRICE per GPU-hour (repeat per cluster); with every cluster priced the front is against cost.",
)
@click.option("--deadline", help="Days the run may take (90, 90d, 12w): points past it are marked.")
@click.option(
    "--budget", type=MONEY, help="Most the run may cost (in the prices' currency): dearer priced points are marked."
)
@click.option(
    "--min-scaling",
    type=Real(0, 1),
    default=0.7,
    show_default=True,
    help="Scaling efficiency (speed-up / GPU ratio against the cluster's previous count) under which adding GPUs stops paying.",
)
@click.option(
    "--time-limit", type=SECONDS, help="Seconds per point's search (its best plan so far, marked not proven)."
)
@click.option(
    "--picture", type=click.Path(dir_okay=False), help="Draw the front to FILE (.svg or .png; the plot extra)."
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (schema: `plan schema size`).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the JSON document to this file.")
@stop_on_signals()
def size(model_name: str, clusters: str, picture: Optional[str], as_json: bool, output: Optional[str], **o) -> None:
    """Time to train and GPU-hours (or cost) over clusters and GPU counts, each point solved
    exactly: the Pareto front, and where adding GPUs stops paying."""
    names = [c.strip() for c in clusters.split(",")]
    if not all(names) or len(set(names)) != len(names):
        raise UsageError(f"--clusters {clusters!r}: give distinct cluster presets or profile files, comma-separated")
    counts = parse_gpu_counts(o["gpu_counts"])
    budget_tokens = parse_tokens(o["tokens"])
    price = parse_prices(o["prices"], names)
    days = parse_days(o["deadline"]) if o["deadline"] is not None else None
    if o["budget"] is not None and not price:
        raise UsageError("--budget needs prices: give --price CLUSTER=PRICE for the clusters to cost")
    model = api.load_model(model_name)
    loaded = [(n, api.load_cluster(n)) for n in names]
    check_picture_files({"picture": picture} if picture is not None else {}, others={"-o": output})
    _say_rounded(loaded, counts)
    on_terminal = sys.stderr.isatty()
    request = SizeRequest(model, budget_tokens, o["global_batch"], o["seq_len"], o["stack"], price or {}, days)
    doc = sweep(
        replace(request, budget=o["budget"], min_scaling=o["min_scaling"], time_limit=o["time_limit"]),
        loaded,
        counts,
        (lambda text: click.echo(f"sizing {text}", err=True)) if on_terminal else (lambda _: None),
    )
    if output:
        write_atomic(output, doc.model_dump_json(indent=2) + "\n")
    if picture:
        from planner.draw import render as render_figure
        from planner.draw import size_figure

        write_atomic(picture, render_figure(size_figure(doc), Path(picture).suffix.lower().lstrip(".")))
    if as_json:
        click.echo(doc.model_dump_json(indent=2))
    else:
        render.size_report(doc)
    for path, what in ((output, "document"), (picture, "picture")):
        if path:
            render.note(f"{what} written to {path}")
    if not any(
        p.feasible for p in doc.points
    ):  # nothing fits anywhere: say why, as plan solve does, for the largest count
        largest = max(doc.points, key=lambda p: p.gpus)
        raise InfeasibleError(f"no point has a plan; at {largest.gpus:,} GPUs of {largest.cluster}: {largest.detail}")


def _say_rounded(loaded: list, counts: list[int]) -> None:
    """Counts that round to one whole number of nodes are priced once: say which."""
    for name, cluster in loaded:
        rounded: dict[int, list[int]] = {}
        for n in counts:
            rounded.setdefault(whole_nodes(n, cluster.gpus_per_node), []).append(n)
        for gpus, asked in rounded.items():
            if len(asked) > 1:
                listed = ", ".join(f"{n:,}" for n in asked[:-1]) + f" and {asked[-1]:,}"
                render.note(
                    f"plan size: {name}: {listed} GPUs round to {gpus:,} (whole nodes of "
                    f"{cluster.gpus_per_node}): one point"
                )
