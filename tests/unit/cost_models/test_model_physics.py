"""What the hardware does, checked on the cost model (issue 9's "what it must show")."""

import pytest

from cost_models import communication, compute
from cost_models.estimate import estimate
from hardware_profiles import load_cluster
from planner.presets import load_model
from planner.specs import Collective, JobSpec, Plan


@pytest.fixture(scope="module", params=["dgx-a100-80gb", "dgx-h100-80gb"])
def cluster(request):
    return load_cluster(request.param)


def step(model, cluster, job, **plan):
    return estimate(model, cluster, job, Plan(**plan)).step_time_s


@pytest.mark.parametrize("target", ["generic", "deepspeed", "torchtitan"])  # ZeRO-3 as each stack issues it
def test_zero3_stops_gaining_once_parameter_traffic_exceeds_compute_while_tp_pp_keeps_scaling(cluster, target):
    """Fixed global batch (GPT-3 175B, 512-token sequences), with each ZeRO-3 stack's own calls
    and constants (DeepSpeed's per-bucket reduce-scatters, FSDP's per block): pure ZeRO-3 moves 3 x 2 bytes
    per parameter per GPU per micro-batch whatever dp is, so once a GPU's compute per
    micro-batch (1 sequence) is shorter than that traffic, doubling the GPUs gains little;
    a TP 8 x PP 8 layout keeps almost halving its step time. (At 2,048-token sequences on
    these presets' networks the traffic still hides behind 1 sequence of compute: see the
    README, "Trust".)"""
    model = load_model("gpt3-175b")
    job = JobSpec(global_batch_size=256, seq_len=512, target=target)
    z = {
        dp: step(
            model,
            cluster,
            job,
            dp=dp,
            tp=1,
            pp=1,
            micro_batch_size=256 // dp,
            num_micro_batches=1,
            zero_stage=3,
            recompute="full",
        )
        for dp in (64, 128, 256)
    }
    # 4 -> 2 sequences per GPU: compute still covers most of the traffic (DeepSpeed's module-by-module
    # gathers, six latencies per layer, bend a little sooner)
    assert z[128] / z[64] < (0.7 if target == "deepspeed" else 0.65)
    assert z[256] / z[128] > 0.7  # 2 -> 1: at most 30% gained from twice the GPUs
    m = {
        dp: step(
            model,
            cluster,
            job,
            dp=dp,
            tp=8,
            pp=8,
            micro_batch_size=1,
            num_micro_batches=256 // dp,
            zero_stage=1,
            sequence_parallel=True,
            recompute="selective",
        )
        for dp in (2, 4)
    }
    assert m[4] / m[2] < 0.65 < z[256] / z[128]


@pytest.mark.parametrize("device", ["dgx-a100-80gb", "dgx-h100-80gb"])
@pytest.mark.parametrize("shape", [(1, 1, 1), (4, 1, 1), (1, 1, 8), (1, 4, 2)])
def test_larger_gemms_of_a_family_never_run_less_efficiently(device, shape):
    """Scaling (m, n, k) along a direction: FLOPs per second never drop as the GEMM grows."""
    dev, last = load_cluster(device).device, 0.0
    for x in range(1, 400):
        m, n, k = (64 * x * d for d in shape)
        eff = 2.0 * m * n * k / compute.gemm_shape_time(dev, "bf16", m, n, k)
        assert eff >= last * (1 - 1e-12), (m, n, k)
        last = eff
    assert last / (dev.peak_tflops["bf16"] * 1e12) <= dev.gemm.max_efficiency * dev.sustained_fraction + 1e-12


@pytest.mark.parametrize("c", [Collective.all_reduce, Collective.all_gather, Collective.reduce_scatter])
@pytest.mark.parametrize("stride", [1, 8])
def test_a_collective_takes_longer_on_a_larger_group(cluster, c, stride):
    """Fixed bytes: more ranks mean more ring steps (or tree levels), each with its latency."""
    times = [communication.GroupLink(cluster, n, stride).time(c, 64 * 2**20) for n in (2, 4, 8, 16, 64, 256, 1024)]
    assert all(b > a for a, b in zip(times, times[1:])), times


def test_ring_latency_counts_intra_and_inter_node_hops():
    """NCCL's ring: n - 1 steps for an all-gather, nodes - 1 of them over the network."""
    cluster = load_cluster("dgx-h100-80gb")
    link = communication.GroupLink(cluster, 64, 1)  # 8 nodes of 8
    intra, inter = cluster.intra_node.hop_latency_us, cluster.inter_node.hop_latency_us
    assert link.step_latency_us(Collective.all_gather) == pytest.approx((63 - 7) * intra + 7 * inter)
    ring = 2 * ((63 - 7) * intra + 7 * inter)
    tree = 2 * (7 * cluster.intra_node.tree_hop_latency_us + 3 * cluster.inter_node.tree_hop_latency_us)
    assert link.step_latency_us(Collective.all_reduce) == pytest.approx(min(ring, tree))


@pytest.mark.parametrize("top_k", [1, 2, 4, 8])
def test_deepep_sends_a_token_once_to_each_rank_of_its_node_holding_its_experts(top_k):
    """Inside a node DeepEP's dispatch layout sends a token once per destination rank (its
    is_token_in_rank), not once per routed expert as the alltoall dispatcher does: with top_k
    experts drawn uniformly from 8 ranks it reaches 7 (1 - (7/8)^top_k) other ranks instead of
    7/8 top_k copies. One expert per token: the two dispatchers move the same bytes."""
    from cost_models.tables import all_to_all_time

    cluster = load_cluster("dgx-h100-80gb")
    link = communication.GroupLink(cluster, 8, 1)
    assert not link.inter_node
    nbytes = top_k * 4096 * 4096 * 2.0  # 4096 tokens of 4096 bf16 values, top_k copies
    alltoall = all_to_all_time(link, nbytes, cluster, top_k)
    deepep = all_to_all_time(link, nbytes, cluster, top_k, deepep=True)
    copies = 8 * (1 - (7 / 8) ** top_k)  # distinct ranks a token reaches, its own included
    assert deepep == pytest.approx(link.time(Collective.all_gather, nbytes / top_k * copies))
    assert deepep <= alltoall * (1 + 1e-12)
    if top_k == 1:
        assert deepep == pytest.approx(alltoall)


def _with_all_to_all(cluster, inter: bool, latency_us: float, bandwidth_gbps: float):
    """`cluster` with a measured all-to-all fit (as `plan profile` writes one) on one tier."""
    from planner.specs import CollectiveFit

    name = "inter_node" if inter else "intra_node"
    tier = getattr(cluster, name)
    fit = CollectiveFit(collective=Collective.all_to_all, latency_us=latency_us, bandwidth_gbps=bandwidth_gbps)
    return cluster.model_copy(update={name: tier.model_copy(update={"collectives": [*tier.collectives, fit]})})


def test_measured_all_to_all_prices_the_dispatch():
    """A tier's measured all-to-all replaces what stands for it without one: across nodes, the
    network point-to-point fit (the 7/8 of a rank's buffer bound for the 7 other nodes of EP 64 on
    8-GPU nodes, over its own NIC at the measured bus bandwidth); inside a node, the all-gather fit
    ((n - 1)/n of the buffer at its bus bandwidth, nccl-tests' alltoall convention). DeepEP's
    kernels keep their rule. The presets carry no all-to-all (no public figure): optional."""
    from cost_models.tables import all_to_all_time

    cluster = load_cluster("dgx-h100-80gb")
    assert not cluster.intra_node.has(Collective.all_to_all) and not cluster.inter_node.has(Collective.all_to_all)
    nbytes = 8 * 2048 * 7168 * 2.0  # 2,048 tokens of DeepSeek-V3's width in bf16, 8 copies each
    ep64 = communication.GroupLink(cluster, 64, 1)
    assert ep64.inter_node and ep64.nodes == 8
    p2p = cluster.inter_node.fit(Collective.p2p, 64)
    before = all_to_all_time(ep64, nbytes, cluster, 8)
    local = communication.GroupLink(cluster, 8, 1).time(Collective.all_gather, nbytes / 8)
    assert before == pytest.approx(max(p2p.latency_us * 1e-6 + nbytes * 56 / 64 / (p2p.bandwidth_gbps * 1e9), local))
    slow = _with_all_to_all(cluster, True, 30.0, p2p.bandwidth_gbps / 2)  # half the point-to-point rate
    after = all_to_all_time(communication.GroupLink(slow, 64, 1), nbytes, slow, 8)
    assert after == pytest.approx(max(30e-6 + nbytes * 56 / 64 / (p2p.bandwidth_gbps / 2 * 1e9), local))
    assert after > 1.9 * before
    deepep = all_to_all_time(ep64, nbytes, cluster, 8, deepep=True)
    assert all_to_all_time(communication.GroupLink(slow, 64, 1), nbytes, slow, 8, deepep=True) == pytest.approx(deepep)
    # inside a node: alpha + (n - 1)/n of the buffer at the measured bus bandwidth
    inside = _with_all_to_all(cluster, False, 12.0, 150.0)
    ep8 = communication.GroupLink(inside, 8, 1)
    assert not ep8.inter_node
    assert all_to_all_time(ep8, nbytes, inside, 8) == pytest.approx(12e-6 + nbytes * 7 / 8 / 150e9)
    # and the share of an inter-node exchange that stays inside each node with it
    both = _with_all_to_all(
        inside, True, 30.0, p2p.bandwidth_gbps / 100
    )  # a network so slow the node's share never binds
    net = 30e-6 + nbytes * 56 / 64 / (p2p.bandwidth_gbps / 100 * 1e9)
    assert all_to_all_time(communication.GroupLink(both, 64, 1), nbytes, both, 8) == pytest.approx(net)
    fast = _with_all_to_all(inside, True, 0.0, 1e6)  # a network so fast the node's share binds
    assert all_to_all_time(communication.GroupLink(fast, 64, 1), nbytes, fast, 8) == pytest.approx(
        12e-6 + nbytes / 8 * 7 / 8 / 150e9
    )


def test_a_tier_needs_the_ring_collectives_and_p2p_not_the_all_to_all():
    from planner.specs import ClusterSpec, CollectiveFit, LinkTier

    cluster = load_cluster("dgx-h100-80gb")
    fits = [CollectiveFit(collective=c, latency_us=1.0, bandwidth_gbps=10.0) for c in Collective if c != Collective.p2p]
    data = cluster.model_dump()
    with pytest.raises(ValueError, match="has no fit for p2p.*all_to_all is optional"):
        ClusterSpec.model_validate({**data, "intra_node": LinkTier(name="no p2p", collectives=fits).model_dump()})
    assert ClusterSpec.model_validate(data) == cluster  # the presets: no all-to-all, accepted
