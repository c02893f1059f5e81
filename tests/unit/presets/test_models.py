"""Model specs from our YAML and from Hugging Face config.json files."""

import json

import pytest

from cost_models.compute import total_params
from planner.errors import UsageError
from planner.presets import load_model

LLAMA3_8B_HF = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 128256,
}
GPT2_HF = {
    "model_type": "gpt2",
    "activation_function": "gelu_new",
    "n_ctx": 1024,
    "n_embd": 768,
    "n_head": 12,
    "n_inner": None,
    "n_layer": 12,
    "n_positions": 1024,
    "vocab_size": 50257,
    "resid_pdrop": 0.1,
}


def test_llama_config_json_matches_preset(tmp_path):
    d = tmp_path / "Meta-Llama-3-8B"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(LLAMA3_8B_HF))
    m = load_model(str(d / "config.json"))
    preset = load_model("llama3-8b")
    assert m.name == "Meta-Llama-3-8B"
    assert total_params(m) == total_params(preset) == 8_030_261_248
    assert (m.kv_heads, m.ffn, m.activation.value, m.norm) == (8, 14336, "swiglu", "rmsnorm")


def test_gpt2_config_json(tmp_path):
    p = tmp_path / "gpt2.json"
    p.write_text(json.dumps(GPT2_HF))
    m = load_model(str(p))
    # Hugging Face's gpt2 has 124,439,808 parameters (tied head, learned positions).
    assert total_params(m) == 124_439_808
    assert m.ffn == 4 * 768 and m.tied_embeddings and m.learned_position_embeddings


def test_hf_config_missing_field_is_named(tmp_path):
    p = tmp_path / "config.json"
    cfg = dict(LLAMA3_8B_HF)
    del cfg["intermediate_size"]
    p.write_text(json.dumps(cfg))
    with pytest.raises(UsageError, match="intermediate_size"):
        load_model(str(p))


def test_malformed_json_names_line(tmp_path):
    p = tmp_path / "m.json"
    p.write_text('{\n "name": "x",\n "num_layers": 2,,\n}')
    with pytest.raises(UsageError, match=r"m.json:3: malformed JSON"):
        load_model(str(p))


def test_bad_field_value_names_field_and_line(tmp_path):
    p = tmp_path / "m.yaml"
    p.write_text("name: x\nnum_layers: 2\nhidden_size: 66\nnum_heads: 4\nvocab_size: 10\nmax_seq_len: 8\n")
    with pytest.raises(UsageError, match="not divisible by num_heads"):
        load_model(str(p))
    p.write_text("name: x\nnum_layers: -2\nhidden_size: 64\nnum_heads: 4\nvocab_size: 10\nmax_seq_len: 8\n")
    with pytest.raises(UsageError, match=r"m.yaml:2: field 'num_layers'"):
        load_model(str(p))
