"""The three consumers of cost_models/terms.py agree: for random candidates and random integer
layer splits and recompute counts (fixed seed), the ILP's rows with the split fixed give
exactly `evaluate`'s step time and memory, and no bound exceeds what `evaluate` says."""

from __future__ import annotations

import random

import pulp
import pytest

from cost_models.estimate import evaluate
from cost_models.fit import constants_of, with_constants
from cost_models.memory import GIB
from cost_models.terms import MODES
from hardware_profiles import load_cluster
from planner.presets import load_model
from planner.search.bounds import cheap_bound, min_peak_memory, refined_bound
from planner.search.candidates import CostTables, SearchSpace, enumerate_candidates
from planner.search.ilp import candidate_problem, make_solver, quiet_stdout
from planner import stacks
from planner.specs import JobSpec, ModelSpec

pytestmark = pytest.mark.slow  # CONTRIBUTING.md: the quick tier leaves it out

SMALL = ModelSpec(name="small", num_layers=6, hidden_size=1024, num_heads=8, vocab_size=32000, max_seq_len=2048)


def _small_cluster(overlap: float):
    base = load_cluster("dgx-a100-80gb")
    return base.model_copy(update={"gpus_per_node": 2, "overlap_efficiency": overlap})


# (model, cluster, GPUs, global batch): a small model whose ranks straddle one gradient
# bucket (25 MiB), with partial overlap; and real models with interleaving and every ZeRO stage.
def _with_host_time(cluster, seconds: float):
    return with_constants(cluster, "generic", constants_of(cluster, "generic"), step_overhead_s=seconds)


SETTINGS = [
    (SMALL, _small_cluster(0.6), 4, 8),
    (SMALL, _small_cluster(1.0), 8, 16),
    (load_model("gpt3-13b"), load_cluster("dgx-a100-80gb"), 64, 256),
    # a host time per step (StackConstants.step_overhead_s) for the jobs' stack, generic
    (
        load_model("llama2-7b"),
        _with_host_time(load_cluster("dgx-a100-40gb").model_copy(update={"overlap_efficiency": 0.8}), 0.05),
        16,
        64,
    ),
]
# A mixture-of-experts model: every ep, the first two layers dense on the first stage.
MOE = SMALL.model_copy(
    update={
        "name": "small-moe",
        "activation": "swiglu",
        "num_experts": 4,
        "experts_per_token": 2,
        "moe_ffn_hidden_size": 512,
        "num_shared_experts": 1,
        "first_dense_layers": 2,
    }
)
SETTINGS.append((MOE, _small_cluster(0.6), 8, 16))
# Context parallelism: 8,192-token sequences split over cp = 2 or 4 ranks.
SETTINGS.append((SMALL.model_copy(update={"max_seq_len": 8192}), _small_cluster(0.6), 8, 16, (1, 2, 4), 8192))
# DeepSpeed's stack: ZeRO 0-1 gradients reduced after backward (planner/stacks/stack.py:Stack.gradient_reduce).
SETTINGS.append((SMALL, _small_cluster(0.6), 8, 16, (1,), 2048, "deepspeed"))
SAMPLES_PER_SETTING = 60


def _random_counts(rng: random.Random, L: int, P: int, interleaved: bool) -> list[tuple[int, int, int]]:
    if interleaved:  # model chunks of L // P layers, L % P of them (at random) one more: the ILP's domain
        split = [L // P] * P
        for j in rng.sample(range(P), L % P):
            split[j] += 1
    else:
        cuts = sorted(rng.sample(range(1, L), P - 1))
        bounds = [0, *cuts, L]
        split = [bounds[i + 1] - bounds[i] for i in range(P)]
    out = []
    for n in split:
        a = rng.randint(0, n)
        b = rng.randint(0, n - a)
        out.append(tuple(rng.sample([a, b, n - a - b], 3)))
    return out


def _symmetric_order(counts, pp: int) -> list:
    """The ILP breaks the symmetry of a rank's middle model chunks (neither the first nor the
    last stage) by ordering them by (layers, full, selective), descending: reorder so."""
    counts, P = list(counts), len(counts)
    for r in range(pp):
        middle = [j for j in range(r, P, pp) if 0 < j < P - 1]
        ordered = sorted((counts[j] for j in middle), key=lambda c: (sum(c), c[2], c[1]), reverse=True)
        for j, c in zip(middle, ordered):
            counts[j] = c
    return counts


def _cases():
    rng = random.Random(20261130)
    for s, (model, cluster, gpus, batch, *cp) in enumerate(SETTINGS):
        cps, seq, target = (*cp, "generic")[:3] if cp else ((1,), 2048, "generic")
        job = JobSpec(global_batch_size=batch, seq_len=seq, target=target)
        rules = stacks.get(target).rules  # what the stack runs (DeepSpeed: no ZeRO-2/3 beside a pipeline)
        space = SearchSpace(
            num_gpus=gpus, global_batch_size=batch, include_dominated=True, cp_degrees=cps, seq_len=seq, rules=rules
        )
        cands, _ = enumerate_candidates(model, cluster, space)
        tables = CostTables(model, cluster, job)
        for i, c in enumerate(rng.sample(cands, min(SAMPLES_PER_SETTING, len(cands)))):
            counts = _random_counts(rng, model.num_layers, c.pp * c.vpp, c.vpp > 1)
            while sum(counts[0]) < model.first_dense_layers and c.vpp == 1:
                counts = _random_counts(rng, model.num_layers, c.pp * c.vpp, False)
            if sum(counts[0]) < model.first_dense_layers:
                continue  # interleaved chunks too small for the dense layers: no valid split
            yield pytest.param(tables, c, counts, id=f"s{s}-{i}")


def _fixed_split_ilp(pc, counts, limit_gib: float):
    """The ILP of one candidate with its split fixed to `counts`: (status, objective seconds)."""
    ts = 1.0 / evaluate(pc, counts).step_time_s * 100
    prob, term, x = candidate_problem("fixed", pc, limit_gib, MODES, ts, rank_rows=True)  # every valid row
    for j, c in enumerate(counts):
        for i in range(3):
            prob += x[j][i] == c[i], f"fix_{j}_{i}"
    prob += term
    with quiet_stdout():
        prob.solve(make_solver("highs", None))
    return pulp.LpStatus[prob.status], (pulp.value(term) or 0.0) / ts


@pytest.mark.parametrize("tables,cand,counts", list(_cases()))
def test_ilp_rows_bounds_and_estimate_agree(tables, cand, counts):
    pc = tables.pipeline(cand)
    est = evaluate(pc, counts)
    # Reordering a rank's middle chunks changes nothing (what the ILP's symmetry rows assume),
    # unless the chunks are of unequal length (rounds pace them; the ILP has no such rows then).
    if not pc.uneven_chunks:
        counts = _symmetric_order(counts, cand.pp)
        assert evaluate(pc, counts).step_time_s == pytest.approx(est.step_time_s, rel=1e-12)
    peak = est.peak_memory_gib
    # The ILP's objective row with this split is the estimate's step time.
    status, objective = _fixed_split_ilp(pc, counts, peak * (1 + 1e-9))
    assert status == "Optimal"
    assert objective == pytest.approx(est.step_time_s, rel=1e-7)
    # Its memory rows hold exactly at the estimate's peak: a limit just below it is infeasible.
    status, _ = _fixed_split_ilp(pc, counts, peak * (1 - 1e-6))
    assert status == "Infeasible"
    # No bound is above what the estimate says of this split.
    assert cheap_bound(pc, peak * (1 + 1e-9)) <= est.step_time_s * (1 + 1e-9)
    rb = refined_bound(pc, peak * (1 + 1e-9), MODES)
    assert rb is not None and rb <= est.step_time_s * (1 + 1e-9)
    assert min_peak_memory(pc) / GIB <= peak * (1 + 1e-9)


def test_an_interleaved_layout_never_needs_less_memory_than_its_plain_sibling():
    """planner/search/solve.py:min_memory_needed skips interleaved candidates whose vpp-1 1F1B
    sibling it also bounds: sound only if the sibling's least peak memory is never above theirs."""
    from dataclasses import replace

    from planner.specs import Schedule

    checked = 0
    for model, cluster, gpus, batch in [
        (load_model("gpt3-13b"), load_cluster("dgx-a100-80gb"), 64, 256),
        (load_model("llama2-7b"), load_cluster("dgx-a100-40gb"), 16, 64),
        (MOE, _small_cluster(0.6), 8, 16),
    ]:
        job = JobSpec(global_batch_size=batch, seq_len=2048)
        cands, _ = enumerate_candidates(model, cluster, SearchSpace(num_gpus=gpus, global_batch_size=batch))
        tables, plain = CostTables(model, cluster, job), set(cands)
        for c in cands:
            sibling = replace(c, vpp=1, schedule=Schedule.one_f_one_b)
            if c.vpp > 1 and sibling in plain:
                for modes in (MODES, MODES[:2]):
                    assert min_peak_memory(tables.pipeline(sibling), modes) <= min_peak_memory(
                        tables.pipeline(c), modes
                    ) * (1 + 1e-12)
                checked += 1
    assert checked > 50, checked
