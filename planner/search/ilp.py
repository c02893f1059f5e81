"""Step 3 of the search: the integer program over layer splits and per-stage recompute.

For a batch of candidate layouts the ILP picks one (binary y_k, sum y_k = 1) and, for it,
how many layers each virtual stage j runs with no / selective / full recomputation
(integers x_kj0, x_kj1, x_kj2: Megatron-style partial recompute falls out), minimising the
step time of cost_models.estimate.evaluate exactly:
    T = sum_j S_j + (m - 1) M,  M >= S_j                      (GPipe / 1F1B)
    T = m MR + (p - 1) MS,  MR >= sum_{j on r} S_j, MS >= S_j   (interleaved)
plus the exposed DP communication D >= E_r and optimizer time O >= o params_r, each a
convex piecewise-linear term written as max() constraints (a binary per rank only where
a gradient bucket may or may not fill). Memory of every rank, with its schedule's
in-flight micro-batches, is a linear constraint. Every coefficient comes from the
candidate's PipelineCosts, the same tables `plan estimate` evaluates.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass

import pulp

from cost_models.estimate import GRADIENT_BUCKET_BYTES, PipelineCosts
from cost_models.memory import GIB
from planner.specs import Collective

from .candidates import Candidate


# Relative optimality gap the MILP solver must close: far below any difference the cost
# model can resolve, so "optimal" means optimal to 1e-7 of the step time.
MIP_GAP = 1e-7


@dataclass(frozen=True)
class Solution:
    candidate: Candidate
    counts: tuple  # per virtual stage (none, selective, full) layer counts
    objective: float  # the ILP's value for this candidate: seconds per step


@contextmanager
def quiet_stdout():
    """Solvers print banners at the C level (HiGHS: once per process), which
    redirect_stdout cannot catch: point file descriptor 1 at /dev/null for the duration, so
    that `--json` output stays clean. Statuses come back through the API."""
    sys.stdout.flush()
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        os.close(devnull)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def make_solver(name: str, time_limit: float | None):
    if name == "highs":
        return pulp.HiGHS(msg=False, gapRel=MIP_GAP, gapAbs=0.0, timeLimit=time_limit, threads=1)
    return pulp.PULP_CBC_CMD(msg=False, gapRel=MIP_GAP, gapAbs=0.0, timeLimit=time_limit, threads=1)


def default_solver() -> str:
    try:
        import highspy  # noqa: F401

        return "highs"
    except ImportError:  # pragma: no cover - depends on the install
        return "cbc"


def _block(prob, k: int, pc: PipelineCosts, y, weight: float, memory_limit_gib: float, modes: tuple, ts: float):
    """Variables and constraints of one candidate; returns (objective term, decode info).

    Times enter multiplied by `ts` (time units chosen so that the step is O(100)): the
    solver's absolute feasibility tolerances then stay far below what the model resolves.
    """
    lc, L, pp, v, m = pc.layer, pc.num_layers, pc.pp, pc.vpp, pc.num_micro_batches
    P = pc.num_stages
    a0, a1, a2 = lc.activation_bytes
    r_sel, r_full = lc.recompute[1] * ts, lc.recompute[2] * ts
    fb = (lc.forward + lc.backward + lc.tp_forward + lc.tp_backward) * ts
    fwd_layer = (lc.forward + lc.tp_forward) * ts
    extras = [pc.stage_extras(j) for j in range(P)]
    var = lambda name, low=None, up=None, cat="Continuous": prob.add_variable(name, low, up, cat=cat)  # noqa: E731
    x = [[var(f"x{k}_{j}_{i}", 0, L if i in modes else 0, cat="Integer") for i in range(3)] for j in range(P)]
    n = [pulp.lpSum(xj) for xj in x]
    prob += pulp.lpSum(n) == L * y, f"layers{k}"
    for j in range(P):
        if v > 1:  # interleaved: equal model chunks (Megatron-LM), see candidates.py
            prob += n[j] == (L // P) * y, f"chunk{k}_{j}"
        else:
            prob += n[j] >= y, f"nonempty{k}_{j}"
    # A stage with a fully recomputed layer rebuilds one layer's activations in backward.
    w = [var(f"w{k}_{j}", cat="Binary") for j in range(P)]
    for j in range(P):
        prob += x[j][2] <= (L - P + 1) * w[j], f"fullflag{k}_{j}"
        prob += w[j] <= y, f"fullsel{k}_{j}"

    rank_stages = [list(range(r, P, pp)) for r in range(pp)]
    # Symmetry: a rank's middle model chunks (neither first nor last stage) cost the same
    # whichever of them holds which layers, so order them by (layers, full, selective),
    # lexicographically, as one weighted key. Any solution can be permuted into this order.
    base = L + 1
    for rs in rank_stages:
        middle = [j for j in rs if 0 < j < P - 1]
        for j, j2 in zip(middle, middle[1:]):
            key = lambda i: base * base * n[i] + base * x[i][2] + x[i][1]  # noqa: E731
            prob += key(j) >= key(j2), f"order{k}_{j}"
    params = [pulp.lpSum(lc.params * n[j] + extras[j].params * y for j in rs) for rs in rank_stages]

    # Exposed DP communication (evaluate's dp_exposed), linear pieces per rank.
    alpha = {c: tuple(ts * q for q in pc.dp_link.coefficients(c)) if pc.dp > 1 else (0.0, 0.0) for c in Collective}
    eta = pc.overlap  # fraction of DP communication that hides behind compute
    e = pc.comm_bytes_per_param

    def coll(c: Collective, nbytes_expr):
        al, be = alpha[c]
        return al * y + be * nbytes_expr

    stage_time = []  # S_j without the ZeRO-3 term
    for j in range(P):
        xj, ex = x[j], extras[j]
        stage_time.append(fb * n[j] + r_sel * xj[1] + r_full * xj[2] + (ex.compute + ex.p2p) * ts * y)
    fwd = [pulp.lpSum(fwd_layer * n[j] + extras[j].forward * ts * y for j in rs) for rs in rank_stages]
    tot = [pulp.lpSum(stage_time[j] for j in rs) for rs in rank_stages]
    per_mb = [0] * pp  # exposed DP traffic per micro-batch of each rank (ZeRO-2/3)
    D = var(f"D{k}", 0)
    if pc.dp > 1:
        for r, rs in enumerate(rank_stages):
            G = e * params[r]
            bwd = tot[r] - fwd[r]
            if pc.zero_stage == 3:
                uf, ub = var(f"uf{k}_{r}", 0), var(f"ub{k}_{r}", 0)
                first = pc.zero3_first_gather * ts
                ag_rs = coll(Collective.all_gather, G) + coll(Collective.reduce_scatter, G)
                prob += uf >= (1 - eta) * coll(Collective.all_gather, G) + eta * first * y, f"z3f1{k}_{r}"
                prob += uf >= coll(Collective.all_gather, G) - eta * fwd[r], f"z3f2{k}_{r}"
                prob += ub >= (1 - eta) * ag_rs + eta * first * y, f"z3b1{k}_{r}"
                prob += ub >= ag_rs - eta * bwd, f"z3b2{k}_{r}"
                per_mb[r] = uf + ub
                continue
            red = Collective.all_reduce if pc.zero_stage == 0 else Collective.reduce_scatter
            # overlapped(): max((1 - eta) time(G) + eta min(time(G), time(bucket)), time(G) - eta backward);
            # the last bucket never hides.
            extra_params = sum(extras[j].params for j in rs)
            lo_layers = len(rs) if v == 1 else len(rs) * (L // P)
            hi_layers = L - (P - len(rs)) if v == 1 else lo_layers
            g_lo, g_hi = e * (lc.params * lo_layers + extra_params), e * (lc.params * hi_layers + extra_params)
            U = var(f"U{k}_{r}", 0)
            prob += U >= coll(red, G) - eta * bwd, f"dpwin{k}_{r}"
            t_bucket = alpha[red][0] + alpha[red][1] * GRADIENT_BUCKET_BYTES
            if g_lo >= GRADIENT_BUCKET_BYTES:
                prob += U >= (1 - eta) * coll(red, G) + eta * t_bucket * y, f"dpbucket{k}_{r}"
            elif g_hi <= GRADIENT_BUCKET_BYTES:
                prob += U >= coll(red, G), f"dpall{k}_{r}"
            else:  # the rank's gradients may or may not fill a bucket: one binary
                z = var(f"zb{k}_{r}", cat="Binary")
                big = alpha[red][0] + alpha[red][1] * g_hi
                prob += G >= GRADIENT_BUCKET_BYTES * z, f"dpfull{k}_{r}"
                prob += z <= y, f"dpzsel{k}_{r}"
                prob += U >= (1 - eta) * coll(red, G) + eta * t_bucket * z, f"dpbucketz{k}_{r}"
                prob += U >= coll(red, G) - big * z, f"dpallz{k}_{r}"
            ag = coll(Collective.all_gather, G) if pc.zero_stage in (1, 2) else 0
            if pc.zero_stage == 2:
                per_mb[r] = U  # reduce-scatter after every micro-batch
                prob += D >= ag, f"dpmax{k}_{r}"
            else:
                prob += D >= U + ag, f"dpmax{k}_{r}"

    S = [stage_time[j] + (per_mb[j % pp] * (1.0 / v) if pc.zero_stage in (2, 3) and pc.dp > 1 else 0) for j in range(P)]
    if v == 1:
        M = var(f"M{k}", 0)
        for j in range(P):
            prob += M >= S[j], f"slowest{k}_{j}"
        t_pipe = pulp.lpSum(S) + (m - 1) * M
    else:
        MR, MS = var(f"MR{k}", 0), var(f"MS{k}", 0)
        for r in range(pp):
            prob += MR >= pulp.lpSum(S[j] for j in rank_stages[r]), f"slowrank{k}_{r}"
        for j in range(P):
            prob += MS >= S[j], f"slowstage{k}_{j}"
        t_pipe = m * MR + (pp - 1) * MS

    O = var(f"O{k}", 0)
    for r in range(pp):
        prob += O >= pc.optimizer_seconds_per_param * ts * params[r], f"opt{k}_{r}"

    # Memory of every rank, in GiB: model states + in-flight activations + transient buffers.
    limit = memory_limit_gib * GIB
    for r, rs in enumerate(rank_stages):
        T = var(f"T{k}_{r}", 0)
        for j in rs:
            prob += T >= extras[j].temporary_bytes / GIB * y + a0 / GIB * w[j], f"temp{k}_{j}"
        acts = pulp.lpSum(a0 * x[j][0] + a1 * x[j][1] + a2 * x[j][2] + extras[j].activation_bytes * y for j in rs)
        prob += (
            pc.memory_per_param / GIB * params[r] + pc.in_flight[r] / GIB * acts + T
            + (pc.overhead_bytes + pc.zero3_gather_bytes) / GIB * y <= limit / GIB * y
        ), f"memory{k}_{r}"
    return weight * (t_pipe + D + O), x


def solve_batch(
    batch: list[tuple[Candidate, PipelineCosts, float]],
    memory_limit_gib: float,
    solver: str,
    time_limit: float | None = None,
    modes: tuple = (0, 1, 2),
) -> tuple[Solution | None, str]:
    """Pick the best candidate of `batch` (each with its objective weight, 1/tokens scaled)
    and its best layer split. Returns (solution or None if none fits, solver status)."""
    prob = pulp.LpProblem("layout", pulp.LpMinimize)
    ys = [prob.add_variable(f"y{k}", cat="Binary") for k in range(len(batch))]
    prob += pulp.lpSum(ys) == 1, "choose_one"
    terms, blocks = [], []
    first = batch[0][1]
    rough = (first.layer.forward + first.layer.backward) * first.num_layers * first.num_micro_batches
    ts = 100.0 / max(rough, 1e-12)
    for k, ((cand, pc, weight), y) in enumerate(zip(batch, ys)):
        term, x = _block(prob, k, pc, y, weight, memory_limit_gib, modes, ts)
        terms.append(term)
        blocks.append(x)
    prob += pulp.lpSum(terms)
    with quiet_stdout():
        prob.solve(make_solver(solver, time_limit))
    status = pulp.LpStatus[prob.status]
    if status != "Optimal" or prob.sol_status not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        return None, status
    k = max(range(len(batch)), key=lambda i: ys[i].value() or 0)
    counts = tuple(tuple(int(round(xv.value() or 0)) for xv in xj) for xj in blocks[k])
    cand, pc, weight = batch[k]
    value = pulp.value(terms[k]) / (weight * ts)
    return Solution(cand, counts, value), status
