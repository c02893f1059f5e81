"""Mixture-of-experts models: the Hugging Face configs of each style read into ModelSpec (with the
real field names), the presets checked against their published parameter counts, and the
refusals (one line naming the field) for what the spec cannot hold.

Published counts: Mixtral 8x7B 46.7B total, 12.9B active (Jiang et al. 2024); Qwen3-30B-A3B
30.5B, 3.3B (Qwen3 Technical Report); DeepSeek-V3 671B, 37B (36.6B without the input
embedding, the DeepSeek-V3 README); Qwen1.5-MoE-A2.7B 14.3B, 2.7B (its model card).
"""

from __future__ import annotations

import math

import io
import json

import pytest
from click.testing import CliRunner
from rich.console import Console

from cost_models import compute, memory
from cost_models.compute import active_params, layer_params, total_params
from planner.cli import render
from planner.cli.main import cli
from planner.errors import UsageError
from planner.presets import from_hf_config, load_model
from planner.specs import DType, ModelSpec, Plan, Recompute

# config.json of mistralai/Mixtral-8x7B-v0.1, as published.
MIXTRAL = {
    "architectures": ["MixtralForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mixtral",
    "num_attention_heads": 32,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "output_router_logits": False,
    "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.02,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 32000,
}
# config.json of Qwen/Qwen3-30B-A3B.
QWEN3_MOE = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "decoder_sparse_step": 1,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "max_position_embeddings": 40960,
    "max_window_layers": 48,
    "mlp_only_layers": [],
    "model_type": "qwen3_moe",
    "moe_intermediate_size": 768,
    "norm_topk_prob": True,
    "num_attention_heads": 32,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 48,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_sliding_window": False,
    "vocab_size": 151936,
}
# config.json of Qwen/Qwen1.5-MoE-A2.7B (Qwen2-MoE: 4 x 1408 of shared expert).
QWEN2_MOE = {
    "architectures": ["Qwen2MoeForCausalLM"],
    "attention_dropout": 0.0,
    "decoder_sparse_step": 1,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "max_position_embeddings": 8192,
    "max_window_layers": 21,
    "model_type": "qwen2_moe",
    "moe_intermediate_size": 1408,
    "norm_topk_prob": False,
    "num_attention_heads": 16,
    "num_experts": 60,
    "num_experts_per_tok": 4,
    "num_hidden_layers": 24,
    "num_key_value_heads": 16,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "shared_expert_intermediate_size": 5632,
    "sliding_window": 32768,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_sliding_window": False,
    "vocab_size": 151936,
}
# config.json of deepseek-ai/DeepSeek-V3 (less quantization_config, rope_scaling and auto_map).
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "ep_size": 1,
    "first_k_dense_replace": 3,
    "hidden_act": "silu",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "kv_lora_rank": 512,
    "max_position_embeddings": 163840,
    "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048,
    "moe_layer_freq": 1,
    "n_group": 8,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 61,
    "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000,
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "tie_word_embeddings": False,
    "topk_group": 4,
    "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16",
    "v_head_dim": 128,
    "vocab_size": 129280,
}
# config.json of openai/gpt-oss-120b (less quantization_config and rope_scaling).
GPT_OSS = {
    "architectures": ["GptOssForCausalLM"],
    "attention_bias": True,
    "attention_dropout": 0.0,
    "experts_per_token": 4,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2880,
    "intermediate_size": 2880,
    "layer_types": ["sliding_attention", "full_attention"] * 18,
    "max_position_embeddings": 131072,
    "model_type": "gpt_oss",
    "num_attention_heads": 64,
    "num_experts_per_tok": 4,
    "num_hidden_layers": 36,
    "num_key_value_heads": 8,
    "num_local_experts": 128,
    "rms_norm_eps": 1e-05,
    "rope_theta": 150000,
    "sliding_window": 128,
    "swiglu_limit": 7.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 201088,
}

SHAPE = (
    "num_layers",
    "hidden_size",
    "num_heads",
    "kv_heads",
    "ffn_hidden_size",
    "vocab_size",
    "activation",
    "tied_embeddings",
    "linear_bias",
    "norm",
    "num_experts",
    "experts_per_token",
    "moe_ffn_hidden_size",
    "num_shared_experts",
    "first_dense_layers",
)


def _read(config: dict, name: str = "m") -> ModelSpec:
    return ModelSpec.model_validate(from_hf_config(config, name))


def _same_shape(a: ModelSpec, b: ModelSpec) -> bool:
    return all(getattr(a, f) == getattr(b, f) for f in SHAPE)


# ----- Mixtral


def test_mixtral_preset_has_the_published_46_7b_total_and_12_9b_active():
    m = load_model("mixtral-8x7b")
    # Each tensor once: embedding and head 2 V h, per layer attention h(h + 2 x 8 x 128) + h^2,
    # router h x 8, 8 experts of 3 h f, two RMSNorms; the final norm.
    h, f, layers, vocab = 4096, 14336, 32, 32000
    per_layer = h * (h + 2 * 8 * 128) + h * h + h * 8 + 8 * 3 * h * f + 2 * h
    assert total_params(m) == layers * per_layer + 2 * vocab * h + h == 46_702_792_704
    assert active_params(m) == 12_879_925_248  # 2 of 8 experts: 46.70B - 32 x 6 x 3 h f
    assert round(total_params(m) / 1e9, 1) == 46.7 and round(active_params(m) / 1e9, 1) == 12.9


def test_a_mixtral_config_json_reads_as_the_preset(tmp_path):
    (tmp_path / "Mixtral-8x7B-v0.1").mkdir()
    (tmp_path / "Mixtral-8x7B-v0.1" / "config.json").write_text(json.dumps(MIXTRAL))
    m = load_model(str(tmp_path / "Mixtral-8x7B-v0.1"))
    preset = load_model("mixtral-8x7b")
    assert (
        m.name == "Mixtral-8x7B-v0.1" and m.is_moe and (m.num_experts, m.experts_per_token, m.moe_ffn) == (8, 2, 14336)
    )
    assert _same_shape(m, preset)
    assert (
        (total_params(m), active_params(m))
        == (total_params(preset), active_params(preset))
        == (46_702_792_704, 12_879_925_248)
    )


def test_a_mixtral_config_is_planned(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(MIXTRAL))
    r = CliRunner().invoke(
        cli,
        [
            "estimate",
            "--model",
            str(tmp_path / "config.json"),
            "--cluster",
            "dgx-h100-80gb",
            "--gpus",
            "16",
            "--global-batch",
            "64",
            "--seq-len",
            "4096",
            "--tp",
            "2",
            "--pp",
            "2",
            "--ep",
            "4",
            "--sequence-parallel",
            "--json",
        ],
    )
    doc = json.loads(r.stdout)
    assert r.exit_code == (0 if doc["estimate"]["fits"] else 1), r.output  # a plan over its memory exits 1
    assert doc["model"]["num_experts"] == 8 and doc["plan"]["ep"] == 4


# ----- Qwen3-MoE and Qwen2-MoE


# Qwen3-30B-A3B's attention at head_dim 128 against the preset's (heads of hidden/heads = 64):
# q and o 2048 x 4096 and k, v 2048 x 512, plus the q/k norms, instead of 2048 x 2048 and 2048 x 256.
QWEN3_HEAD_DIM_GAP = 48 * ((2 * 2048 * 4096 + 2 * 2048 * 512 + 2 * 128) - (2 * 2048 * 2048 + 2 * 2048 * 256))


def test_qwen3_30b_a3b_preset_is_the_published_count():
    """Heads of 128 (attention_head_dim, not hidden/heads = 64): the published 30.5B / 3.3B; the
    preset's count equals the heads-of-64 one plus the attention weights the wider heads add."""
    m = load_model("qwen3-30b-a3b")
    assert m.qk_norm  # q/k norms of head_dim each, counted (QWEN3_HEAD_DIM_GAP holds them)
    assert (total_params(m), active_params(m)) == (
        30_079_125_504 + QWEN3_HEAD_DIM_GAP,
        2_900_035_584 + QWEN3_HEAD_DIM_GAP,
    )
    assert round(total_params(m) / 1e9, 1) == 30.5
    assert round(active_params(m) / 1e9, 2) == 3.35  # Qwen's "3.3B activated"
    assert m.attention_head_dim == 128 and m.q_width == 4096


def test_qwen3_moe_config_reads_with_its_fields_and_head_width():
    m = from_hf_config(QWEN3_MOE, "Qwen3-30B-A3B")
    assert m["attention_head_dim"] == 128
    m = _read(QWEN3_MOE)
    assert (m.num_experts, m.experts_per_token, m.moe_ffn, m.num_shared_experts, m.first_dense_layers) == (
        128,
        8,
        768,
        0,
        0,
    )
    assert _same_shape(m, load_model("qwen3-30b-a3b"))


def test_qwen2_moe_shared_expert_is_whole_experts():
    m = _read(QWEN2_MOE)
    assert (m.num_experts, m.experts_per_token, m.moe_ffn, m.num_shared_experts) == (60, 4, 1408, 4)  # 5632 = 4 x 1408
    assert round(total_params(m) / 1e9, 1) == 14.3 and round(active_params(m) / 1e9, 1) == 2.7
    assert _read({**QWEN2_MOE, "shared_expert_intermediate_size": 0}).num_shared_experts == 0


# ----- DeepSeek-V3

# Multi-head latent attention per layer (DeepSeek-V2 paper, section 2.1): W_DQ, q norm, W_UQ
# (queries of 128 + 64), W_DKV with W_KR, kv norm, W_UK with W_UV, W_O.
MLA = (7168 * 1536 + 1536 + 1536 * 128 * 192) + (7168 * (512 + 64) + 512 + 512 * 128 * 256) + 128 * 128 * 7168


def test_deepseek_v3_preset_is_671b_with_37b_active():
    """DeepSeek-V3's own counts (report, sec. 1 and 4.2: 671B, 37B activated; Hugging Face
    README: 671B main model + 14B multi-token prediction, which the preset leaves out), with
    MLA's own shapes."""
    m = load_model("deepseek-v3")
    total, active = total_params(m), active_params(m)
    assert round(total / 1e9, 2) == 671.03
    embedding = 129280 * 7168
    assert round((active - embedding) / 1e9, 1) == 36.6  # the README's 36.6B: without the input embedding
    assert 37e9 < active < 38e9
    # one MoE layer: its attention is MLA's (norms and the router outside it)
    assert layer_params(m).total - MLA == 2 * 7168 + 7168 * 256 + layer_params(m).expert + 3 * 7168 * 2048
    assert m.mla and "multi-head latent attention" in m.source


def test_deepseek_v3_config_reads_as_the_preset():
    m = _read(DEEPSEEK_V3, "DeepSeek-V3")
    assert (m.num_experts, m.experts_per_token, m.moe_ffn, m.num_shared_experts, m.first_dense_layers, m.ffn) == (
        256,
        8,
        2048,
        1,
        3,
        18432,
    )
    preset = load_model("deepseek-v3")
    assert _same_shape(m, preset)
    assert [(getattr(m, f), getattr(preset, f)) for f in MLA_FIELDS] == [(v, v) for v in (128, 512, 1536, 64, 128)]
    assert "multi-token-prediction" in m.source
    assert round(MLA / 1e6, 1) == 187.1  # DeepSeek-V2 paper's shapes at V3's widths


MLA_FIELDS = ("attention_head_dim", "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "v_head_dim")


def test_mla_attention_flops_are_its_query_key_and_value_widths():
    """Core attention of MLA: QK^T over query/key heads of 128 + 64 and AV over value heads of
    128, 2 b s^2 a (d_qk + d_v) forward (DeepSeek-V2 sec. 2.1), not 4 b s^2 h."""
    m, b, s = load_model("deepseek-v3"), 2, 4096
    assert compute.attention_flops_forward(m, b, s) == 2 * b * s * s * 128 * (192 + 128)
    # the projections: every weight once (2 x tokens x weights), the MoE layer's router and 9 experts
    weights = MLA - 1536 - 512 + 7168 * 256 + 9 * 3 * 7168 * 2048
    assert compute.layer_flops_forward(m, b, s) == 2 * b * s * weights + compute.attention_flops_forward(m, b, s)


def test_mla_down_projections_are_whole_on_every_tp_rank():
    """Megatron-Core's MLASelfAttention duplicates the down-projections over TP (parallel_mode
    'duplicated') and splits the up- and output projections: at tp=4 the replicated weights are
    the two down-projections and the latents' norms, the sharded ones a quarter of the rest."""
    m = load_model("deepseek-v3")
    down = 7168 * 1536 + 7168 * (512 + 64)
    one, four = compute.layer_params(m, dense=True), compute.layer_params(m, tp=4, dense=True)
    assert four.replicated == down + 1536 + 512 + 2 * 7168
    assert four.sharded * 4 == one.sharded == MLA - down - 1536 - 512 + 3 * 7168 * 18432
    assert compute.attention_input_width(m) == 1536 + 512 + 64  # what TP gathers for the up-projections


def test_mla_keeps_its_wider_queries_keys_and_values_for_backward():
    """Activations of MLA's attention per layer (tp=2, SP, flash): Q and K of 128 x 192, V and the
    output projection's input of 128 x 128 (split over TP), the latents twice (norm input on this
    rank's tokens, up-projection input gathered); a dense layer to isolate the attention."""
    m = load_model("deepseek-v3")
    s, b, tp, e = 4096, 1, 2, 2
    got = memory.layer_activation_bytes(m, b, s, tp, True, Recompute.none, True, DType.bf16, dense=True)
    mha = m.model_copy(update=dict(kv_lora_rank=None, q_lora_rank=None, qk_rope_head_dim=0, v_head_dim=None))
    base = memory.layer_activation_bytes(mha, b, s, tp, True, Recompute.none, True, DType.bf16, dense=True)
    mla = e * s * b * (2 * 128 * 192 / tp + 2 * 128 * 128 / tp + 2 * (1536 + 512) / tp)
    assert got - base == mla - e * s * b * 4 * 128 * 128 / tp  # against MHA's Q, K, V and output of 128 x 128
    # selective (Megatron's mla_up_proj): the latents, the gathered rotary key and the output
    # projection's input stay; Q, K, V and the fused kernel's fp32 log-sum-exp per head and row go
    sel = memory.layer_activation_bytes(m, b, s, tp, True, Recompute.selective, True, DType.bf16, dense=True)
    assert got - sel == e * s * b * (2 * 128 * 192 / tp + 128 * 128 / tp - 64) + 4 * b * (128 // tp) * s


def test_megatron_gathers_mla_latents_where_torchtitan_gathers_the_layer_input():
    """TP 8 with sequence parallelism, one DeepSeek-V3 dense layer: Megatron-Core's duplicated
    down-projections run on each rank's tokens, so the attention's gather carries the latents and
    the rotary key (1536 + 512 + 64 features a token); torchtitan's (wq_a, wkv_a NoParallel)
    gathers the layer input, as standard attention does. Backward conjugates each collective."""
    from cost_models.communication import GroupLink
    from cost_models.tables import layer_costs
    from hardware_profiles import load_cluster
    from planner.specs import Axis, Collective, JobSpec, Layout

    TP8_SP = Layout(micro_batch_size=1, tp=8, sequence_parallel=True)
    m, cluster = load_model("deepseek-v3"), load_cluster("dgx-h100-80gb")
    link, buf = GroupLink(cluster, 8, 1), 2 * 4096 * 7168
    ag, rs = (lambda n: link.time(Collective.all_gather, n)), (lambda n: link.time(Collective.reduce_scatter, n))
    lat = buf * (1536 + 512 + 64) / 7168
    mega = layer_costs(
        m, cluster, JobSpec(global_batch_size=8, seq_len=4096, target="megatron"), TP8_SP, {Axis.tp: link}, dense=True
    )
    assert mega.tp_forward == pytest.approx(ag(buf) + ag(lat) + 2 * rs(buf))
    assert mega.tp_backward == pytest.approx(2 * ag(buf) + rs(lat) + rs(buf))
    titan = layer_costs(
        m, cluster, JobSpec(global_batch_size=8, seq_len=4096, target="torchtitan"), TP8_SP, {Axis.tp: link}, dense=True
    )
    assert titan.tp_forward == titan.tp_backward == pytest.approx(2 * (ag(buf) + rs(buf)))
    # selective recompute reruns the up-projections and gathers their latents again (not the rotary key)
    assert mega.recompute[1] == pytest.approx(
        compute.layer_compute(
            m, cluster.device, JobSpec(global_batch_size=8, seq_len=4096, target="megatron"), TP8_SP, dense=True
        ).attention_core_forward
        + ag(buf * (1536 + 512) / 7168)
    )


def test_edge_costs_of_a_multi_token_prediction_model_follow_its_layer():
    """The search caches each layout's edge costs; with a multi-token-prediction module they
    are built from the layer, so two layouts whose layers differ (FP8 or not) must not share them."""
    from planner.specs import Layout
    from planner.search.candidates import CostTables
    from hardware_profiles import load_cluster
    from planner.specs import Axis, JobSpec, Schedule

    m, cluster = load_model("llama3-8b").model_copy(update={"mtp_layers": 1}), load_cluster("dgx-h100-80gb")
    job = JobSpec(global_batch_size=64, seq_len=4096)
    kw = dict(
        dp=4,
        tp=4,
        pp=2,
        vpp=1,
        micro_batch_size=1,
        num_micro_batches=16,
        schedule=Schedule.one_f_one_b,
        zero_stage=1,
        sequence_parallel=True,
        mesh_order=(Axis.tp, Axis.dp, Axis.pp),
    )
    plain, fp8 = Layout(**kw), Layout(**kw, fp8=True)
    tables = CostTables(m, cluster, job)
    tables.edge(plain)
    assert tables.edge(fp8) == CostTables(m, cluster, job).edge(fp8) != tables.edge(plain)


def test_mla_needs_its_head_width_and_refuses_what_it_has_no_use_for():
    m = load_model("deepseek-v3").model_dump()
    for change, words in [
        ({"attention_head_dim": None}, "needs attention_head_dim"),
        ({"num_kv_heads": 8}, "leave num_kv_heads out"),
        ({"qk_norm": True}, "set qk_norm false"),
        ({"kv_lora_rank": None}, "describe multi-head latent attention: they need kv_lora_rank"),
    ]:
        with pytest.raises(ValueError, match=words):
            ModelSpec.model_validate({**m, **change})


def test_deepseek_v2_lite_projects_its_queries_at_full_rank():
    """DeepSeek-V2-Lite's config has q_lora_rank null: one query projection of 16 heads x 192."""
    lite = {
        **DEEPSEEK_V3,
        "q_lora_rank": None,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "hidden_size": 2048,
    }
    m = _read(lite)
    assert m.q_lora_rank is None and m.mla
    assert compute.attention_linears(m) == [
        (2048, 16 * 192, "column"),
        (2048, 512 + 64, "duplicated"),
        (512, 16 * 256, "column"),
        (16 * 128, 2048, "row"),
    ]


def test_mla_runs_as_multi_head_attention_and_says_so():
    from planner.executor.prepare import runnable_model

    notes = []
    ran = runnable_model(
        load_model("deepseek-v3"), Plan(dp=1, tp=1, pp=1, micro_batch_size=1, num_micro_batches=1), notes
    )
    assert not ran.mla and ran.q_width == ran.out_width == 128 * 128
    assert "multi-head latent attention run as multi-head attention of 128 heads of 128" in notes[-1]


# ----- multi-token prediction (DeepSeek-V3 sec. 2.2)


def test_a_multi_token_prediction_module_is_a_layer_a_projection_and_two_norms():
    """One module: a transformer layer of the last layer's kind (MoE), three RMSNorms of h (its
    two inputs' and its output's) and the 2h -> h projection (the embedding and the head are
    shared): 11.61B for DeepSeek-V3, which with the 671.03B main model is what the Hugging Face
    checkpoint holds less its copies of the embedding and head."""
    main = load_model("deepseek-v3")
    m = main.model_copy(update={"mtp_layers": 1})
    module = layer_params(m).total + 3 * 7168 + 2 * 7168 * 7168
    assert compute.mtp_module_params(m) == module and round(module / 1e9, 2) == 11.61
    assert total_params(m) - total_params(main) == module
    assert active_params(m) - active_params(main) == module - 248 * 3 * 7168 * 2048  # 8 of 256 routed experts active
    # its FLOPs: the projection, the layer and the LM head once more, 3x forward per token
    s, extra = (
        4096,
        2 * 4096 * 2 * 7168 * 7168 + compute.layer_flops_forward(m, 1, 4096) + compute.head_flops_forward(m, 1, 4096),
    )
    assert compute.model_flops_per_step(m, 8, s) - compute.model_flops_per_step(main, 8, s) == pytest.approx(
        3 * 8 * extra
    )


def test_multi_token_prediction_runs_on_the_last_pipeline_stage():
    """Megatron-Core builds the module on the last stage (with a copy of the embedding table
    there when pp > 1): only that pipeline rank's memory grows, and the step with it."""
    from planner import api

    kw = dict(
        gpus=512,
        global_batch=512,
        seq_len=4096,
        tp=2,
        pp=8,
        ep=64,
        zero=1,
        sequence_parallel=True,
        recompute="selective",
        layers_per_stage=[7, 8, 8, 8, 8, 8, 8, 6],
        target="megatron",
    )
    main = load_model("deepseek-v3")
    without = api.estimate(main, "dgx-h100-80gb", **kw).estimate
    with_mtp = api.estimate(main.model_copy(update={"mtp_layers": 1}), "dgx-h100-80gb", **kw).estimate
    a, b = without.memory_gib_per_pipeline_rank, with_mtp.memory_gib_per_pipeline_rank
    assert [x.total for x in a[:-1]] == [x.total for x in b[:-1]]
    # the last rank holds the embedding table (tp 2: half the vocabulary), the module's norms and
    # projection (a column-parallel half) and one MoE layer as every rank holds its layers
    m = main.model_copy(update={"mtp_layers": 1})
    layer = layer_params(m, tp=2, ep=64)
    table, own = 129280 // 2 * 7168, 3 * 7168 + 2 * 7168 * 7168 // 2
    added = table + own + layer.total
    assert b[-1].weights - a[-1].weights == pytest.approx(2 * added / 2**30)  # 16-bit weights, not sharded by ZeRO-1
    # Adam's 12 bytes: ZeRO-1 shards the dense part over dp 32, the routed experts over their
    # expert-DP group (tp 2 x dp 32 / ep 64 = 1 rank: not at all)
    assert b[-1].optimizer_states - a[-1].optimizer_states == pytest.approx(
        12 * ((added - layer.expert) / 32 + layer.expert) / 2**30
    )
    assert with_mtp.step_time_s > without.step_time_s


def test_multi_token_prediction_is_said_where_a_stack_or_run_builds_none():
    from planner.executor.prepare import runnable_model
    from planner.stacks.torchtitan import rules as tt_rules

    m = load_model("deepseek-v3").model_copy(update={"mtp_layers": 1})
    assert "mtp_layers 1 (torchtitan 0.3.0 builds no multi-token prediction" in tt_rules.model_problems(m)[0]
    notes = []
    assert runnable_model(m, Plan(dp=1, tp=1, pp=1, micro_batch_size=1, num_micro_batches=1), notes).mtp_layers == 0
    assert "the 1 multi-token-prediction module(s) left out" in notes[-1]
    assert "num_nextn_predict_layers) not planned" in _read(DEEPSEEK_V3).source and _read(DEEPSEEK_V3).mtp_layers == 0


# ----- GPT-OSS


def test_gpt_oss_reads_experts_biases_and_windows_and_notes_sinks():
    m = _read(GPT_OSS)  # 64 heads of 64 = 4096-wide attention on a 2880 residual
    assert (m.num_experts, m.experts_per_token, m.moe_ffn, m.linear_bias, m.q_width) == (128, 4, 2880, True, 4096)
    assert "attention sinks" in m.source and (m.sliding_window, m.sliding_window_layers) == (128, 18)  # windows costed
    with pytest.raises(UsageError, match="field 'experts_per_token' = 2 contradicts num_experts_per_tok = 4"):
        from_hf_config({**GPT_OSS, "experts_per_token": 2}, "m")


# rope_scaling of openai/gpt-oss-120b's config.json and of deepseek-ai/DeepSeek-V3's
GPT_OSS_ROPE = {
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "factor": 32.0,
    "original_max_position_embeddings": 4096,
    "rope_type": "yarn",
    "truncate": False,
}
DEEPSEEK_V3_ROPE = {
    "beta_fast": 32,
    "beta_slow": 1,
    "factor": 40,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "original_max_position_embeddings": 4096,
    "type": "yarn",
}


def test_gpt_oss_reads_its_clamp_and_yarn_attention_factor():
    """transformers' _compute_yarn_parameters: 0.1 ln(factor) + 1 (GPT-OSS: 1.347), or its ratio
    under mscale and mscale_all_dim (DeepSeek-V3: 1, folded into the softmax scale), or the
    attention_factor given; other scalings, none."""
    m = _read({**GPT_OSS, "rope_scaling": GPT_OSS_ROPE})
    assert m.glu_limit == 7.0 and m.rope_attention_factor == pytest.approx(0.1 * math.log(32) + 1)
    assert _read({k: v for k, v in GPT_OSS.items() if k != "swiglu_limit"}).glu_limit == 7.0  # GptOssConfig's default
    assert _read(GPT_OSS).rope_attention_factor == 1.0
    assert _read({**DEEPSEEK_V3, "rope_scaling": DEEPSEEK_V3_ROPE}).rope_attention_factor == pytest.approx(1.0)
    assert _read(
        {**DEEPSEEK_V3, "rope_scaling": {**DEEPSEEK_V3_ROPE, "mscale": 0.707}}
    ).rope_attention_factor == pytest.approx((0.0707 * math.log(40) + 1) / (0.1 * math.log(40) + 1))
    assert _read({**GPT_OSS, "rope_parameters": {**GPT_OSS_ROPE, "attention_factor": 1.2}}).rope_attention_factor == 1.2
    llama3 = {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    }
    assert _read({**GPT_OSS, "rope_scaling": llama3}).rope_attention_factor == 1.0
    assert _read({**MIXTRAL}).glu_limit is None
    assert _read({**GPT_OSS, "swiglu_limit": None}).glu_limit == 7.0  # null: the family's default
    # transformers 5 derives a missing factor from the context's extension: 131072 / 4096 = 32
    no_factor = {k: v for k, v in GPT_OSS_ROPE.items() if k != "factor"}
    assert _read({**GPT_OSS, "rope_scaling": no_factor}).rope_attention_factor == pytest.approx(0.1 * math.log(32) + 1)
    assert _read({**DEEPSEEK_V3, "rope_scaling": {**DEEPSEEK_V3_ROPE, "mscale_all_dim": 0}}).rope_attention_factor == (
        pytest.approx(0.1 * math.log(40) + 1)
    )  # 0: unset, as transformers reads it


def test_a_clamped_glu_keeps_its_clamped_halves_for_backward():
    """The clamps keep the fc1 output, and the activation the clamped copy of both halves:
    2 x f more per token-expert assignment (bf16), nothing under full recompute."""
    m = _read(GPT_OSS)
    plain = m.model_copy(update={"glu_limit": None})

    def kept(model, recompute):
        return memory.layer_activation_bytes(model, 1, 4096, 1, False, recompute, True)

    assert kept(m, Recompute.none) - kept(plain, Recompute.none) == 2 * 2 * 4096 * 4 * 2880
    assert kept(m, Recompute.full) == kept(plain, Recompute.full)


def test_a_clamp_needs_a_gated_mlp_and_a_rope_factor_rotary_positions():
    m = load_model("gpt3-175b").model_dump()
    with pytest.raises(ValueError, match="glu_limit clamps a gated MLP"):
        ModelSpec.model_validate({**m, "glu_limit": 7.0})
    with pytest.raises(ValueError, match="rope_attention_factor scales a rotary embedding"):
        ModelSpec.model_validate({**m, "rope_attention_factor": 1.3})


def test_a_clamp_and_a_rope_factor_are_left_out_of_a_run_and_said():
    from planner.executor.prepare import runnable_model

    notes: list = []
    m = runnable_model(
        _read({**GPT_OSS, "rope_scaling": GPT_OSS_ROPE}),
        Plan(dp=1, tp=1, pp=1, micro_batch_size=1, num_micro_batches=1),
        notes,
    )
    assert m.glu_limit is None and m.rope_attention_factor == 1.0
    assert "clamp at 7 left out" in notes[-1] and "attention factor 1.34657 left out" in notes[-1]


# ----- refusals: one line naming the field


@pytest.mark.parametrize(
    "config,field",
    [
        ({**QWEN2_MOE, "decoder_sparse_step": 2}, "decoder_sparse_step"),
        ({**QWEN3_MOE, "head_dim": 64, "mlp_only_layers": [0, 5]}, "mlp_only_layers"),
        ({**QWEN2_MOE, "shared_expert_intermediate_size": 5000}, "shared_expert_intermediate_size"),
        ({**DEEPSEEK_V3, "moe_layer_freq": 2}, "moe_layer_freq"),
        (
            {**MIXTRAL, "model_type": "olmoe", "architectures": ["OlmoeForCausalLM"]},
            "num_local_experts",
        ),  # an unknown MoE architecture
        ({**QWEN2_MOE, "model_type": "qwen2"}, "num_experts"),  # expert fields on a dense model_type
        ({**MIXTRAL, "num_experts_per_tok": None}, "num_experts_per_tok"),
        ({**QWEN3_MOE, "head_dim": 0}, "head_dim"),
        ({**GPT_OSS, "swiglu_limit": -1}, "swiglu_limit"),
        ({**GPT_OSS, "rope_scaling": {**GPT_OSS_ROPE, "factor": "32"}}, "rope_scaling"),
        ({**GPT_OSS, "rope_scaling": {**GPT_OSS_ROPE, "attention_factor": 5000}}, "rope_scaling"),
    ],
    ids=[
        "decoder_sparse_step",
        "mlp_only_layers",
        "shared_width",
        "moe_layer_freq",
        "unknown_moe",
        "dense_type",
        "no_top_k",
        "head_dim",
        "swiglu_limit",
        "yarn_factor",
        "yarn_attention_factor",
    ],
)
def test_what_cannot_be_modelled_is_refused_in_one_line_naming_the_field(tmp_path, config, field):
    (tmp_path / "config.json").write_text(json.dumps(config))
    r = CliRunner().invoke(
        cli,
        [
            "estimate",
            "--model",
            str(tmp_path / "config.json"),
            "--cluster",
            "dgx-h100-80gb",
            "--gpus",
            "8",
            "--global-batch",
            "8",
            "--seq-len",
            "1024",
        ],
    )
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 2, r.output
    assert len(lines) == 1 and lines[0].startswith("error: ") and field in lines[0], r.stderr


def test_an_unknown_moe_architecture_names_its_field_and_type():
    with pytest.raises(
        UsageError, match=r"field 'num_local_experts' = 8 with model_type 'olmoe': a mixture-of-experts architecture"
    ):
        from_hf_config({**MIXTRAL, "model_type": "olmoe"}, "m")


# ----- `plan presets`


def test_plan_presets_lists_the_moe_presets_with_their_parameter_counts(monkeypatch):
    monkeypatch.setattr(render, "console", Console(record=True, width=200, highlight=False, file=io.StringIO()))
    r = CliRunner().invoke(cli, ["presets"])
    assert r.exit_code == 0, r.output
    rows = {
        line.split("│")[1].strip(): line for line in render.console.export_text().splitlines() if line.count("│") > 2
    }
    for name, params in [("mixtral-8x7b", "46.70B"), ("qwen3-30b-a3b", "30.53B"), ("deepseek-v3", "671.03B")]:
        assert params in rows[name], rows.get(name)
    assert "128 (MLA)" in rows["deepseek-v3"] and "32 (4)" in rows["qwen3-30b-a3b"]  # heads (KV heads, or MLA)


def test_presets_json_states_total_and_active_parameters():
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "planner.cli.main", "presets", "--json"], capture_output=True, text=True, check=True
    )
    models = {m["name"]: m for m in json.loads(out.stdout)["models"]}
    assert (models["mixtral-8x7b"]["parameters"], models["mixtral-8x7b"]["active_parameters"]) == (
        46_702_792_704,
        12_879_925_248,
    )
    assert models["llama3-8b"]["parameters"] == models["llama3-8b"]["active_parameters"]
