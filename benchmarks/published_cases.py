"""Every published run we calibrate on, as (model, cluster, job, plan, published metric) cases.

Two data files, each record citing its source: benchmarks/data/calibration_runs.json (the
project's reference set) and benchmarks/data/public_runs.json (added for this purpose:
llm-foundry, NVIDIA DGX Cloud benchmarking, IBM/PyTorch FSDP blog, fms-fsdp; see
benchmarks/data/public_runs.md). None of the held-out sources is among them.

How a record is read (what is not stated in a record is a stated assumption here):
- the cluster preset of its GPU, with the inter-node bandwidth of the network the record
  names (Gb/s per node, split over its 8 GPUs, 90% of line rate as bus bandwidth, as the
  presets);
- FSDP FULL_SHARD = ZeRO-3, SHARD_GRAD_OP = ZeRO-2, HSDP = ZeRO-3 over the data-parallel
  group (an approximation: HSDP shards within a node only); Megatron/NeMo = ZeRO-1
  (distributed optimizer) with sequence parallelism when tp > 1, target `megatron`;
- "selective" checkpointing of every other block (torchtitan, IBM) = half the layers
  fully recomputed; a record without a recompute setting = none;
- the compared figure is tokens/s per GPU where published (it does not depend on how a
  source counts FLOPs), else hardware TFLOP/s per GPU.
Runs the cost model does not cover are listed by `excluded()` with the reason: FP8,
context parallelism (issue 12), a 500 W power-capped H100 (no preset for it), missing
model dimensions or GPU count.
"""

from __future__ import annotations

import json
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
    "llm_foundry_a100_80gb": 1600,
    "llm_foundry_a100_40gb": 1600,
    "fms_fsdp_readme": 400,
}

# Model families by record: architecture flags the records do not carry.
LLAMA = dict(activation=Activation.swiglu, learned_position_embeddings=False, linear_bias=False, norm="rmsnorm", dropout=False)
MPT = dict(activation=Activation.gelu, learned_position_embeddings=True, linear_bias=False, norm="layernorm", dropout=False,
           tied_embeddings=True)  # llm-foundry benchmark configs: no bias, learned positions (the record's notes), tied head
GPT = dict(activation=Activation.gelu, learned_position_embeddings=True, linear_bias=True, norm="layernorm", dropout=False)
# Nemotron-4 (Parmar et al. 2024, tables 1-2): squared-ReLU MLP (two matrices), rotary, GQA with 8 KV heads, no bias.
NEMOTRON = {
    6144: dict(num_heads=48, num_kv_heads=8, ffn_hidden_size=24576),
    18432: dict(num_heads=96, num_kv_heads=8, ffn_hidden_size=73728),
}
NEMOTRON_FLAGS = dict(activation=Activation.gelu, learned_position_embeddings=False, linear_bias=False, norm="layernorm",
                      dropout=False)


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
    if "gpt-3" in name or "gpt-neox" in name:
        return GPT
    if "bloom" in name:
        return dict(GPT, learned_position_embeddings=False, tied_embeddings=True)
    return None


def _model(rec: dict) -> ModelSpec:
    m, fam = rec["model"], _family(rec)
    fields = dict(
        name=rec["name"][:40], num_layers=m["layers"], hidden_size=m["hidden"], vocab_size=m["vocab"],
        max_seq_len=m["seq_len"], **{k: v for k, v in fam.items()},
    )
    # GPT-3 175B: 96 heads of 128 (Brown et al. 2020, table 2.1), where a record omits them.
    fields.setdefault("num_heads", m["heads"] or (96 if m["hidden"] == 12288 else None))
    if m.get("ffn_hidden") and "ffn_hidden_size" not in fields:
        fields["ffn_hidden_size"] = m["ffn_hidden"]
    if m.get("num_query_groups") and "num_kv_heads" not in fields:
        fields["num_kv_heads"] = m["num_query_groups"]
    if "bloom" in rec["name"].lower():
        fields["vocab_size"] = 250880
    return ModelSpec(**fields)


def _cluster(rec: dict) -> ClusterSpec:
    gpu = rec["hardware"]["gpu"]
    name = "dgx-a100-40gb" if "40GB" in gpu else "dgx-a100-80gb" if "A100" in gpu else "dgx-h100-80gb"
    cluster = load_cluster(name)
    gbps = NETWORK_GBPS.get(rec["group"])
    ic = rec["hardware"].get("interconnect") or ""
    if gbps is None and rec["group"].startswith("ibm_fsdp"):
        gbps = 400 if "400 Gbps" in ic else 800
    if gbps is None:
        return cluster
    per_gpu = 0.9 * gbps / 8 / 8  # GB/s per GPU as bus bandwidth
    tier = cluster.inter_node
    fits = [f.model_copy(update={"bandwidth_gbps": per_gpu}) for f in tier.collectives]
    return cluster.model_copy(update={"inter_node": tier.model_copy(update={"collectives": fits, "name": f"{gbps} Gb/s per node"})})


def _recompute(rec: dict, layers: int) -> dict:
    r = (rec["parallel"].get("recompute") or "none").lower()
    if r.startswith("full") or "checkpointing after every" in r or r.startswith("activation checkpointing") or "ac true" in r:
        return {"recompute": "full"}
    if r.startswith("selective"):
        return {"stage_recompute": [StageRecompute(none=layers // 2, full=layers - layers // 2)]}
    return {"recompute": "none"}


def excluded(rec: dict) -> Optional[str]:
    """Why a record is not a case, or None."""
    name, gpu = rec["name"], rec["hardware"]["gpu"] or ""
    if rec.get("precision") == "fp8" or "fp8" in rec["group"] or "Float8" in name:
        return "FP8: not modelled yet (issue 12)"
    if "V100" in gpu:
        return "V100: no preset for that GPU"
    if "500W" in gpu:
        return "H100 96GB HBM2e capped at 500 W: no preset for that part"
    if (rec["parallel"].get("cp") or 1) > 1 or "CP" in name.split(",")[-1]:
        return "context parallelism: not modelled yet (issue 12)"
    if "torch.compile" in name or "compile" in (rec.get("framework") or "").lower():
        return "torch.compile fusion: not modelled"
    if "maxtext" in rec["group"] or "paxml" in name.lower() or "automodel" in rec["group"]:
        return "JAX / CP-based stacks: not modelled"
    if rec["hardware"]["count"] is None or rec["model"]["layers"] is None or rec["model"]["hidden"] is None:
        return "GPU count or model dimensions not stated"
    if "proxy" in name:
        return "a 7-layer proxy model, not a training run"
    if _family(rec) is None:
        return "model family not known"
    if rec["group"] == "megatron_2019":
        return "V100: no preset for that GPU"
    return None


def case(rec: dict) -> Case:
    p, res, n = rec["parallel"], rec["result"], rec["hardware"]["count"]
    model = _model(rec)
    tp, pp, cp = p.get("tp") or 1, p.get("pp") or 1, p.get("cp") or 1
    dp = p.get("dp") or n // (tp * pp * cp)
    mbs = p.get("micro_batch_size") or 1
    gbs = p.get("global_batch_size") or dp * mbs
    m = max(1, gbs // (dp * mbs))
    gbs = dp * mbs * m
    megatron = "DGXC" in rec["name"] or rec["group"] in ("bloom", "gpt_neox_20b")
    impl = (p.get("data_parallel_impl") or "").upper()
    zero = 1 if megatron else 2 if "SHARD_GRAD_OP" in impl or "SHARD_GRAD_OP" in rec["name"] else 3
    vpp = p.get("virtual_pp") or 1
    sp = megatron and tp > 1 and rec["group"] not in ("bloom", "gpt_neox_20b")
    plan = Plan(
        dp=dp, tp=tp, pp=pp, vpp=vpp, micro_batch_size=mbs, num_micro_batches=m, zero_stage=zero, sequence_parallel=sp,
        # NeMo's performance recipes turn TP comm overlap on (NVIDIA/dgxc-benchmarking
        # nemotron/nemotron4-15b-synth.yaml: ub_tp_comm_overlap True). A later 340B config of that
        # repository turns it off, at another batch and GPU count than the v24.11.1 table read here.
        tp_comm_overlap=sp and "DGXC" in rec["name"],
        schedule="interleaved-1f1b" if vpp > 1 else "1f1b", **_recompute(rec, model.num_layers),
    )
    flash = rec["group"] not in ("bloom", "gpt_neox_20b")
    job = JobSpec(global_batch_size=gbs, seq_len=rec["model"]["seq_len"], flash_attention=flash,
                  precision="fp16" if rec["group"] == "gpt_neox_20b" else "bf16",
                  target="megatron" if "DGXC" in rec["name"] else "generic",
                  # llm-foundry's MPT takes flash-attn's fused cross-entropy unless told otherwise
                  # (llmfoundry/models/mpt/modeling_mpt.py: loss_fn defaults to 'fused_crossentropy').
                  loss_kernel="fused" if rec["group"].startswith("llm_foundry") else None)
    per_gpu = res.get("tokens_per_sec_per_gpu")
    if per_gpu is None and res.get("tokens_per_sec"):
        per_gpu = res["tokens_per_sec"] / n
    if per_gpu is None and res.get("seconds_per_iter"):
        per_gpu = gbs * job.seq_len / res["seconds_per_iter"] / n
    if per_gpu is not None:
        metric, published = "tokens_per_s_per_gpu", float(per_gpu)
    else:
        metric, published = "hardware_tflops_per_gpu", float(res["tflops_per_gpu"])
    return Case(rec["name"], rec["group"], model, _cluster(rec), job, plan, metric, published, res.get("peak_memory_gib"))


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
