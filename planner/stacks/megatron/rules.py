"""What Megatron-LM (megatron-core 0.16.1, the Megatron-LM of tag core_v0.16.1) can express:
its `RULES`, the architecture fields its arguments cannot state (model_problems), what it
cannot run of a layout (layout_problems) or a plan (problems), and how its recompute flags
recompute (recompute_counts), which the exporter (export.py, whose docstring says where each
flag comes from) writes with the same functions.
"""

from __future__ import annotations

from typing import Optional

from planner.specs import Activation, Axis, JobSpec, Layout, ModelSpec, Plan, Recompute, Schedule, StageRecompute
from planner.stacks.stack import Rules, _effective, windowed

RULES = Rules(
    stack="megatron",
    # ZeRO-1 is the distributed optimizer (--use-distributed-optimizer: megatron/core/optimizer/
    # distrib_optimizer.py shards the fp32 main weights and Adam moments over the data-parallel
    # group; the gradient buffer stays whole). Stages 2 and 3 exist only as Megatron-FSDP
    # (--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads|optim_grads_params,
    # megatron/core/distributed/fsdp/) and torch FSDP2 (--use-torch-fsdp2, pp=1 only), which
    # this exporter does not write.
    zero_stages=(0, 1),
    zero_stages_with_pp=(0, 1),
    zero_stages_with_tp=(0, 1),
    # the distributed optimizer in instances: --num-distributed-optimizer-instances dp / dp_shard
    # (megatron/training/arguments.py at core_v0.16.1 -> parallel_state.initialize_model_parallel's
    # intra-partial dp x cp groups of dp_shard x cp ranks; gradients reduce-scattered within an
    # instance, all-reduced across: distributed/param_and_grad_buffer.py). DistributedDataParallel
    # asserts the distributed optimizer ("Partial DistOpt cannot be used without DistOpt"): ZeRO-1 only.
    hybrid_zero_stages=(1,),
    # pipeline_parallel/schedules.py:get_forward_backward_func: pp > 1 runs
    # forward_backward_pipelining_without_interleaving (1F1B) or, with virtual stages,
    # forward_backward_pipelining_with_interleaving; there is no all-forward-then-all-backward
    # (GPipe) schedule.
    schedules=(Schedule.one_f_one_b, Schedule.interleaved_1f1b),
    interleaved=True,  # ModelParallelConfig.virtual_pipeline_model_parallel_size
    sequence_parallel=True,  # ModelParallelConfig.sequence_parallel (needs tp > 1, checked there)
    # ModelParallelConfig.expert_model_parallel_size: any ep whose expert groups tile the
    # tp x dp ranks of a pipeline stage (parallel_state.initialize_model_parallel: world_size
    # divisible by expert-TP x ep x pp) and divide the experts (arguments.py:validate_args);
    # specs.ep_problem states both. problems() adds the one mesh-order rule.
    max_ep=None,
    # ModelParallelConfig.context_parallel_size with cp_comm_type "p2p" (export.py's docstring):
    # any cp whose tp x pp x cp divides the world (parallel_state.initialize_model_parallel);
    # specs.cp_problem states the sequence rules. problems() adds the one mesh-order rule.
    max_cp=None,
    # TransformerConfig.fp8 = "hybrid", fp8_recipe = "delayed" (export.py's docstring).
    fp8=True,
    tp_comm_overlap=True,  # ModelParallelConfig.tp_comm_overlap: Transformer Engine userbuffers
    # TransformerConfig.recompute_modules "layernorm" and "moe_act" (selective granularity):
    # output-discarding checkpoints of the separate norms (transformer_layer.py: not an IdentityOp
    # norm, i.e. not fused into a LayerNormLinear) and of the grouped experts' activation
    # (moe/experts.py, with --moe-grouped-gemm)
    recompute_norm_act=True,
    # transformer_config.py:__post_init__ raises "Delayed scaling does not support moe_act and
    # layernorm recompute for fp8", and this export's FP8 recipe is delayed scaling
    recompute_norm_act_fp8=False,
    # parallel_state.initialize_model_parallel(order=...): "tp-cp-ep-dp-pp" by default (tp
    # innermost, then dp, then pp) and "tp-cp-ep-pp-dp" under Megatron-LM's
    # --use-tp-pp-dp-mapping; its docstring: "we support tp-dp-pp and tp-pp-dp orders".
    mesh_orders=((Axis.tp, Axis.dp, Axis.pp), (Axis.tp, Axis.pp, Axis.dp)),
    # TransformerConfig.pipeline_model_parallel_layout (--pipeline-model-parallel-layout,
    # transformer/pipeline_parallel_layer_layout.py) gives every virtual stage its own layer
    # count, in our order (layout[i], i = chunk x pp + pipeline rank).
    split="free",
    # transformer/transformer_block.py:_checkpointed_forward: --recompute-granularity full with
    # --recompute-method block recomputes the first --recompute-num-layers layers of every model
    # chunk (the same N everywhere); uniform recomputes all of them; selective recomputes the
    # core attention of every layer (recompute_num_layers must then be None). same_per_stage is
    # a little stricter: it wants equal full counts, where block gives a short chunk
    # min(N, its layers) and uniform recomputes every layer of unequal chunks.
    recompute="same_per_stage",
    notes={
        "uneven stages": "any split: --decoder-first/last-pipeline-num-layers when only the first and last rank differ, "
        "else --pipeline-model-parallel-layout",
        "per-stage recompute": "full on the first N layers of every stage (--recompute-method block), or one mode for all layers",
        "ZeRO": "0, and 1 as --use-distributed-optimizer; Megatron-FSDP and torch FSDP2 (ZeRO-2/3) exist but are not exported",
        "mesh order": "tp,dp,pp (default) or tp,pp,dp (--use-tp-pp-dp-mapping)",
        "data parallel": "not a flag: WORLD_SIZE / (tp x pp x cp) from the launcher",
        "hybrid sharding": "ZeRO-1 as --num-distributed-optimizer-instances dp / dp_shard (instances of dp_shard x cp "
        "ranks); ep must divide dp_shard x cp x tp",
        "experts": "--expert-model-parallel-size ep with expert-TP 1 (folded from tp x cp x dp), all-to-all dispatch, grouped GEMM; "
        "with --use-tp-pp-dp-mapping and pp > 1 only ep = tp",
        "context parallelism": "--context-parallel-size cp --cp-comm-type p2p (a ring of K/V chunks in Transformer Engine's "
        "attention, 2 x cp load-balanced chunks); not with --use-tp-pp-dp-mapping and pp > 1",
        "FP8": "--fp8-format hybrid --fp8-recipe delayed (Transformer Engine: E4M3 forward, E5M2 gradients, per-tensor scales)",
        "norm/act recompute": "--recompute-granularity selective --recompute-modules layernorm moe_act (with core_attn or "
        "mla_up_proj under selective recompute); not with FP8's delayed scaling",
    },
)

_FULL_UNIFORM = ("full", "uniform", 1)  # every layer keeps only its input (chunks of one layer)


def megatron_recompute(setting: Optional[tuple], stage_layers: list[int]) -> list[StageRecompute]:
    """(none, selective, full) layers per virtual stage under Megatron's recompute flags
    (granularity, method, num_layers), as transformer_block.py:_checkpointed_forward applies
    them to each model chunk: block recomputes the chunk's first N layers, uniform all of them."""
    return [StageRecompute(none=n, selective=s, full=f) for n, s, f in recompute_counts(setting, stage_layers)]


def recompute_counts(setting: Optional[tuple], stage_layers: list[int]) -> list[tuple]:
    """megatron_recompute as (none, selective, full) tuples (problems() runs it per candidate)."""
    if setting is None:
        return [(n, 0, 0) for n in stage_layers]
    if setting[0] == "selective":
        return [(0, n, 0) for n in stage_layers]
    full = [min(setting[2], n) if setting[1] == "block" else n for n in stage_layers]
    return [(n - f, 0, f) for n, f in zip(stage_layers, full)]


def recompute_setting(counts: list[tuple]) -> Optional[tuple]:
    """Megatron's recompute flags nearest to per-stage (none, selective, full) counts
    (recompute_counts says whether they reproduce the counts exactly)."""
    if any(c[1] for c in counts):
        return ("selective", None, None)
    if not any(c[2] for c in counts):
        return None
    if all(c[2] == sum(c) for c in counts):
        return _FULL_UNIFORM
    return ("full", "block", max(c[2] for c in counts))


def plan_counts(plan: Plan, num_layers: int) -> list[tuple]:
    """The plan's (none, selective, full) layers per virtual stage, without building a
    StageRecompute per stage."""
    if plan.stage_recompute is not None:
        return [(r.none, r.selective, r.full) for r in plan.stage_recompute]
    i = ("none", "selective", "full").index(Recompute(plan.recompute).value)
    return [tuple(n if k == i else 0 for k in range(3)) for n in plan.stage_layers(num_layers)]


def model_problems(model: ModelSpec) -> list[str]:
    """The architecture fields Megatron-LM's arguments cannot express, whatever the plan."""
    out = []
    if Activation(model.activation) == Activation.geglu:
        # Megatron-LM arguments.py:core_transformer_config_from_args (core_v0.16.1): the gated
        # MLPs are --swiglu (F.silu) and --quick-geglu (quick_gelu, x sigmoid(1.702 x)); no flag
        # gates through GELU, and gated_linear_unit has no flag of its own.
        out.append(
            "activation geglu (Megatron-LM gates its MLP through SiLU, --swiglu, or x sigmoid(1.702 x), "
            "--quick-geglu, not GELU)"
        )
    if model.norms_per_layer != 2:
        # transformer/transformer_layer.py:TransformerLayerSubmodules: input_layernorm,
        # pre_cross_attn_layernorm (decoders with cross-attention) and pre_mlp_layernorm only.
        out.append(
            f"norms_per_layer {model.norms_per_layer} (megatron-core's layer normalises only the inputs of "
            "attention and the MLP)"
        )
    if model.logit_softcapping:
        # models/gpt/gpt_model.py: the output layer's logits go to the loss as they are.
        out.append("logit_softcapping (megatron-core's GPT model does not soft-cap its logits)")
    if model.sliding_window is not None and model.sliding_window_layers != model.num_layers:
        # --window-attn-skip-freq (an N, or a 0/1 list per layer: transformer/utils.py:
        # is_layer_window_attention) places the windowed layers; the spec holds only their count.
        out.append(
            f"sliding_window on {windowed(model)} (the model spec does not say which layers; "
            "--window-attn-skip-freq must)"
        )
    if model.glu_limit is not None:
        # Megatron-Core's TransformerConfig.activation_func_clamp_value (Megatron-Bridge's GPT-OSS
        # provider sets it); arguments.py has no flag for it.
        out.append(
            f"glu_limit {model.glu_limit:g} (Megatron-LM's arguments cannot clamp the MLP: Megatron-Core's "
            "TransformerConfig.activation_func_clamp_value can, as Megatron-Bridge sets it)"
        )
    out += _rope_problems(model)
    if model.rope_attention_factor != 1.0 and not model.mla:
        # arguments.py: --rope-type yarn for multi-latent attention only ("Common attention only
        # support rope_type=rope"); Megatron-Core's position_embedding_type "yarn" has no flag.
        out.append(
            f"rope_attention_factor {model.rope_attention_factor:g} (YaRN: Megatron-LM's arguments take it for "
            "multi-latent attention only, and this exporter writes none; Megatron-Core's TransformerConfig "
            "position_embedding_type 'yarn' can, as Megatron-Bridge sets it)"
        )
    return out


# MLATransformerConfig's YaRN fields that Megatron-LM has no flag for (transformer_config.py at
# core_v0.16.1): a model must have these values for Megatron to build it
MLA_YARN_FIXED = {"original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0}


def _rope_problems(model: ModelSpec) -> list[str]:
    """The rotary embedding's base and scaling that Megatron-LM's arguments cannot state (export.py:
    _rope_flags writes the rest). arguments.py: --rotary-base takes an integer; --use-rope-scaling
    with --rope-scaling-factor is Llama 3.x's scaling with low_freq_factor 1, high_freq_factor 4
    and an original context of 8192 fixed (core/models/common/embeddings/rotary_pos_embedding.py:
    _apply_scaling's defaults), for standard attention; multi-latent attention takes YaRN
    (--rope-type yarn, --rotary-scaling-factor, --mscale, --mscale-all-dim) with the other YaRN
    fields at MLATransformerConfig's defaults (MLA_YARN_FIXED); standard attention takes no YaRN
    ("Common attention only support rope_type=rope")."""
    if model.learned_position_embeddings:
        return []
    out = []
    if model.rope_theta != int(model.rope_theta):
        out.append(f"rope_theta {model.rope_theta:g} (Megatron-LM's --rotary-base takes an integer)")
    r = model.rope_scaling
    if r is None:
        return out
    if r.rope_type == "llama3" and not model.mla:
        if r.band() != (1.0, 4.0, 8192):
            low, high, original = r.band()
            out.append(
                f"rope_scaling llama3 with low_freq_factor {low:g}, high_freq_factor {high:g}, original_max_position_embeddings "
                f"{original} (Megatron-LM's --use-rope-scaling fixes them at 1, 4 and 8192)"
            )
    elif r.rope_type == "yarn" and model.mla:
        for name, fixed in MLA_YARN_FIXED.items():
            if getattr(r, name) not in (None, fixed):
                out.append(
                    f"rope_scaling yarn with {name} {getattr(r, name):g} (Megatron-LM has no flag for it: "
                    f"MLATransformerConfig keeps {fixed:g})"
                )
    else:
        attention = "multi-latent attention" if model.mla else "standard attention"
        takes = "YaRN" if model.mla else "Llama 3.x's scaling (--use-rope-scaling)"
        out.append(
            f"rope_scaling {r.rope_type} on {attention} (Megatron-LM's arguments scale its rotary frequencies with {takes} only)"
        )
    return out


def layout_problems(layout: Layout, model: ModelSpec, job: JobSpec) -> list[str]:
    """What Megatron cannot run of a layout (a search candidate, or Plan.layout) that `RULES`
    does not cover."""
    out = []
    # transformer/attention.py: num_query_groups_per_partition = divide(num_query_groups, tp)
    # (core/utils.py:divide asserts an exact division): TP splits the KV heads, never replicates them.
    if layout.tp > 1 and model.kv_heads % layout.tp:
        out.append(
            f"tp={layout.tp} over the {model.kv_heads} KV heads of {model.name} (Megatron divides the query groups over TP, "
            "never replicates them)"
        )
    # schedules.py: the interleaved schedule runs micro-batches in groups of
    # microbatch_group_size_per_vp_stage (default pp) and raises on a remainder smaller than pp.
    if layout.vpp > 1 and layout.num_micro_batches % layout.pp:
        out.append(
            f"interleaved schedule with {layout.num_micro_batches} micro-batches, not a multiple of pp={layout.pp}"
        )
    # tensor_parallel/mappings.py: sequence parallelism scatters the sequence over the TP group
    # ("First dimension of the tensor should be divisible by tensor parallel size"); under
    # context parallelism that is a CP rank's s / cp tokens.
    if layout.sequence_parallel and layout.cp == 1 and job.seq_len % layout.tp:
        out.append(f"sequence parallelism with seq_len {job.seq_len} not divisible by tp={layout.tp}")
    if layout.sequence_parallel and layout.cp > 1 and (job.seq_len // layout.cp) % layout.tp:
        out.append(
            f"sequence parallelism with {job.seq_len // layout.cp} tokens per CP rank not divisible by tp={layout.tp}"
        )
    if layout.cp > 1 and model.sliding_window is not None:
        # Transformer Engine's attention/dot_product_attention/context_parallel.py
        # (attn_forward_func_with_cp) asserts a sliding window only with cp_comm_type a2a or
        # all_gather: "The context parallel running configs cannot support sliding window
        # attetnion!"; the plan's ring is p2p.
        out.append(
            f"context parallelism cp={layout.cp} with a sliding window (Transformer Engine's p2p ring refuses windows)"
        )
    # parallel_state: --use-tp-pp-dp-mapping orders ranks "tp-cp-ep-pp-dp", cp next to tp and
    # inside pp, where the plan holds cp inside the dp axis (tp, pp, then cp x dp).
    if layout.cp > 1 and tp_pp_dp_mapping(layout):
        out.append(
            f"context parallelism cp={layout.cp} with mesh order tp,pp,dp (Megatron's --use-tp-pp-dp-mapping "
            "puts cp next to tp, inside pp; the plan holds it inside dp)"
        )
    # parallel_state.initialize_model_parallel: the expert rank generator uses the same order
    # with ep x expert-TP in place of tp; unless pp is outermost it asserts "the data parallel size
    # of the attention and moe layers must be the same", i.e. ep x expert-TP (1) = tp.
    if model.is_moe and tp_pp_dp_mapping(layout) and layout.ep != layout.tp:
        out.append(
            f"expert parallelism ep={layout.ep} with mesh order tp,pp,dp (Megatron folds experts there only with ep = tp = {layout.tp})"
        )
    return out


def problems(plan: Plan, model: ModelSpec, job: JobSpec) -> list[str]:
    """What Megatron cannot run of the plan that `RULES` does not cover: layout_problems and
    the per-stage recompute its flags cannot reproduce."""
    out = []
    layers = plan.stage_layers(model.num_layers)
    counts = plan_counts(plan, model.num_layers)
    if recompute_counts(recompute_setting(counts), layers) != counts:
        out.append(
            "recompute other than selective on every layer or full on the first N layers of every stage "
            f"({', '.join(f'{n}/{s}/{f}' for n, s, f in counts)} none/selective/full)"
        )
    return out + layout_problems(plan.layout, model, job)


def tp_pp_dp_mapping(layout) -> bool:
    """Whether the layout needs --use-tp-pp-dp-mapping (its mesh order is not Megatron's
    default); the dp axis holds dp x cp ranks."""
    order, dp_axis = tuple(Axis(a) for a in layout.mesh_order), layout.dp * layout.cp
    assert RULES.mesh_orders is not None  # Megatron's, its default first
    return _effective(order, dp_axis, layout.tp, layout.pp) != _effective(
        RULES.mesh_orders[0], dp_axis, layout.tp, layout.pp
    )
