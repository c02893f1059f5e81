"""Plan.recompute_norm_act: the separate norms' and the MoE experts' activation outputs
recomputed in backward instead of kept (Megatron-Core's --recompute-modules layernorm moe_act,
output-discarding checkpoints: transformer_layer.py, moe/experts.py). The bytes it frees and the
time it adds, term by term; which norms are separate under Transformer Engine; where it is
refused; the search over it against brute force; its command-line round trip."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cost_models import compute, memory
from cost_models.communication import GroupLink
from cost_models.estimate import estimate
from cost_models.tables import layer_costs
from hardware_profiles import load_cluster
from planner import stacks
from planner.presets import load_model
from planner.search.candidates import SearchSpace
from planner.search.stacks import norm_act_choices
from planner.specs import Axis, JobSpec, Layout, Plan, PlanError
from planner.stacks.stack import EAGER
from tests.unit.search.test_solver import MOE_SMALL, assert_same_optimum, tiny_cluster

H100 = load_cluster("dgx-h100-80gb")
MEGATRON = stacks.get("megatron").kernels


def _layer(model, job, b, tp, sp, norm_act, ep=1, dense=False):
    link = GroupLink(H100, tp, 1)
    ep_link = GroupLink(H100, ep, tp) if ep > 1 else None
    layout = Layout(micro_batch_size=b, tp=tp, sequence_parallel=sp, ep=ep, recompute_norm_act=norm_act)
    return layer_costs(model, H100, job, layout, {Axis.tp: link, **({Axis.ep: ep_link} if ep_link else {})}, dense)


def test_moe_layer_frees_its_pre_mlp_norm_and_expert_activation_outputs():
    """Qwen3-30B-A3B under Megatron at tp 2 with SP, ep 4, 2 x 4,096 tokens: the pre-MLP norm's
    output (e s b h / t: the router's and the dispatch's input) and the routed experts' activation
    output (e s b k f / t) are not kept, in the modes that keep activations; their forward reruns
    in backward: the norm reads and writes its rows, the activation reads the fc1 output (gate
    and up) and writes its own, one kernel each."""
    model = load_model("qwen3-30b-a3b")
    job = JobSpec(global_batch_size=8, seq_len=4096, target="megatron")
    b, s, tp, e, h = 2, 4096, 2, 2, model.hidden_size
    k, f = model.experts_per_token, model.moe_ffn
    off, on = (_layer(model, job, b, tp, True, x, ep=4) for x in (False, True))
    freed = e * s * b * h / tp + e * s * b * k * f / tp
    assert [x - y for x, y in zip(off.activation_bytes, on.activation_bytes)] == pytest.approx([freed, freed, 0.0])
    rows, assigned = s * b / tp, s * b / tp * k
    rerun = compute.memory_bound_time(H100.device, 2 * rows * h * e + 3 * assigned * f * e) + compute.kernels_time(
        H100.device, MEGATRON.rmsnorm + MEGATRON.gated_activation
    )
    assert [y - x for x, y in zip(off.recompute, on.recompute)] == pytest.approx([rerun, rerun, 0.0])
    assert (on.forward, on.backward, on.recompute_flops) == (off.forward, off.backward, off.recompute_flops)


def test_a_clamped_glu_frees_its_clamped_halves_too():
    """GPT-OSS's clamped GLU keeps its two clamped halves beside the fc1 output (memory.py); moe_act
    reruns the clamps with the activation, so 3 f per assignment go instead of 1 f."""
    model = load_model("qwen3-30b-a3b")
    clamped = model.model_copy(update={"glu_limit": 7.0})
    args = (2, 4096, 1, False, MEGATRON)
    act = 2 * 4096 * model.experts_per_token * model.moe_ffn
    assert memory.norm_act_bytes(clamped, *args) - memory.norm_act_bytes(model, *args) == 2 * 2 * act


def test_which_norms_are_separate():
    """Transformer Engine fuses the attention's and a dense MLP's norm into LayerNormLinear, which
    keeps the normalised input itself (gpt_layer_specs.py: IdentityOp norms): a dense Llama frees
    nothing under Megatron; a MoE layer frees its pre-MLP norm, MLA its input norm (DeepSeek-V3's
    dense layers: one, its MoE layers: two); eager norms are all separate (two)."""
    llama, dsv3 = load_model("llama3-8b"), load_model("deepseek-v3")
    assert memory.norm_act_bytes(llama, 1, 4096, 1, False, MEGATRON) == 0
    assert memory.norm_act_bytes(llama, 1, 4096, 1, False, EAGER) == 2 * 2 * 4096 * llama.hidden_size
    assert memory.norm_act_bytes(dsv3, 1, 4096, 1, False, MEGATRON, dense=True) == 2 * 4096 * dsv3.hidden_size
    assert compute.separate_norms(dsv3, MEGATRON) == 2
    job = JobSpec(global_batch_size=8, seq_len=4096, target="megatron")
    off, on = (_layer(llama, job, 1, 2, True, x) for x in (False, True))
    assert (on.activation_bytes, on.recompute) == (off.activation_bytes, off.recompute)


def test_the_search_tries_it_only_where_a_stack_has_it_and_it_frees_memory():
    megatron, generic = stacks.get("megatron"), stacks.get("generic")
    assert norm_act_choices(load_model("qwen3-30b-a3b"), megatron) == (False, True)
    assert norm_act_choices(load_model("llama3-8b"), megatron) == (False,)  # TE's fused norms: nothing to free
    assert norm_act_choices(load_model("qwen3-30b-a3b"), generic) == (False,)  # the executor keeps them


@pytest.mark.parametrize(
    "fields,target,message",
    [
        (dict(recompute="full"), "megatron", "fully recomputed layer reruns its whole forward"),
        (dict(), "generic", "not available in target generic; use --target megatron"),
        (dict(), "torchtitan", "not available in target torchtitan"),
    ],
)
def test_it_is_refused_where_it_cannot_run(fields, target, message):
    job = JobSpec(global_batch_size=4, seq_len=1024, target=target)
    with pytest.raises((PlanError, ValueError), match=message):
        plan = Plan(dp=2, tp=1, pp=1, micro_batch_size=2, num_micro_batches=1, recompute_norm_act=True, **fields)
        stacks.validate_plan(plan, load_model("qwen3-30b-a3b"), job)


def test_megatron_refuses_it_with_fp8_delayed_scaling():
    """transformer_config.py raises for moe_act / layernorm recompute under delayed scaling,
    the FP8 recipe the Megatron export writes."""
    model = load_model("qwen3-30b-a3b")
    job = JobSpec(global_batch_size=8, seq_len=4096, target="megatron")
    plan = Plan(dp=8, ep=8, tp=1, pp=1, micro_batch_size=1, num_micro_batches=1, fp8=True, recompute_norm_act=True)
    assert any(
        "FP8 recipe refuses it" in p
        for p in stacks.get("megatron").problems(plan, model, job)
        + stacks.get("megatron").rules.plan_problems(plan, model)
    )


@pytest.mark.slow
@pytest.mark.parametrize("memory_gib", [80, 1.6, 1.3])
def test_search_over_it_matches_brute_force(memory_gib):
    """A small MoE model under Megatron: the ILP search over norm/act recompute (with every split,
    and no full recompute beside it) finds the brute-force optimum from roomy to tight memory;
    roomy, keeping the outputs (no rerun) wins."""
    job = JobSpec(global_batch_size=4, seq_len=2048, target="megatron")
    space = SearchSpace(
        num_gpus=4,
        global_batch_size=4,
        recompute_norm_act=(False, True),
        fixed={"mesh_order": (Axis.tp, Axis.dp, Axis.pp), "micro_batch_size": 1},
    )
    res = assert_same_optimum(MOE_SMALL, tiny_cluster(memory_gib), job, space)
    if memory_gib == 80:
        assert not res.fastest.plan.recompute_norm_act
    if res.best is not None and res.best.plan.recompute_norm_act:
        assert all(r.full == 0 for r in res.best.plan.stage_recompute_counts(MOE_SMALL.num_layers))


def test_tight_memory_picks_it_over_heavier_recompute():
    """dp 4 x ep 4, ZeRO-0, Megatron's fp32 main gradients: keeping every activation needs 2.830
    GiB, rerunning the norms and the activation 2.795, full recompute less at a 26% longer step.
    At 2.81 GiB the search reruns the norms and the activation (the cheaper way to fit); at 2.95
    it keeps them."""
    job = JobSpec(global_batch_size=4, seq_len=2048, target="megatron")
    space = SearchSpace(
        num_gpus=4,
        global_batch_size=4,
        recompute_norm_act=(False, True),
        fixed={
            "mesh_order": (Axis.tp, Axis.dp, Axis.pp),
            "micro_batch_size": 1,
            "tp": 1,
            "pp": 1,
            "ep": 4,
            "zero_stage": 0,
        },
    )
    tight = assert_same_optimum(MOE_SMALL, tiny_cluster(2.81), job, space).fastest.plan
    roomy = assert_same_optimum(MOE_SMALL, tiny_cluster(2.95), job, space).fastest.plan
    assert (tight.recompute_norm_act, tight.recompute.value) == (True, "none")
    assert (roomy.recompute_norm_act, roomy.recompute.value) == (False, "none")


@pytest.mark.slow
def test_estimate_cli_round_trip(tmp_path):
    """`plan estimate --recompute-norm-act` writes it into the plan; `--plan FILE --keep-norm-act`
    takes it out again, saying so, and memory goes back up."""
    out = tmp_path / "plan.json"
    cmd = [
        sys.executable,
        "-m",
        "planner.cli.main",
        "estimate",
        "--model",
        "qwen3-30b-a3b",
        "--cluster",
        "dgx-h100-80gb",
        "--gpus",
        "16",
        "--global-batch",
        "64",
        "--seq-len",
        "4096",
        "--ep",
        "8",
        "--pp",
        "2",
        "--target",
        "megatron",
    ]
    res = subprocess.run(cmd + ["--recompute-norm-act", "--json", "-o", str(out)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    on = json.loads(res.stdout)
    assert (
        on["plan"]["recompute_norm_act"] is True and json.loads(out.read_text())["plan"]["recompute_norm_act"] is True
    )
    res = subprocess.run(
        [sys.executable, "-m", "planner.cli.main", "estimate", "--plan", str(out), "--keep-norm-act", "--json"],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    off = json.loads(res.stdout)
    assert off["plan"]["recompute_norm_act"] is False and "recompute_norm_act True -> False" in res.stderr
    assert off["estimate"]["peak_memory_gib"] > on["estimate"]["peak_memory_gib"]
    assert off["estimate"]["step_time_s"] < on["estimate"]["step_time_s"]
    bad = subprocess.run(cmd[:-2] + ["--target", "torchtitan", "--recompute-norm-act"], capture_output=True, text=True)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "--target megatron" in bad.stderr


def test_gpt_oss_on_b200_at_ep8_fits_as_its_recipe_ran():
    """Megatron-Bridge 26.04's GPT-OSS 120B on 64 B200 at EP 8, MBS 4, recomputing layernorm and
    moe_act (its recipe): predicted to fit; keeping those outputs, it would not."""
    from benchmarks.published_cases import cases

    rows = [c for c in cases()[0] if "GPT-OSS 120B BF16, 64 B200, TP1 PP1 EP8" in c.name]
    assert rows and all(c.plan.recompute_norm_act for c in rows)
    for c in rows:
        assert estimate(c.model, c.cluster, c.job, c.plan).fits
        assert not estimate(c.model, c.cluster, c.job, c.plan.model_copy(update={"recompute_norm_act": False})).fits


def test_plan_run_keeps_the_outputs_and_says_so():
    """The executor's layers keep every output (no output-discarding checkpoints): `plan run`
    runs the plan without it, predicts for what it runs, and its report says so."""
    from planner.executor.prepare import prepare_case

    model = load_model("qwen3-30b-a3b")
    job = JobSpec(global_batch_size=8, seq_len=256, target="megatron")
    plan = Plan(dp=2, ep=2, tp=1, pp=1, micro_batch_size=1, num_micro_batches=4, recompute_norm_act=True)
    case = prepare_case(model, job, plan)
    assert not case.plan.recompute_norm_act
    assert any("activation outputs kept" in n for n in case.notes)


@pytest.mark.slow
@pytest.mark.parametrize(
    "fixes,message",
    [
        (
            ["--fix", "recompute=full", "--fix", "recompute_norm_act=true", "--target", "megatron"],
            "with --fix recompute=full: a fully recomputed layer",
        ),
        (["--fix", "recompute_norm_act=true", "--target", "torchtitan"], "torchtitan does not recompute"),
        (["--fix", "recompute_norm_act=true", "--fix", "fp8=true", "--target", "megatron"], "FP8 recipe refuses"),
    ],
)
def test_solve_refuses_a_fix_it_cannot_honour(fixes, message):
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "planner.cli.main",
            "solve",
            "--model",
            "qwen3-30b-a3b",
            "--cluster",
            "dgx-h100-80gb",
            "--gpus",
            "16",
            "--global-batch",
            "64",
            "--seq-len",
            "4096",
            *fixes,
        ],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and message in res.stderr, res.stderr


def test_fixed_full_recompute_searches_without_it():
    """--fix recompute=full leaves nothing the norm/act recompute could rerun: it is not searched."""
    from planner.search.stacks import target_space
    from planner.specs import Recompute

    job = JobSpec(global_batch_size=64, seq_len=4096, target="megatron")
    base = SearchSpace(num_gpus=16, global_batch_size=64, recompute_modes=(Recompute.full,))
    assert target_space(base, load_model("qwen3-30b-a3b"), job).recompute_norm_act == (False,)


@pytest.mark.slow
def test_a_plan_over_memory_names_it_where_it_would_help():
    """`plan estimate`'s one-line 'does not fit' names --recompute-norm-act where the target has it
    and it frees memory, and not elsewhere."""
    base = [
        "estimate",
        "--model",
        "qwen3-30b-a3b",
        "--cluster",
        "dgx-h100-80gb",
        "--gpus",
        "16",
        "--global-batch",
        "64",
        "--seq-len",
        "4096",
        "--pp",
        "2",
        "--ep",
        "8",
        "--micro-batch-size",
        "2",
    ]
    for extra, named in (
        (["--target", "megatron"], True),
        ([], False),
        (["--target", "megatron", "--recompute-norm-act"], False),
    ):
        res = subprocess.run(
            [sys.executable, "-m", "planner.cli.main", *base, *extra, "--json"], capture_output=True, text=True
        )
        assert res.returncode == 1 and "does not fit" in res.stderr
        assert ("--recompute-norm-act" in res.stderr) == named, extra
