"""`plan export --to deepspeed`: every export of a matrix of plans is accepted by DeepSpeed
0.19.8's own config parser and means what the plan means (batch, ZeRO buckets, AutoTP,
checkpointing, pipeline), DeepSpeed's partitioner, schedule and topology lay the plan out as
planned, a broken config is rejected by the same parser, and plans DeepSpeed cannot run are
refused naming the feature. Tests that need the package skip without it."""

import json
import subprocess
import sys

import pytest

from cost_models.compute import layer_params
from cost_models.memory import in_flight_micro_batches
from cost_models.terms import DEEPSPEED_REDUCE_BUCKET_ELEMENTS, GRADIENT_BUCKET_BYTES
from planner.errors import UsageError
from planner.stacks import export, rules
from planner.export import deepspeed as ds_export
from planner.stacks.deepspeed import rules as ds_rules
from planner.presets import load_model
from planner.specs import DTYPE_BYTES, Axis, JobSpec, Plan, Schedule, StageRecompute
from tests.paths import HF_CONFIGS

SKIP_REASON = "the export extra is not installed: pip install '.[export]'"


def job(batch: int, precision: str = "bf16", optimizer: str = "adam") -> JobSpec:
    return JobSpec(global_batch_size=batch, seq_len=2048, precision=precision, optimizer=optimizer, target="deepspeed")


def full_counts(layers: list[int]) -> list[StageRecompute]:
    return [StageRecompute(full=n) for n in layers]


# (model, plan, job): every feature DeepSpeed has. Each plan passes Plan.validate_for.
MATRIX = [
    ("llama3-8b", Plan(dp=16, tp=1, pp=1, micro_batch_size=2, num_micro_batches=2, zero_stage=0), job(64)),
    (
        "llama3-8b",
        Plan(dp=16, tp=1, pp=1, micro_batch_size=2, num_micro_batches=2, zero_stage=1, recompute="full"),
        job(64),
    ),
    ("llama3-8b", Plan(dp=16, tp=1, pp=1, micro_batch_size=1, num_micro_batches=4, zero_stage=2), job(64)),
    ("llama3-8b", Plan(dp=16, tp=1, pp=1, micro_batch_size=2, num_micro_batches=2, zero_stage=3), job(64)),
    # AutoTP, every ZeRO stage, tp = KV heads (8) and below
    ("llama3-8b", Plan(dp=4, tp=4, pp=1, micro_batch_size=4, num_micro_batches=4, zero_stage=0), job(64)),
    (
        "llama3-8b",
        Plan(dp=2, tp=8, pp=1, micro_batch_size=4, num_micro_batches=8, zero_stage=1, recompute="full"),
        job(64),
    ),
    ("llama3-8b", Plan(dp=4, tp=2, pp=1, micro_batch_size=2, num_micro_batches=8, zero_stage=2), job(64, "fp16")),
    (
        "llama3-70b",
        Plan(dp=8, tp=8, pp=1, micro_batch_size=1, num_micro_batches=16, zero_stage=3, recompute="full"),
        job(128),
    ),
    # pipelines: 1F1B, ZeRO 0 and 1, even splits (default and explicit), fewer micro-batches than stages
    (
        "llama3-70b",
        Plan(dp=2, tp=1, pp=8, micro_batch_size=1, num_micro_batches=32, zero_stage=1, recompute="full"),
        job(64),
    ),
    (
        "llama3-70b",
        Plan(
            dp=4,
            tp=1,
            pp=4,
            micro_batch_size=1,
            num_micro_batches=16,
            zero_stage=0,
            layers_per_stage=[20] * 4,
            stage_recompute=full_counts([20] * 4),
        ),
        job(64),
    ),
    ("gpt3-1.3b", Plan(dp=4, tp=1, pp=4, micro_batch_size=2, num_micro_batches=8, zero_stage=1), job(64, "fp16")),
    ("gpt3-1.3b", Plan(dp=4, tp=1, pp=2, micro_batch_size=4, num_micro_batches=1, zero_stage=0), job(16)),
    # fp32 and SGD under ZeRO
    (
        "gpt3-1.3b",
        Plan(dp=8, tp=1, pp=1, micro_batch_size=4, num_micro_batches=2, zero_stage=2),
        job(64, "fp32", "sgd"),
    ),
    # Mixture of experts (AutoEP): ep 1, 2, 4, 8 under every ZeRO stage, with a pipeline, shared
    # experts and dense first layers (DeepSeek-V3), 128 experts (Qwen3)
    ("mixtral-8x7b", Plan(dp=8, ep=8, tp=1, pp=1, micro_batch_size=1, num_micro_batches=4, zero_stage=1), job(32)),
    (
        "mixtral-8x7b",
        Plan(dp=16, ep=4, tp=1, pp=1, micro_batch_size=1, num_micro_batches=2, zero_stage=3, recompute="full"),
        job(32),
    ),
    ("mixtral-8x7b", Plan(dp=16, ep=1, tp=1, pp=1, micro_batch_size=1, num_micro_batches=2, zero_stage=2), job(32)),
    (
        "mixtral-8x7b",
        Plan(dp=8, ep=2, tp=1, pp=4, micro_batch_size=1, num_micro_batches=8, zero_stage=1, recompute="full"),
        job(64),
    ),
    ("qwen3-30b-a3b", Plan(dp=8, ep=8, tp=1, pp=2, micro_batch_size=1, num_micro_batches=8, zero_stage=0), job(64)),
    (
        "deepseek-v3",
        Plan(dp=64, ep=8, tp=1, pp=1, micro_batch_size=1, num_micro_batches=1, zero_stage=3, recompute="full"),
        job(64),
    ),
]
IDS = [
    f"{m}-dp{p.dp}-ep{p.ep}-tp{p.tp}-pp{p.pp}-z{p.zero_stage}-{j.precision.value}-{p.recompute.value}"
    for m, p, j in MATRIX
]


def _export(model_name, plan, job_spec):
    model = load_model(model_name)
    plan.validate_for(model, job_spec, plan.world_size)
    return model, export("deepspeed", plan, model, job_spec, plan.world_size)


# --------------------------------------------------------------------------- without the package


def test_rules_state_what_deepspeed_has():
    r = rules("deepspeed")
    assert r.zero_stages_with_pp == (0, 1) and r.zero_stages_with_tp == (0, 1, 2, 3)
    assert r.schedules == (Schedule.one_f_one_b,) and not r.interleaved
    assert not r.sequence_parallel and not r.tp_comm_overlap
    assert r.mesh_orders == ((Axis.tp, Axis.dp, Axis.pp),)
    assert (r.split, r.recompute) == ("even", "uniform")
    assert {"ZeRO", "mesh order", "uneven stages", "per-stage recompute"} <= set(r.notes)
    assert r.hybrid_zero_stages == () and "removed MiCS" in r.notes["hybrid sharding"]
    assert r.max_cp == 1 and "Ulysses" in r.notes["context parallelism"]
    assert not r.fp8 and "no FP8 training recipe" in r.notes["FP8"]


@pytest.mark.parametrize("model_name, plan, job_spec", MATRIX, ids=IDS)
def test_export_is_pure_json_with_our_numbers(model_name, plan, job_spec):
    model, e = _export(model_name, plan, job_spec)
    assert (e.stack, e.kind) == ("deepspeed", "json") and json.loads(e.text) == e.data
    d = e.data
    assert (
        d["train_batch_size"]
        == job_spec.global_batch_size
        == d["train_micro_batch_size_per_gpu"] * d["gradient_accumulation_steps"] * plan.dp
    )
    zero = d["zero_optimization"]
    if plan.zero_stage in (1, 2):  # the cost model's 25 MiB gradient bucket, in gradient elements
        assert zero["reduce_bucket_size"] * DTYPE_BYTES[job_spec.precision] == GRADIENT_BUCKET_BYTES == 25 * 2**20
    if plan.zero_stage == 3:  # DeepSpeed's own default bucket, which the cost model charges per call
        assert zero["reduce_bucket_size"] == DEEPSPEED_REDUCE_BUCKET_ELEMENTS == 500_000_000
    if plan.zero_stage:
        assert zero["overlap_comm"] is True
    if plan.zero_stage == 3:  # one layer (this rank's TP shard and E / ep experts) prefetched, current + next live
        assert zero["stage3_prefetch_bucket_size"] == layer_params(model, plan.tp, plan.ep).total
        assert zero["stage3_max_live_parameters"] == 2 * layer_params(model, plan.tp, plan.ep).total
    assert ("tensor_parallel" in d) == (plan.tp > 1) and ("pipeline" in d) == (plan.pp > 1)
    assert ("activation_checkpointing" in d) == (plan.recompute == "full" or plan.stage_recompute is not None)
    layout = d["planner"]["layout"]
    assert (layout["dp"], layout["tp"], layout["pp"], layout["ep"], layout["world_size"]) == (
        plan.dp,
        plan.tp,
        plan.pp,
        plan.ep,
        plan.world_size,
    )
    assert ("expert_parallel" in d) == model.is_moe == ("experts" in d["planner"])
    if model.is_moe:
        assert (
            d["expert_parallel"]["autoep_size"] == plan.ep
            and d["planner"]["experts"]["num_experts"] == model.num_experts
        )


@pytest.mark.parametrize("model_name, plan, job_spec", MATRIX, ids=IDS)
def test_read_back_of_the_exported_dict(model_name, plan, job_spec):
    model, e = _export(model_name, plan, job_spec)
    assert ds_export.read_back(e.data) == ours(plan, model, job_spec)


def test_the_exporter_imports_neither_torch_nor_deepspeed():
    code = "import sys, planner.export.deepspeed; print('torch' in sys.modules, 'deepspeed' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]


def _p(**kw) -> Plan:
    base = dict(dp=2, tp=1, pp=4, micro_batch_size=1, num_micro_batches=8)
    return Plan(**{**base, **kw})


# (model, plan, a phrase the refusal must contain)
REFUSED = [
    ("llama3-8b", _p(zero_stage=2), "ZeRO stage 2 with pipeline parallelism"),
    ("llama3-8b", _p(zero_stage=3), "ZeRO stage 3 with pipeline parallelism"),
    ("llama3-8b", _p(tp=2, dp=1), "tensor parallelism together with pipeline parallelism"),
    ("llama3-8b", _p(tp=2, pp=1, sequence_parallel=True), "sequence parallelism"),
    ("llama3-8b", _p(schedule="gpipe"), "schedule gpipe"),
    ("llama3-8b", _p(schedule="interleaved-1f1b", vpp=2), "schedule interleaved-1f1b"),
    ("llama3-8b", _p(layers_per_stage=[7, 9, 8, 8]), "uneven layers per stage"),
    ("llama3-8b", _p(pp=3, dp=2), "uneven layers per stage 11, 11, 10"),  # 32 layers on 3 stages
    ("llama3-8b", _p(recompute="selective"), "selective recompute"),
    (
        "llama3-8b",
        _p(stage_recompute=[StageRecompute(full=8)] * 2 + [StageRecompute(none=8)] * 2),
        "recompute mixing modes",
    ),
    ("llama3-8b", _p(tp=2, pp=1, mesh_order=["dp", "tp", "pp"]), "mesh order dp,tp,pp"),
    ("llama3-8b", _p(cp=2, dp=1), "context parallelism cp=2 (deepspeed has none)"),
    ("llama3-8b", _p(fp8=True), "FP8 GEMMs (this export of deepspeed has no FP8 recipe)"),
    # hybrid sharding: none since 0.19.8 removed MiCS (test_deepspeed_refuses_mics)
    *[
        (
            "llama3-8b",
            _p(pp=1, dp=8, zero_stage=z, dp_shard=4),
            f"hybrid sharding dp_shard=4 with ZeRO stage {z} (deepspeed has none)",
        )
        for z in (1, 2, 3)
    ],
]


@pytest.mark.parametrize("model_name, plan, phrase", REFUSED, ids=[r[2] for r in REFUSED])
def test_what_deepspeed_cannot_run_is_refused_by_name(model_name, plan, phrase):
    with pytest.raises(UsageError, match="deepspeed cannot run this plan") as err:
        export("deepspeed", plan, load_model(model_name), job(16), plan.world_size)
    assert phrase in str(err.value)


def test_refusals_are_one_line_naming_the_feature():
    """Context parallelism and FP8, which DeepSpeed's config cannot ask for, each refused in one line."""
    for plan, feature in ((_p(cp=2, dp=1), "context parallelism"), (_p(fp8=True), "FP8")):
        with pytest.raises(UsageError) as err:
            export("deepspeed", plan, load_model("llama3-8b"), job(16), plan.world_size)
        assert len(str(err.value).splitlines()) == 1 and feature in str(err.value)


def test_plan_export_of_a_hybrid_plan_exits_2_with_one_line(tmp_path):
    """`plan export --to deepspeed` of a hybrid ZeRO-3 plan: refused in one line (exit 2), not
    written as a full shard."""
    from click.testing import CliRunner

    from planner.cli.main import cli

    path = tmp_path / "hybrid.json"
    size = ["--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--gpus", "16", "--global-batch", "32"]
    layout = ["--dp", "16", "--tp", "1", "--pp", "1", "--zero", "3", "--dp-shard", "8"]
    made = CliRunner().invoke(cli, ["estimate", *size, *layout, "--target", "generic", "-o", str(path)])
    assert made.exit_code == 0, made.output
    res = CliRunner().invoke(cli, ["export", str(path), "--to", "deepspeed"])
    assert res.exit_code == 2 and res.stdout == ""
    assert res.stderr.strip().splitlines() == [
        "error: deepspeed cannot run this plan: hybrid sharding dp_shard=8 with ZeRO stage 3 (deepspeed has none); "
        "re-plan with `plan solve ... --target deepspeed`, which searches only what deepspeed can express"
    ]


def test_read_back_refuses_ulysses_as_context_parallelism():
    _, e = _export(*MATRIX[0])
    with pytest.raises(ValueError, match="sequence_parallel_size 2 is Ulysses, not our context parallelism"):
        ds_export.read_back({**e.data, "sequence_parallel_size": 2})


def test_nothing_in_the_matrix_is_refused():
    for model_name, plan, _ in MATRIX:
        model = load_model(model_name)
        assert rules("deepspeed").plan_problems(plan, model) == [] and ds_rules.problems(plan, model, None) == []


HF = HF_CONFIGS  # published Hugging Face configs (SOURCES.md)


def test_a_model_deepspeed_wraps_as_it_is_exports_and_the_planner_block_names_it():
    """DeepSpeed's config holds no architecture (the model is the user's module), so Gemma 2's
    GeGLU, four norms, windows and soft-capped logits export; the planner block says what the
    model must be. A Llama's says its rotary base and scaling only (DeepSpeed cannot set them: the
    user's model must have them); a GPT with learned positions has nothing to say."""
    model = load_model(str(HF / "gemma-2-9b.json"))
    plan = Plan(dp=8, tp=2, pp=1, micro_batch_size=1, num_micro_batches=4, zero_stage=3)
    assert ds_rules.model_problems(model) == []
    e = export("deepspeed", plan, model, job(32), plan.world_size)
    said = e.data["planner"]["model"]
    for feature in (
        "GeGLU",
        "4 norms per layer",
        "sliding window of 4096 keys",
        "on 21 of 42 layers",
        "soft-capped logits",
    ):
        assert feature in said
    _, llama = _export("llama3-8b", Plan(dp=8, tp=1, pp=1, micro_batch_size=1, num_micro_batches=4), job(32))
    assert llama.data["planner"]["model"] == (
        "llama3-8b, planned with rotary base 500,000, Llama 3.1 rotary scaling (factor 8, "
        "low_freq_factor 1, high_freq_factor 4, original 8192) (your model code builds them)"
    )
    _, gpt = _export("gpt3-1.3b", Plan(dp=8, tp=1, pp=1, micro_batch_size=1, num_micro_batches=4), job(32))
    assert "model" not in gpt.data["planner"]


# --------------------------------------------------------------------------- with DeepSpeed 0.19.8


def test_autotp_sums_the_gradients_of_qk_norms_over_tp(ds_config):
    """Why QK-norm exports under AutoTP (model_problems' docstring): DeepSpeed reads a Hugging
    Face model's tp_plan (runtime/engine.py) and keeps Qwen3's q_norm / k_norm, which normalise
    the heads of one TP rank, whole with their gradients summed over the TP group."""
    from deepspeed.module_inject.tp_plan_converter import TPPlanConverter
    from transformers import Qwen3Config

    specs = TPPlanConverter.convert(Qwen3Config.base_model_tp_plan)
    reduced = [s for s in specs if s.grad_allreduce]
    assert len(reduced) == 2 and all(any(n in p for p in s.patterns for n in ("q_norm", "k_norm")) for s in reduced)
    model = load_model(str(HF / "qwen3-8b.json"))
    plan = Plan(dp=4, tp=2, pp=1, micro_batch_size=1, num_micro_batches=4, zero_stage=1)
    assert model.qk_norm and ds_config(export("deepspeed", plan, model, job(16), plan.world_size).data, plan.dp)


@pytest.fixture
def ds_config(monkeypatch):
    """DeepSpeed's parser with a DP size: DeepSpeedConfig reads it from the `mpu` (as
    deepspeed.initialize passes a PipelineModule's grid, or a user's mpu), but only once
    deepspeed.comm answers get_rank; without a process group it falls back to world size 1."""
    pytest.importorskip("deepspeed", reason=SKIP_REASON)
    from deepspeed.runtime import config as ds_config_module

    monkeypatch.setattr(ds_config_module.dist, "get_rank", lambda *a, **k: 0)

    def parse(config, dp: int):
        class DataParallelSize:  # the one method DeepSpeedConfig asks an mpu
            def get_data_parallel_world_size(self):
                return dp

        return ds_config_module.DeepSpeedConfig(config, mpu=DataParallelSize())

    return parse


@pytest.mark.parametrize("model_name, plan, job_spec", MATRIX, ids=IDS)
def test_deepspeed_accepts_every_export_and_reads_our_values(ds_config, model_name, plan, job_spec):
    model, e = _export(model_name, plan, job_spec)
    cfg = ds_config(e.data, plan.dp)
    assert (cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps) == (
        job_spec.global_batch_size,
        plan.micro_batch_size,
        plan.num_micro_batches,
    )
    assert int(cfg.zero_optimization_stage) == plan.zero_stage
    assert (cfg.bfloat16_config.enabled, cfg.float16_config.enabled) == (
        job_spec.precision == "bf16",
        job_spec.precision == "fp16",
    )
    assert cfg.tensor_parallel_config.autotp_size == (plan.tp if plan.tp > 1 else 0)
    z = cfg.zero_config
    if plan.zero_stage in (1, 2):
        assert z.overlap_comm and z.reduce_bucket_size == GRADIENT_BUCKET_BYTES // DTYPE_BYTES[job_spec.precision]
    if plan.zero_stage == 3:
        assert z.overlap_comm and z.reduce_bucket_size == DEEPSPEED_REDUCE_BUCKET_ELEMENTS
    if plan.zero_stage in (1, 2):
        assert z.allgather_bucket_size == z.reduce_bucket_size
    if plan.zero_stage == 3:
        layer = layer_params(model, plan.tp, plan.ep).total
        assert (z.prefetch_bucket_size, z.max_live_parameters) == (layer, 2 * layer)
    if model.is_moe and plan.zero_stage in (1, 2):
        # runtime/zero/stage_1_and_2.py _configure_moe_settings asserts both for MoE models
        assert z.contiguous_gradients and z.reduce_scatter
    ep = cfg.expert_parallel_config
    assert (ep.enabled, ep.autoep_size) == (model.is_moe, plan.ep if model.is_moe else 1)
    full = plan.recompute == "full" or plan.stage_recompute is not None
    assert cfg.pipeline["activation_checkpoint_interval"] == (1 if full and plan.pp > 1 else 0)
    assert cfg.pipeline["stages"] == (plan.pp if plan.pp > 1 else "auto")
    assert cfg.activation_checkpointing_config.partition_activations is False


@pytest.mark.parametrize("model_name, plan, job_spec", MATRIX, ids=IDS)
def test_round_trip_through_deepspeeds_parser(ds_config, tmp_path, model_name, plan, job_spec):
    model, e = _export(model_name, plan, job_spec)
    path = tmp_path / "ds_config.json"
    path.write_text(e.text)  # the printed text, read as DeepSpeed reads a config file (hjson)
    assert ds_export.read_back(parsed(ds_config(str(path), plan.dp))) == ours(plan, model, job_spec)


def test_a_wrong_batch_is_rejected_by_deepspeed(ds_config):
    _, e = _export(*MATRIX[8])
    ds_config(e.data, 2)
    with pytest.raises(AssertionError, match="train_batch_size is not equal"):
        ds_config({**e.data, "train_batch_size": e.data["train_batch_size"] + 1}, 2)
    with pytest.raises(AssertionError, match="train_batch_size is not equal"):  # the same config on the wrong DP size
        ds_config(e.data, 4)
    with pytest.raises(ValueError, match="reduce_bucket_sise"):  # ZeRO's section forbids unknown keys
        ds_config({**e.data, "zero_optimization": {"stage": 1, "reduce_bucket_sise": 1}}, 2)


def test_deepspeed_refuses_mics(ds_config):
    """Why RULES has no hybrid ZeRO stage: DeepSpeed 0.19.8 refuses MiCS' keys, its only shard
    group with replicas (runtime/config.py:_REMOVED_ZERO_CONFIG_KEYS)."""
    from deepspeed.runtime.config import DeepSpeedConfigError

    _, e = _export("llama3-8b", _p(pp=1, dp=8, zero_stage=3), job(64))
    ds_config(e.data, 8)  # the plain ZeRO-3 export passes
    for key, value in (("mics_shard_size", 4), ("mics_hierarchical_params_gather", True)):
        with pytest.raises(DeepSpeedConfigError, match="MiCS ZeRO-3 sharding has been removed"):
            ds_config({**e.data, "zero_optimization": {**e.data["zero_optimization"], key: value}}, 8)


def test_autotp_without_an_mpu_counts_tp_ranks_as_replicas(monkeypatch):
    """What the export's planner.autotp_batch note says: with no mpu DeepSpeedConfig divides
    the batch by every rank (dist.get_world_size()), so an AutoTP export needs one."""
    pytest.importorskip("deepspeed", reason=SKIP_REASON)
    from deepspeed.runtime import config as ds_config_module

    _, e = _export(*MATRIX[4])  # dp=4 tp=4
    monkeypatch.setattr(ds_config_module.dist, "get_rank", lambda *a, **k: 0)
    monkeypatch.setattr(ds_config_module.dist, "get_world_size", lambda *a, **k: 16)
    with pytest.raises(AssertionError, match="64 != 4 \\* 4 \\* 16"):
        ds_config_module.DeepSpeedConfig(e.data)
    assert "mpu" in e.data["planner"]["autotp_batch"]


@pytest.mark.parametrize(
    "model_name, plan, job_spec",
    [c for c in MATRIX if c[1].pp > 1],
    ids=[i for i, c in zip(IDS, MATRIX) if c[1].pp > 1],
)
def test_deepspeeds_partitioner_splits_the_layers_as_planned(model_name, plan, job_spec):
    """PipelineModule._partition_layers, run with the exported partition method on a model of
    embedding, the transformer blocks, final norm and LM head, gives the plan's split."""
    pytest.importorskip("deepspeed", reason=SKIP_REASON)
    import torch
    from deepspeed.runtime.pipe.module import LayerSpec, PipelineModule
    from deepspeed.runtime.pipe.topology import PipeDataParallelTopology

    model, e = _export(model_name, plan, job_spec)
    # layer classes of a Llama-like PipelineModule, named as Hugging Face names them
    kinds = {
        name: type(name, (torch.nn.Module,), {}) for name in ("Embedding", "LlamaDecoderLayer", "RMSNorm", "LMHead")
    }
    specs = (
        [LayerSpec(kinds["Embedding"])]
        + [LayerSpec(kinds["LlamaDecoderLayer"])] * model.num_layers
        + [LayerSpec(kinds["RMSNorm"]), LayerSpec(kinds["LMHead"])]
    )
    module = PipelineModule.__new__(PipelineModule)  # the partitioner alone: no process group, no layers built
    torch.nn.Module.__init__(module)
    module._layer_specs, module.num_stages = specs, plan.pp
    module._topo, module.global_rank = (
        PipeDataParallelTopology(num_pp=plan.pp, num_dp=2),
        1,
    )  # rank 1: stage 0, prints nothing
    module._partition_layers(method=e.data["planner"]["pipeline_module"]["partition_method"])
    assert e.data["pipeline"]["partition"] == e.data["planner"]["pipeline_module"]["partition_method"]
    blocks = [
        sum(specs[i].typename is kinds["LlamaDecoderLayer"] for i in range(module.parts[s], module.parts[s + 1]))
        for s in range(plan.pp)
    ]
    assert blocks == plan.stage_layers(model.num_layers) == e.data["planner"]["pipeline_module"]["layers_per_stage"]


@pytest.mark.parametrize("pp, micro_batches", [(2, 1), (4, 2), (4, 8), (8, 32)])
def test_deepspeeds_train_schedule_is_our_1f1b(pp, micro_batches):
    """The pipeline engine's only training schedule holds, on every stage, as many
    micro-batches in flight as the cost model's 1F1B: min(pp - stage, m)."""
    pytest.importorskip("deepspeed", reason=SKIP_REASON)
    from deepspeed.runtime.pipe import schedule

    for stage in range(pp):
        held = peak = 0
        for step in schedule.TrainSchedule(micro_batches=micro_batches, stages=pp, stage_id=stage).steps():
            for cmd in step:
                held += isinstance(cmd, schedule.ForwardPass) - isinstance(cmd, schedule.BackwardPass)
                peak = max(peak, held)
        assert peak == in_flight_micro_batches(Schedule.one_f_one_b, pp, micro_batches, stage)


@pytest.mark.parametrize("dp, tp, pp", [(2, 4, 2), (4, 2, 1), (2, 1, 4), (3, 2, 2)])
def test_deepspeeds_topology_is_the_mesh_order_we_allow(dp, tp, pp):
    """PipeModelDataParallelTopology places every rank where mesh order tp,dp,pp (innermost
    first) does, and, when both have degree > 1, not where dp,tp,pp would."""
    pytest.importorskip("deepspeed", reason=SKIP_REASON)
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    topo = PipeModelDataParallelTopology(num_pp=pp, num_mp=tp, num_dp=dp)
    degree = {Axis.dp: dp, Axis.tp: tp, Axis.pp: pp}

    def coords(rank, order):
        out = {}
        for axis in order:
            rank, out[axis] = divmod(rank, degree[axis])
        return out

    placed = [coords(r, ds_rules.MESH_ORDER) for r in range(dp * tp * pp)]
    assert all(
        (c.pipe, c.data, c.model) == (p[Axis.pp], p[Axis.dp], p[Axis.tp])
        for c, p in zip(map(topo.get_coord, range(len(placed))), placed)
    )
    swapped = [coords(r, (Axis.dp, Axis.tp, Axis.pp)) for r in range(dp * tp * pp)]
    assert (swapped != placed) == (dp > 1 and tp > 1)


# --------------------------------------------------------------------------- helpers


def ours(plan: Plan, model, job_spec: JobSpec) -> dict:
    """The plan's fields as read_back names them."""
    full = plan.recompute == "full" or plan.stage_recompute is not None
    return {
        "dp": plan.dp,
        "dp_shard": plan.dp_shard,
        "tp": plan.tp,
        "pp": plan.pp,
        "vpp": plan.vpp,
        "micro_batch_size": plan.micro_batch_size,
        "num_micro_batches": plan.num_micro_batches,
        "global_batch_size": job_spec.global_batch_size,
        "zero_stage": plan.zero_stage,
        "sequence_parallel": plan.sequence_parallel,
        "schedule": plan.schedule.value,
        "recompute": "full" if full else "none",
        "precision": job_spec.precision.value,
        "mesh_order": [a.value for a in plan.mesh_order],
        "ep": plan.ep,
        "cp": plan.cp,
        "fp8": plan.fp8,
    }


def parsed(cfg) -> dict:
    """The keys the exporter writes, as DeepSpeed's DeepSpeedConfig parsed them."""
    return {
        "train_batch_size": cfg.train_batch_size,
        "train_micro_batch_size_per_gpu": cfg.train_micro_batch_size_per_gpu,
        "gradient_accumulation_steps": cfg.gradient_accumulation_steps,
        "bf16": {"enabled": cfg.bfloat16_config.enabled},
        "fp16": {"enabled": cfg.float16_config.enabled},
        "zero_optimization": {"stage": int(cfg.zero_optimization_stage)},
        "tensor_parallel": {"autotp_size": cfg.tensor_parallel_config.autotp_size},
        "pipeline": dict(cfg.pipeline),
        "planner": cfg._param_dict.get("planner", {}),  # DeepSpeed keeps keys it does not know only here
        "expert_parallel": {
            "enabled": cfg.expert_parallel_config.enabled,
            "autoep_size": cfg.expert_parallel_config.autoep_size,
        },
    }


# --------------------------------------------------------------------------- experts (AutoEP)

MOE = [c for c in MATRIX if load_model(c[0]).is_moe]
MOE_IDS = [i for i, c in zip(IDS, MATRIX) if load_model(c[0]).is_moe]


def tiny_hf_moe(model, pipeline: bool):
    """A Hugging Face Mixtral of toy width with `model`'s expert count and top-k: what AutoEP
    detects and replaces. With `pipeline`, its decoder layers registered as a PipelineModule
    registers layers ("1", "2", ...: runtime/pipe/module.py _build) and no Hugging Face config."""
    import torch
    from transformers import MixtralConfig, MixtralForCausalLM

    hf = MixtralForCausalLM(
        MixtralConfig(
            hidden_size=16,
            intermediate_size=8,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            num_local_experts=model.num_experts,
            num_experts_per_tok=model.experts_per_token,
            vocab_size=32,
        )
    )
    if not pipeline:
        return hf
    stages = torch.nn.Module()
    for i, layer in enumerate(hf.model.layers):
        stages.add_module(str(i + 1), layer)
    return stages


def folded_expert_groups(plan: Plan) -> list[tuple]:
    """The cost model's expert-parallel groups (cost_models/tables.py:ep_link_of): each pipeline
    stage's tp x dp ranks, tp fastest, in runs of ep (pp outermost: DeepSpeed's fixed order)."""
    stage = plan.dp * plan.tp
    return [
        tuple(range(s + k, s + k + plan.ep)) for s in range(0, plan.world_size, stage) for k in range(0, stage, plan.ep)
    ]


@pytest.mark.parametrize("model_name, plan, job_spec", MOE, ids=MOE_IDS)
def test_autoep_takes_the_export_and_folds_the_planned_groups(ds_config, model_name, plan, job_spec):
    """AutoEP's own checks on the parsed section (validate_autoep_config, with the layout and
    ZeRO stage), its rank tables equal to the cost model's folding, and its detection on a Hugging
    Face MoE model (a PipelineModule's layers when pp > 1) finding every MoE block with the
    model's top-k and accepting ep for its expert count (validate_autoep_post_detection)."""
    pytest.importorskip("transformers", reason=SKIP_REASON)
    from deepspeed.module_inject.auto_ep import AutoEP
    from deepspeed.module_inject.auto_ep_config import validate_autoep_config, validate_autoep_post_detection
    from deepspeed.module_inject.auto_ep_folding import build_folding_spec, expected_folding_group_tables

    model, e = _export(model_name, plan, job_spec)
    ep = ds_config(e.data, plan.dp).expert_parallel_config
    validate_autoep_config(ep, plan.world_size, plan.pp, plan.tp, 1, zero_stage=plan.zero_stage)
    spec = build_folding_spec(
        world_size=plan.world_size,
        pp_size=plan.pp,
        tp_size=plan.tp,
        ep_size=ep.autoep_size,
        etp_size=ep.expert_tensor_parallel_size,
        mp_mode="sp",
    )
    assert list(expected_folding_group_tables(spec).ep_groups) == folded_expert_groups(plan)
    assert spec.edp_size == e.data["planner"]["experts"]["expert_data_parallel"]
    found = AutoEP(tiny_hf_moe(model, plan.pp > 1), ep).ep_parser()
    assert len(found) == 2 and {(s.num_experts, s.top_k) for s in found} == {
        (model.num_experts, model.experts_per_token)
    }
    validate_autoep_post_detection(ep, found)


def test_autoep_rejects_a_broken_export(ds_config):
    """An ep that does not divide the experts (detection), or does not tile the ranks of a
    stage (the folding spec)."""
    pytest.importorskip("transformers", reason=SKIP_REASON)
    from deepspeed.module_inject.auto_ep import AutoEP
    from deepspeed.module_inject.auto_ep_config import validate_autoep_config, validate_autoep_post_detection

    model_name, plan, job_spec = MOE[0]  # mixtral, dp 8, ep 8
    model, e = _export(model_name, plan, job_spec)
    three = ds_config(
        {**e.data, "expert_parallel": {**e.data["expert_parallel"], "autoep_size": 3}}, plan.dp
    ).expert_parallel_config
    found = AutoEP(tiny_hf_moe(model, False), three).ep_parser()
    with pytest.raises(
        ValueError, match="num_experts=8 in layer 'model.layers.0.mlp' is not divisible by autoep_size=3"
    ):
        validate_autoep_post_detection(three, found)
    with pytest.raises(ValueError, match=r"\(3 \* 1 = 3\) must divide the stage size"):
        validate_autoep_config(three, plan.world_size, plan.pp, plan.tp, 1, zero_stage=plan.zero_stage)
    sixteen = ds_config(
        {**e.data, "expert_parallel": {**e.data["expert_parallel"], "autoep_size": 16}}, plan.dp
    ).expert_parallel_config
    with pytest.raises(ValueError, match="autoep_size=16 exceeds num_experts=8"):
        validate_autoep_post_detection(sixteen, found)


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
def test_mixtral_solved_for_deepspeed_exports_and_deepspeed_takes_it(tmp_path, monkeypatch):
    """`plan solve --target deepspeed` on Mixtral 8x7B (64 H100), then `plan export` of the plan
    and every alternative: each reads back to its plan and, with DeepSpeed, parses and passes
    AutoEP's checks."""
    path = tmp_path / "mixtral.json"
    cli = [sys.executable, "-m", "planner.cli.main"]
    solved = subprocess.run(
        [*cli, "solve", *MIXTRAL_SOLVE, "--target", "deepspeed", "--top-k", "4", "-o", str(path)],
        capture_output=True,
        text=True,
    )
    assert solved.returncode == 0, solved.stderr
    doc = json.loads(path.read_text())
    model, job_spec = load_model("mixtral-8x7b"), JobSpec.model_validate(doc["job"])
    for k, entry in enumerate([doc] + doc["alternatives"]):
        res = subprocess.run(
            [*cli, "export", str(path), "--to", "deepspeed", "--json", *(["--alternative", str(k)] if k else [])],
            capture_output=True,
            text=True,
        )
        assert res.returncode == 0, res.stderr
        plan, data = Plan.model_validate(entry["plan"]), json.loads(res.stdout)["data"]
        assert ds_export.read_back(data) == ours(plan, model, job_spec)
        try:
            from deepspeed.module_inject.auto_ep_config import validate_autoep_config
            from deepspeed.runtime import config as ds_config_module
        except ImportError:
            continue
        monkeypatch.setattr(ds_config_module.dist, "get_rank", lambda *a, **k: 0)
        mpu = type("DataParallelSize", (), {"get_data_parallel_world_size": lambda self, dp=plan.dp: dp})()
        cfg = ds_config_module.DeepSpeedConfig(data, mpu=mpu)
        validate_autoep_config(
            cfg.expert_parallel_config, plan.world_size, plan.pp, plan.tp, 1, zero_stage=plan.zero_stage
        )
