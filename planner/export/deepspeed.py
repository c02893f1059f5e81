"""A plan as a DeepSpeed 0.19.8 config JSON: what `deepspeed.initialize(config=...)` reads.

Batch, precision, ZeRO with the buckets and prefetch the cost model assumes, AutoTP, activation
checkpointing and the pipeline engine's keys are DeepSpeed's own. What DeepSpeed takes in code
rather than in its JSON (PipelineModule's `num_stages` and `partition_method`, the layout, the
rank order) goes in a top-level "planner" block, which DeepSpeedConfig ignores (it reads only
the keys it knows, runtime/config.py:DeepSpeedConfig._initialize_params).

Mixture-of-experts models get DeepSpeed's AutoEP (the JSON's "expert_parallel" section,
deepspeed/module_inject/auto_ep*.py): it replaces each Hugging Face MoE block with grouped-GEMM
experts, num_experts / ep of them on each rank, tokens exchanged by all-to-all within groups of
ep consecutive data-parallel ranks of a pipeline stage (utils/groups.py
_create_expert_and_data_parallel), expert-TP 1, dropless; ZeRO shards each expert over its
expert-data-parallel group. That is the cost model's folding (cost_models/tables.py:ep_link_of).
The older deepspeed.moe.layer.MoE(ep_size=...) is model code, routes top-1 or top-2 only, drops
tokens beyond its capacity by default (drop_tokens=True) and has no ZeRO-3 (runtime/engine.py
_validate_zero3_moe_compatibility); it is not what is exported. The cost model assumes balanced
routing.

Hybrid sharding (Plan.dp_shard) is not exported: DeepSpeed 0.19.8 removed MiCS, its only
config for ZeRO-3 sharded within groups and replicated across them (DeepSpeedConfig raises for
zero_optimization.mics_shard_size: runtime/config.py:_REMOVED_ZERO_CONFIG_KEYS), so rules.py
has no hybrid ZeRO stage and `plan export` refuses such a plan in one line.

Every rule (rules.py) and key below cites the installed package's source (deepspeed/...); the
tests feed every export to deepspeed.runtime.config.DeepSpeedConfig and to DeepSpeed's own
partitioner, schedule, topology and AutoEP classes.
"""

from __future__ import annotations

import json
from typing import Any

from cost_models.compute import layer_params
from cost_models.terms import DEEPSPEED_REDUCE_BUCKET_ELEMENTS, GRADIENT_BUCKET_BYTES
from planner.specs import DTYPE_BYTES, DType, Optimizer, Recompute, Schedule
from planner.stacks.deepspeed.rules import MESH_ORDER
from planner.stacks.stack import Export, architecture

# PipelineModule(partition_method="type:REGEX") balances the layers whose class name matches
# REGEX (case-insensitive search, runtime/pipe/module.py:_find_layer_type): LlamaDecoderLayer,
# MistralDecoderLayer, Qwen2DecoderLayer, Megatron-DeepSpeed's ParallelTransformerLayerPipe.
# Another block class (GPT2Block) must be named here; a regex matching nothing fails loudly.
BLOCK_TYPE = "DecoderLayer|TransformerLayer"


def export(plan, model, job, num_gpus: int) -> Export:
    full = any(r.full for r in plan.stage_recompute_counts(model.num_layers))
    config = {
        # DeepSpeedConfig._batch_assertion: train_batch_size == micro x accumulation x DP size.
        "train_batch_size": plan.dp * plan.micro_batch_size * plan.num_micro_batches,
        "train_micro_batch_size_per_gpu": plan.micro_batch_size,
        "gradient_accumulation_steps": plan.num_micro_batches,
        **_precision(job.precision),
        "zero_optimization": _zero(plan, model, job),
    }
    if plan.zero_stage and job.optimizer == Optimizer.sgd:
        # runtime/zero/utils.py ZERO_SUPPORTED_OPTIMIZERS lists no SGD; the engine asserts unless allowed.
        config["zero_allow_untested_optimizer"] = True
    if plan.tp > 1:
        config["tensor_parallel"] = {"autotp_size": plan.tp}
    if full:
        # deepspeed.checkpointing's settings: keep each checkpointed layer input whole and on the
        # GPU, as the cost model counts it (no partitioning over TP, no CPU offload).
        config["activation_checkpointing"] = {
            "partition_activations": False,
            "cpu_checkpointing": False,
            "contiguous_memory_optimization": False,
        }
    if model.is_moe:
        config["expert_parallel"] = _expert_parallel(plan, model)
    if plan.pp > 1:
        # runtime/config.py get_pipeline_config reads this section; the pipeline engine applies
        # activation_checkpoint_interval (pipe/engine.py). "stages" and "partition" are parsed but
        # applied only by PipelineModule's constructor arguments (see the "planner" block).
        config["pipeline"] = {
            "stages": plan.pp,
            "partition": f"type:{BLOCK_TYPE}",
            "activation_checkpoint_interval": 1 if full else 0,
        }
    config["planner"] = _planner_block(plan, model, num_gpus, full)
    return Export(stack="deepspeed", text=json.dumps(config, indent=2) + "\n", data=config, kind="json")


def _expert_parallel(plan, model) -> dict:
    """AutoEP's section (module_inject/auto_ep_config.py parse_autoep_config). At ep = 1 it still
    swaps the blocks for its grouped-GEMM experts (the GEMMs the cost model prices), without the
    all-to-all."""
    section = {
        "enabled": True,
        "autoep_size": plan.ep,
        "expert_tensor_parallel_size": 1,
        "top_k": model.experts_per_token,
    }
    if plan.pp > 1:
        # AutoEP finds MoE blocks by module name (its presets: model.layers.N.mlp) and reads top-k
        # from the model's Hugging Face config; a PipelineModule registers layer i as "i"
        # (runtime/pipe/module.py _build) and has no such config.
        section["moe_layer_pattern"] = r"\d+\.mlp"
    return section


def _precision(precision: DType) -> dict:
    """bf16 / fp16 mixed precision (fp32 master weights in the ZeRO or BF16 optimizer); fp32: neither."""
    if precision == DType.bf16:
        return {"bf16": {"enabled": True}}
    if precision == DType.fp16:
        return {"fp16": {"enabled": True}}  # dynamic loss scaling (runtime/fp16 defaults)
    return {}


def _zero(plan, model, job) -> dict:
    """ZeRO settings that make DeepSpeed communicate as the cost model (cost_models/terms.py
    dp_exposure) charges: gradients reduced in GRADIENT_BUCKET_BYTES buckets beside backward
    (ZeRO-1 on the last micro-batch, ZeRO-2 on every one; at ZeRO-0, and with a pipeline, the
    engine reduces after backward whatever the config says: Stack.gradient_reduce, which the cost
    model charges as such), ZeRO-3 gathering one layer ahead
    with at most the current and the prefetched layer live (cost_models/tables.py
    zero3_gather_bytes) and reducing gradients in DeepSpeed's own default buckets
    (cost_models/terms.py DEEPSPEED_REDUCE_BUCKET_ELEMENTS, which tables.zero3_reduce_calls
    charges). DeepSpeed sizes buckets in elements of the 16-bit (or fp32) gradient."""
    if plan.zero_stage == 0:
        # Without ZeRO DeepSpeed all-reduces after backward in fixed 5e8-element buffers
        # (runtime/engine.py allreduce_gradients, MEMORY_OPT_ALLREDUCE_SIZE): nothing to set.
        return {"stage": 0}
    bucket = GRADIENT_BUCKET_BYTES // DTYPE_BYTES[job.precision]
    zero = {"stage": plan.zero_stage, "overlap_comm": True, "contiguous_gradients": True, "reduce_bucket_size": bucket}
    if plan.zero_stage < 3:
        zero |= {"reduce_scatter": True, "allgather_bucket_size": bucket}
    else:
        layer = layer_params(model, plan.tp, plan.ep).total  # one layer's parameters on this rank (its E / ep experts)
        zero |= {
            "stage3_prefetch_bucket_size": layer,
            "stage3_max_live_parameters": 2 * layer,
            "reduce_bucket_size": DEEPSPEED_REDUCE_BUCKET_ELEMENTS,
        }
    return zero


def _planner_block(plan, model, num_gpus: int, full: bool) -> dict:
    """What DeepSpeed takes in code, not in its JSON; DeepSpeedConfig ignores this key."""
    block: dict[str, Any] = {
        "about": "not read by DeepSpeed: the layout, and what to pass in code",
        "layout": {
            "dp": plan.dp,
            "tp": plan.tp,
            "pp": plan.pp,
            "ep": plan.ep,
            "world_size": num_gpus,
            "mesh_order": ",".join(a.value for a in MESH_ORDER) + " (innermost first; DeepSpeed's fixed order)",
        },
        "recompute": "full: checkpoint every transformer layer" if full else "none",
    }
    features = architecture(model)
    if features:  # the model is the user's module: it must be the one the plan costed
        block["model"] = f"{model.name}, planned with " + "; ".join(features) + " (your model code builds them)"
    if plan.pp > 1:
        block["pipeline_module"] = {
            "num_stages": plan.pp,
            "partition_method": f"type:{BLOCK_TYPE}",
            "layers_per_stage": plan.stage_layers(model.num_layers),
        }
    elif full:
        block["recompute"] += (
            " in model code (deepspeed.checkpointing.checkpoint or HF gradient_checkpointing_enable())"
        )
    if model.is_moe:
        block["experts"] = _experts_block(plan, model)
    if plan.tp > 1:
        # runtime/config.py DeepSpeedConfig: world_size is mpu.get_data_parallel_world_size(), else all ranks.
        block["autotp_batch"] = (
            f"pass deepspeed.initialize(..., mpu=...) whose get_data_parallel_world_size() is {plan.dp}: "
            "without an mpu DeepSpeed checks train_batch_size against all dp x tp ranks"
        )
    return block


def _experts_block(plan, model) -> dict:
    block = {
        "num_experts": model.num_experts,
        "experts_per_token": model.experts_per_token,
        "expert_width": model.moe_ffn,
        "shared_experts": model.num_shared_experts,
        "first_dense_layers": model.first_dense_layers,
        "ep": plan.ep,
        "expert_data_parallel": plan.dp * plan.tp // plan.ep,
        "routing": "planned as balanced (every expert top-k x tokens / experts); AutoEP drops no token",
        # runtime/zero/stage_1_and_2.py _configure_moe_settings asserts MoE parameter groups;
        # the engine makes them itself only for an optimizer it builds (_configure_optimizer).
        "optimizer": "pass no optimizer object, or one whose param groups come from "
        "deepspeed.moe.utils.split_params_into_different_moe_groups_for_optimizer",
    }
    if plan.pp > 1:
        block["pipeline"] = (
            "expert_parallel.moe_layer_pattern matches layer i's .mlp in the PipelineModule; with no Hugging "
            "Face config AutoEP routes as its custom preset (softmax top-k, no shared experts) unless "
            "expert_parallel.preset_model names the model family (mixtral, qwen3_moe, deepseek_v3, ...)"
        )
    return block


def read_back(data: dict) -> dict:
    """Our fields from a DeepSpeed config dict: the exported one, or the same keys as
    DeepSpeed's parser (deepspeed.runtime.config.DeepSpeedConfig) holds them."""
    batch, micro, accumulation = (
        data["train_batch_size"],
        data["train_micro_batch_size_per_gpu"],
        data["gradient_accumulation_steps"],
    )
    pipeline = data.get("pipeline", {})
    pp = pipeline.get("stages", 1) if isinstance(pipeline.get("stages"), int) else 1  # DeepSpeed's default is "auto"
    tp = max(1, data.get("tensor_parallel", {}).get("autotp_size", 0))  # 0: AutoTP off
    if pp > 1:
        full = pipeline.get("activation_checkpoint_interval", 0) > 0
    else:  # a plain module checkpoints in model code: only the planner block says so
        full = data.get("planner", {}).get("recompute", "none").startswith("full")
    precision = (
        "bf16" if data.get("bf16", {}).get("enabled") else "fp16" if data.get("fp16", {}).get("enabled") else "fp32"
    )
    experts = data.get("expert_parallel") or {}
    if data.get("sequence_parallel_size", 1) > 1:
        raise ValueError(
            f"sequence_parallel_size {data['sequence_parallel_size']} is Ulysses, not our context parallelism"
        )
    return {
        "dp": batch // (micro * accumulation),
        "dp_shard": None,  # no hybrid sharding in DeepSpeed 0.19.8 (module docstring)
        "tp": tp,
        "pp": pp,
        "vpp": 1,
        "micro_batch_size": micro,
        "num_micro_batches": accumulation,
        "global_batch_size": batch,
        "zero_stage": int(data.get("zero_optimization", {}).get("stage", 0)),
        "sequence_parallel": False,
        "schedule": Schedule.one_f_one_b.value,
        "recompute": (Recompute.full if full else Recompute.none).value,
        "precision": precision,
        "mesh_order": [a.value for a in MESH_ORDER],
        "ep": int(experts.get("autoep_size", 1)) if experts.get("enabled") else 1,
        "cp": 1,
        "fp8": False,
    }
