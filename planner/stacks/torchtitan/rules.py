"""What torchtitan 0.3.0 can express: its `RULES`, the model configs it ships (FLAVORS: a
model that is one of them is exported by name, and inherits its RoPE length), the architecture
fields none of its components builds (model_problems) and what it cannot run of a layout or a
plan (layout_problems, problems). The exporter (export.py) says how a plan becomes overrides.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from planner.specs import Activation, Axis, DType, JobSpec, Layout, ModelSpec, Optimizer, Plan, Schedule
from planner.stacks.stack import Rules

RULES = Rules(
    stack="torchtitan",
    # Data parallelism is always FSDP2's fully_shard (models/llama3/parallelize.py calls
    # apply_fsdp_to_decoder in every case; there is no separate DDP wrapper). ZeRO-0 = a
    # replicate-only mesh (data_parallel_replicate_degree = dp, shard degree 1, which
    # ParallelismConfig's docstring calls DDP: parameters, gradients and optimizer states whole on
    # every rank, gradients all-reduced); ZeRO-2 = sharded with
    # fsdp_reshard_after_forward "never" (parameters gathered in forward are kept through
    # backward; gradients and optimizer states sharded); ZeRO-3 = "always"
    # (distributed/fsdp.py:get_fsdp_reshard_after_forward_policy). fully_shard shards optimizer
    # states only together with gradients and parameters, and config/configs.py:ParallelismConfig
    # has no optimizer-only sharding: no ZeRO-1.
    zero_stages=(0, 2, 3),
    # apply_fsdp_to_decoder(pp_enabled=...) runs on every pipeline model chunk
    # (distributed/pipeline_parallel.py:pipeline_llm calls parallelize_fn per chunk), and FSDP
    # works over the TP mesh's data-parallel axes (distributed/full_dtensor.py:resolve_fsdp_mesh).
    zero_stages_with_pp=(0, 2, 3),
    zero_stages_with_tp=(0, 2, 3),
    # HSDP: FSDP2 on a (dp_replicate, dp_shard) mesh (config/configs.py:ParallelismConfig
    # data_parallel_replicate_degree dp / dp_shard, data_parallel_shard_degree dp_shard;
    # distributed/full_dtensor.py:resolve_fsdp_mesh shards over dp_shard x cp, replicates over
    # dp_replicate). ZeRO-0 is the replicate-only mesh: nothing to shard.
    hybrid_zero_stages=(2, 3),
    # --parallelism.pipeline_parallel_schedule is any name of torch's get_schedule_class
    # (torch/distributed/pipelining/schedules.py): "GPipe", "1F1B", "Interleaved1F1B", ...
    schedules=(Schedule.gpipe, Schedule.one_f_one_b, Schedule.interleaved_1f1b),
    # module_fqns_per_model_part with pp x vpp parts; looped schedules put part j on pipeline
    # rank j % pp (pipeline_parallel.py:_get_pp_rank_to_stage_indices_mapping, style "loop"),
    # our order.
    interleaved=True,
    # ParallelismConfig.enable_sequence_parallel (default True; --parallelism.no_enable_sequence_parallel
    # turns it off): models/llama3/model.py passes it to set_llama3_sharding_config.
    sequence_parallel=True,
    # CompileConfig.enable_async_tensor_parallel (needs --compile.enable with "model" in
    # --compile.components, CompileConfig.__post_init__): inductor's micro-pipelined TP
    # (distributed/compile.py:_maybe_enable_async_tp).
    tp_comm_overlap=True,
    # ParallelDims.build_mesh unflattens the world as ("pp", "dp_replicate", "dp_shard", "cp",
    # "tp"), outermost first: tp on consecutive ranks, then dp, then pp. Nothing reorders it.
    mesh_orders=((Axis.tp, Axis.dp, Axis.pp),),
    # ParallelismConfig.module_fqns_per_model_part lists every part's modules by name, so any
    # number of layers per (virtual) stage (pipeline_llm uses it instead of the generated split).
    split="free",
    # Trainer.Config.activation_checkpoint is one policy, and ActivationCheckpointing.apply
    # (distributed/activation_checkpoint.py) wraps every transformer block with it.
    recompute="uniform",
    # FullAC reruns whole blocks (our "full"); activation-checkpoint:none keeps everything. Its
    # SelectiveAC is not our "selective" (rerun the core attention only): it is per-op SAC that
    # saves the outputs of matmuls and attention except every second matmul and recomputes the
    # rest (SelectiveAC._wrap_block), another memory/compute trade the plan does not estimate.
    recompute_modes=("none", "full"),
    # ParallelismConfig.expert_parallel_degree: ep borrows ranks from dp_shard x cp x tp (its
    # docstring; ParallelDims.build_mesh unflattens the world into pp, dp_replicate, efsdp, ep).
    # problems() states what that means for ZeRO-0 and for TP at ep = 1.
    max_ep=None,
    # ParallelismConfig.context_parallel_degree: any cp ParallelDims tiles the world with; the
    # K/V all-gather in place of the ring and FSDP over cp (no ZeRO-0) are in the module
    # docstring and problems().
    max_cp=None,
    # No FP8 override, and no per-tensor recipe (export.py's docstring).
    fp8=False,
    notes={
        "ZeRO": "0 = replicate-only FSDP2 mesh (DDP-like); 2 = FSDP2 reshard_after_forward never; 3 = always; no ZeRO-1",
        "uneven stages": "any split: --parallelism.module_fqns_per_model_part lists each stage's layers",
        "per-stage recompute": "one policy for every layer: activation-checkpoint:none or :full",
        "selective recompute": "no: torchtitan's selective AC is per-op SAC (saves matmuls but every second one), not core-attention recompute",
        "sequence parallelism": "on or off with TP (--parallelism.[no_]enable_sequence_parallel)",
        "TP overlap": "async TP under torch.compile (--compile.enable_async_tensor_parallel)",
        "mesh order": "tp innermost, then dp, then pp (ParallelDims: pp, dp_replicate, dp_shard, cp, tp)",
        "hybrid sharding": "HSDP: --parallelism.data_parallel_replicate_degree dp / dp_shard, data_parallel_shard_degree "
        "dp_shard (FSDP over dp_shard x cp); ep must divide dp_shard x cp x tp",
        "model": "llama3 8B/70B/405B, deepseek_v3 671B, qwen3 30B-A3B by --config; any other model needs the user's own "
        "config_registry function",
        "experts": "--parallelism.expert_parallel_degree (expert-TP 1, borrowed from dp_shard x cp x tp); with ZeRO-0 only ep = tp; "
        "MoE with tp > 1 needs ep > 1 (at ep = 1 torchtitan shards experts over TP)",
        "context parallelism": "--parallelism.context_parallel_degree with head-tail chunks; FlexAttention all-gathers K/V over "
        "the cp ranks (no ring in 0.3.0: the ring's bytes, not overlapped, the gathered K/V kept for backward); ZeRO-2/3 only "
        "(FSDP always shards over cp)",
        "FP8": "no: float8 is a model-spec converter (a config_registry function, no override) with rowwise recipes only",
    },
)


ROPE_MAX_SEQ = 131072  # the llama3 flavors' RoPE max_seq_len


@dataclass(frozen=True)
class Flavor:
    """One of torchtitan's model configs: the config_registry function and the model it builds
    (models/llama3/__init__.py: _8b, _70b, _405b, FFN width from compute_ffn_hidden_dim;
    models/deepseek_v3/__init__.py: _671b; models/qwen3/__init__.py: "30B-A3B")."""

    config: str
    flavor: str  # ModelSpec.flavor of the Trainer.Config it returns
    num_layers: int
    hidden_size: int
    num_heads: int
    kv_heads: int
    ffn: int
    vocab_size: int
    note: str = ""
    module: str = "llama3"  # --module: the package under torchtitan/models
    max_seq_len: int = ROPE_MAX_SEQ  # RoPE positions; Decoder.Config.update_from_config refuses longer
    head_dim: Optional[int] = None  # None: hidden_size / num_heads
    # (routed experts, top-k, expert width, shared experts, dense first layers); None: dense
    experts: Optional[tuple] = None
    qk_norm: bool = False  # GQAttention.Config.qk_norm set (models/qwen3/__init__.py: an RMSNorm of head_dim)
    # multi-head latent attention (models/deepseek_v3): (kv_lora_rank, q_lora_rank, qk_rope_head_dim, v_head_dim); None: none
    mla: Optional[tuple] = None
    # the rotary embedding its RoPE config builds (models/common/rope.py: RoPE.Config theta, scaling and its
    # parameters), as rope_key states it
    rope: tuple = (10000.0, None)


# models/llama3/__init__.py: ComplexRoPE.Config(theta=500000, scaling="llama") with RoPE.Config's
# llama defaults (scaling_factor 8, low_freq_factor 1, high_freq_factor 4, original 8192)
_LLAMA31_ROPE = (500000.0, ("llama3", 8.0, 1.0, 4.0, 8192))
# models/deepseek_v3/__init__.py: theta 10000, scaling "yarn", rope_factor 40, beta_fast 32, beta_slow 1,
# original_seq_len 4096 (the mscales fold into its softmax scale, as DeepSeek-V3's mscale = mscale_all_dim)
_DEEPSEEK_V3_ROPE = (10000.0, ("yarn", 40.0, 4096, 32.0, 1.0))

FLAVORS = (
    Flavor("llama3_8b", "8B", 32, 4096, 32, 8, 14336, 128256, rope=_LLAMA31_ROPE),
    Flavor("llama3_70b", "70B", 80, 8192, 64, 8, 28672, 128256, rope=_LLAMA31_ROPE),
    Flavor(
        "llama3_405b",
        "405B",
        126,
        16384,
        128,
        8,
        53248,
        128256,
        rope=_LLAMA31_ROPE,
        note="llama3_405b builds float8 linear layers (in its model spec, not an override; building it needs torchao "
        "and an SM89+ GPU), which the plan's 16-bit estimate does not model",
    ),
    Flavor(
        "deepseek_v3_671b",
        "671B",
        61,
        7168,
        128,
        128,
        18432,
        129280,
        module="deepseek_v3",
        max_seq_len=16384,
        head_dim=128,
        experts=(256, 8, 2048, 1, 3),
        mla=(512, 1536, 64, 128),
        rope=_DEEPSEEK_V3_ROPE,
        note="deepseek_v3_671b routes as DeepSeek-V3 does (sigmoid scores, 8 groups of which 4 are kept, a "
        "load-balancing bias); the plan costs balanced top-8 routing",
    ),
    Flavor(
        "qwen3_30b_a3b",
        "30B-A3B",
        48,
        2048,
        32,
        4,
        768,
        151936,
        module="qwen3",
        max_seq_len=40960,
        head_dim=128,
        experts=(128, 8, 768, 0, 0),
        qk_norm=True,
        rope=(1000000.0, None),
    ),  # models/qwen3: theta 1e6, no scaling
)


def rope_key(model: ModelSpec) -> tuple:
    """(theta, scaling) as Flavor.rope holds it: Llama 3.1's (type, factor, low, high, original),
    YaRN's (type, factor, original, beta_fast, beta_slow) with equal mscales (which fold into the
    softmax scale as torchtitan's deepseek_v3 does; unequal ones are no flavor), else the type and
    factor."""
    r = model.rope_scaling
    if r is None:
        return (model.rope_theta, None)
    if r.rope_type == "llama3":
        return (model.rope_theta, ("llama3", r.factor, *r.band()))
    if r.rope_type == "yarn" and (r.mscale or 1.0) == (
        r.mscale_all_dim if r.mscale_all_dim is not None else r.mscale or 1.0
    ):
        return (
            model.rope_theta,
            ("yarn", r.factor, r.original_max_position_embeddings or 4096, r.beta_fast or 32.0, r.beta_slow or 1.0),
        )
    return (model.rope_theta, (r.rope_type, r.factor, "unmatched"))


PRECISIONS = {DType.bf16: "bfloat16", DType.fp32: "float32"}  # TrainingConfig.mixed_precision_param's choices


def matching_flavor(model: ModelSpec) -> Optional[Flavor]:
    """The torchtitan config that builds this model, or None (a generic export): a Llama-style
    decoder (SwiGLU, two RMSNorms a layer, full causal attention, plain logits, no biases: the
    blocks of models/common/decoder.py and feed_forward.py) of the config's shape and rotary
    embedding (rope_key), with QK-norm exactly where the config has it."""
    llama = (
        model.activation == Activation.swiglu
        and model.norm == "rmsnorm"
        and not model.linear_bias
        and not model.learned_position_embeddings
        and not model.tied_embeddings
        and model.norms_per_layer == 2
        and model.sliding_window is None
        and not model.logit_softcapping
    )
    mla = (model.kv_lora_rank, model.q_lora_rank, model.qk_rope_head_dim, model.v_dim) if model.mla else None
    shape = (
        model.num_layers,
        model.hidden_size,
        model.num_heads,
        model.kv_heads,
        model.ffn,
        model.vocab_size,
        model.head_dim,
        _experts(model),
        model.qk_norm,
        mla,
        rope_key(model),
    )
    for f in FLAVORS:
        if (
            llama
            and not model.qkv_bias
            and shape
            == (
                f.num_layers,
                f.hidden_size,
                f.num_heads,
                f.kv_heads,
                f.ffn,
                f.vocab_size,
                f.head_dim or f.hidden_size // f.num_heads,
                f.experts,
                f.qk_norm,
                f.mla,
                f.rope,
            )
        ):
            return f
    return None


def model_problems(model: ModelSpec) -> list[str]:
    """The architecture fields no torchtitan 0.3.0 component builds (a model that is none of
    its configs is the user's config_registry function, assembled from them: _features)."""
    out = []
    if Activation(model.activation) == Activation.geglu:
        # models/common/feed_forward.py: FeedForward (and its subclasses) is w2(silu(w1 x) * w3 x);
        # GELU appears only in ungated vision and diffusion MLPs (common/vision_encoder.py, flux).
        out.append("activation geglu (torchtitan 0.3.0's gated feed-forward is SwiGLU only)")
    if model.mtp_layers:
        out.append(
            f"mtp_layers {model.mtp_layers} (torchtitan 0.3.0 builds no multi-token prediction: models/deepseek_v3 "
            "has none)"
        )
    if model.norms_per_layer == 3:
        # models/common/decoder.py:TransformerBlock has two norms, muse_glimmer's block four.
        out.append("norms_per_layer 3 (torchtitan's blocks have two norms, or four: models/muse_glimmer)")
    return out


def _experts(model: ModelSpec) -> Optional[tuple]:
    if not model.is_moe:
        return None
    return (
        model.num_experts,
        model.experts_per_token,
        model.moe_ffn,
        model.num_shared_experts,
        model.first_dense_layers,
    )


def problems(plan: Plan, model: ModelSpec, job: JobSpec) -> list[str]:
    """What torchtitan 0.3 cannot run of the plan that `RULES` does not cover: layout_problems
    (nothing here depends on the layer split)."""
    return layout_problems(plan.layout, model, job)


def layout_problems(plan: Layout, model: ModelSpec, job: JobSpec) -> list[str]:
    """What torchtitan 0.3 cannot run of a layout (a search candidate, or Plan.layout) that
    `RULES` does not cover."""
    out = []
    if DType(job.precision) not in PRECISIONS:
        out.append(
            f"{DType(job.precision).value} precision (torchtitan's mixed_precision_param is bfloat16 or float32)"
        )
    if Optimizer(job.optimizer) != Optimizer.adam:
        # components/optimizer/optimizer.py:_resolve_optimizer_factory knows Adam and AdamW only.
        out.append(f"optimizer {Optimizer(job.optimizer).value} (torchtitan builds Adam or AdamW)")
    if plan.tp > 1 and model.kv_heads % plan.tp:
        # models/common/decoder.py:Decoder.Config.update_from_config: tp must divide n_kv_heads.
        out.append(
            f"tp={plan.tp} over the {model.kv_heads} KV heads of {model.name} (torchtitan shards KV heads, never replicates them)"
        )
    # trainer.py (Trainer.__init__): seq_len must be divisible by tp under sequence parallelism,
    # times 2 x cp under context parallelism (the head-tail chunks).
    divisor = (plan.tp if plan.sequence_parallel else 1) * (2 * plan.cp if plan.cp > 1 else 1)
    if job.seq_len % divisor and plan.cp == 1:
        out.append(
            f"seq_len {job.seq_len} with sequence parallelism over tp={plan.tp} (torchtitan needs seq_len divisible by tp)"
        )
    elif job.seq_len % divisor:
        out.append(
            f"seq_len {job.seq_len} with context parallelism cp={plan.cp}"
            + (f" and sequence parallelism over tp={plan.tp}" if plan.sequence_parallel else "")
            + f" (torchtitan needs seq_len divisible by {divisor})"
        )
    if plan.cp > 1 and plan.zero_stage == 0:
        # ParallelDims.fsdp_enabled is dp_shard > 1 or cp > 1: the weights are FSDP-sharded over
        # the cp ranks, where ZeRO-0 replicates them over dp x cp.
        out.append(
            f"context parallelism cp={plan.cp} with ZeRO-0 (torchtitan always FSDP-shards the weights over the cp ranks)"
        )
    if plan.pp > 1 and model.tied_embeddings:
        # Decoder.Config.update_from_config: "Weight tying is not supported with Pipeline Parallel."
        out.append("tied embeddings with pipeline parallelism (torchtitan does not tie weights across pipeline stages)")
    if plan.pp > 1 and plan.schedule == Schedule.one_f_one_b and plan.num_micro_batches < plan.pp:
        # torch/distributed/pipelining/schedules.py: Schedule1F1B needs n_microbatches >= stages.
        out.append(
            f"1F1B with {plan.num_micro_batches} micro-batches on {plan.pp} pipeline ranks (torch's Schedule1F1B needs at least pp)"
        )
    f = matching_flavor(model)
    if f is not None and job.seq_len > f.max_seq_len:
        out.append(f"seq_len {job.seq_len} beyond the {f.max_seq_len} RoPE positions of torchtitan's {f.config} config")
    return out + _expert_problems(plan, model)


def _expert_problems(plan: Layout, model: ModelSpec) -> list[str]:
    """Where torchtitan's expert placement is not the plan's (experts whole, expert-TP 1)."""
    out = []
    if model.is_moe and plan.tp > 1 and plan.ep == 1:
        # models/common/moe_sharding.py:expert_param_placement_dense: without EP the experts are
        # sharded over the TP axis (and the tokens gathered for them), where the plan keeps every
        # expert whole on each rank of its sequence shard.
        out.append(
            f"a mixture-of-experts layer with tp={plan.tp} and ep=1 (torchtitan then shards the experts over TP; use ep > 1)"
        )
    if plan.ep > 1 and plan.zero_stage == 0 and plan.ep != plan.tp:
        # EP borrows ranks from dp_shard x cp x tp only (ParallelismConfig.expert_parallel_degree);
        # the replicate-only mesh of ZeRO-0 has dp_shard 1, so ep must divide tp, and any ep < tp
        # leaves efsdp = tp / ep ranks over which FSDP shards the experts (ZeRO-3 for experts).
        out.append(
            f"expert parallelism ep={plan.ep} with ZeRO-0 (torchtitan folds experts into the replicate-only mesh only as ep = tp = {plan.tp})"
        )
    return out
