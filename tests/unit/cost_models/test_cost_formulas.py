"""The analytic cost model (cost_models/) checked against published formulas, with numbers.

Every test evaluates the published closed form itself (usually with exact rational
arithmetic) and compares it with what the library computes term by term, so a change in the
library's accounting makes the test fail.

Sources:
  [N21]  Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
         Clusters Using Megatron-LM" (eq. 2 parameters, eq. 3 FLOPs, sec. 2.2 schedules,
         sec. 3.2 communication).
  [K22]  Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
         Models" (Table 2 activation memory, sec. 4.2.3 interleaving, appendix FLOPs).
  [R20]  Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion
         Parameter Models" (sec. 3 / 5 model-state memory).
  [T05]  Thakur et al. 2005, ring collectives; NCCL-tests "bus bandwidth" convention.

Notation: a heads, b micro-batch, h hidden, L layers, s sequence, t TP degree, p pipeline
stages, m micro-batches, v interleaved chunks, V vocabulary, B global batch, N DP degree.
"""

from __future__ import annotations

from fractions import Fraction as Fr

import pytest

from cost_models import communication, compute, memory, pipeline
from cost_models.estimate import estimate
from cost_models.tables import mesh_links, pipeline_costs
from hardware_profiles import load_cluster
from planner.presets import load_model
from planner.specs import (
    Axis,
    Collective,
    CollectiveFit,
    DType,
    JobSpec,
    LinkTier,
    LossKernel,
    ModelSpec,
    Optimizer,
    Plan,
    Recompute,
    Schedule,
)

REL = 1e-12  # "exact" comparisons of floats that the library builds from integer terms
GIB = 2**30


# --------------------------------------------------------------------------- helpers


def gpt(L: int, h: int, a: int, V: int, s: int, *, dropout: bool = True, name: str = "gpt-test") -> ModelSpec:
    """A GPT-style model as in [N21]: GELU MLP of 4h, MHA, biases, LayerNorm, dropout,
    learned positions (max_seq_len = s) and tied input/output embeddings."""
    return ModelSpec(
        name=name,
        num_layers=L,
        hidden_size=h,
        num_heads=a,
        vocab_size=V,
        max_seq_len=s,
        activation="gelu",
        tied_embeddings=True,
        learned_position_embeddings=True,
        linear_bias=True,
        norm="layernorm",
        dropout=dropout,
    )


GPT3_175B = dict(L=96, h=12288, a=96, V=51200, s=2048)

# (L, h, a, V, s): GPT-3 175B, GPT-3 1.3B-like, and small / odd shapes.
GPT_SHAPES = [
    pytest.param(96, 12288, 96, 51200, 2048, id="gpt3-175b"),
    pytest.param(24, 2048, 16, 50257, 2048, id="gpt3-1.3b"),
    pytest.param(3, 40, 5, 997, 77, id="odd-3x40"),
    pytest.param(7, 120, 8, 1009, 129, id="odd-7x120"),
    pytest.param(1, 8, 1, 3, 5, id="tiny"),
]


@pytest.fixture(scope="module")
def a100():
    return load_cluster("dgx-a100-80gb")


# =========================================================================== 1. parameters


def narayanan_eq2_params(L: int, h: int, V: int, s: int) -> Fr:
    """[N21] eq. 2: P = 12 L h^2 (1 + 13/(12h) + (V + s)/(12 L h))."""
    return 12 * L * h**2 * (1 + Fr(13, 12 * h) + Fr(V + s, 12 * L * h))


@pytest.mark.parametrize("L,h,a,V,s", GPT_SHAPES)
def test_total_params_matches_narayanan_eq2_plus_final_layernorm(L, h, a, V, s):
    """[N21] eq. 2 counts the layers (12h^2 + 13h each), the tied V x h table and the s x h
    position table; it omits the final LayerNorm (weight + bias = 2h), which the library
    counts. So total_params == eq. 2 + 2h exactly."""
    model = gpt(L, h, a, V, s)
    expected = narayanan_eq2_params(L, h, V, s) + 2 * h
    assert expected.denominator == 1
    assert compute.total_params(model) == int(expected)


def test_gpt3_175b_preset_param_count():
    """GPT-3 175B (L=96, h=12288, V=51200, s=2048): eq. 2 gives 174,615,822,336
    ([N21] Table 1 lists 174.6B); the library adds the final LayerNorm's 2h = 24,576."""
    model = load_model("gpt3-175b")
    assert (model.num_layers, model.hidden_size, model.num_heads, model.vocab_size, model.max_seq_len) == (
        96,
        12288,
        96,
        51200,
        2048,
    )
    eq2 = narayanan_eq2_params(96, 12288, 51200, 2048)
    assert eq2 == 174_615_822_336
    assert compute.total_params(model) == 174_615_822_336 + 2 * 12288
    assert round(compute.total_params(model) / 1e9, 1) == 174.6


@pytest.mark.parametrize("L,h,a,V,s", GPT_SHAPES)
def test_layer_params_gpt_layer_is_12h2_plus_13h(L, h, a, V, s):
    """[N21] eq. 2, per layer: 12 h^2 (QKV 3h^2, projection h^2, MLP 8h^2) + 13 h
    (biases 3h + h + 4h + h, two LayerNorms 4h)."""
    lp = compute.layer_params(gpt(L, h, a, V, s), 1)
    assert lp.total == 12 * h**2 + 13 * h


@pytest.mark.parametrize(
    "preset,published",
    [
        ("llama2-7b", 6_738_415_616),  # Hugging Face meta-llama/Llama-2-7b-hf
        ("llama3-8b", 8_030_261_248),  # Hugging Face meta-llama/Meta-Llama-3-8B
    ],
)
def test_llama_presets_match_published_param_counts(preset, published):
    """Published totals (Hugging Face model cards / safetensors metadata), exact."""
    assert compute.total_params(load_model(preset)) == published


@pytest.mark.parametrize("h,a", [(12288, 96), (2048, 16), (120, 8), (64, 8)])
@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_layer_params_sharded_scale_as_one_over_tp(h, a, tp):
    """[N21] sec. 3.2 (Megatron TP): the column/row-parallel weights and the column-parallel
    biases (12h^2 + 7h) are split over t ranks; the row-parallel biases and the LayerNorms
    (2h + 4h) are replicated on every rank."""
    model = gpt(2, h, a, 1000, 64)
    full = compute.layer_params(model, 1)
    shard = compute.layer_params(model, tp)
    assert full.sharded == 12 * h**2 + 7 * h
    assert full.replicated == 6 * h
    assert shard.sharded * tp == full.sharded
    assert shard.replicated == full.replicated


# =========================================================================== 2. FLOPs


def korthikanti_model_flops(B: int, L: int, s: int, h: int, V: int) -> Fr:
    """[K22] appendix: model FLOPs = 72 B L s h^2 (1 + s/(6h) + V/(12 h L))."""
    return 72 * B * L * s * h**2 * (1 + Fr(s, 6 * h) + Fr(V, 12 * h * L))


def narayanan_eq3_flops(B: int, L: int, s: int, h: int, V: int) -> Fr:
    """[N21] eq. 3, full recomputation: F = 96 B s L h^2 (1 + s/(6h) + V/(16 L h))."""
    return 96 * B * s * L * h**2 * (1 + Fr(s, 6 * h) + Fr(V, 16 * L * h))


def selective_hardware_flops(B: int, L: int, s: int, h: int, V: int) -> Fr:
    """Model FLOPs plus one extra forward of QK^T and AV (4 b s^2 h per layer per
    micro-batch, i.e. 4 B L s^2 h = 72 B L s h^2 * s/(18h) over the step):
    72 B L s h^2 (1 + s/(6h) + s/(18h) + V/(12 h L)).

    NOTE: the shared reference README (quoting [K22]) writes "1 + s/(3h)" for selective
    recompute. That does not follow from counting the rerun QK^T and AV: their forward is
    4 b s^2 h per layer (2 b s^2 h each), which adds s/(18h), not s/(6h). We test the count.
    """
    return 72 * B * L * s * h**2 * (1 + Fr(s, 6 * h) + Fr(s, 18 * h) + Fr(V, 12 * h * L))


@pytest.mark.parametrize("L,h,a,V,s", GPT_SHAPES)
@pytest.mark.parametrize("B", [1, 3, 1536])
def test_model_flops_per_step_matches_korthikanti(L, h, a, V, s, B):
    """[K22]: 72 B L s h^2 (1 + s/(6h) + V/(12 h L))."""
    got = compute.model_flops_per_step(gpt(L, h, a, V, s), B, s)
    assert got == pytest.approx(float(korthikanti_model_flops(B, L, s, h, V)), rel=1e-9)


def test_layer_forward_flops_gpt_is_24bsh2_plus_4bs2h():
    """[N21] sec. 5.1: one GPT layer's forward is 24 b s h^2 + 4 b s^2 h FLOPs."""
    b, s, h = 3, 2048, 12288
    model = gpt(96, h, 96, 51200, s)
    assert compute.layer_flops_forward(model, b, s) == pytest.approx(24 * b * s * h**2 + 4 * b * s**2 * h, rel=REL)
    assert compute.attention_flops_forward(model, b, s) == pytest.approx(4 * b * s**2 * h, rel=REL)


# (model shape, plan) pairs for the estimate-level FLOP checks.
FLOP_CASES = [
    pytest.param(
        GPT3_175B, dict(dp=2, tp=8, pp=8, micro_batch_size=1, num_micro_batches=16), id="gpt3-175b-tp8-pp8-dp2"
    ),
    pytest.param(
        dict(L=7, h=120, a=8, V=1009, s=129),
        dict(dp=3, tp=2, pp=1, micro_batch_size=2, num_micro_batches=5),
        id="odd-7x120",
    ),
    pytest.param(
        dict(L=4, h=64, a=4, V=500, s=32),
        dict(dp=1, tp=1, pp=2, micro_batch_size=1, num_micro_batches=4),
        id="small-pp2",
    ),
]


def _estimate_flops(shape, plan_kw, recompute, cluster):
    model = gpt(shape["L"], shape["h"], shape["a"], shape["V"], shape["s"])
    plan = Plan(recompute=recompute, **plan_kw)
    B = plan.dp * plan.micro_batch_size * plan.num_micro_batches
    job = JobSpec(global_batch_size=B, seq_len=shape["s"])
    est = estimate(model, cluster, job, plan)
    hardware = est.hardware_tflops_per_gpu * est.step_time_s * plan.world_size * 1e12
    model_flops = est.model_tflops_per_gpu * est.step_time_s * plan.world_size * 1e12
    return B, est, hardware, model_flops


@pytest.mark.parametrize("shape,plan_kw", FLOP_CASES)
def test_estimate_hardware_flops_full_recompute_matches_narayanan_eq3(shape, plan_kw, a100):
    """[N21] eq. 3: with full recomputation each layer's forward runs twice,
    F = 96 B s L h^2 (1 + s/(6h) + V/(16 L h)) (the LM head is not recomputed)."""
    B, est, hardware, model_flops = _estimate_flops(shape, plan_kw, Recompute.full, a100)
    L, h, V, s = shape["L"], shape["h"], shape["V"], shape["s"]
    assert hardware == pytest.approx(float(narayanan_eq3_flops(B, L, s, h, V)), rel=1e-9)
    assert model_flops == pytest.approx(float(korthikanti_model_flops(B, L, s, h, V)), rel=1e-9)
    assert est.model_flops_per_step == pytest.approx(float(korthikanti_model_flops(B, L, s, h, V)), rel=1e-9)


@pytest.mark.parametrize("shape,plan_kw", FLOP_CASES)
def test_estimate_hardware_flops_selective_recompute_adds_attention_forward(shape, plan_kw, a100):
    """Selective recompute ([K22] sec. 4.2) reruns only QK^T, softmax, dropout and AV: the
    extra FLOPs are their forward, 4 b s^2 h per layer per micro-batch, so hardware FLOPs
    = 72 B L s h^2 (1 + s/(6h) + s/(18h) + V/(12 h L)) (see selective_hardware_flops for why
    this is not the README's s/(3h))."""
    B, est, hardware, model_flops = _estimate_flops(shape, plan_kw, Recompute.selective, a100)
    L, h, V, s = shape["L"], shape["h"], shape["V"], shape["s"]
    assert hardware - model_flops == pytest.approx(4 * B * L * s**2 * h, rel=1e-9)
    assert hardware == pytest.approx(float(selective_hardware_flops(B, L, s, h, V)), rel=1e-9)


@pytest.mark.parametrize("shape,plan_kw", FLOP_CASES)
def test_estimate_hardware_flops_without_recompute_equal_model_flops(shape, plan_kw, a100):
    """No recompute: hardware FLOPs = model FLOPs = [K22]'s 72 B L s h^2 (...)."""
    B, est, hardware, model_flops = _estimate_flops(shape, plan_kw, Recompute.none, a100)
    L, h, V, s = shape["L"], shape["h"], shape["V"], shape["s"]
    assert hardware == pytest.approx(float(korthikanti_model_flops(B, L, s, h, V)), rel=1e-9)
    assert model_flops == pytest.approx(hardware, rel=1e-12)


# =========================================================================== 3. activations

# [K22] Table 2, bytes per transformer layer (16-bit activations, 1-byte dropout masks).


def k22_no_parallelism(s, b, h, a):
    return s * b * h * (34 + Fr(5 * a * s, h))


def k22_tp(s, b, h, a, t):
    return s * b * h * (10 + Fr(24, t) + Fr(5 * a * s, h * t))


def k22_tp_sp(s, b, h, a, t):
    return s * b * h * (Fr(34, t) + Fr(5 * a * s, h * t))


def k22_tp_selective(s, b, h, a, t):
    return s * b * h * (10 + Fr(24, t))


def k22_tp_sp_selective(s, b, h, a, t):
    return Fr(34 * s * b * h, t)


def k22_full(s, b, h, a, t):
    return 2 * s * b * h


# (h, a, s) model shapes and micro-batch sizes; t in {1, 2, 4, 8} divides a and h.
ACT_SHAPES = [
    pytest.param(12288, 96, 2048, id="gpt3-175b"),
    pytest.param(2048, 16, 2048, id="gpt3-1.3b"),
    pytest.param(120, 8, 129, id="odd-120"),
    pytest.param(64, 8, 7, id="small-64"),
]
TPS = [1, 2, 4, 8]
MICRO = [1, 3]


def _acts(h, a, s, b, t, sp, recompute, flash=False, dropout=True):
    model = gpt(2, h, a, 1000, s, dropout=dropout)
    return memory.layer_activation_bytes(model, b, s, t, sp, recompute, flash_attention=flash)


@pytest.mark.parametrize("h,a,s", ACT_SHAPES)
@pytest.mark.parametrize("b", MICRO)
def test_activations_no_parallelism(h, a, s, b):
    """[K22] Table 2, no parallelism: s b h (34 + 5 a s / h)."""
    got = _acts(h, a, s, b, 1, False, Recompute.none)
    assert got == pytest.approx(float(k22_no_parallelism(s, b, h, a)), rel=REL)


@pytest.mark.parametrize("h,a,s", ACT_SHAPES)
@pytest.mark.parametrize("b", MICRO)
@pytest.mark.parametrize("t", TPS)
def test_activations_tensor_parallel(h, a, s, b, t):
    """[K22] Table 2, tensor parallel: s b h (10 + 24/t + 5 a s / (h t))."""
    got = _acts(h, a, s, b, t, False, Recompute.none)
    assert got == pytest.approx(float(k22_tp(s, b, h, a, t)), rel=REL)


@pytest.mark.parametrize("h,a,s", ACT_SHAPES)
@pytest.mark.parametrize("b", MICRO)
@pytest.mark.parametrize("t", [2, 4, 8])
def test_activations_tp_sequence_parallel(h, a, s, b, t):
    """[K22] Table 2, TP + sequence parallel: s b h (34/t + 5 a s / (h t))."""
    got = _acts(h, a, s, b, t, True, Recompute.none)
    assert got == pytest.approx(float(k22_tp_sp(s, b, h, a, t)), rel=REL)


@pytest.mark.parametrize("h,a,s", ACT_SHAPES)
@pytest.mark.parametrize("b", MICRO)
@pytest.mark.parametrize("t", TPS)
def test_activations_tp_selective(h, a, s, b, t):
    """[K22] Table 2, TP + selective recompute: s b h (10 + 24/t)."""
    got = _acts(h, a, s, b, t, False, Recompute.selective)
    assert got == pytest.approx(float(k22_tp_selective(s, b, h, a, t)), rel=REL)


@pytest.mark.parametrize("h,a,s", ACT_SHAPES)
@pytest.mark.parametrize("b", MICRO)
@pytest.mark.parametrize("t", [2, 4, 8])
def test_activations_tp_sp_selective(h, a, s, b, t):
    """[K22] Table 2, TP + SP + selective recompute: 34 s b h / t."""
    got = _acts(h, a, s, b, t, True, Recompute.selective)
    assert got == pytest.approx(float(k22_tp_sp_selective(s, b, h, a, t)), rel=REL)


@pytest.mark.parametrize("h,a,s", ACT_SHAPES)
@pytest.mark.parametrize("b", MICRO)
@pytest.mark.parametrize("t", TPS)
def test_activations_full_recompute(h, a, s, b, t):
    """[K22] Table 2, full recompute: only the layer input, 2 s b h (without SP, whatever t)."""
    got = _acts(h, a, s, b, t, False, Recompute.full)
    assert got == pytest.approx(float(k22_full(s, b, h, a, t)), rel=REL)


@pytest.mark.parametrize("t", [2, 4, 8])
def test_activations_full_recompute_with_sp_is_sharded(t):
    """With sequence parallelism the stored layer input is the 1/t sequence shard ([K22]
    sec. 4.2.2; the library's documented 2 s b h / t)."""
    h, a, s, b = 12288, 96, 2048, 1
    assert _acts(h, a, s, b, t, True, Recompute.full) == pytest.approx(2 * s * b * h / t, rel=REL)


@pytest.mark.parametrize("h,a,s", ACT_SHAPES)
@pytest.mark.parametrize("b", MICRO)
@pytest.mark.parametrize("t,sp", [(t, False) for t in TPS] + [(t, True) for t in TPS if t > 1])
def test_activations_flash_attention_keeps_only_logsumexp(h, a, s, b, t, sp):
    """A fused attention kernel (FlashAttention) stores no s x s scores, softmax or dropout
    mask: recompute=none equals the selective value plus the fp32 log-sum-exp per row,
    4 b (a/t) s bytes."""
    flash = _acts(h, a, s, b, t, sp, Recompute.none, flash=True)
    selective = _acts(h, a, s, b, t, sp, Recompute.selective, flash=False)
    expected_selective = (k22_tp_sp_selective if sp else k22_tp_selective)(s, b, h, a, t)
    assert selective == pytest.approx(float(expected_selective), rel=REL)
    assert flash == pytest.approx(float(expected_selective + 4 * b * Fr(a, t) * s), rel=REL)


@pytest.mark.parametrize("t,sp", [(1, False), (4, False), (8, True)])
@pytest.mark.parametrize(
    "kernel,kept,transient",
    [
        # eager: fp32 log-softmax saved ([K22]'s 4 s b V / t); 16-bit logits + fp32 gradient at backward
        (LossKernel.eager, 4, 2 + 4),
        # Megatron's vocab-parallel cross-entropy: fp32 softmax in place, 16-bit gradient cast
        (LossKernel.vocab_parallel, 4, 2),
        # a fused kernel (flash-attn): 16-bit logits saved, 16-bit gradient
        (LossKernel.fused, 2, 2),
    ],
)
def test_loss_bytes_per_logit(kernel, kept, transient, t, sp):
    """What the last stage holds for the loss, per logit of its V/t vocabulary shard, besides
    the final-norm and head inputs (2 x 2 s b h, / t with SP)."""
    model = load_model("gpt3-175b")
    s, b, V = 2048, 2, model.vocab_size
    shard = -(-V // t)
    head = memory.head_activation_bytes(model, b, s, t, sp, DType.bf16, kernel)
    assert head == pytest.approx(2 * 2 * s * b * model.hidden_size / (t if sp else 1) + kept * s * b * shard, rel=1e-3)
    assert memory.logits_temporary_bytes(model, b, s, t, DType.bf16, kernel) == pytest.approx(
        transient * s * b * shard, rel=1e-3
    )


def test_loss_kernel_defaults_to_the_targets():
    """Megatron runs its vocab-parallel cross-entropy; other stacks PyTorch's; a job may name its own."""
    job = JobSpec(global_batch_size=8, seq_len=1024)
    assert compute.loss_kernel(job) == LossKernel.eager
    assert compute.loss_kernel(job.model_copy(update={"target": "megatron"})) == LossKernel.vocab_parallel
    assert (
        compute.loss_kernel(JobSpec(global_batch_size=8, seq_len=1024, target="megatron", loss_kernel="fused"))
        == LossKernel.fused
    )


# =========================================================================== 4. in-flight micro-batches


@pytest.mark.parametrize("p", [1, 2, 4, 8])
@pytest.mark.parametrize("m", [1, 3, 4, 16])
def test_in_flight_1f1b_and_gpipe(p, m):
    """[N21] sec. 2.2: under 1F1B rank i runs p - i warm-up forwards, so it holds
    min(p - i, m) micro-batches; GPipe runs all m forwards first and holds m."""
    for i in range(p):
        assert memory.in_flight_micro_batches(Schedule.one_f_one_b, p, m, i) == min(p - i, m)
        assert memory.in_flight_micro_batches(Schedule.gpipe, p, m, i) == m


@pytest.mark.parametrize("p,v", [(2, 2), (4, 2), (4, 3), (8, 2), (8, 4)])
def test_in_flight_interleaved_first_rank(p, v):
    """Megatron's interleaved warm-up: 2 (p - r - 1) + (v - 1) p forwards, plus the first
    steady-state one, so rank r holds 2 (p - r - 1) + (v - 1) p + 1 chunk-micro-batches
    (m large). Each chunk has L/(p v) layers, so rank 0 holds
        (L/(p v)) (2(p - 1) + (v - 1) p + 1) = (L/(p v)) (p v + p - 1) = L (1 + (p - 1)/(p v))
    layers' worth: [K22] sec. 4.2.3 (there "m" denotes the interleaving chunks)."""
    m = 16 * p  # large
    for r in range(p):
        assert (
            memory.in_flight_micro_batches(Schedule.interleaved_1f1b, p, m, r, v) == 2 * (p - r - 1) + (v - 1) * p + 1
        )
    first = memory.in_flight_micro_batches(Schedule.interleaved_1f1b, p, m, 0, v)
    assert Fr(first, p * v) == 1 + Fr(p - 1, p * v)


# Interleaved vs 1F1B activation memory of the first pipeline rank, through `estimate`.
# dropout=False: the first stage has no embedding dropout mask, so rank 0 holds layers only.
INTERLEAVE_CASES = [
    pytest.param(dict(L=96, h=12288, a=96, s=2048), 4, 2, 8, 8, id="gpt3-175b-p4-v2"),
    pytest.param(dict(L=96, h=12288, a=96, s=2048), 8, 3, 1, 16, id="gpt3-175b-p8-v3-tp1"),
    pytest.param(dict(L=24, h=120, a=8, s=129), 3, 4, 2, 6, id="odd-p3-v4"),
    pytest.param(dict(L=16, h=64, a=4, s=32), 2, 8, 4, 4, id="small-p2-v8"),
]


@pytest.mark.parametrize("shape,p,v,t,m", INTERLEAVE_CASES)
@pytest.mark.parametrize("recompute", [Recompute.none, Recompute.selective])
def test_estimate_first_rank_activations_interleaved_vs_1f1b(shape, p, v, t, m, recompute, a100):
    """[K22] sec. 4.2.3: under 1F1B the first rank holds p micro-batches of its L/p layers,
    i.e. L layers' worth whatever p is; the interleaved schedule multiplies this by
    (1 + (p - 1)/(p v))."""
    L, h, a, s = shape["L"], shape["h"], shape["a"], shape["s"]
    assert L % (p * v) == 0
    model = ModelSpec(
        name="gpt-nodrop",
        num_layers=L,
        hidden_size=h,
        num_heads=a,
        vocab_size=1000,
        max_seq_len=s,
        tied_embeddings=True,
        dropout=False,
    )
    b = 1
    job = JobSpec(global_batch_size=b * m, seq_len=s, flash_attention=False)
    common = dict(dp=1, tp=t, pp=p, micro_batch_size=b, num_micro_batches=m, recompute=recompute)
    one = estimate(model, a100, job, Plan(schedule=Schedule.one_f_one_b, **common))
    inter = estimate(model, a100, job, Plan(schedule=Schedule.interleaved_1f1b, vpp=v, **common))

    per_layer = memory.layer_activation_bytes(model, b, s, t, False, recompute, flash_attention=False)
    a_1f1b = one.memory_gib_per_pipeline_rank[0].activations
    a_inter = inter.memory_gib_per_pipeline_rank[0].activations
    assert a_1f1b * GIB == pytest.approx(L * per_layer, rel=1e-9)
    assert a_inter * GIB == pytest.approx(L * per_layer * (1 + (p - 1) / (p * v)), rel=1e-9)
    assert a_inter / a_1f1b == pytest.approx(1 + (p - 1) / (p * v), rel=1e-9)


@pytest.mark.parametrize("p,m", [(4, 8), (4, 2), (8, 16)])
def test_estimate_1f1b_rank_activations(p, m, a100):
    """[N21] sec. 2.2: rank i (not the last, which also holds the LM head's activations) holds
    min(p - i, m) micro-batches of its L/p layers."""
    L, h, a, s, t = 32, 256, 8, 128, 2
    model = ModelSpec(
        name="gpt-nodrop", num_layers=L, hidden_size=h, num_heads=a, vocab_size=1000, max_seq_len=s, dropout=False
    )
    job = JobSpec(global_batch_size=m, seq_len=s, flash_attention=False)
    est = estimate(model, a100, job, Plan(dp=1, tp=t, pp=p, micro_batch_size=1, num_micro_batches=m))
    per_layer = memory.layer_activation_bytes(model, 1, s, t, False, Recompute.none, flash_attention=False)
    for i in range(p - 1):
        assert est.memory_gib_per_pipeline_rank[i].activations * GIB == pytest.approx(
            (L // p) * per_layer * min(p - i, m), rel=1e-9
        )


# =========================================================================== 5. ZeRO


PSI = 7_000_000_000


@pytest.mark.parametrize("N", [1, 2, 8, 64, 1024])
@pytest.mark.parametrize(
    "stage,formula",
    [
        (0, lambda psi, n: 16 * psi),
        (1, lambda psi, n: 4 * psi + Fr(12 * psi, n)),
        (2, lambda psi, n: 2 * psi + Fr(14 * psi, n)),
        (3, lambda psi, n: Fr(16 * psi, n)),
    ],
)
def test_zero_model_state_bytes(N, stage, formula):
    """[R20] mixed-precision Adam: 2 Psi (16-bit weights) + 2 Psi (16-bit grads) + 12 Psi
    (fp32 master, momentum, variance) = 16 Psi; stage 1: 4 Psi + 12 Psi/N;
    stage 2: 2 Psi + 14 Psi/N; stage 3: 16 Psi/N."""
    parts = memory.model_state_bytes(PSI, N, stage, DType.bf16, Optimizer.adam)
    assert sum(parts) == pytest.approx(float(formula(PSI, N)), rel=REL)


def test_zero_paper_example_7_5b_on_64_gpus():
    """[R20] Figure 1: Psi = 7.5B, N_d = 64: baseline 120 GB, P_os 31.4 GB, P_os+g 16.6 GB,
    P_os+g+p 1.9 GB (GB = 1e9 bytes)."""
    psi, n = 7.5e9, 64
    got = [sum(memory.model_state_bytes(psi, n, z, DType.fp16, Optimizer.adam)) / 1e9 for z in range(4)]
    assert [round(x, 1) for x in got] == [120.0, 31.4, 16.6, 1.9]


# =========================================================================== 6. pipeline


@pytest.mark.parametrize("p", [1, 2, 4, 8])
@pytest.mark.parametrize("m", [1, 4, 7, 32])
def test_pipeline_time_equal_stages(p, m):
    """[N21] sec. 2.2: p equal stages of t per micro-batch take (m + p - 1) t."""
    t = 0.37
    assert pipeline.pipeline_time([t] * p, p, m) == pytest.approx((m + p - 1) * t, rel=REL)


@pytest.mark.parametrize("p", [2, 4, 8])
@pytest.mark.parametrize("m", [4, 8, 32])
@pytest.mark.parametrize("v", [2, 3, 4])
def test_pipeline_time_interleaved(p, m, v):
    """[N21] sec. 2.2.2: with v chunks of t/v each the step takes (m + (p - 1)/v) t, i.e. the
    bubble shrinks to (p - 1)/(v m) of the ideal m t."""
    t = 0.37
    got = pipeline.pipeline_time([t / v] * (p * v), p, m, v)
    assert got == pytest.approx((m + (p - 1) / v) * t, rel=REL)
    assert (got - m * t) / (m * t) == pytest.approx(float(Fr(p - 1, v * m)), rel=1e-9)


@pytest.mark.parametrize(
    "stages,m",
    [([1.0, 2.0, 3.0], 5), ([0.5, 0.25, 0.75, 0.1], 1), ([2.0, 2.0, 1.0, 1.0, 3.0], 16), ([4.0], 3)],
)
def test_pipeline_time_unequal_stages(stages, m):
    """Unequal stages: the steady state runs at the slowest stage's pace and fill/drain costs
    one pass through all stages: T = sum_j S_j + (m - 1) max_j S_j."""
    got = pipeline.pipeline_time(stages, len(stages), m)
    assert got == pytest.approx(sum(stages) + (m - 1) * max(stages), rel=REL)


# =========================================================================== 7. communication


ALPHA_US = {
    Collective.all_reduce: 20.0,
    Collective.all_gather: 11.0,
    Collective.reduce_scatter: 13.0,
    Collective.p2p: 7.0,
    Collective.all_to_all: 9.0,
}
BW_GBPS = {
    Collective.all_reduce: 150.0,
    Collective.all_gather: 170.0,
    Collective.reduce_scatter: 160.0,
    Collective.p2p: 50.0,
    Collective.all_to_all: 40.0,
}
VOLUME = {
    Collective.all_reduce: lambda n: Fr(2 * (n - 1), n),
    Collective.all_gather: lambda n: Fr(n - 1, n),
    Collective.reduce_scatter: lambda n: Fr(n - 1, n),
    Collective.p2p: lambda n: Fr(1),
    Collective.all_to_all: lambda n: Fr(n - 1, n),  # nccl-tests' alltoall busbw: all but a rank's own piece
}


@pytest.fixture(scope="module")
def tier():
    return LinkTier(
        name="test link",
        collectives=[
            CollectiveFit(collective=c, latency_us=ALPHA_US[c], bandwidth_gbps=BW_GBPS[c]) for c in Collective
        ],
    )


def link_time(cluster, tier, collective, n, nbytes):
    """What the cost model charges: a group of n consecutive ranks filling one node of `tier`."""
    one_node = cluster.model_copy(update={"gpus_per_node": n, "intra_node": tier})
    return communication.GroupLink(one_node, n, 1).time(collective, nbytes)


@pytest.mark.parametrize("collective", list(Collective))
@pytest.mark.parametrize("n", [2, 3, 8, 64])
@pytest.mark.parametrize("nbytes", [1, 4096, 3 * 2**30])
def test_collective_time_alpha_beta_ring(tier, collective, n, nbytes, a100):
    """[T05] ring collectives, bus-bandwidth convention: alpha + k(n) bytes / B with
    k = 2(n-1)/n (all-reduce), (n-1)/n (all-gather, reduce-scatter, all-to-all), 1 (point-to-point)."""
    expected = ALPHA_US[collective] * 1e-6 + float(VOLUME[collective](n)) * nbytes / (BW_GBPS[collective] * 1e9)
    assert link_time(a100, tier, collective, n, nbytes) == pytest.approx(expected, rel=REL)


def test_collective_time_single_rank_is_free(tier, a100):
    for c in Collective:
        assert link_time(a100, tier, c, 1, 1e9) == 0.0


TP_CASES = [
    pytest.param(GPT3_175B, 1, 2048, id="gpt3-175b-b1"),
    pytest.param(dict(L=7, h=120, a=8, V=1009, s=129), 3, 129, id="odd-b3"),
]


@pytest.mark.parametrize("shape,b,s", TP_CASES)
@pytest.mark.parametrize("t", [2, 4, 8])
def test_tp_communication_four_all_reduces_per_layer(shape, b, s, t, a100):
    """[N21] sec. 3.2: per layer per micro-batch, TP does four all-reduces of b s h values
    (two forward, two backward); with a ring each device moves 8 b s h (t - 1)/t values.
    TP inside one node (tp innermost, t <= 8) uses the intra-node tier."""
    model = gpt(shape["L"], shape["h"], shape["a"], shape["V"], shape["s"])
    h = shape["h"]
    plan = Plan(dp=2, tp=t, pp=1, micro_batch_size=b, num_micro_batches=2)
    job = JobSpec(global_batch_size=2 * b * 2, seq_len=s)
    lc = pipeline_costs(model, a100, job, plan).layer
    one = link_time(a100, a100.intra_node, Collective.all_reduce, t, 2 * b * s * h)
    assert lc.tp_forward == pytest.approx(2 * one, rel=REL)
    assert lc.tp_backward == pytest.approx(2 * one, rel=REL)
    assert lc.tp_forward + lc.tp_backward == pytest.approx(4 * one, rel=REL)

    # Volume: subtract the four latencies (per call + ring steps), convert seconds back to 16-bit values.
    fit = a100.intra_node.fit(Collective.all_reduce, t)
    alpha = fit.latency_us + 2 * (t - 1) * a100.intra_node.hop_latency_us
    if a100.intra_node.tree_hop_latency_us is not None:
        alpha = min(alpha, fit.latency_us + 2 * (t - 1) * a100.intra_node.tree_hop_latency_us)
    values = (lc.tp_forward + lc.tp_backward - 4 * alpha * 1e-6) * fit.bandwidth_gbps * 1e9 / 2
    assert values == pytest.approx(float(8 * b * s * h * Fr(t - 1, t)), rel=1e-9)


@pytest.mark.parametrize("t", [2, 4, 8])
def test_tp_communication_sequence_parallel_same_volume(t, a100):
    """[K22] sec. 4.2.2: with sequence parallelism each all-reduce becomes an all-gather plus
    a reduce-scatter of the same buffer: four of each per layer per micro-batch."""
    b, s, h = 2, 2048, 12288
    model = gpt(96, h, 96, 51200, s)
    plan = Plan(dp=1, tp=t, pp=1, micro_batch_size=b, num_micro_batches=1, sequence_parallel=True)
    lc = pipeline_costs(model, a100, JobSpec(global_batch_size=b, seq_len=s), plan).layer
    ag = link_time(a100, a100.intra_node, Collective.all_gather, t, 2 * b * s * h)
    rs = link_time(a100, a100.intra_node, Collective.reduce_scatter, t, 2 * b * s * h)
    assert lc.tp_forward + lc.tp_backward == pytest.approx(4 * (ag + rs), rel=REL)


def test_tp_communication_none_without_tp(a100):
    model = gpt(4, 64, 4, 500, 32)
    lc = pipeline_costs(
        model,
        a100,
        JobSpec(global_batch_size=2, seq_len=32),
        Plan(dp=2, tp=1, pp=1, micro_batch_size=1, num_micro_batches=1),
    ).layer
    assert lc.tp_forward == lc.tp_backward == 0.0


@pytest.mark.parametrize("sp,t", [(False, 8), (True, 8), (True, 4)])
def test_pp_p2p_sends_sbh_values(sp, t, a100):
    """[N21] sec. 4.1: pipeline stages send b s h values per micro-batch; with Megatron's
    scatter/gather optimisation only the 1/t shard crosses nodes, all-gathered over NVLink
    on arrival (with sequence parallelism the shard is all a rank holds: no gather).
    With tp x dp = 8 GPUs inside a node and pp outermost, the send crosses nodes."""
    b, s, h = 1, 2048, 12288
    model = gpt(96, h, 96, 51200, s)
    plan = Plan(dp=8 // t, tp=t, pp=4, micro_batch_size=b, num_micro_batches=4, sequence_parallel=sp)
    ec = pipeline_costs(model, a100, JobSpec(global_batch_size=b * 4 * (8 // t), seq_len=s), plan).edge
    fit = a100.inter_node.fit(Collective.p2p, 2)
    shard = fit.latency_us * 1e-6 + 2 * b * s * h / t / (fit.bandwidth_gbps * 1e9)
    if sp:
        assert ec.p2p == pytest.approx(shard, rel=REL)
    else:
        gather = link_time(a100, a100.intra_node, Collective.all_gather, t, 2 * b * s * h)
        whole = fit.latency_us * 1e-6 + 2 * b * s * h / (fit.bandwidth_gbps * 1e9)
        assert ec.p2p == pytest.approx(min(whole, shard + gather), rel=REL)
        assert ec.p2p < 0.3 * whole  # InfiniBand carries 1/t of it


@pytest.mark.parametrize(
    "kw,expected",
    [
        # tp=8 innermost fills the 8-GPU node; dp and pp groups span nodes.
        (
            dict(dp=4, tp=8, pp=2, mesh_order=[Axis.tp, Axis.dp, Axis.pp]),
            {Axis.tp: False, Axis.dp: True, Axis.pp: True},
        ),
        # tp=4, dp=2 inside the node; pp across nodes.
        (
            dict(dp=2, tp=4, pp=4, mesh_order=[Axis.tp, Axis.dp, Axis.pp]),
            {Axis.tp: False, Axis.dp: False, Axis.pp: True},
        ),
        # dp innermost: dp=4 in the node, tp=8 at stride 4 spans 4 nodes.
        (
            dict(dp=4, tp=8, pp=1, mesh_order=[Axis.dp, Axis.tp, Axis.pp]),
            {Axis.tp: True, Axis.dp: False, Axis.pp: False},
        ),
        # pp innermost: pp=2 and tp=4 share a node (stride 2, extent 8); dp spans nodes.
        (
            dict(dp=2, tp=4, pp=2, mesh_order=[Axis.pp, Axis.tp, Axis.dp]),
            {Axis.tp: False, Axis.dp: True, Axis.pp: False},
        ),
        # tp=16 cannot fit in one 8-GPU node.
        (
            dict(dp=1, tp=16, pp=1, mesh_order=[Axis.tp, Axis.dp, Axis.pp]),
            {Axis.tp: True, Axis.dp: False, Axis.pp: False},
        ),
        # tp=2, dp=3: a dp group covers 6 consecutive ranks, and 8 % 6 != 0, so some dp
        # groups straddle two nodes (ranks 6..11); tp pairs never do.
        (
            dict(dp=3, tp=2, pp=1, mesh_order=[Axis.tp, Axis.dp, Axis.pp]),
            {Axis.tp: False, Axis.dp: True, Axis.pp: False},
        ),
        # tp=3 on 8-GPU nodes: ranks 6, 7, 8 form a group across two nodes.
        (
            dict(dp=8, tp=3, pp=1, mesh_order=[Axis.tp, Axis.dp, Axis.pp]),
            {Axis.tp: True, Axis.dp: True, Axis.pp: False},
        ),
    ],
)
def test_axis_spans_nodes(kw, expected, a100):
    """Ranks are laid out node by node (8 consecutive ranks per node); a group of an axis
    with stride S and degree d occupies S*d consecutive ranks, and stays inside a node for
    every group only if S*d divides the node size."""
    assert a100.gpus_per_node == 8
    links = mesh_links(a100, kw["dp"], kw["tp"], kw["pp"], kw["mesh_order"])
    for axis, spans in expected.items():
        assert links[axis].inter_node is spans, axis
