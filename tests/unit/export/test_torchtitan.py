"""`plan export --to torchtitan`: the overrides go through torchtitan 0.3.0's own parser
(ConfigManager.parse_args: tyro over the config_registry's Trainer.Config, with its
__post_init__ checks), its ParallelDims (degrees x world size, and the device mesh built on a
fake process group), its model config's checks (Decoder.Config.update_from_config), its
pipeline split and schedule builder (pipeline_parallel.py, with torch's schedules); broken
overrides are rejected by the same code; the overrides read back to the plan; plans torchtitan
cannot run are refused naming the feature. The exporter, RULES and the refusals are tested
without torchtitan too."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from planner import stacks as exporters
from planner.errors import UsageError
from planner.export import torchtitan as tt
from planner.stacks.torchtitan import rules as tt_rules
from planner.presets import load_model
from planner.specs import Axis, JobSpec, Plan, StageRecompute
from tests.paths import HF_CONFIGS

EXTRA = "the export extra is not installed: pip install '.[export]'"
HF = HF_CONFIGS  # published Hugging Face configs (SOURCES.md)
BASE = [
    "--module",
    "llama3",
    "--config",
    "llama3_8b",
]  # a base config for generic exports (their overrides are model-free)
MOE_BASE = [
    "--module",
    "qwen3",
    "--config",
    "qwen3_30b_a3b",
]  # ... for generic mixture-of-experts exports (128 experts)


def case(
    model: str,
    gpus: int,
    dp: int,
    tp: int,
    pp: int,
    mbs: int,
    m: int,
    *,
    zero=3,
    vpp=1,
    schedule="1f1b",
    sp=None,
    overlap=False,
    recompute="none",
    precision="bf16",
    seq=4096,
    **plan_fields,
):
    """A valid (model, plan, job, gpus) for one layout; SP on with TP unless told otherwise."""
    spec = load_model(model)
    plan = Plan(
        dp=dp,
        tp=tp,
        pp=pp,
        vpp=vpp,
        micro_batch_size=mbs,
        num_micro_batches=m,
        schedule=schedule,
        zero_stage=zero,
        sequence_parallel=tp > 1 if sp is None else sp,
        tp_comm_overlap=overlap,
        recompute=recompute,
        **plan_fields,
    )
    job = JobSpec(
        global_batch_size=dp * mbs * m, seq_len=min(seq, spec.max_seq_len), precision=precision, target="torchtitan"
    )
    plan.validate_for(spec, job, gpus)
    return SimpleNamespace(model=spec, plan=plan, job=job, gpus=gpus)


# Every ZeRO stage torchtitan has (0 replicate, 2 never reshard, 3 full shard) with and without
# TP and PP, SP on and off, async TP, each schedule (Interleaved1F1B with vpp 1 and 2), uneven
# splits, none and full recompute (also given per stage), bf16 and fp32, dp = 1, each llama3
# config, and generic models (a Llama-like and a GPT).
MATRIX = {
    "8b-fsdp3-dp16": case("llama3-8b", 16, 16, 1, 1, 2, 2),
    "8b-zero2-tp4-overlap-full": case("llama3-8b", 16, 4, 4, 1, 1, 4, zero=2, overlap=True, recompute="full"),
    "8b-zero0-tp2-no-sp-fp32": case("llama3-8b", 16, 8, 2, 1, 1, 2, zero=0, sp=False, precision="fp32"),
    "8b-fsdp3-tp4-pp2-1f1b": case("llama3-8b", 16, 2, 4, 2, 1, 32, recompute="full"),
    "8b-zero2-tp2-pp4-gpipe-uneven": case(
        "llama3-8b", 16, 2, 2, 4, 2, 3, zero=2, schedule="gpipe", layers_per_stage=[5, 9, 9, 9]
    ),
    "8b-zero0-pp4-interleaved-vpp1": case("llama3-8b", 8, 2, 1, 4, 1, 8, zero=0, schedule="interleaved-1f1b"),
    "8b-one-rank-dp-tp8-fsdp3": case("llama3-8b", 8, 1, 8, 1, 4, 2),
    "70b-fsdp3-tp8-pp4-vpp2-uneven-full": case(
        "llama3-70b",
        64,
        2,
        8,
        4,
        1,
        8,
        vpp=2,
        schedule="interleaved-1f1b",
        layers_per_stage=[9, 10, 10, 11, 10, 10, 10, 10],
        recompute="full",
    ),
    "70b-zero0-tp8-pp4-full-per-stage": case(
        "llama3-70b", 32, 1, 8, 4, 1, 4, zero=0, recompute="full", stage_recompute=[StageRecompute(full=20)] * 4
    ),
    "405b-fsdp3-tp8-pp8-vpp2-overlap": case(
        "llama3-405b", 128, 2, 8, 8, 1, 16, vpp=2, schedule="interleaved-1f1b", overlap=True, recompute="full"
    ),
    "llama2-7b-generic-zero2-tp2-pp2": case("llama2-7b", 8, 2, 2, 2, 2, 4, zero=2),
    "gpt3-1.3b-generic-zero0-fp32": case("gpt3-1.3b", 8, 8, 1, 1, 4, 2, zero=0, precision="fp32", seq=2048),
    # Mixture of experts: ep 1, 2, 4, 8; EP folded from dp_shard x tp (ep > tp) with a pipeline;
    # ZeRO-0 with ep = tp; torchtitan's own MoE configs (DeepSeek-V3 with its dense first layers
    # on the first stage, Qwen3 with TP + SP and interleaving) and a generic one (Mixtral).
    "mixtral-generic-fsdp3-ep8": case("mixtral-8x7b", 8, 8, 1, 1, 1, 2, ep=8),
    "mixtral-generic-fsdp3-ep1": case("mixtral-8x7b", 8, 8, 1, 1, 1, 2),
    "mixtral-generic-zero2-ep4-tp2-pp2": case("mixtral-8x7b", 16, 4, 2, 2, 1, 8, zero=2, ep=4, recompute="full"),
    "mixtral-generic-zero0-ep2-tp2": case("mixtral-8x7b", 8, 4, 2, 1, 1, 2, zero=0, ep=2),
    "deepseek-v3-fsdp3-ep8-pp4-uneven": case(
        "deepseek-v3", 64, 16, 1, 4, 1, 8, ep=8, layers_per_stage=[13, 16, 16, 16], recompute="full"
    ),
    # Qwen3-30B-A3B as its Hugging Face config reads (QK-norm: torchtitan's qwen3 config); the
    # preset, which leaves QK-norm out, is generic.
    "qwen3-30b-a3b-fsdp3-ep8-tp2-pp2-vpp2": case(
        str(HF / "qwen3-30b-a3b.json"), 32, 8, 2, 2, 1, 8, ep=8, vpp=2, schedule="interleaved-1f1b"
    ),
    "qwen3-30b-a3b-preset-generic-fsdp3-ep8": case("qwen3-30b-a3b", 8, 8, 1, 1, 1, 2, ep=8),
    # Context parallelism: cp 2 and 4, with dp, TP + SP, pipelines (1F1B, interleaved), ZeRO-2
    # and 3, and experts borrowed from dp_shard x cp x tp. (FP8: refused, see RULES.)
    "8b-cp2-fsdp3-dp4-tp2": case("llama3-8b", 16, 4, 2, 1, 1, 2, cp=2, seq=8192),
    "8b-cp4-zero2-dp2-pp2-full": case("llama3-8b", 16, 2, 1, 2, 1, 4, zero=2, cp=4, seq=16384, recompute="full"),
    "70b-cp2-fsdp3-tp8-pp2-vpp2-full": case(
        "llama3-70b", 64, 2, 8, 2, 1, 8, vpp=2, schedule="interleaved-1f1b", cp=2, seq=32768, recompute="full"
    ),
    "mixtral-generic-cp2-ep8-fsdp3": case("mixtral-8x7b", 8, 4, 1, 1, 1, 2, ep=8, cp=2, seq=8192),
    # Hybrid sharding (HSDP): replicas of a shard group beside TP, of a dp_shard x cp group with a
    # pipeline (ZeRO-2), and experts borrowed from the shard group.
    "8b-hsdp3-shard4-dp8-tp2": case("llama3-8b", 16, 8, 2, 1, 1, 2, dp_shard=4),
    "8b-hsdp2-shard2-dp4-cp2-pp2": case("llama3-8b", 16, 4, 1, 2, 1, 4, zero=2, dp_shard=2, cp=2, seq=8192),
    "mixtral-generic-hsdp3-shard4-ep4": case("mixtral-8x7b", 16, 16, 1, 1, 1, 1, ep=4, dp_shard=4),
}


def _export(c):
    return exporters.export("torchtitan", c.plan, c.model, c.job, c.gpus)


def _expected(c) -> dict:
    """What read_back must return: the plan's own fields."""
    p, pipeline = c.plan, c.plan.pp > 1
    return {
        "dp": p.dp,
        "dp_shard": p.dp_shard,
        "tp": p.tp,
        "pp": p.pp,
        "vpp": p.vpp,
        "micro_batch_size": p.micro_batch_size,
        "num_micro_batches": p.num_micro_batches,
        "global_batch_size": c.job.global_batch_size,
        "seq_len": c.job.seq_len,
        "zero_stage": p.zero_stage,
        "sequence_parallel": p.sequence_parallel,
        "tp_comm_overlap": p.tp_comm_overlap,
        "layers_per_stage": p.stage_layers(c.model.num_layers) if pipeline else None,
        "recompute": tt.recompute_mode(p, c.model).value,
        "precision": c.job.precision.value,
        "mesh_order": [a.value for a in p.mesh_order],
        "ep": p.ep,
        "cp": p.cp,
    }


def _compare(got: dict, c) -> None:
    want = _expected(c)
    assert {k: got[k] for k in want} == want
    if c.plan.pp > 1:
        assert got["schedule"] == c.plan.schedule.value


# --------------------------------------------------------------------------- without torchtitan


def test_rules_state_what_torchtitan_0_3_expresses():
    r = tt_rules.RULES
    assert r.zero_stages == r.zero_stages_with_pp == r.zero_stages_with_tp == (0, 2, 3)
    assert r.max_pp is None and r.max_tp is None and r.interleaved and r.sequence_parallel and r.tp_comm_overlap
    assert set(r.schedules) == set(tt._SCHEDULES)
    assert r.mesh_orders == ((Axis.tp, Axis.dp, Axis.pp),)
    assert (r.split, r.recompute, r.recompute_modes) == ("free", "uniform", ("none", "full"))
    assert r.max_ep is None and "ep = tp" in r.notes["experts"]
    assert r.max_cp is None and "all-gathers K/V" in r.notes["context parallelism"]
    assert not r.fp8 and "rowwise" in r.notes["FP8"]


def test_the_exporter_imports_no_torch():
    code = "import sys, planner.export.torchtitan; sys.exit(any(m.split('.')[0] in ('torch', 'torchtitan', 'tyro') for m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_llama3_presets_get_their_config_and_others_are_generic():
    assert tt_rules.matching_flavor(load_model("llama3-8b")).config == "llama3_8b"
    assert tt_rules.matching_flavor(load_model("llama3-70b")).config == "llama3_70b"
    assert tt_rules.matching_flavor(load_model("llama3-405b")).config == "llama3_405b"
    assert tt_rules.matching_flavor(load_model("llama2-7b")) is None  # other shape
    assert tt_rules.matching_flavor(load_model("gpt3-1.3b")) is None  # GELU, LayerNorm, learned positions
    assert (
        tt_rules.matching_flavor(load_model("deepseek-v3")).module,
        tt_rules.matching_flavor(load_model("deepseek-v3")).config,
    ) == ("deepseek_v3", "deepseek_v3_671b")
    qwen3 = load_model(str(HF / "qwen3-30b-a3b.json"))
    assert tt_rules.matching_flavor(qwen3).config == "qwen3_30b_a3b"
    assert tt_rules.matching_flavor(load_model("qwen3-30b-a3b")) is not None  # the preset has Qwen3's QK-norm too
    assert tt_rules.matching_flavor(load_model("mixtral-8x7b")) is None  # torchtitan 0.3.0 has no Mixtral
    narrow = qwen3.model_copy(update={"attention_head_dim": None})  # heads of 64: not Qwen3's
    assert tt_rules.matching_flavor(narrow) is None
    generic = _export(MATRIX["llama2-7b-generic-zero2-tp2-pp2"])
    assert "--module" not in generic.data and "--config" not in generic.data
    assert "--module YOUR_MODULE --config YOUR_CONFIG" in generic.text and "32 layers, hidden 4096" in generic.text


@pytest.mark.parametrize("name", list(MATRIX))
def test_the_text_is_a_bash_array_of_the_data(name):
    """Shell-ready: bash reads the text's TORCHTITAN_ARGS back as exactly `data`."""
    out = _export(MATRIX[name])
    assert out.kind == "args" and out.stack == "torchtitan" and all(isinstance(a, str) for a in out.data)
    script = out.text + 'printf "%s\\n" "${TORCHTITAN_ARGS[@]}"\n'
    printed = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout
    assert printed.splitlines() == out.data


@pytest.mark.parametrize("name", list(MATRIX))
def test_argv_reads_back_to_the_plan(name):
    c = MATRIX[name]
    _compare(tt.read_back(_export(c).data), c)


def test_zero_stages_map_to_replicate_and_reshard():
    def settings(c):
        d = _export(c).data
        return tuple(
            d[d.index(k) + 1]
            for k in (
                "--parallelism.data_parallel_replicate_degree",
                "--parallelism.data_parallel_shard_degree",
                "--parallelism.fsdp_reshard_after_forward",
            )
        )

    assert settings(MATRIX["8b-zero0-tp2-no-sp-fp32"]) == ("8", "1", "default")
    assert settings(MATRIX["8b-zero2-tp4-overlap-full"]) == ("1", "4", "never")
    assert settings(MATRIX["8b-fsdp3-dp16"]) == ("1", "16", "always")
    assert settings(MATRIX["8b-hsdp3-shard4-dp8-tp2"]) == ("2", "4", "always")  # HSDP: 2 replicas of 4
    assert settings(MATRIX["8b-hsdp2-shard2-dp4-cp2-pp2"]) == ("2", "2", "never")


def test_pipeline_batch_is_one_schedule_without_accumulation():
    c = MATRIX["8b-fsdp3-tp4-pp2-1f1b"]
    d = _export(c).data
    assert d[d.index("--training.local_batch_size") + 1] == "32"  # 32 micro-batches of 1 in one schedule
    assert d[d.index("--parallelism.pipeline_parallel_microbatch_size") + 1] == "1"
    assert "--training.disable_cuda_graphs" in d and d[-1] == "activation-checkpoint:full"


def test_read_back_refuses_what_is_none_of_our_fields():
    d = _export(MATRIX["8b-fsdp3-dp16"]).data
    with pytest.raises(ValueError, match="per-op SAC"):
        tt.read_back(d[:-1] + ["activation-checkpoint:selective"])
    with pytest.raises(ValueError, match="not a multiple of local batch"):
        tt.read_back(_with(d, "--training.global_batch_size", "50"))


def _with(argv: list[str], key: str, value: str) -> list[str]:
    out = list(argv)
    out[out.index(key) + 1] = value
    return out


def _refusal(c, **changes) -> str:
    plan = Plan.model_validate({**c.plan.model_dump(), **changes.pop("plan", {})})
    job = JobSpec.model_validate({**c.job.model_dump(), **changes.pop("job", {})})
    with pytest.raises(UsageError) as err:
        exporters.export("torchtitan", plan, changes.pop("model", c.model), job, c.gpus)
    return str(err.value)


@pytest.mark.parametrize(
    "update",
    [
        {"qk_norm": True},
        {"norms_per_layer": 4},
        {"sliding_window": 4096, "sliding_window_layers": 32},
        {"logit_softcapping": True},
    ],
    ids=["qk-norm", "four-norms", "window", "softcapping"],
)
def test_a_llama_shape_with_more_is_no_llama3_config(update):
    """torchtitan's llama3_8b builds no QK-norm, two norms a layer, full attention and plain
    logits: Llama 3 8B's shape with any of those is generic, its text naming what to build."""
    model = load_model("llama3-8b").model_copy(update=update)
    assert (
        tt_rules.matching_flavor(load_model("llama3-8b")).config == "llama3_8b"
        and tt_rules.matching_flavor(model) is None
    )
    c = MATRIX["8b-fsdp3-dp16"]
    text = exporters.export("torchtitan", c.plan, model, c.job, c.gpus).text
    component = {
        "qk_norm": "GQAttention.Config.qk_norm",
        "norms_per_layer": "post_attention_norm",
        "sliding_window": "a 4096-key sliding window on every layer (32)",
        "logit_softcapping": "SoftCappedLinear",
    }
    assert "--module YOUR_MODULE" in text and component[next(iter(update))] in text


def test_geglu_is_refused_in_one_line():
    """No torchtitan 0.3.0 feed-forward gates through GELU (Gemma 2, 3): refused whatever the plan."""
    c = MATRIX["8b-fsdp3-dp16"]
    with pytest.raises(
        UsageError, match=r"^torchtitan cannot build gemma-2-9b: activation geglu .*; deepspeed, accelerate can"
    ) as err:
        exporters.export("torchtitan", c.plan, load_model(str(HF / "gemma-2-9b.json")), c.job, c.gpus)
    assert "\n" not in str(err.value)
    assert (
        tt_rules.model_problems(load_model(str(HF / "gpt-oss-120b.json"))) == []
    )  # windows on half the layers: its own config says which


def test_plans_torchtitan_cannot_run_are_refused_naming_the_feature():
    dp16, tp4, pp = MATRIX["8b-fsdp3-dp16"], MATRIX["8b-zero2-tp4-overlap-full"], MATRIX["8b-fsdp3-tp4-pp2-1f1b"]
    assert "ZeRO stage 1" in _refusal(dp16, plan={"zero_stage": 1})
    hybrid = MATRIX["8b-hsdp3-shard4-dp8-tp2"]  # no ZeRO-1 at all, so no hybrid ZeRO-1 either
    assert "ZeRO stage 1 (torchtitan has stages 0, 2, 3) (and 1 more)" in _refusal(hybrid, plan={"zero_stage": 1})
    zero1 = Plan.model_validate({**hybrid.plan.model_dump(), "zero_stage": 1})
    assert tt_rules.RULES.layout_problems(zero1.layout)[1] == (
        "hybrid sharding dp_shard=4 with ZeRO stage 1 (torchtitan has it with stages 2, 3)"
    )
    assert "selective recompute" in _refusal(dp16, plan={"recompute": "selective"})
    mixed = [StageRecompute(none=8, full=8), StageRecompute(full=16)]
    assert "recompute mixing modes" in _refusal(pp, plan={"recompute": "mixed", "stage_recompute": mixed})
    assert "mesh order dp,tp,pp" in _refusal(tp4, plan={"mesh_order": [Axis.dp, Axis.tp, Axis.pp]})
    assert "fp16 precision" in _refusal(dp16, job={"precision": "fp16"})
    assert "optimizer sgd" in _refusal(dp16, job={"optimizer": "sgd"})
    assert "seq_len 4090 with sequence parallelism over tp=4" in _refusal(tp4, job={"seq_len": 4090})
    assert "1F1B with 2 micro-batches on 4 pipeline ranks" in _refusal(
        MATRIX["8b-zero2-tp2-pp4-gpipe-uneven"], plan={"schedule": "1f1b", "num_micro_batches": 2}
    )
    gpt = MATRIX["gpt3-1.3b-generic-zero0-fp32"]
    assert "tied embeddings with pipeline parallelism" in _refusal(gpt, plan={"dp": 4, "pp": 2})
    moe = MATRIX["mixtral-generic-zero0-ep2-tp2"]
    assert "tp=2 and ep=1 (torchtitan then shards the experts over TP" in _refusal(moe, plan={"ep": 1, "zero_stage": 3})
    assert "expert parallelism ep=4 with ZeRO-0" in _refusal(moe, plan={"ep": 4})
    cp = MATRIX["8b-cp2-fsdp3-dp4-tp2"]
    assert "context parallelism cp=2 with ZeRO-0 (torchtitan always FSDP-shards" in _refusal(cp, plan={"zero_stage": 0})
    assert (
        "seq_len 8196 with context parallelism cp=2 and sequence parallelism over tp=2 (torchtitan needs seq_len divisible by 8)"
        in _refusal(cp, job={"seq_len": 8196})
    )
    assert "seq_len 8194 with context parallelism cp=2 (torchtitan needs seq_len divisible by 4)" in _refusal(
        cp, plan={"sequence_parallel": False}, job={"seq_len": 8194}
    )
    assert "FP8 GEMMs (this export of torchtitan has no FP8 recipe)" in _refusal(dp16, plan={"fp8": True})
    deepseek = MATRIX["deepseek-v3-fsdp3-ep8-pp4-uneven"]  # the 671B config's RoPE covers 16,384 positions
    assert "seq_len 32768 beyond the 16384 RoPE positions of torchtitan's deepseek_v3_671b" in _refusal(
        deepseek, model=deepseek.model.model_copy(update={"max_seq_len": 32768}), job={"seq_len": 32768}
    )
    seventy = MATRIX["70b-zero0-tp8-pp4-full-per-stage"]  # tp=16 x 8 KV heads: our tp_problem allows it, torchtitan not
    assert "tp=16 over the 8 KV heads" in _refusal(seventy, plan={"tp": 16, "pp": 2, "stage_recompute": None})


# --------------------------------------------------------------------------- through torchtitan 0.3.0


@pytest.fixture(scope="module")
def titan():
    pytest.importorskip("torchtitan", reason=EXTRA)
    pytest.importorskip("triton", reason=EXTRA + " (torchtitan 0.3 imports triton even on CPU)")
    from torchtitan.config import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims

    import torch

    # llama3_405b's config converts its linears to float8 while it is built (its model_registry
    # call runs Float8LinearConverter), which needs torchao and an SM89+ GPU.
    float8 = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)
    return SimpleNamespace(
        parse=lambda argv: ConfigManager().parse_args(list(argv)), ParallelDims=ParallelDims, float8=float8
    )


def _parsed(titan, c, argv=None):
    """The overrides through ConfigManager; generic ones on BASE, and 405B's on the 70B config
    where the 405B config cannot be built (test_llama3_405b_config_is_built_with_float8)."""
    argv = list(_export(c).data if argv is None else argv)
    if "llama3_405b" in argv and not titan.float8:
        argv[argv.index("llama3_405b")] = "llama3_70b"
    moe = c is not None and c.model.is_moe
    return titan.parse(argv if "--module" in argv else (MOE_BASE if moe else BASE) + argv)


def _base_flavor(titan, c) -> str:
    """The flavor of the config _parsed builds for this case."""
    flavor = tt_rules.matching_flavor(c.model)
    if flavor is None:
        return "30B-A3B" if c.model.is_moe else "8B"
    return "70B" if flavor.flavor == "405B" and not titan.float8 else flavor.flavor


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MATRIX))
def test_torchtitan_parses_the_overrides_and_they_mean_the_plan(titan, name):
    c = MATRIX[name]
    config = _parsed(titan, c)
    p, t, plan = config.parallelism, config.training, c.plan
    assert (
        p.data_parallel_replicate_degree * p.data_parallel_shard_degree,
        p.tensor_parallel_degree,
        p.pipeline_parallel_degree,
        p.context_parallel_degree,
        p.expert_parallel_degree,
    ) == (plan.dp, plan.tp, plan.pp, plan.cp, plan.ep)
    assert plan.cp == 1 or p.context_parallel_load_balancer == "headtail"  # 2 x cp chunks, the plan's causal balancing
    assert (t.global_batch_size, t.seq_len, t.dtype) == (c.job.global_batch_size, c.job.seq_len, "float32")
    policy = type(config.activation_checkpoint).__qualname__
    assert policy == {"none": "NoneType", "full": "FullAC.Config"}[tt.recompute_mode(plan, c.model).value]
    assert config.compile.enable_async_tensor_parallel == plan.tp_comm_overlap
    assert not plan.tp_comm_overlap or config.compile.enable
    flavor = tt_rules.matching_flavor(c.model)
    module = flavor.module if flavor else ("qwen3" if c.model.is_moe else "llama3")
    assert (config.model_spec.name, config.model_spec.flavor) == (module, _base_flavor(titan, c))
    if flavor is not None:
        # The model's own checks: tp divides heads and KV heads, seq_len within RoPE, no tying with
        # PP, the expert-parallel dispatcher's sizes; and its MoE layers are the plan's.
        config.model_spec.model.update_from_config(config=config)
        qk_norms = [getattr(layer.attention, "qk_norm", None) is not None for layer in config.model_spec.model.layers]
        assert qk_norms == [c.model.qk_norm] * len(qk_norms)
        if c.model.is_moe:
            layers = config.model_spec.model.layers
            assert [getattr(layer, "moe", None) is None for layer in layers] == [
                i < c.model.first_dense_layers for i in range(c.model.num_layers)
            ]
            moe = layers[-1].moe
            assert (moe.num_experts, moe.router.top_k, moe.routed_experts.inner_experts.hidden_dim) == (
                c.model.num_experts,
                c.model.experts_per_token,
                c.model.moe_ffn,
            )
    dims = titan.ParallelDims.from_config(p, world_size=c.gpus)
    assert (dims.dp_replicate * dims.dp_shard, dims.cp, dims.tp, dims.pp, dims.ep) == (
        plan.dp,
        plan.cp,
        plan.tp,
        plan.pp,
        plan.ep,
    )
    shard = plan.dp_shard or plan.dp
    assert (dims.dp_replicate, dims.dp_shard) == ((plan.dp, 1) if plan.zero_stage == 0 else (plan.dp // shard, shard))
    assert dims.fsdp_enabled == (
        plan.zero_stage > 0 and shard > 1 or plan.cp > 1
    )  # why problems() refuses ZeRO-0 with cp > 1


def test_torchtitan_has_the_components_a_generic_text_names(titan):
    """What _features points a generic model to exists in torchtitan 0.3.0 with those fields;
    its sliding-window mask admits the spec's window of keys, the query's own included; and its
    feed-forward gates through SiLU (why GeGLU is refused)."""
    import dataclasses

    import torch
    from torchtitan.models.common.attention import GQAttention, get_sliding_window_mask_mod
    from torchtitan.models.common.feed_forward import FeedForward
    from torchtitan.models.gpt_oss.model import Attention as GptOssAttention
    from torchtitan.models.muse_glimmer.model import MuseGlimmerTransformerBlock, SoftCappedLinear

    def fields(cls):
        return {f.name for f in dataclasses.fields(cls.Config)}

    assert "qk_norm" in fields(GQAttention) and "sliding_window_size" in fields(GptOssAttention)
    assert {"post_attention_norm", "post_ffn_norm"} <= fields(MuseGlimmerTransformerBlock)
    assert "output_soft_cap_temp" in fields(SoftCappedLinear)
    from torchtitan.models.common.rope import CosSinRoPE
    from torchtitan.models.gpt_oss.moe import GptOssGroupedExperts

    assert "swiglu_limit" in fields(GptOssGroupedExperts) and {"scaling", "rope_factor"} <= fields(CosSinRoPE)
    q, kv = torch.arange(12)[:, None], torch.arange(12)[None, :]
    allowed = get_sliding_window_mask_mod(4)(0, 0, q, kv)
    assert allowed.sum(dim=1).tolist() == [min(i + 1, 4) for i in range(12)]
    assert "silu" in FeedForward.forward.__code__.co_names and "gelu" not in FeedForward.forward.__code__.co_names


@pytest.mark.parametrize(
    "name", [n for n in MATRIX if MATRIX[n].plan.cp > 1 and tt_rules.matching_flavor(MATRIX[n].model)]
)
def test_context_parallel_attention_is_an_all_gather_of_kv(titan, name):
    """What the module docstring says torchtitan's CP is, read off the model it builds: the
    llama3 configs' attention is FlexAttention, whose sharding keeps the queries split over cp
    (Shard(1)) and gathers K and V whole (Replicate on cp) before the kernel."""
    c = MATRIX[name]
    config = _parsed(titan, c)
    config.model_spec.model.update_from_config(config=config)
    inner = config.model_spec.model.layers[0].attention.inner_attention
    assert type(inner).__qualname__ == "FlexAttention.Config"

    def on_cp(name: str) -> str:
        return next(
            repr(t)
            for a, t in inner.sharding_config.in_dst_shardings[name].axis_types.items()
            if getattr(a, "value", a) == "cp"
        )

    assert (on_cp("q_BLNH"), on_cp("k_BLNH"), on_cp("v_BLNH")) == ("S(1)", "R", "R")


def test_a_mesh_order_that_puts_cp_outside_tp_is_refused():
    """dp 1, cp 2, tp 2 laid out dp,tp,pp: the cp ranks (in the dp axis) innermost, where
    ParallelDims puts tp innermost and cp outside it."""
    c = MATRIX["8b-cp2-fsdp3-dp4-tp2"]
    assert "mesh order dp,tp,pp" in _refusal(
        c, plan={"dp": 1, "mesh_order": ["dp", "tp", "pp"]}, job={"global_batch_size": 2}
    )


def test_cp_text_states_the_gathered_kv_memory():
    """2 x b x (s - s / cp) x KV heads / tp x head width x 2 bytes: 2 x 1 x 4096 x 4 x 128 x 2 = 8 MiB."""
    assert "keeps them for backward: 8 MiB per layer and micro-batch" in _export(MATRIX["8b-cp2-fsdp3-dp4-tp2"]).text
    assert "only in the layer being recomputed" in _export(MATRIX["8b-cp4-zero2-dp2-pp2-full"]).text


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MATRIX))
def test_parsed_config_reads_back_to_the_plan(titan, name):
    c = MATRIX[name]
    got = tt.read_back(_parsed(titan, c))
    _compare(got, c)
    assert got["flavor"] == _base_flavor(titan, c)


def test_llama3_405b_config_is_built_with_float8(titan):
    """The one config this machine may not build: torchtitan makes llama3_405b's float8 linears
    as it builds the config (so the 405B overrides are parsed on llama3_70b elsewhere here)."""
    argv = _export(MATRIX["405b-fsdp3-tp8-pp8-vpp2-overlap"]).data
    if titan.float8:
        assert titan.parse(argv).model_spec.flavor == "405B"
    else:
        with pytest.raises((ImportError, ValueError), match="torchao|float8"):
            titan.parse(argv)


def test_flavors_are_torchtitans_models(titan):
    """Each flavor's numbers are those of the model its config_registry function builds."""
    import importlib

    for f in tt_rules.FLAVORS:
        model = importlib.import_module(f"torchtitan.models.{f.module}").model_registry(f.flavor).model
        attention, dense = model.layers[0].attention, model.layers[0].feed_forward
        assert (
            len(model.layers),
            model.dim,
            attention.n_heads,
            getattr(attention, "n_kv_heads", None) or attention.n_heads,
            model.vocab_size,
            model.enable_weight_tying,
            model.max_seq_len,
        ) == (f.num_layers, f.hidden_size, f.num_heads, f.kv_heads, f.vocab_size, False, f.max_seq_len)
        if f.mla:  # models/deepseek_v3: multi-head latent attention (q_lora_rank 0: none)
            assert (
                attention.kv_lora_rank,
                attention.q_lora_rank or None,
                attention.qk_rope_head_dim,
                attention.v_head_dim,
                attention.qk_nope_head_dim,
            ) == (*f.mla, f.head_dim)
        else:
            assert (
                getattr(attention, "head_dim", None) == f.head_dim
            )  # set only where heads are not hidden / n_heads wide
        if f.experts is None:
            assert dense.w1.out_features == f.ffn and f.max_seq_len == tt_rules.ROPE_MAX_SEQ
            continue
        moe = model.layers[-1].moe
        shared = (
            moe.shared_experts.w1.out_features // moe.routed_experts.inner_experts.hidden_dim
            if moe.shared_experts
            else 0
        )
        first_dense = sum(getattr(layer, "moe", None) is None for layer in model.layers)
        assert (
            moe.num_experts,
            moe.router.top_k,
            moe.routed_experts.inner_experts.hidden_dim,
            shared,
            first_dense,
        ) == f.experts
        assert first_dense == 0 or dense.w1.out_features == f.ffn


@pytest.fixture
def fake_world():
    """torch's fake process group of a given size (no communication), torn down after the test."""
    pytest.importorskip("torchtitan", reason=EXTRA)
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    def start(world_size: int):
        if dist.is_initialized():
            dist.destroy_process_group()
        dist.init_process_group("fake", rank=0, world_size=world_size, store=FakeStore())

    yield start
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in MATRIX if MATRIX[n].gpus > 1])
def test_the_mesh_puts_tp_innermost_then_dp_then_pp(titan, fake_world, name):
    """ParallelDims.build_mesh, as rank 0 sees it: its TP group is ranks 0..tp-1, its
    data-parallel group strides by tp, its pipeline group by tp x dp (the plan's mesh order)."""
    c = MATRIX[name]
    fake_world(c.gpus)
    dims = titan.ParallelDims.from_config(_parsed(titan, c).parallelism, world_size=c.gpus)
    dims.build_mesh()
    tp, cp, dp, pp = c.plan.tp, c.plan.cp, c.plan.dp, c.plan.pp

    def ranks(axis: str, degree: int) -> list[int]:
        return dims.get_mesh(axis).mesh.tolist() if degree > 1 else [0]  # degree-1 axes are not available

    assert (ranks("tp", tp), ranks("cp", cp), ranks("batch", dp), ranks("pp", pp)) == (
        list(range(tp)),
        [i * tp for i in range(cp)],
        [i * tp * cp for i in range(dp)],
        [i * tp * cp * dp for i in range(pp)],
    )
    if dp * cp > 1:  # the loss (gradient) mesh: the plan's dp x cp ranks of the same weights
        assert ranks("loss", dp * cp) == [i * tp for i in range(dp * cp)]
    if cp > 1:  # FSDP shards over dp_shard x cp: the plan's ZeRO over dp x cp
        from torchtitan.distributed.full_dtensor import resolve_fsdp_mesh

        assert resolve_fsdp_mesh(dims)[1].shard == ("dp_shard", "cp")
    shard = c.plan.dp_shard or dp
    if c.plan.dp_shard:  # HSDP: a shard group is dp_shard consecutive dp ranks (x cp), replicated outside it
        from torchtitan.distributed.full_dtensor import resolve_fsdp_mesh

        assert resolve_fsdp_mesh(dims)[1].replicate == "dp_replicate"
        assert (ranks("dp_shard", shard), ranks("dp_replicate", dp // shard)) == (
            [i * tp * cp for i in range(shard)],
            [i * tp * cp * shard for i in range(dp // shard)],
        )
    if c.plan.ep > 1:  # the cost model's folding: ep consecutive ranks of the tp x cp x dp block, expert-TP 1
        # ZeRO-0: ep = tp, experts whole on every replica
        efsdp = shard * cp * tp // c.plan.ep if c.plan.zero_stage else 1
        assert (ranks("ep", c.plan.ep), dims.get_mesh("efsdp").size()) == (list(range(c.plan.ep)), efsdp)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in MATRIX if MATRIX[n].plan.pp > 1])
def test_the_pipeline_split_and_schedule_are_the_plans(titan, fake_world, name):
    """The parts name every layer once, in order, with the plan's count per virtual stage; rank
    0 holds parts 0, pp, 2pp, ... (our j % pp); torchtitan's schedule builder accepts the batch
    with the plan's micro-batch count."""
    import torch
    import torch.nn as nn
    from torch.distributed.pipelining import PipelineStage
    from torchtitan.distributed.pipeline_parallel import _build_pipeline_schedule, _get_pp_rank_to_stage_indices_mapping

    c = MATRIX[name]
    config = _parsed(titan, c)
    p, plan = config.parallelism, c.plan
    parts = p.module_fqns_per_model_part
    layers = [n for part in parts for n in part if n.startswith("layers.")]
    assert layers == [f"layers.{i}" for i in range(c.model.num_layers)]
    assert [sum(n.startswith("layers.") for n in part) for part in parts] == plan.stage_layers(c.model.num_layers)
    assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "lm_head"]
    stages = _get_pp_rank_to_stage_indices_mapping(0, plan.pp, p.pipeline_parallel_schedule, len(parts))
    assert stages == tuple(range(0, plan.pp * plan.vpp, plan.pp))
    fake_world(plan.pp)
    import torch.distributed as dist

    modules = [
        PipelineStage(nn.Linear(2, 2), j, len(parts), torch.device("cpu"), group=dist.group.WORLD) for j in stages
    ]
    schedule = _build_pipeline_schedule(
        parallelism=p,
        local_batch_size=config.training.local_batch_size,
        stages=modules,
        loss_fn=lambda out, target: (out.sum(), None),
    )
    assert schedule._n_microbatches == plan.num_micro_batches


def test_the_part_names_are_torchtitans_modules(titan):
    """_split_module (pipeline_parallel.py) keeps exactly the named modules of the real model."""
    import torch
    from torchtitan.distributed.pipeline_parallel import _split_module

    c = MATRIX["8b-zero2-tp2-pp4-gpipe-uneven"]
    config = _parsed(titan, c)
    with torch.device("meta"):
        model = config.model_spec.model.build()
    for names, count in zip(config.parallelism.module_fqns_per_model_part, c.plan.layers_per_stage):
        part = _split_module(model, names)
        assert len(part.layers) == count
        assert (part.tok_embeddings is not None, part.lm_head is not None) == (
            "tok_embeddings" in names,
            "lm_head" in names,
        )


# --------------------------------------------------------------------------- broken overrides are rejected


def test_degrees_that_miss_the_world_size_are_rejected(titan):
    c = MATRIX["8b-fsdp3-tp4-pp2-1f1b"]
    config = _parsed(titan, c, _with(_export(c).data, "--parallelism.data_parallel_shard_degree", "3"))
    with pytest.raises(AssertionError, match=r"dp_shard\(3\) \* cp\(1\) \* tp\(4\) \* pp\(2\) != WORLD_SIZE\(16\)"):
        titan.ParallelDims.from_config(config.parallelism, world_size=c.gpus)
    titan.ParallelDims.from_config(_parsed(titan, c).parallelism, world_size=c.gpus)  # the export itself passes


def test_a_context_parallel_degree_that_misses_the_world_is_rejected(titan, fake_world):
    """cp 3 with the rest of the 16 ranks' degrees: ParallelDims refuses the product; the
    export's cp 4 builds its mesh."""
    c = MATRIX["8b-cp4-zero2-dp2-pp2-full"]
    fake_world(c.gpus)
    titan.ParallelDims.from_config(_parsed(titan, c).parallelism, world_size=c.gpus).build_mesh()
    broken = _parsed(titan, c, _with(_export(c).data, "--parallelism.context_parallel_degree", "3"))
    with pytest.raises(AssertionError, match=r"dp_shard\(2\) \* cp\(3\) \* tp\(1\) \* pp\(2\) != WORLD_SIZE\(16\)"):
        titan.ParallelDims.from_config(broken.parallelism, world_size=c.gpus)
    with pytest.raises(SystemExit):  # ParallelismConfig.__post_init__: "cannot be an empty string" (tyro exits)
        _parsed(titan, c, _with(_export(c).data, "--parallelism.context_parallel_load_balancer", ""))


def test_a_local_batch_the_micro_batch_does_not_divide_is_rejected(titan):
    c = MATRIX["8b-zero2-tp2-pp4-gpipe-uneven"]
    with pytest.raises(SystemExit):
        _parsed(titan, c, _with(_export(c).data, "--training.local_batch_size", "5"))


def test_a_pipeline_without_disabling_cuda_graphs_is_rejected(titan):
    c = MATRIX["8b-fsdp3-tp4-pp2-1f1b"]
    with pytest.raises(SystemExit):
        _parsed(titan, c, [a for a in _export(c).data if a != "--training.disable_cuda_graphs"])


def test_async_tp_without_compile_is_rejected(titan):
    c = MATRIX["8b-zero2-tp4-overlap-full"]
    with pytest.raises(SystemExit):
        _parsed(titan, c, [a for a in _export(c).data if a != "--compile.enable"])


def test_tp_over_kv_heads_it_cannot_shard_is_rejected_by_the_model(titan):
    c = MATRIX["70b-zero0-tp8-pp4-full-per-stage"]
    config = _parsed(titan, c, _with(_export(c).data, "--parallelism.tensor_parallel_degree", "16"))
    with pytest.raises(ValueError, match=r"must divide n_kv_heads \(8\)"):
        config.model_spec.model.update_from_config(config=config)


def test_1f1b_with_fewer_micro_batches_than_ranks_is_rejected(titan, fake_world):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.pipelining import PipelineStage
    from torchtitan.distributed.pipeline_parallel import _build_pipeline_schedule

    config = _parsed(
        titan,
        None,
        BASE
        + [
            "--parallelism.pipeline_parallel_degree",
            "4",
            "--training.disable_cuda_graphs",
            "--training.local_batch_size",
            "2",
        ],
    )
    fake_world(4)
    stage = PipelineStage(nn.Linear(2, 2), 0, 4, torch.device("cpu"), group=dist.group.WORLD)
    with pytest.raises(ValueError, match="must be greater than or equal to the number of stages"):
        _build_pipeline_schedule(
            parallelism=config.parallelism,
            local_batch_size=2,
            stages=[stage],
            loss_fn=lambda out, target: (out.sum(), None),
        )


def test_expert_degrees_that_do_not_tile_the_sharded_ranks_are_rejected(titan, fake_world):
    """ParallelDims.build_mesh unflattens the world into (pp, dp_replicate, efsdp, ep) with
    efsdp = dp_shard x cp x tp // ep: an ep that does not divide dp_shard x tp (3 of 4 x 2), or
    ZeRO-0's replicate-only mesh with ep beyond tp, leaves ranks over and is refused."""
    c = MATRIX["mixtral-generic-zero2-ep4-tp2-pp2"]
    fake_world(c.gpus)
    titan.ParallelDims.from_config(_parsed(titan, c).parallelism, world_size=c.gpus).build_mesh()  # the export itself
    broken = _parsed(titan, c, _with(_export(c).data, "--parallelism.expert_parallel_degree", "3"))
    with pytest.raises(
        ValueError, match=r"mesh_sizes=\(2, 1, 2, 3\) is 12, but the original dimension at dim=0 has size 16"
    ):
        titan.ParallelDims.from_config(broken.parallelism, world_size=c.gpus).build_mesh()
    c = MATRIX["mixtral-generic-zero0-ep2-tp2"]
    fake_world(c.gpus)
    broken = _parsed(titan, c, _with(_export(c).data, "--parallelism.expert_parallel_degree", "4"))
    with pytest.raises(ValueError, match=r"mesh_sizes=\(1, 4, 0, 4\) is 0"):
        titan.ParallelDims.from_config(broken.parallelism, world_size=c.gpus).build_mesh()


def test_experts_beyond_a_shard_group_are_refused_in_one_line(titan, fake_world):
    """ep 8 over shard groups of 4 ranks: the export refuses it, as torchtitan's mesh does
    (efsdp = dp_shard x cp x tp // ep = 0) for the overrides it would have written."""
    c = MATRIX["mixtral-generic-hsdp3-shard4-ep4"]
    plan = c.plan.model_copy(update={"ep": 8})
    with pytest.raises(UsageError, match=r"ep=8 across shard groups \(ep must divide dp_shard x cp x tp = 4") as err:
        exporters.export("torchtitan", plan, c.model, c.job, c.gpus)
    assert len(str(err.value).splitlines()) == 1
    fake_world(c.gpus)
    broken = _parsed(titan, c, _with(_export(c).data, "--parallelism.expert_parallel_degree", "8"))
    with pytest.raises(ValueError, match=r"mesh_sizes=\(1, 4, 0, 8\) is 0"):
        titan.ParallelDims.from_config(broken.parallelism, world_size=c.gpus).build_mesh()


def test_expert_parallelism_with_cuda_graphs_is_rejected(titan):
    """The standard all-to-all dispatcher synchronises with the CPU: Trainer.Config refuses
    ep > 1 unless CUDA graphs are off, which the export turns off."""
    c = MATRIX["mixtral-generic-fsdp3-ep8"]
    assert "--training.disable_cuda_graphs" in _export(c).data
    with pytest.raises(SystemExit):
        _parsed(titan, c, [a for a in _export(c).data if a != "--training.disable_cuda_graphs"])


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
def test_mixtral_solved_for_torchtitan_exports_and_torchtitan_takes_it(tmp_path):
    """`plan solve --target torchtitan` on Mixtral 8x7B (64 H100), then `plan export` of the
    plan and every alternative: the overrides read back to the plan and, with torchtitan,
    parse (on a MoE base config) into ParallelDims of the plan's degrees."""
    path = tmp_path / "mixtral.json"
    cli = [sys.executable, "-m", "planner.cli.main"]
    solved = subprocess.run(
        [*cli, "solve", *MIXTRAL_SOLVE, "--target", "torchtitan", "--top-k", "4", "-o", str(path)],
        capture_output=True,
        text=True,
    )
    assert solved.returncode == 0, solved.stderr
    doc = json.loads(path.read_text())
    for k, entry in enumerate([doc] + doc["alternatives"]):
        res = subprocess.run(
            [*cli, "export", str(path), "--to", "torchtitan", "--json", *(["--alternative", str(k)] if k else [])],
            capture_output=True,
            text=True,
        )
        assert res.returncode == 0, res.stderr
        plan, data = Plan.model_validate(entry["plan"]), json.loads(res.stdout)["data"]
        back = tt.read_back(data)
        assert (back["dp"], back["tp"], back["pp"], back["ep"], back["zero_stage"]) == (
            plan.dp,
            plan.tp,
            plan.pp,
            plan.ep,
            plan.zero_stage,
        )
        try:
            from torchtitan.config import ConfigManager
            from torchtitan.distributed.parallel_dims import ParallelDims
        except ImportError:
            continue
        dims = ParallelDims.from_config(ConfigManager().parse_args(MOE_BASE + data).parallelism, world_size=64)
        assert (dims.dp_replicate * dims.dp_shard, dims.tp, dims.pp, dims.ep) == (plan.dp, plan.tp, plan.pp, plan.ep)


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
def test_llama3_8b_128k_solved_for_torchtitan_exports_with_context_parallelism(tmp_path):
    """`plan solve --target torchtitan` on Llama 3 8B, 128k tokens, 8 H100, then `plan export`
    of the plan and every alternative: context parallelism is chosen, the overrides read back
    to the plan's cp and, with torchtitan, parse into ParallelDims of the plan's degrees."""
    path = tmp_path / "long.json"
    cli = [sys.executable, "-m", "planner.cli.main"]
    solved = subprocess.run(
        [*cli, "solve", *LONG_SOLVE, "--target", "torchtitan", "--top-k", "4", "-o", str(path)],
        capture_output=True,
        text=True,
    )
    assert solved.returncode == 0, solved.stderr
    doc = json.loads(path.read_text())
    entries = [doc] + doc["alternatives"]
    assert any(Plan.model_validate(e["plan"]).cp > 1 for e in entries)
    for k, entry in enumerate(entries):
        res = subprocess.run(
            [*cli, "export", str(path), "--to", "torchtitan", "--json", *(["--alternative", str(k)] if k else [])],
            capture_output=True,
            text=True,
        )
        assert res.returncode == 0, res.stderr
        plan, data = Plan.model_validate(entry["plan"]), json.loads(res.stdout)["data"]
        back = tt.read_back(data)
        assert (back["dp"], back["cp"], back["tp"], back["pp"], back["zero_stage"]) == (
            plan.dp,
            plan.cp,
            plan.tp,
            plan.pp,
            plan.zero_stage,
        )
        try:
            from torchtitan.config import ConfigManager
            from torchtitan.distributed.parallel_dims import ParallelDims
        except ImportError:
            continue
        dims = ParallelDims.from_config(ConfigManager().parse_args(data).parallelism, world_size=8)
        assert (dims.dp_replicate * dims.dp_shard, dims.cp, dims.tp, dims.pp) == (plan.dp, plan.cp, plan.tp, plan.pp)
