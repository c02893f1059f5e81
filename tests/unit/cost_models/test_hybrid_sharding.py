"""Hybrid sharding (Plan.dp_shard): dp = replicas x shard group. The model states follow the
ZeRO paper's per-rank formulas over the shard group, not all of dp (Rajbhandari et al. 2020,
sec. 5: stage 3 holds 16 Psi / N_d for mixed-precision Adam); the gradient reduction is a
reduce-scatter within the group followed by an all-reduce of each rank's 1 / N_shard share across
the replicas (FSDP2 HSDP, MiCS sec. 4.2, Megatron's optimizer instances), priced with the ring
volume factors (n-1)/n and 2(r-1)/r."""

import pytest

from cost_models.communication import VOLUME_FACTOR, GroupLink
from cost_models.compute import total_params
from cost_models.estimate import estimate
from cost_models.tables import pipeline_costs
from cost_models.terms import DataParallel, Linear
from hardware_profiles import load_cluster
from planner.presets import load_model
from planner.search.brute import brute_force
from planner.search.candidates import SearchSpace, enumerate_candidates
from planner.search.solve import solve
from planner.specs import MEMORY_HEADROOM, Collective, JobSpec, ModelSpec, Plan, PlanError

H100 = load_cluster("dgx-h100-80gb")
MODEL = load_model("llama3-8b")
JOB = JobSpec(global_batch_size=256, seq_len=4096, target="generic")


def plan(dp: int, shard=None, zero: int = 3, tp: int = 1, mbs: int = 1) -> Plan:
    return Plan(
        dp=dp,
        tp=tp,
        pp=1,
        micro_batch_size=mbs,
        num_micro_batches=JOB.global_batch_size // (dp * mbs),
        zero_stage=zero,
        dp_shard=shard,
    )


def states_gib(p: Plan) -> float:
    est = estimate(MODEL, H100, JOB, p)
    r = est.memory_gib_per_pipeline_rank[0]
    return r.weights + r.gradients + r.optimizer_states


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_states_are_sharded_over_the_group_not_dp(zero):
    """64 ranks as 8 replicas of 8: each rank holds what a rank of a dp-8 layout holds (states /
    8), more than the 1/64 of full sharding."""
    hybrid, group_only, full = (
        states_gib(plan(64, 8, zero)),
        states_gib(plan(8, None, zero)),
        states_gib(plan(64, None, zero)),
    )
    assert hybrid == pytest.approx(group_only, rel=1e-9)
    assert hybrid > full


def test_zero3_states_follow_the_zero_paper():
    """Stage 3, mixed-precision Adam (the generic stack's ZeRO recipe): 16 Psi / N_shard bytes."""
    params = total_params(MODEL)
    want = 16 * params / 8 / 2**30
    assert states_gib(plan(64, 8, 3)) == pytest.approx(want, rel=0.02)


def test_reduction_is_group_reduce_scatter_then_replica_all_reduce():
    """The hybrid reduction's time is the reduce-scatter over the shard group plus the
    all-reduce of 1/N_shard of the bytes over the replicas, each alpha + volume x bytes / bw."""
    p = plan(64, 8, 3)
    pc = pipeline_costs(MODEL, H100, JOB, p)
    dp = DataParallel.of(pc)
    assert (dp.size, dp.replicas, dp.width) == (8, 8, 64)
    group, across = GroupLink(H100, 8, 1), GroupLink(H100, 8, 8)  # inside one node; one rank per node
    assert not group.inter_node and across.inter_node
    nbytes = 2.0e9
    rs_alpha, rs_beta = group.coefficients(Collective.reduce_scatter)
    ar_alpha, ar_beta = across.coefficients(Collective.all_reduce)
    assert rs_beta * H100.intra_node.fit(Collective.reduce_scatter, 8).bandwidth_gbps * 1e9 == pytest.approx(
        VOLUME_FACTOR[Collective.reduce_scatter](8)
    )
    assert ar_beta * H100.inter_node.fit(Collective.all_reduce, 8).bandwidth_gbps * 1e9 == pytest.approx(2 * 7 / 8)
    want = rs_alpha + rs_beta * nbytes + ar_alpha + ar_beta * nbytes / 8
    assert dp.reduction_time(Collective.reduce_scatter, nbytes) == pytest.approx(want, rel=1e-12)
    # a bucketed stream of nbytes: each bucket one reduce-scatter in the group and one all-reduce
    # across the replicas, each paying its latency (one call where the model counts no buckets:
    # cost_models/tables.py:MECHANISMS)
    per = 1 / dp.bucket_bytes if dp.bucket_bytes else 0.0
    stream = rs_alpha + ar_alpha + nbytes * (rs_beta + rs_alpha * per + ar_beta / 8 + ar_alpha * per)
    got = dp.reduction(Collective.reduce_scatter, Linear.per_layer(nbytes, 0.0))
    assert got.const == pytest.approx(stream, rel=1e-12)


@pytest.mark.parametrize("calls", [False, True])
def test_buckets_pay_the_latency_once_each(monkeypatch, calls):
    """With calls_as_issued, a stream of nbytes pays alpha per bucket of the stack's size."""
    from cost_models import tables

    monkeypatch.setitem(tables.MECHANISMS, "calls_as_issued", calls)
    dp = DataParallel.of(pipeline_costs(MODEL, H100, JOB, plan(64, 8, 1)))
    alpha, beta = dp.costs[2]  # reduce-scatter
    nbytes = 10 * 25 * 2**20
    got = dp.collective(Collective.reduce_scatter, Linear.per_layer(nbytes, 0.0)).const
    assert got == pytest.approx(alpha * (1 + (10 if calls else 0)) + beta * nbytes, rel=1e-12)


def test_full_sharding_has_no_replica_term():
    dp = DataParallel.of(pipeline_costs(MODEL, H100, JOB, plan(64)))
    assert (dp.size, dp.replicas) == (64, 1)
    assert dp.reduction_time(Collective.reduce_scatter, 1e9) == dp.time(Collective.reduce_scatter, 1e9)


def test_the_group_inside_a_node_gathers_on_nvlink():
    """ZeRO-3's per-layer all-gathers stay on the node's link when the shard group fits in it:
    cheaper per byte than the group of 64 that crosses nodes."""
    full = DataParallel.of(pipeline_costs(MODEL, H100, JOB, plan(64)))
    hybrid = DataParallel.of(pipeline_costs(MODEL, H100, JOB, plan(64, 8)))
    assert hybrid.time(Collective.all_gather, 1e9) < full.time(Collective.all_gather, 1e9)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"dp_shard": 3}, "does not divide dp 8"),
        ({"dp_shard": 4, "zero_stage": 0}, "needs ZeRO stage 1, 2 or 3"),
    ],
)
def test_plan_refuses_a_shard_that_cannot_be(fields, message):
    base = dict(dp=8, tp=1, pp=1, micro_batch_size=1, num_micro_batches=1, zero_stage=3)
    with pytest.raises((PlanError, ValueError), match=message):
        Plan(**{**base, **fields})


def test_shard_equal_to_dp_is_the_plain_plan():
    p = plan(8, 8)
    assert p.dp_shard is None and "dp_shard" not in p.model_dump_json()
    assert plan(8, 4).model_dump()["dp_shard"] == 4


SMALL = ModelSpec(name="small", num_layers=4, hidden_size=1024, num_heads=8, vocab_size=32000, max_seq_len=2048)


def tiny_cluster(memory_gib: float):
    base = load_cluster("dgx-a100-80gb")
    device = base.device.model_copy(
        update={"framework_overhead_gib": 0.0, "memory_gib": memory_gib / (1 - MEMORY_HEADROOM)}
    )
    return base.model_copy(update={"gpus_per_node": 2, "device": device})


def test_the_search_offers_shard_groups_of_whole_nodes():
    space = SearchSpace(num_gpus=8, global_batch_size=8, fixed={"tp": 1, "pp": 1, "zero_stage": 3})
    layouts, _ = enumerate_candidates(SMALL, tiny_cluster(80), space)
    assert {c.shard_dp for c in layouts} == {2, 4, 8}  # a node, two nodes, all of dp


@pytest.mark.slow
@pytest.mark.parametrize("memory_gib", [80, 1.5, 1.2, 0.8])
def test_matches_brute_force_with_shard_groups(memory_gib):
    """8 GPUs on 2-GPU nodes, every layout with its shard group: the ILP search and the
    enumeration of every split agree, from roomy (a group of one node wins: ZeRO-1 over 2 ranks,
    4 replicas) through full sharding to nothing that fits."""
    job = JobSpec(global_batch_size=8, seq_len=2048)
    space = SearchSpace(num_gpus=8, global_batch_size=8, fixed={"tp": 1, "micro_batch_size": 1})
    res = solve(SMALL, tiny_cluster(memory_gib), job, space, top_k=1)
    ref = brute_force(SMALL, tiny_cluster(memory_gib), job, space)
    if ref.value is None:
        assert res.best is None
        return
    assert 1 / res.fastest.estimate.tokens_per_s == pytest.approx(ref.value, rel=1e-7)
    assert res.fastest.plan.dp_shard == (ref.candidate.dp_shard or None)
