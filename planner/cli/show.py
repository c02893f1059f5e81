"""`plan show`: a plan as pictures. In the terminal a compact text version (the schedule of
one step per pipeline rank, memory per pipeline rank, the axes' placement and links); with
--timeline / --memory / --placement FILE, SVG or PNG pictures by the file's extension
(matplotlib, the `plot` extra). The numbers come from planner/pictures.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import click
from rich.console import Console
from rich.table import Table

from cost_models.estimate import estimate as run_estimate
from planner import pictures
from planner.cli import render
from planner.cli.common import check_plan
from planner.datafile import check_output, write_atomic
from planner.errors import UsageError
from planner.plan_file import read_plan_file

# Text timeline: one character per time bin, the cause that fills most of it; forward and
# backward alternate case with the micro-batch's parity so that neighbours stay apart.
_CHARS = {"forward": "F", "backward": "B", "recompute": "R", "tp_comm": "c", "pp_comm": "c", "dp_comm": "d", "optimizer": "o"}
_FILE_OPTIONS = ("timeline", "memory", "placement")
_SHORT = {"weights": "weights", "gradients": "grads", "optimizer_states": "optim", "activations": "activ",
          "temporary": "temp", "overhead": "ovh"}
# The first node's ranks are listed in the terminal; --placement FILE draws all of them.
_LISTED_RANKS = 16


@click.command()
@click.argument("plan_file", type=click.Path(dir_okay=False))
@click.option("--alternative", type=int, default=None, help="Show alternative K of a `plan solve` document (1 = first).")
@click.option("--timeline", type=click.Path(dir_okay=False), help="Draw the schedule of one step to FILE (.svg or .png).")
@click.option("--memory", type=click.Path(dir_okay=False), help="Draw memory per pipeline rank to FILE (.svg or .png).")
@click.option("--placement", type=click.Path(dir_okay=False), help="Draw ranks on nodes with their groups and links to FILE (.svg or .png).")
@click.option("--json", "as_json", is_flag=True, help="Print the pictures' numbers as one JSON object.")
def show(plan_file: str, alternative: Optional[int], timeline: Optional[str], memory: Optional[str],
         placement: Optional[str], as_json: bool) -> None:
    """Pictures of a plan: its pipeline schedule, memory per GPU and placement of ranks."""
    files = {k: v for k, v in (("timeline", timeline), ("memory", memory), ("placement", placement)) if v is not None}
    _check_files(files, plan_file)
    doc = read_plan_file(Path(plan_file), alternative)
    model, cluster, job, plan = doc.model, doc.cluster, doc.job, doc.plan
    check_plan(plan, model, job, doc.num_gpus)
    est = run_estimate(model, cluster, job, plan)
    tl = pictures.timeline(model, cluster, job, plan, est)
    bars = pictures.memory_bars(est)
    pl = pictures.placement(plan, cluster)
    title = f"{model.name} on {doc.num_gpus} x {cluster.name}: {render.plan_summary(plan)}"
    est_bubble = est.time_breakdown_s.pipeline_bubble / est.step_time_s

    if files:
        from planner import draw

        figures = {
            "timeline": lambda: draw.timeline_figure(tl, title, est.step_time_s, est_bubble),
            "memory": lambda: draw.memory_figure(bars, est.memory_capacity_gib, title),
            "placement": lambda: draw.placement_figure(pl, title),
        }
        rendered = {k: draw.render(figures[k](), Path(f).suffix.lower().lstrip(".")) for k, f in files.items()}
        for k, f in files.items():  # every picture drawn before any is written
            write_atomic(f, rendered[k])
    if as_json:
        click.echo(json.dumps(_document(tl, est, est_bubble, bars, pl), indent=2))
        return
    console = render.console
    console.print(title, highlight=False)
    _text_timeline(console, tl, est.step_time_s, est_bubble)
    _text_memory(console, bars, est.memory_capacity_gib)
    _text_placement(console, pl)
    for k, f in files.items():
        console.print(f"wrote the {k} picture to {f}", highlight=False)


def _check_files(files: dict, plan_file: str) -> None:
    """Before any work: known extensions, distinct files, writable places, matplotlib."""
    from planner.draw import FORMATS, require_matplotlib

    seen: dict[str, str] = {}
    for k, f in files.items():
        ext = Path(f).suffix.lower().lstrip(".")
        if ext not in FORMATS:
            raise UsageError(f"--{k} {f}: the picture's format comes from the extension; use .svg or .png")
        target = str(check_output(f, (plan_file,)).resolve())
        if target in seen:
            raise UsageError(f"--{seen[target]} and --{k} both write {f}; give each picture its own file")
        seen[target] = k
    if files:
        require_matplotlib()


def _document(tl: pictures.Timeline, est, est_bubble: float, bars, pl: pictures.Placement) -> dict:
    return {
        "timeline": {
            "step_time_s": tl.step_time,
            "estimate_step_time_s": est.step_time_s,
            "pipeline_end_s": tl.pipeline_end,
            "bottleneck_pipeline_rank": tl.bottleneck_rank,
            "bubble_share": tl.bubble_share,
            "estimate_bubble_share": est_bubble,
            "pipeline_ranks": [
                {"pipeline_rank": r, "busy_s": tl.busy[r], "idle_s": tl.idle(r),
                 "tail": [{"kind": k, "start_s": s, "seconds": d} for k, s, d in tl.tails[r]]}
                for r in range(tl.pp)
            ],
        },
        "memory_gib_per_pipeline_rank": bars,
        "memory_capacity_gib": est.memory_capacity_gib,
        "placement": {"gpus_per_node": pl.gpus_per_node, "axes": pl.axes, "num_ranks": len(pl.ranks)},
    }


def _text_timeline(console: Console, tl: pictures.Timeline, est_step: float, est_bubble: float) -> None:
    width = max(20, min(200, console.width - 9))
    dt = tl.step_time / width
    console.print(
        f"\nSchedule of one step ({tl.step_time:.3g} s, estimate {est_step:.3g} s): pipeline bubble on rank "
        f"{tl.bottleneck_rank} = {tl.bubble_share:.1%} of the step (estimate {est_bubble:.1%})", highlight=False,
    )
    rows = []
    for r in range(tl.pp):
        fill = [dict() for _ in range(width)]

        def add(kind_char: str, start: float, seconds: float, fill=fill) -> None:
            a, b = start / dt, (start + seconds) / dt
            i = int(a)
            while i < min(width, b):
                fill[i][kind_char] = fill[i].get(kind_char, 0.0) + min(b, i + 1) - max(a, i)
                i += 1

        for op in (o for o in tl.ops if o.rank == r):
            t = op.start
            for kind, seconds in op.segments:
                ch = _CHARS[kind]
                if kind in ("forward", "backward") and op.micro_batch % 2:
                    ch = ch.lower()
                add(ch, t, seconds)
                t += seconds
        for kind, start, seconds in tl.tails[r]:
            add(_CHARS[kind], start, seconds)
        line = "".join(max(f, key=f.get) if f and sum(f.values()) >= 0.5 else "." for f in fill)
        rows.append(f"pp {r:<3}|{line}|")
    for row in rows:
        console.print(row, highlight=False, markup=False)
    console.print(
        "F/f forward, B/b backward (case alternates by micro-batch), R recompute, c TP/pipeline communication, "
        "d exposed DP/ZeRO, o optimizer, . idle", highlight=False, style="dim",
    )


def _text_memory(console: Console, bars, capacity: float) -> None:
    table = Table(title=f"Memory per GPU, GiB (device {capacity:g})", title_justify="left")
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
    table = Table(title=f"Placement: {n} ranks on {nodes} node(s) of {pl.gpus_per_node} GPUs", title_justify="left")
    for col in ("axis", "degree", "stride", "link"):
        table.add_column(col, justify="right" if col in ("degree", "stride") else "left")
    for a in pl.axes:
        table.add_row(a["axis"], str(a["degree"]), str(a["stride"]), a["where"])
    console.print()
    console.print(table)
    shown = [rk for rk in pl.ranks[:_LISTED_RANKS] if rk["node"] == 0]
    more = f" ... ({n - len(shown)} more; --placement FILE draws every rank)" if n > len(shown) else ""
    console.print(
        "node 0: " + "  ".join(f"r{rk['rank']}(d{rk['dp']} t{rk['tp']} p{rk['pp']})" for rk in shown) + more,
        highlight=False, markup=False,
    )
