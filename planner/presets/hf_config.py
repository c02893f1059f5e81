"""Hugging Face config.json -> ModelSpec fields, by model_type.

A config's model_type names the Hugging Face modelling code that builds the model from it
(transformers' models/<model_type>/modeling_<model_type>.py; for DeepSeek and Phi-3 also the
checkpoint's own code that auto_map names). For each model_type read here, FAMILIES says which
of that code's fields change the cost and how the spec holds them; COST_FREE names the fields
that change nothing the cost model prices, each with why. A field that is neither is refused,
named: it may belong to an architecture this reader does not know, and a plan of the wrong
model is worse than none. A model_type not in FAMILIES is refused the same way; the escape
hatch is a model spec of our own (planner/presets/models/*.yaml).

Defaults (a field a published config leaves out) are those of the model_type's configuration
class (transformers 5.24, models/<model_type>/configuration_<model_type>.py): Gemma-2-9B's
config.json has no tie_word_embeddings, and Gemma2Config ties them.

The checkpoint's torch_dtype / dtype is its storage dtype (Gemma-2-9B and OLMo 2 publish
float32), not the training precision: the spec's param_dtype stays bf16 (mixed precision) and
the source says what the checkpoint holds. A checkpoint stored as anything but float32, bfloat16
or float16 (float64, int8) is refused: what would train from it is not what this plans.

Every field read has a kind (FIELD_KINDS: a count within the spec's bounds, a yes/no, a name),
checked before anything is computed from it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, NoReturn, Optional

from planner.datafile import short_text
from planner.errors import UsageError
from planner.specs import MAX_COUNT, MAX_LAYERS, MAX_SEQ_LEN, MAX_VOCAB, MAX_WIDTH
from planner.specs.model import ROPE_TYPES

# ----- the families read


@dataclass(frozen=True)
class Family:
    """One model_type as its Hugging Face modelling code builds it."""

    fields: frozenset[str]  # the fields of its configuration read or checked below
    defaults: dict = field(default_factory=dict)  # its configuration class's defaults for fields configs leave out
    gated: bool = True  # gate, up and down projections (LlamaMLP); False: fc1 and fc2 (GPT-2, GPT-NeoX)
    activation_key: str = "hidden_act"
    biases: str = "attention"  # which linear layers carry biases: see _biases
    norms_per_layer: int = 2
    qk_norm: bool = False
    windows: str = "none"  # which layers a sliding window applies to: see _window_layers
    moe: str | None = None  # which reader of the expert fields (planner/presets/__init__.py:_moe_fields)
    mla: bool = False  # DeepSeek's multi-head latent attention (its widths read: read_decoder)


# Fields every rotary decoder below reads (LlamaConfig's names).
_DECODER = frozenset(
    {
        "num_hidden_layers",
        "hidden_size",
        "num_attention_heads",
        "num_key_value_heads",
        "intermediate_size",
        "vocab_size",
        "max_position_embeddings",
        "head_dim",
        "hidden_act",
        "tie_word_embeddings",
        "attention_bias",
        "attention_dropout",
    }
)
_QWEN_WINDOWS = frozenset({"use_sliding_window", "sliding_window", "max_window_layers", "layer_types"})
_QWEN_MOE = frozenset(
    {
        "num_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "shared_expert_intermediate_size",
        "decoder_sparse_step",
        "mlp_only_layers",
    }
)
_DEEPSEEK = frozenset(
    {
        "n_routed_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "n_shared_experts",
        "first_k_dense_replace",
        "moe_layer_freq",
        "kv_lora_rank",
        "q_lora_rank",
        "qk_nope_head_dim",
        "qk_rope_head_dim",
        "v_head_dim",
        "qk_head_dim",
        "num_nextn_predict_layers",
        "mlp_bias",
    }
)
_GEMMA = frozenset(
    {
        "hidden_activation",
        "sliding_window",
        "layer_types",
        "final_logit_softcapping",
        "attn_logit_softcapping",
        "use_bidirectional_attention",
    }
)
_NO_WINDOW = {"sliding_window": None}
# Defaults every configuration class below shares unless its Family says otherwise.
_DEFAULTS = {"hidden_act": "silu", "tie_word_embeddings": False, "attention_bias": False, "attention_dropout": 0.0}
_QWEN_WINDOW = {"use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28}

FAMILIES: dict[str, Family] = {
    "llama": Family(_DECODER | {"mlp_bias"}, biases="attention+mlp"),
    "mistral": Family(
        _DECODER | {"sliding_window"}, {"num_key_value_heads": 8, "sliding_window": 4096}, biases="none", windows="all"
    ),
    "mixtral": Family(
        _DECODER | {"sliding_window", "num_local_experts", "num_experts_per_tok"},
        {"num_key_value_heads": 8, **_NO_WINDOW},
        biases="none",
        windows="all",
        moe="mixtral",
    ),
    "qwen2": Family(
        _DECODER | _QWEN_WINDOWS, {"num_key_value_heads": 32, **_QWEN_WINDOW}, biases="qkv", windows="above"
    ),
    "qwen2_moe": Family(
        _DECODER | _QWEN_WINDOWS | _QWEN_MOE | {"qkv_bias"},
        {"num_key_value_heads": 16, "qkv_bias": True, **_QWEN_WINDOW},
        biases="qkv",
        windows="odd_below",
        moe="qwen_moe",
    ),
    "qwen3": Family(
        _DECODER | _QWEN_WINDOWS,
        {"num_key_value_heads": 32, "head_dim": 128, **_QWEN_WINDOW},
        qk_norm=True,
        windows="above",
    ),
    # Qwen3-MoE's configs carry max_window_layers, which its modelling code does not read
    "qwen3_moe": Family(
        _DECODER | _QWEN_WINDOWS | _QWEN_MOE,
        {"num_key_value_heads": 4, **_QWEN_WINDOW},
        qk_norm=True,
        windows="every",
        moe="qwen_moe",
    ),
    # Gemma: GeGLU (hidden_act "gelu" in the first releases meant the tanh approximation: GemmaConfig)
    "gemma": Family(
        _DECODER | {"hidden_activation", "use_bidirectional_attention"},
        {"num_key_value_heads": 16, "head_dim": 256, "hidden_act": "gelu_pytorch_tanh", "tie_word_embeddings": True},
    ),
    "gemma2": Family(
        _DECODER | _GEMMA,
        {
            "num_key_value_heads": 4,
            "head_dim": 256,
            "hidden_activation": "gelu_pytorch_tanh",
            "tie_word_embeddings": True,
            "sliding_window": 4096,
            "final_logit_softcapping": 30.0,
            "attn_logit_softcapping": 50.0,
        },
        activation_key="hidden_activation",
        norms_per_layer=4,
        windows="alternate",
    ),
    "gemma3_text": Family(
        _DECODER | _GEMMA | {"sliding_window_pattern", "_sliding_window_pattern"},
        {
            "num_key_value_heads": 4,
            "head_dim": 256,
            "hidden_activation": "gelu_pytorch_tanh",
            "tie_word_embeddings": True,
            "sliding_window": 4096,
        },
        activation_key="hidden_activation",
        norms_per_layer=4,
        qk_norm=True,
        windows="pattern",
    ),
    # Phi-3: q, k, v fused into qkv_proj and gate, up into gate_up_proj: the GEMMs the cost model
    # prices already (one of h x (q + 2 kv), one of h x 2f).
    "phi3": Family(
        _DECODER | {"sliding_window", "resid_pdrop", "embd_pdrop"}, _NO_WINDOW, biases="none", windows="all"
    ),
    "deepseek_v2": Family(
        _DECODER | _DEEPSEEK,
        {"kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128},
        moe="deepseek",
        mla=True,
    ),
    "deepseek_v3": Family(
        _DECODER | _DEEPSEEK,
        {
            "num_key_value_heads": 128,
            "kv_lora_rank": 512,
            "q_lora_rank": 1536,
            "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64,
            "v_head_dim": 128,
        },
        moe="deepseek",
        mla=True,
    ),
    "gpt_oss": Family(
        _DECODER
        | {
            "sliding_window",
            "layer_types",
            "num_local_experts",
            "num_experts_per_tok",
            "experts_per_token",
            "swiglu_limit",
        },
        {"num_key_value_heads": 8, "head_dim": 64, "sliding_window": 128, "attention_bias": True, "swiglu_limit": 7.0},
        biases="all",
        windows="alternate",
        moe="gpt_oss",
    ),
    # OLMo 2 normalises the attention and MLP outputs instead of their inputs: two norms, as costed.
    "olmo2": Family(_DECODER, qk_norm=True),
    "gpt_neox": Family(
        _DECODER | {"hidden_dropout", "layer_norm_eps"},
        {"hidden_act": "gelu", "attention_bias": True},
        gated=False,
        biases="all",
    ),
    "gpt2": Family(
        frozenset(
            {
                "n_layer",
                "n_embd",
                "n_head",
                "n_inner",
                "n_positions",
                "n_ctx",
                "vocab_size",
                "activation_function",
                "resid_pdrop",
                "embd_pdrop",
                "attn_pdrop",
                "tie_word_embeddings",
                "layer_norm_epsilon",
                "add_cross_attention",
            }
        ),
        {
            "activation_function": "gelu_new",
            "resid_pdrop": 0.1,
            "embd_pdrop": 0.1,
            "attn_pdrop": 0.1,
            "tie_word_embeddings": True,
        },
        gated=False,
        activation_key="activation_function",
        biases="all",
    ),
}
# GPT-2's field names -> the decoder names the reader uses (GPT2Config's attribute_map).
_GPT2_NAMES = {
    "n_layer": "num_hidden_layers",
    "n_embd": "hidden_size",
    "n_head": "num_attention_heads",
    "n_inner": "intermediate_size",
    "n_positions": "max_position_embeddings",
}

# Fields that change nothing the cost model prices, and why.
_WHY = {
    "bookkeeping": (
        "_name_or_path",
        "_commit_hash",
        "architectures",
        "model_type",
        "transformers_version",
        "auto_map",
        "torch_dtype",
        "dtype",
        "use_cache",
        "return_dict",
        "output_hidden_states",
        "output_attentions",
        "torchscript",
        "use_bfloat16",
        "tf_legacy_loss",
        "id2label",
        "label2id",
        "num_labels",
        "problem_type",
        "finetuning_task",
        "tokenizer_class",
        "prefix",
        "task_specific_params",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "sep_token_id",
        "decoder_start_token_id",
        "is_decoder",
        "_attn_implementation",
        "attn_implementation",
        "_attn_implementation_autoset",
        "initializer_range",
        "initializer_factor",
        "cache_implementation",
        "quantization_config",
    ),
    "generation defaults (transformers drops them from the model's config)": (
        "max_length",
        "min_length",
        "do_sample",
        "early_stopping",
        "num_beams",
        "num_beam_groups",
        "diversity_penalty",
        "temperature",
        "top_k",
        "top_p",
        "typical_p",
        "repetition_penalty",
        "length_penalty",
        "no_repeat_ngram_size",
        "encoder_no_repeat_ngram_size",
        "bad_words_ids",
        "num_return_sequences",
        "output_scores",
        "return_dict_in_generate",
        "forced_bos_token_id",
        "forced_eos_token_id",
        "remove_invalid_values",
        "exponential_decay_length_penalty",
        "suppress_tokens",
        "begin_suppress_tokens",
    ),
    "rotary frequencies: the rotation costs the same whatever they are (rope_scaling's long-context extension too, "
    "but for YaRN's attention factor, read from it); rope_theta and rope_scaling are read for the exports": (
        "rope_theta",
        "rope_scaling",
        "rope_parameters",
        "rope_local_base_freq",
        "rope_interleave",
        "original_max_position_embeddings",
        "rotary_emb_base",
        "initial_context_length",
        "use_mrope",
    ),
    "rotary on part of each head: costed as on all of it (a few bytes an element)": (
        "partial_rotary_factor",
        "rotary_pct",
    ),
    "a norm's epsilon": ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon"),
    "a scale on the attention scores": (
        "query_pre_attn_scalar",
        "scale_attn_weights",
        "scale_attn_by_inverse_layer_idx",
        "reorder_and_upcast_attn",
    ),
    "how the router picks and weights experts, and its auxiliary loss: the same experts' work": (
        "router_aux_loss_coef",
        "output_router_logits",
        "router_jitter_noise",
        "norm_topk_prob",
        "routed_scaling_factor",
        "scoring_func",
        "topk_method",
        "n_group",
        "topk_group",
        "aux_loss_alpha",
        "seq_aux",
        "ep_size",
    ),
    "GPT-OSS's SwiGLU slope: the same element-wise operators": ("swiglu_alpha",),
    "GPT-NeoX's parallel attention and MLP: the same operators": ("use_parallel_residual",),
    "Llama's sliced matmuls that reproduce pretraining numerics: the same GEMM work": ("pretraining_tp",),
    "heads other than the causal LM's": (
        "summary_type",
        "summary_use_proj",
        "summary_activation",
        "summary_proj_to_labels",
        "summary_first_dropout",
        "classifier_dropout",
    ),
    "Gemma 2's copy of sliding_window from before layer_types": ("sliding_window_size",),
}
COST_FREE: dict[str, str] = {key: why for why, keys in _WHY.items() for key in keys}
# Fields of every configuration planned at one value only (PretrainedConfig's; Gemma's).
_PLANNED_AT: dict[str, tuple[object, ...]] = {
    "is_encoder_decoder": (False,),
    "add_cross_attention": (False,),
    "tie_encoder_decoder": (False,),
    "cross_attention_hidden_size": (None,),
    "chunk_size_feed_forward": (0,),
    "pruned_heads": ({},),
    "use_bidirectional_attention": (None, False),
}
# Fields whose shapes have no family default: a config without one is refused, naming it.
_SHAPE = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size", "max_position_embeddings")
_SILU = ("silu", "swish")
_GELU = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "gelu_python", "gelu_accurate")


def unread_field(data: dict, model_type: str) -> str | None:
    """The first field of `data` this reader neither reads for `model_type` nor knows to be
    cost-free, or one at a value it does not plan (a reason), or None."""
    fam = FAMILIES[model_type]
    for key in data:
        if key not in fam.fields and key not in COST_FREE and key not in _PLANNED_AT:
            return (
                f"field '{key}' is not one this reader knows for model_type {model_type!r}; if it does not change the "
                "architecture, remove it from a copy of the config.json, else write a model spec (planner/presets/models/*.yaml)"
            )
    for key, planned in _PLANNED_AT.items():
        if key in data and data[key] not in planned:
            return f"field '{key}' = {data[key]!r} is not modelled (only {' or '.join(map(repr, planned))})"
    return None


# ----- the kind of every field read
# What each field this reader reads (any family's, and the bookkeeping it looks at) must hold, as
# transformers writes it: a count within the bounds of the spec (planner/specs/model.py), a yes/no, a
# name. Checked before anything is computed from a field, so a string, a bool, a dict or a number
# beyond any model is refused naming the field, not read as something else ("false" as true, 0
# heads as "equal to the query heads", a name as its letters). null: the family's default.


def _count(lo: int, hi: int) -> tuple:
    return ("integer", lo, hi)


_LAYERS, _WIDTH = _count(1, MAX_LAYERS), _count(1, MAX_WIDTH)
_PROBABILITY = ("number", 0.0, 1.0)
FIELD_KINDS: dict[str, tuple] = {
    **dict.fromkeys(("num_hidden_layers", "n_layer"), _LAYERS),
    **dict.fromkeys(
        (
            "hidden_size",
            "n_embd",
            "intermediate_size",
            "n_inner",
            "head_dim",
            "moe_intermediate_size",
            "kv_lora_rank",
            "q_lora_rank",
            "qk_nope_head_dim",
            "qk_rope_head_dim",
            "v_head_dim",
            "qk_head_dim",
        ),
        _WIDTH,
    ),
    **dict.fromkeys(
        (
            "num_attention_heads",
            "n_head",
            "num_key_value_heads",
            "num_experts",
            "num_local_experts",
            "n_routed_experts",
            "num_experts_per_tok",
            "experts_per_token",
        ),
        _count(1, MAX_COUNT),
    ),
    **dict.fromkeys(
        ("decoder_sparse_step", "moe_layer_freq", "sliding_window_pattern", "_sliding_window_pattern"), _LAYERS
    ),
    **dict.fromkeys(
        ("max_window_layers", "first_k_dense_replace", "num_nextn_predict_layers", "n_shared_experts"),
        _count(0, MAX_LAYERS),
    ),
    "shared_expert_intermediate_size": _count(0, MAX_WIDTH),
    "vocab_size": _count(1, MAX_VOCAB),
    **dict.fromkeys(("max_position_embeddings", "n_positions", "n_ctx", "sliding_window"), _count(1, MAX_SEQ_LEN)),
    **dict.fromkeys(
        (
            "tie_word_embeddings",
            "attention_bias",
            "mlp_bias",
            "qkv_bias",
            "use_sliding_window",
            "add_cross_attention",
            "use_bidirectional_attention",
            "is_encoder_decoder",
        ),
        ("bool",),
    ),
    **dict.fromkeys(("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop"), _PROBABILITY),
    **dict.fromkeys(("final_logit_softcapping", "attn_logit_softcapping", "swiglu_limit"), ("number", 1e-6, 1e6)),
    **dict.fromkeys(("layer_norm_eps", "layer_norm_epsilon"), ("number", 0.0, 1.0)),
    **dict.fromkeys(("hidden_act", "hidden_activation", "activation_function", "model_type"), ("name",)),
    "layer_types": ("names",),
    "architectures": ("names",),
    "mlp_only_layers": ("counts",),
    **dict.fromkeys(("torch_dtype", "dtype"), ("dtype",)),
    "quantization_config": ("mapping",),
}
# Storage dtypes of a checkpoint one trains from in 16-bit mixed precision (the spec's bf16): the
# module docstring. A float64 or integer (quantized) checkpoint is not what this plans: refused.
_STORED = ("float32", "bfloat16", "float16")


def typed_fields(data: dict, name: str) -> dict:
    """`data` with every field FIELD_KINDS names checked (UsageError naming the first one of the
    wrong kind) and `architectures` given as one name read as a list of that one."""
    for key, kind in FIELD_KINDS.items():
        value = data.get(key)
        if value is None:
            continue
        why = _kind_problem(kind, value)
        if why:
            shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
            if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
                shown = "an integer too large for any model"
            raise UsageError(f"{name}: field '{key}' = {shown}: {why}")
    if isinstance(data.get("architectures"), str):
        return {**data, "architectures": [data["architectures"]]}
    return data


def _kind_problem(kind: tuple, value) -> str | None:
    """Why `value` is not of `kind` (a FIELD_KINDS entry), or None."""
    tag = kind[0]
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if tag in ("integer", "number"):
        lo, hi = kind[1], kind[2]
        if not number or (tag == "integer" and not isinstance(value, int)) or not lo <= value <= hi:
            what = "an integer" if tag == "integer" else "a number"
            return (
                f"must be {what} from {lo:,} to {hi:,}" if tag == "integer" else f"must be {what} from {lo:g} to {hi:g}"
            )
        return None
    if tag == "bool":
        return None if isinstance(value, bool) else "must be true or false"
    if tag == "name":
        return None if isinstance(value, str) else "must be a name (a string)"
    if tag == "names":
        ok = isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))
        return None if ok else "must be a list of names (strings)"
    if tag == "counts":
        ok = isinstance(value, list) and all(
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_LAYERS for v in value
        )
        return None if ok else "must be a list of layer numbers"
    if tag == "dtype":
        if value in _STORED:
            return None
        return (
            f"a checkpoint stored as {value!r} is not planned: planning is for 16-bit mixed precision from a "
            f"{', '.join(_STORED)} checkpoint; give one of those in a copy of the config.json, or write a model spec"
        )
    return None if isinstance(value, dict) else "must be a mapping"


# ----- reading


class _Config:
    """A config.json's values under the decoder names, with its family's defaults."""

    def __init__(self, data: dict, model_type: str, name: str):
        self.fam, self.name, self.model_type = FAMILIES[model_type], name, model_type
        self.data = {_GPT2_NAMES.get(k, k): v for k, v in data.items()} if model_type == "gpt2" else data

    def get(self, key: str):
        return self.data[key] if key in self.data else self.fam.defaults.get(key, _DEFAULTS.get(key))

    def need(self, *keys: str):
        for key in keys:
            if self.data.get(key) is not None:
                return self.data[key]
        raise UsageError(f"{self.name}: Hugging Face config has no {' / '.join(keys)}")

    def refuse(self, key: str, why: str) -> NoReturn:
        raise UsageError(f"{self.name}: field '{key}' = {short_text(repr(self.data.get(key)))}: {why}")


def read_decoder(data: dict, model_type: str, name: str, moe_fields: Callable) -> dict:
    """ModelSpec fields of a config of a family in FAMILIES (checked by unread_field first)."""
    c = _Config(data, model_type, name)
    fam, h, heads = c.fam, c.need("hidden_size"), c.need("num_attention_heads")
    layers = c.need("num_hidden_layers")
    linear_bias, notes = _biases(c, layers)
    spec = dict(
        name=name,
        num_layers=layers,
        hidden_size=h,
        num_heads=heads,
        num_kv_heads=c.get("num_key_value_heads") or heads,
        ffn_hidden_size=None
        if fam.moe
        else ((c.get("intermediate_size") or 4 * h) if model_type == "gpt2" else c.need("intermediate_size")),
        vocab_size=c.need("vocab_size"),
        max_seq_len=c.need("max_position_embeddings", "n_ctx"),
        activation=_activation(c),
        tied_embeddings=bool(c.get("tie_word_embeddings")),
        learned_position_embeddings=model_type == "gpt2",
        linear_bias=linear_bias,
        norm="layernorm" if model_type in ("gpt2", "gpt_neox") else "rmsnorm",
        norms_per_layer=fam.norms_per_layer,
        qk_norm=fam.qk_norm,
        dropout=_dropout(c),
        logit_softcapping=c.get("final_logit_softcapping") is not None,
        param_dtype="bf16",
        source=f"Hugging Face config.json ({model_type} style)",
    )
    head_dim = None if fam.mla else c.get("head_dim")
    if head_dim is not None and head_dim * heads != h:
        spec["attention_head_dim"] = head_dim  # Qwen3, Gemma, GPT-OSS: heads of their own width
    if fam.mla:  # DeepSeek-V2/V3: multi-head latent attention (its own key and value for every head)
        spec.update(
            num_kv_heads=None,
            attention_head_dim=c.need("qk_nope_head_dim"),
            kv_lora_rank=c.need("kv_lora_rank"),
            q_lora_rank=c.get("q_lora_rank"),
            qk_rope_head_dim=c.need("qk_rope_head_dim"),
            v_head_dim=c.need("v_head_dim"),
        )
        if c.data.get("qk_head_dim") not in (None, spec["attention_head_dim"] + spec["qk_rope_head_dim"]):
            c.refuse("qk_head_dim", "it is not qk_nope_head_dim + qk_rope_head_dim; fix the config")
    spec["sliding_window"], spec["sliding_window_layers"] = _windows(c, layers)
    if model_type == "gpt_oss":  # GptOssExperts clamps the gate and up halves at swiglu_limit (null: the default)
        limit = c.data.get("swiglu_limit")
        spec["glu_limit"] = float(c.fam.defaults["swiglu_limit"] if limit is None else limit)
    if not spec[
        "learned_position_embeddings"
    ]:  # a rotary model's YaRN factor (ModelSpec refuses one with learned positions)
        spec["rope_attention_factor"] = _rope_attention_factor(c)
        spec["rope_theta"], spec["rope_scaling"] = _rope(c)
    if c.fam.biases == "qkv" and (c.model_type != "qwen2_moe" or c.get("qkv_bias")):
        spec["qkv_bias"] = True  # Qwen2Attention's q/k/v biases (_biases)
    if fam.moe:
        experts, approximated = moe_fields(data, name, fam.moe, c.need)
        spec.update(experts)
        notes += approximated
    spec["source"] = "; ".join([spec["source"], *notes, *_checkpoint_notes(c, layers, h)])
    return spec


def _rope(c: _Config) -> tuple[float, Optional[dict]]:
    """The rotary base and scaling the stacks must be told (the exports write them or refuse):
    rope_theta (transformers 5: rope_parameters' rope_theta; GPT-NeoX: rotary_emb_base),
    10,000 where the config has none (transformers' default); the scaling's type and factor, with
    Llama 3.1's frequency band, from rope_parameters or rope_scaling (None for 'default')."""
    rope_parameters = c.data.get("rope_parameters")
    params = rope_parameters if isinstance(rope_parameters, dict) else {}
    key = next((k for k in ("rope_theta", "rotary_emb_base") if c.data.get(k) is not None), None)
    theta = c.data[key] if key else params.get("rope_theta", 10000.0)
    key = key or "rope_parameters"
    if _kind_problem(("number", 1, 1e12), theta):
        c.refuse(key, "the rotary base must be a number from 1 to 1e+12")
    for key in ("rope_parameters", "rope_scaling"):
        rope = c.data.get(key)
        if not isinstance(rope, dict):  # no scaling here
            continue
        kind = rope.get("rope_type") or rope.get("type")
        if kind in (None, "default"):
            continue
        if kind not in ROPE_TYPES:
            c.refuse(key, f"rope_type {kind!r} is none of {', '.join(ROPE_TYPES)}")
        factor = rope.get("factor")
        if factor is None and rope.get("original_max_position_embeddings"):
            factor = (c.get("max_position_embeddings") or 1) / rope["original_max_position_embeddings"]
        out = {"rope_type": kind, "factor": 1.0 if factor is None else factor}
        by_kind = {
            "llama3": ("low_freq_factor", "high_freq_factor"),
            "yarn": ("beta_fast", "beta_slow", "mscale", "mscale_all_dim"),
        }
        parts = (*by_kind.get(kind, ()), "original_max_position_embeddings")
        out.update({k: rope[k] for k in parts if rope.get(k) is not None})
        for part, value in out.items():
            lo = 0.0 if part.startswith("mscale") else 1e-6  # a zero mscale scales nothing (GPT-OSS's mscale_all_dim)
            if part != "rope_type" and _kind_problem(("number", lo, 1e6), value):
                c.refuse(key, f"its {part} {value!r} must be a number from {lo:g} to 1e+06")
        if out["factor"] < 1:
            c.refuse(key, f"its factor {out['factor']!r} shrinks the context: it must be at least 1")
        return float(theta), out
    return float(theta), None


def _rope_attention_factor(c: _Config) -> float:
    """YaRN's attention factor on the rotary embedding's cos and sin, as transformers computes it
    (modeling_rope_utils.py:_compute_yarn_parameters): attention_factor if given, else
    0.1 mscale ln(factor) + 1 over the same with mscale_all_dim where both are given (DeepSeek-V3:
    1), else 0.1 ln(factor) + 1 (GPT-OSS's factor 32: 1.347); 1 for any other rotary scaling."""
    for key in ("rope_parameters", "rope_scaling"):
        rope = c.data.get(key)
        if rope is not None and not isinstance(rope, dict):  # transformers reads it as a mapping
            c.refuse(key, "must be a mapping (rope_type, factor, ...) or null")
        if isinstance(rope, dict) and (rope.get("rope_type") or rope.get("type")) == "yarn":
            break
    else:
        return 1.0
    values = {}
    for part, lo in (
        ("factor", 1e-6),
        ("attention_factor", 1e-6),
        ("mscale", 0.0),
        ("mscale_all_dim", 0.0),
        ("original_max_position_embeddings", 1),
    ):
        value = rope.get(part)
        if value is not None and _kind_problem(("number", lo, 1e6), value):
            c.refuse(key, f"its {part} {value!r} must be a number from {lo:g} to 1e+06")
        values[part] = value
    factor = values["factor"]
    if factor is None and values["original_max_position_embeddings"]:  # transformers 5: the context's extension
        factor = (c.get("max_position_embeddings") or 1) / values["original_max_position_embeddings"]
    factor = factor or 1.0

    def mscale(m: float) -> float:
        return 0.1 * m * math.log(factor) + 1.0 if factor > 1 else 1.0

    if values["attention_factor"] is not None:
        out = float(values["attention_factor"])
    elif values["mscale"] and values["mscale_all_dim"]:
        out = mscale(values["mscale"]) / mscale(values["mscale_all_dim"])
    else:
        out = mscale(1.0)
    if not 1e-6 < out <= 1e3:  # ModelSpec's bounds on rope_attention_factor
        c.refuse(key, f"its YaRN attention factor comes to {out:g}, not between 1e-06 and 1000")
    return out


def _activation(c: _Config) -> str:
    """swiglu or geglu for a gated family (its MLP always has gate, up and down), gelu otherwise."""
    key = c.fam.activation_key
    act = str(c.get(key)).lower()
    if act in _GELU:
        return "geglu" if c.fam.gated else "gelu"
    if act in _SILU and c.fam.gated:
        return "swiglu"
    kinds = "silu (SwiGLU) or a gelu (GeGLU)" if c.fam.gated else "a gelu"
    c.refuse(key, f"the MLP's activation is not modelled (only {kinds}; the spec's activation: gelu, swiglu, geglu)")


def _biases(c: _Config, layers: int) -> tuple[bool, list[str]]:
    """The spec's linear_bias (all linear layers biased, or none) and what that leaves out."""
    kind = c.fam.biases
    if kind == "all":  # GPT-2, GPT-NeoX (the MLP always), GPT-OSS (experts and router always)
        return True, []
    if kind == "none":  # Mistral, Mixtral, Phi-3: the modelling code builds no bias
        if c.data.get("attention_bias"):
            c.refuse(
                "attention_bias",
                f"the {c.model_type} modelling code builds no biases; remove it, or write a model spec",
            )
        return False, []
    if kind == "qkv":  # Qwen2: biases on q, k and v only (Qwen2Attention), 2-MoE behind qkv_bias: ModelSpec.qkv_bias
        return False, []
    attention = bool(c.get("attention_bias"))
    mlp = bool(c.get("mlp_bias")) if kind == "attention+mlp" else False
    note = (
        [f"attention_bias {attention}, mlp_bias {mlp}: biases counted on every linear layer"]
        if attention != mlp
        else []
    )
    return attention or mlp, note


def _dropout(c: _Config) -> bool:
    """Dropout anywhere (unread_field has refused these fields where the family has none)."""
    return any(c.get(k) for k in ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop"))


def _windows(c: _Config, layers: int) -> tuple[int | None, int]:
    """(sliding_window, how many layers use it), by the family's rule (its configuration's
    __post_init__) or the config's own layer_types."""
    rule, window = c.fam.windows, c.get("sliding_window")
    if rule in ("above", "odd_below", "every") and not c.get("use_sliding_window"):
        window = None  # Qwen: the window is read only with use_sliding_window
    if rule == "none" or window is None:
        return None, 0
    if not (isinstance(window, int) and not isinstance(window, bool) and window > 0):
        c.refuse("sliding_window", "is not a positive integer")
    types = c.data.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers or set(types) - {"sliding_attention", "full_attention"}:
            c.refuse("layer_types", f"not modelled: only a list of {layers} 'sliding_attention' / 'full_attention'")
        sliding = types.count("sliding_attention")
    else:
        sliding = sum(_window_layer(c, rule, i) for i in range(layers))
    return (window, sliding) if sliding else (None, 0)


def _window_layer(c: _Config, rule: str, i: int) -> bool:
    """Whether layer i has the window, without layer_types (the configuration classes' rules)."""
    if rule in ("all", "every"):  # Mistral, Mixtral, Phi-3; Qwen3-MoE
        return True
    if rule == "above":  # Qwen2, Qwen3: full attention in the first max_window_layers
        return i >= c.get("max_window_layers")
    if rule == "odd_below":  # Qwen2-MoE
        return bool((i + 1) % 2) and i < c.get("max_window_layers")
    if rule == "alternate":  # Gemma 2, GPT-OSS: sliding, full, sliding, ...
        return bool((i + 1) % 2)
    pattern = c.data.get(
        "sliding_window_pattern", c.data.get("_sliding_window_pattern", 6)
    )  # Gemma 3: 5 sliding, 1 full
    return bool((i + 1) % pattern)


def _checkpoint_notes(c: _Config, layers: int, h: int) -> list[str]:
    """What the spec leaves out or reads differently, for the source."""
    notes = []
    if c.get("attn_logit_softcapping") is not None:
        notes.append(
            "attention logit soft-capping (attn_logit_softcapping) not costed: a tanh per score inside the attention kernel"
        )
    if c.model_type == "olmo2":
        heads = c.need("num_attention_heads")
        d = c.get("head_dim") or h // heads
        extra = layers * d * (heads + (c.get("num_key_value_heads") or heads) - 2)
        notes.append(
            f"QK-norm weights counted per head (Qwen3's), OLMo 2's span all heads: {extra / 1e6:.2f}M parameters more"
        )
    stored = c.data.get("torch_dtype") or c.data.get("dtype")
    if stored and stored != "bfloat16":
        notes.append(f"checkpoint stored as {stored} (torch_dtype); planned in bf16 mixed precision unless --precision")
    quant = c.data.get("quantization_config")
    if isinstance(quant, dict):
        notes.append(
            f"checkpoint quantized ({quant.get('quant_method', '?')}); planned at 16 bits (--fp8 plans FP8 GEMMs)"
        )
    return notes
