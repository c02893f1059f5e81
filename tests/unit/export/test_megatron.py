"""plan export --to megatron: Megatron-LM arguments, checked against megatron-core 0.16.1.

Megatron-LM's argument parser (megatron/training/arguments.py) is not in the megatron-core
wheel, so `megatron_lm` below reads the arguments the way it does at tag core_v0.16.1: a flag
per TransformerConfig field named by megatron/training/argument_utils.py's rule (taken from the
installed dataclass, so a flag that is no field fails), the hand-written flags listed in
LM_FLAGS, the validate_args checks that concern these flags, and
core_transformer_config_from_args' mapping. The real megatron-core then validates: the
TransformerConfig / ModelParallelConfig / DDP and optimizer configs, the micro-batch calculator,
get_num_layers_to_build and the layout parser, the schedule chooser, the rank generator, and
the block's recompute loop (run on stand-in layers).
"""

from __future__ import annotations

import contextlib
import importlib.util
import dataclasses
import enum
import json
import re
import shutil
import subprocess
import sys
import typing
from types import SimpleNamespace
from unittest import mock

import pytest

from planner.errors import UsageError
from planner.stacks import export, rules
from planner.export import megatron as mlm
from planner.stacks.megatron import rules as mlm_rules
from planner.presets import load_model
from planner.specs import JobSpec, Plan, StageRecompute
from tests.paths import HF_CONFIGS

PINNED = "0.16.1"
HF = HF_CONFIGS  # published Hugging Face configs (SOURCES.md)
SKIP = "the export extra is not installed: pip install '.[export]'"


def R(none=0, selective=0, full=0):
    return StageRecompute(none=none, selective=selective, full=full)


def job_for(plan: Plan, seq_len=4096, **kw) -> JobSpec:
    return JobSpec(
        global_batch_size=plan.dp * plan.micro_batch_size * plan.num_micro_batches,
        seq_len=seq_len,
        target="megatron",
        **kw,
    )


# (id, model, plan, job options): every ZeRO stage, schedule, split and recompute form Megatron has.
MATRIX = [
    (
        "gpt-dp8-fp16",
        "gpt3-1.3b",
        dict(dp=8, tp=1, pp=1, micro_batch_size=4, num_micro_batches=2),
        dict(seq_len=2048, precision="fp16"),
    ),
    (
        "gpt-tp2-pp2-zero1-selective-tppdp",
        "gpt3-1.3b",
        dict(
            dp=2,
            tp=2,
            pp=2,
            micro_batch_size=2,
            num_micro_batches=4,
            zero_stage=1,
            sequence_parallel=True,
            recompute="selective",
            mesh_order=["tp", "pp", "dp"],
        ),
        dict(seq_len=2048),
    ),
    (
        "gpt-fp32-sgd-unfused-tp2",
        "gpt3-1.3b",
        dict(dp=2, tp=2, pp=1, micro_batch_size=1, num_micro_batches=3),
        dict(seq_len=1024, precision="fp32", optimizer="sgd", flash_attention=False),
    ),
    (
        "gpt-pp2-vpp3-layout-block",
        "gpt3-1.3b",
        dict(
            dp=1,
            tp=1,
            pp=2,
            vpp=3,
            schedule="interleaved-1f1b",
            micro_batch_size=1,
            num_micro_batches=4,
            layers_per_stage=[4, 4, 4, 4, 5, 3],
            stage_recompute=[R(3, 0, 1), R(3, 0, 1), R(3, 0, 1), R(3, 0, 1), R(4, 0, 1), R(2, 0, 1)],
        ),
        dict(seq_len=2048),
    ),
    (
        "gpt-interleaved-vpp1-is-1f1b",
        "gpt3-1.3b",
        dict(dp=2, tp=1, pp=2, schedule="interleaved-1f1b", micro_batch_size=2, num_micro_batches=4),
        dict(seq_len=2048),
    ),
    (
        "llama8b-pp4-vpp2-sp-overlap-full",
        "llama3-8b",
        dict(
            dp=2,
            tp=2,
            pp=4,
            vpp=2,
            schedule="interleaved-1f1b",
            micro_batch_size=1,
            num_micro_batches=8,
            zero_stage=1,
            sequence_parallel=True,
            tp_comm_overlap=True,
            recompute="full",
        ),
        {},
    ),
    (
        "llama8b-pp4-first-last-block2",
        "llama3-8b",
        dict(
            dp=4,
            tp=1,
            pp=4,
            micro_batch_size=1,
            num_micro_batches=8,
            layers_per_stage=[7, 9, 9, 7],
            stage_recompute=[R(5, 0, 2), R(7, 0, 2), R(7, 0, 2), R(5, 0, 2)],
        ),
        {},
    ),
    (
        "llama8b-pp4-vpp2-first-last",
        "llama3-8b",
        dict(
            dp=1,
            tp=4,
            pp=4,
            vpp=2,
            schedule="interleaved-1f1b",
            micro_batch_size=1,
            num_micro_batches=4,
            layers_per_stage=[3, 5, 5, 3, 3, 5, 5, 3],
            sequence_parallel=True,
        ),
        {},
    ),
    (
        "llama70b-pp4-layout-block3",
        "llama3-70b",
        dict(
            dp=2,
            tp=8,
            pp=4,
            micro_batch_size=1,
            num_micro_batches=16,
            zero_stage=1,
            sequence_parallel=True,
            tp_comm_overlap=True,
            layers_per_stage=[19, 21, 20, 20],
            stage_recompute=[R(16, 0, 3), R(18, 0, 3), R(17, 0, 3), R(17, 0, 3)],
        ),
        {},
    ),
    (
        "llama70b-pp8-vpp5-selective",
        "llama3-70b",
        dict(
            dp=1,
            tp=8,
            pp=8,
            vpp=5,
            schedule="interleaved-1f1b",
            micro_batch_size=1,
            num_micro_batches=16,
            sequence_parallel=True,
            recompute="selective",
        ),
        {},
    ),
    (
        "llama70b-pp3-default-uneven",
        "llama3-70b",
        dict(dp=2, tp=4, pp=3, micro_batch_size=2, num_micro_batches=6, zero_stage=1, sequence_parallel=True),
        {},
    ),
    # Mixture of experts: ep 1, 2, 4, 8, with pipelines (1F1B, interleaved) and TP + SP; experts
    # folded from tp x dp across TP groups (ep > tp); shared experts and dense first layers
    # (DeepSeek-V3, its dense layers on the first stage) under --use-tp-pp-dp-mapping (ep = tp);
    # heads of their own width (Qwen3: --kv-channels).
    (
        "mixtral-ep8-dp8-zero1",
        "mixtral-8x7b",
        dict(dp=8, ep=8, tp=1, pp=1, micro_batch_size=1, num_micro_batches=4, zero_stage=1),
        {},
    ),
    (
        "mixtral-ep4-tp2-sp-pp2",
        "mixtral-8x7b",
        dict(
            dp=4,
            ep=4,
            tp=2,
            pp=2,
            micro_batch_size=1,
            num_micro_batches=8,
            zero_stage=1,
            sequence_parallel=True,
            recompute="selective",
        ),
        {},
    ),
    (
        "mixtral-ep2-pp4-vpp2-full",
        "mixtral-8x7b",
        dict(
            dp=2,
            ep=2,
            tp=1,
            pp=4,
            vpp=2,
            schedule="interleaved-1f1b",
            micro_batch_size=1,
            num_micro_batches=8,
            recompute="full",
        ),
        {},
    ),
    (
        "mixtral-ep1-tp4-sp-overlap",
        "mixtral-8x7b",
        dict(dp=2, tp=4, pp=1, micro_batch_size=2, num_micro_batches=2, sequence_parallel=True, tp_comm_overlap=True),
        {},
    ),
    (
        "deepseek-ep8-tp8-pp4-tppdp-first13",
        "deepseek-v3",
        dict(
            dp=2,
            ep=8,
            tp=8,
            pp=4,
            micro_batch_size=1,
            num_micro_batches=8,
            zero_stage=1,
            sequence_parallel=True,
            mesh_order=["tp", "pp", "dp"],
            layers_per_stage=[13, 16, 16, 16],
        ),
        {},
    ),
    # MLA's selective recompute: its up-projections (--recompute-modules mla_up_proj)
    (
        "deepseek-ep16-tp2-pp4-selective",
        "deepseek-v3",
        dict(
            dp=8,
            ep=16,
            tp=2,
            pp=4,
            micro_batch_size=1,
            num_micro_batches=8,
            zero_stage=1,
            sequence_parallel=True,
            recompute="selective",
            layers_per_stage=[13, 16, 16, 16],
        ),
        {},
    ),
    (
        "qwen3-ep4-tp2-dp4",
        "qwen3-30b-a3b",
        dict(dp=4, ep=4, tp=2, pp=1, micro_batch_size=1, num_micro_batches=4, zero_stage=1, sequence_parallel=True),
        {},
    ),
    # The norms' and the experts' activation recomputed (Plan.recompute_norm_act: --recompute-modules
    # layernorm moe_act), alone, beside selective recompute, beside MLA's, and on a dense model
    (
        "qwen3-ep8-norm-act",
        "qwen3-30b-a3b",
        dict(dp=8, ep=8, tp=1, pp=1, micro_batch_size=1, num_micro_batches=4, zero_stage=1, recompute_norm_act=True),
        {},
    ),
    (
        "mixtral-ep4-tp2-sp-pp2-selective-norm-act",
        "mixtral-8x7b",
        dict(
            dp=4,
            ep=4,
            tp=2,
            pp=2,
            micro_batch_size=1,
            num_micro_batches=8,
            zero_stage=1,
            sequence_parallel=True,
            recompute="selective",
            recompute_norm_act=True,
        ),
        {},
    ),
    (
        "deepseek-ep16-tp2-pp4-selective-norm-act",
        "deepseek-v3",
        dict(
            dp=8,
            ep=16,
            tp=2,
            pp=4,
            micro_batch_size=1,
            num_micro_batches=8,
            zero_stage=1,
            sequence_parallel=True,
            recompute="selective",
            layers_per_stage=[13, 16, 16, 16],
            recompute_norm_act=True,
        ),
        {},
    ),
    (
        "llama8b-tp2-sp-norm-act",
        "llama3-8b",
        dict(
            dp=4,
            tp=2,
            pp=1,
            micro_batch_size=1,
            num_micro_batches=4,
            zero_stage=1,
            sequence_parallel=True,
            recompute_norm_act=True,
        ),
        {},
    ),
    # Context parallelism (cp 2, 4; with dp, TP + SP, pipelines, interleaving, experts folded
    # from tp x cp x dp) and FP8 (on with bf16 and fp16, with and without CP; off everywhere above).
    (
        "llama8b-cp2-dp2-tp2-sp-fp8-block12",
        "llama3-8b",
        dict(
            dp=2,
            cp=2,
            tp=2,
            pp=1,
            micro_batch_size=1,
            num_micro_batches=4,
            zero_stage=1,
            sequence_parallel=True,
            fp8=True,
            stage_recompute=[R(20, 0, 12)],
        ),
        dict(seq_len=8192),
    ),
    (
        "llama8b-cp4-dp2-pp2-full",
        "llama3-8b",
        dict(dp=2, cp=4, tp=1, pp=2, micro_batch_size=1, num_micro_batches=4, recompute="full"),
        dict(seq_len=16384),
    ),
    (
        "llama70b-cp2-tp8-pp4-vpp2-fp8",
        "llama3-70b",
        dict(
            dp=1,
            cp=2,
            tp=8,
            pp=4,
            vpp=2,
            schedule="interleaved-1f1b",
            micro_batch_size=1,
            num_micro_batches=8,
            zero_stage=1,
            sequence_parallel=True,
            tp_comm_overlap=True,
            fp8=True,
        ),
        dict(seq_len=32768),
    ),
    (
        "llama8b-cp4-tp2-tppdp-at-pp1",
        "llama3-8b",  # at pp = 1 the order tp,pp,dp is Megatron's default: no mapping flag
        dict(
            dp=1,
            cp=4,
            tp=2,
            pp=1,
            micro_batch_size=1,
            num_micro_batches=2,
            sequence_parallel=True,
            mesh_order=["tp", "pp", "dp"],
        ),
        dict(seq_len=16384),
    ),
    (
        "mixtral-cp2-ep4-dp2-zero1",
        "mixtral-8x7b",
        dict(dp=2, cp=2, ep=4, tp=1, pp=1, micro_batch_size=1, num_micro_batches=4, zero_stage=1),
        dict(seq_len=8192),
    ),
    # Hybrid sharding: the distributed optimizer in dp / dp_shard instances of dp_shard x cp ranks,
    # beside TP; with experts borrowed from the instance (ep = dp_shard x tp).
    (
        "llama8b-zero1-shard2-dp4-cp2-tp2",
        "llama3-8b",
        dict(
            dp=4,
            dp_shard=2,
            cp=2,
            tp=2,
            pp=1,
            micro_batch_size=1,
            num_micro_batches=2,
            zero_stage=1,
            sequence_parallel=True,
        ),
        dict(seq_len=8192),
    ),
    (
        "mixtral-zero1-shard4-ep4-dp8",
        "mixtral-8x7b",
        dict(dp=8, dp_shard=4, ep=4, tp=1, pp=1, micro_batch_size=1, num_micro_batches=2, zero_stage=1),
        {},
    ),
    (
        "gpt-dp4-fp8-fp16",
        "gpt3-1.3b",
        dict(dp=4, tp=1, pp=1, micro_batch_size=2, num_micro_batches=2, fp8=True),
        dict(seq_len=2048, precision="fp16"),
    ),
    # Architecture read from Hugging Face configs: a window on every layer (Mistral v0.1: 4096
    # keys at 8,192 tokens; Phi-3: 2,047), QK-norm (Qwen3).
    (
        "mistral-v0.1-window-tp2-sp-pp2",
        str(HF / "mistral-7b-v0.1.json"),
        dict(dp=2, tp=2, pp=2, micro_batch_size=1, num_micro_batches=4, zero_stage=1, sequence_parallel=True),
        dict(seq_len=8192),
    ),
    (
        "phi3-window-dp4",
        str(HF / "phi-3-mini-4k.json"),
        dict(dp=4, tp=1, pp=1, micro_batch_size=2, num_micro_batches=2),
        {},
    ),
    (
        "qwen3-8b-qk-norm-tp4-pp2-selective",
        str(HF / "qwen3-8b.json"),
        dict(dp=1, tp=4, pp=2, micro_batch_size=1, num_micro_batches=4, sequence_parallel=True, recompute="selective"),
        {},
    ),
    (
        "llama8b-tp2-zero1-grad-reduce-bf16",
        "llama3-8b",
        dict(dp=4, tp=2, pp=1, micro_batch_size=1, num_micro_batches=2, zero_stage=1, sequence_parallel=True),
        dict(grad_reduce_bf16=True),
    ),
]
# Megatron runs these, but the Rules' same_per_stage (equal full counts per stage) refuses them:
# every layer fully recomputed over unequal stages (--recompute-method uniform), and block
# recompute of more layers than a short stage holds.
BEYOND_RULES = [
    (
        "llama70b-pp3-uneven-all-full",
        "llama3-70b",
        dict(dp=2, tp=4, pp=3, micro_batch_size=2, num_micro_batches=6, sequence_parallel=True, recompute="full"),
        {},
    ),
    (
        "llama8b-pp4-block-beyond-short-stage",
        "llama3-8b",
        dict(
            dp=1,
            tp=1,
            pp=4,
            micro_batch_size=1,
            num_micro_batches=4,
            layers_per_stage=[2, 10, 10, 10],
            stage_recompute=[R(0, 0, 2), R(7, 0, 3), R(7, 0, 3), R(7, 0, 3)],
        ),
        {},
    ),
]


def matrix_case(case):
    _, model_name, plan_kw, job_kw = case
    model = load_model(model_name)
    plan = Plan(**plan_kw)
    job = job_for(plan, **job_kw)
    plan.validate_for(model, job, plan.world_size)
    return plan, model, job


# --------------------------------------------------------------------------- without megatron-core


def test_rules_state_what_megatron_expresses():
    r = rules("megatron")
    assert r is mlm_rules.RULES and r.zero_stages == (0, 1) and r.zero_stages_with_pp == (0, 1)
    assert [s.value for s in r.schedules] == ["1f1b", "interleaved-1f1b"] and r.interleaved
    assert r.sequence_parallel and r.tp_comm_overlap
    assert [[a.value for a in o] for o in r.mesh_orders] == [["tp", "dp", "pp"], ["tp", "pp", "dp"]]
    assert (r.split, r.recompute) == ("free", "same_per_stage")
    assert "Megatron-FSDP" in r.notes["ZeRO"] and len(r.notes) >= 4
    assert r.max_ep is None and "expert-TP 1" in r.notes["experts"]
    assert r.max_cp is None and "--cp-comm-type p2p" in r.notes["context parallelism"]
    assert r.fp8 and "--fp8-format hybrid" in r.notes["FP8"]


BASE = dict(dp=2, tp=2, pp=2, micro_batch_size=1, num_micro_batches=4)


@pytest.mark.parametrize(
    "change, feature",
    [
        (dict(zero_stage=2), "ZeRO stage 2"),
        (dict(zero_stage=3), "ZeRO stage 3"),
        (dict(schedule="gpipe"), "schedule gpipe"),
        (dict(mesh_order=["dp", "tp", "pp"]), "mesh order dp,tp,pp"),
        (dict(stage_recompute=[R(14, 0, 2), R(15, 0, 1)]), "a different number of fully recomputed layers per stage"),
        (dict(stage_recompute=[R(8, 8, 0), R(8, 8, 0)]), "selective recompute on some layers only"),
        # megatron.py:problems, beyond the Rules
        (
            dict(pp=2, vpp=2, schedule="interleaved-1f1b", num_micro_batches=3),
            "interleaved schedule with 3 micro-batches",
        ),
        (dict(sequence_parallel=True), "sequence parallelism with seq_len 4095"),
    ],
)
def test_export_refuses_what_megatron_cannot_run(change, feature):
    plan = Plan(**{**BASE, **change})
    with pytest.raises(UsageError, match=f"megatron cannot run this plan: {feature}"):
        export("megatron", plan, load_model("llama3-8b"), job_for(plan, seq_len=4095), plan.world_size)


def _hf(name: str, **update):
    return load_model(str(HF / f"{name}.json")).model_copy(update=update)


@pytest.mark.parametrize(
    "model, feature",
    [
        (_hf("gemma-2-9b"), "megatron cannot build gemma-2-9b: activation geglu"),
        (
            load_model("llama3-8b").model_copy(update={"norms_per_layer": 4}),
            "megatron cannot build llama3-8b: norms_per_layer 4",
        ),
        (
            load_model("llama3-8b").model_copy(update={"logit_softcapping": True}),
            "megatron cannot build llama3-8b: logit_softcapping",
        ),
        (_hf("gpt-oss-120b"), "megatron cannot build gpt-oss-120b: sliding_window on 18 of 36 layers"),
        (load_model("llama3-8b").model_copy(update={"glu_limit": 7.0}), "megatron cannot build llama3-8b: glu_limit 7"),
        (
            load_model("llama3-8b").model_copy(update={"rope_attention_factor": 1.2}),
            "megatron cannot build llama3-8b: rope_attention_factor 1.2",
        ),
    ],
    ids=["geglu", "four-norms", "softcapping", "window-on-some-layers", "glu-clamp", "yarn"],
)
def test_an_architecture_megatron_cannot_build_is_refused_in_one_line(model, feature):
    """Gemma's GeGLU, four norms a layer, soft-capped logits, and windows on layers the spec
    does not name (GPT-OSS: 18 of 36): refused whatever the plan, naming the field."""
    plan = Plan(dp=8, tp=1, pp=1, micro_batch_size=1, num_micro_batches=1)
    with pytest.raises(UsageError, match=f"^{re.escape(feature)}") as refused:
        export("megatron", plan, model, job_for(plan), plan.world_size)
    assert "\n" not in str(refused.value) and str(refused.value).endswith("can (`plan solve --target deepspeed`)")
    assert mlm_rules.model_problems(load_model("llama3-8b")) == []


def test_context_parallelism_with_a_window_is_refused():
    """Transformer Engine's p2p ring (the plan's context parallelism) asserts no sliding window."""
    model = _hf("mistral-7b-v0.1")
    plan = Plan(dp=2, cp=2, tp=2, pp=1, micro_batch_size=1, num_micro_batches=2)
    with pytest.raises(
        UsageError, match="megatron cannot run this plan: context parallelism cp=2 with a sliding window"
    ):
        export("megatron", plan, model, job_for(plan, seq_len=16384), plan.world_size)
    assert mlm_rules.problems(plan, load_model("llama3-8b"), job_for(plan, seq_len=16384)) == []


def test_expert_parallelism_across_a_tp_pp_dp_mapping_is_refused():
    """parallel_state.initialize_model_parallel: without pp outermost, the expert and dense
    data-parallel sizes must agree (ep x expert-TP = tp); test_megatron_core_refuses_... runs it."""
    model, plan = (
        load_model("mixtral-8x7b"),
        Plan(dp=4, ep=4, tp=1, pp=2, micro_batch_size=1, num_micro_batches=4, mesh_order=["tp", "pp", "dp"]),
    )
    with pytest.raises(
        UsageError, match="megatron cannot run this plan: expert parallelism ep=4 with mesh order tp,pp,dp"
    ):
        export("megatron", plan, model, job_for(plan), plan.world_size)
    assert mlm_rules.problems(plan.model_copy(update={"mesh_order": ["tp", "dp", "pp"]}), model, job_for(plan)) == []


def test_context_parallelism_megatron_cannot_lay_out_is_refused():
    """--use-tp-pp-dp-mapping puts cp next to tp, inside pp (test_the_tp_pp_dp_mapping_moves_cp
    shows it); sequence parallelism needs a CP rank's s / cp tokens to split over tp."""
    model = load_model("llama3-8b")
    plan = Plan(dp=2, cp=2, tp=2, pp=2, micro_batch_size=1, num_micro_batches=4, mesh_order=["tp", "pp", "dp"])
    with pytest.raises(
        UsageError, match="megatron cannot run this plan: context parallelism cp=2 with mesh order tp,pp,dp"
    ):
        export("megatron", plan, model, job_for(plan, seq_len=8192), plan.world_size)
    one_replica = plan.model_copy(update={"dp": 1})  # dp 1, but the dp axis still holds cp: the same refusal
    assert mlm_rules.problems(one_replica, model, job_for(one_replica, seq_len=8192))
    sp = Plan(dp=1, cp=2, tp=4, pp=1, micro_batch_size=1, num_micro_batches=2, sequence_parallel=True)
    with pytest.raises(UsageError, match="sequence parallelism with 4098 tokens per CP rank not divisible by tp=4"):
        export("megatron", sp, model, job_for(sp, seq_len=8196), sp.world_size)
    with pytest.raises(UsageError, match=r"dp x cp x tp x pp = 8 GPUs, not 16"):
        mlm.export(sp, model, job_for(sp, seq_len=8192), 16)


def test_read_back_refuses_context_parallelism_and_fp8_that_are_not_ours():
    plan, model, job = _case("llama8b-cp2-dp2-tp2-sp-fp8-block12")
    data = export("megatron", plan, model, job, plan.world_size).data
    assert {k: mlm.read_back(data, 8)[k] for k in ("dp", "cp", "fp8")} == {"dp": 2, "cp": 2, "fp8": True}
    with pytest.raises(ValueError, match="--cp-comm-type a2a is not the ring"):
        mlm.read_back(_replace(data, "--cp-comm-type", "a2a"), 8)
    with pytest.raises(ValueError, match="--fp8-format e4m3 is not our FP8 recipe"):
        mlm.read_back(_replace(data, "--fp8-format", "e4m3"), 8)


def test_moe_layer_pattern_reads_as_megatron_evaluates_it():
    assert mlm.moe_layer_pattern(3, 61) == "([0]*3+[1]*58)"
    assert mlm.layer_pattern("([0]*3+[1]*58)", 61) == moe_freq_type("([0]*3+[1]*58)") == [0] * 3 + [1] * 58
    assert mlm.layer_pattern("([1]*3+[0]*1)*2", 8) == [1, 1, 1, 0, 1, 1, 1, 0]
    assert mlm.layer_pattern(2, 4) == [1, 0, 1, 0]
    with pytest.raises(ValueError, match="not a list expression"):
        mlm.layer_pattern("[__import__('os')]", 1)


def test_export_needs_the_plans_world_size():
    """Megatron has no dp flag: the launch's WORLD_SIZE sets it, so it must be the plan's."""
    plan = Plan(**BASE)
    with pytest.raises(UsageError, match="dp x tp x pp = 8 GPUs, not 16"):
        mlm.export(plan, load_model("llama3-8b"), job_for(plan), 16)


def test_split_flags_pick_the_plainest_form():
    def split(layers, pp, vpp=1):
        plan = Plan(
            dp=1,
            tp=1,
            pp=pp,
            vpp=vpp,
            micro_batch_size=1,
            num_micro_batches=pp,
            schedule="interleaved-1f1b" if vpp > 1 else "1f1b",
            layers_per_stage=layers,
        )
        return mlm._split_flags(plan, sum(layers))

    assert split([8, 8, 8, 8], 4) == []
    assert split([4] * 8, 4, 2) == [("--num-virtual-stages-per-pipeline-rank", 2)]
    assert split([7, 9, 9, 7], 4) == [
        ("--decoder-first-pipeline-num-layers", 7),
        ("--decoder-last-pipeline-num-layers", 7),
    ]
    assert split([9, 7, 8, 8], 4) == [("--pipeline-model-parallel-layout", "E,t*9|t*7|t*8|t*8,L")]
    assert mlm.layout_layers(mlm.layout_string([9, 7, 1, 8])) == [9, 7, 1, 8]
    assert mlm.megatron_stage_layers(32, 4, 2, 6, 6) == [3, 5, 5, 3, 3, 5, 5, 3]
    assert mlm.megatron_stage_layers(30, 4, 1) is None  # Megatron refuses 30 layers over 4 ranks evenly


def test_recompute_counts_under_megatron_flags():
    assert mlm_rules.megatron_recompute(("full", "block", 3), [2, 5]) == [R(0, 0, 2), R(2, 0, 3)]
    assert mlm_rules.megatron_recompute(("full", "uniform", 1), [2, 5]) == [R(0, 0, 2), R(0, 0, 5)]
    assert mlm_rules.megatron_recompute(("selective", None, None), [2, 5]) == [R(0, 2, 0), R(0, 5, 0)]


@pytest.mark.parametrize("case", BEYOND_RULES, ids=[c[0] for c in BEYOND_RULES])
def test_rules_accept_every_recompute_megatron_runs(case):
    """min(N, layers) fully recomputed layers per stage (all of a shorter stage; every layer of
    uneven stages): the Rules, hence the search, take what Megatron's block / uniform methods
    run (tests below run these through megatron-core)."""
    plan, model, job = matrix_case(case)
    assert mlm_rules.problems(plan, model, job) == []
    assert mlm_rules.RULES.plan_problems(plan, model) == []
    assert export("megatron", plan, model, job, plan.world_size).data


@pytest.mark.parametrize("case", MATRIX, ids=[c[0] for c in MATRIX])
def test_text_is_the_argument_list_for_a_shell(case):
    plan, model, job = matrix_case(case)
    out = export("megatron", plan, model, job, plan.world_size)
    assert out.kind == "args" and out.stack == "megatron"
    if shutil.which("bash") is None:
        pytest.skip("no bash to read the text")
    printed = subprocess.run(
        ["bash", "-c", "printf '%s\\0' " + out.text], capture_output=True, text=True, check=True
    ).stdout
    assert printed.split("\0")[:-1] == out.data


def test_read_back_needs_the_world_size_for_dp():
    plan, model, job = matrix_case(MATRIX[1])
    back = mlm.read_back(export("megatron", plan, model, job, 8).data)
    assert back["dp"] is None and back["num_micro_batches"] is None and back["tp"] == 2


# --------------------------------------------------------------------------- with megatron-core


def tuple_type(text: str) -> tuple:
    """Megatron-LM's --window-size type (arguments.py:tuple_type at core_v0.16.1): "1,2" or
    "(1,2)" -> (1, 2)."""
    return tuple(int(i) for i in text.strip("()").split(","))


def moe_freq_type(text: str):
    """Megatron-LM's --moe-layer-freq type (arguments.py:moe_freq_type and _eval_pattern at
    core_v0.16.1): an integer, or a list expression of digits, commas, brackets, parentheses,
    + and *, which it evaluates."""
    if "[" not in text:
        return int(text)
    if re.search(r"[^,\d\[\]\(\)\+\*]", text):
        raise ValueError(f"Invalid pattern: {text}")
    return eval(text)  # what Megatron-LM does, after the same character check


# Megatron-LM flags not generated from TransformerConfig (arguments.py / training_config.py at
# core_v0.16.1): dest -> type (bool: store_true), and the allowed values where it lists them.
LM_FLAGS = {
    "micro_batch_size": int,
    "global_batch_size": int,
    "seq_length": int,
    "max_position_embeddings": int,
    "position_embedding_type": ("learned_absolute", "rope", "mrope", "relative", "none"),
    "swiglu": bool,
    "untie_embeddings_and_output_weights": bool,
    "group_query_attention": bool,
    "decoder_first_pipeline_num_layers": int,
    "decoder_last_pipeline_num_layers": int,
    "pipeline_model_parallel_layout": str,
    "num_virtual_stages_per_pipeline_rank": int,
    "num_layers_per_virtual_pipeline_stage": int,
    "use_distributed_optimizer": bool,
    "num_distributed_optimizer_instances": int,  # _add_distributed_args, default 1
    "overlap_grad_reduce": bool,
    "overlap_param_gather": bool,
    "grad_reduce_in_bf16": bool,  # _add_mixed_precision_args
    "use_tp_pp_dp_mapping": bool,
    "optimizer": ("adam", "sgd", "muon", "dist_muon"),
    "num_experts": int,
    "moe_layer_freq": moe_freq_type,  # _add_moe_args
    "cp_comm_type": str,  # _add_distributed_args: nargs='+', default ["p2p"] (one value here: every layer alike)
    "window_size": tuple_type,
    "window_attn_skip_freq": moe_freq_type,  # _add_network_size_args, by hand
    # _add_mla_args: MLATransformerConfig's dimensions (core_transformer_config_from_args builds
    # that config under --multi-latent-attention)
    "q_lora_rank": int,
    "kv_lora_rank": int,
    "qk_head_dim": int,
    "qk_pos_emb_head_dim": int,
    "v_head_dim": int,
    # _add_network_size_args: the rotary base (an int) and Llama 3.x's scaling, which GPTModel takes
    "rotary_base": int,
    "use_rope_scaling": bool,
    "rope_scaling_factor": float,
    # --rope-type (choices rope, yarn) and _add_mla_args' YaRN factor and attention scales
    "rope_type": ("rope", "yarn"),
    "rotary_scaling_factor": float,
    "mscale": float,
    "mscale_all_dim": float,
}
MLA_DIMS = ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")
# what core_transformer_config_from_args copies by name into MLATransformerConfig's fields
MLA_ROPE = ("rotary_base", "rope_type", "rotary_scaling_factor", "mscale", "mscale_all_dim")
# TransformerConfig fields arguments.py:_add_network_size_args gives no flag of their own (set
# from the flags above or from the precision).
NOT_FLAGS = {
    "virtual_pipeline_model_parallel_size",
    "num_layers_in_first_pipeline_stage",
    "num_layers_in_last_pipeline_stage",
    "pipeline_model_parallel_layout",
    "params_dtype",
    "pipeline_dtype",
    "gated_linear_unit",
    "activation_func",
    "bias_activation_fusion",
    "num_moe_experts",
    "moe_layer_freq",
    "cp_comm_type",
    "window_size",
    "window_attn_skip_freq",
}


@pytest.fixture(scope="module")
def mcore():
    pytest.importorskip("megatron.core", reason=SKIP)
    import megatron.core

    return megatron.core


def _config_flags(TransformerConfig) -> dict:
    """flag -> (field, value a bool flag stores, or None for a flag that takes a value), named as
    megatron/training/argument_utils.py:ArgumentGroupFactory names them."""
    hints, out = typing.get_type_hints(TransformerConfig), {}
    for f in dataclasses.fields(TransformerConfig):
        if not f.init or f.name in NOT_FLAGS:
            continue
        dashed = f.name.replace("_", "-")
        names = f.metadata.get("argparse_meta", {}).get("arg_names")
        if hints[f.name] is bool:
            names = names or ([f"--{dashed}"] if f.default is False else [f"--no-{dashed}", f"--disable-{dashed}"])
            out.update({n: (f.name, f.default is False) for n in names})
        else:
            out.update({n: (f.name, None) for n in names or [f"--{dashed}"]})
    return out


def _is_list(kind) -> bool:
    if typing.get_origin(kind) is typing.Union:
        kind = next(a for a in typing.get_args(kind) if a is not type(None))
    return typing.get_origin(kind) is list


def _convert(kind, text: str):
    if typing.get_origin(kind) is typing.Union:
        kind = next(a for a in typing.get_args(kind) if a is not type(None))
    if typing.get_origin(kind) is typing.Literal or isinstance(kind, tuple):
        choices = typing.get_args(kind) if not isinstance(kind, tuple) else kind
        assert text in choices, f"{text!r} is not one of {choices}"
        return text
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return kind[text]
    return kind(text)


def megatron_lm(argv: list[str], world_size: int):
    """What Megatron-LM makes of the arguments on `world_size` GPUs: the real configs."""
    import torch
    import torch.nn.functional as F
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    flags, hints = _config_flags(TransformerConfig), typing.get_type_hints(TransformerConfig)
    kw, lm, i = {}, {}, 0
    while i < len(argv):
        flag, dest = argv[i], argv[i][2:].replace("-", "_")
        assert flag not in argv[:i], f"{flag} given twice"
        if dest in LM_FLAGS and LM_FLAGS[dest] is bool:
            lm[dest], i = True, i + 1
        elif dest in LM_FLAGS:
            lm[dest], i = _convert(LM_FLAGS[dest], argv[i + 1]), i + 2
        elif flag in flags and flags[flag][1] is not None:
            kw[flags[flag][0]], i = flags[flag][1], i + 1
        elif flag in flags and _is_list(hints[flags[flag][0]]):  # nargs: the values up to the next flag
            j = next((k for k in range(i + 1, len(argv)) if argv[k].startswith("--")), len(argv))
            kw[flags[flag][0]], i = list(argv[i + 1 : j]), j
        elif flag in flags:
            kw[flags[flag][0]], i = _convert(hints[flags[flag][0]], argv[i + 1]), i + 2
        else:
            raise AssertionError(f"Megatron-LM 0.16.1 has no flag {flag}")
    tp, pp, L = kw.get("tensor_model_parallel_size", 1), kw.get("pipeline_model_parallel_size", 1), kw["num_layers"]
    cp = kw.get("context_parallel_size", 1)
    # arguments.py:validate_args, the checks that concern these flags.
    total_model_size = tp * pp * cp
    assert world_size % total_model_size == 0, (
        f"world size ({world_size}) is not divisible by total_model_size ({total_model_size=})"
    )
    if cp > 1:
        assert lm["seq_length"] % (cp * 2) == 0, (
            "seq-length should be a multiple of 2 * context-parallel-size if context-parallel-size > 1."
        )
    assert "a2a+p2p" not in lm.get("cp_comm_type", "p2p"), (
        "--hierarchical-context-parallel-sizes must be set when a2a+p2p is used in cp comm"
    )
    first, last = lm.get("decoder_first_pipeline_num_layers"), lm.get("decoder_last_pipeline_num_layers")
    layout, vpp = lm.get("pipeline_model_parallel_layout"), lm.get("num_virtual_stages_per_pipeline_rank")
    assert (
        sum(
            k in lm
            for k in (
                "num_layers_per_virtual_pipeline_stage",
                "num_virtual_stages_per_pipeline_rank",
                "pipeline_model_parallel_layout",
            )
        )
        <= 1
    )
    if layout is not None:
        vpp = PipelineParallelLayerLayout.get_num_stages_from_str(layout) // pp
    elif first is None and last is None:
        assert L % pp == 0, "Number of layers should be divisible by the pipeline-model-parallel size"
    if lm.get("overlap_param_gather"):
        assert lm.get("use_distributed_optimizer") and lm.get("overlap_grad_reduce")
    instances = lm.get("num_distributed_optimizer_instances", 1)
    # megatron-core's distributed_data_parallel.py (DistributedDataParallel.__init__) and
    # parallel_state.initialize_model_parallel, which model_parallel() below runs
    assert instances == 1 or lm.get("use_distributed_optimizer"), "Partial DistOpt cannot be used without DistOpt"
    if kw.get("tp_comm_overlap"):
        assert kw.get("sequence_parallel")
    assert lm["max_position_embeddings"] >= lm["seq_length"]
    ep = kw.get("expert_model_parallel_size", 1)
    if ep > 1:
        assert lm.get("num_experts") is not None, "num_experts must be non None to use expert model parallelism"
        assert lm["num_experts"] % ep == 0, "Number of experts should be a multiple of expert model parallel_size."
    # arguments.py:core_transformer_config_from_args (num_moe_experts from --num-experts; the
    # other fields, moe_layer_freq among them, by name).
    dtype = torch.bfloat16 if kw.get("bf16") else torch.float16 if kw.get("fp16") else torch.float32
    swiglu = lm.get("swiglu", False)
    if not lm.get("group_query_attention"):
        kw["num_query_groups"] = None
    if kw.get("multi_latent_attention"):
        from megatron.core.transformer.transformer_config import MLATransformerConfig as TransformerConfig

        kw.update({k: lm[k] for k in MLA_DIMS + MLA_ROPE if k in lm})
    else:
        assert lm.get("rope_type", "rope") == "rope", "Common attention only support rope_type=rope"
    config = TransformerConfig(
        **kw,
        num_layers_in_first_pipeline_stage=first,
        num_layers_in_last_pipeline_stage=last,
        virtual_pipeline_model_parallel_size=vpp if vpp and vpp > 1 else None,
        pipeline_model_parallel_layout=layout,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        gated_linear_unit=swiglu,
        activation_func=F.silu if swiglu else F.gelu,
        # bias_swiglu_fusion / bias_gelu_fusion default on; validate_args turns the gelu one off without biases
        bias_activation_fusion=swiglu or kw.get("add_bias_linear", True),
        num_moe_experts=lm.get("num_experts"),
        moe_layer_freq=lm.get("moe_layer_freq", 1),
        cp_comm_type=lm.get("cp_comm_type", "p2p"),  # one value: kw_args['cp_comm_type'] = args.cp_comm_type[0]
        window_size=lm.get("window_size"),
        window_attn_skip_freq=lm.get("window_attn_skip_freq"),
    )
    dp = world_size // total_model_size  # args.data_parallel_size
    return SimpleNamespace(
        config=config,
        lm=lm,
        dp=dp,
        world_size=world_size,
        # validate_args: bf16 accumulates and all-reduces gradients in fp32 unless --grad-reduce-in-bf16
        ddp=DistributedDataParallelConfig(
            grad_reduce_in_fp32=bool(kw.get("bf16")) and not lm.get("grad_reduce_in_bf16", False),
            use_distributed_optimizer=lm.get("use_distributed_optimizer", False),
            num_distributed_optimizer_instances=instances,
            overlap_grad_reduce=lm.get("overlap_grad_reduce", False),
            overlap_param_gather=lm.get("overlap_param_gather", False),
        ),
        optimizer=OptimizerConfig(
            optimizer=lm.get("optimizer", "adam"),
            use_distributed_optimizer=lm.get("use_distributed_optimizer", False),
            bf16=config.bf16,
            fp16=config.fp16,
            params_dtype=dtype,
        ),
        batches=ConstantNumMicroBatchesCalculator(
            lm["global_batch_size"], lm["micro_batch_size"], dp, decrease_batch_size_if_needed=False, rank=0
        ),
        order="tp-cp-ep-pp-dp" if lm.get("use_tp_pp_dp_mapping") else "tp-cp-ep-dp-pp",
    )


def built_layers(config) -> list[int]:
    """Layers per virtual stage (chunk x pp + rank) as Megatron builds them."""
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    pp, vpp = config.pipeline_model_parallel_size, config.virtual_pipeline_model_parallel_size or 1
    if config.pipeline_model_parallel_layout is not None:
        grid = config.pipeline_model_parallel_layout.layout  # [pp rank][chunk] -> layer kinds
        return [grid[r][c].count(LayerType.decoder) for c in range(vpp) for r in range(pp)]
    return [
        get_num_layers_to_build(config, vp_stage=c if vpp > 1 else None, pp_rank=r)
        for c in range(vpp)
        for r in range(pp)
    ]


def recomputed(config, n: int) -> StageRecompute:
    """(none, selective, full) of a model chunk of n layers: selective from attention.py's
    checkpoint_core_attention rule, full by running TransformerBlock._checkpointed_forward over
    stand-in layers and counting those it runs inside tensor_parallel.checkpoint (under FP8,
    Transformer Engine's te_checkpoint, which takes the RNG tracker and TP group first). The
    block's input requires grad, as the embedding's output or a received activation does: with
    FP8, block recompute skips layers whose input does not."""
    import torch
    from megatron.core import tensor_parallel
    from megatron.core.transformer import transformer_block
    from megatron.core.transformer.transformer_block import TransformerBlock

    # selective: the core attention, or MLA's up-projections (multi_latent_attention.py: recompute_up_proj)
    if config.recompute_granularity == "selective" and (
        "core_attn" in config.recompute_modules
        or (config.multi_latent_attention and "mla_up_proj" in config.recompute_modules)
    ):
        return R(selective=n)
    if config.recompute_granularity != "full":  # TransformerBlock.forward checkpoints only under 'full'
        return R(none=n)
    inside, ran = [], []

    def checkpoint(forward, distribute_saved_activations, *args):
        inside.append(True)
        try:
            return forward(*args)
        finally:
            inside.pop()

    def te_checkpoint(forward, distribute_saved_activations, get_rng_state_tracker, tp_group, *args):
        return checkpoint(forward, distribute_saved_activations, *args)

    def layer(hidden_states, context, **_):
        ran.append(bool(inside))
        return hidden_states, context

    block = SimpleNamespace(
        config=config,
        num_layers_per_pipeline_rank=n,
        layers=[layer] * n,
        _get_layer=lambda i: layer,
        pg_collection=SimpleNamespace(tp=None),
    )
    with (
        mock.patch.object(tensor_parallel, "checkpoint", checkpoint),
        mock.patch.object(transformer_block, "te_checkpoint", te_checkpoint),
    ):
        TransformerBlock._checkpointed_forward(
            block,
            hidden_states=torch.zeros(1, requires_grad=True),
            attention_mask=None,
            context=None,
            context_mask=None,
            rotary_pos_emb=None,
            attention_bias=None,
            packed_seq_params=None,
            use_inner_quantization_context=False,
        )
    assert len(ran) == n
    return R(none=ran.count(False), full=ran.count(True))


GROUPS = ("tp", "cp", "dp", "pp", "dp-cp")  # dp-cp: the ranks holding the same weights (gradients reduced over them)


def mesh_groups(plan: Plan) -> dict:
    """Rank groups of each axis (and of dp x cp) with the plan's mesh order (innermost first),
    cp innermost inside the dp axis."""
    degree = {"dp": plan.dp, "cp": plan.cp, "tp": plan.tp, "pp": plan.pp}
    order = [b for a in plan.mesh_order for b in (("cp", "dp") if a.value == "dp" else (a.value,))]
    stride = {a: 1 for a in order}
    for inner, outer in zip(order, order[1:]):
        stride[outer] = stride[inner] * degree[inner]

    def groups(axes: list[str]) -> list[list[int]]:
        others = [a for a in order if a not in axes]
        starts = {sum(stride[a] * k for a, k in zip(others, ks)) for ks in _product([range(degree[a]) for a in others])}
        offsets = [sum(stride[a] * k for a, k in zip(axes, ks)) for ks in _product([range(degree[a]) for a in axes])]
        return sorted(sorted(s + o for o in offsets) for s in starts)

    return {name: groups(name.split("-")) for name in GROUPS}


def _product(ranges):
    out = [()]
    for r in ranges:
        out = [o + (k,) for o in out for k in r]
    return out


def folded_expert_groups(plan: Plan) -> list[list[list[int]]]:
    """The cost model's expert-parallel groups (cost_models/tables.py:ep_link_of), per pipeline
    rank: its tp x cp x dp ranks in order, tp fastest, cut into runs of ep."""
    degree = {"dp": plan.dp * plan.cp, "tp": plan.tp, "pp": plan.pp}  # the dp axis holds cp innermost
    stride, step = {}, 1
    for axis in (a.value for a in plan.mesh_order):
        stride[axis], step = step, step * degree[axis]
    out = []
    for p in range(plan.pp):
        block = [
            p * stride["pp"] + d * stride["dp"] + t * stride["tp"] for d in range(degree["dp"]) for t in range(plan.tp)
        ]
        out.append([sorted(block[k : k + plan.ep]) for k in range(0, len(block), plan.ep)])
    return out


@contextlib.contextmanager
def model_parallel(m):
    """megatron-core's parallel_state.initialize_model_parallel for the exported sizes, as rank 0
    of a fake process group of the world size (no communication): its own checks run."""
    import torch.distributed as dist
    from megatron.core import parallel_state
    from torch.testing._internal.distributed.fake_pg import FakeStore

    c = m.config
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", rank=0, world_size=m.world_size, store=FakeStore())
    try:
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=c.tensor_model_parallel_size,
            pipeline_model_parallel_size=c.pipeline_model_parallel_size,
            virtual_pipeline_model_parallel_size=c.virtual_pipeline_model_parallel_size,
            context_parallel_size=c.context_parallel_size,
            expert_model_parallel_size=c.expert_model_parallel_size,
            expert_tensor_parallel_size=c.expert_tensor_parallel_size,
            num_distributed_optimizer_instances=m.ddp.num_distributed_optimizer_instances if hasattr(m, "ddp") else 1,
            order=m.order,
            create_gloo_process_groups=False,
        )
        yield parallel_state
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


def check_experts(m, plan: Plan, model) -> None:
    """The MoE side of an export as megatron-core builds it: the config's expert fields, the
    layer specs (dense MLPs first, all on the first stage), and the expert groups from
    parallel_state (rank 0's, and every group its RankGenerator makes) equal to the folding the
    cost model prices."""
    import torch.distributed as dist
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec, get_gpt_decoder_layer_specs
    from megatron.core.parallel_state import RankGenerator

    c = m.config
    assert (c.num_moe_experts, c.moe_router_topk, c.moe_ffn_hidden_size) == (
        model.num_experts,
        model.experts_per_token,
        model.moe_ffn,
    )
    assert c.moe_shared_expert_intermediate_size == ((model.num_shared_experts * model.moe_ffn) or None)
    assert (c.expert_model_parallel_size, c.expert_tensor_parallel_size) == (plan.ep, 1)
    assert (c.moe_token_dispatcher_type, c.moe_grouped_gemm, c.moe_expert_capacity_factor) == (
        "alltoall",
        True,
        None,
    )  # dropless
    kinds = [
        spec.submodules.mlp.module.__name__ for spec in get_gpt_decoder_layer_specs(c, use_transformer_engine=False)
    ]
    assert kinds == ["MLP"] * model.first_dense_layers + ["MoELayer"] * (model.num_layers - model.first_dense_layers)
    folded = folded_expert_groups(plan)
    with model_parallel(m) as ps:  # rank 0: the first group of the first stage; its expert-DP peers lead the others
        # (a --pipeline-model-parallel-layout asks parallel_state for the rank's pipeline rank)
        first = get_gpt_decoder_block_spec(
            c, use_transformer_engine=False, pp_rank=0, vp_stage=0 if plan.vpp > 1 else None
        )
        assert [s.submodules.mlp.module.__name__ for s in first.layer_specs].count("MLP") == model.first_dense_layers
        assert sorted(dist.get_process_group_ranks(ps.get_expert_model_parallel_group())) == folded[0][0]
        assert sorted(dist.get_process_group_ranks(ps.get_expert_data_parallel_group())) == sorted(
            g[0] for g in folded[0]
        )
    generated = RankGenerator(
        tp=1, ep=plan.ep, dp=plan.world_size // (plan.ep * plan.pp), pp=plan.pp, cp=1, order=m.order
    )
    assert sorted(sorted(g) for g in generated.get_ranks("ep")) == sorted(g for stage in folded for g in stage)


def check_architecture(c, model, job: JobSpec) -> None:
    """QK-norm and sliding windows as megatron-core builds them: the layer spec's query and key
    norms (gpt_builders.py passes --qk-layernorm to it), which layers attend within a window
    (transformer/utils.py:is_layer_window_attention, as dot_product_attention.py and TE's
    attention ask it) and the keys each query sees there (get_sliding_window_causal_mask: the
    spec's window counts the query's own key, as the cost model's w(w+1)/2 + (s-w)w pairs)."""
    import torch
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.identity_op import IdentityOp
    from megatron.core.transformer.utils import get_sliding_window_causal_mask, is_layer_window_attention

    attention = get_gpt_layer_local_spec(qk_layernorm=c.qk_layernorm).submodules.self_attention.submodules
    assert (attention.q_layernorm is not IdentityOp, attention.k_layernorm is not IdentityOp) == (
        model.qk_norm,
        model.qk_norm,
    )
    windowed = [
        is_layer_window_attention(c.window_size, c.window_attn_skip_freq, n) for n in range(1, model.num_layers + 1)
    ]
    assert sum(windowed) == model.sliding_window_layers
    if model.sliding_window is not None:
        ones = torch.ones
        with mock.patch.object(
            torch, "ones", lambda *a, device=None, **k: ones(*a, **k)
        ):  # it builds the mask on "cuda"
            masked = get_sliding_window_causal_mask(job.seq_len, job.seq_len, c.window_size)
        keys = (~masked).sum(dim=1)
        expected = torch.tensor([min(i + 1, model.sliding_window) for i in range(job.seq_len)])
        # the first query that sees the wrong number of keys, not two lists of seq_len numbers:
        # pytest's diff of those (in full when CI is set) took tens of minutes
        wrong = (keys != expected).nonzero().flatten()
        assert len(wrong) == 0, (
            f"query {int(wrong[0])} sees {int(keys[wrong[0]])} keys, the spec's window {int(expected[wrong[0]])}"
        )


NORM_ACT = ("layernorm", "moe_act")  # Megatron-Core's recompute modules Plan.recompute_norm_act writes


@pytest.mark.slow
def test_megatron_core_is_the_pinned_version(mcore):
    assert mcore.__version__ == PINNED, f"the export rules cite megatron-core {PINNED}; installed {mcore.__version__}"


@pytest.mark.slow
@pytest.mark.parametrize("case", MATRIX, ids=[c[0] for c in MATRIX])
def test_megatron_accepts_the_export_and_it_means_the_plan(case, mcore):
    plan, model, job = matrix_case(case)
    check_means_the_plan(export("megatron", plan, model, job, plan.world_size).data, plan, model, job)


@pytest.mark.parametrize("case", BEYOND_RULES, ids=[c[0] for c in BEYOND_RULES])
def test_megatron_runs_the_recompute_the_rules_refuse(case, mcore):
    plan, model, job = matrix_case(case)
    check_means_the_plan(mlm.export(plan, model, job, plan.world_size).data, plan, model, job)


def check_means_the_plan(data: list[str], plan: Plan, model, job: JobSpec) -> None:
    from megatron.core.parallel_state import RankGenerator
    from megatron.core.pipeline_parallel.schedules import get_forward_backward_func

    m = megatron_lm(data, plan.world_size)
    c, L = m.config, model.num_layers
    vpp = c.virtual_pipeline_model_parallel_size
    assert (m.dp, c.context_parallel_size, c.tensor_model_parallel_size, c.pipeline_model_parallel_size) == (
        plan.dp,
        plan.cp,
        plan.tp,
        plan.pp,
    )
    assert plan.cp == 1 or c.cp_comm_type == "p2p"  # the ring of K/V chunks the cost model prices
    if plan.fp8:  # Transformer Engine's hybrid format, per-tensor delayed scaling; attention and weights stay 16-bit
        assert (c.fp8, c.fp8_recipe, c.fp8_param, c.fp8_dot_product_attention, c.fp8_wgrad) == (
            "hybrid",
            "delayed",
            False,
            False,
            True,
        )
    else:
        assert c.fp8 is None
    assert (m.batches.micro_batch_size, m.batches.num_micro_batches) == (plan.micro_batch_size, plan.num_micro_batches)
    # the interleaved schedule with one chunk per rank is 1F1B: Megatron runs it without interleaving
    assert (vpp or 1) == plan.vpp
    want = {1: "forward_backward_no_pipelining"}.get(
        plan.pp, "forward_backward_pipelining_" + ("with_interleaving" if plan.vpp > 1 else "without_interleaving")
    )
    assert get_forward_backward_func(plan.pp, vpp).__name__ == want
    if vpp:  # schedules.py: micro-batches run in groups of microbatch_group_size_per_vp_stage
        assert plan.num_micro_batches % c.microbatch_group_size_per_vp_stage == 0
    layers = built_layers(c)
    assert layers == plan.stage_layers(L)
    assert [recomputed(c, n) for n in layers] == plan.stage_recompute_counts(L)
    assert m.ddp.use_distributed_optimizer == m.optimizer.use_distributed_optimizer == (plan.zero_stage == 1)
    assert m.ddp.num_distributed_optimizer_instances == plan.dp // (plan.dp_shard or plan.dp)  # hybrid sharding
    assert m.ddp.overlap_grad_reduce == (plan.dp > 1)
    # the gradient buffer's dtype the memory model priced (cost_models/memory.py: megatron's recipes)
    assert m.ddp.grad_reduce_in_fp32 == (job.precision == "bf16" and not job.grad_reduce_bf16)
    assert (c.sequence_parallel, c.tp_comm_overlap) == (plan.sequence_parallel, plan.tp_comm_overlap)
    assert (c.bf16, c.fp16) == (
        job.precision == "bf16",
        job.precision == "fp16",
    ) and m.optimizer.optimizer == job.optimizer
    ranks = RankGenerator(tp=plan.tp, ep=1, dp=plan.dp, pp=plan.pp, cp=plan.cp, order=m.order)
    assert {a: sorted(sorted(g) for g in ranks.get_ranks(a)) for a in GROUPS} == mesh_groups(plan)
    assert (c.num_layers, c.hidden_size, c.ffn_hidden_size, c.num_attention_heads, c.num_query_groups) == (
        L,
        model.hidden_size,
        model.ffn,
        model.num_heads,
        model.kv_heads,
    )
    assert c.gated_linear_unit == (model.activation == "swiglu") and c.add_bias_linear == model.linear_bias
    assert c.normalization == {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm"}[model.norm]
    assert (c.hidden_dropout > 0) == model.dropout and (c.attention_backend.name == "unfused") == (
        not job.flash_attention
    )
    assert m.lm["seq_length"] == job.seq_len and m.lm.get("untie_embeddings_and_output_weights", False) == (
        not model.tied_embeddings
    )
    assert (
        m.lm.get("position_embedding_type", "learned_absolute") == "learned_absolute"
    ) == model.learned_position_embeddings
    if model.mla:  # MLA's dimensions are its own (kv_channels unused)
        assert c.multi_latent_attention and tuple(getattr(c, k) for k in MLA_DIMS) == (
            model.q_lora_rank,
            model.kv_lora_rank,
            model.head_dim,
            model.qk_rope_head_dim,
            model.v_dim,
        )
        if (
            c.recompute_granularity == "selective" and plan.recompute != "none"
        ):  # what the cost model reruns: the up-projections (fused attention)
            assert [m for m in c.recompute_modules if m not in NORM_ACT] == (
                ["mla_up_proj"] if job.flash_attention else ["core_attn", "mla_up_proj"]
            )
    else:
        assert c.kv_channels == model.head_dim and not c.multi_latent_attention
    # Plan.recompute_norm_act: the norms' outputs (the experts' activation too in a MoE model) discarded and rerun
    modules = set(c.recompute_modules or ()) if c.recompute_granularity == "selective" else set()
    assert modules & set(NORM_ACT) == (
        (set(NORM_ACT) if model.is_moe else {"layernorm"}) if plan.recompute_norm_act else set()
    )
    check_architecture(c, model, job)
    check_rope_and_biases(m, model)
    if model.is_moe:
        check_experts(m, plan, model)
    else:
        assert (c.num_moe_experts, c.expert_model_parallel_size) == (None, 1)


def check_rope_and_biases(m, model) -> None:
    """The rotary base and scaling and the q/k/v biases Megatron builds are the model's: GPTModel
    takes --rotary-base, --use-rope-scaling and --rope-scaling-factor (whose band is Llama 3.x's:
    rotary_pos_embedding.py:_apply_scaling's defaults), MLATransformerConfig its YaRN fields."""
    c, lm = m.config, m.lm
    assert c.add_qkv_bias == model.qkv_bias
    if model.learned_position_embeddings:
        return
    r = model.rope_scaling
    if model.mla:
        assert c.rotary_base == model.rope_theta
        assert c.rope_type == ("rope" if r is None else "yarn")
        if r is not None:
            assert (c.rotary_scaling_factor, c.mscale, c.mscale_all_dim) == (
                r.factor,
                r.mscale or 1.0,
                r.mscale_all_dim or 0.0,
            )
            assert (c.original_max_position_embeddings, c.beta_fast, c.beta_slow) == (
                r.original_max_position_embeddings or 4096,
                r.beta_fast or 32,
                r.beta_slow or 1,
            )
        return
    assert lm["rotary_base"] == model.rope_theta
    assert lm.get("use_rope_scaling", False) == (r is not None)
    if r is not None:
        import inspect
        from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

        band = inspect.signature(RotaryEmbedding._apply_scaling).parameters
        assert (r.rope_type, lm["rope_scaling_factor"]) == ("llama3", r.factor)
        assert r.band() == tuple(
            band[k].default for k in ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
        )


# (id, model, what Megatron must build): one per family the exports must train as planned
ROPE_FAMILIES = [
    ("llama3.1-8b", str(HF / "llama-3.1-8b.json"), dict(rope_theta=500000.0, rope_scaling=8.0, qkv_bias=False)),
    ("llama3-8b", str(HF / "llama-3-8b.json"), dict(rope_theta=500000.0, rope_scaling=None, qkv_bias=False)),
    ("qwen2-7b", str(HF / "qwen2-7b.json"), dict(rope_theta=1000000.0, rope_scaling=None, qkv_bias=True)),
    ("qwen2.5-7b", str(HF / "qwen2.5-7b.json"), dict(rope_theta=1000000.0, rope_scaling=None, qkv_bias=True)),
    ("mixtral", str(HF / "mixtral-8x7b.json"), dict(rope_theta=1000000.0, rope_scaling=None, qkv_bias=False)),
    ("qwen3-8b", str(HF / "qwen3-8b.json"), dict(rope_theta=1000000.0, rope_scaling=None, qkv_bias=False)),
    ("deepseek-v3", str(HF / "deepseek-v3.json"), dict(rope_theta=10000.0, rope_scaling=40.0, qkv_bias=False)),
    ("llama2-7b", "llama2-7b", dict(rope_theta=10000.0, rope_scaling=None, qkv_bias=False)),
]


@pytest.mark.parametrize("name,source,want", ROPE_FAMILIES, ids=[f[0] for f in ROPE_FAMILIES])
def test_export_trains_the_planned_rope_and_biases(name, source, want, mcore):
    """Megatron-LM's own config objects read back the planned rotary base, scaling and q/k/v
    biases (Megatron's defaults, 10,000 and none, are not Llama 3's or Qwen2's)."""
    model = load_model(source)
    assert (model.rope_theta, model.rope_scaling.factor if model.rope_scaling else None, model.qkv_bias) == tuple(
        want.values()
    )
    ep = 8 if model.is_moe else 1
    plan = Plan(dp=8, tp=1, pp=1, ep=ep, micro_batch_size=1, num_micro_batches=1)
    data = export("megatron", plan, model, job_for(plan), plan.world_size).data
    m = megatron_lm(data, plan.world_size)
    check_rope_and_biases(m, model)
    back = mlm.read_back(data, plan.world_size)
    assert (back["rope_theta"], back["qkv_bias"]) == (model.rope_theta, model.qkv_bias)
    assert (back["rope_scaling"] or {}).get("factor") == want["rope_scaling"]


@pytest.mark.parametrize(
    "update,field",
    [
        (dict(rope_theta=500000.5), "rope_theta 500000"),
        (dict(rope_scaling={"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 2.0}), "high_freq_factor 2"),
        (dict(rope_scaling={"rope_type": "linear", "factor": 2.0}), "rope_scaling linear"),
    ],
)
def test_megatron_refuses_a_rope_it_cannot_build(update, field):
    """A rotary base or scaling Megatron-LM's arguments cannot state: export refuses it in one
    line naming the field, and the search does not offer the stack."""
    from planner.specs import ModelSpec

    model = ModelSpec.model_validate({**load_model("llama3-8b").model_dump(), **update})
    plan = Plan(dp=8, tp=1, pp=1, micro_batch_size=1, num_micro_batches=1)
    with pytest.raises(UsageError, match=field):
        export("megatron", plan, model, job_for(plan), 8)
    assert any(field in p for p in mlm_rules.model_problems(model))


def test_megatron_refuses_yarn_on_standard_attention():
    """GPT-OSS: YaRN on standard attention (Megatron-LM: "Common attention only support rope_type=rope")."""
    model = load_model(str(HF / "gpt-oss-120b.json"))
    assert any("rope_scaling yarn on standard attention" in p for p in mlm_rules.model_problems(model))


@pytest.mark.parametrize("case", MATRIX, ids=[c[0] for c in MATRIX])
def test_round_trip_through_megatron(case, mcore):
    plan, model, job = matrix_case(case)
    data = export("megatron", plan, model, job, plan.world_size).data
    m = megatron_lm(data, plan.world_size)
    back = mlm.read_back(data, plan.world_size)
    assert back["stage_layers"] == built_layers(m.config)
    assert (back["dp"], back["num_micro_batches"]) == (m.dp, m.batches.num_micro_batches)
    mine = {
        k: back[k]
        for k in (
            "dp",
            "dp_shard",
            "cp",
            "tp",
            "pp",
            "vpp",
            "micro_batch_size",
            "num_micro_batches",
            "zero_stage",
            "sequence_parallel",
            "tp_comm_overlap",
            "precision",
            "optimizer",
            "fp8",
            "recompute_norm_act",
        )
    }
    assert mine == dict(
        dp=plan.dp,
        dp_shard=plan.dp_shard,
        cp=plan.cp,
        tp=plan.tp,
        pp=plan.pp,
        vpp=plan.vpp,
        fp8=plan.fp8,
        micro_batch_size=plan.micro_batch_size,
        num_micro_batches=plan.num_micro_batches,
        zero_stage=plan.zero_stage,
        sequence_parallel=plan.sequence_parallel,
        tp_comm_overlap=plan.tp_comm_overlap,
        precision=job.precision.value,
        optimizer=job.optimizer.value,
        recompute_norm_act=plan.recompute_norm_act,
    )
    assert back["global_batch_size"] == job.global_batch_size
    assert back["stage_layers"] == plan.stage_layers(model.num_layers)
    assert back["stage_recompute"] == [
        (r.none, r.selective, r.full) for r in plan.stage_recompute_counts(model.num_layers)
    ]
    if plan.pp > 1:
        assert back["schedule"] == ("interleaved-1f1b" if plan.vpp > 1 else "1f1b")
    degree = {"dp": plan.dp * plan.cp, "tp": plan.tp, "pp": plan.pp}
    assert [a for a in back["mesh_order"] if degree[a] > 1] == [a.value for a in plan.mesh_order if degree[a.value] > 1]
    assert (back["num_layers"], back["num_kv_heads"], back["activation"], back["tied_embeddings"]) == (
        model.num_layers,
        model.kv_heads,
        model.activation.value,
        model.tied_embeddings,
    )
    assert (
        (back["qk_norm"], back["sliding_window"])
        == (model.qk_norm, model.sliding_window)
        == (m.config.qk_layernorm, m.config.window_size[0] + 1 if m.config.window_size else None)
    )
    assert (
        (back["ep"], back["num_experts"])
        == (plan.ep, model.num_experts)
        == (m.config.expert_model_parallel_size, m.config.num_moe_experts)
    )
    if model.is_moe:
        assert {
            k: back[k] for k in ("experts_per_token", "moe_ffn_hidden_size", "num_shared_experts", "first_dense_layers")
        } == {
            "experts_per_token": model.experts_per_token,
            "moe_ffn_hidden_size": model.moe_ffn,
            "num_shared_experts": model.num_shared_experts,
            "first_dense_layers": model.first_dense_layers,
        }


def _replace(argv, flag, value):
    argv = list(argv)
    argv[argv.index(flag) + 1] = str(value)
    return argv


def test_megatron_rejects_a_broken_export(mcore):
    """The checks can fail: a global batch one more than micro x dp x micro-batches, a first
    stage that leaves the middle ranks unequal, sequence parallelism without tp (which
    megatron-core refuses; Megatron-LM's validate_args would drop it first), a flag that does
    not exist, a layout one layer short."""
    plan, model, job = matrix_case(MATRIX[6])  # llama8b-pp4-first-last-block2
    data = export("megatron", plan, model, job, plan.world_size).data
    megatron_lm(data, plan.world_size)
    with pytest.raises(AssertionError, match="global batch size"):
        megatron_lm(_replace(data, "--global-batch-size", job.global_batch_size + 1), plan.world_size)
    with pytest.raises(ValueError, match="middle stage"):
        megatron_lm(_replace(data, "--decoder-first-pipeline-num-layers", 6), plan.world_size)
    with pytest.raises(ValueError, match="sequence parallelism"):
        megatron_lm(["--sequence-parallel"] + data, plan.world_size)
    with pytest.raises(AssertionError, match="no flag --num-gpus"):
        megatron_lm(data + ["--num-gpus", "16"], plan.world_size)
    plan, model, job = matrix_case(MATRIX[8])  # llama70b-pp4-layout-block3
    data = export("megatron", plan, model, job, plan.world_size).data
    with pytest.raises(AssertionError, match="Number of decoder layers"):
        megatron_lm(_replace(data, "--pipeline-model-parallel-layout", "E,t*19|t*21|t*20|t*19,L"), plan.world_size)


def _case(name):
    return matrix_case(next(c for c in MATRIX if c[0] == name))


def test_megatron_rejects_a_broken_moe_export(mcore):
    """Experts the expert-parallel degree does not divide (Megatron-LM's validate_args; and
    megatron-core's parallel_state, for which 3 ranks do not tile a stage of 8), and a
    --moe-layer-freq list one layer short (the layer specs)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_layer_specs

    plan, model, job = _case("mixtral-ep8-dp8-zero1")
    data = export("megatron", plan, model, job, plan.world_size).data
    with pytest.raises(AssertionError, match="Number of experts should be a multiple of expert model parallel_size"):
        megatron_lm(_replace(data, "--expert-model-parallel-size", 3), plan.world_size)
    m = megatron_lm(data, plan.world_size)
    three = SimpleNamespace(
        config=dataclasses.replace(m.config, expert_model_parallel_size=3), world_size=m.world_size, order=m.order
    )
    with pytest.raises(
        RuntimeError, match=r"world_size \(8\) is not divisible by expert_tensor_model_pipeline_parallel size \(3\)"
    ):
        with model_parallel(three):
            pass
    plan, model, job = _case("deepseek-ep8-tp8-pp4-tppdp-first13")
    data = export("megatron", plan, model, job, plan.world_size).data
    assert data[data.index("--moe-layer-freq") + 1] == "([0]*3+[1]*58)"
    short = megatron_lm(_replace(data, "--moe-layer-freq", "([0]*3+[1]*57)"), plan.world_size)
    with pytest.raises(AssertionError, match="Invalid length of moe_layer_pattern: 60, expected 61"):
        get_gpt_decoder_layer_specs(short.config, use_transformer_engine=False)


CP_CASES = [c for c in MATRIX if c[2].get("cp", 1) > 1]


@pytest.mark.parametrize("case", CP_CASES, ids=[c[0] for c in CP_CASES])
def test_megatron_core_builds_the_context_parallel_groups(case, mcore):
    """parallel_state.initialize_model_parallel (rank 0 of a fake group of the world size): its
    context-parallel group, its data-parallel group with and without cp (the one gradients are
    reduced and the distributed optimizer shards over) are the plan's: cp innermost in dp."""
    import torch.distributed as dist

    plan, model, job = matrix_case(case)
    m = megatron_lm(export("megatron", plan, model, job, plan.world_size).data, plan.world_size)
    want = {name: next(g for g in groups if 0 in g) for name, groups in mesh_groups(plan).items()}
    with model_parallel(m) as ps:
        assert sorted(dist.get_process_group_ranks(ps.get_context_parallel_group())) == want["cp"]
        assert sorted(dist.get_process_group_ranks(ps.get_data_parallel_group())) == want["dp"]
        assert (
            sorted(dist.get_process_group_ranks(ps.get_data_parallel_group(with_context_parallel=True)))
            == want["dp-cp"]
        )
        assert sorted(dist.get_process_group_ranks(ps.get_tensor_model_parallel_group())) == want["tp"]
        assert ps.get_data_parallel_world_size() == plan.dp


HYBRID_CASES = [c for c in MATRIX if c[2].get("dp_shard")]


@pytest.mark.parametrize("case", HYBRID_CASES, ids=[c[0] for c in HYBRID_CASES])
def test_megatron_core_builds_the_optimizer_instances(case, mcore):
    """parallel_state.initialize_model_parallel with --num-distributed-optimizer-instances (rank
    0 of a fake group of the world size): the partial data-parallel group the distributed
    optimizer shards over is the plan's shard group, dp_shard x cp ranks (cp innermost), and the
    instance group across which gradients are all-reduced holds one rank of each replica."""
    import torch.distributed as dist

    plan, model, job = matrix_case(case)
    m = megatron_lm(export("megatron", plan, model, job, plan.world_size).data, plan.world_size)
    dp_cp = next(g for g in mesh_groups(plan)["dp-cp"] if 0 in g)  # by rank: dp index, then cp index
    group = plan.dp_shard * plan.cp
    with model_parallel(m) as ps:
        shard = ps.get_data_parallel_group(with_context_parallel=True, partial_data_parallel=True)
        assert sorted(dist.get_process_group_ranks(shard)) == dp_cp[:group]
        across = ps.get_inter_distributed_optimizer_instance_group()
        assert sorted(dist.get_process_group_ranks(across)) == dp_cp[::group]


def test_hybrid_sharding_megatron_cannot_run_is_refused(mcore):
    """Only the distributed optimizer runs in instances: hybrid ZeRO-2 is refused in one line (its
    own stage first); experts the instances would cut are refused by the export, as megatron-core's
    parallel_state refuses the flags it would have written."""
    plan = Plan(**{**BASE, "dp": 4, "zero_stage": 2, "dp_shard": 2})
    with pytest.raises(UsageError, match=r"megatron cannot run this plan: ZeRO stage 2 .*\(and 1 more\)") as err:
        export("megatron", plan, load_model("llama3-8b"), job_for(plan), plan.world_size)
    assert len(str(err.value).splitlines()) == 1
    assert (
        "hybrid sharding dp_shard=2 with ZeRO stage 2 (megatron has it with stages 1)"
        in mlm_rules.RULES.layout_problems(plan.layout)
    )
    plan, model, job = _case("mixtral-zero1-shard4-ep4-dp8")
    wide = plan.model_copy(update={"ep": 8})
    with pytest.raises(UsageError, match=r"ep=8 across shard groups \(ep must divide dp_shard x cp x tp = 4") as err:
        export("megatron", wide, model, job, plan.world_size)
    assert len(str(err.value).splitlines()) == 1
    data = _replace(export("megatron", plan, model, job, plan.world_size).data, "--expert-model-parallel-size", 8)
    with pytest.raises(AssertionError, match="Expert data parallel size should be divisible by partial DistOpt"):
        with model_parallel(megatron_lm(data, plan.world_size)):
            pass


def test_the_tp_pp_dp_mapping_moves_cp(mcore):
    """Why problems() refuses cp with mesh order tp,pp,dp (pp > 1): Megatron's tp-cp-ep-pp-dp
    order groups cp ranks tp apart, the plan's mesh tp x pp apart (cp inside dp)."""
    from megatron.core.parallel_state import RankGenerator

    plan = Plan(dp=2, cp=2, tp=2, pp=2, micro_batch_size=1, num_micro_batches=4, mesh_order=["tp", "pp", "dp"])
    mapped = RankGenerator(tp=2, ep=1, dp=2, pp=2, cp=2, order="tp-cp-ep-pp-dp")
    assert sorted(sorted(g) for g in mapped.get_ranks("cp"))[0] == [0, 2]
    assert mesh_groups(plan)["cp"][0] == [0, 4]


def test_megatron_rejects_a_broken_cp_or_fp8_export(mcore):
    """A cp that does not tile the world with tp x pp (Megatron-LM's validate_args, and
    megatron-core's initialize_model_parallel), a sequence that does not cut into 2 x cp chunks,
    an FP8 format or recipe megatron-core does not have or cannot build."""
    plan, model, job = _case("llama8b-cp4-dp2-pp2-full")
    data = export("megatron", plan, model, job, plan.world_size).data
    m = megatron_lm(data, plan.world_size)
    with pytest.raises(AssertionError, match=r"world size \(16\) is not divisible by total_model_size"):
        megatron_lm(_replace(data, "--context-parallel-size", 3), plan.world_size)
    three = SimpleNamespace(
        config=dataclasses.replace(m.config, context_parallel_size=3), world_size=m.world_size, order=m.order
    )
    with pytest.raises(RuntimeError, match=r"world_size \(16\) is not divisible by 6"):
        with model_parallel(three):
            pass
    with pytest.raises(AssertionError, match="seq-length should be a multiple of 2 \\* context-parallel-size"):
        megatron_lm(
            _replace(_replace(data, "--seq-length", 16380), "--max-position-embeddings", 16380), plan.world_size
        )
    with pytest.raises(AssertionError, match="hierarchical-context-parallel-sizes must be set"):
        megatron_lm(_replace(data, "--cp-comm-type", "a2a+p2p"), plan.world_size)
    plan, model, job = _case("llama8b-cp2-dp2-tp2-sp-fp8-block12")
    data = export("megatron", plan, model, job, plan.world_size).data
    with pytest.raises(AssertionError, match="'e5m2' is not one of"):
        megatron_lm(_replace(data, "--fp8-format", "e5m2"), plan.world_size)
    with pytest.raises(ValueError, match="fp8_quantizer_factory must be provided"):
        megatron_lm(_replace(data, "--fp8-recipe", "custom"), plan.world_size)


def test_a_window_one_key_too_wide_or_no_qk_norm_is_caught(mcore):
    """The architecture checks can fail: --window-size W,0 lets a query see W + 1 keys (one more
    than the spec's window), and an export without --qk-layernorm builds no query/key norms."""
    plan, model, job = _case("phi3-window-dp4")
    data = export("megatron", plan, model, job, plan.world_size).data
    wide = megatron_lm(_replace(data, "--window-size", f"{model.sliding_window},0"), plan.world_size)
    with pytest.raises(AssertionError):
        check_architecture(wide.config, model, job)
    plan, model, job = _case("qwen3-8b-qk-norm-tp4-pp2-selective")
    data = export("megatron", plan, model, job, plan.world_size).data
    with pytest.raises(AssertionError):
        check_architecture(megatron_lm([a for a in data if a != "--qk-layernorm"], plan.world_size).config, model, job)


@pytest.mark.slow
def test_megatron_has_none_of_what_it_is_refused(mcore):
    """What model_problems' reasons say of megatron-core 0.16.1: its only gated GELU-like
    activation, quick_gelu, is not the tanh GELU Gemma gates through; a layer has no norm after
    attention or the MLP; the windowed layers are placed by window_attn_skip_freq (so a count of
    them does not say which)."""
    import torch
    import torch.nn.functional as F
    from megatron.core.fusions.fused_bias_geglu import quick_gelu
    from megatron.core.transformer.transformer_layer import TransformerLayerSubmodules
    from megatron.core.transformer.utils import is_layer_window_attention

    x = torch.linspace(-4, 4, 81)
    assert (quick_gelu(x) - F.gelu(x, approximate="tanh")).abs().max() > 1e-2
    norms = {f.name for f in dataclasses.fields(TransformerLayerSubmodules) if "norm" in f.name}
    assert norms == {"input_layernorm", "pre_cross_attn_layernorm", "pre_mlp_layernorm"}
    alternate = [is_layer_window_attention((127, 0), 2, n) for n in range(1, 37)]
    trailing = [is_layer_window_attention((127, 0), [0] * 18 + [1] * 18, n) for n in range(1, 37)]
    assert sum(alternate) == sum(trailing) == 18 and alternate != trailing


def test_a_top_1_router_gets_the_softmax_first(mcore):
    """TransformerConfig refuses top-1 routing with the softmax after the selection (its
    gradient would be zero); the export adds --moe-router-pre-softmax for it."""
    model = load_model("mixtral-8x7b").model_copy(update={"experts_per_token": 1})
    plan = Plan(dp=8, ep=8, tp=1, pp=1, micro_batch_size=1, num_micro_batches=2)
    data = export("megatron", plan, model, job_for(plan), plan.world_size).data
    check_means_the_plan(data, plan, model, job_for(plan))
    assert megatron_lm(data, plan.world_size).config.moe_router_pre_softmax
    with pytest.raises(ValueError, match="Please use --moe-router-pre-softmax when topk is 1"):
        megatron_lm([a for a in data if a != "--moe-router-pre-softmax"], plan.world_size)


def test_megatron_core_refuses_experts_across_a_tp_pp_dp_mapping(mcore):
    """What problems() refuses: with --use-tp-pp-dp-mapping and pp > 1, parallel_state needs
    the expert and dense layers' data-parallel sizes equal (ep = tp)."""
    model = load_model("mixtral-8x7b")
    plan = Plan(dp=4, ep=4, tp=1, pp=2, micro_batch_size=1, num_micro_batches=4, mesh_order=["tp", "pp", "dp"])
    m = megatron_lm(mlm.export(plan, model, job_for(plan), plan.world_size).data, plan.world_size)
    assert m.order == "tp-cp-ep-pp-dp"
    with pytest.raises(AssertionError, match="data parallel size of the attention and moe layers must be the same"):
        with model_parallel(m):
            pass


def plan_cli(*args):
    return subprocess.run([sys.executable, "-m", "planner.cli.main", *args], capture_output=True, text=True)


MIXTRAL_SOLVE = [
    "--model",
    "mixtral-8x7b",
    "--cluster",
    "dgx-h100-80gb",
    "--gpus",
    "64",
    "--global-batch",
    "512",
    "--seq-len",
    "4096",
]


@pytest.mark.slow
def test_mixtral_solved_for_megatron_exports_and_megatron_runs_it(tmp_path):
    """`plan solve --target megatron` on Mixtral 8x7B (64 H100), then `plan export` of the plan
    and every alternative: each is what megatron-core accepts and means the plan."""
    path = tmp_path / "mixtral.json"
    solved = plan_cli("solve", *MIXTRAL_SOLVE, "--target", "megatron", "--top-k", "4", "-o", str(path))
    assert solved.returncode == 0, solved.stderr
    doc = json.loads(path.read_text())
    model = load_model("mixtral-8x7b")
    for k, entry in enumerate([doc] + doc["alternatives"]):
        res = plan_cli("export", str(path), "--to", "megatron", "--json", *(["--alternative", str(k)] if k else []))
        assert res.returncode == 0, res.stderr
        plan, job = Plan.model_validate(entry["plan"]), JobSpec.model_validate(doc["job"])
        data = json.loads(res.stdout)["data"]
        assert mlm.read_back(data, 64)["ep"] == plan.ep
        if importlib.util.find_spec("megatron") is not None:
            check_means_the_plan(data, plan, model, job)


LONG_SOLVE = [
    "--model",
    "llama3-8b",
    "--cluster",
    "dgx-h100-80gb",
    "--gpus",
    "8",
    "--global-batch",
    "8",
    "--seq-len",
    "131072",
]


@pytest.mark.slow
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_llama3_8b_128k_solved_for_megatron_exports_with_context_parallelism(tmp_path, fp8):
    """`plan solve --target megatron` on Llama 3 8B, 128k tokens, 8 H100 (with and without
    --fp8), then `plan export` of the plan and every alternative: context parallelism is chosen,
    every export reads back to its plan's cp and fp8 and, with megatron-core, is what it accepts
    and means the plan."""
    path = tmp_path / "long.json"
    solved = plan_cli(
        "solve", *LONG_SOLVE, "--target", "megatron", "--top-k", "4", *(["--fp8"] if fp8 else []), "-o", str(path)
    )
    assert solved.returncode == 0, solved.stderr
    doc = json.loads(path.read_text())
    model, entries = load_model("llama3-8b"), [doc] + doc["alternatives"]
    assert any(Plan.model_validate(e["plan"]).cp > 1 for e in entries)
    for k, entry in enumerate(entries):
        res = plan_cli("export", str(path), "--to", "megatron", "--json", *(["--alternative", str(k)] if k else []))
        assert res.returncode == 0, res.stderr
        plan, job = Plan.model_validate(entry["plan"]), JobSpec.model_validate(doc["job"])
        data = json.loads(res.stdout)["data"]
        back = mlm.read_back(data, 8)
        assert (back["dp"], back["cp"], back["tp"], back["pp"], back["fp8"]) == (
            plan.dp,
            plan.cp,
            plan.tp,
            plan.pp,
            plan.fp8,
        )
        if importlib.util.find_spec("megatron") is not None:
            check_means_the_plan(data, plan, model, job)


def test_multi_token_prediction_exports_as_mtp_num_layers(mcore):
    """--mtp-num-layers (TransformerConfig.mtp_num_layers): Megatron-Core builds the modules on
    the last pipeline stage, where the cost model puts them (cost_models/tables.py:edge_costs)."""
    plan, model, job = _case("deepseek-ep16-tp2-pp4-selective")
    data = export("megatron", plan, model.model_copy(update={"mtp_layers": 1}), job, plan.world_size).data
    assert data[data.index("--mtp-num-layers") + 1] == "1"
    assert megatron_lm(data, plan.world_size).config.mtp_num_layers == 1
    assert "--mtp-num-layers" not in export("megatron", plan, model, job, plan.world_size).data


LLAMA405_SOLVE = [
    "--model",
    "llama3-405b",
    "--cluster",
    "dgx-h100-80gb",
    "--gpus",
    "16384",
    "--global-batch",
    "2048",
    "--seq-len",
    "8192",
    "--target",
    "megatron",
]


@pytest.mark.slow
def test_llama3_405b_on_16384_h100_interleaves_unevenly_and_megatron_runs_it(tmp_path):
    """Llama 3.1 405B (126 layers) on 16,384 H100: interleaving needs chunks of unequal length
    (126 is no multiple of pp x vpp). The free search interleaves (it used to fall back to a
    1F1B pipeline of 32 with half the step in the bubble), `--fix pp=16 --fix vpp=2` solves,
    and both export as a --pipeline-model-parallel-layout that megatron-core builds into the
    planned chunks."""
    model = load_model("llama3-405b")
    for fixes in ([], ["--fix", "pp=16", "--fix", "vpp=2"]):
        path = tmp_path / "405b.json"
        solved = plan_cli("solve", *LLAMA405_SOLVE, *fixes, "-o", str(path))
        assert solved.returncode == 0, solved.stderr
        doc = json.loads(path.read_text())
        plan, job = Plan.model_validate(doc["plan"]), JobSpec.model_validate(doc["job"])
        layers = plan.stage_layers(model.num_layers)
        assert plan.vpp > 1 and len(set(layers)) == 2 and sum(layers) == 126, (plan.pp, plan.vpp, layers)
        assert doc["estimate"]["time_breakdown_s"]["pipeline_bubble"] < 0.35 * doc["estimate"]["step_time_s"]
        if fixes:
            assert (plan.pp, plan.vpp) == (16, 2)
        res = plan_cli("export", str(path), "--to", "megatron", "--json")
        assert res.returncode == 0, res.stderr
        data = json.loads(res.stdout)["data"]
        assert "--pipeline-model-parallel-layout" in data
        if importlib.util.find_spec("megatron") is not None:
            check_means_the_plan(data, plan, model, job)
