"""`plan run` of mixture-of-experts plans (gloo, CPU), each compared with one process.

The model is a spec file (tests write it as YAML, as a user would): 4 Llama-style layers of
width 64, the first dense, the others with 4 experts of width 96, top-2 routing and one
shared expert. Plans come from `plan estimate --json` of the dense-equivalent layout with
"ep" set in the plan (or passed as --ep where the command has it): the estimate part of a
plan file is ignored on read. Expert parallelism is checked on 2 and 4 processes, with and
without extra data parallelism, with ZeRO-1 and with pipeline parallelism; the token
exchange alone is checked against a local computation on 2 processes. Every launch has a
timeout and a short process-group timeout, so a hang fails the test.
"""

import copy
import json
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest

from tests.run_helpers import PG_TIMEOUT, cli, plan_doc, run_batch, write_specs

from planner.errors import UsageError
from planner.executor.prepare import prepare_case
from planner.specs import JobSpec, ModelSpec, Plan

pytestmark = pytest.mark.distributed
torch = pytest.importorskip("torch")


MOE_YAML = """\
name: tiny-moe
num_layers: 4
hidden_size: 64
num_heads: 4
num_kv_heads: 2
vocab_size: 256
max_seq_len: 32
activation: swiglu
learned_position_embeddings: false
linear_bias: false
norm: rmsnorm
dropout: false
param_dtype: fp32
num_experts: 4
experts_per_token: 2
moe_ffn_hidden_size: 96
num_shared_experts: 1
first_dense_layers: 1
"""
# The same experts as GPT-style MLPs (GELU, biases, LayerNorm, learned positions).
GELU_YAML = (
    MOE_YAML.replace("tiny-moe", "tiny-moe-gelu")
    .replace("swiglu", "gelu")
    .replace("learned_position_embeddings: false", "learned_position_embeddings: true")
    .replace("linear_bias: false", "linear_bias: true")
    .replace("rmsnorm", "layernorm")
)
GLOBAL_BATCH = 8

# name -> (model file, processes, ep, plan estimate options). Each runs 3 steps against the reference.
TWO_PROCESSES = {
    "dp2 ep2": ("moe", 2, 2, ["--micro-batch-size", "2"]),
    "dp2 ep2 zero1": ("moe", 2, 2, ["--micro-batch-size", "2", "--zero", "1"]),
    "dp2 ep1 replicated experts": ("moe", 2, 1, ["--micro-batch-size", "2"]),
    "dp2 ep2 gelu": ("gelu", 2, 2, ["--micro-batch-size", "4"]),
}
FOUR_PROCESSES = {
    "dp4 ep2": ("moe", 4, 2, []),
    "dp4 ep4": ("moe", 4, 4, []),
    "dp4 ep2 zero1": ("moe", 4, 2, ["--micro-batch-size", "2", "--zero", "1"]),
    "dp2 pp2 ep2": ("moe", 4, 2, ["--pp", "2"]),
    "dp2 pp2 ep2 zero1 gpipe full recompute": (
        "moe",
        4,
        2,
        ["--pp", "2", "--zero", "1", "--schedule", "gpipe", "--recompute", "full"],
    ),
    "dp2 pp2 vpp2 ep2 interleaved": ("moe", 4, 2, ["--pp", "2", "--vpp", "2"]),
}


@pytest.fixture(scope="module")
def model_files(tmp_path_factory) -> dict:
    return write_specs(tmp_path_factory.mktemp("models"), {"moe": MOE_YAML, "gelu": GELU_YAML})


def _plan_doc(model_file: Path, gpus: int, ep: int, options: list[str]) -> dict:
    """A plan document from `plan estimate --ep EP --json`."""
    return plan_doc(model_file, gpus, GLOBAL_BATCH, 32, [*options, "--ep", str(ep)])


def _run_batch(tmp_path: Path, cases: dict, nproc: int, files: dict) -> dict:
    docs = [_plan_doc(files[model], gpus, ep, options) for model, gpus, ep, options in cases.values()]
    return dict(zip(cases, run_batch(tmp_path, docs, nproc)))


@pytest.fixture(scope="module")
def two(tmp_path_factory, model_files):
    return _run_batch(tmp_path_factory.mktemp("two"), TWO_PROCESSES, 2, model_files)


@pytest.fixture(scope="module")
def four(tmp_path_factory, model_files):
    return _run_batch(tmp_path_factory.mktemp("four"), FOUR_PROCESSES, 4, model_files)


def _check_matches_reference(report: dict, ep: int) -> None:
    v = report["verification"]
    assert report["verdict"] == "pass", v["message"]
    assert report["plan"]["ep"] == ep
    assert len(v["losses"]) == 3 and v["max_loss_rel_error"] <= 1e-5 and v["max_grad_norm_rel_error"] <= 1e-5
    assert v["losses"][0] != v["losses"][-1]  # the run trained


@pytest.mark.parametrize("name", list(TWO_PROCESSES))
def test_two_processes_match_reference(two, name):
    _check_matches_reference(two[name], TWO_PROCESSES[name][2])


@pytest.mark.parametrize("name", list(FOUR_PROCESSES))
def test_four_processes_match_reference(four, name):
    _check_matches_reference(four[name], FOUR_PROCESSES[name][2])


# One expert of tiny-moe: gate, up and down matrices of 64 x 96, fp32.
EXPERT_BYTES = 3 * 64 * 96 * 4
MOE_LAYERS = 3


def test_each_rank_keeps_its_share_of_the_experts(two, four):
    """Weights measured per rank: ep=2 drops half of the 4 experts of each of the 3 MoE
    layers against ep=1, ep=4 three quarters; PP halves the layers, EP their experts."""

    def weights(report):
        held = {r["memory"]["weights_bytes"] for r in report["ranks"]}
        assert len(held) == 1  # every rank of an even layout holds as much
        return held.pop()

    full = weights(two["dp2 ep1 replicated experts"])
    assert full - weights(two["dp2 ep2"]) == MOE_LAYERS * 2 * EXPERT_BYTES
    assert full - weights(four["dp4 ep2"]) == MOE_LAYERS * 2 * EXPERT_BYTES
    assert full - weights(four["dp4 ep4"]) == MOE_LAYERS * 3 * EXPERT_BYTES


def test_plan_run_on_a_moe_plan_file(tmp_path, model_files):
    """The command end to end: a plan file of the spec file's model with ep=2 on 2 processes."""
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(_plan_doc(model_files["moe"], 2, 2, ["--micro-batch-size", "2"])))
    res = cli("run", str(path), "--steps", "3", "--warmup", "1", "--json", "--timeout", PG_TIMEOUT)
    assert res.returncode == 0, res.stderr[-2000:]
    report = json.loads(res.stdout)
    assert report["verdict"] == "pass" and report["plan"]["ep"] == 2 and report["settings"]["world_size"] == 2


# --------------------------------------------------------------------------- refusals

MOE = ModelSpec(
    name="tiny-moe",
    num_layers=4,
    hidden_size=64,
    num_heads=4,
    num_kv_heads=2,
    vocab_size=256,
    max_seq_len=32,
    activation="swiglu",
    learned_position_embeddings=False,
    linear_bias=False,
    norm="rmsnorm",
    dropout=False,
    param_dtype="fp32",
    num_experts=4,
    experts_per_token=2,
    moe_ffn_hidden_size=96,
    num_shared_experts=1,
    first_dense_layers=1,
)
JOB = JobSpec(global_batch_size=GLOBAL_BATCH, seq_len=32, precision="fp32")


@pytest.mark.parametrize(
    "plan, words",
    [
        (
            Plan(dp=2, tp=2, pp=1, ep=2, micro_batch_size=2, num_micro_batches=2, sequence_parallel=True),
            "plan run does not run tensor parallelism in mixture-of-experts layers (tp=2)",
        ),
        (
            Plan(dp=2, tp=1, pp=1, ep=2, micro_batch_size=2, num_micro_batches=2, zero_stage=3),
            "plan run shards expert-parallel experts with ZeRO-0 or 1 only (ep=2 with ZeRO-3)",
        ),
    ],
)
def test_what_plan_run_cannot_do_is_refused_before_launch(plan, words):
    with pytest.raises(UsageError) as err:
        prepare_case(MOE, JOB, plan)
    assert str(err.value).startswith(words) and "\n" not in str(err.value)


# --------------------------------------------------------------------------- the token exchange


def test_moe_layer_is_the_routing_it_documents():
    """One process: each token's output is the shared expert plus its top-2 experts weighted
    by the softmax over their two logits (Mixtral's renormalised top-k)."""
    from planner.distributed.reference_model import MoE

    torch.manual_seed(0)
    layer = MoE(MOE)
    x = torch.randn(12, 64)
    logits = layer.router(x)
    expected = []
    for i in range(12):
        top = logits[i].topk(2)
        w = torch.softmax(top.values, dim=0)
        routed = sum(w[j] * layer.experts[int(top.indices[j])](x[i : i + 1])[0] for j in range(2))
        expected.append(routed + layer.shared(x[i : i + 1])[0])
    torch.testing.assert_close(layer(x), torch.stack(expected), rtol=1e-5, atol=1e-6)


def _exchange_worker(rank: int, world: int, init_file: str) -> None:
    """Every rank: the same MoE layer twice, whole (local) and with its experts split over
    the world (Exchange), on this rank's own tokens; outputs, input gradients, router and
    shared-expert gradients must agree, and each held expert's gradient must be the sum of
    the local layers' gradients for it over all ranks (the tokens of every rank reach it)."""
    import torch.distributed as dist
    import torch.nn as nn

    from planner.distributed.reference_model import MoE
    from planner.executor.experts import Exchange

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world, timeout=timedelta(seconds=30)
    )
    try:
        for skewed in (False, True):
            torch.manual_seed(0)
            whole = MoE(MOE)
            gen = torch.Generator().manual_seed(100 + rank)
            x = torch.randn(2, 3 + 4 * rank, 64, generator=gen)  # a different number of tokens on each rank
            if skewed:  # every token picks experts 0 and 1: the other ranks receive nothing
                with torch.no_grad():
                    whole.router.weight.zero_()
                    whole.router.weight[0, 0] = whole.router.weight[1, 1] = 1.0
                    x[..., :2] = x[..., :2].abs() + 0.1
            split = copy.deepcopy(whole)
            per = MOE.num_experts // world
            split.first_expert = rank * per
            split.experts = nn.ModuleList(split.experts[rank * per : (rank + 1) * per])
            split.exchange = Exchange(dist.group.WORLD, world)
            upstream = torch.randn(x.shape, generator=gen)
            xs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
            outs = [whole(xs[0]), split(xs[1])]
            for out in outs:
                (out * upstream).sum().backward()
            torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(xs[1].grad, xs[0].grad, rtol=1e-5, atol=1e-6)
            for a, b in ((whole.router, split.router), (whole.shared, split.shared)):
                for pa, pb in zip(a.parameters(), b.parameters()):
                    torch.testing.assert_close(pb.grad, pa.grad, rtol=1e-5, atol=1e-6)
            summed = [p.grad if p.grad is not None else torch.zeros_like(p) for p in whole.experts.parameters()]
            flat = torch.cat([g.reshape(-1) for g in summed])
            dist.all_reduce(flat)
            offset, expected = 0, []
            for g in summed:
                expected.append(flat[offset : offset + g.numel()].view_as(g))
                offset += g.numel()
            mine = expected[rank * per * 3 : (rank + 1) * per * 3]  # 3 matrices an expert (SwiGLU)
            got = [p.grad if p.grad is not None else torch.zeros_like(p) for p in split.experts.parameters()]
            for g, e in zip(got, mine, strict=True):
                torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)
            if skewed and rank > 0:
                assert all(not g.any() for g in got)
    finally:
        dist.destroy_process_group()


def test_all_to_all_dispatch_and_combine_equal_a_local_computation(tmp_path):
    import torch.multiprocessing as mp

    world = 2
    ctx = mp.start_processes(
        _exchange_worker,
        args=(world, str(tmp_path / f"init-{uuid.uuid4().hex}")),
        nprocs=world,
        join=False,
        start_method="spawn",
    )
    deadline = time.time() + 120
    while not ctx.join(timeout=1):  # raises with the worker's traceback when one fails
        if time.time() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail("the exchange test did not finish in 120 s")
