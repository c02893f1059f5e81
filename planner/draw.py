"""SVG / PNG pictures of a plan with matplotlib (the optional `plot` extra): the schedule of one
step, memory per pipeline rank, and the placement of ranks on nodes. Each function returns a
matplotlib Figure built from planner/pictures.py's data (tests inspect its artists);
:func:`render` turns one into file bytes. No pyplot: figures are not registered anywhere, so
nothing leaks between calls and no display is needed."""

from __future__ import annotations

import contextlib
import io
import math
import warnings

from planner.datafile import short_text
from planner.errors import PlannerError
from planner.pictures import MAX_OPS, MEMORY_KINDS, Placement, Timeline, Window, rank_coordinates

FORMATS = ("svg", "png")

# One colour per cause, the same in the timeline and its legend.
KIND_COLOURS = {
    "forward": "#4C72B0",
    "backward": "#55A868",
    "recompute": "#DD8452",
    "tp_comm": "#8172B3",
    "pp_comm": "#937860",
    "dp_comm": "#C44E52",
    "optimizer": "#DA8BC3",
}
KIND_LABELS = {
    "forward": "forward",
    "backward": "backward",
    "recompute": "recompute",
    "tp_comm": "TP collectives",
    "pp_comm": "pipeline sends",
    "dp_comm": "exposed DP / ZeRO",
    "optimizer": "optimizer step",
}
MEMORY_COLOURS = {
    "weights": "#4C72B0",
    "gradients": "#55A868",
    "optimizer_states": "#DD8452",
    "activations": "#C44E52",
    "temporary": "#8172B3",
    "overhead": "#937860",
}
# Above this many ranks a placement picture is unreadable (and slow to draw).
MAX_PLACEMENT_RANKS = 8192
# Above this many passes a timeline picture is unreadable and slow to draw (20,000 took 14 s of
# CPU, 400,000 took 85 s): zoom with --micro-batches / --ranks instead.
MAX_TIMELINE_PASSES = 30_000
# The largest figure drawn, inches (width, height): 4,400 x 6,600 pixels at render()'s 110 dpi,
# about what an image viewer still opens; content beyond it shrinks instead.
MAX_FIGURE_IN = (40.0, 60.0)
# A timeline no wider than this (inches; 2,640 pixels): a denser one is zoomed (plan show --micro-batches, --ranks).
TIMELINE_WIDTH_IN = 24.0
# Passes of other micro-batches inside a zoomed timeline's window are drawn this opaque.
PALE = 0.3


def require_matplotlib() -> None:
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise PlannerError(
            "pictures need matplotlib, which is not installed: pip install 'matplotlib>=3.8' "
            "(the plot extra: pip install '.[plot]' in a clone of this repository)"
        )


def _figure(width: float, height: float):
    """A constrained-layout figure no larger than MAX_FIGURE_IN, with an Agg canvas so that
    text can be measured before the figure is saved."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(min(width, MAX_FIGURE_IN[0]), min(height, MAX_FIGURE_IN[1])), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _extent(fig, text: str, size: float) -> tuple[float, float]:
    """Width and height in pixels of `text` (lines included) at `size` points, as drawn."""
    from matplotlib.text import Text

    t = Text(0, 0, text, fontsize=size)
    t.set_figure(fig)
    box = t.get_window_extent(fig.canvas.get_renderer())
    return box.width, box.height


def _title(fig, text: str, size: float, left: bool = False) -> None:
    """The figure's title, its lines wrapped until the drawn text fits the figure's width
    (measured, as the renderer draws it), then smaller type if a line still does not."""
    import textwrap

    room = fig.bbox.width * 0.96
    lines = text.split("\n")
    chars = max(len(line) for line in lines)
    while True:
        wrapped = "\n".join(textwrap.fill(line, chars, break_on_hyphens=False) for line in lines)
        width, _ = _extent(fig, wrapped, size)
        if width <= room or (chars <= 12 and size <= 4):
            break
        if chars > 12:
            chars = max(12, min(chars - 1, int(chars * room / width)))
        else:
            size -= 1
    fig.suptitle(wrapped, fontsize=size, **({"x": 0.01, "ha": "left"} if left else {}))


def _layout(fig) -> None:
    """Lay the figure out now (the constrained layout that saving repeats), so that axes'
    pixel sizes are known."""
    with _layout_unwarned():
        fig.get_layout_engine().execute(fig)


@contextlib.contextmanager
def _layout_unwarned():
    """matplotlib's 'constrained_layout not applied' warning (a title taller than the figure,
    drawn as it falls) kept off stderr."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="constrained_layout not applied", category=UserWarning)
        yield


def too_many_passes(passes: int, whole: int | None = None) -> None:
    """Refuse a timeline picture of more than MAX_TIMELINE_PASSES passes drawn, or of a plan
    whose whole timeline (`whole` passes, default `passes`) is more than MAX_OPS (PlannerError)."""
    whole = passes if whole is None else whole
    if whole > MAX_OPS:  # the timeline is simulated whole before any zoom: a zoom cannot help
        raise PlannerError(
            f"the timeline would have {whole:,} passes (more than {MAX_OPS:,}); show a plan with fewer micro-batches"
        )
    if passes > MAX_TIMELINE_PASSES:
        raise PlannerError(
            f"a timeline picture of {passes:,} passes is unreadable (at most {MAX_TIMELINE_PASSES:,}); "
            "zoom with --micro-batches A-B or --ranks A-B"
        )


def timeline_figure(
    tl: Timeline, title: str, estimate_step: float, estimate_bubble: float, window: Window | None = None
):
    """One row per pipeline rank (rank 0 on top); every op a box split by cause, outlined so
    that each micro-batch is visible, with its micro-batch number where it fits. `window`
    (planner/pictures.py:window) crops the step to some ranks and micro-batches; passes of
    other micro-batches that run inside it are drawn pale."""
    from matplotlib.patches import Patch

    win = window or Window.whole(tl)
    ranks = win.ranks
    ops = [op for op in tl.ops if op.rank in ranks and win.overlaps(op.start, op.duration)]
    too_many_passes(len(ops))
    fig = _figure(min(TIMELINE_WIDTH_IN, 8 + 0.06 * len(ops) / len(ranks)), 1.6 + 0.45 * len(ranks))
    ax = fig.add_subplot()
    spans: dict[tuple[int, str, bool], list[tuple[float, float]]] = {}
    for op in ops:
        t = op.start
        for kind, seconds in op.segments:
            spans.setdefault((op.rank, kind, win.chosen(op)), []).append((t, seconds))
            t += seconds
    for r in ranks:
        for kind, start, seconds in tl.tails[r]:
            if win.overlaps(start, seconds):
                spans.setdefault((r, kind, True), []).append((start, seconds))
    for (r, kind, chosen), xs in spans.items():
        ax.broken_barh(
            xs, (r - 0.4, 0.8), facecolors=KIND_COLOURS[kind], alpha=1.0 if chosen else PALE, gid=f"{kind}-rank{r}"
        )
    # op outlines: one rectangle per pass, so adjacent micro-batches stay apart
    for r in ranks:
        mine = [(op.start, op.duration) for op in ops if op.rank == r]
        ax.broken_barh(mine, (r - 0.4, 0.8), facecolors="none", edgecolors="white", linewidths=0.6, gid=f"ops-rank{r}")
    ax.set_xlim(win.start, win.end)
    ax.set_ylim(ranks[-1] + 0.5, ranks[0] - 0.5)
    ax.set_yticks(ranks, [f"pp {r}" for r in ranks], fontsize=10 if len(ranks) <= 32 else 8)
    ax.set_xlabel("seconds into the step")
    used = [k for k in KIND_COLOURS if any(key[1] == k for key in spans)]
    ax.legend(
        handles=[Patch(color=KIND_COLOURS[k], label=KIND_LABELS[k]) for k in used],
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
        fontsize=8,
        frameon=False,
    )
    zoom = "" if win.is_whole(tl) else f"\n{win.describe(tl)}; other micro-batches' passes pale"
    _title(
        fig,
        f"{title}\nstep {tl.step_time:.3g} s (estimate {estimate_step:.3g} s); pipeline bubble on rank "
        f"{tl.bottleneck_rank}: {tl.bubble_share:.1%} of the step (estimate {estimate_bubble:.1%}); white = idle"
        + zoom,
        9,
    )
    _label_ops(fig, ax, [op for op in ops if win.start <= op.start and op.end <= win.end], win)
    return fig


def _label_ops(fig, ax, ops, win: Window) -> None:
    """Each op's micro-batch number where the widest of the numbers, as drawn, fits inside its
    box: one width for every box, so that boxes of one length are all labelled or none is."""
    if not ops:
        return
    _layout(fig)
    (x0, y0), (x1, y1) = ax.transData.transform([(0.0, 0.0), (1.0, 1.0)])
    width, height = _extent(fig, str(max(op.micro_batch for op in ops)), 6)
    if height + 1 > 0.8 * abs(y1 - y0):
        return
    shortest = (width + 2) / abs(x1 - x0)  # seconds a box must last to hold the number
    for op in ops:
        if op.duration >= shortest:
            ax.text(
                op.start + op.duration / 2,
                op.rank,
                str(op.micro_batch),
                ha="center",
                va="center",
                fontsize=6,
                color="white" if op.kind == "F" and win.chosen(op) else "black",
                clip_on=True,
                in_layout=False,
                gid=f"label-{op.kind}{op.stage}-{op.micro_batch}",
            )


def memory_figure(bars: list[dict[str, float]], capacity_gib: float, title: str):
    """Stacked bars of GiB by kind per pipeline rank, against the device's memory, which is
    labelled beside the axes (where no bar reaches); the legend below them."""
    from matplotlib.patches import Patch

    fig = _figure(max(5.0, 2.5 + 0.35 * len(bars)), 5.0)
    ax = fig.add_subplot()
    x = list(range(len(bars)))
    bottom = [0.0] * len(bars)
    for kind in MEMORY_KINDS:
        heights = [b[kind] for b in bars]
        ax.bar(x, heights, bottom=bottom, color=MEMORY_COLOURS[kind], width=0.8, gid=f"memory-{kind}")
        bottom = [a + h for a, h in zip(bottom, heights)]
    ax.axhline(capacity_gib, color="black", linestyle="--", linewidth=1)
    ax.annotate(
        f"device\n{capacity_gib:g} GiB",
        xy=(1.0, capacity_gib),
        xycoords=("axes fraction", "data"),
        xytext=(4, 0),
        textcoords="offset points",
        ha="left",
        va="center",
        fontsize=8,
        annotation_clip=False,
    )
    ax.set_xticks(x, [str(i) for i in x] if len(bars) <= 32 else [str(i) if i % 8 == 0 else "" for i in x])
    ax.set_xlabel("pipeline rank")
    ax.set_ylabel("GiB per GPU")
    ax.set_ylim(0, max(capacity_gib, max(bottom)) * 1.08)
    fig.legend(
        handles=[Patch(color=MEMORY_COLOURS[k], label=k.replace("_", " ")) for k in MEMORY_KINDS],
        loc="outside lower center",
        ncols=3,
        fontsize=8,
        frameon=False,
    )
    _title(fig, f"{title}\npeak {max(bottom):.1f} GiB of {capacity_gib:g} GiB", 9)
    return fig


def placement_figure(pl: Placement, title: str):
    """Nodes as rows of GPU cells, each labelled with its rank and its (dp, tp, pp)
    coordinates (and its place in its expert group with expert parallelism) where the label
    fits, coloured by pipeline rank; tensor-parallel groups that sit side by side are outlined;
    nodes are named with their leaf switch under an oversubscribed spine; the axes' degrees,
    strides and links (and the expert groups' all-to-all) are listed above."""
    n = len(pl.ranks)
    if n > MAX_PLACEMENT_RANKS:
        raise PlannerError(
            f"a placement picture of {n:,} ranks is unreadable (at most {MAX_PLACEMENT_RANKS:,}); "
            "`plan show` without --placement summarises it as text"
        )
    g = min(pl.gpus_per_node, n)  # cells a node row shows: a plan smaller than a node uses part of one
    nodes = math.ceil(n / pl.gpus_per_node)
    column_in = 0.9 * g + 1.2  # one column of nodes: g cells and the gap for node names
    widest = max(1, int((MAX_FIGURE_IN[0] - 2.5) // column_in))  # columns that fit the widest figure
    cols = max(1, min(math.ceil(nodes / 32), widest))  # 32 nodes a column until the width is used
    rows = math.ceil(nodes / cols)
    fig = _figure(2.5 + cols * column_in, 1.5 + 0.55 * rows)
    ax = fig.add_subplot()

    def origin(node: int) -> tuple[float, float]:
        col, row = divmod(node, rows)
        return col * (g + 1.5), row

    _placement_cells(ax, pl, origin)
    lines = [f"{a['axis']} = {a['degree']}, stride {a['stride']}: {a['where']}" for a in pl.axes]
    ax.set_xlim(-1.5, cols * (g + 1.5))  # 1.5 cells left of each node for its name
    ax.set_ylim(rows + 0.2, -0.3)
    ax.set_axis_off()
    _title(
        fig,
        f"{title}\ncolour = pipeline rank; outlined = a tensor-parallel group on one node\n" + "\n".join(lines),
        8,
        left=True,
    )
    _placement_labels(fig, ax, pl, nodes, origin)
    return fig


def _placement_cells(ax, pl: Placement, origin) -> None:
    """A cell per rank coloured by pipeline rank; a black outline round each tensor-parallel
    group whose ranks are consecutive GPUs of one node."""
    from matplotlib import colormaps
    from matplotlib.patches import Rectangle

    cmap = colormaps["tab20"]
    for rk in pl.ranks:
        x0, y0 = origin(rk["node"])
        ax.add_patch(
            Rectangle((x0 + rk["gpu"], y0), 0.95, 0.9, facecolor=cmap(rk["pp"] % 20), edgecolor="white", linewidth=0.5)
        )
    groups: dict[tuple[int, int, int], list[dict]] = {}  # a TP group: one (dp, cp, pp) coordinate
    for rk in pl.ranks:
        groups.setdefault((rk["dp"], rk["cp"], rk["pp"]), []).append(rk)
    for members in groups.values():
        nodes_of = {m["node"] for m in members}
        gpus = sorted(m["gpu"] for m in members)
        if len(members) > 1 and len(nodes_of) == 1 and gpus[-1] - gpus[0] == len(gpus) - 1:
            x0, y0 = origin(members[0]["node"])
            ax.add_patch(
                Rectangle(
                    (x0 + gpus[0] - 0.03, y0 - 0.03),
                    len(gpus) + 0.01,
                    0.96,
                    fill=False,
                    edgecolor="black",
                    linewidth=1.2,
                )
            )


def _rank_label(rk: dict, cp: bool, ep: bool) -> str:
    return f"r{rk['rank']}\n{rank_coordinates(rk, cp, ep)}"


def node_name(pl: Placement, node: int) -> str:
    """ "node 3", or "node 3 leaf 1" under an oversubscribed spine."""
    return f"node {node}" + (f" leaf {node // pl.nodes_per_leaf}" if pl.nodes_per_leaf else "")


def _placement_labels(fig, ax, pl: Placement, nodes: int, origin) -> None:
    """Rank labels in their cells and node names in the gaps left of them, each in the largest
    type (at most 6 and 7 points) at which the widest drawn label fits; none where even 4 points
    does not."""
    _layout(fig)
    (x0, y0), (x1, y1) = ax.transData.transform([(0.0, 0.0), (1.0, 1.0)])
    unit_w, unit_h = abs(x1 - x0), abs(y1 - y0)

    def size_for(text: str, width: float, height: float, largest: int) -> int | None:
        return next((s for s in range(largest, 3, -1) if _fits(fig, text, s, width, height)), None)

    cp = any(rk["cp"] for rk in pl.ranks)  # context parallel: its coordinate too
    labels = [_rank_label(rk, cp, pl.expert_parallel) for rk in pl.ranks]
    widest = max(labels, key=len)
    size = size_for(widest, 0.95 * unit_w, 0.9 * unit_h, 6)
    if size is not None:
        for rk, label in zip(pl.ranks, labels):
            x, y = origin(rk["node"])
            ax.text(
                x + rk["gpu"] + 0.475,
                y + 0.45,
                label,
                ha="center",
                va="center",
                fontsize=size,
                gid=f"rank-{rk['rank']}",
                in_layout=False,
            )
    size = size_for(node_name(pl, nodes - 1), 1.2 * unit_w, 0.9 * unit_h, 7)
    if size is not None:
        for node in range(nodes):
            x, y = origin(node)
            ax.text(x - 0.2, y + 0.45, node_name(pl, node), ha="right", va="center", fontsize=size, in_layout=False)


def _fits(fig, text: str, size: float, width: float, height: float) -> bool:
    w, h = _extent(fig, text, size)
    return w + 2 <= width and h + 1 <= height


def render(fig, fmt: str) -> bytes:
    """The figure as SVG (text kept as text, so labels can be searched) or PNG bytes."""
    import matplotlib

    buf = io.BytesIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "plan"}), _layout_unwarned():
        fig.savefig(buf, format=fmt, dpi=110)
    return buf.getvalue()


# One colour per cluster of a `plan size` picture, in the order given.
CLUSTER_COLOURS = (
    "#4C72B0",
    "#55A868",
    "#C44E52",
    "#8172B3",
    "#DD8452",
    "#937860",
    "#DA8BC3",
    "#8C8C8C",
    "#CCB974",
    "#64B5CD",
)


def size_figure(doc):
    """`plan size`'s front: days to train (x, log) against GPU-hours or cost (y), a marker per
    feasible point coloured by cluster and labelled with its GPU count, the interval of its
    days as a horizontal bar, the front joined by a line; points where adding GPUs stops
    paying ringed."""
    fig = _figure(8.0, 5.5)
    ax = fig.add_subplot()
    cost = doc.front_axis == "cost"
    value = (lambda p: p.cost) if cost else (lambda p: p.gpu_hours)
    clusters = list(dict.fromkeys(p.cluster for p in doc.points))
    for i, name in enumerate(clusters):
        ps = [p for p in doc.points if p.cluster == name and p.feasible and value(p) is not None]
        if not ps:
            continue
        colour = CLUSTER_COLOURS[i % len(CLUSTER_COLOURS)]
        ax.plot(
            [p.days for p in ps],
            [value(p) for p in ps],
            marker="o",
            linestyle=":",
            color=colour,
            label=name,
            gid=f"size-{i}",
        )
        for p in ps:
            ax.hlines(value(p), p.days_interval[0], p.days_interval[1], color=colour, alpha=0.4, linewidth=3)
            ax.annotate(
                f"{p.gpus:,}", (p.days, value(p)), xytext=(3, 4), textcoords="offset points", fontsize=7, color=colour
            )
            if p.stops_paying:
                ax.plot(
                    [p.days], [value(p)], marker="o", markersize=13, markerfacecolor="none", color="black", linewidth=0
                )
    front = sorted((p for p in doc.points if p.on_front and value(p) is not None), key=lambda p: p.days)
    if front:
        ax.plot(
            [p.days for p in front],
            [value(p) for p in front],
            color="black",
            linewidth=1.2,
            label="front",
            gid="size-front",
        )
    if doc.deadline_days is not None:
        ax.axvline(doc.deadline_days, color="black", linestyle="--", linewidth=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("days to train (bars: the step time's interval)")
    ax.set_ylabel("cost" if cost else "GPU-hours")
    if ax.get_legend_handles_labels()[1]:
        ax.legend(fontsize=8, frameon=False)
    else:  # no point has a plan: an empty chart says so rather than nothing
        ax.text(0.5, 0.5, "no point has a plan (the table says why)", transform=ax.transAxes, ha="center", va="center")
    ringed = " (ringed: adding GPUs stops paying)" if any(p.stops_paying for p in doc.points) else ""
    _title(
        fig,
        f"{short_text(doc.model.name)}: {doc.tokens / 1e12:,.3g}T tokens, batch {doc.global_batch_size:,} x {doc.seq_len:,}{ringed}",
        9,
    )
    return fig
