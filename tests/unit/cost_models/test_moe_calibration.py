"""The published mixture-of-experts runs of benchmarks/published_cases.py: each maps to a plan
the planner accepts for its model, job and GPU count, and is predicted to fit its GPUs (the
rule tests/unit/cost_models/test_calibration.py applies to the dense runs). Every MoE record is either a case
or excluded with a reason, and the excluded ones say why in words a reader can check.
"""

import pytest

from benchmarks.published_cases import cases, load_records
from cost_models.estimate import estimate

ALL, SKIPPED = cases()
MOE = [c for c in ALL if c.model.is_moe]
MOE_RECORDS = [r for r in load_records() if r["model"].get("num_experts")]
GPUS = {r["name"]: r["hardware"]["count"] for r in MOE_RECORDS}


def test_moe_records_are_cases_or_excluded_with_a_reason():
    named = {c.name for c in MOE} | {name for name, _ in SKIPPED}
    assert {r["name"] for r in MOE_RECORDS} <= named
    # Guards against a mapping change that silently drops every run: the bf16 runs with a full
    # layout (dgxc DeepSeek-V3, ModelZoo Qwen3-235B, Megatron-Bridge GPT-OSS and Qwen3-30B) stay in.
    assert len({c.group for c in MOE}) >= 4 and len(MOE) >= 12


@pytest.mark.parametrize("case", MOE, ids=lambda c: c.name[:60])
def test_moe_run_maps_to_a_valid_plan(case):
    case.plan.validate_for(case.model, case.job, num_gpus=GPUS[case.name])
    assert case.plan.ep > 1, "an expert-parallel run planned without expert parallelism"
    assert case.model.num_experts % case.plan.ep == 0


@pytest.mark.parametrize("case", MOE, ids=lambda c: c.name[:60])
def test_moe_run_fits_its_gpus(case):
    """A run that ran is predicted to fit its GPUs."""
    from tests.unit.cost_models.test_calibration import KNOWN_MISSES

    est = estimate(case.model, case.cluster, case.job, case.plan)
    assert est.peak_memory_gib <= est.memory_capacity_gib * KNOWN_MISSES.get(case.name, 1.0), (
        f"{case.name}: {est.peak_memory_gib:.1f} of {est.memory_capacity_gib} GiB"
    )


@pytest.mark.parametrize(
    "fragment, reason",
    [
        ("(tokendrop) precision not stated", "precision not stated"),
        ("1F1B A2A overlap", "EP all-to-all overlapped with another micro-batch (1F1B merge): not modelled"),
        ("TP2 PP32 EP8", "more pipeline stages than layers"),
        ("MoE Parallel Folding", "micro-batch size or virtual pipeline size not stated"),
        ("NeMo AutoModel Qwen3 MoE 30B", "a benchmark gate sending each token to k consecutive experts"),
    ],
)
def test_moe_exclusions_name_their_reason(fragment, reason):
    reasons = [why for name, why in SKIPPED if fragment in name]
    assert reasons and all(why.startswith(reason) for why in reasons), reasons


def test_each_moe_case_dispatches_as_its_recipe_does():
    """DeepEP where the recipe runs it (the Megatron-Core MoE model zoo), the all-to-all dispatcher
    elsewhere (dgxc-benchmarking's DeepSeek-V3 recipe, Megatron-Bridge's GPT-OSS): a record's notes
    that merely name DeepEP must not switch its dispatcher."""
    by_group = {}
    for c in MOE:
        by_group.setdefault(c.group, set()).add(c.job.moe_dispatcher)
    assert by_group["modelzoo_qwen3_h100"] == {"deepep"}
    assert by_group["dgxc_moe_h100_2505"] == {"alltoall"}
    assert by_group["bridge_moe_h100"] == {"alltoall"}
