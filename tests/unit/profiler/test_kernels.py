"""planner/profiler/kernels.py: timings become the preset's kernel tables (GemmModel,
fused-attention efficiency, launch gap), and the cost model reads them like the presets'."""

import pytest

from cost_models import compute
from hardware_profiles import load_cluster
from planner.presets import load_model
from planner.profiler import kernels
from planner.specs import DType, JobSpec, Layout

torch = pytest.importorskip("torch")


def test_gemm_model_takes_the_best_large_gemm():
    peak = 989.0
    big = 2.0 * 8192**3
    points = [
        (2.0 * 1024**3, 2.0 * 1024**3 / (0.95 * peak * 1e12)),  # small: ignored even if it looks fast
        (big, big / (0.70 * peak * 1e12)),
        (big, big / (0.78 * peak * 1e12)),
    ]
    g = kernels.gemm_model(132, points, peak)
    assert g.sm_count == 132
    assert g.max_efficiency == pytest.approx(0.78, rel=1e-12)


def test_attention_efficiency_counts_the_backward_recompute():
    flops = kernels.attention_flops(2, 16, 4096, 128)
    assert flops == 4.0 * 2 * 16 * 4096**2 * 128 / 2  # causal: half the tiles
    eff = kernels.attention_efficiency(
        flops, forward_s=flops / (0.5 * 312e12), backward_s=2.5 * flops / (0.4 * 312e12), peak_tflops=312
    )
    assert eff.forward == pytest.approx(0.5) and eff.backward == pytest.approx(0.4)


def test_launch_gap():
    assert kernels.launch_gap_us(2000, 0.01) == pytest.approx(5.0)


def test_measured_tables_feed_the_cost_model():
    """A device whose measured attention runs at half the preset's efficiency takes longer per
    layer by exactly the attention's extra time; a lower measured GEMM ceiling slows GEMMs."""
    dev = load_cluster("dgx-h100-80gb").device
    model = load_model("llama3-8b")
    job = JobSpec(global_batch_size=1, seq_len=4096, precision="bf16")
    base = compute.layer_compute(model, dev, job, Layout())
    slow_att = {
        k: v.model_copy(update={"forward": v.forward / 2, "backward": v.backward / 2}) for k, v in dev.attention.items()
    }
    slow = compute.layer_compute(model, dev.model_copy(update={"attention": slow_att}), job, Layout())
    f0, b0 = compute.attention_times(dev, DType.bf16, 1, model.num_heads, 4096, model.head_dim, True)
    assert slow.forward - base.forward == pytest.approx(f0, rel=1e-9)
    assert slow.backward - base.backward == pytest.approx(b0, rel=1e-9)
    lower = dev.model_copy(update={"gemm": dev.gemm.model_copy(update={"max_efficiency": dev.gemm.max_efficiency / 2})})
    assert compute.layer_compute(model, lower, job, Layout()).forward > base.forward


def test_measurements_run_on_cpu():
    """The timing code itself, on small CPU shapes: positive times, tables a DeviceSpec accepts."""
    torch.set_num_threads(1)
    flops, fwd, bwd = kernels.measure_attention(
        torch, "cpu", torch.float32, 3, lambda: None, heads=2, seq=128, head_dim=16
    )
    assert flops > 0 and fwd > 0 and bwd > 0
    gap = kernels.measure_launch_gap(torch, "cpu", 3, lambda: None, kernels=200)
    assert 0 < gap < 1e4
    tables = kernels.device_tables(
        torch, "cpu", torch.float32, 3, lambda: None, [(2e9, 0.1)], peak_tflops=1.0, sm_count=None
    )
    assert set(tables) == {"kernel_overhead_us"}
    dev = load_cluster("dgx-a100-80gb").device
    fake = kernels.gemm_model(108, [(2e9, 0.1)], 1.0)
    dev.model_validate({**dev.model_dump(), "gemm": fake.model_dump(), "kernel_overhead_us": gap})


def test_a_gpu_profile_carries_the_kernel_tables():
    """assemble(): on a GPU the measured tables replace the curve-only device (GEMMs by shape
    with the measured ceiling, attention per kernel, the launch gap), keeping the shipped
    preset's fitted sustained fraction for that part; a CPU profile stays curve-only."""
    from planner.profiler.profile import assemble
    from planner.specs import MatmulPoint, ProfileEnvironment

    env = ProfileEnvironment(
        torch_version="2.13",
        backend="nccl",
        device_type="cuda",
        device_name="NVIDIA H100 80GB HBM3",
        dtype=DType.bf16,
        world_size=1,
        nproc_per_node=1,
        nnodes=1,
        date="2026-11-30",
        hostname="h",
        quick=True,
    )
    n = 8192
    point = MatmulPoint(n=n, flops=2.0 * n**3, seconds=2.0 * n**3 / 750e12, tflops=750.0)
    tables = {
        "gemm": kernels.gemm_model(132, [(point.flops, point.seconds)], 989.0),
        "attention": {"flash2": kernels.attention_efficiency(1e12, 1e12 / 400e12, 2.5e12 / 300e12, 989.0)},
        "kernel_overhead_us": 6.0,
    }
    result = {
        "env": env,
        "per_rank": [([], [point], 3000.0, 79.0, 1.0)],
        "sweeps": [],
        "overlap": 1.0,
        "stacks": [],
        "kernels": tables,
    }
    dev = assemble(result, "h100-measured", load_model("gpt2-124m")).device
    assert dev.gemm.sm_count == 132 and dev.gemm.max_efficiency == pytest.approx(750 / 989)
    assert dev.attention["flash2"].forward == pytest.approx(400 / 989)
    assert dev.kernel_overhead_us == 6.0
    assert dev.sustained_fraction == load_cluster("dgx-h100-80gb").device.sustained_fraction
    cpu = assemble(
        {**result, "env": env.model_copy(update={"device_type": "cpu", "device_name": "cpu"}), "kernels": {}},
        "cpu",
        load_model("gpt2-124m"),
    ).device
    assert cpu.gemm is None and cpu.attention is None


def test_a_rank_whose_memory_share_the_framework_fills_is_refused_in_one_line():
    """assemble(): a rank's memory share (the host's memory over its ranks, on CPU) not above the
    framework's own is a PlannerError naming both and what to change, not a DeviceSpec validation
    traceback; just above it assembles."""
    from planner.errors import PlannerError
    from planner.profiler.profile import assemble
    from planner.specs import MatmulPoint, ProfileEnvironment

    env = ProfileEnvironment(
        torch_version="2.13",
        backend="gloo",
        device_type="cpu",
        device_name="cpu",
        dtype=DType.fp32,
        world_size=4,
        nproc_per_node=4,
        nnodes=1,
        date="2026-12-04",
        hostname="h",
        quick=True,
    )
    point = MatmulPoint(n=512, flops=2.0 * 512**3, seconds=1e-2, tflops=2.0 * 512**3 / 1e-2 / 1e12)

    def result(capacity, overhead):
        return {
            "env": env,
            "per_rank": [([], [point], 10.0, capacity, overhead)] * 4,
            "sweeps": [],
            "overlap": 1.0,
            "stacks": [],
        }

    with pytest.raises(
        PlannerError,
        match=r"^each of the 4 ranks per node has 1\.50 GiB of memory \(its share\), not more than "
        r"the 1\.50 GiB its framework alone takes; profile with fewer ranks per node$",
    ):
        assemble(result(1.5, 1.5), "cpu", load_model("gpt2-124m"))
    assert assemble(result(1.6, 1.5), "cpu", load_model("gpt2-124m")).device.framework_overhead_gib == 1.5


def _sweeps(intra_gbps: float, inter_gbps: float):
    from planner.specs import Collective, CollectiveSweep, TimedPoint

    pts = [TimedPoint(nbytes=1 << 20, seconds=1e-4), TimedPoint(nbytes=1 << 26, seconds=1e-3)]
    return [
        CollectiveSweep(
            collective=c,
            group_size=n,
            inter_node=inter,
            points=pts,
            latency_us=10.0,
            bandwidth_gbps=bw,
            max_relative_error=0.01,
        )
        for c in Collective
        for n, inter, bw in ((4, False, intra_gbps), (8, True, inter_gbps))
    ]


@pytest.mark.parametrize("inter_gbps,domain", [(700.0, True), (45.0, False)])
def test_hosts_on_one_nvlink_fabric_are_written_as_one_domain(inter_gbps, domain):
    """Two hosts of 4 GPUs: where collectives across them run at NVLink speed (a GB200 NVL72
    rack's trays) the profile says one scale-up domain of 8 and takes the network beyond it from
    the part's preset; where they run at NIC speed (45 of 720 GB/s) the hosts stay two nodes."""
    from planner.profiler.profile import DOMAIN_SHARE, assemble, shared_domain_share
    from planner.specs import MatmulPoint, ProfileEnvironment

    env = ProfileEnvironment(
        torch_version="2.13",
        backend="nccl",
        device_type="cuda",
        device_name="NVIDIA GB200",
        dtype=DType.bf16,
        world_size=8,
        nproc_per_node=4,
        nnodes=2,
        date="2026-12-03",
        hostname="h",
        quick=True,
    )
    sweeps = _sweeps(720.0, inter_gbps)
    assert shared_domain_share(sweeps) == pytest.approx(inter_gbps / 720.0)
    gemm = MatmulPoint(n=8192, flops=2.0 * 8192**3, seconds=2.0 * 8192**3 / 1800e12, tflops=1800.0)
    result = {
        "env": env,
        "per_rank": [([], [gemm], 3000.0, 180.0, 1.0)] * 8,
        "sweeps": sweeps,
        "overlap": 1.0,
        "stacks": [],
    }
    c = assemble(result, "gb200-measured", load_model("gpt2-124m"))
    assert (c.domain_gpus == 8) is domain and (inter_gbps / 720.0 >= DOMAIN_SHARE) is domain
    if domain:
        assert c.inter_node == load_cluster("gb200-nvl72").inter_node and "scale-up domain" in c.source
    else:
        assert c.domain_gpus == 4 and c.inter_node.fit("all_reduce", 8).bandwidth_gbps == 45.0
    cpu = assemble(
        {**result, "env": env.model_copy(update={"device_type": "cpu", "device_name": "cpu"})},
        "cpu",
        load_model("gpt2-124m"),
    )
    assert cpu.domain_gpus == 4  # gloo on CPUs: no NVLink to find
