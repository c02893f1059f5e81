"""SVG / PNG pictures of a plan with matplotlib (the optional `plot` extra): the schedule of one
step, memory per pipeline rank, and the placement of ranks on nodes. Each function returns a
matplotlib Figure built from planner/pictures.py's data (tests inspect its artists);
:func:`render` turns one into file bytes. No pyplot: figures are not registered anywhere, so
nothing leaks between calls and no display is needed."""

from __future__ import annotations

import io
import math

from planner.errors import PlannerError
from planner.pictures import MEMORY_KINDS, Placement, Timeline

FORMATS = ("svg", "png")

# One colour per cause, the same in the timeline and its legend.
KIND_COLOURS = {
    "forward": "#4C72B0", "backward": "#55A868", "recompute": "#DD8452", "tp_comm": "#8172B3",
    "pp_comm": "#937860", "dp_comm": "#C44E52", "optimizer": "#DA8BC3",
}
KIND_LABELS = {
    "forward": "forward", "backward": "backward", "recompute": "recompute", "tp_comm": "TP collectives",
    "pp_comm": "pipeline sends", "dp_comm": "exposed DP / ZeRO", "optimizer": "optimizer step",
}
MEMORY_COLOURS = {
    "weights": "#4C72B0", "gradients": "#55A868", "optimizer_states": "#DD8452", "activations": "#C44E52",
    "temporary": "#8172B3", "overhead": "#937860",
}
# Above this many ranks a placement picture is unreadable (and slow to draw).
MAX_PLACEMENT_RANKS = 8192


def require_matplotlib() -> None:
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise PlannerError("pictures need matplotlib, which is not installed: pip install 'planner[plot]'")


def _wrap(text: str, fig) -> str:
    """Each line of `text` wrapped to the figure's width (about 15 characters per inch at 9 pt)."""
    import textwrap

    width = max(30, int(fig.get_figwidth() * 15))
    return "\n".join(textwrap.fill(line, width) for line in text.split("\n"))


def _figure(width: float, height: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def timeline_figure(tl: Timeline, title: str, estimate_step: float, estimate_bubble: float):
    """One row per pipeline rank (rank 0 on top); every op a box split by cause, outlined so
    that each micro-batch is visible, with its micro-batch number where it fits."""
    from matplotlib.patches import Patch

    fig = _figure(min(24.0, 8 + 0.04 * len(tl.ops) / max(tl.pp, 1)), 1.6 + 0.45 * tl.pp)
    ax = fig.add_subplot()
    spans: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for op in tl.ops:
        t = op.start
        for kind, seconds in op.segments:
            spans.setdefault((op.rank, kind), []).append((t, seconds))
            t += seconds
    for r, tail in enumerate(tl.tails):
        for kind, start, seconds in tail:
            spans.setdefault((r, kind), []).append((start, seconds))
    for (r, kind), xs in spans.items():
        ax.broken_barh(xs, (r - 0.4, 0.8), facecolors=KIND_COLOURS[kind], gid=f"{kind}-rank{r}")
    # op outlines: one rectangle per pass, so adjacent micro-batches stay apart
    for r in range(tl.pp):
        mine = [(op.start, op.duration) for op in tl.ops if op.rank == r]
        ax.broken_barh(mine, (r - 0.4, 0.8), facecolors="none", edgecolors="white", linewidths=0.6, gid=f"ops-rank{r}")
    per_rank = len(tl.ops) / max(tl.pp, 1)
    if per_rank <= 96:
        for op in tl.ops:
            ax.text(op.start + op.duration / 2, op.rank, str(op.micro_batch), ha="center", va="center",
                    fontsize=6, color="white" if op.kind == "F" else "black")
    ax.set_xlim(0, tl.step_time)
    ax.set_ylim(tl.pp - 0.5, -0.5)
    ax.set_yticks(range(tl.pp), [f"pp {r}" for r in range(tl.pp)])
    ax.set_xlabel("seconds into the step")
    ax.set_title(_wrap(
        f"{title}\nstep {tl.step_time:.3g} s (estimate {estimate_step:.3g} s); pipeline bubble on rank "
        f"{tl.bottleneck_rank}: {tl.bubble_share:.1%} of the step (estimate {estimate_bubble:.1%}); white = idle", fig),
        fontsize=9,
    )
    used = [k for k in KIND_COLOURS if any(key[1] == k for key in spans)]
    ax.legend(handles=[Patch(color=KIND_COLOURS[k], label=KIND_LABELS[k]) for k in used],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    return fig


def memory_figure(bars: list[dict[str, float]], capacity_gib: float, title: str):
    """Stacked bars of GiB by kind per pipeline rank, against the device's memory."""
    from matplotlib.patches import Patch

    fig = _figure(max(5.0, 2.5 + 0.35 * len(bars)), 4.5)
    ax = fig.add_subplot()
    x = list(range(len(bars)))
    bottom = [0.0] * len(bars)
    for kind in MEMORY_KINDS:
        heights = [b[kind] for b in bars]
        ax.bar(x, heights, bottom=bottom, color=MEMORY_COLOURS[kind], width=0.8, gid=f"memory-{kind}")
        bottom = [a + h for a, h in zip(bottom, heights)]
    ax.axhline(capacity_gib, color="black", linestyle="--", linewidth=1)
    ax.text(len(bars) - 0.5, capacity_gib, f" device {capacity_gib:g} GiB", va="bottom", ha="right", fontsize=8)
    ax.set_xticks(x, [str(i) for i in x] if len(bars) <= 32 else [str(i) if i % 8 == 0 else "" for i in x])
    ax.set_xlabel("pipeline rank")
    ax.set_ylabel("GiB per GPU")
    ax.set_ylim(0, max(capacity_gib, max(bottom)) * 1.08)
    ax.set_title(_wrap(f"{title}\npeak {max(bottom):.1f} GiB of {capacity_gib:g} GiB", fig), fontsize=9)
    ax.legend(handles=[Patch(color=MEMORY_COLOURS[k], label=k.replace("_", " ")) for k in MEMORY_KINDS],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    return fig


def placement_figure(pl: Placement, title: str):
    """Nodes as rows of GPU cells, each labelled with its rank and its (dp, tp, pp)
    coordinates and coloured by pipeline rank; tensor-parallel groups that sit side by side
    are outlined; the axes' degrees, strides and links are listed beside."""
    from matplotlib.patches import Rectangle

    n = len(pl.ranks)
    if n > MAX_PLACEMENT_RANKS:
        raise PlannerError(
            f"a placement picture of {n:,} ranks is unreadable (at most {MAX_PLACEMENT_RANKS:,}); "
            "`plan show` without --placement summarises it as text"
        )
    g = pl.gpus_per_node
    nodes = math.ceil(n / g)
    cols = max(1, math.ceil(nodes / 32))  # node columns, 32 nodes per column at most
    rows = math.ceil(nodes / cols)
    fig = _figure(min(40.0, 3.5 + cols * (0.9 * g + 1.2)), min(60.0, 1.5 + 0.55 * rows))
    ax = fig.add_subplot()
    from matplotlib import colormaps

    cmap = colormaps["tab20"]
    label_size = 6 if g <= 8 else 4

    def origin(node: int) -> tuple[float, float]:
        col, row = divmod(node, rows)
        return col * (g + 1.5), row

    for rk in pl.ranks:
        x0, y0 = origin(rk["node"])
        x = x0 + rk["gpu"]
        ax.add_patch(Rectangle((x, y0), 0.95, 0.9, facecolor=cmap(rk["pp"] % 20), edgecolor="white", linewidth=0.5))
        ax.text(x + 0.475, y0 + 0.45, f"r{rk['rank']}\nd{rk['dp']} t{rk['tp']} p{rk['pp']}",
                ha="center", va="center", fontsize=label_size, gid=f"rank-{rk['rank']}")
    for node in range(nodes):
        x0, y0 = origin(node)
        ax.text(x0 - 0.2, y0 + 0.45, f"node {node}", ha="right", va="center", fontsize=7)
    # outline TP groups whose ranks are consecutive GPUs of one node
    groups: dict[tuple[int, int], list[dict]] = {}
    for rk in pl.ranks:
        groups.setdefault((rk["dp"], rk["pp"]), []).append(rk)
    for members in groups.values():
        nodes_of = {m["node"] for m in members}
        gpus = sorted(m["gpu"] for m in members)
        if len(members) > 1 and len(nodes_of) == 1 and gpus[-1] - gpus[0] == len(gpus) - 1:
            x0, y0 = origin(members[0]["node"])
            ax.add_patch(Rectangle((x0 + gpus[0] - 0.03, y0 - 0.03), len(gpus) + 0.01, 0.96,
                                   fill=False, edgecolor="black", linewidth=1.2))
    lines = [f"{a['axis']} = {a['degree']}, stride {a['stride']}: {a['where']}" for a in pl.axes]
    ax.set_xlim(-2.2, cols * (g + 1.5))
    ax.set_ylim(rows + 0.2, -0.3)
    ax.set_axis_off()
    ax.set_title(_wrap(f"{title}\ncolour = pipeline rank; outlined = a tensor-parallel group on one node\n" + "\n".join(lines), fig),
                 fontsize=8, loc="left")
    return fig


def render(fig, fmt: str) -> bytes:
    """The figure as SVG (text kept as text, so labels can be searched) or PNG bytes."""
    import matplotlib

    buf = io.BytesIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "plan"}):
        fig.savefig(buf, format=fmt, dpi=110)
    return buf.getvalue()
