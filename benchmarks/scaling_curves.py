"""Tokens/s per GPU against GPU count at a fixed global batch, per stack: where each curve bends and why.

    python benchmarks/scaling_curves.py [--quick] [--plot PATH]

Five curves per (model, cluster), each point one `plan solve` (planner.api.solve, no
alternatives) at 64-2,048 GPUs:
- 3-D (megatron): target megatron, nothing fixed (the solver's best tp x pp x dp layout);
- FSDP (torchtitan) and ZeRO-3 (deepspeed): tp 1, pp 1, ZeRO-3 sharded over all of dp
  (dp_shard = dp: one shard group);
- HSDP (torchtitan) and MiCS (deepspeed): tp 1, pp 1, ZeRO-3 sharded within a node of 8 GPUs
  (dp_shard 8), replicated across nodes.
Models: Llama 2 7B and Llama 3 70B at 1,024 x 4,096 tokens (Llama 2's 4M-token batch, Touvron
et al. 2023, sec. 2.2), GPT-3 175B at 1,536 x 2,048 (GPT-3's 3.2M, Brown et al. 2020, table
2.1); clusters dgx-a100-80gb and dgx-h100-80gb. A sharded curve's dp is the GPU count, so where
the batch does not divide over it the point is skipped and said so (`batch`); a point the stack
cannot run is `refused`, one that fits no memory `memory` (each with the solver's message once).

A curve bends at the first count whose tokens/s per GPU is more than BEND below the best of the
counts before it; the term named is the field of the estimate's time_breakdown_s whose share
of the step grew most from the curve's previous point to that one.

Published points: the runs of benchmarks/published_cases.py on the same two presets whose
model is within MODEL_MATCH of the curve's parameter count and whose data-parallel family
matches a curve (tp x pp > 1: 3-D; ZeRO-3 with tp = pp = 1: FSDP / HSDP by target torchtitan,
ZeRO-3 / MiCS by target deepspeed, full or per-node sharding by dp_shard), each predicted with
its own layout, batch and network (cost_models.estimate), ratio = predicted / published. FP8
runs are left out (the curves are BF16). The picture shows those published in tokens/s per GPU
(o) beside their prediction (x); TFLOP/s-only runs are in the table only. `--quick`: Llama 2 7B
on dgx-h100-80gb at 64-256 GPUs (the smoke test's grid).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # runnable as a script from anywhere
from benchmarks.published_cases import Case, cases  # noqa: E402
from cost_models.compute import total_params  # noqa: E402
from cost_models.estimate import estimate as cm_estimate  # noqa: E402
from planner.api import load_model, solve  # noqa: E402
from planner.errors import MemoryMiss, PlannerError  # noqa: E402
from planner.specs import Plan  # noqa: E402
from planner.tune.loop import layout_label  # noqa: E402

BEND = 0.10  # a fall of more than 10% below the best so far is a bend
MODEL_MATCH = 0.15  # a published run's model within 15% of the curve's parameter count
NODE = 8  # GPUs per node of both presets: HSDP's / MiCS's shard group
CLUSTERS = ("dgx-a100-80gb", "dgx-h100-80gb")
COUNTS = (64, 128, 256, 512, 1024, 2048)


@dataclass(frozen=True)
class Workload:
    model: str  # preset name
    global_batch: int  # sequences per step, the same at every GPU count
    seq_len: int


WORKLOADS = (Workload("llama2-7b", 1024, 4096), Workload("llama3-70b", 1024, 4096), Workload("gpt3-175b", 1536, 2048))
QUICK = ((WORKLOADS[0],), ("dgx-h100-80gb",), (64, 128, 256))


@dataclass(frozen=True)
class Family:
    label: str
    target: str
    shard: Optional[int]  # None: nothing fixed (3-D); 0: ZeRO-3 over all of dp; k: ZeRO-3 within k ranks

    def fixes(self, gpus: int) -> dict:
        if self.shard is None:
            return {}
        return {"tp": 1, "pp": 1, "zero": 3, "dp_shard": self.shard or gpus}


FAMILIES = (
    Family("3-D (megatron)", "megatron", None),
    Family("FSDP (torchtitan)", "torchtitan", 0),
    Family("HSDP (torchtitan)", "torchtitan", NODE),
    Family("ZeRO-3 (deepspeed)", "deepspeed", 0),
    Family("MiCS (deepspeed)", "deepspeed", NODE),
)


@dataclass(frozen=True)
class Point:
    gpus: int
    per_gpu: Optional[float] = None  # tokens/s per GPU; None: no plan (missing says why)
    interval: Optional[tuple[float, float]] = None  # tokens/s per GPU at the step-time interval's ends
    shares: Optional[dict[str, float]] = None  # each time_breakdown_s field over the step time
    layout: str = ""
    missing: str = ""  # "batch", "memory", "refused"
    reason: str = ""  # the solver's message (or the batch's)


def solve_point(work: Workload, cluster: str, family: Family, gpus: int) -> Point:
    """One curve's point: the plan solve finds, or why there is none."""
    if family.shard is not None and work.global_batch % gpus:
        reason = f"batch {work.global_batch} does not divide over dp {gpus}"
        return Point(gpus, missing="batch", reason=reason)
    try:
        doc = solve(
            work.model,
            cluster,
            gpus=gpus,
            global_batch=work.global_batch,
            seq_len=work.seq_len,
            target=family.target,
            fixes=family.fixes(gpus),
            top_k=0,
        )
    except MemoryMiss as exc:
        return Point(gpus, missing="memory", reason=str(exc))
    except PlannerError as exc:
        return Point(gpus, missing="refused", reason=str(exc))
    est, tokens = doc.estimate, work.global_batch * work.seq_len / gpus
    step = est.step_time_s
    interval = (tokens / est.step_time_interval_s[1], tokens / est.step_time_interval_s[0])
    shares = {name: t / step for name, t in est.time_breakdown_s.model_dump().items()}
    return Point(gpus, est.tokens_per_s / gpus, interval if est.step_time_interval_s else None, shares, label(doc.plan))


def label(plan: Plan) -> str:
    return layout_label(plan) + (f" shard{plan.dp_shard}" if plan.dp_shard else "")


Curves = dict[tuple[str, str], dict[str, list[Point]]]  # (model, cluster) -> family label -> points


def run_grid(workloads: Sequence[Workload], clusters: Sequence[str], counts: Sequence[int]) -> Curves:
    return {
        (w.model, c): {f.label: [solve_point(w, c, f, n) for n in counts] for f in FAMILIES}
        for w in workloads
        for c in clusters
    }


@dataclass(frozen=True)
class Bend:
    gpus: int
    previous: int  # the curve's point before it
    fall: float  # below the best so far, a fraction
    term: str  # the time_breakdown_s field whose share grew most
    share_before: float
    share_after: float


def find_bend(points: Sequence[Point]) -> Optional[Bend]:
    """The first point more than BEND below the best before it, and the term that grew most."""
    best: Optional[float] = None
    previous: Optional[Point] = None
    for p in points:
        if p.per_gpu is None or p.shares is None:
            continue
        if previous is not None and previous.shares is not None and best is not None and p.per_gpu < (1 - BEND) * best:
            before, after = previous.shares, p.shares
            term = max(after, key=lambda k: after[k] - before.get(k, 0.0))
            return Bend(p.gpus, previous.gpus, 1 - p.per_gpu / best, term, before.get(term, 0.0), after[term])
        best = p.per_gpu if best is None else max(best, p.per_gpu)
        previous = p
    return None


def print_curves(curves: Curves, workloads: Sequence[Workload], counts: Sequence[int]) -> None:
    batch = {w.model: w for w in workloads}
    width = max(len(f.label) for f in FAMILIES) + 2
    for (model, cluster), by_family in curves.items():
        w = batch[model]
        print(f"\n{model} on {cluster}, global batch {w.global_batch} x {w.seq_len} tokens: tokens/s per GPU")
        print("GPUs " + "".join(f.label.rjust(width) for f in FAMILIES))
        for i, n in enumerate(counts):
            cells = [by_family[f.label][i] for f in FAMILIES]
            print(f"{n:>4} " + "".join((f"{p.per_gpu:,.0f}" if p.per_gpu else p.missing).rjust(width) for p in cells))
        for f in FAMILIES:
            points = by_family[f.label]
            if f.shard is None:
                print(f"  {f.label} layouts: " + "; ".join(f"{p.gpus}: {p.layout}" for p in points if p.layout))
            for reason in dict.fromkeys(p.reason for p in points if p.missing):
                at = ", ".join(str(p.gpus) for p in points if p.reason == reason)
                print(f"  {f.label} at {at}: {reason}")


def print_bends(curves: Curves) -> None:
    print(f"\nWhere each curve bends: the first count more than {BEND:.0%} below its best so far")
    print(f"{'model':<11} {'cluster':<14} {'curve':<19} {'bend at':>8} {'fall':>6}  term that grew (share of step)")
    for (model, cluster), by_family in curves.items():
        for f in FAMILIES:
            points = [p for p in by_family[f.label] if p.per_gpu is not None]
            bend = find_bend(points)
            if bend is None:
                what = f"{'none':>8} {'':>6}  " + (f"within {BEND:.0%} to {points[-1].gpus}" if points else "no points")
            else:
                what = (
                    f"{bend.gpus:>8} {bend.fall:>6.0%}  {bend.term} "
                    f"({bend.share_before:.0%} at {bend.previous} -> {bend.share_after:.0%})"
                )
            print(f"{model:<11} {cluster:<14} {f.label:<19} {what}")


@dataclass(frozen=True)
class Published:
    model: str  # the curve's preset
    cluster: str
    curve: str  # the family label it is checked against
    case: Case
    predicted: float  # the case's metric, from the estimate of its own layout and batch

    @property
    def ratio(self) -> float:
        return self.predicted / self.case.published


def curve_of(case: Case) -> Optional[str]:
    """The curve a published run's layout belongs to, or None (ZeRO-1/2 without tp or pp, FP8)."""
    p = case.plan
    if p.fp8:
        return None
    if p.tp * p.pp > 1:
        return FAMILIES[0].label
    if p.zero_stage != 3:
        return None
    hybrid = bool(p.dp_shard) and p.dp_shard != p.dp
    sharded = (f for f in FAMILIES if f.shard is not None and f.target == case.job.target.value)
    return next((f.label for f in sharded if (f.shard == NODE) == hybrid), None)


def published_points(workloads: Sequence[Workload], clusters: Sequence[str]) -> list[Published]:
    params = {w.model: total_params(load_model(w.model)) for w in workloads}
    found, _ = cases()
    out = []
    for c in found:
        curve = curve_of(c)
        near = [m for m, n in params.items() if abs(total_params(c.model) / n - 1) <= MODEL_MATCH]
        if curve is None or not near or c.cluster.name not in clusters:
            continue
        predicted = c.predicted(cm_estimate(c.model, c.cluster, c.job, c.plan))
        out.append(Published(near[0], c.cluster.name, curve, c, predicted))
    order = [w.model for w in workloads], list(clusters), [f.label for f in FAMILIES]
    return sorted(
        out,
        key=lambda p: (
            order[0].index(p.model),
            order[1].index(p.cluster),
            order[2].index(p.curve),
            p.case.plan.world_size,
        ),
    )


def print_published(points: Sequence[Published]) -> None:
    print("\nPublished points (each predicted with its own layout and batch; ratio = predicted / published)")
    print(
        f"{'model':<11} {'cluster':<14} {'curve':<19} {'GPUs':>5} {'metric':<12} {'published':>9} {'predicted':>9} ratio  run"
    )
    for p in points:
        metric = "tok/s/GPU" if p.case.metric == "tokens_per_s_per_gpu" else "TFLOP/s/GPU"
        print(
            f"{p.model:<11} {p.cluster:<14} {p.curve:<19} {p.case.plan.world_size:>5} {metric:<12} "
            f"{p.case.published:>9,.0f} {p.predicted:>9,.0f} {p.ratio:5.2f}  {p.case.name[:70]}"
        )
    for curve in (f.label for f in FAMILIES if any(p.curve == f.label for p in points)):
        ratios = [p.ratio for p in points if p.curve == curve]
        mean = math.exp(sum(map(math.log, ratios)) / len(ratios))
        runs = f"{len(ratios)} run" + ("s" if len(ratios) > 1 else "")
        print(f"  {curve}: {runs}, ratios {min(ratios):.2f}-{max(ratios):.2f}, geometric mean {mean:.2f}")


def plot(path: str, curves: Curves, published: Sequence[Published], workloads, clusters) -> None:
    """Rows = models, columns = clusters; one line per curve (its interval shaded), the bend
    marked, published runs in tokens/s per GPU (o) beside their prediction (x)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    fig = Figure(figsize=(6.0 * len(clusters), 3.6 * len(workloads)), layout="constrained")
    axes = fig.subplots(len(workloads), len(clusters), squeeze=False)
    colour = {f.label: f"C{i}" for i, f in enumerate(FAMILIES)}
    for (r, w), (c, cluster) in ((rw, cc) for rw in enumerate(workloads) for cc in enumerate(clusters)):
        ax = axes[r][c]
        for i, f in enumerate(FAMILIES):
            pts = [p for p in curves[(w.model, cluster)][f.label] if p.per_gpu is not None]
            _curve(ax, pts, colour[f.label], i)
        for p in published:
            if (p.model, p.cluster) == (w.model, cluster) and p.case.metric == "tokens_per_s_per_gpu":
                n, col = p.case.plan.world_size, colour[p.curve]
                ax.plot([n, n], [p.case.published, p.predicted], color=col, lw=0.6)
                ax.plot(n, p.case.published, "o", mfc="none", mec=col, ms=6)
                ax.plot(n, p.predicted, "x", color=col, ms=5)
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_ylim(bottom=0)
        ax.set_title(f"{w.model} on {cluster}, batch {w.global_batch} x {w.seq_len}", fontsize=9)
        ax.set_xlabel("GPUs", fontsize=8)
        ax.set_ylabel("tokens/s per GPU", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    drawn = {f for by_family in curves.values() for f, pts in by_family.items() if any(p.per_gpu for p in pts)}
    names = {f.label: f.label + ("" if f.label in drawn else ": no plan") for f in FAMILIES}
    handles = [axes[0][0].plot([], [], color=colour[f.label], marker=".", label=names[f.label])[0] for f in FAMILIES]
    handles += axes[0][0].plot([], [], "ko", mfc="none", label="published run")
    handles += axes[0][0].plot([], [], "kx", label="predicted for that run")
    fig.legend(handles=handles, loc="outside lower center", ncols=4, fontsize=8)
    fig.savefig(path, dpi=100)


def _curve(ax, pts: Sequence[Point], col: str, row: int) -> None:
    """One curve, its step-time interval shaded, its bend marked and named (row: the label's offset)."""
    if not pts:
        return
    ax.plot([p.gpus for p in pts], [p.per_gpu for p in pts], color=col, marker=".")
    banded = [p for p in pts if p.interval]
    if banded:
        low, high = zip(*(p.interval for p in banded if p.interval))
        ax.fill_between([p.gpus for p in banded], low, high, color=col, alpha=0.10, lw=0)
    bend = find_bend(pts)
    if bend is not None:
        y = next(p.per_gpu for p in pts if p.gpus == bend.gpus)
        ax.plot(bend.gpus, y, "v", color=col, ms=7)
        ax.annotate(
            bend.term, (bend.gpus, y), textcoords="offset points", xytext=(5, -8 - 7 * row), fontsize=6, color=col
        )


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="Llama 2 7B on dgx-h100-80gb at 64-256 GPUs only")
    parser.add_argument("--plot", metavar="PATH", help="write the picture (PNG or SVG; needs matplotlib)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    workloads, clusters, counts = QUICK if args.quick else (WORKLOADS, CLUSTERS, COUNTS)
    curves = run_grid(workloads, clusters, counts)
    print_curves(curves, workloads, counts)
    print_bends(curves)
    published = published_points(workloads, clusters)
    print_published(published)
    if args.plot:
        plot(args.plot, curves, published, workloads, clusters)
        print(f"\nwrote {args.plot}")
    solves = sum(len(points) for by_family in curves.values() for points in by_family.values())
    print(f"\nwall time {time.perf_counter() - start:.0f} s ({solves} points)")


if __name__ == "__main__":
    main()
