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


# Fields of architectures the cost model does not cover yet; a config carrying one is refused
# rather than planned as a dense decoder (a Mixtral costed as a 7B "fits" on 8 GPUs).
_MOE_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size")
_NOT_DECODERS = {"bert", "roberta", "deberta", "deberta-v2", "distilbert", "electra", "albert", "xlm-roberta", "t5", "mt5",
                 "bart", "mbart", "pegasus", "whisper", "vit", "clip", "encoder-decoder"}


def unsupported(data: dict, name: str) -> str | None:
    """Why this Hugging Face config cannot be planned (one line naming the field), or None."""
    for key in _MOE_FIELDS:
        value = data.get(key)
        if value not in (None, 0, 1, False):
            return (f"{name}: field '{key}' = {value!r}: mixture-of-experts models are not modelled yet; planning it as a dense "
                    "model would be wrong (remove the field only if the model is really dense)")
    model_type = str(data.get("model_type", "")).lower()
    if model_type in _NOT_DECODERS or data.get("is_encoder_decoder"):
        field = "model_type" if model_type in _NOT_DECODERS else "is_encoder_decoder"
        return f"{name}: field '{field}' = {data.get(field)!r}: only decoder-only language models are planned"
    for key in ("vision_config", "audio_config", "text_config"):
        if key in data:
            return f"{name}: field '{key}': multimodal configs are not modelled; give the language model's own config"
    archs = [a for a in data.get("architectures") or [] if isinstance(a, str)]
    if archs and not any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs):
        return f"{name}: field 'architectures' = {archs}: only causal language models (…ForCausalLM) are planned"
    return None


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

    why = unsupported(data, name)
    if why:
        raise UsageError(why)
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
            param_dtype=dtype,  # without torch_dtype: bf16 mixed precision, like every other input
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
