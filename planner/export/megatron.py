"""Megatron-LM command-line arguments for a plan (megatron-core 0.16.1 and the Megatron-LM of
the same tag, core_v0.16.1): `plan export PLAN --to megatron` prints them, one flag a line, to
append to `torchrun ... pretrain_gpt.py`.

Where the flags come from: Megatron-LM's megatron/training/arguments.py writes a few by hand
(batch, pipeline split, data-parallel and optimizer flags) and generates the rest from
megatron-core's config dataclasses (megatron/training/argument_utils.py: field `sequence_parallel`
-> `--sequence-parallel`, unless the field's `argparse_meta` names the flag, as for
`add_bias_linear` -> `--disable-bias-linear`); megatron-core's TransformerConfig /
ModelParallelConfig then validate them (tests/unit/export/test_megatron.py builds those from the
exported arguments).

The data-parallel degree is no flag: Megatron-LM takes it as WORLD_SIZE / (tp x pp x cp) from
the launcher (arguments.py: `args.world_size = int(os.getenv("WORLD_SIZE"))`,
`total_model_size = tp * pp * context_parallel_size`, `args.data_parallel_size =
args.world_size // total_model_size`) and the micro-batch count as global batch / (micro-batch x
dp) (megatron/core/num_microbatches_calculator.py): cp does not multiply the batch. So
`read_back` needs the GPU count to return dp and the micro-batch count.

Context parallelism is the cost model's ring (cost_models/tables.py: cp - 1 K/V passes beside
the attention blocks): --context-parallel-size cp with --cp-comm-type p2p, which
TransformerConfig.cp_comm_type documents as "Exchange KV chunks with P2P communications in ring
topology ... overlapped with attention compute" (Transformer Engine's attention; the local
DotProductAttention asserts cp = 1). Megatron-LM splits each sequence into 2 x cp chunks, rank
r keeping chunks r and 2cp-1-r (core/utils.py:get_batch_on_this_cp_rank, the plan's causal load
balancing; arguments.py asserts seq_length % (2 x cp) == 0). Ranks: tp, then cp, then dp
(parallel_state's "tp-cp-ep-dp-pp"), weights reduced and sharded by the distributed optimizer
over the dp x cp group (distributed/distributed_data_parallel.py: dp_cp_group).

Hybrid sharding (Plan.dp_shard below dp, ZeRO-1 only: rules.py) is the distributed optimizer in
instances: --num-distributed-optimizer-instances dp / dp_shard. Megatron-LM's arguments.py
(core_v0.16.1; not in the megatron-core wheel) declares the flag and initialize.py passes it to
megatron-core's parallel_state.initialize_model_parallel, which cuts each dp x cp group into that
many runs of dp_shard x cp consecutive members (_INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP, cp
innermost: the plan's shard group) and asserts that they divide it; training.py copies it into
DistributedDataParallelConfig, whose buffers reduce-scatter gradients within an instance and
all-reduce each shard across the instances (distributed/param_and_grad_buffer.py:
start_grad_sync), and whose DistributedDataParallel asserts "Partial DistOpt cannot be used
without DistOpt". Experts follow: the expert data-parallel group is cut the same way
(parallel_state.py asserts that the instances divide it), so ep must divide dp_shard x cp x tp.

FP8 is Transformer Engine's "hybrid" format (--fp8-format hybrid: TransformerConfig.fp8, "e4m3
for all FP8 activation and weight tensors and e5m2 for all FP8 output activation gradient
tensors") with per-tensor delayed scaling (--fp8-recipe delayed: each tensor's scale comes from
its amax history, known before the tensor is made, so Transformer Engine writes the FP8 copy
from the kernel that makes it, as the cost model prices the casts (cost_models/compute.py:
linear_times); current "tensorwise" scaling needs the tensor's own amax first, a pass more).
Attention stays 16-bit (fp8_dot_product_attention off) and the output layer is Megatron's own
ColumnParallelLinear, not a TE module, as the cost model keeps the LM head 16-bit. The
schedules mark each step's first micro-batch (pipeline_parallel/schedules.py calls
transformer/module.py:set_is_first_microbatch, which acts when config.fp8 is set) and TE's
linears then cast their weights to FP8 once and reuse the copy (extensions/transformer_engine.py:
is_first_microbatch): the once-per-step weight cast and kept FP8 copy the cost model counts.

Mixture-of-experts models get Megatron-Core's MoE layer as the cost model prices it
(cost_models/compute.py: layer_params, expert_times; cost_models/tables.py: ep_link_of):
--num-experts / --moe-router-topk / --moe-ffn-hidden-size, shared experts as one MLP of
num_shared x expert width (--moe-shared-expert-intermediate-size), the first dense layers as a
--moe-layer-freq pattern, experts split over ep ranks with expert-TP 1
(--expert-model-parallel-size ep --expert-tensor-parallel-size 1: parallel_state.py folds the
expert groups out of the tp x dp ranks, order tp-ep-dp-pp), tokens exchanged by all-to-all
(--moe-token-dispatcher-type alltoall) and each rank's experts run as one grouped GEMM
(--moe-grouped-gemm: Transformer Engine's TEGroupedMLP; Megatron-LM asserts an Ampere or newer
GPU). The cost model assumes balanced, dropless routing (every expert gets top-k x tokens / E):
no --moe-expert-capacity-factor, so Megatron drops no token; balancing the router (its aux loss
coefficient, default 0, or expert bias) is the user's training choice.

Plan.recompute_norm_act is the selective granularity's modules "layernorm" and "moe_act"
(--recompute-granularity selective --recompute-modules layernorm moe_act, core_attn or MLA's
mla_up_proj beside them when the plan recomputes selectively): transformer_layer.py discards a
separate norm's output and reruns the norm in backward (tensor_parallel/random.py:
CheckpointWithoutOutput), the grouped experts the same for their activation (moe/experts.py);
a norm inside Transformer Engine's LayerNormLinear (the attention's, a dense MLP's) is left as
it is, as the cost model prices it (planner/stacks/stack.py:Kernels.norm_in_linear).
"""

from __future__ import annotations

import ast
import shlex
from typing import Optional

from planner.errors import UsageError
from planner.specs import Activation, DType, JobSpec, ModelSpec, Optimizer, Plan, Schedule
from planner.stacks.megatron.rules import megatron_recompute, plan_counts, recompute_setting, tp_pp_dp_mapping
from planner.stacks.stack import Export


def megatron_stage_layers(
    num_layers: int, pp: int, vpp: int, first: Optional[int] = None, last: Optional[int] = None
) -> Optional[list[int]]:
    """Layers per virtual stage (chunk x pp + rank) as Megatron builds them without a layout
    (transformer/transformer_block.py:get_num_layers_to_build): the first / last pipeline rank
    gets `first` / `last` layers, the others share the rest equally, and each rank divides its
    layers equally among its vpp chunks. None where Megatron refuses the numbers."""
    per_rank: list[Optional[int]] = [None] * pp
    if first is not None:
        per_rank[0] = first
    if last is not None:
        per_rank[-1] = last
    rest = num_layers - sum(n for n in per_rank if n is not None)
    middle = per_rank.count(None)
    if rest < 0 or (middle and rest % middle) or (not middle and rest):
        return None
    rank_layers = [rest // middle if n is None else n for n in per_rank]
    if any(n <= 0 or n % vpp for n in rank_layers):
        return None
    return [rank_layers[rank] // vpp for _ in range(vpp) for rank in range(pp)]


def layout_string(stage_layers: list[int]) -> str:
    """--pipeline-model-parallel-layout for these layers per virtual stage: 'E' (embedding)
    opens the first stage, 'L' (loss) closes the last, 't*n' is n decoder layers."""
    stages = [f"t*{n}" for n in stage_layers]
    stages[0], stages[-1] = "E," + stages[0], stages[-1] + ",L"
    return "|".join(stages)


def layout_layers(layout: str) -> list[int]:
    """Decoder layers per virtual stage of a layout written by layout_string."""
    counts = []
    for stage in layout.split("|"):
        n = 0
        for item in filter(None, stage.split(",")):
            kind, _, times = item.partition("*")
            n += int(times or 1) if kind == "t" else 0
        counts.append(n)
    return counts


def _split_flags(plan: Plan, num_layers: int) -> list[tuple]:
    """The pipeline split: nothing when Megatron's even split is the plan's, the first / last
    rank flags when they reproduce it, else the explicit layout (which also sets vpp)."""
    layers = plan.stage_layers(num_layers)
    vpp_flag = [("--num-virtual-stages-per-pipeline-rank", plan.vpp)] if plan.vpp > 1 else []
    if layers == megatron_stage_layers(num_layers, plan.pp, plan.vpp):
        return vpp_flag
    # --num-virtual-stages-per-pipeline-rank, not --num-layers-per-virtual-pipeline-stage: only
    # the former goes with the first / last flags (arguments.py:validate_args).
    first, last = layers[0] * plan.vpp, layers[plan.pp - 1] * plan.vpp
    if plan.pp > 1 and layers == megatron_stage_layers(num_layers, plan.pp, plan.vpp, first, last):
        return [("--decoder-first-pipeline-num-layers", first), ("--decoder-last-pipeline-num-layers", last)] + vpp_flag
    return [("--pipeline-model-parallel-layout", layout_string(layers))]


def _values(value) -> tuple:
    """A flag's values: several for a list-valued flag (a tuple), else one."""
    return value if isinstance(value, tuple) else (value,)


def _recompute_flags(setting: Optional[tuple]) -> list[tuple]:
    if setting is None:
        return []
    granularity, method, num_layers = setting
    flags = [("--recompute-granularity", granularity)]
    if method is not None:
        flags += [("--recompute-method", method), ("--recompute-num-layers", num_layers)]
    return flags


def export(plan: Plan, model: ModelSpec, job: JobSpec, num_gpus: int) -> Export:
    """Megatron-LM flags for the plan; `num_gpus` is the WORLD_SIZE to launch with (dp x cp x tp x pp)."""
    if num_gpus != plan.world_size:  # no flag carries dp: the launch's world size sets it
        product = "dp x cp x tp x pp" if plan.cp > 1 else "dp x tp x pp"
        raise UsageError(f"Megatron takes dp from the world size: {product} = {plan.world_size} GPUs, not {num_gpus}")
    if plan.dp_shard and (plan.dp_shard * plan.cp * plan.tp) % plan.ep:
        # parallel_state.initialize_model_parallel: "Expert data parallel size should be divisible
        # by partial DistOpt shard factor" (dp x cp x tp / ep by dp / dp_shard)
        raise UsageError(
            f"Megatron cuts the expert data-parallel group into the dp / dp_shard = {plan.dp // plan.dp_shard} "
            f"optimizer instances too: ep={plan.ep} must divide dp_shard x cp x tp = "
            f"{plan.dp_shard * plan.cp * plan.tp}; use a larger dp_shard or a smaller ep"
        )
    L = model.num_layers
    flags = [("--tensor-model-parallel-size", plan.tp), ("--pipeline-model-parallel-size", plan.pp)]
    if plan.cp > 1:  # the ring the cost model prices (module docstring)
        flags += [("--context-parallel-size", plan.cp), ("--cp-comm-type", "p2p")]
    flags += _split_flags(plan, L)
    if plan.sequence_parallel:
        flags.append(("--sequence-parallel", None))
    if plan.tp_comm_overlap:
        flags.append(("--tp-comm-overlap", None))
    if tp_pp_dp_mapping(plan):
        flags.append(("--use-tp-pp-dp-mapping", None))
    setting = recompute_setting(plan_counts(plan, L))
    modules: tuple = ()
    if setting is not None and setting[0] == "selective":
        # what the cost model reruns under MLA (cost_models/compute.py:layer_compute): the
        # up-projections, and the core attention only where it is unfused; else the core attention
        # (Megatron's default module, named once other modules join it)
        if model.mla:
            modules = ("mla_up_proj",) if job.flash_attention else ("core_attn", "mla_up_proj")
        elif plan.recompute_norm_act:
            modules = ("core_attn",)
    if plan.recompute_norm_act:  # Plan.recompute_norm_act: modules of the selective granularity
        modules += ("layernorm", "moe_act") if model.is_moe else ("layernorm",)
        setting = setting or ("selective", None, None)
    flags += _recompute_flags(setting)
    if modules:
        flags.append(("--recompute-modules", modules))
    flags += [("--micro-batch-size", plan.micro_batch_size), ("--global-batch-size", job.global_batch_size)]
    precision = DType(job.precision)
    if precision != DType.fp32:
        flags.append((f"--{precision.value}", None))
    if precision == DType.bf16 and job.grad_reduce_bf16:
        # arguments.py: --bf16 turns accumulate_allreduce_grads_in_fp32 on (fp32 main gradients, the
        # DDP buffer's grad_reduce_in_fp32) unless --grad-reduce-in-bf16: the memory the plan priced
        flags.append(("--grad-reduce-in-bf16", None))
    if plan.fp8:  # Transformer Engine's hybrid format, per-tensor delayed scaling (module docstring)
        flags += [("--fp8-format", "hybrid"), ("--fp8-recipe", "delayed")]
    if plan.zero_stage == 1:
        flags.append(("--use-distributed-optimizer", None))
    if plan.dp_shard:  # hybrid sharding: the distributed optimizer in dp / dp_shard instances (module docstring)
        flags.append(("--num-distributed-optimizer-instances", plan.dp // plan.dp_shard))
    if plan.dp > 1:  # the cost model hides data-parallel traffic behind the backward
        flags.append(("--overlap-grad-reduce", None))
        if plan.zero_stage == 1:  # arguments.py: param gather overlap needs the distributed optimizer
            flags.append(("--overlap-param-gather", None))
    if Optimizer(job.optimizer) != Optimizer.adam:
        flags.append(("--optimizer", Optimizer(job.optimizer).value))
    flags += _model_flags(model, job) + _expert_flags(model, plan)
    argv = [str(x) for flag, value in flags for x in ((flag,) if value is None else (flag, *_values(value)))]
    text = " \\\n".join(
        flag if value is None else " ".join([flag, *(shlex.quote(str(v)) for v in _values(value))])
        for flag, value in flags
    )
    return Export(stack="megatron", text=text, data=argv, kind="args")


def _model_flags(model: ModelSpec, job: JobSpec) -> list[tuple]:
    """Shape and architecture flags; the tokenizer and data flags stay the user's."""
    flags = [
        ("--num-layers", model.num_layers),
        ("--hidden-size", model.hidden_size),
        ("--ffn-hidden-size", model.ffn),
        ("--num-attention-heads", model.num_heads),
    ]
    if model.kv_heads != model.num_heads:
        flags += [("--group-query-attention", None), ("--num-query-groups", model.kv_heads)]
    if model.mla:  # arguments.py _add_mla_args; --qk-head-dim is the non-rotary part of a query/key head
        flags += [
            ("--multi-latent-attention", None),
            ("--kv-lora-rank", model.kv_lora_rank),
            ("--qk-head-dim", model.head_dim),
            ("--qk-pos-emb-head-dim", model.qk_rope_head_dim),
            ("--v-head-dim", model.v_dim),
        ]
        if model.q_lora_rank:
            flags.append(("--q-lora-rank", model.q_lora_rank))
    elif model.attention_head_dim is not None:  # heads not hidden / num_heads wide (Qwen3)
        flags.append(("--kv-channels", model.head_dim))
    # arguments.py requires max_position_embeddings >= seq_length even for rotary positions,
    # where it sizes no table.
    max_positions = model.max_seq_len if model.learned_position_embeddings else max(model.max_seq_len, job.seq_len)
    flags += [("--seq-length", job.seq_len), ("--max-position-embeddings", max_positions)]
    if not model.learned_position_embeddings:
        flags.append(("--position-embedding-type", "rope"))
        flags += _rope_flags(model)
    if Activation(model.activation) == Activation.swiglu:
        flags.append(("--swiglu", None))
    if model.norm == "rmsnorm":
        flags.append(("--normalization", "RMSNorm"))
    if model.qk_norm:
        # TransformerConfig.qk_layernorm: a norm of --normalization's type over each head's
        # head_dim for queries and keys (transformer/attention.py: q_layernorm, k_layernorm
        # built with hidden_size_per_attention_head).
        flags.append(("--qk-layernorm", None))
    if model.sliding_window is not None:  # on every layer (model_problems refuses fewer)
        # --window-size LEFT,RIGHT (arguments.py: tuple_type): a query sees keys LEFT back and
        # RIGHT ahead (transformer/utils.py:get_sliding_window_causal_mask), itself included;
        # the spec's window counts the query's own key.
        flags.append(("--window-size", f"{model.sliding_window - 1},0"))
    if model.mtp_layers:  # transformer/multi_token_prediction.py, on the last pipeline stage as the cost model puts it
        flags.append(("--mtp-num-layers", model.mtp_layers))
    if not model.linear_bias:
        flags.append(("--disable-bias-linear", None))
        if model.qkv_bias:  # TransformerConfig.add_qkv_bias: biases on the QKV projection only (Qwen2)
            flags.append(("--add-qkv-bias", None))
    if not model.dropout:
        flags += [("--attention-dropout", 0.0), ("--hidden-dropout", 0.0)]
    if not model.tied_embeddings:
        flags.append(("--untie-embeddings-and-output-weights", None))
    if not job.flash_attention:  # the plan stored the s x s scores: Megatron's unfused attention
        flags.append(("--attention-backend", "unfused"))
    return flags


def _rope_flags(model: ModelSpec) -> list[tuple]:
    """The rotary base, always written (Megatron-LM's default 10,000 is not Llama 3's 500,000),
    and the scaling as rules.py:_rope_problems allows it: Llama 3.x's (--use-rope-scaling
    --rope-scaling-factor) on standard attention; on multi-latent attention, YaRN with its factor
    and attention scales (--rope-type yarn --rotary-scaling-factor --mscale --mscale-all-dim; their
    defaults 1 and 0 are not DeepSeek's) or no scaling (--rope-type rope: MLA takes YaRN by
    default)."""
    flags: list[tuple] = [("--rotary-base", int(model.rope_theta))]
    r = model.rope_scaling
    if model.mla:
        if r is None:
            return flags + [("--rope-type", "rope")]
        mscale = 1.0 if r.mscale is None else r.mscale
        mscale_all = 0.0 if r.mscale_all_dim is None else r.mscale_all_dim  # transformers' defaults for a YaRN config
        return flags + [
            ("--rope-type", "yarn"),
            ("--rotary-scaling-factor", r.factor),
            ("--mscale", mscale),
            ("--mscale-all-dim", mscale_all),
        ]
    if r is not None:  # llama3 (the others are refused)
        flags += [("--use-rope-scaling", None), ("--rope-scaling-factor", r.factor)]
    return flags


def _expert_flags(model: ModelSpec, plan: Plan) -> list[tuple]:
    """The MoE layer and its expert parallelism (the module docstring says why each)."""
    if not model.is_moe:
        return []
    flags = [
        ("--num-experts", model.num_experts),
        ("--moe-router-topk", model.experts_per_token),
        ("--moe-ffn-hidden-size", model.moe_ffn),
    ]
    if model.num_shared_experts:  # one MLP as wide as all shared experts together
        flags.append(("--moe-shared-expert-intermediate-size", model.num_shared_experts * model.moe_ffn))
    if model.first_dense_layers:  # 0: a dense MLP of --ffn-hidden-size, 1: experts
        flags.append(("--moe-layer-freq", moe_layer_pattern(model.first_dense_layers, model.num_layers)))
    if model.experts_per_token == 1:
        # TransformerConfig.__post_init__: a softmax over one selected expert has a zero
        # gradient, so top-1 needs the softmax before the selection.
        flags.append(("--moe-router-pre-softmax", None))
    return flags + [
        ("--expert-model-parallel-size", plan.ep),
        ("--expert-tensor-parallel-size", 1),
        ("--moe-token-dispatcher-type", "alltoall"),
        ("--moe-grouped-gemm", None),
    ]


def moe_layer_pattern(first_dense: int, num_layers: int) -> str:
    """--moe-layer-freq for `first_dense` dense layers then experts: the Python list expression
    Megatron-LM's moe_freq_type evaluates (its length must be the layer count,
    gpt_layer_specs.py:get_gpt_decoder_layer_specs)."""
    return f"([0]*{first_dense}+[1]*{num_layers - first_dense})"


def layer_pattern(freq, num_layers: int) -> list[int]:
    """Per-layer 1 (experts) / 0 (dense MLP) from --moe-layer-freq as Megatron reads it: an
    integer N (experts on every N-th layer) or a list expression of digits, [], (), + and *."""
    if isinstance(freq, int) or str(freq).strip().isdigit():
        return [int(i % int(freq) == 0) for i in range(num_layers)]
    return _list_expression(ast.parse(str(freq), mode="eval").body)


def _list_expression(node):
    """The value of a list expression without eval: integers, lists of them, + and *."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.List):
        return [_list_expression(e) for e in node.elts]
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
        left, right = _list_expression(node.left), _list_expression(node.right)
        return left + right if isinstance(node.op, ast.Add) else left * right
    raise ValueError(f"--moe-layer-freq: {ast.unparse(node)!r} is not a list expression of integers, + and *")


def read_back(data: list[str], world_size: Optional[int] = None) -> dict:
    """Our fields from Megatron-LM arguments (as `export` writes them). dp and the micro-batch
    count come from `world_size` (Megatron's WORLD_SIZE); None without it."""
    args = _parse_argv(data)
    tp, pp = int(args.get("tensor-model-parallel-size", 1)), int(args.get("pipeline-model-parallel-size", 1))
    L = int(args["num-layers"])
    if "pipeline-model-parallel-layout" in args:
        layers = layout_layers(args["pipeline-model-parallel-layout"])
    else:
        first, last = (
            int(args[k]) if k in args else None
            for k in ("decoder-first-pipeline-num-layers", "decoder-last-pipeline-num-layers")
        )
        split = megatron_stage_layers(L, pp, int(args.get("num-virtual-stages-per-pipeline-rank", 1)), first, last)
        assert split is not None  # _split_flags writes these flags only for a split Megatron builds
        layers = split
    vpp = len(layers) // pp
    setting = None
    if "recompute-granularity" in args:
        num = args.get("recompute-num-layers")
        setting = (args["recompute-granularity"], args.get("recompute-method"), int(num) if num is not None else None)
    modules = set(_values(args.get("recompute-modules", ("core_attn",))))  # Megatron's default: core_attn
    norm_act = setting is not None and setting[0] == "selective" and bool(modules & {"layernorm", "moe_act"})
    if norm_act and not modules & {"core_attn", "mla_up_proj"}:
        setting = None  # the norms and the activation only: no layer's attention recomputed
    micro, global_batch = int(args["micro-batch-size"]), int(args["global-batch-size"])
    cp = int(args.get("context-parallel-size", 1))
    if cp > 1 and args.get("cp-comm-type", "p2p") != "p2p":  # Megatron-LM's default is p2p
        raise ValueError(
            f"--cp-comm-type {args['cp-comm-type']} is not the ring of K/V passes our context parallelism is"
        )
    if args.get("fp8-format", "hybrid") != "hybrid":
        raise ValueError(
            f"--fp8-format {args['fp8-format']} is not our FP8 recipe (E4M3 forward, E5M2 gradients: hybrid)"
        )
    dp = world_size // (tp * pp * cp) if world_size else None
    instances = int(args.get("num-distributed-optimizer-instances", 1))
    return {
        "dp": dp,
        "dp_shard": dp // instances if dp and instances > 1 else None,
        "cp": cp,
        "tp": tp,
        "pp": pp,
        "vpp": vpp,
        "fp8": "fp8-format" in args,
        "schedule": None if pp == 1 else (Schedule.interleaved_1f1b if vpp > 1 else Schedule.one_f_one_b).value,
        "micro_batch_size": micro,
        "global_batch_size": global_batch,
        "num_micro_batches": global_batch // (micro * dp) if dp else None,
        "zero_stage": 1 if "use-distributed-optimizer" in args else 0,
        "sequence_parallel": "sequence-parallel" in args,
        "tp_comm_overlap": "tp-comm-overlap" in args,
        "recompute_norm_act": norm_act,
        "mesh_order": ["tp", "pp", "dp"] if "use-tp-pp-dp-mapping" in args else ["tp", "dp", "pp"],
        "stage_layers": layers,
        "stage_recompute": [(c.none, c.selective, c.full) for c in megatron_recompute(setting, layers)],
        "precision": "bf16" if "bf16" in args else "fp16" if "fp16" in args else "fp32",
        "grad_reduce_bf16": "grad-reduce-in-bf16" in args,
        "optimizer": args.get("optimizer", "adam"),
        "num_layers": L,
        "hidden_size": int(args["hidden-size"]),
        "ffn_hidden_size": int(args["ffn-hidden-size"]),
        "num_heads": int(args["num-attention-heads"]),
        "num_kv_heads": int(args["num-query-groups"])
        if "group-query-attention" in args
        else int(args["num-attention-heads"]),
        "seq_len": int(args["seq-length"]),
        "activation": "swiglu" if "swiglu" in args else "gelu",
        "qk_norm": "qk-layernorm" in args,
        "qkv_bias": "add-qkv-bias" in args,
        "rope_theta": float(args.get("rotary-base", 10000)) if args.get("position-embedding-type") == "rope" else None,
        "rope_scaling": _rope_back(args),
        "sliding_window": int(args["window-size"].split(",")[0]) + 1 if "window-size" in args else None,
        "tied_embeddings": "untie-embeddings-and-output-weights" not in args,
        **_experts_back(args, L),
    }


def _rope_back(args: dict) -> Optional[dict]:
    """The rotary scaling the arguments ask for, as ModelSpec.rope_scaling's fields; None: none."""
    if "use-rope-scaling" in args:
        return {"rope_type": "llama3", "factor": float(args.get("rope-scaling-factor", 8.0))}
    if "multi-latent-attention" in args and args.get("rope-type", "yarn") == "yarn":
        return {
            "rope_type": "yarn",
            "factor": float(args.get("rotary-scaling-factor", 1.0)),
            "mscale": float(args.get("mscale", 1.0)),
            "mscale_all_dim": float(args.get("mscale-all-dim", 0.0)),
        }
    return None


def _experts_back(args: dict, num_layers: int) -> dict:
    """ep and the MoE fields of our ModelSpec; ValueError where the layer pattern is not ours
    (dense layers anywhere but first)."""
    if "num-experts" not in args:
        return {"ep": 1, "num_experts": None}
    pattern = layer_pattern(args.get("moe-layer-freq", 1), num_layers)
    first_dense = pattern.index(1) if 1 in pattern else num_layers
    if len(pattern) != num_layers or pattern != [0] * first_dense + [1] * (num_layers - first_dense):
        raise ValueError(
            f"--moe-layer-freq {args['moe-layer-freq']}: dense layers only before the first MoE layer are ours"
        )
    moe_ffn = int(args.get("moe-ffn-hidden-size", args["ffn-hidden-size"]))
    return {
        "ep": int(args.get("expert-model-parallel-size", 1)),
        "num_experts": int(args["num-experts"]),
        "experts_per_token": int(args.get("moe-router-topk", 2)),
        "moe_ffn_hidden_size": moe_ffn,
        "num_shared_experts": int(args.get("moe-shared-expert-intermediate-size", 0)) // moe_ffn,
        "first_dense_layers": first_dense,
    }


def _parse_argv(argv: list[str]) -> dict:
    """--flag value / --flag (True) pairs, keyed without the dashes; a flag followed by several
    values (--recompute-modules a b) keeps them as a tuple."""
    out, i = {}, 0
    while i < len(argv):
        flag = argv[i]
        if not flag.startswith("--"):
            raise ValueError(f"expected a --flag at position {i}, got {flag!r}")
        j = i + 1
        while j < len(argv) and not argv[j].startswith("--"):
            j += 1
        values = argv[i + 1 : j]
        out[flag[2:]] = True if not values else values[0] if len(values) == 1 else tuple(values)
        i = j
    return out
