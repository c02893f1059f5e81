"""The model: ModelSpec, a decoder-only transformer, and its enums (Activation, DType)."""

from __future__ import annotations

from enum import Enum
from typing import Optional

from pydantic import Field, field_validator, model_validator

from planner.specs.base import MAX_COUNT, MAX_LAYERS, MAX_SEQ_LEN, MAX_VOCAB, MAX_WIDTH, Integer, Real, _Spec


# --------------------------------------------------------------------------- enums


class Activation(str, Enum):
    """MLP flavour: GELU (two matrices, h -> f -> h), or a gated linear unit of three (gate, up,
    down: down(act(gate x) * up x)) whose gate goes through SiLU (SwiGLU: Llama, Mistral, Qwen)
    or tanh-approximated GELU (GeGLU: Gemma). The two gated ones cost the same: the same GEMMs
    and one elementwise activation (Shazeer 2020, "GLU Variants Improve Transformer")."""

    gelu = "gelu"
    swiglu = "swiglu"
    geglu = "geglu"


class DType(str, Enum):
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"


DTYPE_BYTES = {DType.fp32: 4, DType.bf16: 2, DType.fp16: 2}


# --------------------------------------------------------------------------- model


ROPE_TYPES = ("llama3", "yarn", "linear", "dynamic", "longrope")  # transformers' rope_type values, bar "default"


class RopeScaling(_Spec):
    """A rotary embedding's frequency scaling for a longer context. 'llama3' is Llama 3.1's
    (transformers' modeling_rope_utils.py:_compute_llama3_parameters; Megatron-Core's
    RotaryEmbedding._apply_scaling): wavelengths above original / low_freq_factor are divided by
    `factor`, those below original / high_freq_factor kept, the band between interpolated. The
    other types are named with their factor (YaRN's attention factor is rope_attention_factor);
    a stack's export writes a type it has or refuses it."""

    rope_type: str = Field(default="llama3", description=f"One of {', '.join(ROPE_TYPES)}.")
    factor: Real(1, 1e3) = Field(description="How much longer the context is than the original (Llama 3.1: 8).")
    low_freq_factor: Optional[Real(0, 1e3, open_lo=True)] = Field(default=None, description="'llama3': 1 where None.")
    high_freq_factor: Optional[Real(0, 1e3, open_lo=True)] = Field(default=None, description="'llama3': 4 where None.")
    original_max_position_embeddings: Optional[Integer(1, MAX_SEQ_LEN)] = Field(
        default=None, description="The context the model was trained with before scaling ('llama3': 8192 where None)."
    )
    # YaRN's (Peng et al. 2023; DeepSeek-V3: factor 40, beta_fast 32, beta_slow 1, mscale and
    # mscale_all_dim 1, original 4096): the correction range and the attention scales, None where
    # the config gives none
    beta_fast: Optional[Real(0, 1e6)] = Field(
        default=None, description="'yarn': the fast correction boundary (rotations)."
    )
    beta_slow: Optional[Real(0, 1e6)] = Field(
        default=None, description="'yarn': the slow correction boundary (rotations)."
    )
    mscale: Optional[Real(0, 1e3)] = Field(default=None, description="'yarn': the attention scale's coefficient.")
    mscale_all_dim: Optional[Real(0, 1e3)] = Field(
        default=None, description="'yarn': its coefficient over all dimensions."
    )

    def band(self) -> tuple:
        """'llama3's (low_freq_factor, high_freq_factor, original_max_position_embeddings)."""
        return (
            1.0 if self.low_freq_factor is None else self.low_freq_factor,
            4.0 if self.high_freq_factor is None else self.high_freq_factor,
            8192 if self.original_max_position_embeddings is None else self.original_max_position_embeddings,
        )

    @field_validator("rope_type")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in ROPE_TYPES:
            raise ValueError(f"rope_type must be one of {', '.join(ROPE_TYPES)}, not {v!r}")
        return v

    @model_validator(mode="after")
    def _band(self) -> "RopeScaling":
        low, high, _ = self.band()
        if self.rope_type == "llama3" and high <= low:
            raise ValueError(f"rope_scaling: high_freq_factor {high:g} must exceed low_freq_factor {low:g}")
        if self.rope_type != "llama3" and (self.low_freq_factor is not None or self.high_freq_factor is not None):
            raise ValueError(
                f"rope_scaling: low_freq_factor and high_freq_factor belong to rope_type 'llama3', not {self.rope_type!r}"
            )
        yarn = (self.beta_fast, self.beta_slow, self.mscale, self.mscale_all_dim)
        if self.rope_type != "yarn" and any(v is not None for v in yarn):
            raise ValueError(
                f"rope_scaling: beta_fast, beta_slow, mscale and mscale_all_dim belong to rope_type 'yarn', not {self.rope_type!r}"
            )
        return self


class ModelSpec(_Spec):
    """A decoder-only transformer (GPT / Llama family)."""

    name: str = Field(description="Model name, e.g. 'gpt3-175b'.")
    num_layers: Integer(1, MAX_LAYERS) = Field(description="Number of transformer layers (blocks).")
    hidden_size: Integer(1, MAX_WIDTH) = Field(description="Model width h.")
    num_heads: Integer(1, MAX_COUNT) = Field(description="Attention (query) heads a.")
    attention_head_dim: Optional[Integer(1, MAX_WIDTH)] = Field(
        default=None,
        description="Width of one attention head when it is not hidden_size / num_heads (Qwen3, GPT-OSS: the query and "
        "output projections are then h x (heads x head_dim)); None: hidden_size / num_heads (schema 1.4).",
    )
    num_kv_heads: Optional[Integer(1, MAX_COUNT)] = Field(
        default=None, description="Key/value heads for grouped-query attention; None means equal to num_heads (MHA)."
    )
    kv_lora_rank: Optional[Integer(1, MAX_WIDTH)] = Field(
        default=None,
        description="Multi-head latent attention (DeepSeek-V2/V3, Kimi K2): width of the compressed key-value latent that "
        "one down-projection makes from the input and per-head up-projections expand into keys and values (DeepSeek-V3: "
        "512); attention_head_dim is then each head's non-rotary query/key width. None: standard attention. (schema 1.9)",
    )
    q_lora_rank: Optional[Integer(1, MAX_WIDTH)] = Field(
        default=None,
        description="Multi-head latent attention: width of the query latent (DeepSeek-V3: 1536); None: the queries are "
        "projected from the input at full rank. (schema 1.9)",
    )
    qk_rope_head_dim: Integer(0, MAX_WIDTH) = Field(
        default=0,
        description="Multi-head latent attention: rotary features added to each query and key head, the key's shared by "
        "all heads and projected with the latent (DeepSeek-V3: 64). (schema 1.9)",
    )
    v_head_dim: Optional[Integer(1, MAX_WIDTH)] = Field(
        default=None,
        description="Multi-head latent attention: width of one value head; None: the head width. (schema 1.9)",
    )
    ffn_hidden_size: Optional[Integer(1, MAX_WIDTH)] = Field(
        default=None, description="MLP inner width f; None means 4*h (GPT convention)."
    )
    vocab_size: Integer(1, MAX_VOCAB) = Field(
        description="Vocabulary size V (padded, as the embedding table is allocated)."
    )
    max_seq_len: Integer(1, MAX_SEQ_LEN) = Field(
        description="Context length the model was trained with (learned position table size)."
    )
    activation: Activation = Field(
        default=Activation.gelu,
        description="MLP flavour: 'gelu' (2 matrices), 'swiglu' or 'geglu' (3 matrices: gate, up, down; 'geglu' schema 1.6).",
    )
    glu_limit: Optional[Real(0, 1e6, open_lo=True)] = Field(
        default=None,
        description="A gated MLP clamps its gate half from above and its linear half on both sides to this limit before "
        "the activation (GPT-OSS: swiglu_limit 7.0); None: no clamp. It costs element-wise passes over the activation's "
        "input. (schema 1.10)",
    )
    tied_embeddings: bool = Field(default=False, description="Input embedding and LM head share one matrix.")
    learned_position_embeddings: bool = Field(
        default=True, description="A learned position table of max_seq_len x h (GPT); False for rotary (Llama)."
    )
    linear_bias: bool = Field(default=True, description="Linear layers carry biases (GPT yes, Llama no).")
    rope_attention_factor: Real(0, 1e3, open_lo=True) = Field(
        default=1.0,
        description="Scale on the rotary embedding's cos and sin (YaRN's attention factor, 0.1 ln(factor) + 1 by Peng et "
        "al. 2023: GPT-OSS 1.347 for its factor 32); 1 without. Megatron-Core's fused RoPE kernel cannot apply it and "
        "rotates in eager operators instead. (schema 1.10)",
    )
    rope_theta: Real(1, 1e12) = Field(
        default=10000.0,
        description="Rotary base frequency theta (inverse frequencies theta^(-2i/d)): 10,000 unless the model says (Llama 3: "
        "500,000; Qwen2 and Mixtral: 1,000,000). It costs nothing; exports write it, so the stack trains this model. (schema 1.14)",
    )
    rope_scaling: Optional[RopeScaling] = Field(
        default=None,
        description="Llama 3.1's rotary frequency scaling (rope_type 'llama3' of a Hugging Face config); None: none. Costs "
        "nothing; exports write it or refuse. (schema 1.14)",
    )
    qkv_bias: bool = Field(
        default=False,
        description="Biases on the query, key and value projections only (Qwen2), with linear_bias false. (schema 1.14)",
    )
    norm: str = Field(default="layernorm", description="'layernorm' (weight+bias) or 'rmsnorm' (weight only).")
    norms_per_layer: Integer(2, 4) = Field(
        default=2,
        description="Norms of width h in a layer: 2 (before attention and before the MLP; OLMo 2 normalises their outputs "
        "instead, at the same cost), 4 (Gemma 2 and 3: before and after each). Each keeps its input for backward. (schema 1.6)",
    )
    qk_norm: bool = Field(
        default=False,
        description="Queries and keys are normalised per head before attention (Qwen3, Gemma 3, OLMo 2). (schema 1.6)",
    )
    sliding_window: Optional[Integer(1, MAX_SEQ_LEN)] = Field(
        default=None,
        description="Keys a query attends to in the sliding-window layers (Mistral 7B v0.1: 4096); None: full causal attention. (schema 1.6)",
    )
    sliding_window_layers: Integer(0, MAX_LAYERS) = Field(
        default=0,
        description="How many layers attend within sliding_window (Gemma 2: every other one); 0 without a window.",
    )
    logit_softcapping: bool = Field(
        default=False,
        description="The logits are soft-capped, c tanh(logits / c), before the loss (Gemma 2). (schema 1.6)",
    )
    dropout: bool = Field(
        default=True,
        description="Dropout after attention and MLP (stores 1-byte masks, Korthikanti et al.); Llama-style models train without.",
    )
    param_dtype: DType = Field(
        default=DType.bf16,
        description="Training precision when the job names none (16-bit mixed precision: bf16). A Hugging Face config's "
        "torch_dtype is the checkpoint's storage dtype, not this: such a model trains in bf16 unless told otherwise.",
    )
    num_experts: Optional[Integer(2, MAX_COUNT)] = Field(
        default=None,
        description="Mixture-of-experts: routed experts per MoE layer; None for a dense model (schema 1.4).",
    )
    experts_per_token: Optional[Integer(1, MAX_COUNT)] = Field(
        default=None, description="Routed experts each token goes to (top-k)."
    )
    moe_ffn_hidden_size: Optional[Integer(1, MAX_WIDTH)] = Field(
        default=None, description="Inner width of one expert's MLP; None means ffn_hidden_size."
    )
    num_shared_experts: Integer(0, 1_000) = Field(
        default=0, description="Experts every token goes to besides the routed ones (DeepSeek)."
    )
    first_dense_layers: Integer(0, MAX_LAYERS) = Field(
        default=0,
        description="The first k layers have a dense MLP of ffn_hidden_size instead of experts (DeepSeek-V3: 3).",
    )
    mtp_layers: Integer(0, MAX_LAYERS) = Field(
        default=0,
        description="Multi-token prediction (DeepSeek-V3 sec. 2.2): modules after the last layer, each predicting one token "
        "further: the next tokens' embeddings (the input table) and the previous depth's hidden states, each normalised, "
        "concatenated and projected 2h -> h, one transformer layer of the last layer's kind, and the shared LM head with "
        "its own loss. They run on the last pipeline stage (Megatron-Core). (schema 1.9)",
    )
    source: Optional[str] = Field(default=None, description="Where the numbers come from (paper, config file).")

    @field_validator("norm")
    @classmethod
    def _norm_kind(cls, v: str) -> str:
        if v not in ("layernorm", "rmsnorm"):
            raise ValueError(f"norm must be 'layernorm' or 'rmsnorm', not {v!r}")
        return v

    @model_validator(mode="after")
    def _shapes(self) -> "ModelSpec":
        if self.attention_head_dim is None and self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
        if self.num_heads % self.kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not divisible by num_kv_heads {self.kv_heads}")
        if self.num_experts is None:
            if self.experts_per_token or self.moe_ffn_hidden_size or self.num_shared_experts or self.first_dense_layers:
                raise ValueError(
                    "experts_per_token, moe_ffn_hidden_size, num_shared_experts and first_dense_layers need num_experts"
                )
        else:
            if self.experts_per_token is None or self.experts_per_token > self.num_experts:
                raise ValueError(
                    f"a mixture-of-experts model needs experts_per_token between 1 and num_experts ({self.num_experts})"
                )
            if self.first_dense_layers >= self.num_layers:
                raise ValueError(
                    f"first_dense_layers {self.first_dense_layers} leaves no MoE layer of {self.num_layers}"
                )
        if self.kv_lora_rank is None and (self.q_lora_rank or self.qk_rope_head_dim or self.v_head_dim):
            raise ValueError(
                "q_lora_rank, qk_rope_head_dim and v_head_dim describe multi-head latent attention: they need kv_lora_rank"
            )
        if self.kv_lora_rank is not None:
            if self.kv_heads != self.num_heads:
                raise ValueError(
                    "multi-head latent attention expands keys and values for every head: leave num_kv_heads out "
                    f"(or set it to num_heads, {self.num_heads})"
                )
            if self.attention_head_dim is None:
                raise ValueError(
                    "multi-head latent attention needs attention_head_dim, each head's non-rotary query/key width "
                    "(DeepSeek-V3: 128)"
                )
            if self.qk_norm:
                raise ValueError(
                    "multi-head latent attention normalises its latents, not per-head queries and keys: set qk_norm false"
                )
            if self.linear_bias:
                raise ValueError(
                    "multi-head latent attention is costed without biases (DeepSeek's and Megatron-Core's have none): "
                    "set linear_bias false"
                )
        if self.glu_limit is not None and not self.gated:
            raise ValueError("glu_limit clamps a gated MLP's halves: it needs activation 'swiglu' or 'geglu'")
        if self.learned_position_embeddings and (self.rope_theta != 10000.0 or self.rope_scaling is not None):
            raise ValueError(
                "rope_theta and rope_scaling describe a rotary embedding: they need learned_position_embeddings false"
            )
        if self.qkv_bias and self.linear_bias:
            raise ValueError(
                "qkv_bias is for a model whose other linear layers have no bias: with linear_bias true every "
                "layer has one already; drop qkv_bias"
            )
        if self.rope_attention_factor != 1.0 and self.learned_position_embeddings:
            raise ValueError(
                "rope_attention_factor scales a rotary embedding: it needs learned_position_embeddings false"
            )
        if self.sliding_window is None and self.sliding_window_layers:
            raise ValueError("sliding_window_layers needs sliding_window")
        if self.sliding_window is not None and not 0 < self.sliding_window_layers <= self.num_layers:
            raise ValueError(f"sliding_window needs sliding_window_layers between 1 and num_layers ({self.num_layers})")
        return self

    @property
    def gated(self) -> bool:
        """The MLP is a gated linear unit: gate, up and down matrices (SwiGLU, GeGLU)."""
        return Activation(self.activation) != Activation.gelu

    @property
    def is_moe(self) -> bool:
        return self.num_experts is not None

    @property
    def moe_ffn(self) -> int:
        """One expert's MLP width."""
        return self.moe_ffn_hidden_size or self.ffn

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def ffn(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def head_dim(self) -> int:
        return self.attention_head_dim or self.hidden_size // self.num_heads

    @property
    def mla(self) -> bool:
        """Multi-head latent attention (kv_lora_rank set)."""
        return self.kv_lora_rank is not None

    @property
    def qk_head_dim(self) -> int:
        """Width of one query (and key) head: head_dim, plus the rotary part under MLA."""
        return self.head_dim + self.qk_rope_head_dim

    @property
    def v_dim(self) -> int:
        """Width of one value head (and of one head's attention output)."""
        return self.v_head_dim or self.head_dim

    @property
    def q_width(self) -> int:
        """Width of the queries: heads x query head width."""
        return self.num_heads * self.qk_head_dim

    @property
    def out_width(self) -> int:
        """Width of the attention output before its projection: heads x value head width."""
        return self.num_heads * self.v_dim
