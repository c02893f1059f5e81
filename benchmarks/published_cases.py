"""Every published run we calibrate on, as (model, cluster, job, plan, published metric) cases.

Two data files, each record citing its source: benchmarks/data/calibration_runs.json (the
project's reference set) and benchmarks/data/public_runs.json (added for this purpose:
llm-foundry, NVIDIA DGX Cloud benchmarking, the NeMo Megatron launcher's 2022 A100 tables,
the DeepSpeed team's ZeRO-3 runs on Azure A100, IBM/PyTorch FSDP blog, fms-fsdp, and the
mixture-of-experts runs of dgxc-benchmarking, NeMo AutoModel, Megatron-Bridge and the
Megatron-MoE-ModelZoo, and Megatron-Bridge's DGX-GB200 / DGX-B200 rows; see
benchmarks/data/public_runs.md). None of the held-out sources is among them.

How a record is read (what is not stated in a record is a stated assumption here):
- the cluster preset of its GPU (PRESET_OF_GPU: GB200 -> gb200-nvl72, B200 -> dgx-b200, MI300X /
  MI325X / MI355X -> mi300x / mi325x / mi355x, A100 40/80GB, else dgx-h100-80gb), with the inter-node bandwidth of the network the record
  names (Gb/s per node, split over its 8 GPUs, 90% of line rate as bus bandwidth, as the
  presets);
- FSDP FULL_SHARD = ZeRO-3, SHARD_GRAD_OP = ZeRO-2, HSDP = ZeRO-3 sharded within a node and
  replicated across nodes (dp_shard = the node's 8 GPUs: fms-fsdp's default sharding_strategy
  "hsdp", fms_fsdp/config/training.py, is FSDP's HYBRID_SHARD, whose groups without a mesh are
  the node); Megatron/NeMo = ZeRO-1
  (distributed optimizer) with sequence parallelism when tp > 1, target `megatron`, unless the
  record says otherwise (a data_parallel_impl naming ZeRO-0, sequence_parallel false);
- attention fused (FlashAttention / cuDNN) unless the record says "flash_attention": false
  (BLOOM and GPT-NeoX-20B ran Megatron's unfused attention);
- "selective" checkpointing of every other block (torchtitan, IBM) = half the layers
  fully recomputed; a record without a recompute setting = none;
- the compared figure is tokens/s per GPU where published (it does not depend on how a
  source counts FLOPs), else hardware TFLOP/s per GPU.
Mixture-of-experts records carry the expert fields in "model" (num_experts,
experts_per_token, moe_ffn_hidden, shared_experts, first_dense_layers) and "ep" / "etp" in
"parallel"; ep maps to Plan.ep (experts folded into tp x dp with expert-TP 1). DeepSeek-V3
and Kimi K2 attend with multi-head latent attention, as planner/presets/models/deepseek-v3.yaml
does (MLA below); a head_dim of its own (Qwen3, GPT-OSS) is
ModelSpec.attention_head_dim; sliding windows (GPT-OSS) are the record's model's
sliding_window / sliding_window_layers. A record whose "parallel" names its recipe's dispatcher
("dispatcher": "deepep") is costed with it (JobSpec.moe_dispatcher), else with the all-to-all. Where a record states them, "recompute_mode" (how its recompute is costed),
"layers_per_stage" (the pipeline split) and "tp_comm_overlap" are read as they are; Megatron's recompute
modules layernorm and moe_act are Plan.recompute_norm_act.
Megatron runs of NVIDIA's performance recipes are costed with bf16 gradient reduction
(JobSpec.grad_reduce_bf16, BF16_GRAD_FRAMEWORKS): Megatron-Bridge's performance scripts set
recipe.ddp.grad_reduce_in_fp32 = False (scripts/performance/utils/helpers.py:
set_basic_perf_overrides), NeMo 2's the same, and the NeMo launcher's configs sync gradients in
bf16 (optim.grad_sync_dtype bf16); the other Megatron runs keep Megatron's fp32 main gradients.
Runs the cost model does not cover are listed by `excluded()` with the reason: FP8, CPU offload,
context parallelism (issue 12), a 500 W power-capped H100 (no preset for it), missing
model dimensions or GPU count, and for mixture-of-experts runs expert-TP other than 1, TP
without sequence parallelism, all-to-all overlapped across micro-batches, a benchmark's
routing other than balanced top-k, pipeline stages without layers, layer types the spec has
no counterpart for, or a layout the source leaves unstated or contradicts.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from hardware_profiles import load_cluster
from planner.specs import Activation, ClusterSpec, JobSpec, ModelSpec, Plan, StageRecompute

DATA = Path(__file__).resolve().parent / "data"
FILES = ("calibration_runs.json", "public_runs.json")

# Inter-node network per 8-GPU node, Gb/s, where a record names one.
NETWORK_GBPS = {
    "bloom": 400,  # Jean Zay: 4 Omni-Path 100 Gb/s links per node (record's interconnect field)
    "gpt_neox_20b": 800,  # four ConnectX-6 HDR 200 Gb/s HCAs per 8-GPU node (Black et al. 2022, GPT-NeoX-20B, sec. 3)
    # Lambda's three cloud nodes over Ethernet of a speed not stated: listed, not fitted (_skip)
    "gpt_neox_20b_lambda": 100,
    "llm_foundry_a100_80gb": 1600,
    "llm_foundry_a100_40gb": 1600,
    "fms_fsdp_readme": 400,
}

# Sources whose TFLOPs figure counts FLOPs by a formula of their own, not the hardware FLOPs the
# planner executes: such a run is compared in tokens/s/GPU, its published TFLOPs divided by that
# formula's FLOPs per token.
# GPT-NeoX-20B's 117 TFLOPs per GPU (Black et al. 2022, sec. 3): gpt-neox's logger of the time
# (EleutherAI/gpt-neox megatron/logging.py get_flops at c560814b, the 20B release, 2022-02-10)
# counts tokens x (6 N + 60 s h L) with N the model's parameters (20,556,201,984, its model card):
# no recompute forward, although the run checkpoints every layer. At that rate the 150,000 steps
# of 1,536 x 2,048 tokens take 1,827 h on 96 GPUs, as the 1,830 h of training quoted for the run;
# counted by the Megatron formula with recompute (1.087x the FLOPs per token) they would take 1,986 h.
FLOPS_PER_TOKEN_OF_SOURCE = {
    "gpt_neox_20b": lambda m: 6 * 20_556_201_984 + 60 * m["seq_len"] * m["hidden"] * m["layers"],
}

# Model families by record: architecture flags the records do not carry.
LLAMA = dict(
    activation=Activation.swiglu, learned_position_embeddings=False, linear_bias=False, norm="rmsnorm", dropout=False
)
MPT = dict(
    activation=Activation.gelu,
    learned_position_embeddings=True,
    linear_bias=False,
    norm="layernorm",
    dropout=False,
    tied_embeddings=True,
)  # llm-foundry benchmark configs: no bias, learned positions (the record's notes), tied head
GPT = dict(
    activation=Activation.gelu, learned_position_embeddings=True, linear_bias=True, norm="layernorm", dropout=False
)
# Nemotron-4 (Parmar et al. 2024, tables 1-2): squared-ReLU MLP (two matrices), rotary, GQA with 8 KV heads, no bias.
NEMOTRON = {
    6144: dict(num_heads=48, num_kv_heads=8, ffn_hidden_size=24576),
    18432: dict(num_heads=96, num_kv_heads=8, ffn_hidden_size=73728),
}
NEMOTRON_FLAGS = dict(
    activation=Activation.gelu, learned_position_embeddings=False, linear_bias=False, norm="layernorm", dropout=False
)
# Mixture-of-experts families: Llama-style blocks (SwiGLU experts, RMSNorm, rotary, no bias, untied head; Hugging Face
# configs of DeepSeek-V3, Kimi K2, Qwen3-MoE). GPT-OSS: the same with biases on the attention and expert projections
# (openai/gpt-oss-120b config.json attention_bias true; GptOssExperts gate_up_proj_bias / down_proj_bias), its
# experts' GLU clamped at swiglu_limit 7.0 and its rotary embedding YaRN-scaled (rope_scaling factor 32: attention
# factor 0.1 ln 32 + 1, transformers' _compute_yarn_parameters).
# DeepSeek-V3 and Kimi K2 (moonshotai/Kimi-K2-Base config.json: the same attention) attend with
# multi-head latent attention of the Hugging Face deepseek-ai/DeepSeek-V3 config.json's widths.
MLA = dict(attention_head_dim=128, kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, v_head_dim=128)
MOE_FAMILIES = {
    "deepseek": dict(LLAMA, **MLA),
    "kimi": dict(LLAMA, **MLA),
    "qwen3": LLAMA,
    "gpt-oss": dict(LLAMA, linear_bias=True, glu_limit=7.0, rope_attention_factor=0.1 * math.log(32) + 1),
}
# Groups whose runs are Megatron-Core / NeMo / Megatron-Bridge (ZeRO-1 distributed optimizer, target megatron).
MEGATRON_MOE_GROUPS = ("dgxc_moe_h100_2505", "bridge_moe_h100", "modelzoo_qwen3_h100")
# Megatron-Bridge performance tables on Blackwell (dense FP8 and BF16 GPT-OSS rows), one group per system.
BLACKWELL_GROUPS = ("bridge_gb200", "bridge_b200", "bridge_gb300", "bridge_b300")
# NeMo (Megatron-Core underneath) and Megatron-Bridge performance tables: Megatron's distributed
# optimizer (ZeRO-1) unless the record names another data-parallel implementation.
MEGATRON_GROUPS = MEGATRON_MOE_GROUPS + (
    "nemo_h100_fp8_2407",
    "nemo_h100_fp8_longseq_2403",
    "megatron_bridge_h100_fp8",
    "nemo_a100_gpt5b_2206",
    "nemo_a100_gpt175b_2206",
    "nemo_a100_gpt5b_2208",
    "nemo_a100_gpt175b_2208",
    *BLACKWELL_GROUPS,
)


@dataclass(frozen=True)
class Case:
    name: str
    group: str
    model: ModelSpec
    cluster: ClusterSpec
    job: JobSpec
    plan: Plan
    metric: str  # "tokens_per_s_per_gpu" or "hardware_tflops_per_gpu"
    published: float
    peak_memory_gib: Optional[float] = None  # published peak memory, where given
    notes: tuple = field(default=())

    def predicted(self, est) -> float:
        """The published metric, read off our estimate of this run."""
        if self.metric == "tokens_per_s_per_gpu":
            return est.tokens_per_s / self.plan.world_size
        return est.hardware_tflops_per_gpu


def load_records() -> list[dict]:
    out = []
    for f in FILES:
        out.extend(json.loads((DATA / f).read_text()))
    return out


def _family(rec: dict) -> Optional[dict]:
    name = rec["name"].lower()
    if "llama" in name:
        return LLAMA
    if "mpt" in name:
        return MPT
    if "nemotron" in name:
        return {**NEMOTRON_FLAGS, **NEMOTRON.get(rec["model"]["hidden"], {})}
    if "gpt-3" in name or "gpt-neox" in name or "mingpt" in name:  # minGPT: the GPT-3 architecture
        return GPT
    if "bloom" in name:
        return dict(GPT, learned_position_embeddings=False, tied_embeddings=True)
    return next((flags for key, flags in MOE_FAMILIES.items() if key in name), None)


def _model(rec: dict) -> ModelSpec:
    m, fam = rec["model"], _family(rec)
    fields = dict(
        name=rec["name"][:40],
        num_layers=m["layers"],
        hidden_size=m["hidden"],
        vocab_size=m["vocab"],
        max_seq_len=m["seq_len"],
        **{k: v for k, v in fam.items()},
    )
    # GPT-3 175B: 96 heads of 128 (Brown et al. 2020, table 2.1), where a record omits them.
    fields.setdefault("num_heads", m["heads"] or (96 if m["hidden"] == 12288 else None))
    if m.get("ffn_hidden") and "ffn_hidden_size" not in fields:
        fields["ffn_hidden_size"] = m["ffn_hidden"]
    if m.get("num_query_groups") and "num_kv_heads" not in fields:
        fields["num_kv_heads"] = m["num_query_groups"]
    if "bloom" in rec["name"].lower():
        fields["vocab_size"] = 250880
    if m.get("mtp_layers"):  # DeepSeek-V3 in NeMo's recipe: one multi-token-prediction module
        fields["mtp_layers"] = m["mtp_layers"]
    if m.get("sliding_window"):  # GPT-OSS: a window of 128 on every other layer (its config's layer_types)
        fields.update(sliding_window=m["sliding_window"], sliding_window_layers=m["sliding_window_layers"])
    return ModelSpec(**fields, **_experts(m))


def _experts(m: dict) -> dict:
    """ModelSpec's expert fields from a record's model; a model with experts on every layer and no
    dense width stated gets the expert width as ffn_hidden_size (unused: no dense MLP)."""
    if not m.get("num_experts"):
        return {}
    heads = m.get("head_dim")
    own_heads = {"attention_head_dim": heads} if heads and m.get("heads") and heads * m["heads"] != m["hidden"] else {}
    return dict(
        num_experts=m["num_experts"],
        experts_per_token=m["experts_per_token"],
        moe_ffn_hidden_size=m["moe_ffn_hidden"],
        num_shared_experts=m.get("shared_experts") or 0,
        first_dense_layers=m.get("first_dense_layers") or 0,
        **({} if m.get("ffn_hidden") else {"ffn_hidden_size": m["moe_ffn_hidden"]}),
        **own_heads,
    )


# The cluster preset of a record's GPU, first match by name (an H100 or H200 record, and any
# other, takes dgx-h100-80gb). GB300 before B300 and GB200 before B200: "GB200" contains "B200".
# The Blackwell and AMD presets are UNCALIBRATED (hardware_profiles): their records are the runs
# that check them.
PRESET_OF_GPU = (
    ("GB300", "gb300-nvl72"),
    ("B300", "dgx-b300"),
    ("GB200", "gb200-nvl72"),
    ("B200", "dgx-b200"),
    ("MI355X", "mi355x"),
    ("MI325X", "mi325x"),
    ("MI300X", "mi300x"),
    ("40GB", "dgx-a100-40gb"),
    ("A100", "dgx-a100-80gb"),
)
# GPUs with FP8 tensor-core GEMMs (the planner's FP8: per-tensor scales).
FP8_GPUS = ("H100", "H200", "B200", "GB200", "B300", "GB300", "MI300X", "MI325X", "MI355X")


def preset_of(gpu: str) -> str:
    return next((name for key, name in PRESET_OF_GPU if key in gpu), "dgx-h100-80gb")


def _cluster(rec: dict) -> ClusterSpec:
    cluster = load_cluster(preset_of(rec["hardware"]["gpu"] or ""))
    gbps = NETWORK_GBPS.get(rec["group"])
    ic = rec["hardware"].get("interconnect") or ""
    if gbps is None and rec["group"].startswith("ibm_fsdp"):
        gbps = 400 if "400 Gbps" in ic else 800
    if gbps is None:
        return cluster
    per_gpu = 0.9 * gbps / 8 / 8  # GB/s per GPU as bus bandwidth
    tier = cluster.inter_node
    fits = [f.model_copy(update={"bandwidth_gbps": per_gpu}) for f in tier.collectives]
    return cluster.model_copy(
        update={"inter_node": tier.model_copy(update={"collectives": fits, "name": f"{gbps} Gb/s per node"})}
    )


def _norm_act(rec: dict, stack: str) -> bool:
    """Plan.recompute_norm_act: a Megatron record whose recompute modules are layernorm and
    moe_act (Megatron-Bridge's GPT-OSS and Qwen3 recipes, the model zoo's 'norm, act')."""
    r = (rec["parallel"].get("recompute") or "").lower()
    return stack == "megatron" and "layernorm" in r and "moe_act" in r


def _recompute(rec: dict, layers: int) -> dict:
    if rec["parallel"].get("recompute_mode"):  # the record says how its recompute is costed (its notes say why)
        return {"recompute": rec["parallel"]["recompute_mode"]}
    r = (rec["parallel"].get("recompute") or "none").lower()
    if (
        r.startswith("full")
        or "checkpointing after every" in r
        or r.startswith("activation checkpointing")
        or "ac true" in r
    ):
        return {"recompute": "full"}
    if r.startswith("selective"):
        return {"stage_recompute": [StageRecompute(none=layers // 2, full=layers - layers // 2)]}
    return {"recompute": "none"}


def _fp8(rec: dict) -> bool:
    """FP8 GEMMs: the record's precision, group or name says FP8 (current or delayed scaling,
    costed alike: per-tensor scales)."""
    return rec.get("precision") == "fp8" or "fp8" in rec["group"] or "Float8" in rec["name"] or "FP8" in rec["name"]


def excluded(rec: dict) -> Optional[str]:
    """Why a record is not a case, or None."""
    name, gpu = rec["name"], rec["hardware"]["gpu"] or ""
    if rec.get("doubtful"):  # the source contradicts itself (public_runs.md says how)
        return f"doubtful: {rec['doubtful'].split(':')[0]}"
    if _fp8(rec) and not any(g in gpu for g in FP8_GPUS):
        return "FP8 on a device without FP8 GEMMs"
    if "V100" in gpu:
        return "V100: no preset for that GPU"
    if rec["parallel"].get("layout_contradiction"):  # the table and its release's recipe disagree (public_runs.md)
        return f"the source's layout contradicts itself ({rec['parallel']['layout_contradiction']})"
    if rec["parallel"].get("offload"):
        return "CPU offload of optimizer states or activations: not modelled"
    network = rec["hardware"].get("interconnect") or ""
    if network.startswith("Ethernet") and "speed not stated" in network:
        # Lambda's GPT-NeoX-20B: its pipeline sends cross nodes on that network and decide the figure
        # (predicted 1.57x the published at 100 Gb/s per node, 0.94x at 10)
        return "inter-node network speed not stated (Ethernet carrying the pipeline's sends)"
    if "500W" in gpu:
        return "H100 96GB HBM2e capped at 500 W: no preset for that part"
    cp = rec["parallel"].get("cp") or 1
    if cp > 1 and (rec["model"].get("seq_len") or 0) % (2 * cp):
        return "context parallelism whose sequence does not split into 2 x cp chunks"
    if "torch.compile" in name or "compile" in (rec.get("framework") or "").lower():
        return "torch.compile fusion: not modelled"
    if "maxtext" in rec["group"] or "paxml" in name.lower() or rec["group"] == "nemo_automodel_h100_bf16":
        return "JAX / CP-based stacks: not modelled"
    if rec["model"].get("num_experts"):
        why = _moe_problem(rec)
        if why:
            return why
    if rec["hardware"]["count"] is None or rec["model"]["layers"] is None or rec["model"]["hidden"] is None:
        return "GPU count or model dimensions not stated"
    if "proxy" in name:
        return "a 7-layer proxy model, not a training run"
    if _family(rec) is None:
        return "model family not known"
    if rec["group"] == "megatron_2019":
        return "V100: no preset for that GPU"
    return None


def _moe_problem(rec: dict) -> Optional[str]:
    """Why a mixture-of-experts record is not a case (after the checks every record gets), or None."""
    p, layers = rec["parallel"], rec["model"]["layers"]
    if rec.get("precision") is None:
        return "precision not stated"
    if rec["model"].get("not_modelled"):
        return f"{rec['model']['not_modelled']}: not modelled"
    if p.get("micro_batch_size") is None or ((p.get("pp") or 1) > 1 and p.get("virtual_pp") is None):
        return "micro-batch size or virtual pipeline size not stated"
    if (p.get("etp") or 1) != 1:
        return f"expert-TP {p['etp']}: experts are planned with expert-TP 1 only"
    if (p.get("tp") or 1) > 1 and p.get("sequence_parallel") is False:
        return "MoE layers under TP without sequence parallelism: not modelled"
    if p.get("ep_a2a_overlap"):
        return "EP all-to-all overlapped with another micro-batch (1F1B merge): not modelled"
    if p.get("routing") == "consecutive":  # NeMo AutoModel's benchmark gate (public_runs.md)
        return (
            "a benchmark gate sending each token to k consecutive experts (1-2 GPUs, not balanced top-k): not modelled"
        )
    if (p.get("pp") or 1) * (p.get("virtual_pp") or 1) > layers:
        return "more pipeline stages than layers (embedding and loss counted as layers): a stage without layers is not modelled"
    return None


# Groups run on DeepSpeed: BLOOM (Megatron-DeepSpeed, ZeRO-1; with it, one group, the layouts BigScience
# benchmarked for it on the same machine and code in February 2022, fp16 ZeRO-1) and GPT-NeoX-20B
# (GPT-NeoX, built on DeepSpeed's engine, ZeRO-1).
DEEPSPEED_GROUPS = ("bloom", "gpt_neox_20b", "gpt_neox_20b_lambda")


# Where each group's runs come from: the code base or publisher whose tables they are. Groups of
# one source share their software, their measuring and their authors' choices, so they are not
# independent evidence: leave-one-source-out validation (benchmarks/fidelity_published.py) leaves
# a source's groups out together. NeMo's lineage (NeMo, its launcher, Megatron-Bridge and
# AutoModel publish one series of performance summaries) is one source; NVIDIA's DGX Cloud
# benchmarking recipes, its Megatron-MoE model zoo and each paper are others; IBM's FSDP blog
# and fms-fsdp's README are one team's one code base.
SOURCES = {
    "NeMo performance summaries": (
        "nemo_a100_gpt5b_2206",
        "nemo_a100_gpt175b_2206",
        "nemo_a100_gpt5b_2208",
        "nemo_a100_gpt175b_2208",
        "nemo_h100_fp8_2407",
        "nemo_h100_fp8_longseq_2403",
        "megatron_bridge_h100_fp8",
        "bridge_moe_h100",
        "bridge_b200",
        "bridge_b300",
        "bridge_gb200",
        "bridge_gb300",
        "automodel_moe_h100",
        "nemo_automodel_h100_bf16",
    ),
    "NVIDIA/dgxc-benchmarking": (
        "dgxc_h100_bf16_2411",
        "dgxc_h100_bf16_2502",
        "dgxc_grok1_h100_2411",
        "dgxc_maxtext_paxml_h100_2411",
        "dgxc_moe_h100_2505",
    ),
    "Megatron-MoE model zoo": ("modelzoo_qwen3_h100",),
    "MoE Parallel Folding (paper)": ("parallel_folding_2025",),
    "Megatron-LM 2019 (paper)": ("megatron_2019",),
    "mosaicml/llm-foundry": (
        "llm_foundry_a100_40gb",
        "llm_foundry_a100_80gb",
        "llm_foundry_h100",
        "llm_foundry_h100_large",
    ),
    "pytorch/torchtitan": ("torchtitan_a100", "torchtitan_h100_2024"),
    "IBM fms-fsdp": ("fms_fsdp_readme", "ibm_fsdp_blog_2024"),
    "PyTorch FSDP (paper)": ("fsdp_paper_2023",),
    "DeepSpeed blog": ("deepspeed_azure_zero3_2207",),
    "BigScience BLOOM": ("bloom",),
    "EleutherAI/gpt-neox": ("gpt_neox_20b",),
    "Lambda (LambdaLabsML/examples)": ("gpt_neox_20b_lambda",),
}
_SOURCE_OF = {g: src for src, groups in SOURCES.items() for g in groups}


def source_of(group: str) -> str:
    """The source a group's runs come from (SOURCES); a group added without one is refused."""
    if group not in _SOURCE_OF:
        raise KeyError(f"group {group!r} has no source: add it to benchmarks/published_cases.py:SOURCES")
    return _SOURCE_OF[group]


# The frameworks (a record's "framework") whose performance recipes reduce gradients in bf16 (the
# module docstring)
BF16_GRAD_FRAMEWORKS = ("Megatron-Bridge", "NeMo 24.", "NeMo 25.", "NeMo (nemo:24", "NeMo Megatron (nemo:24")


def stack_of(rec: dict) -> str:
    """The training stack (JobSpec.target) a record ran on, whose constants it calibrates:
    Megatron-Core / NeMo / Megatron-Bridge -> megatron; DeepSpeed-based -> deepspeed; the
    PyTorch FSDP stacks (llm-foundry's Composer FSDP1, IBM's and fms-fsdp's FSDP1, torchtitan's
    and NeMo AutoModel's FSDP2), eager PyTorch kernels all -> torchtitan."""
    if "DGXC" in rec["name"] or rec["group"] in MEGATRON_GROUPS:
        return "megatron"
    if rec["group"] in DEEPSPEED_GROUPS or "deepspeed" in rec["group"]:
        return "deepspeed"
    return "torchtitan"


def case(rec: dict) -> Case:
    p, res, n = rec["parallel"], rec["result"], rec["hardware"]["count"]
    model = _model(rec)
    tp, pp, cp = p.get("tp") or 1, p.get("pp") or 1, p.get("cp") or 1
    dp = p.get("dp") or n // (tp * pp * cp)
    mbs = p.get("micro_batch_size") or 1
    gbs = p.get("global_batch_size") or dp * mbs
    m = max(1, gbs // (dp * mbs))
    gbs = dp * mbs * m
    stack = stack_of(rec)
    megatron = stack == "megatron" or rec["group"] in DEEPSPEED_GROUPS
    impl = (p.get("data_parallel_impl") or "").upper()
    zero = (
        3
        if "MEGATRON-FSDP" in impl
        else 0
        if "ZERO-0" in impl
        else 1
        if megatron
        else 2
        if "SHARD_GRAD_OP" in impl or "SHARD_GRAD_OP" in rec["name"]
        else 3
    )
    vpp = p.get("virtual_pp") or 1
    sp = megatron and tp > 1 and p.get("sequence_parallel") is not False and rec["group"] not in DEEPSPEED_GROUPS
    # NeMo's performance recipes turn TP comm overlap on (NVIDIA/dgxc-benchmarking
    # nemotron/nemotron4-15b-synth.yaml: ub_tp_comm_overlap True). A later 340B config of that
    # repository turns it off, at another batch and GPU count than the v24.11.1 table read here.
    # A record that states it is read as it is: the MoE ones, and the Megatron-Bridge and NeMo 24.07
    # dense rows with TP > 1, whose recipes turn it on (benchmarks/data/public_runs.md, Caveats).
    overlap = p.get("tp_comm_overlap")
    plan = Plan(
        dp=dp,
        tp=tp,
        pp=pp,
        vpp=vpp,
        ep=p.get("ep") or 1,
        cp=cp,
        fp8=_fp8(rec),
        micro_batch_size=mbs,
        num_micro_batches=m,
        zero_stage=zero,
        dp_shard=8 if "HSDP" in impl and dp * cp > 8 else None,
        sequence_parallel=sp,
        tp_comm_overlap=sp and ("DGXC" in rec["name"] if overlap is None else overlap),
        schedule="interleaved-1f1b" if vpp > 1 else "1f1b",
        layers_per_stage=p.get("layers_per_stage"),
        recompute_norm_act=_norm_act(rec, stack),
        **_recompute(rec, model.num_layers),
    )
    flash = rec.get("flash_attention", rec["group"] not in DEEPSPEED_GROUPS)  # a record may say it ran without
    job = JobSpec(
        global_batch_size=gbs,
        seq_len=rec["model"]["seq_len"],
        flash_attention=flash,
        precision="fp16" if rec.get("precision") == "fp16" or rec["group"].startswith("gpt_neox_20b") else "bf16",
        target=stack,
        # llm-foundry's MPT takes flash-attn's fused cross-entropy unless told otherwise
        # (llmfoundry/models/mpt/modeling_mpt.py: loss_fn defaults to 'fused_crossentropy').
        loss_kernel="fused" if rec["group"].startswith("llm_foundry") else None,
        # the dispatcher the record's recipe runs ("deepep": the Megatron-Core MoE model zoo)
        moe_dispatcher=p.get("dispatcher") or "alltoall",
        grad_reduce_bf16=stack == "megatron" and (rec.get("framework") or "").startswith(BF16_GRAD_FRAMEWORKS),
    )
    per_gpu = res.get("tokens_per_sec_per_gpu")
    if per_gpu is None and res.get("tokens_per_sec"):
        per_gpu = res["tokens_per_sec"] / n
    if per_gpu is None and res.get("seconds_per_iter"):
        per_gpu = gbs * job.seq_len / res["seconds_per_iter"] / n
    if per_gpu is None and rec["group"] in FLOPS_PER_TOKEN_OF_SOURCE:
        per_gpu = res["tflops_per_gpu"] * 1e12 / FLOPS_PER_TOKEN_OF_SOURCE[rec["group"]](rec["model"])
    if per_gpu is not None:
        metric, published = "tokens_per_s_per_gpu", float(per_gpu)
    else:
        metric, published = "hardware_tflops_per_gpu", float(res["tflops_per_gpu"])
    return Case(
        rec["name"], rec["group"], model, _cluster(rec), job, plan, metric, published, res.get("peak_memory_gib")
    )


def cases() -> tuple[list[Case], list[tuple[str, str]]]:
    """(every case, [(record name, why excluded)])."""
    out, skipped = [], []
    for rec in load_records():
        why = excluded(rec)
        if why:
            skipped.append((rec["name"], why))
        else:
            out.append(case(rec))
    return out, skipped
