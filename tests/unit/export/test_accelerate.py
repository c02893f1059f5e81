"""`plan export --to accelerate`: the YAML goes through Accelerate 1.15's own loader and launcher
(ClusterConfig.from_yaml_file, `accelerate launch`'s argument validation and environment, then
FullyShardedDataParallelPlugin and ParallelismConfig built from that environment as the training
process builds them), broken configs are rejected by the same code, the config reads back to the
plan, and plans Accelerate cannot run are refused naming the feature."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import yaml

from planner import stacks as exporters
from planner.errors import UsageError
from planner.export.accelerate import read_back
from planner.stacks.accelerate.rules import RULES, problems
from planner.presets import load_model
from planner.specs import Axis, JobSpec, Plan, StageRecompute
from tests.paths import HF_CONFIGS

EXTRA = "the export extra is not installed: pip install '.[export]'"
HF = HF_CONFIGS  # published Hugging Face configs (SOURCES.md)
TP_EXTRA = (
    "Accelerate's tensor parallelism needs transformers (TorchTensorParallelConfig checks it): pip install '.[export]'"
)


def case(
    model: str,
    gpus: int,
    dp: int,
    tp: int,
    zero: int,
    mbs: int,
    m: int,
    *,
    recompute="none",
    precision="bf16",
    seq=4096,
    per_node=None,
    **plan_fields,
):
    """A valid (model, plan, job, gpus, gpus_per_node) for one data-parallel x TP layout."""
    spec = load_model(model)
    plan = Plan(
        dp=dp,
        tp=tp,
        pp=1,
        micro_batch_size=mbs,
        num_micro_batches=m,
        recompute=recompute,
        zero_stage=zero,
        **plan_fields,
    )
    job = JobSpec(global_batch_size=dp * mbs * m, seq_len=min(seq, spec.max_seq_len), precision=precision)
    plan.validate_for(spec, job, gpus)
    return SimpleNamespace(model=spec, plan=plan, job=job, gpus=gpus, per_node=per_node)


# Every ZeRO stage Accelerate has (0 = DDP, 2, 3 = FSDP2), TP with FSDP2, both recompute modes
# (also given per stage), each precision, one GPU, one node, several nodes.
MATRIX = {
    "8b-fsdp3-dp16": case("llama3-8b", 16, 16, 1, 3, 2, 2, per_node=8),
    "8b-fsdp3-tp2-full": case("llama3-8b", 16, 8, 2, 3, 4, 2, recompute="full", per_node=8),
    "8b-fsdp2-tp4": case("llama3-8b", 16, 4, 4, 2, 1, 8),
    "8b-fsdp3-tp8-one-node": case("llama3-8b", 16, 2, 8, 3, 1, 4, per_node=16),
    "70b-fsdp3-tp8-full": case("llama3-70b", 64, 8, 8, 3, 1, 16, recompute="full", per_node=8),
    "70b-fsdp2-tp8-full-per-stage": case(
        "llama3-70b", 32, 4, 8, 2, 1, 8, per_node=8, recompute="full", stage_recompute=[StageRecompute(full=80)]
    ),
    "1.3b-ddp-fp16": case("gpt3-1.3b", 8, 8, 1, 0, 4, 2, precision="fp16", per_node=8),
    "1.3b-ddp-full": case("gpt3-1.3b", 8, 8, 1, 0, 4, 2, recompute="full"),
    "1.3b-fsdp2-fp32": case("gpt3-1.3b", 4, 4, 1, 2, 2, 1, precision="fp32"),
    "1.3b-one-gpu": case("gpt3-1.3b", 1, 1, 1, 0, 8, 4),
    # Mixture of experts at ep = 1 (Accelerate has no expert parallelism): FSDP2 shards the
    # experts with the rest of each decoder layer; DDP replicates them.
    "mixtral-fsdp3-dp16-full": case("mixtral-8x7b", 16, 16, 1, 3, 1, 4, recompute="full", per_node=8),
    "qwen3-moe-fsdp2-dp8": case("qwen3-30b-a3b", 8, 8, 1, 2, 1, 4),
    "mixtral-ddp-dp8": case("mixtral-8x7b", 8, 8, 1, 0, 1, 2),
    # Context parallelism (cp 2, 4; with dp, TP, both FSDP2 stages) and FP8 (Transformer Engine;
    # DDP and FSDP2, with and without CP).
    "8b-fsdp3-cp2-dp8": case("llama3-8b", 16, 8, 1, 3, 1, 2, cp=2, seq=8192, per_node=8),
    "8b-fsdp2-cp4-dp2-tp2-full": case("llama3-8b", 16, 2, 2, 2, 1, 4, cp=4, seq=16384, recompute="full"),
    "8b-fsdp3-fp8-dp16": case("llama3-8b", 16, 16, 1, 3, 1, 2, fp8=True, per_node=8),
    "8b-ddp-fp8-full": case("llama3-8b", 8, 8, 1, 0, 1, 2, fp8=True, recompute="full"),
    "8b-fsdp3-cp2-fp8-dp4": case("llama3-8b", 8, 4, 1, 3, 1, 2, cp=2, fp8=True, seq=8192),
    # Hybrid sharding (HSDP): two replicas of an 8-rank shard group (one node each), and
    # replicas of a dp_shard x cp group beside TP.
    "8b-hsdp3-shard8-dp16": case("llama3-8b", 16, 16, 1, 3, 1, 2, dp_shard=8, per_node=8),
    "8b-hsdp2-shard2-cp2-tp2": case("llama3-8b", 16, 4, 2, 2, 1, 2, dp_shard=2, cp=2, seq=8192, per_node=8),
    # A Hugging Face architecture beyond Llama's (Gemma 2: GeGLU, four norms, windows, soft-capped
    # logits), which the script's model builds: the header names it.
    "gemma2-fsdp3-tp2-dp4": case(str(HF / "gemma-2-9b.json"), 8, 4, 2, 3, 1, 2),
}


def _export(c):
    exporters.export("accelerate", c.plan, c.model, c.job, c.gpus)  # passes the registry's checks
    return exporters.get("accelerate").export(c.plan, c.model, c.job, c.gpus, gpus_per_node=c.per_node)


def _expected(c) -> dict:
    full = c.plan.recompute.value == "full"
    return {
        "num_gpus": c.gpus,
        "dp": c.plan.dp,
        "dp_shard": c.plan.dp_shard,
        "cp": c.plan.cp,
        "fp8": c.plan.fp8,
        "tp": c.plan.tp,
        "pp": 1,
        "vpp": 1,
        "zero_stage": c.plan.zero_stage,
        "sequence_parallel": False,
        "recompute": "full" if full else "none",
        "precision": c.job.precision.value,
        "mesh_order": ["tp", "dp", "pp"],
        "micro_batch_size": c.plan.micro_batch_size,
        "num_micro_batches": c.plan.num_micro_batches,
        "global_batch_size": c.job.global_batch_size,
        "seq_len": c.job.seq_len,
    }


# --------------------------------------------------------------------------- without the package


@pytest.mark.parametrize("name", MATRIX)
def test_export_text_is_the_data_and_reads_back_to_the_plan(name):
    c = MATRIX[name]
    out = _export(c)
    assert (out.stack, out.kind) == ("accelerate", "yaml")
    assert yaml.safe_load(out.text) == out.data  # the comment block is only comments
    assert read_back(out.text) == _expected(c)
    degrees = read_back(out.data)  # the structured data alone: no batch (it is not in Accelerate's config)
    assert {k: degrees[k] for k in ("dp", "dp_shard", "tp", "zero_stage", "precision")} == {
        k: _expected(c)[k] for k in ("dp", "dp_shard", "tp", "zero_stage", "precision")
    }
    assert ('tp_plan="auto"' in out.text) == (c.plan.tp > 1)


def test_read_back_refuses_a_batch_comment_that_does_not_multiply():
    text = _export(MATRIX["8b-fsdp3-dp16"]).text.replace("global_batch_size: 64", "global_batch_size: 65")
    with pytest.raises(ValueError, match="global_batch_size 65 is not dp 16 x micro_batch_size 2"):
        read_back(text)


def test_nodes_from_gpus_per_node():
    c = MATRIX["70b-fsdp3-tp8-full"]
    assert _export(c).data["num_machines"] == 8
    one = exporters.export(
        "accelerate", c.plan, c.model, c.job, c.gpus
    )  # no cluster: one node, and the comment says so
    assert one.data["num_machines"] == 1 and "set num_machines to the node count" in one.text
    with pytest.raises(UsageError, match="do not fill whole nodes of 24"):
        exporters.get("accelerate").export(c.plan, c.model, c.job, c.gpus, gpus_per_node=24)


def _refused(model: str, gpus: int, target="generic", precision="bf16", **fields):
    """A valid plan (for `target`'s job) that Accelerate cannot run."""
    spec = load_model(model)
    fields = {"pp": 1, "micro_batch_size": 1, "num_micro_batches": 8, **fields}
    plan = Plan(**fields)
    job = JobSpec(
        global_batch_size=plan.dp * plan.micro_batch_size * plan.num_micro_batches,
        seq_len=2048,
        target=target,
        precision=precision,
    )
    plan.validate_for(spec, job, gpus)
    return plan, spec, job


REFUSED = {
    "ZeRO stage 1": _refused("llama3-8b", 16, dp=16, tp=1, zero_stage=1),
    "pipeline parallelism pp=2": _refused("llama3-8b", 16, dp=8, tp=1, pp=2, zero_stage=3),
    "interleaved virtual stages vpp=2": _refused(
        "llama3-8b", 16, dp=8, tp=1, pp=2, vpp=2, schedule="interleaved-1f1b", zero_stage=0
    ),
    "sequence parallelism": _refused("llama3-8b", 16, dp=8, tp=2, zero_stage=3, sequence_parallel=True),
    "TP communication overlap": _refused(
        "llama3-8b", 16, dp=8, tp=2, zero_stage=3, sequence_parallel=True, tp_comm_overlap=True, target="megatron"
    ),
    "ZeRO stage 0 with tensor parallelism": _refused("llama3-8b", 16, dp=8, tp=2, zero_stage=0),
    "tensor parallelism tp=8 without data parallelism": _refused("llama3-8b", 8, dp=1, tp=8, zero_stage=3),
    "selective recompute": _refused("llama3-8b", 16, dp=16, tp=1, zero_stage=3, recompute="selective"),
    "recompute mixing modes": _refused(
        "llama3-8b", 16, dp=16, tp=1, zero_stage=3, stage_recompute=[StageRecompute(none=16, full=16)]
    ),
    "mesh order dp,tp,pp": _refused("llama3-8b", 16, dp=8, tp=2, zero_stage=3, mesh_order=["dp", "tp", "pp"]),
    "tp=16 over 8 KV heads": _refused("llama3-8b", 32, dp=2, tp=16, zero_stage=3),
    "expert parallelism ep=8 (accelerate has none)": _refused("mixtral-8x7b", 16, dp=16, tp=1, ep=8, zero_stage=3),
    "context parallelism cp=2 with ZeRO-0": _refused("llama3-8b", 16, dp=8, tp=1, cp=2, zero_stage=0),
    "FP8 with fp16 precision": _refused("llama3-8b", 16, dp=16, tp=1, zero_stage=3, fp8=True, precision="fp16"),
    "FP8 with tensor parallelism tp=2": _refused("llama3-8b", 16, dp=8, tp=2, zero_stage=3, fp8=True),
    "context parallelism cp=2 with a sliding window": _refused(
        str(HF / "mistral-7b-v0.1.json"), 16, dp=8, tp=1, cp=2, zero_stage=3
    ),
    "hybrid sharding dp_shard=8 with ZeRO stage 1 (accelerate has it with stages 2, 3)": _refused(
        "llama3-8b", 16, dp=16, tp=1, zero_stage=1, dp_shard=8
    ),
}


@pytest.mark.parametrize("feature", REFUSED)
def test_plans_accelerate_cannot_run_are_refused_naming_the_feature(feature):
    plan, model, job = REFUSED[feature]
    found = RULES.plan_problems(plan, model) + problems(plan, model, job)
    assert any(feature in p for p in found), found
    with pytest.raises(UsageError, match=r"accelerate cannot run this plan: .*--target accelerate") as err:
        exporters.export("accelerate", plan, model, job, plan.world_size)
    assert found[0] in str(err.value)


def test_a_shard_group_of_one_rank_is_refused_in_one_line():
    """dp_shard 1 (replicas of one rank each) is no ParallelismConfig Accelerate takes
    (test_hsdp_over_one_rank_is_rejected_by_accelerate): refused, not written as FSDP."""
    plan, model, job = _refused("llama3-8b", 16, dp=16, tp=1, zero_stage=3, dp_shard=1)
    with pytest.raises(UsageError, match="dp_shard=1") as err:
        exporters.export("accelerate", plan, model, job, plan.world_size)
    assert len(str(err.value).splitlines()) == 1


def test_the_header_names_an_architecture_beyond_llamas():
    text = _export(MATRIX["gemma2-fsdp3-tp2-dp4"]).text
    line = next(x for x in text.splitlines() if x.startswith("# Model:"))
    for feature in ("GeGLU", "4 norms per layer", "sliding window of 4096 keys", "soft-capped logits"):
        assert feature in line
    # a Llama's says its rotary embedding only, which Accelerate takes from the model's config.json
    line = next(x for x in _export(MATRIX["8b-fsdp3-dp16"]).text.splitlines() if x.startswith("# Model:"))
    assert line == (
        "# Model: planned with rotary base 500,000, Llama 3.1 rotary scaling (factor 8, low_freq_factor 1, "
        "high_freq_factor 4, original 8192) (transformers builds them from the model's config.json)"
    )


def test_accelerate_refuses_context_parallelism_over_a_window():
    """What the cp-with-a-window refusal says: Accelerate's context-parallel hooks drop the
    attention mask and refuse a model that has a window (Mistral's config: sliding_window on
    every layer), and take one that has none."""
    pytest.importorskip("accelerate", reason=EXTRA)
    import torch.nn as nn
    from accelerate.big_modeling import _attach_context_parallel_hooks

    def model(**config):
        m = nn.Module()
        m.config = SimpleNamespace(layer_types=None, **config)
        return m

    with pytest.raises(ValueError, match="Context parallelism does not support attention layers of type"):
        _attach_context_parallel_hooks(model(sliding_window=4096))
    _attach_context_parallel_hooks(model(sliding_window=None))


def test_rules_have_no_expert_parallelism():
    assert RULES.max_ep == 1 and "no expert parallelism" in RULES.notes["experts"]


def test_rules_have_context_parallelism_and_fp8():
    assert RULES.max_cp is None and "alltoall" in RULES.notes["context parallelism"]
    assert RULES.fp8 and "Transformer Engine" in RULES.notes["FP8"]


def test_read_back_refuses_an_all_gather_for_context_parallelism():
    data = _export(MATRIX["8b-fsdp3-cp2-dp8"]).data
    data["parallelism_config"]["parallelism_config_cp_comm_strategy"] = "allgather"
    with pytest.raises(ValueError, match="cp_comm_strategy allgather all-gathers K/V"):
        read_back(data)


def test_mesh_order_with_one_nontrivial_axis_is_accepted():
    c = case("llama3-8b", 16, 16, 1, 3, 1, 4, mesh_order=[Axis.dp, Axis.pp, Axis.tp])  # tp = 1: order is moot
    assert _export(c).data["parallelism_config"]["parallelism_config_dp_shard_size"] == 16


def test_module_imports_neither_torch_nor_accelerate():
    code = "import sys, planner.export.accelerate; print(sorted({'torch', 'accelerate', 'transformers'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --------------------------------------------------------------------------- Accelerate's own code


def _write(tmp_path, text: str, name="accelerate.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def _launch(path, monkeypatch):
    """What `accelerate launch --config_file PATH train.py` makes of the file, up to the objects
    the training process builds from the launcher's environment (Accelerator.__init__ builds
    ParallelismConfig() from PARALLELISM_CONFIG_* and FullyShardedDataParallelPlugin() from
    FSDP_*; ParallelismConfig._validate_accelerator then checks it against the world)."""
    pytest.importorskip("accelerate", reason=EXTRA)
    from accelerate.commands.config.config_args import ClusterConfig
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.parallelism_config import ParallelismConfig
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.launch import prepare_multi_gpu_env, prepare_simple_launcher_cmd_env

    from accelerate.utils import launch as launch_utils

    # The launcher refuses fp8 unless an FP8 library is installed (here none is: Transformer Engine
    # needs CUDA); it checks nothing else about it, so stand in for the training machine's.
    monkeypatch.setattr(launch_utils, "is_fp8_available", lambda: True)
    config = ClusterConfig.from_yaml_file(str(path))
    args, _, _ = _validate_launch_command(launch_command_parser().parse_args(["--config_file", str(path), "train.py"]))
    env = prepare_multi_gpu_env(args) if (args.use_fsdp or args.multi_gpu) else prepare_simple_launcher_cmd_env(args)[1]
    for key in [k for k in os.environ if k.startswith(("ACCELERATE_", "FSDP_", "PARALLELISM_CONFIG_"))]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        if key.startswith(("ACCELERATE_", "FSDP_", "PARALLELISM_CONFIG_")):
            monkeypatch.setenv(key, value)
    fsdp = FullyShardedDataParallelPlugin() if args.use_fsdp else None
    sizes = ParallelismConfig() if env.get("ACCELERATE_USE_PARALLELISM_CONFIG") == "true" else None
    if sizes is not None:
        world = SimpleNamespace(
            num_processes=config.num_processes,
            multi_device=config.num_processes > 1,
            is_main_process=True,
            is_fsdp2=fsdp is not None and fsdp.fsdp_version == 2,
            distributed_type=config.distributed_type,
        )
        sizes._validate_accelerator(world)
    return SimpleNamespace(config=config, args=args, env=env, fsdp=fsdp, sizes=sizes, fp8=_fp8_recipe(env, monkeypatch))


def _fp8_recipe(env: dict, monkeypatch):
    """The FP8 recipe the training process builds from the launcher's environment: the backend
    Accelerator.fp8_backend reads (ACCELERATE_FP8_BACKEND) and TERecipeKwargs() from
    ACCELERATE_FP8_* (its only use of Transformer Engine is the availability check, stood in for)."""
    if env.get("ACCELERATE_MIXED_PRECISION") != "fp8":
        return None
    from accelerate.utils import dataclasses as accelerate_dataclasses

    monkeypatch.setattr(accelerate_dataclasses, "is_transformer_engine_available", lambda: True)
    return SimpleNamespace(backend=env.get("ACCELERATE_FP8_BACKEND"), recipe=accelerate_dataclasses.TERecipeKwargs())


@pytest.mark.slow
@pytest.mark.parametrize("name", MATRIX)
def test_accelerate_launch_accepts_the_export_and_means_the_plan(name, tmp_path, monkeypatch):
    c = MATRIX[name]
    if c.plan.tp > 1:
        pytest.importorskip("transformers", reason=TP_EXTRA)
    run = _launch(_write(tmp_path, _export(c).text), monkeypatch)
    assert run.config.num_processes == c.gpus
    assert run.args.mixed_precision == (
        "fp8" if c.plan.fp8 else {"bf16": "bf16", "fp16": "fp16", "fp32": "no"}[c.job.precision.value]
    )
    if c.plan.fp8:  # Transformer Engine, E4M3 forward / E5M2 gradients, every GEMM of each linear in FP8
        assert (run.fp8.backend, run.fp8.recipe.fp8_format, run.fp8.recipe.override_linear_precision) == (
            "TE",
            "HYBRID",
            (False,) * 3,
        )
        assert not run.fp8.recipe.use_mxfp8_block_scaling  # per-tensor scales
    else:
        assert run.fp8 is None
    per_node = c.gpus // run.config.num_machines
    assert per_node == min(c.per_node or c.gpus, c.gpus)
    if c.plan.zero_stage == 0:
        assert run.config.distributed_type.value == ("MULTI_GPU" if c.gpus > 1 else "NO")
        assert run.fsdp is None and run.sizes is None
        if c.gpus > 1:
            assert run.args.nproc_per_node == str(per_node)
        return
    assert run.config.distributed_type.value == "FSDP" and run.fsdp.fsdp_version == 2
    assert run.args.nproc_per_node == str(per_node)
    assert run.fsdp.reshard_after_forward is (
        c.plan.zero_stage == 3
    )  # ZeRO-3 full shard, ZeRO-2 keeps params through backward
    assert run.fsdp.activation_checkpointing is (_expected(c)["recompute"] == "full")
    shard = c.plan.dp_shard or c.plan.dp  # HSDP: dp / dp_shard replicas of a shard group
    assert (
        run.sizes.total_size,
        run.sizes.dp_shard_size,
        run.sizes.dp_replicate_size,
        run.sizes.tp_size,
        run.sizes.cp_size,
    ) == (c.gpus, shard, c.plan.dp // shard, c.plan.tp, c.plan.cp)
    # fully_shard's mesh (utils/fsdp_utils.py:fsdp2_prepare_model): replicas outside the shard group
    assert run.sizes.fsdp_dim_names == (["dp_replicate"] if c.plan.dp_shard else []) + ["dp_shard_cp"]
    names, shape = run.sizes._get_mesh()  # outermost first
    axes = [{"dp_replicate": "dp", "dp_shard": "dp", "tp": "tp", "cp": "cp"}[n] for n in reversed(names)]
    innermost_first = [a for i, a in enumerate(axes) if a not in axes[:i]]  # dp: the shard group, then its replicas
    degree = {"dp": c.plan.dp, "cp": c.plan.cp, "tp": c.plan.tp, "pp": 1}
    planned = [
        b for a in c.plan.mesh_order for b in (("cp", "dp") if a.value == "dp" else (a.value,))
    ]  # cp innermost in dp
    assert innermost_first == [a for a in planned if degree[a] > 1]
    if c.plan.cp > 1:  # torch's ring rotation; FSDP over dp_shard x cp (the plan's weights over dp x cp)
        assert (run.sizes.cp_backend, run.sizes.cp_handler.cp_comm_strategy) == ("torch", "alltoall")
        assert run.sizes.dp_shard_cp_dim_names == ["dp_shard", "cp"]


@pytest.mark.parametrize("name", MATRIX)
def test_round_trip_through_accelerates_loader(name, tmp_path):
    pytest.importorskip("accelerate", reason=EXTRA)
    from accelerate.commands.config.config_args import ClusterConfig

    c = MATRIX[name]
    text = _export(c).text
    parsed = ClusterConfig.from_yaml_file(str(_write(tmp_path, text)))
    back = read_back(parsed)  # degrees from what Accelerate parsed
    script = read_back(text)  # the batch from the comment block
    expected = _expected(c)
    layout_keys = (
        "num_gpus",
        "dp",
        "dp_shard",
        "cp",
        "fp8",
        "tp",
        "pp",
        "vpp",
        "zero_stage",
        "sequence_parallel",
        "precision",
        "mesh_order",
    )
    assert {k: back[k] for k in layout_keys} == {k: expected[k] for k in layout_keys}
    assert script == expected
    assert script["dp"] * script["micro_batch_size"] * script["num_micro_batches"] == c.job.global_batch_size


def _broken(tmp_path, name: str, edit):
    data = _export(MATRIX[name]).data
    edit(data)
    return _write(tmp_path, yaml.safe_dump(data))


def test_sizes_that_do_not_multiply_to_the_world_are_rejected(tmp_path, monkeypatch):
    path = _broken(
        tmp_path, "8b-fsdp3-dp16", lambda d: d["parallelism_config"].update(parallelism_config_dp_shard_size=8)
    )
    with pytest.raises(ValueError, match=r"total_size \(8\) does not match num_processes \(16\)"):
        _launch(path, monkeypatch)


def test_broken_context_parallel_configs_are_rejected(tmp_path, monkeypatch):
    """A cp size that does not tile the world, a rotation torch does not have, and CP beside
    replicas without sharding (DDP): Accelerate's ParallelismConfig refuses them."""
    path = _broken(tmp_path, "8b-fsdp3-cp2-dp8", lambda d: d["parallelism_config"].update(parallelism_config_cp_size=3))
    with pytest.raises(ValueError, match=r"total_size \(24\) does not match num_processes \(16\)"):
        _launch(path, monkeypatch)
    path = _broken(
        tmp_path,
        "8b-fsdp3-cp2-dp8",
        lambda d: d["parallelism_config"].update(parallelism_config_cp_comm_strategy="ring"),
    )
    with pytest.raises(ValueError, match="Invalid cp_comm_strategy: ring"):
        _launch(path, monkeypatch)
    path = _broken(
        tmp_path,
        "1.3b-ddp-full",
        lambda d: d.update(
            parallelism_config={"parallelism_config_dp_replicate_size": 4, "parallelism_config_cp_size": 2}
        ),
    )
    with pytest.raises(
        ValueError, match=r"Tensor/Context parallelism \(tp/cp_size > 1\) cannot be used with pure data parallelism"
    ):
        _launch(path, monkeypatch)


def test_a_broken_fp8_config_is_rejected(tmp_path, monkeypatch):
    path = _broken(tmp_path, "8b-fsdp3-fp8-dp16", lambda d: d["fp8_config"].update(fp8_format="E3M4"))
    with pytest.raises(ValueError, match="`fp8_format` must be one of"):
        _launch(path, monkeypatch)


def test_batch_keys_in_the_config_are_rejected(tmp_path):
    """The tempting mistake: Accelerate's config has no batch or accumulation key."""
    pytest.importorskip("accelerate", reason=EXTRA)
    from accelerate.commands.config.config_args import ClusterConfig

    path = _broken(
        tmp_path, "8b-fsdp3-dp16", lambda d: d.update(gradient_accumulation_steps=2, per_device_train_batch_size=2)
    )
    with pytest.raises(
        ValueError, match=r"unknown keys \(\['gradient_accumulation_steps', 'per_device_train_batch_size'\]\)"
    ):
        ClusterConfig.from_yaml_file(str(path))


def test_fsdp1_sharding_strategy_under_fsdp2_is_rejected(tmp_path, monkeypatch):
    path = _broken(
        tmp_path, "8b-fsdp3-dp16", lambda d: d["fsdp_config"].update(fsdp_reshard_after_forward="FULL_SHARD")
    )
    with pytest.raises(ValueError, match="invalid truth value full_shard"):
        _launch(path, monkeypatch)


def test_ddp_beside_tp_is_rejected(tmp_path, monkeypatch):
    """Why RULES allows TP only with ZeRO-2/3: replicas without sharding next to TP are refused."""
    pytest.importorskip("transformers", reason=TP_EXTRA)
    path = _broken(
        tmp_path,
        "8b-fsdp3-tp2-full",
        lambda d: d["parallelism_config"].update(
            parallelism_config_dp_replicate_size=8, parallelism_config_dp_shard_size=1
        ),
    )
    with pytest.raises(ValueError, match="cannot be used with pure data parallelism"):
        _launch(path, monkeypatch)


def test_hsdp_over_one_rank_is_rejected_by_accelerate(tmp_path, monkeypatch):
    """Why the exporter refuses dp_shard 1: replicas of a one-rank shard group leave FSDP2
    nothing to shard across (ParallelismConfig._validate_accelerator)."""
    path = _broken(
        tmp_path,
        "8b-hsdp3-shard8-dp16",
        lambda d: d["parallelism_config"].update(
            parallelism_config_dp_replicate_size=16, parallelism_config_dp_shard_size=1
        ),
    )
    with pytest.raises(ValueError, match="no dimension for FSDP to shard across"):
        _launch(path, monkeypatch)


def test_fsdp_without_a_shard_dimension_beside_tp_is_rejected(tmp_path, monkeypatch):
    """Why problems() refuses tp > 1 with dp = 1 under FSDP2."""
    pytest.importorskip("transformers", reason=TP_EXTRA)
    path = _broken(
        tmp_path,
        "8b-fsdp3-tp2-full",
        lambda d: (
            d.update(num_processes=2, num_machines=1)
            or d["parallelism_config"].update(parallelism_config_dp_shard_size=1, parallelism_config_tp_size=2)
        ),
    )
    with pytest.raises(ValueError, match="no dimension for FSDP to shard across"):
        _launch(path, monkeypatch)


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
def test_mixtral_solved_for_accelerate_exports_at_ep_1(tmp_path, monkeypatch):
    """`plan solve --target accelerate` on Mixtral 8x7B (64 H100) searches ep = 1 only; `plan
    export` of the plan and every alternative reads back to it and, with Accelerate, launches."""
    path = tmp_path / "mixtral.json"
    cli = [sys.executable, "-m", "planner.cli.main"]
    solved = subprocess.run(
        [*cli, "solve", *MIXTRAL_SOLVE, "--target", "accelerate", "--top-k", "4", "-o", str(path)],
        capture_output=True,
        text=True,
    )
    assert solved.returncode == 0, solved.stderr
    doc = json.loads(path.read_text())
    for k, entry in enumerate([doc] + doc["alternatives"]):
        plan = Plan.model_validate(entry["plan"])
        assert plan.ep == 1
        res = subprocess.run(
            [*cli, "export", str(path), "--to", "accelerate", "--json", *(["--alternative", str(k)] if k else [])],
            capture_output=True,
            text=True,
        )
        assert res.returncode == 0, res.stderr
        text = json.loads(res.stdout)["text"]
        back = read_back(text)
        assert (back["dp"], back["tp"], back["zero_stage"], back["num_micro_batches"]) == (
            plan.dp,
            plan.tp,
            plan.zero_stage,
            plan.num_micro_batches,
        )
        if importlib.util.find_spec("accelerate") is not None and (
            plan.tp == 1 or importlib.util.find_spec("transformers")
        ):
            run = _launch(_write(tmp_path, text, f"mixtral-{k}.yaml"), monkeypatch)
            assert run.config.num_processes == 64


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
def test_llama3_8b_128k_solved_for_accelerate_exports_with_context_parallelism(tmp_path, monkeypatch):
    """`plan solve --target accelerate` on Llama 3 8B, 128k tokens, 8 H100, then `plan export`
    of the plan and every alternative: context parallelism is chosen, the config reads back to
    the plan's cp and, with Accelerate, launches with that cp size."""
    path = tmp_path / "long.json"
    cli = [sys.executable, "-m", "planner.cli.main"]
    solved = subprocess.run(
        [*cli, "solve", *LONG_SOLVE, "--target", "accelerate", "--top-k", "4", "-o", str(path)],
        capture_output=True,
        text=True,
    )
    assert solved.returncode == 0, solved.stderr
    doc = json.loads(path.read_text())
    entries = [doc] + doc["alternatives"]
    assert any(Plan.model_validate(e["plan"]).cp > 1 for e in entries)
    for k, entry in enumerate(entries):
        plan = Plan.model_validate(entry["plan"])
        res = subprocess.run(
            [*cli, "export", str(path), "--to", "accelerate", "--json", *(["--alternative", str(k)] if k else [])],
            capture_output=True,
            text=True,
        )
        assert res.returncode == 0, res.stderr
        text = json.loads(res.stdout)["text"]
        back = read_back(text)
        assert (back["dp"], back["cp"], back["tp"], back["zero_stage"]) == (plan.dp, plan.cp, plan.tp, plan.zero_stage)
        if importlib.util.find_spec("accelerate") is not None and (
            plan.tp == 1 or importlib.util.find_spec("transformers")
        ):
            run = _launch(_write(tmp_path, text, f"long-{k}.yaml"), monkeypatch)
            assert (run.config.num_processes, run.sizes.cp_size if run.sizes else 1) == (8, plan.cp)


# ----- Accelerate trains the user's transformers model, built from its config.json: the planned
# spec must be that model. transformers reads each shipped config and builds it on the meta device.

ROUND_TRIP = sorted(p.stem for p in HF.glob("*.json") if p.stem != "gemma-3-27b")  # gemma-3-27b: multimodal, refused
# Parameters ours counts differently, relative: OLMo 2's q/k norms span the whole projection (ours
# counts them a head wide, 3.5e-5); GPT-OSS (8e-7).
PARAMS_REL = 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("name", ROUND_TRIP)
def test_transformers_builds_the_model_the_spec_planned(name):
    """The rotary base, scaling type and factor, the q/k/v biases and the parameter count of the
    model transformers builds from the config are the spec's (planner/presets/hf_config.py)."""
    if importlib.util.find_spec("transformers") is None or importlib.util.find_spec("torch") is None:
        pytest.skip(EXTRA)
    import warnings

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from cost_models.compute import total_params
    from planner.presets import from_hf_config
    from planner.specs import ModelSpec

    data = json.loads((HF / f"{name}.json").read_text())
    spec = ModelSpec.model_validate(from_hf_config(dict(data), name))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = AutoConfig.for_model(**data)
        with torch.device("meta"):
            built = AutoModelForCausalLM.from_config(config)
    rope = config.rope_parameters
    rope = rope.get("full_attention", rope) if "full_attention" in rope else rope  # Gemma 3: global layers' rope
    assert float(rope["rope_theta"]) == spec.rope_theta
    scaled = rope.get("rope_type", "default") != "default"
    assert scaled == (spec.rope_scaling is not None)
    if scaled:
        assert (rope["rope_type"], float(rope["factor"])) == (spec.rope_scaling.rope_type, spec.rope_scaling.factor)
    names = [k for k, _ in built.named_parameters()]
    assert any(k.endswith("q_proj.bias") for k in names) == (spec.qkv_bias or spec.linear_bias)
    count = sum(p.numel() for p in built.parameters())
    assert abs(total_params(spec) / count - 1) < PARAMS_REL, (total_params(spec), count)
