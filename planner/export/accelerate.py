"""Hugging Face Accelerate 1.15: a plan as the YAML config `accelerate config` writes and
`accelerate launch --config_file` reads.

ZeRO-2/3 become FSDP2 (`distributed_type: FSDP`, `fsdp_version: 2`) sharded over every
data-parallel rank (`parallelism_config_dp_shard_size` = dp), with tensor parallelism as
`parallelism_config_tp_size`; ZeRO-0 is plain DDP (`MULTI_GPU`). The config holds no batch
size: micro-batch, gradient accumulation and sequence length go to the training script, so
the export states them in a comment block at the top that `read_back` reads again.

Hybrid sharding (Plan.dp_shard below dp, ZeRO-2/3) is HSDP: `parallelism_config_dp_replicate_size`
dp / dp_shard and `parallelism_config_dp_shard_size` dp_shard (parallelism_config.py:
ParallelismConfig, "`dp_replicate_size > 1` and `dp_shard_size > 1`, we obtain Hybrid Sharded
Data Parallel (HSDP)"). The mesh is dp_replicate, dp_shard, cp, sp, tp (outermost first,
ParallelismConfig._get_mesh), so a shard group is dp_shard consecutive dp ranks, and
utils/fsdp_utils.py:fsdp2_prepare_model hands fully_shard the 2-D mesh fsdp_dim_names =
(dp_replicate, dp_shard_cp): sharded over dp_shard x cp, replicated over dp / dp_shard, the plan's
groups. A shard group of one dp rank (dp_shard 1) Accelerate refuses: ParallelismConfig.
__post_init__ takes no replicas beside tp or cp without dp_shard > 1, and _validate_accelerator
no FSDP2 with dp_shard and cp both 1 ("no dimension for FSDP to shard across").

Context parallelism is `parallelism_config_cp_size` under FSDP2 (cp_backend "torch", the only
one: parallelism_config.py), with cp_comm_strategy "alltoall": Accelerator._prepare_cp passes it
to torch's set_rotate_method, whose _AllToAllRotater sends each rank's K/V chunk to the next rank
of the cp group, cp - 1 times (torch/distributed/tensor/experimental/_context_parallel/
_attention.py: the cost model's ring; dK/dV go round the same way). torch's context_parallel
shards each sequence into 2 x cp head-tail chunks (enable_load_balance, the plan's causal
balancing), and replaces F.scaled_dot_product_attention: the model must run SDPA, masks dropped
for is_causal (big_modeling.py:_attach_context_parallel_hooks). The mesh is dp, cp, tp (outermost
first) and FSDP shards over dp_shard x cp (parallelism_config.py: dp_shard_cp), the plan's
weights over dp x cp. The script runs each step inside accelerator.maybe_context_parallel(...).

FP8 is `mixed_precision: fp8` with Transformer Engine (fp8_config backend TE, format HYBRID:
E4M3 forward, E5M2 gradients, per-tensor delayed scaling: utils/transformer_engine.py:
apply_fp8_autowrap builds te_recipe.DelayedScaling; override_linear_precision all
false, so every linear's three GEMMs in FP8): Accelerator._prepare_te swaps each nn.Linear for
te.Linear (utils/transformer_engine.py:convert_model), the rest runs under bf16 autocast
(utils/modeling.py:get_mixed_precision_context_manager), attention is untouched. Three
differences from the plan: the LM head is a linear too and runs in FP8 (the plan keeps it
16-bit); convert_model swaps modules one by one (no te.LayerNormLinear; Llama's RMSNorm stays
torch's), so each te.Linear casts its input in a kernel of its own, reading the 16-bit input
once more than the fused casts the plan prices (cost_models/compute.py:linear_times); and
nothing passes TE's is_first_microbatch, so weights are cast to FP8 on every micro-batch rather
than once per step. All three are memory-bound passes, small beside the GEMMs at long sequences.

Sources cited below are files of the installed `accelerate` 1.15.0 package (and of
`transformers`, which Accelerate's TP delegates to).
"""

from __future__ import annotations

import re
from typing import Any, Optional

import yaml

from planner.errors import UsageError
from planner.specs import Axis, DType, ModelSpec, Plan, Recompute
from planner.stacks.stack import Export, architecture

_PRECISION = {DType.bf16: "bf16", DType.fp16: "fp16", DType.fp32: "no"}  # ClusterConfig.mixed_precision
# fp8_config as `accelerate launch` reads it: each key becomes args.fp8_<key> (commands/launch.py),
# then env ACCELERATE_FP8_<KEY> (utils/launch.py:setup_fp8_env), which TERecipeKwargs reads.
_FP8_CONFIG = {"backend": "TE", "fp8_format": "HYBRID", "override_linear_precision": [False, False, False]}
_SIZES = ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size")  # what `accelerate config` asks
_PREFIX = "parallelism_config_"  # the keys' prefix in the YAML (commands/config/cluster.py)
# The comment lines `read_back` recovers: `#   name: value`.
_SCRIPT_LINE = re.compile(
    r"^#\s+(micro_batch_size|gradient_accumulation_steps|global_batch_size|seq_len|recompute):\s*(\S+)"
)


def export(plan: Plan, model: ModelSpec, job, num_gpus: int, gpus_per_node: Optional[int] = None) -> Export:
    """The Accelerate config for `plan` on `num_gpus` GPUs; `gpus_per_node` (the cluster's)
    sets num_machines, else one node is written and a comment says what to change."""
    num_machines = _machines(num_gpus, gpus_per_node)
    data = _config(plan, job, num_gpus, num_machines)
    header = _header(plan, model, job, num_gpus, num_machines, gpus_per_node)
    text = "\n".join(header) + "\n" + yaml.safe_dump(data, sort_keys=True)
    return Export(stack="accelerate", text=text, data=data, kind="yaml")


def _machines(num_gpus: int, gpus_per_node: Optional[int]) -> int:
    if gpus_per_node is None or num_gpus <= gpus_per_node:
        return 1
    if num_gpus % gpus_per_node:
        # accelerate launch starts num_processes // num_machines processes on every node.
        raise UsageError(
            f"{num_gpus} GPUs do not fill whole nodes of {gpus_per_node}; Accelerate starts the same number of processes on every node"
        )
    return num_gpus // gpus_per_node


def _config(plan: Plan, job, num_gpus: int, num_machines: int) -> dict:
    """The keys `accelerate config` writes (commands/config/cluster.py), for ClusterConfig."""
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "downcast_bf16": "no",
        "enable_cpu_affinity": False,
        "machine_rank": 0,  # each node passes its own --machine_rank to accelerate launch
        "main_training_function": "main",
        "mixed_precision": "fp8" if plan.fp8 else _PRECISION[DType(job.precision)],
        "num_machines": num_machines,
        "num_processes": num_gpus,  # all processes over all machines (utils/launch.py: nproc_per_node = this // num_machines)
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": False,
    }
    if plan.fp8:
        config["fp8_config"] = dict(_FP8_CONFIG)
    if plan.zero_stage == 0:
        config["distributed_type"] = "MULTI_GPU" if num_gpus > 1 else "NO"
        if num_gpus > 1:
            config["gpu_ids"] = "all"
        return config
    full = _full_recompute(plan)
    config["distributed_type"] = "FSDP"
    config["fsdp_config"] = {
        "fsdp_version": 2,
        "fsdp_reshard_after_forward": plan.zero_stage == 3,
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",  # one FSDP unit per decoder layer (_no_split_modules)
        "fsdp_activation_checkpointing": full,
        "fsdp_cpu_ram_efficient_loading": False,
        "fsdp_offload_params": False,
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",
    }
    shard = plan.dp_shard or plan.dp  # HSDP: dp / dp_shard replicas of a shard group (module docstring)
    if plan.dp_shard == 1:
        raise UsageError(
            f"Accelerate cannot shard over a group of one data-parallel rank (dp_shard=1, dp={plan.dp}): "
            "ParallelismConfig needs dp_shard_size > 1 beside replicas; use dp_shard 2 or more"
        )
    sizes = {"dp_replicate_size": plan.dp // shard, "dp_shard_size": shard, "tp_size": plan.tp, "cp_size": plan.cp}
    config["parallelism_config"] = {_PREFIX + k: sizes[k] for k in _SIZES}
    if plan.cp > 1:  # torch's ring rotation (module docstring)
        config["parallelism_config"] |= {_PREFIX + "cp_backend": "torch", _PREFIX + "cp_comm_strategy": "alltoall"}
    return config


def _full_recompute(plan: Plan) -> bool:
    return plan.recompute == Recompute.full  # with stage_recompute: every layer of every stage full


def _header(
    plan: Plan, model: ModelSpec, job, num_gpus: int, num_machines: int, gpus_per_node: Optional[int]
) -> list[str]:
    """The comment block: what the training script sets (the config has no batch size)."""
    if plan.zero_stage == 0:
        layout = f"DDP over dp={plan.dp}" if num_gpus > 1 else "one GPU"
    else:
        shard = f"dp_shard={plan.dp_shard}" if plan.dp_shard else f"dp={plan.dp}"
        layout = (
            f"FSDP2 {'full shard (ZeRO-3)' if plan.zero_stage == 3 else 'reshard_after_forward false (ZeRO-2)'} over {shard}"
            + (f" x cp={plan.cp}" if plan.cp > 1 else "")
            + (f" (HSDP: {plan.dp // plan.dp_shard} replicas)" if plan.dp_shard else "")
            + f", tp={plan.tp}"
        )
    lines = [
        f"# Accelerate 1.15 config for {model.name} on {num_gpus} GPU(s): {layout}, no pipeline.",
        "# Run: accelerate launch --config_file THIS_FILE train.py",
        "# The config holds no batch size; the training script sets:",
        f"#   micro_batch_size: {plan.micro_batch_size}  (per device: DataLoader(batch_size={plan.micro_batch_size}))",
        f"#   gradient_accumulation_steps: {plan.num_micro_batches}  (Accelerator(gradient_accumulation_steps={plan.num_micro_batches}))",
        f"#   global_batch_size: {job.global_batch_size}  (= dp {plan.dp} x micro-batch {plan.micro_batch_size} x accumulation {plan.num_micro_batches})",
        f"#   seq_len: {job.seq_len}",
    ]
    if plan.zero_stage == 0 and _full_recompute(plan):
        lines.append(
            "#   recompute: full  (DDP has no config key: model.gradient_checkpointing_enable() before accelerator.prepare)"
        )
    if plan.tp > 1:
        lines.append(
            f'# TP: load the model with from_pretrained(..., tp_plan="auto", tp_size={plan.tp}, '
            "device_mesh=accelerator.torch_device_mesh) (a transformers model with a tp_plan, e.g. Llama)"
        )
    if plan.cp > 1:
        lines += [
            f"# CP: each {job.seq_len}-token sequence over cp={plan.cp} ranks (head-tail chunks, K/V passed round a ring); "
            'load the model with attn_implementation="sdpa"',
            "#   and run each step inside accelerator.maybe_context_parallel(buffers=[input_ids, shift_labels, position_ids], "
            "buffer_seq_dims=[1, 1, 1], no_restore_buffers={input_ids, shift_labels, position_ids})",
        ]
    if plan.fp8:
        lines.append(
            "# FP8: Transformer Engine (installed) swaps every nn.Linear, the LM head too, for te.Linear; "
            "weights recast each micro-batch"
        )
    features = architecture(model)
    if features:  # the script's model must be the one the plan costed
        lines.append(
            "# Model: planned with " + "; ".join(features) + " (transformers builds them from the model's config.json)"
        )
    if gpus_per_node is None and num_gpus > 1:
        lines.append("# Several nodes: set num_machines to the node count (num_processes counts every GPU).")
    if num_machines > 1:
        lines.append(
            f"# {num_machines} nodes: on each pass --machine_rank R --main_process_ip HOST --main_process_port PORT."
        )
    return lines


def read_back(data) -> dict:
    """Our fields from an Accelerate config: the YAML text (its comment block gives the batch),
    a parsed ClusterConfig (`to_dict()`), or the structured dict `export` returns."""
    script = {}
    if isinstance(data, str):
        for line in data.splitlines():
            m = _SCRIPT_LINE.match(line)
            if m:
                script[m.group(1)] = m.group(2)
        data = yaml.safe_load(data)
    elif hasattr(data, "to_dict"):
        data = data.to_dict()
    out = _layout(data)
    if "recompute" in script:
        out["recompute"] = script["recompute"]
    for key, name in (
        ("micro_batch_size", "micro_batch_size"),
        ("gradient_accumulation_steps", "num_micro_batches"),
        ("global_batch_size", "global_batch_size"),
        ("seq_len", "seq_len"),
    ):
        if key in script:
            out[name] = int(script[key])
    if (
        "global_batch_size" in out
        and out["global_batch_size"] != out["dp"] * out["micro_batch_size"] * out["num_micro_batches"]
    ):
        raise ValueError(
            f"global_batch_size {out['global_batch_size']} is not dp {out['dp']} x micro_batch_size "
            f"{out['micro_batch_size']} x gradient_accumulation_steps {out['num_micro_batches']}"
        )
    return out


def _layout(config: dict) -> dict:
    """Degrees, ZeRO stage, recompute and precision from the config's own keys."""
    kind = str(getattr(config["distributed_type"], "value", config["distributed_type"]))
    fsdp = config.get("fsdp_config") or {}
    sizes = {k: int((config.get("parallelism_config") or {}).get(_PREFIX + k, 1)) for k in _SIZES}
    tp = sizes["tp_size"]
    dp_shard = None
    if kind == "FSDP":
        dp = sizes["dp_replicate_size"] * sizes["dp_shard_size"]
        zero = 3 if fsdp.get("fsdp_reshard_after_forward", True) else 2
        dp_shard = sizes["dp_shard_size"] if sizes["dp_replicate_size"] > 1 else None  # HSDP
    else:
        dp, zero = int(config.get("num_processes", 1)) // tp, 0
    mixed = str(getattr(config.get("mixed_precision"), "value", config.get("mixed_precision") or "no"))
    fp8 = mixed == "fp8"
    if fp8 and (config.get("fp8_config") or {}).get("backend", "TE") != "TE":
        raise ValueError(
            f"fp8_config backend {config['fp8_config']['backend']} is not our FP8 recipe (Transformer Engine HYBRID)"
        )
    precision = "bf16" if fp8 else {v: k.value for k, v in _PRECISION.items()}[mixed]
    cp = sizes["cp_size"]
    strategy = (config.get("parallelism_config") or {}).get(
        _PREFIX + "cp_comm_strategy", "allgather"
    )  # Accelerate's default
    if cp > 1 and strategy != "alltoall":
        raise ValueError(f"cp_comm_strategy {strategy} all-gathers K/V, not the ring our context parallelism is")
    return {
        "num_gpus": int(config.get("num_processes", 1)),
        "dp": dp,
        "dp_shard": dp_shard,
        "cp": cp,
        "fp8": fp8,
        "tp": tp,
        "pp": 1,
        "vpp": 1,
        "zero_stage": zero,
        "sequence_parallel": False,
        "recompute": "full" if fsdp.get("fsdp_activation_checkpointing") else "none",
        "precision": precision,
        "mesh_order": [Axis.tp.value, Axis.dp.value, Axis.pp.value],
    }
