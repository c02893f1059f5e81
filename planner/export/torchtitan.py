"""torchtitan 0.3.0: a plan as the command-line overrides of `torchtitan.train`.

torchtitan 0.3 picks the model with `--module llama3 --config llama3_8b` (a function of
torchtitan/models/llama3/config_registry.py that returns a whole Trainer.Config; the model's
dimensions are in it and not on the command line: Trainer.Config.model_spec is
`tyro.conf.Suppress`ed in trainer.py). Everything else is a tyro override of that config
(config/manager.py:ConfigManager.parse_args), e.g. `--parallelism.tensor_parallel_degree 4`;
activation checkpointing is a tyro subcommand (`activation-checkpoint:full`) and must come last.

A model that is one of torchtitan's configs listed in FLAVORS (Llama 3 8B, 70B, 405B; DeepSeek-V3
671B; Qwen3 30B-A3B: same layers, width, heads, KV heads, head width, FFN width, vocabulary and,
for mixture-of-experts models, experts, top-k, expert width, shared experts and dense first
layers) gets `--module M --config F`. Any other model is "generic": the overrides are the same,
but the user must name a config_registry function that builds the model (`--module M --config F`,
see config_registry.py); the text says so and lists the dimensions that model must have. `data`
is then the overrides alone.

Mixture-of-experts models: --parallelism.expert_parallel_degree splits each MoE layer's routed
experts over ep ranks that ParallelDims borrows from dp_shard x cp x tp (the sparse mesh
pp, dp_replicate, efsdp, ep with ep innermost: the cost model's folding, expert-TP 1), exchanging
tokens by all-to-all and running the local experts as grouped GEMMs (models/common/moe.py); FSDP
shards the experts over efsdp = dp_shard x tp / ep with the dense layers' reshard policy. The
standard all-to-all dispatcher synchronises with the CPU, so ep > 1 turns CUDA graphs off as a
pipeline does (Trainer.Config._validate_cuda_graphs). The cost model assumes balanced routing;
torchtitan routes dropless (no capacity factor in the standard dispatcher).

Context parallelism: --parallelism.context_parallel_degree cp splits each sequence into 2 x cp
head-tail chunks (--parallelism.context_parallel_load_balancer headtail: rank r keeps chunks r
and 2cp-1-r, distributed/context_parallel/api.py:cp_shard; trainer.py asserts seq_len divisible
by 2 x cp, times tp under sequence parallelism), on the mesh's cp axis between dp and tp (the
plan's order), FSDP sharding over dp_shard x cp (ParallelDims: "we always assume that when cp
is used, FSDP is also applied"; distributed/full_dtensor.py:resolve_fsdp_mesh). The attention
is not the cost model's ring: torchtitan 0.3.0's language models run FlexAttention (the
default spmd_types backend refuses CP with SDPA, full_dtensor.py:validate_config; sdpa is no
language-model backend, models/common/config_utils.py), and CP with FlexAttention all-gathers
K and V over the cp ranks before each attention and reduce-scatters their gradients
(models/common/decoder_sharding.py: k/v Replicate on cp; distributed/context_parallel/api.py:
flex_cp_allgather on the other backend). It has no option to rotate K/V around a ring (torch's
set_rotate_method is for SDPA and not called). The bytes are the ring's (cp - 1 chunks of K/V
in, their gradients out), but the all-gather waits before the kernel instead of hiding behind
its blocks, and the gathered K/V are saved for backward: the text states that memory per layer.

FP8 is not exported (rules.py: RULES.fp8 False): torchtitan 0.3.0 puts float8 in the model spec
(model_registry(converters=[Float8LinearConverter.Config()]) inside a config_registry function,
as llama3_405b does), which no override reaches (Trainer.Config.model_spec is Suppress'ed), and
its Float8LinearConverter.Config.recipe_name offers only "rowwise" and "rowwise_with_gw_hp"
(components/quantization/float8.py: torchao's per-row scales, E4M3 gradients or a 16-bit weight
gradient), not the plan's per-tensor E4M3 forward / E5M2 gradient recipe; it also needs torchao
and an SM89+ GPU where it is built.

Hybrid sharding (Plan.dp_shard below dp, ZeRO-2/3) is torchtitan's HSDP:
--parallelism.data_parallel_replicate_degree dp / dp_shard and data_parallel_shard_degree dp_shard
(config/configs.py:ParallelismConfig: "If `data_parallel_replicate_degree` is also greater than 1,
the parallelism method used is HSDP"). ParallelDims.build_mesh lays the world out as pp,
dp_replicate, dp_shard, cp, tp (outermost first), so a shard group is dp_shard consecutive dp
ranks, and distributed/full_dtensor.py:resolve_fsdp_mesh shards over ("dp_shard", "cp") and
replicates over "dp_replicate": the plan's shard group of dp_shard x cp ranks, dp / dp_shard
replicas of it. Experts: the sparse mesh is pp, dp_replicate, efsdp, ep with efsdp = dp_shard x
cp x tp / ep, so ep must divide dp_shard x cp x tp (the export refuses it otherwise).

The world size is no override: torchrun starts the ranks, and ParallelDims
(distributed/parallel_dims.py) checks that dp_replicate x dp_shard x cp x tp x pp equals it.

Sources cited below are files of the installed `torchtitan` 0.3.0 package (and of torch, for the
pipeline schedules); tests/unit/export/test_torchtitan.py feeds the exports to them.
"""

from __future__ import annotations

import shlex

from planner.errors import UsageError
from planner.specs import DTYPE_BYTES, DType, JobSpec, ModelSpec, Plan, Recompute, Schedule
from planner.stacks.stack import Export, windowed
from planner.stacks.torchtitan.rules import FLAVORS, PRECISIONS, RULES, matching_flavor

_SCHEDULES = {Schedule.gpipe: "GPipe", Schedule.one_f_one_b: "1F1B", Schedule.interleaved_1f1b: "Interleaved1F1B"}
_RESHARD = {0: "default", 2: "never", 3: "always"}  # fsdp_reshard_after_forward per ZeRO stage
_AC = "activation-checkpoint:"  # tyro subcommand prefix (activation_checkpoint.py:ActivationCheckpointingConfig)


def export(plan: Plan, model: ModelSpec, job: JobSpec, num_gpus: int) -> Export:
    """The overrides for `plan` (data: the argv list; text: a bash array of them, with a header)."""
    args = _model_args(model) + _parallel_args(plan, model) + _training_args(plan, job) + _ac_args(plan, model)
    return Export(stack="torchtitan", text=_text(args, plan, model, job, num_gpus), data=args, kind="args")


def _model_args(model: ModelSpec) -> list[str]:
    f = matching_flavor(model)
    return ["--module", f.module, "--config", f.config] if f else []


def _dp_degrees(plan: Plan) -> tuple[int, int]:
    """(data_parallel_replicate_degree, data_parallel_shard_degree): a replicate-only mesh for
    ZeRO-0, HSDP's replicas x shard group for hybrid sharding, else one shard group of all dp."""
    if plan.zero_stage == 0:
        return plan.dp, 1
    if plan.dp_shard:
        if (plan.dp_shard * plan.cp * plan.tp) % plan.ep:
            # ParallelDims.build_mesh: efsdp = dp_shard x cp x tp // ep, then the sparse mesh
            # pp x dp_replicate x efsdp x ep must make the world
            raise UsageError(
                f"torchtitan borrows expert-parallel ranks from a shard group: ep={plan.ep} must divide "
                f"dp_shard x cp x tp = {plan.dp_shard * plan.cp * plan.tp}; use a larger dp_shard or a smaller ep"
            )
        return plan.dp // plan.dp_shard, plan.dp_shard
    return 1, plan.dp


def _parallel_args(plan: Plan, model: ModelSpec) -> list[str]:
    replicate, shard = _dp_degrees(plan)
    out = [
        "--parallelism.data_parallel_replicate_degree",
        str(replicate),
        "--parallelism.data_parallel_shard_degree",
        str(shard),
        "--parallelism.fsdp_reshard_after_forward",
        _RESHARD[plan.zero_stage],
        "--parallelism.context_parallel_degree",
        str(plan.cp),
    ]
    if plan.cp > 1:  # the plan's causal load balancing: 2 x cp chunks, rank r keeps r and 2cp-1-r
        out += ["--parallelism.context_parallel_load_balancer", "headtail"]
    out += ["--parallelism.tensor_parallel_degree", str(plan.tp)]
    if plan.tp > 1:
        out.append(
            "--parallelism.enable_sequence_parallel"
            if plan.sequence_parallel
            else "--parallelism.no_enable_sequence_parallel"
        )
    if model.is_moe:  # always: a config may set its own (deepseek_v3_671b: 2)
        out += ["--parallelism.expert_parallel_degree", str(plan.ep)]
    out += ["--parallelism.pipeline_parallel_degree", str(plan.pp)]
    if plan.pp > 1:
        out += [
            "--parallelism.pipeline_parallel_schedule",
            _SCHEDULES[Schedule(plan.schedule)],
            "--parallelism.pipeline_parallel_microbatch_size",
            str(plan.micro_batch_size),
            "--parallelism.module_fqns_per_model_part",
            *model_parts(plan.stage_layers(model.num_layers)),
        ]
    if plan.pp > 1 or plan.ep > 1:
        # Trainer.Config._validate_cuda_graphs: "CUDA graphs do not support pipeline parallelism
        # yet", nor an expert-parallel dispatcher that synchronises with the CPU (the standard one)
        out.append("--training.disable_cuda_graphs")
    return out


def model_parts(stage_layers: list[int]) -> list[str]:
    """One comma-separated module list per virtual stage, in pipeline order: the first holds the
    embedding, the last the final norm and LM head (the names of pipeline_parallel.py's split)."""
    parts, first = [], 0
    for j, n in enumerate(stage_layers):
        names = [f"layers.{i}" for i in range(first, first + n)]
        first += n
        if j == 0:
            names.insert(0, "tok_embeddings")
        if j == len(stage_layers) - 1:
            names += ["norm", "lm_head"]
        parts.append(",".join(names))
    return parts


def _training_args(plan: Plan, job: JobSpec) -> list[str]:
    """Batch, sequence, precision, TP overlap. Without a pipeline, local_batch_size is one
    micro-batch and torchtitan accumulates global / (local x dp) of them; with one, the
    schedule runs all micro-batches of a step: local = micro-batch x count, one accumulation
    step (trainer.py: gradient_accumulation_steps, num_pipeline_parallel_microbatches)."""
    local = plan.micro_batch_size * (plan.num_micro_batches if plan.pp > 1 else 1)
    out = [
        "--training.local_batch_size",
        str(local),
        "--training.global_batch_size",
        str(job.global_batch_size),
        "--training.seq_len",
        str(job.seq_len),
        "--training.dtype",
        "float32",  # fp32 master weights and optimizer states; compute in:
        "--training.mixed_precision_param",
        PRECISIONS[DType(job.precision)],
    ]
    if plan.tp_comm_overlap:
        return out + [
            "--compile.enable",
            "--compile.components",
            "model,loss",
            "--compile.enable_async_tensor_parallel",
        ]
    return out + ["--compile.no_enable_async_tensor_parallel"]  # llama3_405b turns it on


def _ac_args(plan: Plan, model: ModelSpec) -> list[str]:
    """The activation-checkpoint subcommand: the one mode of every layer (RULES: uniform)."""
    return [_AC + recompute_mode(plan, model).value]


def recompute_mode(plan: Plan, model: ModelSpec) -> Recompute:
    """The one recompute mode of every layer (the first used, should RULES have let a mixture by)."""
    counts = plan.stage_recompute_counts(model.num_layers)
    modes = (Recompute.none, Recompute.selective, Recompute.full)  # the per-layer modes (not `mixed`)
    return next((m for m in modes if any(getattr(c, m.value) for c in counts)), Recompute.none)


def _text(args: list[str], plan: Plan, model: ModelSpec, job: JobSpec, num_gpus: int) -> str:
    f = matching_flavor(model)
    shard_dp = plan.dp_shard or plan.dp  # the dp ranks one copy of the states is sharded over (times cp)
    group = f"dp x cp = {plan.dp} x {plan.cp}" if plan.cp > 1 else f"dp={plan.dp}"  # the ranks holding the same weights
    if plan.dp_shard:
        group = f"dp_shard x cp = {shard_dp} x {plan.cp}" if plan.cp > 1 else f"dp_shard={shard_dp}"
    dp = {
        0: f"replicated over {group} (ZeRO-0)",
        2: f"FSDP over {group}, parameters kept from forward to backward (ZeRO-2)",
        3: f"FSDP full shard over {group} (ZeRO-3)",
    }[plan.zero_stage] + (f"; HSDP: {plan.dp // shard_dp} replicas of the group" if plan.dp_shard else "")
    degrees = (
        f"dp {plan.dp} x cp {plan.cp} x tp {plan.tp} x pp {plan.pp} (tp innermost, then cp)"
        if plan.cp > 1
        else (f"dp {plan.dp} x tp {plan.tp} x pp {plan.pp} (tp innermost)")
    )
    lines = [f"# torchtitan 0.3.0 overrides: {model.name} on {num_gpus} GPUs = {degrees}; {dp}"]
    if plan.cp > 1:
        lines += _cp_lines(plan, model, job)
    if model.is_moe:
        shard, cp = ("dp_shard x cp x tp", " x cp") if plan.cp > 1 else ("dp_shard x tp", "")
        dp_name = "dp_shard" if plan.dp_shard else "dp"
        spread = (
            f"FSDP-sharded over efsdp = {dp_name}{cp} x tp / ep = {shard_dp * plan.cp * plan.tp // plan.ep} ranks"
            + (f", replicated over {plan.dp // shard_dp}" if plan.dp_shard else "")
            if plan.zero_stage
            else f"replicated over the {plan.dp} replicas"
        )
        lines.append(
            f"# experts: {model.num_experts} per MoE layer, split over ep {plan.ep} ranks borrowed from {shard} "
            f"({model.num_experts // plan.ep} whole on each), {spread}"
        )
    if plan.pp > 1:
        lines.append(
            f"# batch: global {job.global_batch_size} = dp {plan.dp} x {plan.num_micro_batches} pipeline micro-batches "
            f"of {plan.micro_batch_size} (local batch {plan.micro_batch_size * plan.num_micro_batches}), no accumulation"
        )
    else:
        lines.append(
            f"# batch: global {job.global_batch_size} = dp {plan.dp} x local batch {plan.micro_batch_size} "
            f"x {plan.num_micro_batches} accumulation steps"
        )
    module = ""
    if f is None:
        module = " --module YOUR_MODULE --config YOUR_CONFIG"
        example = "qwen3" if model.is_moe else "llama3"
        lines += [
            f"# {model.name} is none of torchtitan's configs in the planner's list: write a config_registry function "
            f"(as in torchtitan/models/{example}/config_registry.py) whose model has",
            "#   " + _dimensions(model),
            "# with modules named tok_embeddings, layers.<i>, norm, lm_head (the pipeline split names them), "
            "and pass it as --module/--config.",
        ]
        if plan.cp > 1:  # full_dtensor.py:validate_config; models/llama3/model.py refuses varlen with CP
            lines.append(
                '# context parallelism needs its attention to be FlexAttention (attn_backend "flex", as llama3\'s)'
            )
    elif f.note:
        lines.append(f"# {f.note}")
    lines.append(
        f"# launch {num_gpus} ranks in all: torchrun --nnodes N --nproc_per_node G ... -m torchtitan.train"
        f'{module} "${{TORCHTITAN_ARGS[@]}}"'
    )
    return "\n".join(lines + ["TORCHTITAN_ARGS=("] + [f"  {line}" for line in _grouped(args)] + [")"]) + "\n"


def _cp_lines(plan: Plan, model: ModelSpec, job: JobSpec) -> list[str]:
    """What torchtitan's context parallelism does beside the plan's ring (module docstring)."""
    s, cp = job.seq_len, plan.cp
    # K and V of the other ranks' chunks, this rank's KV heads (tp shards them), saved by the
    # attention for backward: b x (s - s / cp) x kv_heads / tp x (key + value head widths) x bytes.
    extra = (
        plan.micro_batch_size
        * (s - s // cp)
        * (model.kv_heads // plan.tp)
        * (model.qk_head_dim + model.v_dim)
        * DTYPE_BYTES[job.precision]
    )
    kept = (
        "holds them only in the layer being recomputed (full recompute)"
        if recompute_mode(plan, model) == Recompute.full
        else f"keeps them for backward: {extra / 2**20:,.0f} MiB per layer and micro-batch beyond the plan's estimate"
    )
    return [
        f"# context parallelism: each {s}-token sequence over cp {cp} ranks in {2 * cp} head-tail chunks of {s // (2 * cp)} tokens;",
        "#   FlexAttention all-gathers K/V before each attention (0.3.0 has no ring: the ring's bytes, not overlapped)",
        f"#   and {kept}",
    ]


def _dimensions(model: ModelSpec) -> str:
    heads = f"{model.num_heads} heads ({model.kv_heads} KV" + (
        f", {model.head_dim} wide)" if model.attention_head_dim else ")"
    )
    if model.is_moe:
        mlp = (
            f"{model.num_experts} experts of width {model.moe_ffn}, top-{model.experts_per_token}"
            + (f", {model.num_shared_experts} shared" if model.num_shared_experts else "")
            + f" ({model.activation.value}, torchtitan's MoE layer)"
            + (f" after {model.first_dense_layers} dense layers of FFN {model.ffn}" if model.first_dense_layers else "")
        )
    else:
        mlp = f"FFN {model.ffn} ({model.activation.value})"
    return (
        f"{model.num_layers} layers, hidden {model.hidden_size}, {heads}, {mlp}, vocabulary {model.vocab_size}, {model.norm}"
        + (", learned positions" if model.learned_position_embeddings else ", rotary positions")
        + (", biases" if model.linear_bias else "")
        + (", tied embeddings" if model.tied_embeddings else "")
        + "".join(f", {f}" for f in _features(model))
    )


def _features(model: ModelSpec) -> list[str]:
    """The spec's architecture fields beyond a Llama decoder, each with the torchtitan 0.3.0
    component config that builds it (model_problems refuses the rest)."""
    out = []
    if not model.learned_position_embeddings:
        r = model.rope_scaling
        how = (
            "scaling 'none'"
            if r is None
            else f"scaling 'llama', scaling_factor {r.factor:g}, low_freq_factor {r.band()[0]:g}, high_freq_factor {r.band()[1]:g}, "
            f"original_max_position_embeddings {r.band()[2]}"
            if r.rope_type == "llama3"
            else f"scaling 'yarn', rope_factor {r.factor:g}, beta_fast {r.beta_fast or 32:g}, beta_slow {r.beta_slow or 1:g}, "
            f"original_seq_len {r.original_max_position_embeddings or 4096}"
            if r.rope_type == "yarn"
            else f"a {r.rope_type} scaling of factor {r.factor:g}, which RoPE.Config has not: your own RoPE module"
        )
        out.append(
            f"rotary base {model.rope_theta:,.0f} (RoPE.Config theta={model.rope_theta:g}, {how}; models/common/rope.py)"
        )
    if model.qkv_bias:
        out.append(
            "biases on the query, key and value projections only (the attention's qkv_linear with bias, as the stock "
            "wq/wk/wv biases models/common/attention.py splits)"
        )
    if model.norms_per_layer == 4:
        out.append(
            "norms before and after attention and the MLP (MuseGlimmerTransformerBlock.Config's post_attention_norm "
            "and post_ffn_norm, models/muse_glimmer/model.py)"
        )
    if model.qk_norm:
        out.append(f"QK-norm (GQAttention.Config.qk_norm, an RMSNorm of {model.head_dim}, as models/qwen3 builds it)")
    if model.mla:
        out.append(
            f"multi-head latent attention (q_lora_rank {model.q_lora_rank or 0}, kv_lora_rank {model.kv_lora_rank}, "
            f"qk_nope_head_dim {model.head_dim}, qk_rope_head_dim {model.qk_rope_head_dim}, v_head_dim {model.v_dim}: "
            "the attention of models/deepseek_v3/model.py)"
        )
    if model.sliding_window is not None:
        out.append(
            f"a {model.sliding_window}-key sliding window on {windowed(model)} (the attention's sliding_window_size "
            "per layer, as models/gpt_oss/model.py)"
        )
    if model.glu_limit is not None:
        out.append(
            f"the MLP's halves clamped at {model.glu_limit:g} (GptOssGroupedExperts.Config.swiglu_limit, "
            "models/gpt_oss/moe.py)"
        )
    if model.rope_attention_factor != 1.0:
        out.append(
            f"YaRN rotary scaling of attention factor {model.rope_attention_factor:.4g} (CosSinRoPE.Config "
            "scaling 'yarn' with your model's rope_factor, models/common/rope.py; the factor folded into the "
            "softmax scale as models/gpt_oss/model.py does)"
        )
    if model.logit_softcapping:
        out.append(
            "soft-capped logits (an lm_head of SoftCappedLinear.Config with output_soft_cap_temp your model's cap, "
            "models/muse_glimmer/model.py)"
        )
    return out


def _grouped(args: list[str]) -> list[str]:
    """One option and its values a line, shell-quoted."""
    lines: list[list[str]] = []
    for a in args:
        if (
            (a.startswith("--") and a != "--config") or a.startswith(_AC) or not lines
        ):  # --module M --config F: one line
            lines.append([a])
        else:
            lines[-1].append(a)
    return [shlex.join(words) for words in lines]


# --------------------------------------------------------------------------- read back


def read_back(data) -> dict:
    """Our fields from torchtitan overrides: the Trainer.Config that ConfigManager.parse_args
    returns, or the argv list `export` gives (keys it omits take configs.py's defaults). The
    batch follows trainer.py: accumulation = global / (local x dp); with a pipeline, local is
    split into micro-batches of pipeline_parallel_microbatch_size."""
    s = _from_config(data) if hasattr(data, "parallelism") else _from_argv(list(data))
    if s["shard"] < 1:
        raise ValueError("data_parallel_shard_degree -1 (the leftover ranks) needs the world size to read back")
    if s["dtype"] != "float32":
        raise ValueError(f"training.dtype {s['dtype']} (no fp32 master weights) is none of our precisions")
    if s["ac"] not in ("none", "full"):
        raise ValueError(
            f"activation-checkpoint:{s['ac']} is none of our recompute modes (torchtitan's selective is per-op SAC)"
        )
    dp, pp, local, parts = s["replicate"] * s["shard"], s["pp"], s["local"], s["parts"]
    global_batch = s["global"] if s["global"] > 0 else local * dp
    if global_batch % (local * dp):  # trainer.py asserts the same in Trainer.__init__
        raise ValueError(
            f"global batch {global_batch} is not a multiple of local batch {local} x data-parallel degree {dp}"
        )
    mbs = s["pp_mbs"] if pp > 1 else local
    schedule = {v.lower(): k.value for k, v in _SCHEDULES.items()}.get(s["schedule"].lower(), s["schedule"])
    if pp > 1 and not parts:  # pipeline_parallel.py:_get_pipeline_metadata's default: 2 stages a rank if looped
        parts = [[]] * (pp * (2 if schedule == Schedule.interleaved_1f1b.value else 1))
    assert RULES.mesh_orders is not None  # torchtitan's one order (planner/stacks/torchtitan/rules.py)
    zero = _zero_stage(s["reshard"], s["shard"], pp)
    return {
        "dp": dp,
        "tp": s["tp"],
        "pp": pp,
        "vpp": len(parts) // pp if pp > 1 else 1,
        "micro_batch_size": mbs,
        "num_micro_batches": (local // mbs) * (global_batch // (local * dp)),
        "global_batch_size": global_batch,
        "seq_len": s["seq_len"],
        "zero_stage": zero,
        "dp_shard": s["shard"] if zero and s["replicate"] > 1 else None,  # HSDP: replicas of a shard group
        "sequence_parallel": s["tp"] > 1 and s["sp"],
        "tp_comm_overlap": s["async_tp"],
        "schedule": schedule,
        "layers_per_stage": [sum(1 for n in p if n.startswith("layers.")) for p in parts]
        if pp > 1 and any(parts)
        else None,
        "recompute": s["ac"],
        "precision": {v: k.value for k, v in PRECISIONS.items()}[s["mp_param"]],
        "mesh_order": [a.value for a in RULES.mesh_orders[0]],
        "flavor": s["flavor"],
        "ep": s["ep"],
        "cp": s["cp"],
    }


def _zero_stage(reshard: str, shard: int, pp: int) -> int:
    """fsdp.py:get_fsdp_reshard_after_forward_policy: "default" reshards unless pp > 1."""
    if reshard == "default":
        return 0 if shard == 1 else (2 if pp > 1 else 3)
    return {"never": 2, "always": 3}[reshard]


def _from_config(c) -> dict:
    p, t = c.parallelism, c.training
    policy = type(c.activation_checkpoint).__qualname__.split(".")[0]  # e.g. FullAC.Config -> FullAC
    spec = getattr(c, "model_spec", None)
    return {
        "replicate": p.data_parallel_replicate_degree,
        "shard": p.data_parallel_shard_degree,
        "reshard": p.fsdp_reshard_after_forward,
        "tp": p.tensor_parallel_degree,
        "sp": p.enable_sequence_parallel,
        "pp": p.pipeline_parallel_degree,
        "schedule": p.pipeline_parallel_schedule,
        "pp_mbs": p.pipeline_parallel_microbatch_size,
        "parts": p.module_fqns_per_model_part,
        "local": t.local_batch_size,
        "global": t.global_batch_size,
        "seq_len": t.seq_len,
        "dtype": t.dtype,
        "mp_param": t.mixed_precision_param,
        "async_tp": c.compile.enable_async_tensor_parallel,
        "ac": _AC_NAMES.get(policy, policy),
        "flavor": spec.flavor if spec is not None else None,
        "ep": p.expert_parallel_degree,
        "cp": p.context_parallel_degree,
    }


_AC_NAMES = {"NoneType": "none", "FullAC": "full", "SelectiveAC": "selective", "MemoryBudgetAC": "memory-budget"}
# argv key -> (our key, type); absent keys take config/configs.py's defaults (_ARGV_DEFAULTS).
_ARGV_KEYS = {
    "--parallelism.data_parallel_replicate_degree": ("replicate", int),
    "--parallelism.data_parallel_shard_degree": ("shard", int),
    "--parallelism.fsdp_reshard_after_forward": ("reshard", str),
    "--parallelism.tensor_parallel_degree": ("tp", int),
    "--parallelism.pipeline_parallel_degree": ("pp", int),
    "--parallelism.pipeline_parallel_schedule": ("schedule", str),
    "--parallelism.pipeline_parallel_microbatch_size": ("pp_mbs", int),
    "--training.local_batch_size": ("local", int),
    "--training.global_batch_size": ("global", int),
    "--training.seq_len": ("seq_len", int),
    "--training.dtype": ("dtype", str),
    "--training.mixed_precision_param": ("mp_param", str),
    "--config": ("flavor", str),
    "--parallelism.expert_parallel_degree": ("ep", int),
    "--parallelism.context_parallel_degree": ("cp", int),
}
_ARGV_FLAGS = {"--parallelism.enable_sequence_parallel": "sp", "--compile.enable_async_tensor_parallel": "async_tp"}
_ARGV_DEFAULTS = {
    "replicate": 1,
    "shard": -1,
    "reshard": "default",
    "tp": 1,
    "sp": True,
    "pp": 1,
    "schedule": "1F1B",
    "pp_mbs": 1,
    "parts": None,
    "local": 8,
    "global": -1,
    "seq_len": 2048,
    "dtype": "float32",
    "mp_param": "bfloat16",
    "async_tp": False,
    "ac": "selective",
    "flavor": None,
    "ep": 1,
    "cp": 1,
}  # Trainer.Config's AC: SelectiveAC


def _from_argv(argv: list[str]) -> dict:
    s, i = dict(_ARGV_DEFAULTS), 0
    while i < len(argv):
        a = "--" + argv[i][2:].replace("-", "_") if argv[i].startswith("--") else argv[i]  # tyro takes - or _
        if a in _ARGV_KEYS:
            key, kind = _ARGV_KEYS[a]
            s[key], i = kind(argv[i + 1]), i + 2
            continue
        if a == "--parallelism.module_fqns_per_model_part":
            j = i + 1
            while j < len(argv) and not argv[j].startswith("--") and ":" not in argv[j]:
                j += 1
            s["parts"], i = [part.split(",") for part in argv[i + 1 : j]], j
            continue
        flag = a.replace(".no_", ".", 1)
        if flag in _ARGV_FLAGS:
            s[_ARGV_FLAGS[flag]] = flag == a
        elif a.replace("_", "-").startswith(_AC):
            s["ac"] = a.split(":", 1)[1]
        i += 1
    s["flavor"] = next((f.flavor for f in FLAVORS if f.config == s["flavor"]), s["flavor"])
    return s
