"""Step 2 of the search: lower bounds on a candidate's best step time and memory, read from
the same expressions (cost_models/terms.py) that the estimate evaluates and the ILP optimises.

- :func:`cheap_bound`: O(1) per candidate, ignoring activation memory.
- :func:`refined_bound`: charges the recomputation that memory forces on each pipeline rank
  (continuous relaxation, whole layers per rank).
- :func:`min_peak_memory`: the least peak memory of any split (every layer in its most frugal
  recompute mode, ranks balanced by water-filling).

All are proven lower bounds, so pruning on them is safe; tests/test_terms_consistency.py
checks them against the estimate on random splits.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

from cost_models.memory import GIB
from cost_models.tables import PipelineCosts
from cost_models.terms import GRADIENT_BUCKET_BYTES, MODES, DataParallel, Exposure, Hidden, Linear, RankTerms, dp_exposure

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
    full = term.bucket_bytes is None or term.bucket_bytes(counts) >= GRADIENT_BUCKET_BYTES * (1 - BUCKET_TOL)
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
    cross(term.comm, term.window_piece())
    if term.bucket_bytes is not None and term.bucket_bytes.slope[mode]:
        pts.append((GRADIENT_BUCKET_BYTES - term.bucket_bytes.const) / term.bucket_bytes.slope[mode])
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
    for term in (*ex.per_micro_batch, *ex.per_step):
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
    return t_pipe + step + _mean_optimizer_time(t)


@dataclass(frozen=True)
class _Rank:
    K: float  # fixed time per micro-batch (edges, p2p, least exposed ZeRO-2/3 traffic)
    c: float  # memory needed beyond the layers, minus the limit (bytes); must end <= 0
    q: float  # memory per layer with nothing recomputed
    smax: float  # most memory one layer's recompute can save
    rho: float  # cheapest seconds of recompute per byte saved
    nmin: int  # fewest layers the rank can hold
    nhi: float  # most layers the rank can hold


def _relaxed_rank(rk: RankTerms, t, limit: float, allowed: list[int], mode: int) -> tuple[_Rank, float]:
    """One rank of the relaxation, and its least per-step DP exposure."""
    mem, slope = rk.memory.linear, t.stage_time_slope()
    c = mem.const + max(rk.memory.temporary) - limit
    q = mem.slope[0]
    options = [(slope[i] - slope[0], q - mem.slope[i]) for i in allowed if i and q - mem.slope[i] > 0]
    smax = max((saved for _, saved in options), default=0.0)
    rho = min((cost / saved for cost, saved in options), default=float("inf"))
    nmin, nhi = t.layer_range(rk.rank)
    per_layer = q - smax  # > 0: recompute keeps each layer's input and weights
    cap = _whole(-c / per_layer) if per_layer > 0 else (float("inf") if c <= 0 else -1.0)
    per_mb, step = rank_exposure_floor(rk, nmin, min(nhi, cap), mode)
    return _Rank(rk.time.const + per_mb, c, q, smax, rho, nmin, min(nhi, cap)), step


def _whole(n: float) -> float:
    """Whole layers within n (a hair of slack for rounding: a bound must never be too high)."""
    return math.floor(n + 1e-9)


def refined_bound(pc: PipelineCosts, memory_limit_gib: float, modes: tuple = MODES,
                  deadline: Deadline = NO_DEADLINE) -> Optional[float]:
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
    ranks, step_floor = [], 0.0
    for rk in t.ranks():
        relaxed, step = _relaxed_rank(rk, t, memory_limit_gib * GIB, allowed, mode)
        ranks.append(relaxed)
        step_floor = max(step_floor, step)
    if any(rk.nhi < rk.nmin for rk in ranks) or sum(rk.nhi for rk in ranks) < L:
        return None
    tau = _slowest_rank_time(ranks, a, L, deadline)
    total = L * a + sum(rk.K for rk in ranks)
    t_pipe = total / v + (m - 1 / v) * tau
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


def min_peak_memory(pc: PipelineCosts) -> float:
    """Bytes: a lower bound on the peak memory of any split of this layout, every layer in
    its most frugal recompute mode and the layers spread to equalise rank memory
    (continuous water-filling)."""
    t, L, v = pc.terms, pc.num_layers, pc.vpp
    fixed, slope = [], []
    for rk in t.ranks():
        mem = rk.memory.linear
        fixed.append(mem.const + max(rk.memory.temporary))
        slope.append(min(mem.slope))
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
# solved by enumerating the fully recomputed count. Work per rank and layer count: O(n).
INTEGER_WORK = 200_000  # most (layer count x enumerated counts) steps before falling back
MEMORY_SLACK_GIB = 1e-6  # a MILP's memory row holds to its feasibility tolerance: count such a split as fitting


def rank_time_floor(rk: RankTerms, t, limit: float, allowed: list[int], per_mb: float, n: int) -> float:
    """Least time per micro-batch of rank `rk` holding exactly `n` layers with whole layers
    recomputed (inf when none fits `limit` bytes): its time with the cheapest integer
    (selective, full) counts that fit its memory row, the transient buffer at least the
    largest stage's, or the smallest stage's plus the full-recompute buffer where a layer is
    fully recomputed, plus `per_mb` (a floor on its exposed traffic per micro-batch)."""
    mem, slope = rk.memory, t.stage_time_slope()
    temps = mem.temporary
    base = mem.linear.const + mem.linear.slope[0] * n + max(temps) - limit - MEMORY_SLACK_GIB * GIB
    with_full = max(0.0, min(temps) + mem.full_recompute_buffer - max(temps))
    saved = [mem.linear.slope[0] - mem.linear.slope[i] for i in range(3)]
    extra = [slope[i] - slope[0] for i in range(3)]
    best = math.inf
    for x2 in range(n + 1) if 2 in allowed else (0,):
        need = base - saved[2] * x2 + (with_full if x2 else 0.0)
        if need <= 0:
            x1 = 0
        elif 1 in allowed and saved[1] > 0:
            x1 = math.ceil(need / saved[1] - 1e-12)
        else:
            continue
        if x1 + x2 > n:
            continue
        best = min(best, extra[1] * x1 + extra[2] * x2)
    return rk.time((n, 0, 0)) + best + per_mb


def integer_slowest_rank_time(pc: PipelineCosts, memory_limit_gib: float, modes: tuple = MODES) -> Optional[float]:
    """A lower bound on the slowest pipeline rank's time per micro-batch (the sum of its
    stages' times, what M >= (m - 1/v) W_r maximises in planner/search/ilp.py) in any split
    that fits: the least tau at which the ranks can hold all L layers, each rank's time for
    n whole layers being :func:`rank_time_floor` at most (the exposure at n can fall as n grows, so
    the least over n and more, a nondecreasing sequence the merge needs). The MILP's relaxation lets a
    rank recompute fractions of a layer, so this row, added to it, closes the gap that
    branching on each rank's counts otherwise has to. None where the enumeration would take
    more than INTEGER_WORK steps, a slope is negative (then more layers might need less memory), or
    nothing fits."""
    t, L = pc.terms, pc.num_layers
    allowed = [MODES.index(md) for md in modes]
    ranks = t.ranks()
    if any(s < 0 for s in t.stage_time_slope()) or any(s <= 0 for rk in ranks for s in rk.memory.linear.slope):
        return None
    spans = [t.layer_range(rk.rank) for rk in ranks]
    if sum(hi for _, hi in spans) < L or sum(lo for lo, _ in spans) > L:
        return None
    more = L - sum(lo for lo, _ in spans)
    top = max(lo for lo, _ in spans) + more
    if len(ranks) * (more + 1) * (top + 1) > INTEGER_WORK:
        return None
    mode = max(allowed, key=lambda i: t.layer_recompute[i])
    limit = memory_limit_gib * GIB
    times = []  # per rank: its floor at lo, lo + 1, ... while it fits
    for rk, (lo, hi) in zip(ranks, spans):
        seq = []
        for n in range(lo, min(hi, lo + more) + 1):
            per_mb = rank_exposure_floor(rk, n, n, mode)[0]  # at exactly n layers
            time = rank_time_floor(rk, t, limit, allowed, per_mb, n)
            if time == math.inf:  # more layers need more memory: none fits either
                break
            seq.append(time)
        if not seq:
            return None
        for k in range(len(seq) - 2, -1, -1):  # the exposure is not monotone in n: a suffix minimum is
            seq[k] = min(seq[k], seq[k + 1])
        times.append(seq)
    tau = max(seq[0] for seq in times)
    further = sorted(v for seq in times for v in seq[1:])
    if len(further) < more:
        return None
    return max(tau, further[more - 1]) if more else tau
