"""What Hugging Face Accelerate 1.15 can express: its `RULES` and what beyond them it cannot run
of a layout (layout_problems, problems; it builds any model: model_problems is empty). The
exporter (export.py) says how a plan becomes the YAML config; sources cited are files of the
installed `accelerate` 1.15.0 package (and of `transformers`, which Accelerate's TP delegates to).
"""

from __future__ import annotations

from planner.specs import Axis, DType, Layout, ModelSpec, Plan
from planner.stacks.stack import Rules

RULES = Rules(
    stack="accelerate",
    # ZeRO-0 is DDP (distributed_type MULTI_GPU). FSDP2 always shards gradients and
    # optimizer states with the parameters: ZeRO-2 is fully_shard(reshard_after_forward=False)
    # (parameters gathered once per forward and kept through backward), ZeRO-3 is
    # reshard_after_forward=True (utils/dataclasses.py:FullyShardedDataParallelPlugin, a bool for
    # fsdp_version 2; utils/fsdp_utils.py:fsdp2_prepare_model passes it to fully_shard). Nothing
    # shards only the optimizer states: no ZeRO-1 (that is the DeepSpeed plugin's, not this path).
    zero_stages=(0, 2, 3),
    zero_stages_with_pp=(0, 2, 3),  # moot: there is no pipeline (max_pp below)
    # TP is ParallelismConfig.tp_size, which the config path reaches only with FSDP2:
    # commands/launch.py:_validate_launch_command refuses --use_parallelism_config without
    # --use_fsdp and --fsdp_version=2, commands/config/cluster.py asks for it only under FSDP2, and
    # parallelism_config.py:ParallelismConfig.__post_init__ rejects DDP + TP (dp_replicate > 1,
    # dp_shard == 1, tp > 1).
    zero_stages_with_tp=(2, 3),
    # FSDP2 on ParallelismConfig(dp_replicate_size dp / dp_shard, dp_shard_size dp_shard): HSDP
    # (parallelism_config.py; utils/fsdp_utils.py:fsdp2_prepare_model passes fully_shard the 2-D
    # mesh (dp_replicate, dp_shard_cp)). ParallelismConfig refuses dp_shard_size 1 beside replicas
    # (__post_init__ with tp or cp, _validate_accelerator without): the exporter refuses dp_shard 1.
    hybrid_zero_stages=(2, 3),
    # No pipeline parallelism on the FSDP2 / ParallelismConfig path: its mesh dimensions are
    # dp_replicate, dp_shard, cp, sp and tp only (parallelism_config.py:_get_mesh). (Pipelines
    # exist only inside the separate Megatron-LM plugin, which this export does not target.)
    max_pp=1,
    # No expert parallelism on this path either: ParallelismConfig has no expert axis (the same
    # _get_mesh dimensions), and transformers' own expert parallelism
    # (DistributedConfig(enable_expert_parallel=True)) takes the whole world as its EP group, which
    # ParallelismConfig._validate_accelerator refuses beside FSDP ("no dimension for FSDP to shard
    # across"). expert_model_parallel_size exists only in the Megatron-LM plugin
    # (utils/dataclasses.py:MegatronLMPlugin). A MoE model at ep = 1 exports: FSDP2 shards its
    # experts like any other parameter of the wrapped decoder layer.
    max_ep=1,
    # ParallelismConfig.cp_size with the "alltoall" rotation (export.py's docstring): any cp that
    # tiles the world with the other sizes; under FSDP2 only (problems()).
    max_cp=None,
    # mixed_precision fp8 with the TE backend (export.py's docstring); not with TP (problems()).
    fp8=True,
    schedules=(),
    interleaved=False,
    # Megatron sequence parallelism (norms and dropout sharded over the TP group) is not in
    # Accelerate's TP: the shards come from transformers' tp_plan (Llama's base_model_tp_plan
    # in models/llama/configuration_llama.py lists colwise/rowwise projections, no norm).
    # ParallelismConfig.sp_size is DeepSpeed Ulysses (sp_backend "deepspeed"), a different thing.
    sequence_parallel=False,
    # utils/dataclasses.py:TorchTensorParallelConfig ignores enable_async_tp with a warning.
    tp_comm_overlap=False,
    # ParallelismConfig._get_mesh orders the mesh dp_replicate, dp_shard, cp, sp, tp (outermost
    # first; init_device_mesh puts the last dimension on consecutive ranks): tp innermost, then dp.
    mesh_orders=((Axis.tp, Axis.dp, Axis.pp),),
    split="even",  # one pipeline stage holds every layer
    # fsdp_activation_checkpointing wraps every auto-wrapped layer in checkpoint_wrapper
    # (utils/fsdp_utils.py:fsdp2_apply_ac): all layers fully recomputed, or none.
    recompute="uniform",
    # Accelerate's activation checkpointing reruns whole layers: full or none, no selective.
    recompute_modes=("none", "full"),
    notes={
        "ZeRO": "0 is DDP (MULTI_GPU), 2 is FSDP2 with reshard_after_forward false, 3 is FSDP2 full shard, no ZeRO-1",
        "TP": "parallelism_config tp_size, only under FSDP2 with dp > 1, through transformers' tp_plan (Llama-family models)",
        "sequence parallelism": "none (sp_size is DeepSpeed Ulysses, not Megatron SP)",
        "recompute": "fsdp_activation_checkpointing, every layer full or none, no selective",
        "mesh order": "tp innermost, then dp (ParallelismConfig: dp_replicate, dp_shard, cp, sp, tp)",
        "hybrid sharding": "HSDP: parallelism_config dp_replicate_size dp / dp_shard, dp_shard_size dp_shard (FSDP2 over "
        "dp_shard x cp); not dp_shard 1 (Accelerate needs dp_shard_size > 1 beside replicas)",
        "batch": "not in the config, micro-batch and accumulation go to the script (a comment block says them)",
        "experts": "no expert parallelism (ParallelismConfig has no expert axis); MoE models at ep = 1, experts sharded by FSDP2",
        "context parallelism": "parallelism_config cp_size, cp_comm_strategy alltoall (torch's ring of K/V chunks, head-tail "
        "balanced), FSDP2 only, SDPA attention, the step inside accelerator.maybe_context_parallel",
        "FP8": "mixed_precision fp8, Transformer Engine HYBRID (every nn.Linear, LM head included); bf16 only, not with TP",
    },
)


def model_problems(model: ModelSpec) -> list[str]:
    """None: the config holds no architecture; the script's model does (transformers builds
    GeGLU, the extra norms, QK-norm, windows and soft-capping from the model's config.json), and
    FSDP2 wraps its decoder layers as they are. Context parallelism, which drops attention
    masks, is refused in layout_problems."""
    return []


def layout_problems(layout: Layout, model: ModelSpec, job) -> list[str]:
    """What Accelerate cannot run of a layout (a search candidate, or Plan.layout) that `RULES`
    does not cover."""
    out = []
    if layout.cp > 1 and model.sliding_window is not None:
        # big_modeling.py:_attach_context_parallel_hooks drops each attention's mask for
        # is_causal and so refuses a model with sliding-window layers ("Context parallelism
        # does not support attention layers of type ['sliding_attention']").
        out.append(
            f"context parallelism cp={layout.cp} with a sliding window (Accelerate's context parallelism runs full "
            "causal attention only)"
        )
    if layout.cp > 1 and layout.zero_stage == 0:
        # ParallelismConfig.__post_init__: "Tensor/Context parallelism (tp/cp_size > 1) cannot be
        # used with pure data parallelism" (dp_replicate > 1, dp_shard == 1); FSDP2 shards over cp.
        out.append(
            f"context parallelism cp={layout.cp} with ZeRO-0 (Accelerate's context parallelism needs FSDP2, ZeRO-2/3)"
        )
    if layout.fp8 and DType(job.precision) != DType.bf16:
        # mixed_precision is one value: fp8 runs everything but the TE linears under bf16 autocast.
        out.append(f"FP8 with {DType(job.precision).value} precision (Accelerate's fp8 runs the rest in bf16)")
    if layout.fp8 and layout.tp > 1:
        # Accelerator.prepare: _prepare_tp shards first, then _prepare_te's convert_model rebuilds
        # each nn.Linear as a whole te.Linear(in_features, out_features) and copies the weight in.
        out.append(
            f"FP8 with tensor parallelism tp={layout.tp} (Accelerate's TE conversion rebuilds TP-sharded linears whole)"
        )
    if layout.dp_shard == 1 and layout.cp == 1:
        # ParallelismConfig: replicas beside nothing to shard over (dp_shard_size 1, cp 1) are refused
        # (planner/export/accelerate.py)
        out.append(f"a shard group of one rank (dp_shard=1 of dp={layout.dp}: Accelerate's HSDP needs dp_shard > 1)")
    if layout.tp > 1 and layout.dp == 1 and layout.zero_stage in RULES.zero_stages_with_tp:
        # ParallelismConfig._validate_accelerator: FSDP2 with dp_shard_size == cp_size == 1 has
        # nothing to shard across and is refused.
        out.append(
            f"tensor parallelism tp={layout.tp} without data parallelism (FSDP2 beside TP needs dp > 1 to shard over)"
        )
    if layout.tp > 1 and model.kv_heads % layout.tp:
        # transformers' TP splits k_proj/v_proj colwise by whole heads
        # (distributed/tensor_parallel.py:get_kv_heads_per_rank); it cannot replicate KV heads.
        out.append(
            f"tp={layout.tp} over {model.kv_heads} KV heads of {model.name} (transformers' TP shards whole KV heads)"
        )
    return out


def problems(plan: Plan, model: ModelSpec, job) -> list[str]:
    return layout_problems(plan.layout, model, job)
