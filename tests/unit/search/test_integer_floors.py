"""The ranks' integer floors (planner/search/bounds.py, issue 22) that each candidate's MILP
carries as valid rows: the least recompute that fits equals exhaustive enumeration, the convex
minorant lies under every point, no split of a real layout beats its floors, and the MILP with
the rows finds the optimum the formulation without them finds (same step time to 1e-7)."""

from __future__ import annotations

import math
import random

import pulp
import pytest

from cost_models.estimate import evaluate, rank_counts
from cost_models.memory import GIB
from cost_models.terms import MODES
from hardware_profiles import load_cluster
from planner.presets import load_model
from planner.search import ilp
from planner.search.bounds import (
    MEMORY_SLACK_GIB,
    convex_minorant,
    integer_slowest_rank_time,
    least_recompute,
    rank_time_floors,
)
from planner.search.candidates import CostTables, SearchSpace, enumerate_candidates
from planner.specs import JobSpec, ModelSpec

SMALL = ModelSpec(name="small-8l", num_layers=8, hidden_size=1024, num_heads=8, vocab_size=32000, max_seq_len=2048)


def _layouts(model, cluster_name: str, gpus: int, batch: int, count: int, seed: int):
    cluster = load_cluster(cluster_name)
    job = JobSpec(global_batch_size=batch, seq_len=2048)
    cands, _ = enumerate_candidates(model, cluster, SearchSpace(num_gpus=gpus, global_batch_size=batch))
    tables = CostTables(model, cluster, job)
    rng = random.Random(seed)
    pipelined = [c for c in cands if c.pp > 1]
    return [tables.pipeline(c) for c in rng.sample(pipelined, min(count, len(pipelined)))]


def _brute_recompute(memory, limit: float, allowed, n: int, cost) -> float:
    """least_recompute's integer program by trying every (selective, full) pair."""
    temps, lin = memory.temporary, memory.linear
    best = math.inf
    for x2 in range(n + 1) if 2 in allowed else (0,):
        for x1 in range(n - x2 + 1) if 1 in allowed else (0,):
            buffer = max(max(temps), min(temps) + memory.full_recompute_buffer) if x2 else max(temps)
            if lin((n - x1 - x2, x1, x2)) + buffer - limit - MEMORY_SLACK_GIB * GIB <= 0:
                best = min(best, cost[1] * x1 + cost[2] * x2)
    return best


@pytest.mark.parametrize("allowed", [[0, 1, 2], [0, 2], [0, 1]])
def test_least_recompute_is_exhaustive_enumerations(allowed):
    rng = random.Random(f"least recompute {allowed}")
    checked = 0
    for pc in _layouts(load_model("gpt3-13b"), "dgx-a100-40gb", 64, 256, 12, 22):
        for rk in pc.terms.ranks():
            lin = rk.memory.linear
            for n in rng.sample(range(1, 25), 4):
                frugal, loose = lin((0, 0, n)), lin((n, 0, 0)) + max(rk.memory.temporary)
                limit = rng.uniform(frugal, loose * 1.05)
                cost = (0.0, rng.uniform(0.1, 2.0), rng.uniform(0.1, 2.0))
                got = least_recompute(rk.memory, limit, allowed, n, cost)
                want = _brute_recompute(rk.memory, limit, allowed, n, cost)
                assert got == want or math.isclose(got, want, rel_tol=1e-12), (n, limit, cost)
                checked += 1
    assert checked >= 100


def test_convex_minorant_lies_under_every_point_and_touches_the_hull():
    rng = random.Random("minorant")
    for _ in range(300):
        first = rng.randint(0, 5)
        values = [rng.uniform(0, 10) + rng.choice([0, 0.5]) * k for k in range(rng.randint(1, 30))]
        lines = convex_minorant(first, values)
        for k, v in enumerate(values):
            n = first + k
            assert all(v0 + s * (n - n0) <= v + 1e-9 for n0, v0, s in lines)
        # The first and last points are hull vertices: some line passes through each.
        for k in (0, len(values) - 1):
            n = first + k
            assert max(v0 + s * (n - n0) for n0, v0, s in lines) == pytest.approx(values[k], abs=1e-9)


def test_no_split_beats_its_ranks_floors():
    """Random splits of real layouts under a limit they fit: every rank's time per micro-batch is at
    least its floor at its layer count (and the hull's lines), the slowest at least the slowest's floor."""
    rng = random.Random("floors")
    checked = 0
    for pc in _layouts(load_model("llama2-7b"), "dgx-a100-40gb", 32, 128, 40, 7):
        P, L = pc.num_stages, pc.num_layers
        for _ in range(5):
            if pc.vpp > 1:  # interleaved chunks hold L // P layers or one more (cost_models/terms.py layer_range)
                longer = set(rng.sample(range(P), L % P))
                split = [L // P + (j in longer) for j in range(P)]
            else:
                cuts = sorted(rng.sample(range(1, L), P - 1))
                split = [b - a for a, b in zip([0, *cuts], [*cuts, L])]
            counts = []
            for n in split:
                x2 = rng.randint(0, n)
                x1 = rng.randint(0, n - x2)
                counts.append((n - x1 - x2, x1, x2))
            est = evaluate(pc, counts)
            floors = rank_time_floors(pc, est.peak_memory_gib, MODES)
            assert floors is not None
            ranks, exposed = pc.terms.ranks(), None
            work = []
            for rk, c in zip(ranks, rank_counts(counts, pc.pp)):
                exposed = rk.exposure.values(c)[0]
                work.append(rk.time(c) + exposed)
                lo, seq = floors[rk.rank]
                n = sum(c)
                assert 0 <= n - lo < len(seq)  # it fits, so its count is in the sequence
                assert work[-1] >= seq[n - lo] * (1 - 1e-12)
                for n0, v0, s in convex_minorant(lo, seq):
                    assert work[-1] >= (v0 + s * (n - n0)) * (1 - 1e-12)
            assert max(work) >= integer_slowest_rank_time(pc, floors) * (1 - 1e-12)
            checked += 1
    assert checked == 200


@pytest.mark.parametrize("gpus,batch,share", [(4, 16, 0.55), (8, 32, 0.7), (8, 16, 0.4)])
def test_the_rows_keep_each_milps_optimum(gpus, batch, share, monkeypatch):
    """Memory-tight candidates of a small model: the MILP with every rank's floor rows and
    without any floor (the formulation before issue 22) reach the same step time, proven."""
    checked = 0
    for pc in _layouts(SMALL, "dgx-a100-80gb", gpus, batch, 10, gpus * batch):
        frugal = evaluate(pc, [(0, 0, sum(c)) for c in _even(pc)]).peak_memory_gib
        loose = evaluate(pc, [(sum(c), 0, 0) for c in _even(pc)]).peak_memory_gib
        limit = frugal + share * (loose - frugal)  # between: recompute needed, and the frugal split fits
        with_rows = _optimum(pc, limit, rank_rows=True)
        with monkeypatch.context() as m:
            m.setattr(ilp, "rank_time_floors", lambda *args, **kwargs: None)
            without = _optimum(pc, limit, rank_rows=False)
        assert (with_rows is None) == (without is None)
        if with_rows is not None:
            assert with_rows == pytest.approx(without, rel=1e-7)
            checked += 1
    assert checked >= 5


def _optimum(pc, limit: float, rank_rows: bool):
    """The candidate's MILP optimum (seconds per step), proven, or None where nothing fits."""
    ts = 100.0 / evaluate(pc, _even(pc)).step_time_s
    prob, term, _ = ilp.candidate_problem("test", pc, limit, MODES, ts, rank_rows=rank_rows)
    prob += term
    ilp.run_solver(prob, ilp.make_solver("highs", None))
    if pulp.LpStatus[prob.status] == "Infeasible":
        return None
    assert prob.sol_status == pulp.LpSolutionOptimal
    return pulp.value(term) / ts


def _even(pc) -> list[tuple[int, int, int]]:
    """Layers as evenly as the layout allows (interleaved: its equal chunks)."""
    P, L = pc.num_stages, pc.num_layers
    return [(L // P + (j < L % P), 0, 0) for j in range(P)]


# --------------------------------------------------------------------------- symmetry rows


@pytest.mark.parametrize("m,zero,limit_scale", [(2, 2, 1.0), (2, 1, 0.35), (4, 0, 1.0), (16, 1, 1.0)])
def test_ordering_identical_ranks_keeps_the_optimum(monkeypatch, m, zero, limit_scale):
    """ilp._order_identical_ranks: rows n_r >= n_{r+1} only between ranks whose every cost and
    memory expression is equal (the middle ranks holding the same in-flight micro-batches; never
    the first, with the embedding, or the last, with the head), and the search's optimum is the
    one found without them, memory-tight or not."""
    from planner.specs import Layout
    from planner.specs import Axis, Schedule, memory_limit_gib

    model, cluster = load_model("llama2-7b"), load_cluster("dgx-a100-80gb")
    cand = Layout(
        dp=8,
        tp=1,
        pp=8,
        vpp=1,
        micro_batch_size=1,
        num_micro_batches=m,
        schedule=Schedule.one_f_one_b,
        zero_stage=zero,
        sequence_parallel=False,
        mesh_order=(Axis.tp, Axis.dp, Axis.pp),
    )
    pc = CostTables(model, cluster, JobSpec(global_batch_size=8 * m, seq_len=4096)).pipeline(cand)
    limit = memory_limit_gib(cluster) * limit_scale
    got = ilp.attempt_candidate(cand, pc, limit, "highs")
    with_rows, status = got.solution, got.status
    prob, _, _ = ilp.candidate_problem("probe", pc, limit, MODES, 1.0, symmetry=True)
    ordered = sorted(int(c.name.split("_")[1]) for c in prob.constraints.values() if c.name.startswith("order_"))
    in_flight = [min(m, pc.pp - r) for r in range(pc.pp)]
    assert ordered == [r for r in range(1, pc.pp - 2) if in_flight[r] == in_flight[r + 1]]
    monkeypatch.setattr(ilp, "_order_identical_ranks", lambda *args: None)
    without = ilp.attempt_candidate(cand, pc, limit, "highs").solution
    assert (with_rows is None) == (without is None), status
    if with_rows is not None:
        assert with_rows.proven and without.proven
        assert with_rows.objective == pytest.approx(without.objective, rel=1e-7)
        n = [sum(c) for c in with_rows.counts]
        assert all(n[r] >= n[r + 1] for r in ordered)
