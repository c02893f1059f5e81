"""Hugging Face config.json files of the families people train, as their authors publish them
(tests/data/hf_configs, sources in SOURCES.md there): each reads into the architecture it is
(parameter count against the published figure, MLP, precision, tied head, head width, norms,
windows), what the reader cannot hold is refused in one line naming the field, and the cost
terms the new fields bring (gated GELU, four norms, QK-norm, sliding windows, logit
soft-capping) are checked against their formulas."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from cost_models import compute, memory
from cost_models.compute import active_params, total_params
from hardware_profiles import load_cluster
from planner.cli.main import cli
from planner.errors import UsageError
from planner.presets import from_hf_config, load_model
from planner.specs import JobSpec, Layout, ModelSpec, Recompute
from tests.paths import HF_CONFIGS

DATA = HF_CONFIGS


def config(name: str) -> dict:
    return json.loads((DATA / f"{name}.json").read_text())


def read(name: str, **changes) -> ModelSpec:
    return ModelSpec.model_validate(from_hf_config({**config(name), **changes}, name))


# ----- every family: published parameter counts and the architecture read

# name -> (published total, relative tolerance, where the figure is published). The tolerance
# is the published figure's rounding unless the test says what else the gap is.
PUBLISHED = {
    "llama-2-7b": (6.74e9, 0.001, "Llama 2 paper, Table 1: 7B (6,738,415,616 on the Hub)"),
    "llama-3-8b": (8.03e9, 0.001, "Meta-Llama-3-8B model card: 8B (8.03B on the Hub)"),
    "llama-3.1-8b": (8.03e9, 0.001, "Llama-3.1-8B model card: 8B (8.03B on the Hub)"),
    "mistral-7b-v0.1": (7.24e9, 0.001, "Mistral-7B-v0.1 on the Hub: 7.24B"),
    "mixtral-8x7b": (46.7e9, 0.001, "Mixtral of Experts (Jiang et al. 2024): 46.7B"),
    "qwen2-7b": (7.62e9, 0.001, "Qwen2 technical report, Table 1: 7.6B (7.62B on the Hub)"),
    "qwen2.5-7b": (7.61e9, 0.001, "Qwen2.5-7B model card: 7.61B"),
    "qwen2.5-0.5b": (0.49e9, 0.01, "Qwen2.5-0.5B model card: 0.49B"),
    "qwen3-8b": (8.2e9, 0.005, "Qwen3-8B model card: 8.2B"),
    "qwen3-0.6b": (0.6e9, 0.01, "Qwen3-0.6B model card: 0.6B"),
    "qwen3-30b-a3b": (30.5e9, 0.002, "Qwen3-30B-A3B model card: 30.5B"),
    "gemma-2-9b": (9.24e9, 0.001, "Gemma 2 report, Table 2: 917,504,000 embedding + 8,324,201,984 other"),
    "gemma-3-1b": (1.0e9, 0.001, "Gemma 3 report, Table 1: 302M embedding + 698M other"),
    "phi-3-mini-4k": (3.82e9, 0.001, "Phi-3 report: 3.8B (3.82B on the Hub)"),
    "olmo-2-7b": (7.30e9, 0.001, "OLMo-2-1124-7B model card: 7.30B"),
    "gpt-oss-120b": (116.83e9, 0.0001, "gpt-oss model card, Table 1: 116.83B total"),
    "deepseek-v3": (671e9, 0.0001, "DeepSeek-V3 report: 671B (671.03B without the multi-token-prediction module)"),
}
# name -> (activation, tied, head_dim, norms_per_layer, qk_norm, (sliding_window, layers), soft-capped logits)
SHAPES = {
    "llama-2-7b": ("swiglu", False, 128, 2, False, (None, 0), False),
    "llama-3-8b": ("swiglu", False, 128, 2, False, (None, 0), False),
    "llama-3.1-8b": ("swiglu", False, 128, 2, False, (None, 0), False),
    "mistral-7b-v0.1": ("swiglu", False, 128, 2, False, (4096, 32), False),
    "mixtral-8x7b": ("swiglu", False, 128, 2, False, (None, 0), False),
    "qwen2-7b": ("swiglu", False, 128, 2, False, (None, 0), False),  # use_sliding_window false: no window
    "qwen2.5-7b": ("swiglu", False, 128, 2, False, (None, 0), False),
    "qwen2.5-0.5b": ("swiglu", True, 64, 2, False, (None, 0), False),
    "qwen3-8b": ("swiglu", False, 128, 2, True, (None, 0), False),
    "qwen3-0.6b": ("swiglu", True, 128, 2, True, (None, 0), False),  # 16 heads of 128 on a 1024 residual
    "qwen3-30b-a3b": ("swiglu", False, 128, 2, True, (None, 0), False),
    "gemma-2-9b": ("geglu", True, 256, 4, False, (4096, 21), True),  # 16 heads of 256 on a 3584 residual
    "gemma-3-1b": ("geglu", True, 256, 4, True, (512, 22), False),  # 5 local layers in 6, 26 layers
    "phi-3-mini-4k": ("swiglu", False, 96, 2, False, (2047, 32), False),
    "olmo-2-7b": ("swiglu", False, 128, 2, True, (None, 0), False),
    "gpt-oss-120b": ("swiglu", False, 64, 2, False, (128, 18), False),
    "deepseek-v2": ("swiglu", False, 128, 2, False, (None, 0), False),  # MLA: head_dim the non-rotary query/key width
    "deepseek-v3": ("swiglu", False, 128, 2, False, (None, 0), False),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_total_parameters_are_the_published_count(name):
    total, tolerance, _ = PUBLISHED[name]
    assert total_params(read(name)) == pytest.approx(total, rel=tolerance)


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_each_family_reads_as_its_architecture_in_bf16(name):
    m = read(name)
    activation, tied, head_dim, norms, qk_norm, window, softcap = SHAPES[name]
    assert (m.activation.value, m.tied_embeddings, m.head_dim, m.norms_per_layer, m.qk_norm) == (
        activation,
        tied,
        head_dim,
        norms,
        qk_norm,
    )
    assert ((m.sliding_window, m.sliding_window_layers), m.logit_softcapping) == (window, softcap)
    assert m.param_dtype.value == "bf16"  # whatever the checkpoint's torch_dtype: training is bf16 mixed precision


def test_window_layers_follow_each_familys_rule_or_layer_types():
    """Qwen2: the window only with use_sliding_window, on the layers from max_window_layers on
    (Qwen2Config); an explicit layer_types list wins over a family's pattern."""
    assert (
        read("qwen2-7b", use_sliding_window=True, max_window_layers=20, sliding_window=4096).sliding_window_layers
    ) == 8
    types = ["full_attention"] * 40 + ["sliding_attention"] * 2
    assert read("gemma-2-9b", layer_types=types).sliding_window_layers == 2


def test_the_checkpoint_dtype_is_said_not_planned():
    """Gemma-2-9B and OLMo 2 publish float32 checkpoints, Llama 2 float16: all train in bf16,
    and the source says what the checkpoint holds."""
    for name, stored in [("gemma-2-9b", "float32"), ("olmo-2-7b", "float32"), ("llama-2-7b", "float16")]:
        m = read(name)
        assert m.param_dtype.value == "bf16" and f"checkpoint stored as {stored}" in m.source


def test_gemma_2_9b_is_the_published_9_24b_gated_model():
    """The issue's case: 917,504,000 embedding parameters (tied) and 8,324,201,984 others,
    exactly the Gemma 2 report's; three MLP matrices of 3584 x 14336; 16 heads of 256."""
    m = read("gemma-2-9b")
    embedding = 256000 * 3584
    assert embedding == 917_504_000 and total_params(m) - embedding == 8_324_201_984
    assert m.gated and m.q_width == 4096 and m.ffn == 14336


def test_gemma_3_1b_splits_as_the_report():
    m = read("gemma-3-1b")
    embedding = 262144 * 1152
    assert round(embedding / 1e6) == 302 and round((total_params(m) - embedding) / 1e6) == 698


@pytest.mark.parametrize(
    "name,non_embedding",
    [("qwen2.5-7b", 6.53e9), ("qwen2.5-0.5b", 0.36e9), ("qwen3-8b", 6.95e9), ("qwen3-0.6b", 0.44e9)],
)
def test_qwen_non_embedding_counts_are_the_model_cards(name, non_embedding):
    """Qwen's cards state non-embedding parameters too, to two decimals (the q/k/v biases they
    include, 0.13M and 0.03M for Qwen2.5, are below the rounding)."""
    m = read(name)
    embedding = m.vocab_size * m.hidden_size * (1 if m.tied_embeddings else 2)
    assert total_params(m) - embedding == pytest.approx(non_embedding, abs=0.005e9)


@pytest.mark.parametrize("name,total,active", [("mixtral-8x7b", 46.7e9, 12.9e9), ("qwen3-30b-a3b", 30.5e9, 3.35e9)])
def test_moe_active_parameters_are_published(name, total, active):
    m = read(name)
    assert (total_params(m), active_params(m)) == (pytest.approx(total, rel=0.002), pytest.approx(active, rel=0.005))


def test_gpt_oss_120b_is_116_83b_with_5_13b_active():
    """OpenAI's count of active parameters leaves out the input embedding (a lookup): 5.13B."""
    m = read("gpt-oss-120b")
    embedding = 201088 * 2880
    assert round(total_params(m) / 1e9, 2) == 116.83 and round((active_params(m) - embedding) / 1e9, 2) == 5.13
    assert "checkpoint quantized (mxfp4)" in m.source


def _mla(h: int, heads: int, q_rank: int, kv_rank: int = 512, nope: int = 128, rope: int = 64, v: int = 128) -> int:
    """Multi-head latent attention per layer (DeepSeek-V2 paper, sec. 2.1): W_DQ, q norm, W_UQ;
    W_DKV with W_KR, kv norm, W_UK with W_UV; W_O."""
    return (
        (h * q_rank + q_rank + q_rank * heads * (nope + rope))
        + (h * (kv_rank + rope) + kv_rank + kv_rank * heads * (nope + v))
        + heads * v * h
    )


@pytest.mark.parametrize(
    "name,h,layers,total,active", [("deepseek-v2", 5120, 60, 236e9, 21e9), ("deepseek-v3", 7168, 61, 671e9, 37e9)]
)
def test_deepseek_counts_are_published(name, h, layers, total, active):
    """The papers' 236B / 21B (DeepSeek-V2) and 671B / 37B (DeepSeek-V3), with each layer's
    attention exactly the DeepSeek-V2 paper's MLA (149.2M and 187.1M weights)."""
    m = read(name)
    assert compute.layer_params(m, dense=True).replicated + compute.layer_params(
        m, dense=True
    ).sharded - 2 * h - 3 * h * m.ffn == _mla(h, 128, 1536)
    assert total_params(m) == pytest.approx(total, rel=0.002)
    assert active_params(m) == pytest.approx(active, rel=0.05)  # 21.4B (V2), 37.6B with the embedding (V3)


def test_llama_3_1_long_context_needs_a_training_length():
    """rope_scaling (rope_type llama3) costs nothing; its 131,072 positions are a long-context
    extension: without --seq-len the estimate asks for one."""
    r = CliRunner().invoke(
        cli,
        [
            "estimate",
            "--model",
            str(DATA / "llama-3.1-8b.json"),
            "--cluster",
            "dgx-h100-80gb",
            "--gpus",
            "8",
            "--global-batch",
            "8",
        ],
    )
    assert r.exit_code == 2 and "--seq-len" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_a_gemma_2_config_is_planned_gated_tied_and_in_bf16():
    r = CliRunner().invoke(
        cli,
        [
            "estimate",
            "--model",
            str(DATA / "gemma-2-9b.json"),
            "--cluster",
            "dgx-h100-80gb",
            "--gpus",
            "8",
            "--global-batch",
            "16",
            "--seq-len",
            "8192",
            "--tp",
            "2",
            "--sequence-parallel",
            "--zero",
            "1",
            "--recompute",
            "selective",
            "--json",
        ],
    )
    assert r.exit_code in (0, 1), r.output  # 1: the layout does not fit, still estimated
    doc = json.loads(r.stdout)
    assert (
        doc["job"]["precision"] == "bf16" and doc["model"]["activation"] == "geglu" and doc["model"]["tied_embeddings"]
    )
    assert doc["model"]["norms_per_layer"] == 4 and doc["model"]["sliding_window_layers"] == 21


# ----- refusals: one line naming the field


def _refused(cfg: dict, tmp_path: Path) -> str:
    """`plan estimate`'s refusal of this config.json: exit 2, one line."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    r = CliRunner().invoke(
        cli,
        [
            "estimate",
            "--model",
            str(path),
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
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    return lines[0]


@pytest.mark.parametrize(
    "base,changes,field",
    [
        (
            "llama-3-8b",
            {"model_type": "falcon", "architectures": ["FalconForCausalLM"]},
            "model_type",
        ),  # an unknown family
        ("llama-3-8b", {"model_type": None}, "model_type"),
        (
            "llama-3-8b",
            {"sliding_window": 4096},
            "sliding_window",
        ),  # a field Llama's code has not: perhaps another architecture
        ("llama-3-8b", {"per_layer_config": {"0": {"intermediate_size": 4096}}}, "per_layer_config"),
        ("llama-3-8b", {"hidden_act": "relu"}, "hidden_act"),  # ReGLU: not an activation the spec holds
        ("llama-3-8b", {"pruned_heads": {"0": [1, 2]}}, "pruned_heads"),
        ("gemma-2-9b", {"use_bidirectional_attention": True}, "use_bidirectional_attention"),
        ("gemma-2-9b", {"layer_types": ["chunked_attention"] * 42}, "layer_types"),
        ("gemma-2-9b", {"hidden_activation": "relu"}, "hidden_activation"),
        ("mistral-7b-v0.1", {"attention_bias": True}, "attention_bias"),  # Mistral's code builds no biases
        ("qwen3-30b-a3b", {"mlp_only_layers": [0, 47]}, "mlp_only_layers"),
        ("gemma-3-27b", {}, "vision_config"),  # multimodal: the text_config, as a file of its own, is read
        ("llama-3-8b", {"rope_scaling": "yarn"}, "rope_scaling"),  # not a mapping: no factor to read (was ignored)
    ],
    ids=[
        "unknown_type",
        "no_type",
        "unread_field",
        "per_layer",
        "relu",
        "pruned",
        "bidirectional",
        "layer_types",
        "gemma_act",
        "bias",
        "moe_layers",
        "multimodal",
        "rope_not_mapping",
    ],
)
def test_what_is_not_read_is_refused_naming_the_field(tmp_path, base, changes, field):
    cfg = {k: v for k, v in {**config(base), **changes}.items() if v is not None}
    assert f"'{field}'" in _refused(cfg, tmp_path)


def test_an_unknown_family_lists_the_families_read_and_the_escape_hatch(tmp_path):
    line = _refused({**config("llama-3-8b"), "model_type": "phi", "architectures": ["PhiForCausalLM"]}, tmp_path)
    assert "gemma2" in line and "olmo2" in line and "deepseek_v3" in line and "planner/presets/models" in line


def test_every_family_file_reads_or_is_refused_in_one_line():
    for path in sorted(DATA.glob("*.json")):
        try:
            load_model(str(path))
        except UsageError as exc:
            assert path.stem == "gemma-3-27b" and "\n" not in str(exc)


# ----- the cost terms of the fields read


def _pairs(s: int, w: int | None) -> int:
    """Query-key pairs of causal attention, counted one query at a time."""
    return sum(min(i, w or i) for i in range(1, s + 1))


@pytest.mark.parametrize("s", [512, 4096, 5000, 8192])
def test_sliding_window_pairs_match_counting_them(s):
    m = read("gemma-2-9b")  # 21 of 42 layers at window 4096
    expected = (21 * _pairs(s, 4096) + 21 * _pairs(s, None)) / (42 * _pairs(s, None))
    assert compute.attention_pairs_fraction(m, s) == pytest.approx(expected, rel=1e-12)


def test_sliding_windows_cut_attention_work_not_the_rest():
    """Mistral 7B at 8192 tokens: every layer's queries see 4096 keys, so its attention FLOPs
    are 3/4 of full causal attention (about); the GEMMs are the same."""
    m = read("mistral-7b-v0.1")
    full = m.model_copy(update={"sliding_window": None, "sliding_window_layers": 0})
    s = 8192
    share = _pairs(s, 4096) / _pairs(s, None)
    assert compute.attention_flops_forward(m, 1, s) == pytest.approx(
        share * compute.attention_flops_forward(full, 1, s)
    )
    gemms = compute.layer_flops_forward(full, 1, s) - compute.attention_flops_forward(full, 1, s)
    assert compute.layer_flops_forward(m, 1, s) - compute.attention_flops_forward(m, 1, s) == pytest.approx(gemms)
    dev = load_cluster("dgx-h100-80gb").device
    job = JobSpec(global_batch_size=1, seq_len=s, precision="bf16")
    windowed, whole = (compute.layer_compute(x, dev, job, Layout()) for x in (m, full))
    assert windowed.forward < whole.forward and windowed.flops_forward < whole.flops_forward
    unfused_job = job.model_copy(update={"flash_attention": False})
    unfused = [compute.layer_compute(x, dev, unfused_job, Layout()).forward for x in (m, full)]
    assert unfused[0] == unfused[1]  # unfused attention computes every score, windowed or not


def _activation_bytes(m: ModelSpec) -> float:
    return memory.layer_activation_bytes(m, 1, 4096, 1, False, Recompute.none, True)


def test_gemmas_four_norms_cost_their_weights_inputs_and_passes():
    """Gemma 2's norms after attention and after the MLP: 2h weights more a layer, each keeps
    its input for backward (2 x 2 bytes x s b h more) and reads and writes it once."""
    m = read("gemma-2-9b")
    two = m.model_copy(update={"norms_per_layer": 2})
    h, sbh = m.hidden_size, 4096 * m.hidden_size
    assert compute.layer_params(m).total - compute.layer_params(two).total == 2 * h
    assert _activation_bytes(m) - _activation_bytes(two) == 2 * 2 * sbh
    assert total_params(m) - total_params(two) == 42 * 2 * h


def test_qk_norm_keeps_the_queries_and_keys_before_their_norms():
    m = read("qwen3-8b")
    plain = m.model_copy(update={"qk_norm": False})
    s = 4096
    assert _activation_bytes(m) - _activation_bytes(plain) == 2 * s * (m.q_width + m.head_dim * m.kv_heads)
    assert compute.layer_params(m).total - compute.layer_params(plain).total == 2 * m.head_dim


def test_logit_soft_capping_keeps_tanhs_output():
    m = read("gemma-2-9b")
    plain = m.model_copy(update={"logit_softcapping": False})
    kept = [memory.head_activation_bytes(x, 1, 8192, 1, False) for x in (m, plain)]
    assert kept[0] - kept[1] == 2 * 8192 * 256000  # one 16-bit copy of the logits


def test_a_gated_family_with_silu_is_swiglu():
    assert (
        read("gemma-2-9b", hidden_activation="silu").activation.value == "swiglu"
    )  # Gemma2MLP gates whatever the activation


def test_geglu_costs_what_swiglu_does():
    m = read("gemma-2-9b")
    swiglu = m.model_copy(update={"activation": "swiglu"})
    assert compute.layer_params(m) == compute.layer_params(swiglu)
    assert compute.layer_flops_forward(m, 1, 4096) == compute.layer_flops_forward(swiglu, 1, 4096)
    assert _activation_bytes(m) == _activation_bytes(swiglu)


def test_the_reference_model_builds_geglu_as_costed():
    """plan run's reference MLP: gate, up, down with tanh-approximated GELU on the gate, as many
    parameters as the cost model counts."""
    torch = pytest.importorskip("torch")
    from planner.distributed.reference_model import MLP, ReferenceModel

    spec = ModelSpec(
        name="tiny-gemma",
        num_layers=2,
        hidden_size=32,
        num_heads=4,
        vocab_size=64,
        max_seq_len=16,
        activation="geglu",
        learned_position_embeddings=False,
        linear_bias=False,
        norm="rmsnorm",
        dropout=False,
        tied_embeddings=True,
    )
    mlp = MLP(spec)
    x = torch.randn(3, 32)
    expected = mlp.down(torch.nn.functional.gelu(mlp.gate(x), approximate="tanh") * mlp.up(x))
    assert torch.equal(mlp(x), expected)
    assert sum(p.numel() for p in ReferenceModel(spec).parameters()) == total_params(spec)
