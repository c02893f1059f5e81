"""Step 2 of the search: lower bounds on a candidate's best step time and memory, read from
the same expressions (cost_models/terms.py) that the estimate evaluates and the ILP optimises.

- :func:`cheap_bound`: O(1) per candidate, ignoring activation memory.
- :func:`refined_bound`: charges the recomputation that memory forces on each pipeline rank
  (continuous relaxation, whole layers per rank).
- :func:`min_peak_memory`: the least peak memory of any split (every layer in its most frugal
  recompute mode, ranks balanced by water-filling).

All are proven lower bounds, so pruning on them is safe; tests/unit/cost_models/test_terms_consistency.py
checks them against the estimate on random splits.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Optional

from cost_models.memory import GIB
from cost_models.tables import PipelineCosts
from cost_models.terms import MODES, DataParallel, Exposure, Hidden, Linear, RankMemory, RankTerms, dp_exposure

from .deadline import NO_DEADLINE, Deadline

BUCKET_TOL = 1e-9  # at a bucket's edge take the cheaper side: a bound must never be too high


def _one_mode(n: float, mode: int) -> tuple:
    counts = [0.0, 0.0, 0.0]
    counts[mode] = n
    return tuple(counts)


def _floor_term(term, counts, window: bool = True) -> float:
    """A term's value, or (window=False) what it exposes however long the compute beside it;
    at a gradient bucket's edge, the cheaper side."""
    if not isinstance(term, Hidden):
        return term(counts)
    full = term.bucket_bytes is None or term.bucket_bytes(counts) >= term.bucket * (1 - BUCKET_TOL)
    return term(counts, full) if window else term.never_hidden(counts, full)


def exposure_floor_at_least(exposure: Exposure, n_micro_batch: float, n_step: float) -> tuple[float, float]:
    """Least exposure per micro-batch / per step of a rank holding at least `n_micro_batch` /
    `n_step` layers (and possibly more parameters): every term without its window is
    nondecreasing in the layer count."""
    return (
        sum(_floor_term(t, (n_micro_batch, 0, 0), window=False) for t in exposure.per_micro_batch),
        sum(_floor_term(t, (n_step, 0, 0), window=False) for t in exposure.per_step),
    )


def _breakpoints(term, mode: int) -> list[float]:
    """Layer counts (all in `mode`) where a term's linear pieces cross or its bucket fills."""
    if not isinstance(term, Hidden):
        return []
    pts = []

    def cross(p: Linear, q: Linear):
        ds = p.slope[mode] - q.slope[mode]
        if ds:
            pts.append((q.const - p.const) / ds)

    cross(term.edge_piece(True), term.window_piece())
    cross(term.edge_piece(False), term.window_piece())
    if term.bucket_bytes is not None and term.bucket_bytes.slope[mode]:
        pts.append((term.bucket - term.bucket_bytes.const) / term.bucket_bytes.slope[mode])
    return pts


def rank_exposure_floor(rk: RankTerms, lo: float, hi: float, mode: int) -> tuple[float, float]:
    """Least exposed DP communication (per micro-batch, per step) of rank `rk` holding between
    `lo` and `hi` layers, whatever the split. The exposure is piecewise linear in the layer
    count, so its minimum sits at an end or at a breakpoint of one of its terms. All layers
    are put in `mode`, the allowed recompute mode with the longest backward: a longer window
    can only hide more, so the result is a lower bound."""
    ex = rk.exposure
    if hi < lo or not (ex.per_micro_batch or ex.per_step):
        return 0.0, 0.0
    pts = {lo, hi}
    for term in (*ex.per_micro_batch, *ex.per_step) if hi > lo else ():
        pts.update(_breakpoints(term, mode))
    vals = [
        (sum(_floor_term(t, c) for t in ex.per_micro_batch), sum(_floor_term(t, c) for t in ex.per_step))
        for c in (_one_mode(n, mode) for n in pts if lo <= n <= hi)
    ]
    return min(v[0] for v in vals), min(v[1] for v in vals)


def _mean_step_floor(pc: PipelineCosts) -> tuple[float, float]:
    """(per micro-batch, per step) exposure floors valid for every rank / the fullest rank:
    a rank holds at least one layer, and the rank with the most parameters at least the
    mean; costed as a bare rank (no embedding or head) with no window to hide behind."""
    t = pc.terms
    if pc.dp <= 1 or not t.layer_params:
        return 0.0, 0.0
    return _bare_rank_floors(t.data_parallel, t.layer_params, t.total_params / (pc.pp * t.layer_params))


@lru_cache(maxsize=1 << 16)
def _bare_rank_floors(dp: DataParallel, layer_params: float, n_step: float) -> tuple[float, float]:
    none = Linear.per_layer(0.0, 0.0)
    return exposure_floor_at_least(dp_exposure(dp, Linear.per_layer(0.0, layer_params), none, none), 1, n_step)


def _mean_optimizer_time(t) -> float:
    """The optimizer update of the fullest rank takes at least that of the mean parameters."""
    return t.optimizer_time(Linear.per_layer(t.total_params / t.pp, 0.0)).const


def cheap_bound(pc: PipelineCosts, memory_limit_gib: float) -> Optional[float]:
    """Seconds per step no split can beat, ignoring activation memory; None if even the
    model states cannot fit (the fullest rank holds at least the mean parameter count)."""
    t = pc.terms
    L, m, v, pp = pc.num_layers, pc.num_micro_batches, pc.vpp, pc.pp
    mean_params = t.total_params / pp
    if t.states_bytes(mean_params) > memory_limit_gib * GIB:
        return None
    a = t.stage_time_slope()[0]
    per_mb, step = _mean_step_floor(pc)  # exposed ZeRO-2/3 traffic per micro-batch and rank, at least
    first, last, constants = t.stage_constants()
    W = L * a + constants + pp * per_mb  # sum of stage times
    end_stage = a + max(first, last) + per_mb / v  # an end stage holds >= 1 layer
    t_pipe = W / v + (m - 1 / v) * max(W / pp, end_stage)  # the slowest rank works at least W / pp
    if pc.uneven_chunks:
        t_pipe = max(t_pipe, _padded_pipe(pc, a, W, per_mb / v))
    return t_pipe + step + _mean_optimizer_time(t)


def _padded_pipe(pc: PipelineCosts, a: float, total: float, per_stage: float) -> float:
    """Chunks of unequal length are priced as (m v + p - 1) times the slowest chunk
    (cost_models/pipeline.py), which takes at least the mean of the stage times `total` and at
    least what a chunk of L // P + 1 layers takes: a seconds per layer, the least stage
    constant, `per_stage` exposed traffic."""
    t, P, L = pc.terms, pc.num_stages, pc.num_layers
    first, last, constants = t.stage_constants()
    middle = (constants - first - last) / (P - 2) if P > 2 else min(first, last)
    longest = a * (L // P + 1) + min(first, last, middle) + per_stage
    return (pc.num_micro_batches * pc.vpp + pc.pp - 1) * max(total / P, longest)


@dataclass(frozen=True)
class _Rank:
    K: float  # fixed time per micro-batch (edges, p2p, least exposed ZeRO-2/3 traffic)
    c: float  # memory needed beyond the layers, minus the limit (bytes); must end <= 0
    q: float  # memory per layer with nothing recomputed
    smax: float  # most memory one layer's recompute can save
    rho: float  # cheapest seconds of recompute per byte saved
    nmin: int  # fewest layers the rank can hold
    nhi: float  # most layers the rank can hold


def _relaxed_rank(
    memory: RankMemory, fixed_time: float, nspan: tuple[int, int], t, limit: float, allowed: list[int]
) -> _Rank:
    """One rank of the relaxation (its memory, time besides its layers and layer range), its
    exposure not yet charged."""
    mem, slope = memory.linear, t.stage_time_slope()
    c = mem.const + max(memory.temporary) - limit
    q = mem.slope[0]
    options = [(slope[i] - slope[0], q - mem.slope[i]) for i in allowed if i and q - mem.slope[i] > 0]
    smax = max((saved for _, saved in options), default=0.0)
    rho = min((cost / saved for cost, saved in options), default=float("inf"))
    nmin, nhi = nspan
    per_layer = q - smax  # > 0: recompute keeps each layer's input and weights
    cap = _whole(-c / per_layer) if per_layer > 0 else (float("inf") if c <= 0 else -1.0)
    return _Rank(fixed_time, c, q, smax, rho, nmin, min(nhi, cap))


def _whole(n: float) -> float:
    """Whole layers within n (a hair of slack for rounding: a bound must never be too high)."""
    return math.floor(n + 1e-9)


def refined_bound(
    pc: PipelineCosts, memory_limit_gib: float, modes: tuple = MODES, deadline: Deadline = NO_DEADLINE
) -> Optional[float]:
    """Seconds per step no split can beat, charging the recomputation that memory forces.

    Continuous relaxation per pipeline rank r: with n layers, memory is c_r + q_r n bytes
    before recompute; recompute saves at most smax_r per layer and costs at least rho_r per
    byte saved, so the rank's micro-batch time is at least
        S_r(n) = K_r + a n + rho_r max(0, c_r + q_r n),  feasible while c_r + (q_r - smax_r) n <= 0,
    with K_r including the least exposed ZeRO-2/3 traffic over the rank's possible layer
    counts. Any split has some rank at least as slow as the smallest tau at which the
    ranks can hold L whole layers (a merge of the ranks' S_r(k)), and T >= sum_r S_r / v + (m - 1/v) tau
    (cost_models/pipeline.py). Returns None when no split fits (memory). OutOfTime
    (planner/search/deadline.py) past `deadline`: the merge takes O(L log p).
    """
    t = pc.terms
    L, v, m = pc.num_layers, pc.vpp, pc.num_micro_batches
    a = t.stage_time_slope()[0]
    allowed = [MODES.index(md) for md in modes]
    mode = max(allowed, key=lambda i: t.layer_recompute[i])
    limit = memory_limit_gib * GIB
    # The first rank holds the most activations in flight and the embedding: where memory rules a
    # layout out, it nearly always does, and its memory alone costs a fraction of every rank's terms.
    if _relaxed_rank(t.rank_memory(0), 0.0, t.layer_range(0), t, limit, allowed).nhi < t.layer_range(0)[0]:
        return None
    terms = t.ranks()
    ranks = [_relaxed_rank(rk.memory, rk.time.const, t.layer_range(rk.rank), t, limit, allowed) for rk in terms]
    if any(rk.nhi < rk.nmin for rk in ranks) or sum(rk.nhi for rk in ranks) < L:
        return None  # memory alone rules the layout out: no exposure to charge
    step_floor, floors = 0.0, {}
    for i, (rk, relaxed) in enumerate(zip(terms, ranks)):
        # Ranks with equal constants (the middle ones) have the same exposure terms: cost them once.
        key = (rk.time.const, rk.forward.const, rk.params.const, relaxed.nmin, relaxed.nhi)
        if key not in floors:
            floors[key] = rank_exposure_floor(rk, relaxed.nmin, relaxed.nhi, mode)
        per_mb, step = floors[key]
        ranks[i] = replace(relaxed, K=relaxed.K + per_mb)
        step_floor = max(step_floor, step)
    tau = _slowest_rank_time(ranks, a, L, deadline)
    total = L * a + sum(rk.K for rk in ranks)
    t_pipe = total / v + (m - 1 / v) * tau
    if pc.uneven_chunks:
        t_pipe = max(t_pipe, _padded_pipe(pc, a, total, 0.0))
    return t_pipe + max(step_floor, _mean_step_floor(pc)[1]) + _mean_optimizer_time(t)


def _slowest_rank_time(ranks: list[_Rank], a: float, L: int, deadline: Deadline = NO_DEADLINE) -> float:
    """Smallest tau at which the ranks can hold all L layers, each a whole number of them
    within time tau per micro-batch: with few layers per rank, one layer more on the slowest
    rank is what an integer split costs, and the relaxation charges it. Rank r holds k layers
    from tau = S_r(k) on, so tau is the largest of the ranks' times at their fewest layers
    and the (L - sum of those fewest)-th smallest S_r(k) over the further layers: a merge of
    the ranks' increasing S_r(k), O(L log p), or for many layers over few ranks the same value
    by bisection on tau, O(p log^2 L)."""

    def time_at(rk: _Rank, n: float) -> float:
        need = rk.c + rk.q * n
        return rk.K + a * n + (rk.rho * need if need > 0 else 0.0)

    lo = max(time_at(rk, rk.nmin) for rk in ranks)
    more = L - sum(rk.nmin for rk in ranks)
    if more <= 0:
        return lo
    tau = None
    if len(ranks) * BISECTIONS * more.bit_length() < more and a >= 0 and all(rk.q >= 0 and rk.rho >= 0 for rk in ranks):
        tau = _kth_time_bisected(ranks, time_at, more, deadline)
    if tau is None:
        tau = _kth_time_merged(ranks, time_at, more, deadline)
    return max(lo, tau)


BISECTIONS = 80  # about what bisection on a float needs to reach adjacent floats (53 bits and a few binades)


def _kth_time_merged(ranks: list[_Rank], time_at, more: int, deadline: Deadline) -> float:
    """The `more`-th smallest S_r(k), k > nmin_r, by merging the ranks' sequences on a heap."""
    heap = [(time_at(rk, rk.nmin + 1), i, rk.nmin + 1) for i, rk in enumerate(ranks) if rk.nmin + 1 <= rk.nhi]
    heapq.heapify(heap)
    tau = -math.inf
    for step in range(more):  # the caller checked that the ranks can hold L layers
        if step % 4096 == 4095:
            deadline.check()
        tau, i, k = heapq.heappop(heap)
        if k + 1 <= ranks[i].nhi:
            heapq.heappush(heap, (time_at(ranks[i], k + 1), i, k + 1))
    return tau


def _kth_time_bisected(ranks: list[_Rank], time_at, more: int, deadline: Deadline) -> Optional[float]:
    """The same value as _kth_time_merged: the smallest float tau at which the ranks hold `more`
    further layers, found by bisection between adjacent floats (S_r(k) is nondecreasing in k,
    in floating point too, as every coefficient is >= 0), each count a binary search per rank.
    None where bisection does not apply (an infinite time)."""
    tops = [min(rk.nhi, rk.nmin + more) for rk in ranks]  # whole numbers (layer_range, _whole), or inf capped

    def held(tau: float) -> int:
        total = 0
        for rk, top in zip(ranks, tops):
            k, hi = rk.nmin, int(top)  # the most layers within tau: S_r is nondecreasing
            while k < hi:
                mid = (k + hi + 1) // 2
                k, hi = (mid, hi) if time_at(rk, mid) <= tau else (k, mid - 1)
            total += k - rk.nmin
        return total

    ends = [(time_at(rk, rk.nmin + 1), time_at(rk, int(top))) for rk, top in zip(ranks, tops) if top >= rk.nmin + 1]
    low, high = math.nextafter(min(e[0] for e in ends), -math.inf), max(e[1] for e in ends)
    if not math.isfinite(high) or held(high) < more:
        return None
    for _ in range(4 * BISECTIONS):
        mid = low + (high - low) / 2
        if not low < mid < high:
            return high  # adjacent floats: high is the smallest with `more` layers held
        deadline.check()
        low, high = (low, mid) if held(mid) >= more else (mid, high)
    return None


def min_peak_memory(pc: PipelineCosts, modes: tuple = MODES) -> float:
    """Bytes: a lower bound on the peak memory of any split of this layout, every layer in
    its most frugal recompute mode of `modes` and the layers spread to equalise rank memory
    (continuous water-filling)."""
    t, L, v = pc.terms, pc.num_layers, pc.vpp
    fixed, slope = [], []
    allowed = [i for i, m in enumerate(MODES) if m in modes]
    for rk in t.ranks():
        mem = rk.memory.linear
        fixed.append(mem.const + max(rk.memory.temporary))
        slope.append(min(mem.slope[i] for i in allowed))
    lo = max(c + q * v for c, q in zip(fixed, slope))
    if min(slope) <= 0 or sum(max(v, (lo - c) / q) for c, q in zip(fixed, slope)) >= L:
        return lo  # a rank whose memory does not grow with its layers: no water-filling (the loop below would not end)
    hi = 2 * abs(lo) + 1.0  # grows by doubling even from lo <= 0
    while sum((hi - c) / q for c, q in zip(fixed, slope)) < L:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        if sum(max(v, (mid - c) / q) for c, q in zip(fixed, slope)) >= L:
            hi = mid
        else:
            lo = mid
    return hi


# The integer rank times: a memory-tight rank recomputes whole layers, so the cheapest time of
# a rank holding n layers is a small integer program of its own (two counts, one memory row),
# solved by enumerating the fully recomputed count from the least that can fit and stopping
# once full recompute alone costs more than the best found.
MEMORY_SLACK_GIB = 1e-6  # a MILP's memory row holds to its feasibility tolerance: count such a split as fitting
# Most (rank, layer count) pairs costed per candidate (~10 us each): every rank of any model up
# to ~280 layers on any pipeline depth (128 layers on 64 ranks: 4,160); past it, no floor.
FLOOR_WORK = 20_000


def least_recompute(memory: RankMemory, limit: float, allowed: list[int], n: int, cost: tuple) -> float:
    """Least sum_i cost[i] x_i (cost >= 0 per layer in mode i) over whole (selective x_1, full
    x_2) counts with which a rank holding `n` layers fits `limit` bytes: its memory row, the
    transient buffer at least the largest stage's, or the smallest stage's plus the
    full-recompute buffer where a layer is fully recomputed. inf when none fits."""
    temps, mem = memory.temporary, memory.linear
    base = mem.const + mem.slope[0] * n + max(temps) - limit - MEMORY_SLACK_GIB * GIB
    if base <= 0:
        return 0.0
    with_full = max(0.0, min(temps) + memory.full_recompute_buffer - max(temps))
    s1, s2 = (mem.slope[0] - mem.slope[i] for i in (1, 2))
    selective = 1 in allowed and s1 > 0

    def at(x2: int) -> float:  # the least selective count with x2 fully recomputed
        need = base - s2 * x2 + (with_full if x2 else 0.0)
        x1 = 0 if need <= 0 else math.ceil(need / s1 - 1e-12) if selective else n + 1
        return cost[1] * x1 + cost[2] * x2 if x1 + x2 <= n else math.inf

    best = at(0)
    if 2 not in allowed or s2 <= 0:
        return best
    # Fewer full layers than this cannot fit even with every other layer selective (x1 <= n - x2).
    over = base + with_full - (s1 * n if selective else 0.0)
    x2 = max(1, math.floor(over / (s2 - s1 if selective else s2)) - 1) if s2 > (s1 if selective else 0.0) else 1
    while x2 <= n and cost[2] * x2 < best:
        best = min(best, at(x2))
        x2 += 1
    return best


def rank_time_floors(pc: PipelineCosts, memory_limit_gib: float, modes: tuple = MODES) -> Optional[list]:
    """Per pipeline rank, (n0, [floor at n0, n0 + 1, ...]): the least time per micro-batch of the
    rank holding n whole layers, from the fewest any split gives it up to the most, or as many
    as fit: its time with the cheapest whole layers recomputed that fit its memory
    (:func:`least_recompute`), plus the least exposure per micro-batch at n layers. None where
    a slope is negative (then more layers might need less memory), no split fits, or there are
    more than FLOOR_WORK (rank, layer count) pairs."""
    t, L = pc.terms, pc.num_layers
    allowed = [MODES.index(md) for md in modes]
    ranks = t.ranks()
    slope = t.stage_time_slope()
    extra = tuple(slope[i] - slope[0] for i in range(3))
    if (
        any(s < 0 for s in slope)
        or any(e < 0 for e in extra)
        or any(s <= 0 for rk in ranks for s in rk.memory.linear.slope)
    ):
        return None
    spans = [t.layer_range(rk.rank) for rk in ranks]
    low, high = sum(lo for lo, _ in spans), sum(hi for _, hi in spans)
    if high < L or low > L:
        return None
    # What the other ranks hold leaves each rank between these counts.
    spans = [(max(lo, L - (high - hi)), min(hi, L - (low - lo))) for lo, hi in spans]
    if sum(hi - lo + 1 for lo, hi in spans) > FLOOR_WORK:
        return None
    mode = max(allowed, key=lambda i: t.layer_recompute[i])
    limit = memory_limit_gib * GIB
    floors = []
    for rk, (lo, hi) in zip(ranks, spans):
        seq = []
        for n in range(lo, hi + 1):
            recompute = least_recompute(rk.memory, limit, allowed, n, extra)
            if recompute == math.inf:  # more layers need more memory: none fits either
                break
            seq.append(rk.time((n, 0, 0)) + recompute + rank_exposure_floor(rk, n, n, mode)[0])
        if not seq:
            return None
        floors.append((lo, seq))
    return floors


def integer_slowest_rank_time(pc: PipelineCosts, floors: Optional[list]) -> Optional[float]:
    """A lower bound on the slowest pipeline rank's time per micro-batch (the sum of its
    stages' times, what M >= (m - 1/v) W_r maximises in planner/search/ilp.py) in any split
    that fits, from the ranks' :func:`rank_time_floors`: the least tau at which the ranks can
    hold all L layers, each rank's time for n layers being its floor at n or more (the
    exposure at n can fall as n grows, so a suffix minimum: the nondecreasing sequence the
    merge needs). The MILP's relaxation lets a rank recompute fractions of a layer, so this
    row, added to it, closes the gap that branching on each rank's counts otherwise has to.
    None where `floors` is (nothing fits, or a negative slope)."""
    if floors is None:
        return None
    more = pc.num_layers - sum(lo for lo, _ in floors)
    times = []
    for _, seq in floors:
        seq = list(seq)
        for k in range(len(seq) - 2, -1, -1):  # the exposure is not monotone in n: a suffix minimum is
            seq[k] = min(seq[k], seq[k + 1])
        times.append(seq)
    tau = max(seq[0] for seq in times)
    further = sorted(v for seq in times for v in seq[1:])
    if len(further) < more:
        return None
    return max(tau, further[more - 1]) if more else tau


def convex_minorant(first: int, values: list) -> list[tuple[int, float, float]]:
    """The lower convex hull of the points (first + k, values[k]) as lines (n0, value at n0,
    slope): every line lies on or below every point, so value >= line(n) holds at each n."""
    hull: list[tuple[int, float]] = []
    for k, v in enumerate(values):
        n = first + k
        while len(hull) >= 2 and (hull[-1][1] - hull[-2][1]) * (n - hull[-2][0]) >= (v - hull[-2][1]) * (
            hull[-1][0] - hull[-2][0]
        ):
            hull.pop()
        hull.append((n, v))
    if len(hull) == 1:
        return [(hull[0][0], hull[0][1], 0.0)]
    return [(n0, v0, (v1 - v0) / (n1 - n0)) for (n0, v0), (n1, v1) in zip(hull, hull[1:])]
