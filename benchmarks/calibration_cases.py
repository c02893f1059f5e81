"""Published training runs as (model, cluster, job, plan) cases for the cost model.

Each case names a record of benchmarks/data/calibration_runs.json (every record cites its
source) and says how we read
it: which preset stands for the hardware, which of our knobs stand for the run's
settings, and which published metric to compare. Runs outside what the cost model
covers (V100 without a preset, Float8, torch.compile, context parallelism) are listed
in EXCLUDED with the reason.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from cost_models.estimate import estimate
from hardware_profiles import load_cluster
from planner.presets import load_model
from planner.specs import Estimate, JobSpec, Plan

DATA = Path(__file__).resolve().parent / "data" / "calibration_runs.json"


@dataclass(frozen=True)
class Case:
    record: str  # `name` of the record in calibration_runs.json
    model: str
    cluster: str
    job: dict
    plan: dict
    metric: str  # our Estimate field compared with the published one
    published_key: str  # key under the record's `result`
    per_gpu_tokens: bool = False  # published tokens/s are per GPU
    note: str = ""
    tags: tuple = field(default=())


def _half(layers: int) -> list:
    # torchtitan "selective layer" AC (ac_freq 2): every second block fully checkpointed.
    # torchtitan "selective op" AC saves matmul outputs except every second matmul and
    # recomputes the rest: about half a forward per layer, so it is costed the same way (the
    # published MFUs of the two agree within 3%).
    return [{"none": layers // 2, "full": layers - layers // 2}]


CASES: list[Case] = [
    Case(
        "BLOOM-176B (tr11) on 384 A100 80GB, steady state GBS=2048",
        "bloom-176b", "dgx-a100-80gb",
        dict(global_batch_size=2048, seq_len=2048, flash_attention=False),
        dict(dp=8, tp=4, pp=12, micro_batch_size=2, num_micro_batches=128, recompute="full", zero_stage=1),
        "hardware_tflops_per_gpu", "tflops_per_gpu",
        note="BLOOM's TFLOPs count recompute (hardware FLOPs). Jean Zay's Omni-Path network is slower than the DGX HDR preset.",
    ),
    Case(
        "GPT-NeoX-20B on 96 A100 40GB",
        "gpt-neox-20b", "dgx-a100-40gb",
        dict(global_batch_size=1536, seq_len=2048, precision="fp16", flash_attention=False),
        dict(dp=12, tp=2, pp=4, micro_batch_size=4, num_micro_batches=32, recompute="full", zero_stage=1),
        "hardware_tflops_per_gpu", "tflops_per_gpu",
        note="117 TFLOP/s from the paper's notes; Megatron-style accounting with recompute.",
    ),
    Case(
        "torchtitan Llama 3 8B, 64 A100, FSDP2, local batch 1, AC selective layer",
        "llama3-8b", "dgx-a100-80gb",
        dict(global_batch_size=64, seq_len=8192),
        dict(dp=64, tp=1, pp=1, micro_batch_size=1, num_micro_batches=1, zero_stage=3, stage_recompute=_half(32)),
        "mfu", "mfu",
    ),
    Case(
        "torchtitan Llama 3 8B, 64 A100, FSDP2, local batch 1, AC selective op",
        "llama3-8b", "dgx-a100-80gb",
        dict(global_batch_size=64, seq_len=8192),
        dict(dp=64, tp=1, pp=1, micro_batch_size=1, num_micro_batches=1, zero_stage=3, stage_recompute=_half(32)),
        "mfu", "mfu",
    ),
    Case(
        "torchtitan Llama 3 70B, 64 A100, FSDP2, local batch 1, AC full",
        "llama3-70b", "dgx-a100-80gb",
        dict(global_batch_size=64, seq_len=8192),
        dict(dp=64, tp=1, pp=1, micro_batch_size=1, num_micro_batches=1, zero_stage=3, recompute="full"),
        "mfu", "mfu",
    ),
    Case(
        "torchtitan Llama 2 13B, 64 A100, FSDP2, local batch 2, AC none",
        "llama2-13b", "dgx-a100-80gb",
        dict(global_batch_size=128, seq_len=4096),
        dict(dp=64, tp=1, pp=1, micro_batch_size=2, num_micro_batches=1, zero_stage=3, recompute="none"),
        "mfu", "mfu",
    ),
    Case(
        "torchtitan Llama 2 13B, 64 A100, FSDP2, local batch 2, AC selective layer",
        "llama2-13b", "dgx-a100-80gb",
        dict(global_batch_size=128, seq_len=4096),
        dict(dp=64, tp=1, pp=1, micro_batch_size=2, num_micro_batches=1, zero_stage=3, stage_recompute=_half(40)),
        "mfu", "mfu",
    ),
    Case(
        "torchtitan Llama 2 13B, 64 A100, FSDP2, local batch 2, AC selective op",
        "llama2-13b", "dgx-a100-80gb",
        dict(global_batch_size=128, seq_len=4096),
        dict(dp=64, tp=1, pp=1, micro_batch_size=2, num_micro_batches=1, zero_stage=3, stage_recompute=_half(40)),
        "mfu", "mfu",
    ),
    Case(
        "torchtitan Llama 2 70B, 64 A100, FSDP2, local batch 1, AC selective op",
        "llama2-70b", "dgx-a100-80gb",
        dict(global_batch_size=64, seq_len=4096),
        dict(dp=64, tp=1, pp=1, micro_batch_size=1, num_micro_batches=1, zero_stage=3, stage_recompute=_half(80)),
        "mfu", "mfu",
    ),
    Case(
        "torchtitan Llama 2 70B, 64 A100, FSDP2, local batch 2, AC full",
        "llama2-70b", "dgx-a100-80gb",
        dict(global_batch_size=128, seq_len=4096),
        dict(dp=64, tp=1, pp=1, micro_batch_size=2, num_micro_batches=1, zero_stage=3, recompute="full"),
        "mfu", "mfu",
    ),
    Case(
        "torchtitan Llama 3.1 8B, 8 H100, FSDP",
        "llama3-8b", "dgx-h100-80gb",
        dict(global_batch_size=16, seq_len=8192),
        dict(dp=8, tp=1, pp=1, micro_batch_size=2, num_micro_batches=1, zero_stage=3, stage_recompute=_half(32)),
        "tokens_per_s", "tokens_per_sec_per_gpu", per_gpu_tokens=True,
        note="A 500 W H100 (HBM2e) against the 700 W SXM preset: the preset should predict faster.",
        tags=("h100-500w",),
    ),
    Case(
        "torchtitan Llama 3.1 8B, 128 H100, FSDP",
        "llama3-8b", "dgx-h100-80gb",
        dict(global_batch_size=256, seq_len=8192),
        dict(dp=128, tp=1, pp=1, micro_batch_size=2, num_micro_batches=1, zero_stage=3, stage_recompute=_half(32)),
        "tokens_per_s", "tokens_per_sec_per_gpu", per_gpu_tokens=True,
        note="A 500 W H100 (HBM2e) against the 700 W SXM preset: the preset should predict faster.",
        tags=("h100-500w",),
    ),
]

# Memory comparisons: torchtitan reports peak memory per GPU.
MEMORY_CASES: list[Case] = [
    Case(c.record, c.model, c.cluster, c.job, c.plan, "peak_memory_gib", "peak_memory_gib", note=c.note, tags=c.tags)
    for c in CASES
    if c.record.startswith("torchtitan Llama 3.1 8B")
]

EXCLUDED = {
    "megatron_2019": "V100 (DGX-2H): no preset for that GPU",
    "Float8": "Float8 / torch.compile runs: the cost model covers bf16/fp16 without compiler fusion",
    "CP": "context parallelism is not part of the search space",
}


@dataclass(frozen=True)
class Comparison:
    case: Case
    published: float
    predicted: float
    estimate: Estimate

    @property
    def ratio(self) -> float:
        return self.predicted / self.published


def load_records(path: Path = DATA) -> dict[str, dict]:
    return {r["name"]: r for r in json.loads(path.read_text())}


def run_case(case: Case, records: Optional[dict] = None) -> Comparison:
    records = records or load_records()
    rec = records[case.record]
    model, cluster = load_model(case.model), load_cluster(case.cluster)
    job = JobSpec(**case.job)
    plan = Plan(**case.plan)
    est = estimate(model, cluster, job, plan)
    predicted = getattr(est, case.metric)
    if case.per_gpu_tokens:
        predicted /= plan.world_size
    return Comparison(case, float(rec["result"][case.published_key]), predicted, est)
