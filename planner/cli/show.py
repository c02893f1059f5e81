"""`plan show`: a plan as pictures. In the terminal a compact text version (the schedule of
one step per pipeline rank, memory per pipeline rank, the axes' placement and links); with
--timeline / --memory / --placement FILE, SVG or PNG pictures by the file's extension
(matplotlib, the `plot` extra); --micro-batches A-B / --ranks A-B zoom both timelines to a
window of the same replay (planner/pictures.py:window). The numbers come from
planner/pictures.py."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

import click
from rich.console import Console
from rich.table import Table

from cost_models.estimate import estimate as run_estimate
from planner import pictures
from planner.cli import render
from planner.cli.common import check_picture_files, check_plan
from planner.cli.types import ALTERNATIVE, RANGE
from planner.datafile import short_text, write_atomic
from planner.errors import UsageError
from planner.plan_file import read_plan_file

# Text timeline: one character per time bin, the cause that fills most of it; forward and
# backward alternate case with the micro-batch's parity so that neighbours stay apart.
_CHARS = {
    "forward": "F",
    "backward": "B",
    "recompute": "R",
    "tp_comm": "c",
    "pp_comm": "c",
    "dp_comm": "d",
    "optimizer": "o",
}
_FILE_OPTIONS = ("timeline", "memory", "placement")
_SHORT = {
    "weights": "weights",
    "gradients": "grads",
    "optimizer_states": "optim",
    "activations": "activ",
    "temporary": "temp",
    "overhead": "ovh",
}
# The first node's ranks are listed in the terminal; --placement FILE draws all of them.
_LISTED_RANKS = 16


@click.command()
@click.argument("plan_file", type=click.Path(dir_okay=False))
@click.option(
    "--alternative", type=ALTERNATIVE, default=None, help="Show alternative K of a `plan solve` document (1 = first)."
)
@click.option(
    "--timeline", type=click.Path(dir_okay=False), help="Draw the schedule of one step to FILE (.svg or .png)."
)
@click.option("--memory", type=click.Path(dir_okay=False), help="Draw memory per pipeline rank to FILE (.svg or .png).")
@click.option(
    "--placement",
    type=click.Path(dir_okay=False),
    help="Draw ranks on nodes with their groups and links to FILE (.svg or .png).",
)
@click.option(
    "--micro-batches",
    "micro_batches",
    type=RANGE,
    metavar="A-B",
    help="Zoom the timeline (picture and text) to micro-batches A to B (numbered from 0, as the picture labels "
    "them): the span of time their passes take; other micro-batches' passes in it are drawn pale.",
)
@click.option(
    "--ranks",
    type=RANGE,
    metavar="A-B",
    help="Zoom the timeline (picture and text) to pipeline ranks A to B (pp A to pp B).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the pictures' numbers as one JSON object.")
def show(
    plan_file: str,
    alternative: Optional[int],
    timeline: Optional[str],
    memory: Optional[str],
    placement: Optional[str],
    micro_batches: Optional[tuple[int, int]],
    ranks: Optional[tuple[int, int]],
    as_json: bool,
) -> None:
    """Pictures of a plan: its pipeline schedule, memory per GPU and placement of ranks."""
    files = {k: v for k, v in (("timeline", timeline), ("memory", memory), ("placement", placement)) if v is not None}
    mb_range, rank_range = micro_batches, ranks
    check_picture_files(files, (plan_file,))
    doc = read_plan_file(Path(plan_file), alternative)
    model, cluster, job, plan = doc.model, doc.cluster, doc.job, doc.plan
    check_plan(plan, model, job, doc.num_gpus)
    _check_range("--micro-batches", mb_range, plan.num_micro_batches, "micro-batches")
    _check_range("--ranks", rank_range, plan.pp, "pipeline ranks")
    if "timeline" in files:  # before the replay: the passes of the micro-batches and ranks drawn (others' add to it)
        from planner.draw import too_many_passes

        mbs = plan.num_micro_batches if mb_range is None else mb_range[1] - mb_range[0] + 1
        too_many_passes(
            2 * plan.vpp * mbs * (plan.pp if rank_range is None else rank_range[1] - rank_range[0] + 1),
            2 * plan.vpp * plan.num_micro_batches * plan.pp,
        )
    est = run_estimate(model, cluster, job, plan)
    tl = pictures.timeline(model, cluster, job, plan, est)
    win = pictures.window(tl, mb_range, rank_range)
    bars = pictures.memory_bars(est)
    pl = pictures.placement(plan, cluster)
    title = picture_title(doc)
    est_bubble = est.time_breakdown_s.pipeline_bubble / est.step_time_s

    if files:
        from planner import draw

        figures = {
            "timeline": lambda: draw.timeline_figure(tl, title, est.step_time_s, est_bubble, win),
            "memory": lambda: draw.memory_figure(bars, est.memory_capacity_gib, title),
            "placement": lambda: draw.placement_figure(pl, title),
        }
        rendered = {k: draw.render(figures[k](), Path(f).suffix.lower().lstrip(".")) for k, f in files.items()}
        for k, f in files.items():  # every picture drawn before any is written
            write_atomic(f, rendered[k])
        for k, f in files.items():  # on stderr, as every command's -o (with --json too)
            render.note(f"{k} picture written to {f}")
    if as_json:
        click.echo(json.dumps(_document(tl, win, est, est_bubble, bars, pl), indent=2))
        return
    console = render.console
    console.print(title, highlight=False, markup=False)
    _text_timeline(console, tl, win, est.step_time_s, est_bubble)
    _text_memory(console, bars, est.memory_capacity_gib)
    _text_placement(console, pl)


def picture_title(doc) -> str:
    """What every picture of the plan document `doc` is titled (and the terminal's first line)."""
    stack = "" if doc.job.target.value == "generic" else f" with {doc.job.target.value}"
    return f"{short_text(doc.model.name)} on {doc.num_gpus} x {short_text(doc.cluster.name)}{stack}: {render.plan_summary(doc.plan)}"


def _check_range(option: str, span: Optional[tuple[int, int]], count: int, what: str) -> None:
    if span is not None and span[1] >= count:
        given = f"{span[0]}" if span[0] == span[1] else f"{span[0]}-{span[1]}"
        raise UsageError(
            f"{option} {given}: the plan has {count} {what}, numbered 0-{count - 1}; give a range inside them"
        )


def _document(
    tl: pictures.Timeline, win: pictures.Window, est, est_bubble: float, bars, pl: pictures.Placement
) -> dict:
    zoom = (
        {}
        if win.is_whole(tl)
        else {
            "window": {
                "pipeline_ranks": [win.first_rank, win.last_rank],
                "micro_batches": [win.first_micro_batch, win.last_micro_batch],
                "start_s": win.start,
                "end_s": win.end,
            }
        }
    )
    return {
        "timeline": {
            **zoom,
            "step_time_s": tl.step_time,
            "estimate_step_time_s": est.step_time_s,
            "pipeline_end_s": tl.pipeline_end,
            "bottleneck_pipeline_rank": tl.bottleneck_rank,
            "bubble_share": tl.bubble_share,
            "estimate_bubble_share": est_bubble,
            "pipeline_ranks": [
                {
                    "pipeline_rank": r,
                    "busy_s": tl.busy[r],
                    "idle_s": tl.idle(r),
                    "tail": [{"kind": k, "start_s": s, "seconds": d} for k, s, d in tl.tails[r]],
                }
                for r in range(tl.pp)
            ],
        },
        "memory_gib_per_pipeline_rank": bars,
        "memory_capacity_gib": est.memory_capacity_gib,
        "placement": {
            "gpus_per_node": pl.gpus_per_node,
            "axes": pl.axes,
            "num_ranks": len(pl.ranks),
            "nodes_per_leaf": pl.nodes_per_leaf,
        },
    }


def _text_timeline(
    console: Console, tl: pictures.Timeline, win: pictures.Window, est_step: float, est_bubble: float
) -> None:
    width = max(20, min(200, console.width - 9))
    console.print(
        f"\nSchedule of one step ({tl.step_time:.3g} s, estimate {est_step:.3g} s): pipeline bubble on rank "
        f"{tl.bottleneck_rank} = {tl.bubble_share:.1%} of the step (estimate {est_bubble:.1%})",
        highlight=False,
    )
    if not win.is_whole(tl):
        console.print(f"{win.describe(tl)} (other micro-batches' passes in it shown too)", highlight=False)
    passes = 0
    for r in win.ranks:
        line, count = _text_row(tl, win, r, width)
        passes = max(passes, count)
        console.print(f"pp {r:<3}|{line}|", highlight=False, markup=False)
    console.print(
        "F/f forward, B/b backward (case alternates by micro-batch), R recompute, c TP/pipeline communication, "
        "d exposed DP/ZeRO, o optimizer, . idle",
        highlight=False,
        style="dim",
    )
    if 2 * passes > width:  # a pass narrower than two characters: neighbours run together
        console.print(
            f"{passes} passes on a row of {width} characters run together: draw them with --timeline FILE, or zoom "
            f"with --micro-batches A-B (0-{tl.num_micro_batches - 1}) or --ranks A-B (0-{tl.pp - 1})",
            highlight=False,
        )


def _text_row(tl: pictures.Timeline, win: pictures.Window, rank: int, width: int) -> tuple[str, int]:
    """One pipeline rank's row over the window, one character per time bin (the cause that fills
    most of it), and how many passes it shows."""
    dt = (win.end - win.start) / width
    fill: list[dict[str, float]] = [dict() for _ in range(width)]

    def add(kind_char: str, start: float, seconds: float) -> None:
        a, b = (start - win.start) / dt, (start + seconds - win.start) / dt
        i = max(0, math.floor(a))
        while i < min(width, b):
            fill[i][kind_char] = fill[i].get(kind_char, 0.0) + min(b, i + 1) - max(a, i)
            i += 1

    ops = [o for o in tl.ops if o.rank == rank and win.overlaps(o.start, o.duration)]
    for op in ops:
        t = op.start
        for kind, seconds in op.segments:
            ch = _CHARS[kind]
            if kind in ("forward", "backward") and op.micro_batch % 2:
                ch = ch.lower()
            add(ch, t, seconds)
            t += seconds
    for kind, start, seconds in tl.tails[rank]:
        add(_CHARS[kind], start, seconds)
    return "".join(max(f, key=f.__getitem__) if f and sum(f.values()) >= 0.5 else "." for f in fill), len(ops)


def _text_memory(console: Console, bars, capacity: float) -> None:
    table = Table(title=f"Memory per GPU, GiB (device {render.gib(capacity)})", title_justify="left")
    table.add_column("pp rank", justify="right")
    for k in pictures.MEMORY_KINDS:
        table.add_column(_SHORT.get(k, k), justify="right")
    table.add_column("total", justify="right")
    table.add_column("", no_wrap=True)
    for r, b in enumerate(bars):
        total = sum(b.values())
        filled = int(round(20 * min(total, capacity) / capacity)) if capacity > 0 else 0
        bar = "#" * filled + "-" * (20 - filled) + (" over" if total > capacity else "")
        table.add_row(str(r), *(f"{b[k]:.1f}" for k in pictures.MEMORY_KINDS), f"{total:.1f}", bar)
    console.print()
    console.print(table)


def _text_placement(console: Console, pl: pictures.Placement) -> None:
    n = len(pl.ranks)
    nodes = -(-n // pl.gpus_per_node)
    leaves = (
        f", {-(-nodes // pl.nodes_per_leaf)} leaf switch(es) of {pl.nodes_per_leaf} nodes" if pl.nodes_per_leaf else ""
    )
    table = Table(
        title=f"Placement: {n} ranks on {nodes} node(s) of {pl.gpus_per_node} GPUs{leaves}", title_justify="left"
    )
    for col in ("axis", "degree", "stride", "link"):
        table.add_column(col, justify="right" if col in ("degree", "stride") else "left")
    for a in pl.axes:
        table.add_row(a["axis"], str(a["degree"]), str(a["stride"]), a["where"])
    console.print()
    console.print(table)
    shown = [rk for rk in pl.ranks[:_LISTED_RANKS] if rk["node"] == 0]
    more = f" ... ({n - len(shown)} more; --placement FILE draws every rank)" if n > len(shown) else ""
    console.print(
        "node 0: "
        + "  ".join(f"r{rk['rank']}({pictures.rank_coordinates(rk, False, pl.expert_parallel)})" for rk in shown)
        + more,
        highlight=False,
        markup=False,
    )
