"""Rehearsing a big plan on small hardware (`plan run --scale-* --rehearse-dp`), without
launching: KV heads follow the heads, the scaled model is named as such, every refusal says
which option value works (and that value is checked to work), and a rehearsal world keeps
the layout with fewer data-parallel replicas. One launch at the end (2 processes) runs such
a rehearsal and reads its progress off a pipe."""

import json
import re

import pytest
from click.testing import CliRunner

from hardware_profiles import load_cluster
from planner.cli.main import cli
from planner.errors import UsageError
from planner.executor.prepare import Rehearsal, check_host_memory, check_world, prepare_case
from planner.presets import load_model
from planner.specs import JobSpec, ModelSpec, Plan
from tests.paths import HF_CONFIGS

LLAMA8B = load_model("llama3-8b")  # 32 heads, 8 KV heads
SMALL = dict(layers=2, hidden=256, vocab=1024, seq_len=128)
JOB = JobSpec(global_batch_size=4, seq_len=2048, precision="bf16")


def tp2(**kw) -> Plan:
    return Plan(**(dict(dp=1, tp=2, pp=1, micro_batch_size=1, num_micro_batches=4, sequence_parallel=True) | kw))


def option_values(message: str) -> dict:
    """{'--scale-heads': 4, ...}: the options a message tells the user to pass."""
    found: dict = {}
    for k, v in re.findall(r"(--[a-z-]+) (\d+)", message):
        found.setdefault(k, int(v))  # the first suggestion of each option
    return found


def rehearsal_with(r: Rehearsal, options: dict) -> Rehearsal:
    names = {
        "--scale-heads": "heads",
        "--scale-hidden": "hidden",
        "--scale-vocab": "vocab",
        "--scale-seq-len": "seq_len",
        "--scale-layers": "layers",
        "--rehearse-dp": "dp",
    }
    return Rehearsal(**(r.__dict__ | {names[k]: v for k, v in options.items() if k in names}))


# --------------------------------------------------------------------------- KV heads and names


def test_kv_heads_follow_the_heads_at_the_nearest_count_tp_divides():
    """Issue 18 (8): --scale-heads 4 on llama3-8b at tp=2 was refused ('tp=2 does not divide
    the 1 KV heads of llama3-8b'): 32:8 gives 1 KV head; 2 is the nearest count that divides
    the 4 heads and that tp divides, and the notes say why."""
    case = prepare_case(LLAMA8B, JOB, tp2(), Rehearsal(heads=4, **SMALL))
    assert (case.model.num_heads, case.model.kv_heads) == (4, 2)
    note = next(n for n in case.notes if n.startswith("heads 32 -> 4"))
    assert "KV heads 8 -> 2" in note and "ratio gives 1, which tp=2 does not divide" in note and "nearest" in note
    assert (
        case.model.name
        == "llama3-8b scaled to 2 layers, hidden 256, 4 heads / 2 KV heads, vocabulary 1024, sequence 128"
    )


@pytest.mark.parametrize(
    "heads, tp, kv, exact",
    [
        (8, 2, 2, True),  # 32:8 kept exactly
        (16, 4, 4, True),
        (8, 4, 4, False),  # ratio gives 2, tp=4 needs a multiple of 4
        (2, 2, 2, False),  # ratio gives 0.5: MHA at 2 heads
        (6, 1, 2, False),  # ratio gives 1.5, no whole number: 2 is nearer than 1 (by ratio: 3:1 against 6:1 for 4:1)
    ],
)
def test_kv_count_keeps_the_ratio_where_it_can(heads, tp, kv, exact):
    rehearsal = Rehearsal(heads=heads, **(SMALL | {"hidden": 64 * heads}))
    case = prepare_case(LLAMA8B, JOB, tp2(tp=tp, sequence_parallel=tp > 1), rehearsal)
    assert case.model.kv_heads == kv and case.model.num_heads % kv == 0 and kv % tp == 0
    note = next(n for n in case.notes if n.startswith("heads"))
    assert ("nearest" not in note) == exact


def test_an_unscaled_model_keeps_its_name():
    case = prepare_case(LLAMA8B.model_copy(update={"num_layers": 2}), JobSpec(global_batch_size=4, seq_len=128), tp2())
    assert case.model.name == "llama3-8b"


# --------------------------------------------------------------------------- refusals that say what works


@pytest.mark.parametrize(
    "plan, rehearsal, words",
    [
        (tp2(), Rehearsal(heads=3, **SMALL), "--scale-heads 3: tp=2 does not divide the 3 attention heads"),
        (tp2(), Rehearsal(heads=5, **SMALL), "tp=2 does not divide the 5 attention heads"),
        (
            tp2(),
            Rehearsal(**(SMALL | {"hidden": 250})),
            "--scale-hidden 250 does not split into the 32 attention heads",
        ),
        (tp2(), Rehearsal(heads=2, **(SMALL | {"hidden": 250})), "does not split hidden 250 into even widths"),
        (
            tp2(),
            Rehearsal(heads=4, **(SMALL | {"vocab": 1023})),
            "tp=2 does not divide the vocabulary of 1023 of llama3-8b scaled to",
        ),
        (
            tp2(),
            Rehearsal(heads=4, **(SMALL | {"seq_len": 127})),
            "sequence parallelism needs tp=2 to divide the sequence length 127",
        ),
        (tp2(tp=16), Rehearsal(), "tp=16 does not divide the 8 KV heads of llama3-8b"),
        (
            tp2(pp=4, num_micro_batches=4),
            Rehearsal(heads=4, **(SMALL | {"layers": 3})),
            "fewer than pp x vpp = 4 x 1 = 4",
        ),
        (
            tp2(tp=1, sequence_parallel=False, cp=2),
            Rehearsal(heads=4, **(SMALL | {"seq_len": 130})),
            "cp=2: the sequence (130 tokens)",
        ),
    ],
)
def test_each_refusal_names_the_option_value_that_works(plan, rehearsal, words):
    """The message names the model as scaled where it is, and the --scale-* values it
    suggests are checked here: with them the plan is prepared without complaint."""
    with pytest.raises(UsageError) as err:
        prepare_case(LLAMA8B, JOB, plan, rehearsal)
    message = str(err.value)
    assert words in message and "\n" not in message, message
    suggested = option_values(message.split(";", 1)[1])
    assert suggested, message
    prepare_case(LLAMA8B, JOB, plan, rehearsal_with(rehearsal, suggested))


def test_a_refusal_of_the_cli_names_the_scaled_model_and_the_fix(tmp_path):
    path = _plan_file(tmp_path, LLAMA8B, JOB, tp2())
    res = CliRunner().invoke(
        cli,
        [
            "run",
            path,
            "--scale-layers",
            "2",
            "--scale-hidden",
            "256",
            "--scale-heads",
            "4",
            "--scale-vocab",
            "1023",
            "--scale-seq-len",
            "128",
        ],
    )
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
    assert "llama3-8b scaled to 2 layers, hidden 256, 4 heads / 2 KV heads, vocabulary 1023" in res.output
    assert "--scale-vocab 1024" in res.output


# --------------------------------------------------------------------------- the rehearsal world

BIG = Plan(dp=8, tp=4, pp=2, micro_batch_size=2, num_micro_batches=4, zero_stage=1)
BIG_JOB = JobSpec(global_batch_size=64, seq_len=2048, precision="bf16")
BIG_SCALE = dict(layers=4, hidden=256, heads=8, vocab=1024, seq_len=128)


def test_rehearse_dp_keeps_the_layout_and_each_replicas_micro_batches():
    case = prepare_case(LLAMA8B, BIG_JOB, BIG, Rehearsal(dp=1, **BIG_SCALE))
    p = case.plan
    assert (p.dp, p.tp, p.pp, p.micro_batch_size, p.num_micro_batches, p.zero_stage) == (1, 4, 2, 2, 4, 1)
    assert p.mesh_order == BIG.mesh_order and p.world_size == 8 and case.job.global_batch_size == 8
    note = case.notes[0]
    assert note.startswith(
        "rehearsal world (--rehearse-dp 1): dp 1 x tp 4 x pp 2 = 8 processes instead of dp 8 x tp 4 x pp 2 = 64"
    )
    assert "global batch 64 -> 8 (each replica keeps its 4 micro-batches of 2)" in note
    assert any("ZeRO-1 at dp=1 shards nothing" in n for n in case.notes)
    two = prepare_case(LLAMA8B, BIG_JOB, BIG, Rehearsal(dp=2, **BIG_SCALE))
    assert two.plan.world_size == 16 and two.job.global_batch_size == 16


def test_expert_parallelism_bounds_the_rehearsal_world():
    moe = ModelSpec(
        name="tiny-moe",
        num_layers=4,
        hidden_size=64,
        num_heads=4,
        vocab_size=256,
        max_seq_len=32,
        num_experts=8,
        experts_per_token=2,
        dropout=False,
    )
    plan = Plan(dp=8, tp=1, pp=1, ep=4, micro_batch_size=1, num_micro_batches=1)
    job = JobSpec(global_batch_size=8, seq_len=32)
    with pytest.raises(UsageError, match=r"--rehearse-dp 2: the plan's ep=4 must divide .*; use --rehearse-dp 4"):
        prepare_case(moe, job, plan, Rehearsal(dp=2))
    assert prepare_case(moe, job, plan, Rehearsal(dp=4)).plan.world_size == 4
    with pytest.raises(UsageError) as err:
        check_world(plan, 2, "--nproc-per-node 2 x --nnodes 1")
    assert "the smallest rehearsal of this layout is 4 processes (dp 4 x tp 1 x pp 1): --rehearse-dp 4" in str(
        err.value
    )


@pytest.mark.parametrize(
    "world, says, works",
    [
        (8, "rehearse it on 8 with --rehearse-dp 1 (dp 8 -> 1", 8),
        (16, "rehearse it on 16 with --rehearse-dp 2 (dp 8 -> 2", 16),
        (12, "rehearse it on 8 with --rehearse-dp 1 --nproc-per-node 8", 8),
        (
            2,
            "the smallest rehearsal of this layout is 8 processes (dp 1 x tp 4 x pp 2): --rehearse-dp 1 --nproc-per-node 8; "
            "on 2, re-solve for 2 GPUs",
            8,
        ),
    ],
)
def test_a_world_that_does_not_fit_says_which_options_make_it_fit(world, says, works):
    """Issue 18 (8): a plan for 64 GPUs on 2 processes said only that 64 is not 2."""
    with pytest.raises(UsageError) as err:
        check_world(BIG, world, f"--nproc-per-node {world} x --nnodes 1")
    message = str(err.value)
    assert message.startswith("the plan needs dp x tp x pp = 8 x 4 x 2 = 64 processes") and says in message, message
    options = option_values(message.split(";", 1)[1])
    case = prepare_case(LLAMA8B, BIG_JOB, BIG, Rehearsal(dp=options["--rehearse-dp"], **BIG_SCALE))
    check_world(case.plan, options.get("--nproc-per-node", world), "the suggested launch")
    assert case.plan.world_size == works
    if options["--rehearse-dp"] == 1 and "smallest" not in message:
        assert "--rehearse-dp 2 on 16 keeps it" in message  # ZeRO-1 shards nothing at dp 1: said


def test_too_many_cpu_processes_points_at_rehearse_dp():
    case = prepare_case(LLAMA8B, BIG_JOB, BIG, Rehearsal(**BIG_SCALE))
    with pytest.raises(UsageError) as err:
        check_host_memory(case, load_cluster("dgx-h100-80gb"), 64, None)
    assert "--rehearse-dp 1 runs its layout on 8 processes (dp 1 x tp 4 x pp 2)" in str(err.value)


def test_the_cli_launches_the_rehearsal_world_by_default(tmp_path):
    """Without --nproc-per-node the launch is the rehearsal's world; 64 is refused by its
    size before any worker starts and names --rehearse-dp."""
    path = _plan_file(tmp_path, LLAMA8B, BIG_JOB, BIG)
    scale = [
        "--scale-layers",
        "4",
        "--scale-hidden",
        "256",
        "--scale-heads",
        "8",
        "--scale-vocab",
        "1024",
        "--scale-seq-len",
        "128",
    ]
    res = CliRunner().invoke(cli, ["run", path, *scale, "--nproc-per-node", "2"])
    assert res.exit_code == 2 and "--rehearse-dp 1 --nproc-per-node 8" in res.output, res.output
    res = CliRunner().invoke(cli, ["run", path, *scale, "--rehearse-dp", "1", "--nproc-per-node", "4"])
    assert res.exit_code == 2 and "dp x tp x pp = 1 x 4 x 2 = 8 processes but the launch has 4" in res.output, (
        res.output
    )


def _plan_file(tmp_path, model, job, plan) -> str:
    doc = {
        "schema_version": "1.0",
        "model": json.loads(model.model_dump_json()),
        "cluster": json.loads(load_cluster("dgx-h100-80gb").model_dump_json()),
        "num_gpus": plan.world_size,
        "job": json.loads(job.model_dump_json()),
        "plan": json.loads(plan.model_dump_json()),
    }
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_what_the_reference_model_does_not_build_is_left_out_and_said():
    """Gemma 2's four norms, sliding windows and logit soft-capping, and Qwen3's QK-norm: the
    reference model builds none of them, so the rehearsal runs without them, says so, and the
    prediction is made for what runs (not silently for a model that did not)."""

    from planner.presets import load_model as load

    data = HF_CONFIGS
    gemma = load(str(data / "gemma-2-9b.json"))
    assert gemma.norms_per_layer == 4 and gemma.sliding_window and gemma.logit_softcapping
    case = prepare_case(
        gemma,
        JOB,
        Plan(dp=1, tp=1, pp=1, micro_batch_size=1, num_micro_batches=4),
        Rehearsal(layers=2, hidden=256, heads=4, vocab=1024, seq_len=128),
    )
    m = case.model
    assert (m.norms_per_layer, m.sliding_window, m.sliding_window_layers, m.logit_softcapping) == (2, None, 0, False)
    note = next(n for n in case.notes if "reference model does not build" in n)
    assert "4 norms per layer run as 2" in note and "soft-capping" in note
    qwen = prepare_case(
        load(str(data / "qwen3-0.6b.json")),
        JOB,
        Plan(dp=1, tp=1, pp=1, micro_batch_size=1, num_micro_batches=4),
        Rehearsal(**SMALL),
    )
    assert not qwen.model.qk_norm and any("QK-norm left out" in n for n in qwen.notes)
    plain = prepare_case(LLAMA8B, JOB, tp2(), Rehearsal(**SMALL))
    assert not any("reference model does not build" in n for n in plain.notes)
