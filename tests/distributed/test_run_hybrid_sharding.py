"""`plan run` of hybrid-sharded plans (Plan.dp_shard: dp = replicas x shard group) on gloo CPU
ranks, each compared with one process; the shard groups on the mesh; what a rehearsal and a
refusal do with dp_shard.

One launch of 4 processes runs every plan (starting workers costs seconds of importing torch):
ZeRO-3, 2 and 1 with dp 4 = 2 replicas x a shard group of 2, and shard groups of one dp rank
with context parallelism (the group is the cp pair) and with tensor parallelism (FSDP2 on the
3-D (replicas, shard, tp) layout). The launch is a subprocess with a timeout and a short
process-group timeout (tests/run_helpers.py), so a hang fails the test.
"""

import json

import pytest

from tests.run_helpers import run_batch

from cost_models.compute import total_params
from planner.errors import UsageError
from planner.executor.prepare import Rehearsal, prepare_case
from planner.specs import JobSpec, ModelSpec, Plan

pytestmark = pytest.mark.distributed
torch = pytest.importorskip("torch")

GPT = ModelSpec(
    name="tiny-gpt",
    num_layers=4,
    hidden_size=64,
    num_heads=4,
    vocab_size=256,
    max_seq_len=32,
    param_dtype="fp32",
    dropout=False,
)
LLAMA = ModelSpec(
    **GPT.model_dump()
    | dict(
        name="tiny-llama",
        num_kv_heads=2,
        activation="swiglu",
        learned_position_embeddings=False,
        linear_bias=False,
        norm="rmsnorm",
        tied_embeddings=True,
    )
)
JOB = JobSpec(global_batch_size=8, seq_len=32, precision="fp32")


def _plan(**kw) -> Plan:
    p = dict(dp=1, tp=1, pp=1, micro_batch_size=1) | kw
    p.setdefault("num_micro_batches", JOB.global_batch_size // (p["dp"] * p["micro_batch_size"]))
    return Plan(**p)


# name -> (model, plan, ranks per shard group). Each runs 3 steps against the reference.
FOUR_PROCESSES = {
    "dp4 = 2 x shard 2, zero3 llama tied": (LLAMA, _plan(dp=4, dp_shard=2, zero_stage=3), 2),
    "dp4 = 2 x shard 2, zero2": (GPT, _plan(dp=4, dp_shard=2, zero_stage=2), 2),
    "dp4 = 2 x shard 2, zero1": (GPT, _plan(dp=4, dp_shard=2, zero_stage=1), 2),
    "dp2 = 2 x shard 1 x cp2, zero3": (LLAMA, _plan(dp=2, dp_shard=1, cp=2, zero_stage=3, micro_batch_size=2), 2),
    "dp2 = 2 x shard 1 x tp2, zero3": (GPT, _plan(dp=2, dp_shard=1, tp=2, zero_stage=3, micro_batch_size=2), 1),
}


@pytest.fixture(scope="module")
def four(tmp_path_factory):
    docs = [
        {
            "model": json.loads(m.model_dump_json()),
            "job": json.loads(JOB.model_dump_json()),
            "plan": json.loads(p.model_dump_json()),
        }
        for m, p, _ in FOUR_PROCESSES.values()
    ]
    return dict(zip(FOUR_PROCESSES, run_batch(tmp_path_factory.mktemp("four"), docs, 4)))


@pytest.mark.parametrize("name", list(FOUR_PROCESSES))
def test_hybrid_plans_match_the_single_process_run(four, name):
    report = four[name]
    v = report["verification"]
    assert report["verdict"] == "pass", v["message"]
    assert report["plan"]["dp_shard"] == FOUR_PROCESSES[name][1].dp_shard
    assert len(v["losses"]) == 3 and v["max_loss_rel_error"] <= 1e-5 and v["max_grad_norm_rel_error"] <= 1e-5
    assert v["losses"][0] != v["losses"][-1]  # the run trained


@pytest.mark.parametrize("name", list(FOUR_PROCESSES))
def test_the_model_states_are_sharded_within_the_shard_group_only(four, name):
    """Adam's two fp32 moments (8 bytes a parameter) of a rank are the model's over tp x the
    shard group's ranks, not over all of dp x cp (which would be half of it here); so are the
    fp32 gradients with ZeRO-2/3 (ZeRO-1 keeps them whole, over tp only)."""
    model, plan, group = FOUR_PROCESSES[name]
    params = total_params(model) / plan.tp
    grads = 4 * params / (group if plan.zero_stage >= 2 else 1)
    for rank in four[name]["ranks"]:
        assert rank["memory"]["optimizer_states_bytes"] == pytest.approx(8 * params / group, rel=0.02), rank
        assert rank["memory"]["gradients_bytes"] == pytest.approx(grads, rel=0.02), rank


@pytest.mark.parametrize(
    "plan",
    [
        _plan(dp=4, dp_shard=2, zero_stage=3),
        _plan(dp=4, dp_shard=2, cp=2, tp=2, zero_stage=1, mesh_order=["tp", "dp", "pp"]),
        _plan(dp=4, dp_shard=2, cp=2, pp=2, zero_stage=2, mesh_order=["pp", "dp", "tp"]),
    ],
)
def test_a_shard_group_is_the_innermost_ranks_of_the_dp_axis(plan):
    """build_mesh on a fake process group, as each rank in turn: the shard group is the
    dp_shard x cp ranks of the replica group (dp x cp, cp innermost) that sit together, the
    replicas are its copies, and FSDP2's 2-D mesh is (replicas, shard group)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from planner.executor.parallelize import build_mesh, fsdp_mesh, place, replica_mesh, shard_mesh

    group = plan.layout.shard_dp * plan.cp
    if dist.is_initialized():
        dist.destroy_process_group()
    for r in range(plan.world_size):
        dist.init_process_group("fake", rank=r, world_size=plan.world_size, store=FakeStore())
        try:
            mesh = build_mesh(plan, "cpu")
            where = place(mesh, plan)
            replicas = replica_mesh(mesh, plan).mesh.flatten().tolist()  # in dp x cp order
            mine = replicas.index(r)
            assert mine == where.dp * plan.cp + where.cp
            start = mine // group * group
            assert shard_mesh(mesh, plan).mesh.tolist() == replicas[start : start + group]
            two_d = fsdp_mesh(mesh, plan)
            assert two_d.mesh.tolist() == [replicas[i : i + group] for i in range(0, len(replicas), group)]
        finally:
            dist.destroy_process_group()


def test_a_rehearsal_keeps_the_shard_group_where_it_divides_the_rehearsal_dp():
    plan = _plan(dp=8, dp_shard=2, zero_stage=3)
    kept = prepare_case(GPT, JOB, plan, Rehearsal(dp=4))
    assert (kept.plan.dp, kept.plan.dp_shard) == (4, 2)
    assert "dp 4 (shard 2 x 2 replicas) x tp 1 x pp 1 = 4 processes" in kept.notes[0]
    whole = prepare_case(GPT, JOB, plan, Rehearsal(dp=2))  # a shard group of all of dp: no replicas
    assert (whole.plan.dp, whole.plan.dp_shard) == (2, None)
    wider = prepare_case(GPT, JOB, _plan(dp=8, dp_shard=4, zero_stage=1), Rehearsal(dp=6))
    assert (wider.plan.dp, wider.plan.dp_shard) == (6, 2)
    assert any(
        "dp_shard 4 does not divide the rehearsal's dp 6; ZeRO-1 shards over 2 (3 replicas)" in n for n in wider.notes
    )


def test_expert_parallelism_with_hybrid_sharding_is_refused_in_one_line():
    moe = ModelSpec(**LLAMA.model_dump() | dict(name="tiny-moe", num_experts=4, experts_per_token=2))
    with pytest.raises(UsageError) as err:
        prepare_case(moe, JOB, _plan(dp=4, dp_shard=2, ep=2, zero_stage=1))
    message = str(err.value)
    assert "\n" not in message and "ep=2 with dp_shard 2 of dp 4" in message and "leave dp_shard out" in message
