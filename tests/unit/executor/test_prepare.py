"""`plan run` without launching: rehearsal scaling, refusals before launch, the comparison,
and the saved-activation count against the cost model (one process)."""

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from cost_models import memory as cm
from planner.cli.main import cli
from planner.errors import UsageError
from planner.executor.prepare import Rehearsal, check_world, prepare_case, proportional
from planner.specs import DType, JobSpec, ModelSpec, Plan, Recompute, StageRecompute

GPT = ModelSpec(
    name="tiny-gpt", num_layers=8, hidden_size=64, num_heads=4, vocab_size=256, max_seq_len=32, param_dtype="fp32"
)
JOB = JobSpec(global_batch_size=8, seq_len=32, precision="fp32")


def plan(**kw):
    base = dict(dp=1, tp=1, pp=1, micro_batch_size=2, num_micro_batches=4)
    return Plan(**(base | kw))


# --------------------------------------------------------------------------- scaling


def test_proportional_keeps_totals_and_minimum():
    assert proportional([5, 6, 6, 5], 8, minimum=1) == [2, 2, 2, 2]
    assert proportional([1, 3], 8, minimum=1) == [2, 6]
    assert sum(proportional([24, 24, 25, 23], 12, minimum=1)) == 12
    assert proportional([0, 3, 1], 2) == [0, 2, 0] or sum(proportional([0, 3, 1], 2)) == 2
    assert min(proportional([1, 100], 4, minimum=1)) == 1


def test_scaling_keeps_the_plans_shape_and_records_every_change():
    big = ModelSpec(
        name="gpt3-ish",
        num_layers=24,
        hidden_size=1024,
        num_heads=16,
        vocab_size=50304,
        max_seq_len=2048,
        tied_embeddings=True,
    )
    job = JobSpec(global_batch_size=8, seq_len=2048, precision="bf16")
    p = plan(
        pp=2,
        num_micro_batches=4,
        layers_per_stage=[8, 16],
        stage_recompute=[StageRecompute(none=4, full=4), StageRecompute(none=16)],
    )
    case = prepare_case(big, job, p, Rehearsal(layers=6, hidden=128, heads=4, vocab=512, seq_len=64))
    m = case.model
    assert (m.num_layers, m.hidden_size, m.num_heads, m.vocab_size, m.max_seq_len) == (6, 128, 4, 512, 64)
    assert m.ffn == 512 and not m.dropout and not m.tied_embeddings  # untied: pp > 1
    assert case.job.seq_len == 64 and case.job.precision == DType.fp32
    assert case.plan.layers_per_stage == [2, 4]
    assert [(r.none, r.full) for r in case.plan.stage_recompute] == [(1, 1), (4, 0)]
    text = " | ".join(case.notes)
    for word in (
        "layers 24 -> 6",
        "hidden 1024 -> 128",
        "heads 16 -> 4",
        "vocabulary",
        "sequence 2048 -> 64",
        "untied",
        "fp32",
        "dropout",
    ):
        assert word in text


def test_tied_embeddings_stay_tied_without_pipeline():
    tied = GPT.model_copy(update={"tied_embeddings": True})
    assert prepare_case(tied, JOB, plan(tp=1)).model.tied_embeddings


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    "kw, rehearsal, words",
    [
        (dict(tp=8), Rehearsal(), "does not divide the 4 attention heads"),
        (dict(tp=2), Rehearsal(heads=2, hidden=64), None),  # 2 heads: tp=2 still divides
        (dict(tp=4), Rehearsal(heads=2, hidden=64), "does not divide the 2 attention heads"),
        (dict(pp=4, num_micro_batches=2, micro_batch_size=4), Rehearsal(), "1F1B needs at least as many micro-batches"),
        (dict(pp=4, layers_per_stage=[1, 1, 1, 1]), Rehearsal(), "sums to 4"),
        (dict(tp=2), Rehearsal(vocab=255), "does not divide the vocabulary"),
        (dict(tp=2, sequence_parallel=True), Rehearsal(seq_len=31), "divide the sequence length"),
        (dict(pp=2), Rehearsal(layers=1), "fewer than pp"),
    ],
)
def test_refused_before_launch(kw, rehearsal, words):
    p = plan(**kw)
    if words is None:
        prepare_case(GPT, JOB, p, rehearsal)
        return
    with pytest.raises(UsageError, match=words):
        prepare_case(GPT, JOB, p, rehearsal)


def test_world_size_mismatch_names_every_factor():
    with pytest.raises(UsageError) as e:
        check_world(plan(dp=2, tp=2, pp=1, num_micro_batches=2), 2, "--nproc-per-node 2 x --nnodes 1")
    assert "dp x tp x pp = 2 x 2 x 1 = 4" in str(e.value) and "has 2" in str(e.value)


def _plan_file(tmp_path, **kw):
    doc = {
        "schema_version": "1.0",
        "model": json.loads(GPT.model_dump_json()),
        "cluster": json.loads(__import__("hardware_profiles").load_cluster("dgx-a100-80gb").model_dump_json()),
        "num_gpus": plan(**kw).world_size,
        "job": json.loads(JOB.model_dump_json()),
        "plan": json.loads(plan(**kw).model_dump_json()),
    }
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.mark.parametrize(
    "kw, args, words",
    [
        (dict(dp=2, num_micro_batches=2), ["--nproc-per-node", "3"], "= 2 processes but the launch has 3"),
        (dict(tp=2), ["--scale-heads", "1", "--scale-hidden", "64"], "does not divide the 1 attention heads"),
        (dict(pp=4, micro_batch_size=4, num_micro_batches=2), [], "1F1B needs at least as many micro-batches"),
        (dict(dp=2, num_micro_batches=2), ["--nnodes", "2"], "--rdzv-endpoint"),
        (dict(dp=2, num_micro_batches=2), ["--steps", "2", "--warmup", "2"], "--warmup"),
        (dict(dp=2, num_micro_batches=2), ["--tolerance", "0"], "--tolerance"),
    ],
)
def test_cli_refuses_in_one_line_with_exit_2(tmp_path, kw, args, words):
    res = CliRunner().invoke(cli, ["run", _plan_file(tmp_path, **kw), *args])
    assert res.exit_code == 2, res.output
    assert words in res.output and len(res.output.strip().splitlines()) == 1 and "Traceback" not in res.output


def test_cli_refuses_before_importing_torch(tmp_path):
    """A plan that cannot run is refused in a fraction of a second: torch is never imported."""
    path = _plan_file(tmp_path, dp=2, num_micro_batches=2)
    code = (
        "import sys; from planner.cli.main import main; sys.argv = ['plan', 'run', sys.argv[1], '--nproc-per-node', '3']\n"
        "try:\n    main()\nexcept SystemExit as e:\n    print('exit', e.code, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip().splitlines()[-1] == "exit 2 False", out.stdout + out.stderr


def test_cli_refuses_a_missing_plan_file(tmp_path):
    res = CliRunner().invoke(cli, ["run", str(tmp_path / "nope.json")])
    assert res.exit_code == 2 and "does not exist" in res.output


# --------------------------------------------------------------------------- comparison


# The comparison's own tests are in tests/unit/executor/test_verify.py.


# --------------------------------------------------------------------------- memory count


@pytest.mark.parametrize("mode", ["none", "selective", "full"])
def test_saved_activation_count_matches_the_cost_model_per_layer(mode):
    """One process: the bytes autograd saves for one layer (counted with saved_tensors_hooks,
    storages once) against cost_models.memory.layer_activation_bytes (fp32, flash attention,
    no dropout), and everything released after backward."""
    pytest.importorskip("torch")
    from planner.executor.memory import ActivationTracker
    from planner.distributed.reference_model import build_model, lm_loss, synthetic_batch

    spec = GPT.model_copy(update={"dropout": False})
    counts = []
    for layers in (1, 3):
        model = build_model(spec.model_copy(update={"num_layers": layers}))
        for block in model.layers:
            block.set_recompute(mode)
        tracker = ActivationTracker()
        tokens, targets = synthetic_batch(spec, 2, 32, 0, 0)
        with tracker.hooks():
            loss = lm_loss(model(tokens), targets)
        counts.append(tracker.peak)
        loss.backward()
        assert tracker.live == 0
    per_layer = (counts[1] - counts[0]) / 2
    predicted = cm.layer_activation_bytes(spec, 2, 32, 1, False, Recompute(mode), True, DType.fp32)
    assert per_layer == pytest.approx(predicted, rel=0.05)


def test_a_model_too_big_for_this_machine_is_refused_before_launch():
    from hardware_profiles import load_cluster
    from planner.executor.prepare import check_host_memory

    case = prepare_case(GPT, JOB, plan(pp=2))
    cluster = load_cluster("dgx-a100-80gb")
    check_host_memory(case, cluster, 2, 2**30)  # ~10 MiB a rank plus torch's own 0.3 GiB: fits in 1 GiB
    with pytest.raises(UsageError, match="per rank x 2 ranks here"):
        check_host_memory(case, cluster, 2, 2**29)  # torch's own footprint alone does not fit twice
    check_host_memory(case, cluster, 2, None)  # unknown: no check


def test_more_ranks_than_this_machine_can_run_are_refused_before_launch():
    """A 1,024-GPU plan rehearsed as 1,024 CPU processes on a laptop: refused by core count
    (and by memory: torch alone takes 0.3 GiB a process), with how to rehearse it instead."""
    import os

    from hardware_profiles import load_cluster
    from planner.executor.prepare import RANKS_PER_CORE, check_host_memory

    case = prepare_case(GPT, JOB, plan(pp=2))
    too_many = RANKS_PER_CORE * (os.cpu_count() or 1) + 1
    with pytest.raises(UsageError, match="rehearse the plan on fewer ranks"):
        check_host_memory(case, load_cluster("dgx-a100-80gb"), too_many, None)
    with pytest.raises(UsageError, match="GiB per rank"):
        check_host_memory(case, load_cluster("dgx-a100-80gb"), 2, int(0.5 * 2**30))


def test_nccl_without_a_gpu_is_refused(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    res = CliRunner().invoke(cli, ["run", _plan_file(tmp_path, dp=2, num_micro_batches=2), "--backend", "nccl"])
    assert res.exit_code == 2 and "needs CUDA" in res.output and len(res.output.strip().splitlines()) == 1
