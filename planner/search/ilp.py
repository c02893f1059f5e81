"""Step 3 of the search: the integer program over layer splits and per-stage recompute.

For one candidate layout the ILP picks how many layers each virtual stage j runs with no /
selective / full recomputation (integers x_j0, x_j1, x_j2: Megatron-style partial
recompute falls out), minimising the step time of cost_models/estimate.py:evaluate exactly:
    T = sum_j S_j + M,  M >= (m - 1) S_j                          (GPipe / 1F1B)
    T = MR + MS,  MR >= m sum_{j on r} S_j,  MS >= (p - 1) S_j      (interleaved)
plus the exposed DP communication D >= E_r and optimizer time O >= o params_r. Every row
is built from the expressions of cost_models/terms.py: a Linear becomes an lpSum (its
constant times y, a variable fixed to 1), a Hidden term a variable U >= each of its
pieces (a binary per rank only where a gradient bucket may or may not fill), and memory of
every rank a linear constraint with its largest transient buffer as T >= each stage's.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pulp

from cost_models.memory import GIB
from cost_models.tables import PipelineCosts
from cost_models.terms import MODES, Hidden, LayoutTerms, Linear, RankTerms

from .bounds import convex_minorant, integer_slowest_rank_time, rank_time_floors
from planner.specs import Layout
from .deadline import NO_DEADLINE, Deadline, solver_running, stop_requested


# How long CBC may overrun the deadline before it is killed: it reads its own time limit
# between branch-and-bound nodes, usually well within this.
CBC_GRACE_S = 0.25

# Relative optimality gap the MILP solver must close: far below any difference the cost
# model can resolve, so "optimal" means optimal to 1e-7 of the step time.
MIP_GAP = 1e-7

# The slowest rank's floor enters a hair below its value: rounding in its sums must not cut off
# a split the rows admit.
FLOOR_SLACK = 1e-9


@dataclass(frozen=True)
class Solution:
    candidate: Layout
    counts: tuple  # per virtual stage (none, selective, full) layer counts
    objective: float  # the ILP's value for this candidate: seconds per step
    proven: bool  # False when the solver stopped (time limit) before proving it optimal


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


def make_solver(
    name: str,
    time_limit: float | None,
    exact: bool = False,
    deadline: Deadline = NO_DEADLINE,
    cutoff: float | None = None,
):
    """`exact`: an integer objective, solved to within half a unit. HiGHS runs in this process
    and stops when `deadline` passes or a stop signal comes (:class:`_StoppableHiGHS`); CBC is a
    subprocess with its own wall-clock limit, killed on a stop signal (:func:`run_solver`)."""
    gaps = dict(gapRel=0.0, gapAbs=0.5) if exact else dict(gapRel=MIP_GAP, gapAbs=0.0)
    if name == "highs":
        bound = {} if cutoff is None else dict(objective_bound=cutoff)
        return _StoppableHiGHS(deadline, msg=False, timeLimit=time_limit, threads=1, **gaps, **bound)
    return pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit, threads=1, **gaps)


class _StoppableHiGHS(pulp.HiGHS):
    """PuLP's in-process HiGHS with an interrupt callback: HiGHS asks it about a thousand times a
    second during presolve, simplex and branch-and-bound (HiGHS's callback API, kCallback*Interrupt:
    setting data_in.user_interrupt stops the run with model status kInterrupt, which PuLP reads
    as a time limit: the best point so far, not proven). It stops the run when the deadline
    has passed or a stop signal was recorded (deadline.py:solver_running)."""

    def __init__(self, deadline: Deadline, **kwargs):
        super().__init__(**kwargs)
        self.deadline = deadline

    def callSolver(self, lp):
        import highspy

        deadline = self.deadline

        def interrupt(_kind, _message, _data_out, data_in, _user_data):
            if data_in is not None and (stop_requested() or deadline.expired()):
                data_in.user_interrupt = True

        lp.solverModel.setCallback(interrupt, None)
        kinds = highspy.cb.HighsCallbackType
        for kind in ("kCallbackSimplexInterrupt", "kCallbackIpmInterrupt", "kCallbackMipInterrupt"):
            lp.solverModel.startCallback(getattr(kinds, kind))
        lp.solverModel.run()


def run_solver(prob, solver, deadline: Deadline = NO_DEADLINE) -> None:
    """prob.solve(solver), stoppable: a stop signal during the call ends it (deadline.py:
    solver_running raises Interrupted as it returns). CBC runs as a subprocess: killed on a stop
    signal, or a moment after the deadline if it overruns its own limit (it checks it between
    nodes; the problem is then left unsolved), its temporary files (the MPS model, the solution)
    in a directory of their own that goes with it."""
    cbc = isinstance(solver, pulp.PULP_CBC_CMD)
    left = deadline.left()
    watchdog = threading.Timer(left + CBC_GRACE_S, _kill_children) if cbc and left is not None else None
    with (
        tempfile.TemporaryDirectory(prefix="plan-milp-") as scratch,
        quiet_stdout(),
        solver_running(_kill_children if cbc else None),
    ):
        if cbc:
            solver.tmpDir = scratch
        if watchdog is not None:
            watchdog.daemon = True
            watchdog.start()
        started = time.monotonic()
        try:
            prob.solve(solver)
        except pulp.PulpSolverError:
            # CBC writes no solution when killed by the watchdog, and none when its own time
            # limit stops it before it has one (seen at 1.0 s of a 1.4 s limit): both leave the
            # problem unsolved, as a time limit does. A CBC that cannot run fails at once.
            if not (cbc and (deadline.expired() or (left is not None and time.monotonic() - started >= 0.5 * left))):
                raise
        finally:
            if watchdog is not None:
                watchdog.cancel()


def _kill_children() -> None:
    """Kill this process's child processes (during a CBC solve: CBC). Linux's /proc lists them;
    elsewhere CBC ends at its own time limit (and Ctrl-C from a terminal reaches it directly)."""
    for task in Path("/proc/self/task").glob("*/children"):
        try:
            pids = task.read_text().split()
        except OSError:
            continue
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass


def default_solver() -> str:
    try:
        import highspy  # noqa: F401

        return "highs"
    except ImportError:  # pragma: no cover - depends on the install
        return "cbc"


class _Block:
    """The variables of one candidate, and builders of its rows.

    Times enter multiplied by `ts` (time units chosen so that the step is O(100)): the
    solver's absolute feasibility tolerances then stay far below what the model resolves."""

    w: list  # per stage: whether any layer is fully recomputed (binary; _layer_split)
    slowest_floor: float | None  # bounds.py:integer_slowest_rank_time (add_candidate)

    def __init__(self, prob, pc: PipelineCosts, y, ts: float, modes: tuple, rules=None):
        self.prob, self.pc, self.terms, self.y, self.ts, self.rules = prob, pc, pc.terms, y, ts, rules
        L, P = pc.num_layers, pc.num_stages
        allowed = [MODES[i] in modes for i in range(3)]
        self.x = [[self.var(f"x_{j}_{i}", 0, L if allowed[i] else 0, "Integer") for i in range(3)] for j in range(P)]
        self.n = [pulp.lpSum(xj) for xj in self.x]

    def var(self, name: str, low=None, up=None, cat: str = "Continuous"):
        return self.prob.add_variable(name, low, up, cat=cat)

    def add(self, row, name: str) -> None:
        self.prob += row, name

    def rank_counts(self, r: int) -> list:
        """The rank's layers per recompute mode (sums of its stages' variables)."""
        return [pulp.lpSum(self.x[j][i] for j in self.terms.rank_stages(r)) for i in range(3)]

    def lin(self, e: Linear, counts, scale: float = 1.0):
        """A Linear as an lpSum (its constant times y)."""
        return pulp.lpSum(scale * s * c for s, c in zip(e.slope, counts) if s) + scale * e.const * self.y


def _layer_split(b: _Block) -> None:
    """All layers placed, each stage non-empty (interleaved: model chunks of L // P layers or one
    more, the ILP choosing which take the extra ones); w_j = 1
    where stage j has a fully recomputed layer."""
    t, L, P = b.terms, b.pc.num_layers, b.pc.num_stages
    b.add(pulp.lpSum(b.n) == L * b.y, "layers")
    for j in range(P):
        if b.pc.vpp > 1:  # model chunks as even as L allows: L // P or one more (terms.layer_range)
            if L % P:
                b.add(b.n[j] >= (L // P) * b.y, f"chunklo_{j}_")
                b.add(b.n[j] <= (L // P + 1) * b.y, f"chunkhi_{j}_")
            else:
                b.add(b.n[j] == (L // P) * b.y, f"chunk_{j}_")
        else:
            b.add(b.n[j] >= b.y, f"nonempty_{j}_")
    if b.pc.first_stage_min_layers > 1:  # the first stage holds the model's dense layers
        b.add(b.n[0] >= b.pc.first_stage_min_layers * b.y, "densefirst")
    b.w = [b.var(f"w_{j}", cat="Binary") for j in range(P)]
    for j in range(P):
        b.add(b.x[j][2] <= (L - P + 1) * b.w[j], f"fullflag_{j}_")
        b.add(b.w[j] <= b.y, f"fullsel_{j}_")
    # Symmetry: a rank's middle model chunks (neither first nor last stage) cost the same
    # whichever of them holds which layers, so order them by (layers, full, selective),
    # lexicographically, as one weighted key. Any solution can be permuted into this order.
    # Not for chunks of unequal length (priced by the slowest chunk: cost_models/pipeline.py).
    base = L + 1
    for r in range(b.pc.pp if not b.pc.uneven_chunks else 0):
        middle = [j for j in t.rank_stages(r) if 0 < j < P - 1]
        for j, j2 in zip(middle, middle[1:]):
            key = lambda i: base * base * b.n[i] + base * b.x[i][2] + b.x[i][1]  # noqa: E731
            b.add(key(j) >= key(j2), f"order_{j}_")


def _stack_rules(b: _Block) -> None:
    """What the target stack can express of the split and recompute (planner/stacks/stack.py:
    Rules.counts_problems states the same rules): "even" every stage L / P layers;
    "first_last" equal middle stages; "uniform" one recompute mode for every layer (a binary
    u_i per mode); "same_per_stage" every layer selective (binary s) or min(N, n_j) fully
    recomputed layers in every stage j for one integer N (binary b_j: 1 where N <= n_j), the
    rest not recomputed."""
    rules, L, P, x, y = b.rules, b.pc.num_layers, b.pc.num_stages, b.x, b.y
    if rules is None:
        return
    if rules.split == "even" and b.pc.vpp == 1:
        for j in range(P):
            b.add(b.n[j] == (L / P) * y, f"even_{j}_")
    elif rules.split == "first_last" and b.pc.vpp == 1:
        for j in range(2, P - 1):
            b.add(b.n[j] == b.n[1], f"middle_{j}_")
    if rules.recompute == "uniform":
        u = [b.var(f"u_{i}", cat="Binary") for i in range(3)]
        b.add(pulp.lpSum(u) == y, "onemode")
        for i in range(3):
            b.add(pulp.lpSum(x[j][i] for j in range(P)) == L * u[i], f"onemode_{i}_")
    elif rules.recompute == "same_per_stage":
        s = b.var("s_sel", cat="Binary")
        b.add(s <= y, "sel_y")
        b.add(pulp.lpSum(x[j][1] for j in range(P)) == L * s, "sel_all")
        N = b.var("N_full", 0, L, "Integer")
        for j in range(P):
            b.add(x[j][2] <= L * (y - s), f"sel_nofull_{j}_")
            bj = b.var(f"b_full_{j}", cat="Binary")
            b.add(x[j][2] <= N, f"fullN_{j}_")  # full_j = min(N, n_j)
            b.add(x[j][2] <= b.n[j], f"fulln_{j}_")
            b.add(x[j][2] >= N - L * (1 - bj), f"fullNlo_{j}_")
            b.add(x[j][2] >= b.n[j] - L * bj, f"fullnlo_{j}_")


def _hidden(b: _Block, name: str, h: Hidden, counts, layer_range: tuple[int, int]):
    """U >= each piece of a Hidden term; where the rank's gradients may or may not fill a
    bucket, a binary z picks the piece set (z = 1: full)."""
    ts, U = b.ts, b.var(name, 0)
    b.add(U >= b.lin(h.window_piece(), counts, ts), f"{name}w_")
    # (the gradient bytes at the range's ends; unread without a bucket, which takes the first branch)
    no_bytes = (float("inf"), float("inf"))
    lo, hi = (h.bucket_bytes((n, 0, 0)) for n in layer_range) if h.bucket_bytes is not None else no_bytes
    if h.bucket_bytes is None or lo >= h.bucket:
        b.add(U >= b.lin(h.edge_piece(True), counts, ts), f"{name}e_")
    elif hi <= h.bucket:
        b.add(U >= b.lin(h.edge_piece(False), counts, ts), f"{name}c_")
    else:
        z = b.var(f"{name}z", cat="Binary")
        big = ts * h.comm((layer_range[1], 0, 0))
        b.add(b.lin(h.bucket_bytes, counts) >= h.bucket * z, f"{name}zfull_")
        b.add(z <= b.y, f"{name}zsel_")
        b.add(U >= (1 - h.efficiency) * b.lin(h.comm, counts, ts) + h.efficiency * h.edge * ts * z, f"{name}ze_")
        b.add(U >= b.lin(h.edge_piece(False), counts, ts) - big * z, f"{name}zc_")
    return U


def _exposure(b: _Block, rk: RankTerms, counts) -> tuple:
    """(per micro-batch, per step) exposed DP communication of one rank, as expressions."""
    r, rng = rk.rank, b.terms.layer_range(rk.rank)

    def row(term, name):
        return _hidden(b, name, term, counts, rng) if isinstance(term, Hidden) else b.lin(term, counts, b.ts)

    per_mb = [row(t, f"Um_{r}_{i}") for i, t in enumerate(rk.exposure.per_micro_batch)]
    per_step = [row(t, f"Us_{r}_{i}") for i, t in enumerate(rk.exposure.per_step)]
    return pulp.lpSum(per_mb), pulp.lpSum(per_step)


def _pipeline(b: _Block, S: list, F: list):
    """Pipeline time from the stage times S_j (cost_models/pipeline.py), as max() rows. The
    maximum enters already multiplied by its micro-batch count (M >= (m - 1/v) W_r rather
    than (m - 1/v) M with M >= W_r): a row satisfied only to the solver's feasibility
    tolerance then moves the objective by that tolerance, not by m times it."""
    t, pp, m, v = b.terms, b.pc.pp, b.pc.num_micro_batches, b.pc.vpp
    if b.pc.gpipe:  # every forward, then every backward: a slowest stage per direction
        MF, MB = b.var("MF", 0), b.var("MB", 0)
        for j, (s, f) in enumerate(zip(S, F)):
            b.add(MF >= (m - 1) * f, f"slowfwd_{j}_")
            b.add(MB >= (m - 1) * (s - f), f"slowbwd_{j}_")
        return pulp.lpSum(S) + MF + MB
    M = b.var("M", 0)
    if b.pc.uneven_chunks:  # chunks of unequal length: each as slow as the slowest (pipeline.pipeline_time)
        for j, s in enumerate(S):
            b.add(M >= (m * v + pp - 1) * s, f"padded_{j}_")
        return M
    for r in range(pp):
        b.add(M >= (m - 1 / v) * pulp.lpSum(S[j] for j in t.rank_stages(r)), f"slowest_{r}_")
    if b.slowest_floor is not None:  # whole layers recomputed: bounds.py:integer_slowest_rank_time
        b.add(M >= (m - 1 / v) * b.ts * b.slowest_floor * (1 - FLOOR_SLACK) * b.y, "slowest_floor")
    return pulp.lpSum(S) * (1 / v) + M


def _rank_floor_rows(b: _Block, S: list, floors: list) -> None:
    """Each rank's time per micro-batch (the sum of its stages' S_j) at least its integer floor
    at its layer count n_r (bounds.py:rank_time_floors: whole layers recomputed), as the lines
    of the floor's lower convex hull, valid at every whole n_r. The relaxation recomputes
    fractions of a layer on every rank; these rows charge whole ones in the sum of the stage
    times too, not only on the slowest rank."""
    t, ts = b.terms, b.ts
    for r, (first, seq) in enumerate(floors):
        stages = t.rank_stages(r)
        work, n = pulp.lpSum(S[j] for j in stages), pulp.lpSum(b.n[j] for j in stages)
        for k, (n0, v0, slope) in enumerate(convex_minorant(first, seq)):
            line = (v0 - slope * n0) * b.y + slope * n
            b.add(work >= ts * (1 - FLOOR_SLACK) * line, f"rankfloor_{r}_{k}_")


def _memory(b: _Block, rk: RankTerms, counts, limit_gib: float) -> None:
    """Model states + in-flight activations + fixed buffers + the largest transient buffer
    (a stage with a fully recomputed layer rebuilds one layer's activations: binary w_j)."""
    mem = rk.memory
    T = b.var(f"T_{rk.rank}", 0)
    for j, temp in zip(b.terms.rank_stages(rk.rank), mem.temporary):
        b.add(T >= temp / GIB * b.y + mem.full_recompute_buffer / GIB * b.w[j], f"temp_{j}_")
    b.add(b.lin(mem.linear, counts, 1 / GIB) + T <= limit_gib * b.y, f"memory_{rk.rank}_")


def add_candidate(
    prob,
    pc: PipelineCosts,
    y,
    memory_limit_gib: float,
    modes: tuple,
    ts: float,
    rules=None,
    rank_rows: bool = False,
    symmetry: bool = False,
):
    """Variables and rows of one candidate (`rules`: what the target stack can express of
    the split and recompute, or None; `rank_rows`: each rank's floor rows, not only the
    slowest rank's; `symmetry`: order interchangeable ranks, :func:`_order_identical_ranks`);
    returns (objective term, layer variables)."""
    b = _Block(prob, pc, y, ts, modes, rules)
    floors = rank_time_floors(pc, memory_limit_gib, modes)
    b.slowest_floor = integer_slowest_rank_time(pc, floors)
    _layer_split(b)
    _stack_rules(b)
    t: LayoutTerms = b.terms
    ranks = t.ranks()
    counts = [b.rank_counts(rk.rank) for rk in ranks]
    D = b.var("D", 0)
    S, F = [None] * pc.num_stages, [None] * pc.num_stages
    for rk, c in zip(ranks, counts):
        per_mb, per_step = _exposure(b, rk, c)
        b.add(D >= per_step, f"dpmax_{rk.rank}_")
        for j, st in zip(t.rank_stages(rk.rank), rk.stages):
            S[j] = b.lin(st.total, b.x[j], ts) + per_mb * (1.0 / pc.vpp)
            if pc.gpipe:
                F[j] = b.lin(st.forward_pass, b.x[j], ts)
    if rank_rows and floors is not None:
        _rank_floor_rows(b, S, floors)
    t_pipe = _pipeline(b, S, F)
    opt = b.var("O", 0)
    for rk, c in zip(ranks, counts):
        b.add(opt >= b.lin(rk.optimizer, c, ts), f"opt_{rk.rank}_")
    for rk, c in zip(ranks, counts):
        _memory(b, rk, c, memory_limit_gib)
    if symmetry:
        _order_identical_ranks(b, ranks)
    return t_pipe + D + opt, b.x


def _order_identical_ranks(b: _Block, ranks) -> None:
    """Symmetry breaking: neighbouring pipeline ranks whose every cost and memory expression is
    the same (the middle ranks of a 1F1B or GPipe pipeline that all hold the same in-flight
    micro-batches, e.g. m <= pp - r) are interchangeable: any split permuted among them has the
    same step time and fits the same, and with one stage a rank the pipeline time (the sum of
    the stages and the slowest) does not depend on their order. So some optimum has their layer
    counts non-increasing, and the rows n_r >= n_{r+1} keep only those, instead of letting
    branch-and-bound prove every permutation (population #120 of benchmarks/solve_population.py:
    two MILPs of 21 s and 16 s). Interleaved schedules (a rank's stages spread through the
    pipeline) are left as they are. The search's MILP only: the tie-break (canonical_counts)
    still chooses among all splits."""
    if b.pc.vpp != 1:
        return

    def signature(rk) -> tuple:
        return (rk.time, rk.forward, rk.params, rk.exposure, rk.optimizer, rk.memory, rk.stages)

    sig = [signature(rk) for rk in ranks]
    for r in range(len(ranks) - 1):
        if sig[r] == sig[r + 1]:
            b.add(b.n[r] >= b.n[r + 1], f"order_{r}_")


def candidate_problem(
    name: str,
    pc: PipelineCosts,
    memory_limit_gib: float,
    modes: tuple,
    ts: float,
    rules=None,
    rank_rows: bool = False,
    symmetry: bool = False,
):
    """A MILP holding one candidate's variables and rows, times in units of 1/ts seconds:
    (problem, step-time expression, layer variables x[j][mode])."""
    prob = pulp.LpProblem(name, pulp.LpMinimize)
    y = prob.add_variable("y", 1, 1)
    term, x = add_candidate(prob, pc, y, memory_limit_gib, modes, ts, rules, rank_rows, symmetry)
    return prob, term, x


def _counts(x) -> tuple:
    """Layer counts per stage and recompute mode, as solved."""
    return tuple(tuple(int(round(xv.value() or 0)) for xv in xj) for xj in x)


@dataclass(frozen=True)
class Attempt:
    """One run of a candidate's MILP: the split found (or None), the solver's status, and the
    least step time (seconds) the run proved for any split of the candidate (its dual bound; 0
    where the solver says nothing)."""

    solution: Solution | None
    status: str
    lower_bound_s: float = 0.0


def attempt_candidate(
    cand: Layout,
    pc: PipelineCosts,
    memory_limit_gib: float,
    solver: str,
    time_limit: float | None = None,
    modes: tuple = MODES,
    rules=None,
    cutoff_s: float | None = None,
    deadline: Deadline = NO_DEADLINE,
) -> Attempt:
    """The best layer split of one candidate (:class:`Attempt`: the split, or None if none fits
    or none was found in time; the solver's status; the bound a stopped run proved).
    `time_limit` (seconds) and `deadline`: whichever comes first stops the solver. `cutoff_s`:
    only a split faster than this step time is of use (the search already holds enough faster
    plans); the solver stops as soon as it proves none is, and the status is then "Cutoff".
    HiGHS takes it as its objective bound (nodes whose bound passes it are pruned); CBC as a
    row (term <= cutoff): a row parallel to the objective slowed HiGHS up to 80x on near-ties
    (docs/benchmarks.md)."""
    # Time unit: about 1/100 of the step (the compute per pipeline rank).
    rough = (pc.layer.forward + pc.layer.backward) * pc.num_layers * pc.num_micro_batches / pc.pp
    ts = 100.0 / max(rough, 1e-12)
    rank_rows = rank_rows_help(pc) and pc.num_micro_batches - 1 / pc.vpp >= pc.pp
    prob, term, x = candidate_problem("layout", pc, memory_limit_gib, modes, ts, rules, rank_rows, symmetry=True)
    prob += term
    cutoff = None if cutoff_s is None else cutoff_s * ts * (1 + 1e-9)
    if cutoff is not None and solver != "highs":
        prob += term <= cutoff, "cutoff"
    stop = deadline.sooner(time_limit)
    run_solver(prob, make_solver(solver, stop.left(), deadline=stop, cutoff=cutoff), stop)
    status = pulp.LpStatus[prob.status]
    if cutoff_s is not None and status == "Infeasible":
        return Attempt(None, "Cutoff")
    # PuLP reports a MILP stopped by the time limit as "Optimal" with an integer-feasible
    # (or no) solution: only LpSolutionOptimal is proven.
    proven = prob.sol_status == pulp.LpSolutionOptimal
    if status != "Optimal" or not (proven or _has_solution(prob)):
        return Attempt(None, status if status != "Optimal" else "Not Solved", _dual_bound(prob) / ts)
    if cutoff is not None and proven and pulp.value(term) > cutoff:
        return Attempt(None, "Cutoff")  # HiGHS may return a split its bound did not prune
    return Attempt(Solution(cand, _counts(x), pulp.value(term) / ts, proven), status, _dual_bound(prob) / ts)


def _dual_bound(prob) -> float:
    """The least objective a stopped HiGHS run proved for the MILP (0 when it proved nothing, or
    for CBC, whose PuLP interface does not say)."""
    model = getattr(prob, "solverModel", None)
    if model is None or not hasattr(model, "getInfo"):
        return 0.0
    bound = model.getInfo().mip_dual_bound
    return bound if math.isfinite(bound) and bound > 0 else 0.0


def rank_rows_help(pc: PipelineCosts) -> bool:
    """Whether each rank's floor rows (:func:`_rank_floor_rows`) are worth adding, as measured
    (docs/benchmarks.md): they close the tie-break MILP's gap and, where the slowest rank
    weighs at least the sum of the ranks (m - 1/v >= pp), the search MILP's; where a rank's
    exposed ZeRO-2/3 traffic per micro-batch (a binary per rank) enters its time they slowed
    branch-and-bound 5-50x in both."""
    return not any(rk.exposure.per_micro_batch for rk in pc.terms.ranks())


def _has_solution(prob) -> bool:
    """Whether a MILP stopped early holds a feasible point (HiGHS says; CBC's PuLP status does)."""
    model = getattr(prob, "solverModel", None)
    if model is not None and hasattr(model, "getInfo"):
        return model.getInfo().primal_solution_status == 2  # kSolutionStatusFeasible
    return prob.sol_status == pulp.LpSolutionIntegerFeasible


def canonical_counts(
    pc: PipelineCosts,
    counts,
    step_time: float,
    memory_limit_gib: float,
    solver: str,
    modes: tuple = MODES,
    rules=None,
    deadline: Deadline = NO_DEADLINE,
):
    """The canonical representative of `counts` among the splits of this layout that are as
    fast and fit: many splits tie (a stage off an interleaved schedule's critical path may
    recompute or not), and which of them a MILP solver returns depends on its path, so the
    answer is fixed here by a second, small MILP: keep the step time, and minimise
    sum_j (Q k_i + j^2) x_ji over recomputed layers (k = 1 selective, 2 full, Q > every j^2
    term): the fewest recomputed layers, full ones counted double, placed in the earliest
    stages. Interleaved chunks of L // P layers or one more tie over where the longer chunks
    go as well: among the splits of that least recompute, a third MILP puts the layers in the
    earliest stages (least sum_j j n_j), so that the answer is one split, whatever the solver's
    path. Returns None when the solver cannot confirm one, or the deadline stops it first
    (the caller keeps `counts`)."""
    ts = 100.0 / step_time
    prob, term, x = candidate_problem("canonical", pc, memory_limit_gib, modes, ts, rules, rank_rows_help(pc))
    prob += term <= 100.0 * (1 + 1e-12), "same_step_time"
    P = pc.num_stages
    Q = P * P + 1
    recomputed = pulp.lpSum((Q * k + j * j) * x[j][k] for j in range(P) for k in (1, 2))
    prob += recomputed

    def solved() -> bool:
        run_solver(prob, make_solver(solver, deadline.left(), exact=True, deadline=deadline), deadline)
        return pulp.LpStatus[prob.status] == "Optimal" and prob.sol_status == pulp.LpSolutionOptimal

    if not solved():
        return None
    if pc.vpp > 1 and pc.num_layers % P:
        least = round(pulp.value(recomputed))  # a whole number: integer weights times integer counts
        prob += recomputed <= least + 0.5, "least_recompute"
        prob.setObjective(pulp.lpSum(j * x[j][k] for j in range(P) for k in range(3)))
        if not solved():
            return None
    return _counts(x)
