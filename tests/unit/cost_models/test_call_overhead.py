"""Per-call overhead of collectives (LinkTier.call_overhead_us): fitted by the profile from
synthetic stack timings, and charged by the cost model once per call it counts."""

from dataclasses import replace

import pytest

from cost_models.communication import GroupLink
from cost_models.estimate import estimate
from hardware_profiles import cluster_presets, load_cluster
from planner.profiler.calls import (
    StackTiming,
    fit_call_overhead,
    fit_call_overheads,
    modeled_communication,
    with_call_overhead,
)
from planner.specs import ClusterSpec, Collective, CollectiveFit, JobSpec, LinkTier, ModelSpec, Plan

GPT = ModelSpec(name="tiny-gpt", num_layers=4, hidden_size=128, num_heads=4, vocab_size=512, max_seq_len=128)
JOB = JobSpec(global_batch_size=8, seq_len=128, precision="fp32")
AG, RS, AR = Collective.all_gather, Collective.reduce_scatter, Collective.all_reduce


def gloo_like(overlap: float = 0.5) -> ClusterSpec:
    """A preset whose links are a gloo-like fit (600 us, 1.5 GB/s, no hop latencies)."""
    fits = [CollectiveFit(collective=c, latency_us=600.0, bandwidth_gbps=1.5) for c in Collective]
    tier = LinkTier(name="gloo-like", collectives=fits)
    base = load_cluster("dgx-a100-80gb")
    return base.model_copy(
        update={
            "intra_node": tier,
            "inter_node": tier,
            "gpus_per_node": 4,
            "num_nodes": 1,
            "overlap_efficiency": overlap,
        }
    )


TP_STACK = StackTiming(
    dp=1, tp=2, layers=4, micro_batch_size=4, seq_len=128, plain_forward_s=0.02, plain_backward_s=0.04, run_s=0.0
)
ZERO3_STACK = StackTiming(
    dp=4, tp=1, layers=4, micro_batch_size=4, seq_len=128, plain_forward_s=0.04, plain_backward_s=0.08, run_s=0.0
)


def timed(stack: StackTiming, cluster: ClusterSpec, overhead_us: float, noise: float = 1.0) -> StackTiming:
    """The stack as it would time if each of its calls cost `overhead_us` beyond the fits."""
    comm = modeled_communication(stack, with_call_overhead(cluster, stack, overhead_us), GPT, JOB)
    return replace(stack, run_s=stack.plain_forward_s + stack.plain_backward_s + noise * comm)


@pytest.mark.parametrize("stack", [TP_STACK, ZERO3_STACK], ids=["tp", "zero3"])
@pytest.mark.parametrize("overhead_us", [0.0, 250.0, 5000.0])
@pytest.mark.parametrize("overlap", [0.0, 0.5, 1.0])
def test_fit_recovers_the_overhead_behind_the_timing(stack, overhead_us, overlap):
    cluster = gloo_like(overlap)
    got = fit_call_overhead(cluster, GPT, JOB, timed(stack, cluster, overhead_us))
    assert got == pytest.approx(overhead_us, abs=1e-3)


@pytest.mark.parametrize("stack", [TP_STACK, ZERO3_STACK], ids=["tp", "zero3"])
def test_faster_than_the_fits_gives_no_overhead(stack):
    """A stack whose collectives ran faster than the back-to-back fits predict: 0, never negative."""
    cluster = gloo_like()
    assert fit_call_overhead(cluster, GPT, JOB, timed(stack, cluster, 0.0, noise=0.8)) == 0.0


def test_each_stack_sets_its_own_collectives():
    cluster = gloo_like()
    fitted = fit_call_overheads(
        cluster, GPT, JOB, [timed(TP_STACK, cluster, 3000.0), timed(ZERO3_STACK, cluster, 7000.0)]
    )
    got = fitted.intra_node.call_overhead_us
    assert set(got) == {AR, AG, RS}
    assert got[AR] == pytest.approx(3000.0, abs=1e-3)
    assert got[AG] == got[RS] == pytest.approx(7000.0, abs=1e-3)
    assert cluster.intra_node.call_overhead_us is None  # the input is left alone


def with_overheads(cluster: ClusterSpec, overheads: dict) -> ClusterSpec:
    tier = cluster.intra_node.model_copy(update={"call_overhead_us": overheads})
    return cluster.model_copy(update={"intra_node": tier, "inter_node": tier})


def test_zero3_pays_the_overhead_on_every_layer_call():
    """ZeRO-3 gathers each layer in forward and again in backward and reduce-scatters it:
    3 calls per layer and micro-batch. With nothing hidden (overlap 0) each adds the overhead."""
    cluster, x = gloo_like(overlap=0.0), 0.004
    plan = Plan(dp=4, tp=1, pp=1, micro_batch_size=1, num_micro_batches=2, zero_stage=3)
    base = estimate(GPT, cluster, JOB, plan).time_breakdown_s.dp_communication_exposed
    charged = estimate(
        GPT, with_overheads(cluster, {AG: x * 1e6, RS: x * 1e6}), JOB, plan
    ).time_breakdown_s.dp_communication_exposed
    assert charged - base == pytest.approx(2 * GPT.num_layers * 3 * x, rel=1e-9)
    # data parallelism without ZeRO-3 makes no gather / reduce-scatter call: unchanged
    ddp = plan.model_copy(update={"zero_stage": 0})
    assert estimate(GPT, with_overheads(cluster, {AG: x * 1e6, RS: x * 1e6}), JOB, ddp) == estimate(
        GPT, cluster, JOB, ddp
    )


def test_tp_pays_the_overhead_on_every_all_reduce():
    """Per micro-batch: four all-reduces per layer (two forward, two backward), and at the
    edges one for the embedding output, one for the head's input gradient and two for the
    parallel cross-entropy's max and sum."""
    cluster, x = gloo_like(), 0.002
    plan = Plan(dp=1, tp=2, pp=1, micro_batch_size=2, num_micro_batches=4, zero_stage=0)
    base = estimate(GPT, cluster, JOB, plan).step_time_s
    charged = estimate(GPT, with_overheads(cluster, {AR: x * 1e6}), JOB, plan).step_time_s
    assert charged - base == pytest.approx(4 * (4 * GPT.num_layers + 4) * x, rel=1e-9)


def test_presets_have_no_call_overhead():
    for name in cluster_presets():
        cluster = load_cluster(name)
        for tier in (cluster.intra_node, cluster.inter_node):
            assert tier.call_overhead_us is None, name
        assert all(GroupLink(cluster, 8, 1).call_overhead_us(c) == 0.0 for c in Collective)


def test_negative_overhead_refused():
    fits = [{"collective": "p2p", "latency_us": 1, "bandwidth_gbps": 1}]
    with pytest.raises(ValueError, match=r"call_overhead_us.all_reduce\n.*at least 0"):
        LinkTier.model_validate({"name": "x", "collectives": fits, "call_overhead_us": {"all_reduce": -1.0}})
    tier = LinkTier.model_validate({"name": "x", "collectives": fits, "call_overhead_us": {"all_reduce": 5.0}})
    assert LinkTier.model_validate_json(tier.model_dump_json()) == tier and tier.call_overhead_us == {AR: 5.0}


def test_the_all_to_all_takes_the_all_gathers_overhead_until_it_has_its_own():
    """plan profile times no all-to-all overhead: a MoE exchange pays the all-gather's per call
    (what it paid priced by the all-gather fit, before the all-to-all was measured), its own where
    a profile states one."""
    cluster = with_overheads(gloo_like(), {AG: 700.0, RS: 50.0})
    link = GroupLink(cluster, 4, 1)
    assert link.call_overhead_us(Collective.all_to_all) == 700.0
    own = with_overheads(gloo_like(), {AG: 700.0, Collective.all_to_all: 90.0})
    assert GroupLink(own, 4, 1).call_overhead_us(Collective.all_to_all) == 90.0
    assert GroupLink(gloo_like(), 4, 1).call_overhead_us(Collective.all_to_all) == 0.0
