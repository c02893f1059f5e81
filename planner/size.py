"""`plan size`: which GPU count, of which cluster, for a token budget. Each (cluster, GPU count)
point is solved exactly (planner/api.py:solve: the same search as `plan solve`), its step time
turned into days and GPU-hours for the tokens asked for, and the points are ranked on the
Pareto front of time to train against GPU-hours (against cost where every cluster is priced).

Definitions (each stated in docs/size.md):
- steps = ceil(tokens / (global batch x sequence)); days = steps x step time / 86,400;
  GPU-hours = GPUs x steps x step time / 3,600; cost = GPU-hours x the cluster's price.
- A point is on the front when no other feasible point is at most as long and at most as dear
  (GPU-hours, or cost where priced), one of them strictly.
- Scaling: along one cluster's GPU counts, a point's efficiency is the speed-up over the
  previous feasible count divided by the GPU ratio (1 = perfect); below `min_scaling` the
  point is where adding GPUs stops paying.
- A GPU count that is not a whole number of the cluster's nodes is rounded to the nearest
  whole number of nodes (half a node rounds up), and the point shows the GPUs it priced.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from planner.errors import InfeasibleError, PlannerError, UsageError
from planner.inputs import MAX_GPUS, JobRequest, make_job
from planner.specs import ClusterSpec, ModelSpec, SizeDocument, SizePoint

MAX_POINTS = 400  # clusters x GPU counts: each is an exact solve (about a second)
_SUFFIX = {"": 1, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12, "P": 1e15}


def parse_tokens(text: str) -> float:
    """'15T', '300B', '2.5e12', '1500000000' -> tokens; UsageError otherwise."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?(?:[eE][0-9]+)?)\s*([KMBGTPkmbgtp]?)\s*", text or "")
    value = float(m[1]) * _SUFFIX[m[2].upper()] if m else 0.0
    if not m or not 1e6 <= value <= 1e17:
        raise UsageError(f"--tokens {text!r}: give the tokens to train on, e.g. 15T, 300B or 2.5e12 (from 1M to 100P)")
    return value


def parse_gpu_counts(text: str) -> list[int]:
    """'256..8192' (doubling from the first to the last), '256,1024,4096', or one count."""
    t = (text or "").strip()
    try:
        if ".." in t:
            lo, hi = (int(x) for x in t.split("..", 1))
            if 1 <= hi < lo <= MAX_GPUS and re.fullmatch(r"[0-9]+\.\.[0-9]+", t):
                raise UsageError(
                    f"--gpus {text!r}: the range runs backwards; give FIRST..LAST with FIRST <= LAST, e.g. {hi}..{lo}"
                )
            if not 1 <= lo <= hi:
                raise ValueError
            counts = []
            n = lo
            while n <= hi:
                counts.append(n)
                n *= 2
        else:
            counts = sorted({int(x) for x in t.split(",")})
    except ValueError:
        counts = []
    if not counts or min(counts) < 1 or max(counts) > MAX_GPUS or not re.fullmatch(r"[0-9., ]+", t):
        raise UsageError(
            f"--gpus {text!r}: give GPU counts as FIRST..LAST (doubling), e.g. 256..8192, or a list 256,1024,4096 "
            f"(1 to {MAX_GPUS:,})"
        )
    return counts


def parse_prices(items: Sequence[str], clusters: Sequence[str]) -> dict[str, float]:
    """--price CLUSTER=USD_PER_GPU_HOUR, each for a cluster of --clusters."""
    prices: dict[str, float] = {}
    for item in items:
        name, _, value = item.partition("=")
        try:
            price = float(value)
        except ValueError:
            price = -1.0
        if not name or not math.isfinite(price) or not 0 < price <= 1000:
            raise UsageError(
                f"--price {item!r}: give CLUSTER=PRICE, a price per GPU-hour above 0 and at most 1,000, e.g. dgx-h100-80gb=2.5"
            )
        if name not in clusters:
            raise UsageError(f"--price {item!r}: {name} is not one of --clusters ({', '.join(clusters)})")
        if name in prices:
            raise UsageError(f"--price {item!r}: {name} already has a price ({prices[name]:g}); give each cluster one")
        prices[name] = price
    return prices


def whole_nodes(gpus: int, per_node: int) -> int:
    """`gpus` rounded to the nearest whole number of nodes (half rounds up); a count below one
    node stays as it is (one partial node)."""
    if gpus <= per_node or gpus % per_node == 0:
        return gpus
    return max(1, math.floor(gpus / per_node + 0.5)) * per_node


def reason_of(exc: PlannerError) -> str:
    """One word for why a point has no plan."""
    text = str(exc).lower()
    if "memory" in text or "gib" in text or "does not fit" in text:
        return "memory"
    if "batch" in text or "divid" in text or "multiple" in text:
        return "batch"
    if "time limit" in text:
        return "time"
    return "layout"


@dataclass(frozen=True)
class SizeRequest:
    """What `plan size` is asked: the model and its run (tokens, sequences per step and their
    length), the stack (None: every stack), and the user's prices ($ per GPU-hour by cluster
    name) and limits."""

    model: ModelSpec
    tokens: float
    global_batch: int
    seq_len: int
    target: Optional[str] = None
    prices: dict[str, float] = field(default_factory=dict)
    deadline_days: Optional[float] = None
    budget: Optional[float] = None
    min_scaling: float = 0.7
    time_limit: Optional[float] = None


def sweep(
    request: SizeRequest,
    clusters: Sequence[tuple[str, ClusterSpec]],
    counts: Sequence[int],
    progress: Callable[[str], None] = lambda _: None,
) -> SizeDocument:
    """Solve every (cluster, GPU count) point and mark the front (the module docstring)."""
    r = request
    if len(clusters) * len(counts) > MAX_POINTS:
        raise UsageError(
            f"{len(clusters)} clusters x {len(counts)} GPU counts = {len(clusters) * len(counts)} solves; "
            f"give at most {MAX_POINTS} (fewer --clusters or --gpus)"
        )
    # what is wrong at every count (a sequence past the model's, a dtype the device lacks) is one error now
    for _, cluster in clusters:
        make_job(r.model, JobRequest(r.global_batch, r.seq_len, target=r.target or "generic"), cluster)
    steps = math.ceil(r.tokens / (r.global_batch * r.seq_len))
    started = time.monotonic()
    points: list[dict] = []
    for name, cluster in clusters:
        seen = set()
        for asked in counts:
            gpus = whole_nodes(asked, cluster.gpus_per_node)
            if gpus in seen:
                continue
            seen.add(gpus)
            progress(f"{name}: {gpus:,} GPUs")
            points.append(_point(r, name, cluster, gpus, asked, steps))
    priced = bool(r.prices) and all(n in r.prices for n, _ in clusters)
    _mark(points, r.min_scaling, r.deadline_days, r.budget, priced)
    return SizeDocument(
        model=r.model,
        tokens=r.tokens,
        global_batch_size=r.global_batch,
        seq_len=r.seq_len,
        steps=steps,
        target=r.target,
        prices=r.prices,
        deadline_days=r.deadline_days,
        budget=r.budget,
        min_scaling=r.min_scaling,
        front_axis="cost" if priced else "gpu_hours",
        points=[SizePoint(**p) for p in points],
        wall_time_s=time.monotonic() - started,
    )


def _point(r: SizeRequest, name: str, cluster: ClusterSpec, gpus: int, asked: int, steps: int) -> dict:
    """One point of the sweep: the best plan on `gpus` GPUs of `cluster` and what the run takes
    with it, or why there is none."""
    from planner import api  # planner.api imports the search: loaded when a sweep runs, not with `plan`

    base = dict(
        cluster=name, device=cluster.device.name, gpus=gpus, gpus_asked=asked, price_per_gpu_hour=r.prices.get(name)
    )
    try:
        doc = api.solve(
            r.model,
            cluster,
            gpus=gpus,
            global_batch=r.global_batch,
            seq_len=r.seq_len,
            target=r.target,
            top_k=0,
            time_limit=r.time_limit,
        )
    except (InfeasibleError, UsageError) as exc:  # no layout fits, or this count cannot hold the batch
        return {**base, "feasible": False, "reason": reason_of(exc), "detail": str(exc)}
    est = doc.estimate
    # every preset states its uncertainty, so its interval; a cluster without one (a measured
    # profile) stops here, as it did before this assert
    assert est.step_time_interval_s is not None
    step, (lo, hi) = est.step_time_s, est.step_time_interval_s
    gpu_hours = gpus * steps * step / 3600
    return dict(
        **base,
        feasible=True,
        target=doc.job.target.value,
        plan=doc.plan,
        step_time_s=step,
        step_time_interval_s=(lo, hi),
        mfu=est.mfu,
        peak_memory_gib=est.peak_memory_gib,
        days=steps * step / 86400,
        days_interval=(steps * lo / 86400, steps * hi / 86400),
        gpu_hours=gpu_hours,
        cost=gpu_hours * r.prices[name] if name in r.prices else None,
        optimal=doc.search.optimal,
    )


def _mark(
    points: list[dict], min_scaling: float, deadline_days: Optional[float], budget: Optional[float], priced: bool
) -> None:
    """Front, scaling efficiency and the deadline / budget verdicts, on the points' fields."""
    ok = [p for p in points if p["feasible"]]
    axis = "cost" if priced else "gpu_hours"
    for p in ok:
        p["on_front"] = not any(
            q is not p
            and q["days"] <= p["days"]
            and q[axis] <= p[axis]
            and (q["days"] < p["days"] or q[axis] < p[axis])
            for q in ok
        )
        p["within_deadline"] = None if deadline_days is None else p["days"] <= deadline_days
        p["within_budget"] = None if budget is None or p["cost"] is None else p["cost"] <= budget
    by_cluster: dict[str, list[dict]] = {}
    for p in ok:
        by_cluster.setdefault(p["cluster"], []).append(p)
    for ps in by_cluster.values():
        ps.sort(key=lambda p: p["gpus"])
        for prev, p in zip(ps, ps[1:]):
            p["scaling_efficiency"] = (prev["step_time_s"] / p["step_time_s"]) / (p["gpus"] / prev["gpus"])
            p["stops_paying"] = p["scaling_efficiency"] < min_scaling
