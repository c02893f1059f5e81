"""One layout once (issue 44): a ZeRO stage over a shard group of one rank (dp x cp = 1, and no
routed experts replicated over tp / ep ranks) shards nothing, the same run as ZeRO-0; the search
enumerates it only as ZeRO-0 unless --fix pins the stage, so `plan solve`'s alternatives (and
`plan tune`'s trials, which it lists) are distinct runs."""

from __future__ import annotations

import pytest

from hardware_profiles import load_cluster
from planner import api
from planner.presets import load_model
from planner.search.candidates import DOMINATED, SearchSpace, enumerate_layouts
from planner.specs import Plan

from tests.unit.search.test_solver import MOE_SMALL

SMALL_SOLVE = dict(global_batch=8, seq_len=1024)


def as_run(plan: Plan) -> Plan:
    """A dense model's plan as it runs: ZeRO over one rank of dp x cp is ZeRO-0."""
    return plan.model_copy(update={"zero_stage": 0}) if plan.dp * plan.cp == 1 else plan


def runs(doc) -> list:
    """The recommendation's and each alternative's (stack, run)."""
    return [(doc.job.target, as_run(doc.plan))] + [
        (a.target or doc.job.target, as_run(a.plan)) for a in doc.alternatives
    ]


@pytest.mark.parametrize("gpus", [1, 2, 4])
def test_no_layout_zero_shards_one_rank(gpus):
    """Every enumerated layout of a dense model with ZeRO above 0 has a shard group of more
    than one rank; the ZeRO-0 layout at dp 1 is still there, and the skipped copies are
    counted as dominated."""
    model, cluster = load_model("gpt2-124m"), load_cluster("dgx-a100-80gb")
    layouts = enumerate_layouts(model, cluster, SearchSpace(num_gpus=gpus, global_batch_size=8))
    assert not [c for c in layouts.candidates if c.zero_stage and c.shard_dp * c.cp == 1]
    assert [c for c in layouts.candidates if c.dp == 1 and c.zero_stage == 0]
    assert layouts.rejected[DOMINATED] > 0
    every = enumerate_layouts(model, cluster, SearchSpace(num_gpus=gpus, global_batch_size=8, include_dominated=True))
    assert [c for c in every.candidates if c.zero_stage and c.dp == 1]  # brute force's space keeps them


def test_context_parallel_ranks_are_a_shard_group():
    """ZeRO shards over dp x cp: at dp 1 with cp 2 the group has two ranks, and ZeRO is searched."""
    model, cluster = load_model("gpt2-124m"), load_cluster("dgx-a100-80gb")
    space = SearchSpace(num_gpus=2, global_batch_size=8, cp_degrees=(1, 2), seq_len=1024)
    zeros = {c.zero_stage for c in enumerate_layouts(model, cluster, space).candidates if c.dp == 1 and c.cp == 2}
    assert zeros == {0, 1, 2, 3}


def test_zero_still_shards_experts_replicated_at_dp_1():
    """A MoE model at dp 1, tp 2: with ep 1 the routed experts are replicated on both TP ranks
    (an expert-DP group of two, which ZeRO shards); with ep 2 nothing is left to shard."""
    cluster = load_cluster("dgx-a100-80gb")
    space = SearchSpace(num_gpus=2, global_batch_size=4)
    found = {(c.ep, c.zero_stage) for c in enumerate_layouts(MOE_SMALL, cluster, space).candidates if c.tp == 2}
    assert {(1, z) for z in range(4)} <= found
    assert {(2, z) for z in range(4)} & found == {(2, 0)}


@pytest.mark.parametrize("gpus,target", [(1, None), (1, "generic"), (2, None), (2, "generic"), (4, "generic")])
def test_no_two_alternatives_are_the_same_run(gpus, target):
    """`plan solve`'s plan and alternatives of a small job are distinct runs: no two the same
    plan but for a ZeRO stage over a one-rank shard group (before the fix, dp 1 tp 2 at ZeRO 0, 1
    and 2 filled three of the alternatives of --gpus 2 --target generic)."""
    doc = api.solve("gpt2-124m", "dgx-a100-80gb", gpus=gpus, top_k=8, target=target, **SMALL_SOLVE)
    listed = runs(doc)
    assert len(listed) > 1
    assert len(listed) == len({(t, p.model_dump_json()) for t, p in listed}), listed


@pytest.mark.parametrize("gpus,fixes", [(1, ["zero=2"]), (2, ["zero=2", "dp=1"])])
def test_a_fixed_zero_stage_at_dp_1_is_kept(gpus, fixes):
    """--fix zero=2 at dp 1: the user asked for the stage, and gets it (not ZeRO-0)."""
    doc = api.solve("gpt2-124m", "dgx-a100-80gb", gpus=gpus, top_k=3, target="generic", fixes=fixes, **SMALL_SOLVE)
    assert doc.plan.dp == 1 and doc.plan.zero_stage == 2
    assert all(a.plan.zero_stage == 2 for a in doc.alternatives)
