"""The 2026 rental presets (B200, GB200 NVL72, B300, GB300 NVL72, MI300X, MI325X, MI355X): each cited figure as
written, a small solve on each, GB200's NVLink domain as one node, and the uncalibrated
intervals (hardware_profiles.UNCALIBRATED)."""

import json

import pytest

import planner
from hardware_profiles import (
    UNCALIBRATED,
    UNCALIBRATED_WIDENING,
    cluster_presets,
    load_cluster,
    uncalibrated_entry,
    uncalibrated_reason,
    widened,
)
from planner.specs import StackConstants, Target
from tests.paths import ROOT

NEW = ("dgx-b200", "gb200-nvl72", "dgx-b300", "gb300-nvl72", "mi300x", "mi325x", "mi355x")
STACKS_DIR = ROOT / "planner" / "stacks"

# (preset, field, value, source): the value each preset's "source" text cites.
CITED = [
    (
        "dgx-b200",
        "bf16",
        2250,
        "DGX B200 datasheet (72 PF FP8 sparse / 8 / 2 x 1/2); HGX B200 at 1,000 W: 2,250 dense BF16",
    ),
    ("dgx-b200", "fp8", 4500, "DGX B200 datasheet: 72 PFLOP/s FP8 per 8 GPUs, sparse; halved"),
    ("dgx-b200", "memory_gbps", 8000, "DGX B200 datasheet: 64 TB/s over 8 GPUs"),
    ("dgx-b200", "memory_gib", 179.1, "180 GB (1,440 GB / 8) x 79.6/80"),
    ("dgx-b200", "sm_count", 148, "B200 device queries"),
    ("dgx-b200", "gemm_eff", 0.776, "ml-engineering MAMF: 1,745.0 / 2,250"),
    ("dgx-b200", "fp8_eff", 0.763, "ml-engineering MAMF FP8: 3,432.5 / 4,500"),
    ("dgx-b200", "cudnn_fwd", 0.55, "FlashAttention-4: 1,605 TFLOP/s on B200 / 1.3 over cuDNN 9.13 / 2,250"),
    ("dgx-b200", "intra_ar_gbps", 720, "NVLink 5 900 GB/s per direction x the H100 preset's 80%"),
    ("dgx-b200", "inter_ar_gbps", 45, "8 x ConnectX-7 400 Gb/s, ~90% of 50 GB/s"),
    ("gb200-nvl72", "gpus_per_node", 4, "GB200 NVL72: compute trays of 4 GPUs"),
    ("gb200-nvl72", "domain_gpus", 72, "GB200 NVL72: 72 GPUs on one NVLink Switch fabric"),
    ("gb200-nvl72", "bf16", 2500, "GB200 NVL72 specifications: 360 PF FP16/BF16 sparse / 72 / 2"),
    ("gb200-nvl72", "fp8", 5000, "GB200 NVL72 specifications: 720 PF FP8 sparse / 72 / 2"),
    ("gb200-nvl72", "memory_gbps", 8000, "GB200 NVL72: 576 TB/s / 72"),
    ("gb200-nvl72", "memory_gib", 185.1, "186 GB x 79.6/80"),
    ("gb200-nvl72", "gemm_eff", 0.729, "ml-engineering MAMF: 1,822.0 / 2,500"),
    ("gb200-nvl72", "fp8_eff", 0.723, "ml-engineering MAMF FP8: 3,615.6 / 5,000"),
    ("gb200-nvl72", "intra_ar_gbps", 720, "NVLink 5, as dgx-b200"),
    ("gb200-nvl72", "inter_ar_gbps", 45, "one 400 Gb/s ConnectX-7 per GPU"),
    ("dgx-b300", "bf16", 2250, "HGX B300 specifications: 36 PF FP16/BF16 sparse / 8 / 2"),
    ("dgx-b300", "fp8", 4500, "HGX B300 specifications: 72 PF FP8 sparse / 8 / 2"),
    ("dgx-b300", "memory_gbps", 8000, "HGX B300: up to 8 TB/s per GPU"),
    ("dgx-b300", "memory_gib", 286.6, "288 GB x 79.6/80"),
    ("dgx-b300", "gemm_eff", 0.776, "no B300 MAMF figure: dgx-b200's, same dense rates"),
    ("dgx-b300", "intra_ar_gbps", 720, "NVLink 5, as dgx-b200"),
    ("dgx-b300", "inter_ar_gbps", 90, "one 800 Gb/s ConnectX-8 per GPU, ~90% of 100 GB/s"),
    ("dgx-b300", "gpus_per_node", 8, "HGX B300: 8 GPUs"),
    ("gb300-nvl72", "gpus_per_node", 4, "GB300 NVL72: compute trays of 4 GPUs"),
    ("gb300-nvl72", "domain_gpus", 72, "GB300 NVL72: 72 GPUs on one NVLink Switch fabric"),
    ("gb300-nvl72", "bf16", 2500, "GB300 NVL72 specifications: 360 PF FP16/BF16 sparse / 72 / 2"),
    ("gb300-nvl72", "fp8", 5000, "GB300 NVL72 specifications: 720 PF FP8 sparse / 72 / 2"),
    ("gb300-nvl72", "memory_gbps", 8000, "GB300 NVL72: 576 TB/s / 72"),
    ("gb300-nvl72", "memory_gib", 286.6, "20.7 TB / 72 = 288 GB x 79.6/80"),
    ("gb300-nvl72", "gemm_eff", 0.897, "gb200-nvl72's 0.729 x 1.23, GB300 / GB200 GPT-OSS 120B on the same recipe"),
    ("gb300-nvl72", "fp8_eff", 0.889, "gb200-nvl72's 0.723 x 1.23"),
    ("gb300-nvl72", "cudnn_fwd", 0.676, "gb200-nvl72's 0.55 x 1.23"),
    ("gb300-nvl72", "inter_ar_gbps", 90, "72 ConnectX-8 800 Gb/s per rack, one per GPU"),
    ("mi300x", "bf16", 1307.4, "AMD MI300X specifications (dense)"),
    ("mi300x", "fp8", 2614.9, "AMD MI300X specifications (dense)"),
    ("mi300x", "memory_gbps", 5300, "AMD MI300X specifications: 5.3 TB/s"),
    ("mi300x", "memory_gib", 191.0, "192 GB x 79.6/80"),
    ("mi300x", "sm_count", 304, "304 CUs"),
    ("mi300x", "gemm_eff", 0.511, "ml-engineering MAMF: 668.4 / 1,307.4"),
    ("mi300x", "intra_ar_gbps", 302.4, "7 xGMI links x 48 GB/s usable (AMD ROCm blog) x 90%"),
    ("mi300x", "p2p_gbps", 43.2, "one xGMI link: 48 x 90%"),
    ("mi325x", "bf16", 1307.4, "AMD MI325X specifications: MI300X's compute"),
    ("mi325x", "fp8", 2614.9, "AMD MI325X specifications"),
    ("mi325x", "memory_gbps", 6000, "AMD MI325X specifications: 6 TB/s"),
    ("mi325x", "memory_gib", 254.7, "256 GB x 79.6/80"),
    ("mi325x", "gemm_eff", 0.600, "ml-engineering MAMF: 784.9 / 1,307.4"),
    ("mi355x", "bf16", 2516.6, "AMD MI355X specifications 2.5 PF; clock formula 2,400 MHz x 1,024 x 512 x 2"),
    ("mi355x", "fp8", 5033.2, "AMD MI355X specifications 5.0 PF OCP-FP8 dense; 2 x bf16"),
    ("mi355x", "memory_gbps", 8000, "AMD MI355X specifications: 8 TB/s"),
    ("mi355x", "memory_gib", 286.6, "288 GB x 79.6/80"),
    ("mi355x", "sm_count", 256, "256 CUs (8 XCDs x 32)"),
    ("mi355x", "gemm_eff", 0.622, "ml-engineering MAMF: 1,565.0 / 2,516.6"),
    ("mi355x", "intra_ar_gbps", 362.9, "7 xGMI links x 153.6/2 x 75% usable x 90%"),
]


def _field(c, field):
    d = c.device
    return {
        "bf16": lambda: d.peak_tflops["bf16"],
        "fp8": lambda: d.fp8_peak_tflops,
        "memory_gbps": lambda: d.memory_bandwidth_gbps,
        "memory_gib": lambda: d.memory_gib,
        "sm_count": lambda: d.gemm.sm_count,
        "gemm_eff": lambda: d.gemm.max_efficiency,
        "fp8_eff": lambda: d.gemm.fp8_max_efficiency,
        "cudnn_fwd": lambda: d.attention["cudnn"].forward,
        "intra_ar_gbps": lambda: c.intra_node.fit("all_reduce", 8).bandwidth_gbps,
        "inter_ar_gbps": lambda: c.inter_node.fit("all_reduce", 2).bandwidth_gbps,
        "p2p_gbps": lambda: c.intra_node.fit("p2p", 2).bandwidth_gbps,
        "gpus_per_node": lambda: c.gpus_per_node,
        "domain_gpus": lambda: c.domain_gpus,
    }[field]()


def test_the_new_presets_load_and_are_listed():
    assert set(NEW) <= set(cluster_presets()) and set(NEW) == UNCALIBRATED
    for name in NEW:
        c = load_cluster(name)
        assert c.name == name and "UNCALIBRATED" in c.source
        assert c.device.fp8_peak_tflops == pytest.approx(
            2 * c.device.peak_tflops["bf16"], abs=0.2
        )  # FP8, dense: 2x bf16


@pytest.mark.parametrize("name,field,value,source", CITED, ids=[f"{n}-{f}" for n, f, _, _ in CITED])
def test_each_cited_figure_is_the_one_written(name, field, value, source):
    assert _field(load_cluster(name), field) == pytest.approx(value, abs=1e-9), source


def test_amd_mesh_bandwidth_grows_with_the_links_a_group_uses():
    """A full mesh: a ring of n GPUs uses n - 1 links each, so TP 2 is one link's worth."""
    c = load_cluster("mi300x")
    bw = [c.intra_node.fit("all_reduce", n).bandwidth_gbps for n in (2, 4, 8)]
    assert bw == pytest.approx([43.2, 129.6, 302.4], abs=0.06)
    assert "cudnn" not in c.device.attention  # no cuDNN on ROCm: megatron is costed at flash2's efficiency


@pytest.mark.slow
@pytest.mark.parametrize("name", NEW)
def test_a_small_solve_is_plausible(name):
    doc = planner.solve("llama3-8b", name, gpus=16, global_batch=64, seq_len=4096, target="megatron")
    assert 0.2 < doc.estimate.mfu < 0.7, doc.estimate.mfu
    lo, hi = doc.estimate.step_time_interval_s
    assert lo < doc.estimate.step_time_s < hi


@pytest.mark.parametrize("name", ["gb200-nvl72", "dgx-b200", "gb300-nvl72", "dgx-b300"])
def test_fp8_estimates_on_the_new_nvidia_presets(name):
    base = planner.estimate("llama3-8b", name, gpus=8, global_batch=32, seq_len=4096, tp=2, target="megatron")
    fp8 = planner.estimate("llama3-8b", name, gpus=8, global_batch=32, seq_len=4096, tp=2, target="megatron", fp8=True)
    assert fp8.estimate.time_breakdown_s.compute < base.estimate.time_breakdown_s.compute


def test_fp8_estimates_on_amd():
    doc = planner.estimate(
        "llama3-8b", "mi300x", gpus=8, global_batch=32, seq_len=4096, tp=2, target="megatron", fp8=True
    )
    assert doc.plan.fp8 and doc.estimate.fits


def _slow_nics(cluster, factor=10.0):
    inter = cluster.inter_node
    fits = [f.model_copy(update={"bandwidth_gbps": f.bandwidth_gbps / factor}) for f in inter.collectives]
    return cluster.model_copy(update={"inter_node": inter.model_copy(update={"collectives": fits})})


def _tp(cluster, tp):
    doc = planner.estimate(
        "gpt3-175b", cluster, gpus=tp, global_batch=tp, seq_len=2048, tp=tp, recompute="full", target="megatron"
    )
    return doc.estimate.time_breakdown_s.tp_communication


def test_gb200_prices_tp_inside_its_nvlink_domain():
    """TP 24 is inside one NVL72 domain (72 GPUs a "node"): NVLink figures, untouched by the
    NICs; on dgx-b200 (8 GPUs a node) it crosses nodes and rides the NICs too."""
    gb200, b200 = load_cluster("gb200-nvl72"), load_cluster("dgx-b200")
    assert _tp(gb200, 24) == pytest.approx(_tp(_slow_nics(gb200), 24), rel=1e-12)
    assert _tp(_slow_nics(b200), 24) > 1.5 * _tp(b200, 24)
    assert _tp(gb200, 24) < _tp(b200, 24)


def test_gb200_tp16_straddles_racks_as_the_preset_says():
    """Groups tile the whole 72-GPU domain: 16 does not divide 72, so one TP-16 group in five
    straddles two racks and TP 16 is priced as crossing (the preset's source says so)."""
    gb200 = load_cluster("gb200-nvl72")
    assert "TP 16 is priced as crossing" in gb200.source
    assert _tp(_slow_nics(gb200), 16) > _tp(gb200, 16)


def _star(stack):
    path = STACKS_DIR / stack / "constants.json"
    return json.loads(path.read_text()).get("*") if path.exists() else None


def _calibrated(stack):
    """A stack's entry for a device its runs ran on (the H100's, else the first), before any widening;
    None for a stack without runs of its own."""
    path = STACKS_DIR / stack / "constants.json"
    if not path.exists():
        return None
    entries = {
        k: v for k, v in json.loads(path.read_text()).items() if k != "*" and not v["uncertainty"].get("widened_for")
    }
    return entries.get("H100-SXM5-80GB") or next(iter(entries.values()), None)


@pytest.mark.parametrize("name", NEW)
def test_uncalibrated_intervals_are_the_calibrated_ones_widened(name):
    """The preset's interval is dgx-h100-80gb's (the calibrated pooled one) widened, saying why;
    every stack's constants on it are its shipped ones (the "*" entry's), their interval wider than
    on any device the stack was calibrated on, saying why: never the calibrated interval on a device
    no run was measured on."""
    c = load_cluster(name)
    h100 = load_cluster("dgx-h100-80gb")
    want = {**widened(h100.uncertainty.model_dump()), "widened_for": uncalibrated_reason(c.device.name)}
    assert c.uncertainty.model_dump() == want
    assert c.uncertainty.compute == pytest.approx((1 + h100.uncertainty.compute) ** UNCALIBRATED_WIDENING - 1, abs=1e-4)
    for t in Target:
        star = _star(t.value)
        if star is None:
            assert t not in c.stack_constants
            continue
        own = c.stack_constants[t]
        assert own.sustained_fraction == star["sustained_fraction"] and "uncalibrated" in own.provenance, t
        calibrated = _calibrated(t.value)
        if calibrated is not None:
            assert own.uncertainty.compute > calibrated["uncertainty"]["compute"], t
            assert own == StackConstants.model_validate(uncalibrated_entry(calibrated, c.device.name)), t
        assert c.device.name in own.uncertainty.widened_for
        seen = c.for_target(t)  # what the cost model reads for that stack
        assert seen.uncertainty == own.uncertainty and seen.device.sustained_fraction == star["sustained_fraction"]


def test_an_uncalibrated_estimate_has_the_wider_interval():
    kw = dict(gpus=8, global_batch=32, seq_len=4096, tp=2, target="megatron")
    h100 = planner.estimate("llama3-8b", "dgx-h100-80gb", **kw).estimate
    b200 = planner.estimate("llama3-8b", "dgx-b200", **kw).estimate
    width = [hi / lo for lo, hi in (h100.step_time_interval_s, b200.step_time_interval_s)]
    assert width[1] > width[0]


def test_blackwell_ultra_against_blackwell():
    """B300 keeps B200's dense rates and efficiencies (the datasheets' figures are the same; no
    public B300 microbenchmark): a compute-bound layout inside one node estimates the same step.
    GB300's efficiencies are GB200's x 1.23 (the preset's source: GB300 / GB200 on the same
    recipe), so its compute is at most 1.23x faster and no slower. Both hold 288 GB against
    180 / 186, and their 800 Gb/s NICs give twice the bus bandwidth across nodes."""
    kw = dict(gpus=8, global_batch=32, seq_len=4096, tp=8, target="megatron")
    b200, b300, gb200, gb300 = (
        planner.estimate("llama3-8b", c, **kw).estimate for c in ("dgx-b200", "dgx-b300", "gb200-nvl72", "gb300-nvl72")
    )
    assert b300.step_time_s == pytest.approx(b200.step_time_s, rel=1e-9)
    speedup = gb200.time_breakdown_s.compute / gb300.time_breakdown_s.compute
    # below 1.23: the stack's gap per kernel (its constants, not the device's) does not shrink
    assert 1.05 < speedup <= 1.23 + 1e-9
    for old, new in ((b200, b300), (gb200, gb300)):
        assert new.memory_capacity_gib > 1.5 * old.memory_capacity_gib
    for old, new in (("dgx-b200", "dgx-b300"), ("gb200-nvl72", "gb300-nvl72")):
        ring = [load_cluster(c).inter_node.fit("all_reduce", 16).bandwidth_gbps for c in (old, new)]
        assert ring[1] == pytest.approx(2 * ring[0])
