"""Model presets (YAML files in models/ beside this module) and Hugging Face config.json import."""

from __future__ import annotations

from pathlib import Path

from planner.datafile import load_named, parse_spec
from planner.errors import UsageError
from planner.specs import ModelSpec

PRESET_DIR = Path(__file__).parent / "models"


def model_presets() -> dict[str, Path]:
    return {p.stem: p for p in sorted(PRESET_DIR.glob("*.yaml"))}


# Hugging Face dtype names -> ours.
_HF_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
_LLAMA_LIKE = {"llama", "mistral", "qwen2", "qwen3", "gemma", "mixtral"}


def is_hf_config(data: dict) -> bool:
    return "num_hidden_layers" in data or "n_layer" in data


def from_hf_config(data: dict, name: str) -> dict:
    """Translate a Hugging Face config.json into ModelSpec fields.

    Llama/Mistral/Qwen2 style: num_hidden_layers, hidden_size, num_attention_heads,
    num_key_value_heads, intermediate_size, vocab_size, max_position_embeddings, hidden_act.
    GPT-2 style: n_layer, n_embd, n_head, n_inner, n_positions, vocab_size.
    """

    def need(*keys: str):
        for k in keys:
            if data.get(k) is not None:
                return data[k]
        raise UsageError(f"{name}: Hugging Face config has no {' / '.join(keys)}")

    dtype = _HF_DTYPES.get(str(data.get("torch_dtype") or data.get("dtype") or "bfloat16"), "bf16")
    model_type = str(data.get("model_type", "")).lower()
    if "n_layer" in data:  # GPT-2 family
        hidden = need("n_embd", "hidden_size")
        return dict(
            name=name,
            num_layers=need("n_layer"),
            hidden_size=hidden,
            num_heads=need("n_head"),
            ffn_hidden_size=data.get("n_inner") or 4 * hidden,
            vocab_size=need("vocab_size"),
            max_seq_len=need("n_positions", "n_ctx"),
            activation="gelu",
            tied_embeddings=data.get("tie_word_embeddings", True),
            learned_position_embeddings=True,
            linear_bias=True,
            norm="layernorm",
            dropout=bool(data.get("resid_pdrop", 0.1) or data.get("attn_pdrop", 0.1)),
            param_dtype=dtype if "torch_dtype" in data else "fp32",
            source=f"Hugging Face config.json ({model_type or 'gpt2'} style)",
        )
    act = str(data.get("hidden_act", "silu")).lower()
    swiglu = act in ("silu", "swish") or model_type in _LLAMA_LIKE
    heads = need("num_attention_heads")
    return dict(
        name=name,
        num_layers=need("num_hidden_layers"),
        hidden_size=need("hidden_size"),
        num_heads=heads,
        num_kv_heads=data.get("num_key_value_heads") or heads,
        ffn_hidden_size=need("intermediate_size"),
        vocab_size=need("vocab_size"),
        max_seq_len=need("max_position_embeddings"),
        activation="swiglu" if swiglu else "gelu",
        tied_embeddings=bool(data.get("tie_word_embeddings", False)),
        learned_position_embeddings=False,
        linear_bias=bool(data.get("attention_bias", False) or data.get("use_bias", False) or model_type == "gpt_neox"),
        norm="rmsnorm" if "rms_norm_eps" in data else "layernorm",
        dropout=bool(data.get("attention_dropout", 0.0) or data.get("hidden_dropout", 0.0)),
        param_dtype=dtype,
        source=f"Hugging Face config.json ({model_type or 'llama'} style)",
    )


def _parse(data: dict, path: Path, text: str) -> ModelSpec:
    if is_hf_config(data):
        name = path.parent.name if path.name == "config.json" else path.stem
        return parse_spec(ModelSpec, from_hf_config(data, name), path, text)
    return parse_spec(ModelSpec, data, path, text)


def load_model(name_or_path: str) -> ModelSpec:
    """A model preset by name, or our JSON/YAML spec, or a Hugging Face config.json."""
    return load_named(name_or_path, "model", model_presets(), _parse)
