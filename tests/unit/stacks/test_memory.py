"""Model-state memory as each training stack allocates it (cost_models/memory.py:STATE_RECIPES),
against the stacks' own published per-parameter formulas and, where the package installs here,
their own estimator functions."""

from __future__ import annotations

from fractions import Fraction as Fr

import pytest

from cost_models import memory, tables
from planner import stacks
from hardware_profiles import load_cluster
from planner.presets import load_model
from planner.specs import DType, JobSpec, Optimizer, Plan

PSI = 7_000_000_000
STACKS = ("generic", "megatron", "deepspeed", "torchtitan", "accelerate")


def per_param(recipe, zero, d, precision=DType.bf16, optimizer=Optimizer.adam) -> float:
    return sum(memory.model_state_bytes(PSI, d, zero, precision, optimizer, recipe)) / PSI


def test_every_stack_names_a_recipe():
    assert {stacks.get(s).model_states for s in STACKS} <= set(memory.STATE_RECIPES)
    assert {stacks.get(s).model_states for s in STACKS} == {"zero", "megatron", "deepspeed", "fsdp2", "accelerate"}
    with pytest.raises(ValueError, match="unknown model-state recipe"):
        memory.state_parts("jax", 0, DType.bf16, Optimizer.adam)


@pytest.mark.parametrize("d", [1, 2, 8, 64, 1024])
@pytest.mark.parametrize(
    "precision,plain,distributed",
    [
        # Megatron-LM docs/source/api-guide/dist_optimizer.md, bytes per parameter:
        # (parameter, gradient) dtypes -> non-distributed, distributed optimizer
        (DType.bf16, lambda d: 18, lambda d: 6 + Fr(12, d)),  # bf16 param, fp32 grads
        (DType.fp16, lambda d: 20, lambda d: 4 + Fr(16, d)),  # fp16 param, fp16 grads
        (DType.fp32, lambda d: 16, lambda d: 8 + Fr(8, d)),  # fp32 param, fp32 grads
    ],
)
def test_megatron_distributed_optimizer_table(d, precision, plain, distributed):
    assert per_param("megatron", 0, d, precision) == pytest.approx(float(plain(d)))
    assert per_param("megatron", 1, d, precision) == pytest.approx(float(distributed(d)))


@pytest.mark.parametrize("d", [1, 8, 64, 1024])
def test_megatron_grad_reduce_in_bf16(d):
    """--grad-reduce-in-bf16: a 16-bit gradient buffer, 4 + 12/d."""
    assert per_param("megatron_bf16_grads", 1, d) == pytest.approx(4 + 12 / d)
    assert per_param("megatron_bf16_grads", 0, d) == pytest.approx(16)


@pytest.mark.parametrize("d", [1, 8, 64, 1024])
def test_deepspeed_zero_family(d):
    """DeepSpeed's 2 + 2 + 12 family with its fp32 gradient partition: ZeRO-0 16 (the ZeRO paper's),
    ZeRO-1 4 + 16/d, ZeRO-2 2 + 18/d, ZeRO-3 18/d (its estimators' multipliers)."""
    assert per_param("deepspeed", 0, d) == pytest.approx(16)
    assert per_param("deepspeed", 1, d) == pytest.approx(4 + 16 / d)
    assert per_param("deepspeed", 2, d) == pytest.approx(2 + 18 / d)
    assert per_param("deepspeed", 3, d) == pytest.approx(18 / d)


@pytest.mark.parametrize("d", [2, 8, 64])
def test_fsdp2_sharded_fp32_parameters(d):
    """FSDP2 with MixedPrecisionPolicy(param_dtype=bf16): the shards are the fp32 parameters,
    fp32 gradients, Adam's two moments: 16/d, no separate master copy; ZeRO-2 keeps the unsharded
    bf16 copy (2) besides; torchtitan at ZeRO-0 shards over 1 rank: 16."""
    assert per_param("fsdp2", 3, d) == pytest.approx(16 / d)
    assert per_param("fsdp2", 2, d) == pytest.approx(2 + 16 / d)
    assert per_param("fsdp2", 0, d) == pytest.approx(16)
    w, g, o = memory.state_parts("fsdp2", 3, DType.bf16, Optimizer.adam)
    assert (w, g, o) == ((0, 4), (0, 4), (0, 8))  # weights are the fp32 shards


@pytest.mark.parametrize("d", [2, 8, 64])
def test_accelerate_ddp_and_fsdp2(d):
    """Accelerate: ZeRO-0 is DDP under autocast, fp32 parameters (4) + their bf16 casts (2), fp32
    gradients (4) + DDP's bucket copy (4), Adam (8): 22; ZeRO-3 FSDP2's 16/d."""
    assert per_param("accelerate", 0, d) == pytest.approx(22)
    assert per_param("accelerate", 3, d) == pytest.approx(16 / d)


@pytest.mark.parametrize("d", [1, 8, 1024])
def test_zero_recipe_is_the_papers(d):
    for z, f in enumerate((16, 4 + 12 / d, 2 + 14 / d, 16 / d)):
        assert per_param("zero", z, d) == pytest.approx(f)


def test_deepspeed_estimators_agree():
    """DeepSpeed's own estimate_zero2/3_model_states_mem_needs (no offload) against ours, on the
    GPU side; the ZeRO-3 one adds 4 bytes of the largest layer, our live layer bytes."""
    stage12 = pytest.importorskip("deepspeed.runtime.zero.stage_1_and_2")
    stage3 = pytest.importorskip("deepspeed.runtime.zero.stage3")
    for gpus, nodes in ((8, 1), (8, 16), (8, 128)):
        d = gpus * nodes
        _, gpu2 = stage12.estimate_zero2_model_states_mem_needs(PSI, gpus, nodes, cpu_offload=False)
        assert sum(memory.model_state_bytes(PSI, d, 2, DType.bf16, Optimizer.adam, "deepspeed")) == pytest.approx(
            gpu2, rel=1e-9
        )
        layer = 200_000_000
        _, gpu3, _ = stage3.estimate_zero3_model_states_mem_needs(
            PSI, layer, gpus, nodes, cpu_offload=False, cpu_offload_params=False
        )
        ours = sum(memory.model_state_bytes(PSI, d, 3, DType.bf16, Optimizer.adam, "deepspeed"))
        ours += layer * memory.live_layer_bytes_per_param("deepspeed", 3, DType.bf16)
        assert ours == pytest.approx(gpu3, rel=1e-9)


def test_the_quick_start_plan_prices_megatron_fp32_grads():
    """The README's quick start on Megatron: its gradients are 4 bytes a parameter (the exported
    --bf16 without --grad-reduce-in-bf16), the optimizer 12/d."""
    model, cluster = load_model("gpt3-175b"), load_cluster("dgx-a100-80gb")
    plan = Plan(
        dp=64,
        tp=4,
        pp=4,
        vpp=8,
        micro_batch_size=1,
        num_micro_batches=24,
        schedule="interleaved-1f1b",
        zero_stage=1,
        sequence_parallel=True,
    )
    pcs = {
        t: tables.pipeline_costs(model, cluster, JobSpec(global_batch_size=1536, seq_len=2048, target=t), plan)
        for t in ("megatron", "generic")
    }
    assert pcs["megatron"].state_bytes_per_param == pytest.approx((2, 4, 12 / 64))
    assert pcs["generic"].state_bytes_per_param == pytest.approx((2, 2, 12 / 64))
    from planner.stacks import export

    args = export("megatron", plan, model, JobSpec(global_batch_size=1536, seq_len=2048, target="megatron"), 1024).data
    assert "--bf16" in args and "--grad-reduce-in-bf16" not in args


def test_deepspeed_buckets_and_fsdp2_live_layers():
    """DeepSpeed ZeRO-1/2 overlap_comm: 4.5 x (reduce + allgather bucket) elements; ZeRO-3 its
    contiguous reduce bucket; FSDP2's current + prefetched bf16 layer and the layer's gradient
    with its fp32 reduce copy."""
    assert memory.bucket_bytes("deepspeed", 2, DType.bf16, 1e7, 5e8) == pytest.approx(4.5 * 2 * 1e7 * 2)
    assert memory.bucket_bytes("deepspeed", 3, DType.bf16, 1e7, 5e8) == pytest.approx(5e8 * 2)
    assert memory.bucket_bytes("megatron", 1, DType.bf16, 1e7, 5e8) == 0
    assert memory.live_layer_bytes_per_param("fsdp2", 3, DType.bf16) == 2 * 2 + 2 + 4
    assert memory.live_layer_bytes_per_param("fsdp2", 2, DType.bf16) == 2 + 4
    assert memory.live_layer_bytes_per_param("megatron", 1, DType.bf16) == 0
