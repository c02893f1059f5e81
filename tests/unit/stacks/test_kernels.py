"""The kernels a layer launches, per stack (planner/stacks/stack.py:Kernels, summed by
cost_models/compute.py:layer_kernels): each stack's count against the sum written out from its
code (the files its Kernels comment names), generic's against the operators `plan run`'s
executor really dispatches, and the fused stack's layer faster than an eager one's at the same
constants."""

from __future__ import annotations

import pytest

from cost_models.compute import expert_times, layer_compute, layer_kernels, memory_bound_time, moe_kernels
from hardware_profiles import load_cluster
from planner import api, load_model, stacks
from planner.specs import DType, JobSpec, Layout

TP8_SP = Layout(tp=8, sequence_parallel=True)

GPT3 = load_model("gpt3-175b")  # LayerNorm, GELU, learned positions, dropout, multi-head
LLAMA3 = load_model("llama3-70b")  # RMSNorm, SwiGLU, rotary, grouped-query (8 KV heads of 64)


def counts(target: str, model, flash: bool = True) -> tuple[int, int]:
    return layer_kernels(model, stacks.get(target).kernels, flash)


def test_megatron_launches_its_fused_kernels():
    # Megatron-Core + Transformer Engine: QKV, proj, fc1, fc2 (4 GEMMs); 2 norms; GeLU fused with
    # its bias (1); 2 bias-dropout-adds; fused attention (1)
    assert counts("megatron", GPT3) == (1, 4 + 2 + 1 + 2)
    # unfused: 2 batched GEMMs, FusedScaleMaskSoftmax (1), the probabilities' dropout (1)
    assert counts("megatron", GPT3, flash=False) == (2 + 1 + 1, 9)
    # Llama: fused RoPE on q and on k (2), bias-SwiGLU (1), cuDNN reads the 8 shared KV heads
    assert counts("megatron", LLAMA3) == (1, 4 + 2 + 2 + 1 + 2)


def test_torchtitan_launches_eager_kernels_with_a_fused_rmsnorm():
    # wq, wk, wv, wo, w1, w3, w2 (7); 2 fused RMSNorms; rotary 3 per tensor (6); silu, product (2);
    # 2 residual adds; the attention output made contiguous (1)
    assert counts("torchtitan", LLAMA3) == (1, 7 + 2 + 6 + 2 + 2 + 1)


@pytest.mark.parametrize("target", ["deepspeed", "accelerate"])
def test_a_transformers_model_launches_its_eager_kernels(target):
    # Llama: 7 projections; 2 LlamaRMSNorms of 8 eager ops (16); rotary 5 per tensor (10); act,
    # product (2); 2 residual adds; the transposed output made contiguous (1)
    assert counts(target, LLAMA3) == (1, 7 + 16 + 10 + 2 + 2 + 1)
    # GPT-style with dropout: 6 projections; 2 LayerNorms; GELU; 2 x (dropout + residual add); output copy
    assert counts(target, GPT3) == (1, 6 + 2 + 1 + 4 + 1)
    # eager attention: 2 matmuls, scale, mask, fp32 softmax, downcast, the probabilities' dropout
    assert counts(target, GPT3, flash=False)[0] == 2 + 4 + 1


def test_a_moe_layer_without_shared_experts_counts_no_dense_mlp():
    moe = load_model("mixtral-8x7b")
    assert moe.num_shared_experts == 0
    full, attention_only = (
        layer_kernels(moe, stacks.get("megatron").kernels, True),
        layer_kernels(moe, stacks.get("megatron").kernels, True, mlp=False),
    )
    assert full[1] - attention_only[1] == 2 + 1  # fc1, fc2 and the fused SwiGLU


MIXTRAL = load_model("mixtral-8x7b")  # 8 experts, top-2, SwiGLU, no bias, no shared expert
BIASED = MIXTRAL.model_copy(update={"linear_bias": True})  # GPT-OSS-style biased experts


def test_megatron_moe_launches_a_gemm_per_local_expert():
    # router 4, routing bookkeeping 7, permute 2, two all-to-alls, sort 1, inverse sort, all-to-all,
    # unpermute 3 (19); TE GroupedLinear: fc1 and fc2 one cuBLAS GEMM per local expert; the fused
    # weighted bias-SwiGLU (1); a biased expert's fc2 bias, product and add per local expert
    k = stacks.get("megatron").kernels
    assert moe_kernels(MIXTRAL, k, 16) == 19 + 16 * 2 + 1
    assert moe_kernels(BIASED, k, 16) == 19 + 16 * 2 + 1 + 16 * 2
    assert moe_kernels(MIXTRAL, k, 1) == 19 + 2 + 1


def test_torchtitan_moe_runs_grouped_gemms_whatever_the_local_experts():
    # 15 around the experts; torch._grouped_mm for w1, w3, w2 (3); silu and product (2)
    k = stacks.get("torchtitan").kernels
    assert moe_kernels(MIXTRAL, k, 1) == moe_kernels(MIXTRAL, k, 64) == 15 + 3 + 2


def test_a_transformers_moe_loops_over_its_experts():
    # 11 around the loop; per expert: where, gather, gate, up, down, silu, product, the weights'
    # gather, weighting, index_add
    for target in ("deepspeed", "accelerate"):
        assert moe_kernels(MIXTRAL, stacks.get(target).kernels, 8) == 11 + 8 * (3 + 2 + 5)


def test_a_megatron_moe_layer_pays_a_gap_per_local_expert():
    """At the same tokens and FLOPs per GPU, more local experts (lower ep) launch more GEMMs:
    the MoE part's time grows by 3 x (the launches' difference) x the gap (forward, and backward
    twice), beyond what the GEMM shapes change."""
    device = load_cluster("dgx-h100-80gb").device.model_copy(update={"kernel_overhead_us": 10.0})
    k = stacks.get("megatron").kernels
    no_gap = device.model_copy(update={"kernel_overhead_us": 0.0})

    def gaps(ep):
        with_gap = expert_times(MIXTRAL, device, DType.bf16, 1, 4096, 1, ep, kernels=k)
        without = expert_times(MIXTRAL, no_gap, DType.bf16, 1, 4096, 1, ep, kernels=k)
        return with_gap[0] + with_gap[1] - without[0] - without[1]

    assert gaps(1) == pytest.approx(3 * moe_kernels(MIXTRAL, k, 8) * 10e-6)
    assert gaps(1) - gaps(8) == pytest.approx(3 * 7 * 2 * 10e-6)


CLAMPED = BIASED.model_copy(update={"glu_limit": 7.0})  # GPT-OSS's clamped GLU


def test_a_clamped_glu_and_an_outside_bias_cost_their_passes():
    """Megatron-Core (fusions/fused_bias_geglu.py:weighted_bias_quick_geglu_impl) clamps the
    halves eagerly and concatenates them: 3 kernels, 8 passes over assignments x f forward, twice
    that backward; TEGroupedMLP._apply_bias: 6 passes over assignments x h each way. An eager
    stack's clamp is its two clamps: 2 kernels, 4 passes."""
    device = load_cluster("dgx-h100-80gb").device.model_copy(update={"kernel_overhead_us": 0.0})
    rows, f, h, e = 4096 * 2, MIXTRAL.moe_ffn, MIXTRAL.hidden_size, 2  # top-2 of one 4096-token sequence, bf16
    for target, kernels, passes, bias in (("megatron", 3, 8, 6), ("torchtitan", 2, 4, 0)):
        k = stacks.get(target).kernels
        assert moe_kernels(CLAMPED, k, 4) == moe_kernels(BIASED, k, 4) + kernels
        plain, biased, clamped = (
            expert_times(m, device, DType.bf16, 1, 4096, 1, 2, kernels=k) for m in (MIXTRAL, BIASED, CLAMPED)
        )
        clamp = memory_bound_time(device, passes * rows * f * e)
        assert (clamped[0] - biased[0], clamped[1] - biased[1]) == (pytest.approx(clamp), pytest.approx(2 * clamp))
        outside = memory_bound_time(device, bias * rows * h * e)
        assert (biased[0] - plain[0], biased[1] - plain[1]) == (pytest.approx(outside), pytest.approx(outside))


def test_megatron_rotates_a_yarn_scaled_embedding_in_eager_operators():
    """Megatron-Core's fused RoPE cannot apply YaRN's mscale (rope_utils.py:apply_rotary_pos_emb),
    so _apply_rotary_pos_emb_bshd runs: 12 kernels per tensor, 12 passes over q and k where the
    fused kernel makes 2; torchtitan folds the factor into its tables: nothing changes."""
    yarn = LLAMA3.model_copy(update={"rope_attention_factor": 1.35})
    assert counts("megatron", yarn) == (1, counts("megatron", LLAMA3)[1] - 2 + 24)
    assert counts("torchtitan", yarn) == counts("torchtitan", LLAMA3)
    device = load_cluster("dgx-h100-80gb").device.model_copy(update={"kernel_overhead_us": 0.0})

    def layer(m, target):
        return layer_compute(
            m, device, JobSpec(global_batch_size=1, seq_len=4096, precision="bf16", target=target), Layout()
        )

    q_and_k = 4096 * (8192 + 128 * 8) * 2  # 64 query heads and 8 key heads of 128, bf16
    extra = memory_bound_time(device, 10 * q_and_k)
    assert layer(yarn, "megatron").forward - layer(LLAMA3, "megatron").forward == pytest.approx(extra)
    assert layer(yarn, "torchtitan").forward == layer(LLAMA3, "torchtitan").forward
    # multi-latent attention: Megatron-Core's YaRN cache holds the factor and its fused MLA RoPE applies it
    dsv3 = load_model("deepseek-v3")
    assert counts("megatron", dsv3.model_copy(update={"rope_attention_factor": 1.35})) == counts("megatron", dsv3)


def test_the_fused_stack_runs_the_same_layer_faster_at_the_same_constants():
    """Same device constants, same layer: Megatron's fused QKV / gate+up GEMMs and fewer kernels
    against torchtitan's eager layer, and both faster than a Hugging Face model's."""
    device = load_cluster("dgx-h100-80gb").device
    slow_gaps = device.model_copy(update={"kernel_overhead_us": 10.0})
    times = {
        t: layer_compute(LLAMA3, slow_gaps, JobSpec(global_batch_size=1, seq_len=8192, target=t), TP8_SP)
        for t in ("megatron", "torchtitan", "deepspeed")
    }
    total = {t: c.forward + c.backward for t, c in times.items()}
    assert total["megatron"] < total["torchtitan"] < total["deepspeed"]
    # the difference beyond the GEMM shapes is the gaps: 3 x (kernels difference) x 10 us
    mt, tt = counts("megatron", LLAMA3), counts("torchtitan", LLAMA3)
    assert total["torchtitan"] - total["megatron"] >= 3 * (sum(tt) - sum(mt)) * 10e-6 * 0.999


# ------------------------------------------------------------------------------ the executor's


def _dispatched(block, x) -> list[str]:
    """The operators a forward pass dispatches that do work: views (aliases of their input)
    and detaches left out, what a GPU would launch as kernels."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(func)
            return func(*args, **(kwargs or {}))

    with Record() as record:
        block(x)
    return [
        f.__name__ for f in record.ops if not f.is_view and f.__name__ not in ("_unsafe_view.default", "detach.default")
    ]


@pytest.mark.parametrize("name", ["gpt3-175b", "llama2-7b", "llama3-70b"])
def test_generic_counts_the_kernels_the_executor_launches(name):
    torch = pytest.importorskip("torch")
    from planner.distributed.reference_model import Block

    spec = load_model(name)
    kv = 8 if spec.kv_heads == spec.num_heads else 2  # keep the model's grouping: MHA or GQA
    small = spec.model_copy(update=dict(hidden_size=64, num_heads=8, num_kv_heads=kv, ffn=128, max_seq_len=16))
    torch.manual_seed(0)
    block = Block(small).to(torch.bfloat16)
    ops = _dispatched(block, torch.randn(2, 16, 64, dtype=torch.bfloat16))
    # the executor has no dropout modules: count the model as it runs there
    core, rest = layer_kernels(small.model_copy(update={"dropout": False}), stacks.get("generic").kernels, True)
    assert len(ops) == core + rest, ops
    assert sum("scaled_dot_product" in o for o in ops) == core == 1


@pytest.mark.parametrize("experts", [4, 8])
@pytest.mark.parametrize("name", ["mixtral-8x7b", "qwen3-30b-a3b"])
def test_generic_counts_the_kernels_the_executors_moe_launches(name, experts):
    """The executor's MoE block (reference_model.py:MoE) with every expert local: the operators it
    dispatches against generic's moe_kernels, whose loop launches each expert's MLP."""
    torch = pytest.importorskip("torch")
    from planner.distributed.reference_model import MoE

    spec = load_model(name)
    small = spec.model_copy(
        update=dict(
            hidden_size=64,
            num_heads=8,
            num_kv_heads=2,
            ffn=128,
            moe_ffn_hidden_size=32,
            num_experts=experts,
            experts_per_token=2,
            max_seq_len=16,
        )
    )
    torch.manual_seed(0)
    ops = _dispatched(MoE(small).to(torch.bfloat16), torch.randn(2, 16, 64, dtype=torch.bfloat16))
    assert len(ops) == moe_kernels(small, stacks.get("generic").kernels, experts), ops


# ------------------------------------------------------------------------------ a job's attention kernel


def test_a_job_may_name_its_attention_kernel():
    """JobSpec.attention_kernel (`--attention-kernel`): a torchtitan / FSDP job on Transformer
    Engine's attention is priced with the device's cuDNN entry, as Megatron's is; None keeps
    the stack's; a kernel the device tables do not have is refused."""
    from cost_models.compute import attention_times
    from planner.specs import JobSpec
    from pydantic import ValidationError

    device = load_cluster("dgx-h100-80gb").device
    job = JobSpec(global_batch_size=1, seq_len=8192, precision="bf16", target="torchtitan")
    titan = layer_compute(LLAMA3, device, job, TP8_SP)
    titan_cudnn = layer_compute(LLAMA3, device, job.model_copy(update={"attention_kernel": "cudnn"}), TP8_SP)
    heads, d = LLAMA3.num_heads // 8, LLAMA3.head_dim
    diff = [
        a - b
        for a, b in zip(
            attention_times(device, DType.bf16, 1, heads, 8192, d, True, "flash2"),
            attention_times(device, DType.bf16, 1, heads, 8192, d, True, "cudnn"),
        )
    ]
    assert titan.forward - titan_cudnn.forward == pytest.approx(diff[0], rel=1e-9)
    assert titan.backward - titan_cudnn.backward == pytest.approx(diff[1], rel=1e-9)
    doc = api.estimate(
        "llama3-8b",
        "dgx-h100-80gb",
        gpus=8,
        global_batch=32,
        seq_len=4096,
        zero=3,
        target="torchtitan",
        attention_kernel="cudnn",
    )
    plain = api.estimate(
        "llama3-8b", "dgx-h100-80gb", gpus=8, global_batch=32, seq_len=4096, zero=3, target="torchtitan"
    )
    assert doc.job.attention_kernel == "cudnn" and plain.job.attention_kernel is None
    assert doc.estimate.step_time_s < plain.estimate.step_time_s
    back = api.what_if(doc, attention_kernel="flash2")
    assert "attention_kernel cudnn -> flash2" in back.changes
    assert back.document.estimate.step_time_s == pytest.approx(
        api.estimate(
            "llama3-8b",
            "dgx-h100-80gb",
            gpus=8,
            global_batch=32,
            seq_len=4096,
            zero=3,
            target="torchtitan",
            attention_kernel="flash2",
        ).estimate.step_time_s,
        rel=1e-12,
    )
    with pytest.raises(ValidationError, match="attention_kernel must be one of flash2, cudnn"):
        JobSpec(global_batch_size=8, seq_len=1024, attention_kernel="flash3")


def test_an_unknown_way_of_launching_experts_is_refused():
    from dataclasses import replace

    with pytest.raises(ValueError, match="grouped"):
        replace(stacks.get("megatron").kernels, experts="fused")
