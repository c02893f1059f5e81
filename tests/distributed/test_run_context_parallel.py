"""`plan run` of context-parallel plans (gloo, CPU), each compared with one process; the ring
attention against full causal attention; the mesh against the placement picture; FP8 plans
refused where the device has no FP8.

Models are spec files (tests write them as YAML, as a user would): 4 layers of width 64, a
Llama-style one (rotary positions, grouped-query attention, SwiGLU), a GPT-style one (learned
positions, tied embeddings) and a mixture-of-experts one. Plans come from
`plan estimate --cp N --json` at a sequence of 32 tokens (2 cp chunks of 32 / (2 cp) each per
rank). Every launch has a timeout and a short process-group timeout, so a hang fails the test.
"""

import json
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest

from tests.run_helpers import PG_TIMEOUT, cli, plan_doc, run_batch, write_specs

from planner.errors import UsageError
from planner.executor.prepare import check_world, fp8_problem
from planner.specs import Plan

pytestmark = pytest.mark.distributed
torch = pytest.importorskip("torch")

SEQ_LEN = 32
GLOBAL_BATCH = 4

LLAMA_YAML = """\
name: tiny-llama-cp
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
"""
GPT_YAML = """\
name: tiny-gpt-cp
num_layers: 4
hidden_size: 64
num_heads: 4
vocab_size: 256
max_seq_len: 32
dropout: false
tied_embeddings: true
param_dtype: fp32
"""
MOE_YAML = (
    LLAMA_YAML.replace("tiny-llama-cp", "tiny-moe-cp")
    + """\
num_experts: 4
experts_per_token: 2
moe_ffn_hidden_size: 96
num_shared_experts: 1
first_dense_layers: 1
"""
)
MODELS = {"llama": LLAMA_YAML, "gpt": GPT_YAML, "moe": MOE_YAML}

# name -> (model, processes, plan estimate options). Each runs 3 steps against the reference.
TWO_PROCESSES = {
    "cp2": ("llama", 2, ["--cp", "2"]),
    "cp2 gpt tied selective": ("gpt", 2, ["--cp", "2", "--recompute", "selective"]),
    "cp2 zero1 gpt": ("gpt", 2, ["--cp", "2", "--zero", "1"]),
    "cp2 ep2 moe": ("moe", 2, ["--cp", "2", "--ep", "2"]),
}
FOUR_PROCESSES = {
    "dp2 cp2": ("llama", 4, ["--dp", "2", "--cp", "2"]),
    "dp2 cp2 zero3 gpt": ("gpt", 4, ["--dp", "2", "--cp", "2", "--zero", "3"]),
    "cp2 pp2": ("llama", 4, ["--cp", "2", "--pp", "2"]),
    "cp2 pp2 gpipe full recompute gpt": (
        "gpt",
        4,
        ["--cp", "2", "--pp", "2", "--schedule", "gpipe", "--recompute", "full"],
    ),
    "cp4": ("llama", 4, ["--cp", "4"]),
    "cp2 tp2 sp": ("llama", 4, ["--cp", "2", "--tp", "2", "--sequence-parallel"]),
    "cp2 tp2, dp innermost": ("llama", 4, ["--cp", "2", "--tp", "2", "--mesh-order", "dp,tp,pp"]),
}


@pytest.fixture(scope="module")
def model_files(tmp_path_factory) -> dict:
    return write_specs(tmp_path_factory.mktemp("models"), MODELS)


def _plan_doc(model_file: Path, gpus: int, options: list[str], cluster: str = "dgx-a100-80gb") -> dict:
    return plan_doc(model_file, gpus, GLOBAL_BATCH, SEQ_LEN, options, cluster)


def _run_batch(tmp_path: Path, cases: dict, nproc: int, files: dict) -> dict:
    docs = [_plan_doc(files[model], gpus, options) for model, gpus, options in cases.values()]
    return dict(zip(cases, run_batch(tmp_path, docs, nproc)))


@pytest.fixture(scope="module")
def two(tmp_path_factory, model_files):
    return _run_batch(tmp_path_factory.mktemp("two"), TWO_PROCESSES, 2, model_files)


@pytest.fixture(scope="module")
def four(tmp_path_factory, model_files):
    return _run_batch(tmp_path_factory.mktemp("four"), FOUR_PROCESSES, 4, model_files)


def _option(options: list[str], name: str, default: int = 1) -> int:
    return int(options[options.index(name) + 1]) if name in options else default


def _check_matches_reference(report: dict, options: list[str]) -> None:
    v = report["verification"]
    assert report["verdict"] == "pass", v["message"]
    assert report["plan"]["cp"] == _option(options, "--cp") and report["plan"]["dp"] == _option(options, "--dp")
    assert len(v["losses"]) == 3 and v["max_loss_rel_error"] <= 1e-5 and v["max_grad_norm_rel_error"] <= 1e-5
    assert v["losses"][0] != v["losses"][-1]  # the run trained


@pytest.mark.parametrize("name", list(TWO_PROCESSES))
def test_two_processes_match_reference(two, name):
    _check_matches_reference(two[name], TWO_PROCESSES[name][2])


@pytest.mark.parametrize("name", list(FOUR_PROCESSES))
def test_four_processes_match_reference(four, name):
    _check_matches_reference(four[name], FOUR_PROCESSES[name][2])


def test_plan_run_on_a_cp_plan_file(tmp_path, model_files):
    """The command end to end: a plan file with cp=2 on 2 processes."""
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(_plan_doc(model_files["llama"], 2, ["--cp", "2"])))
    res = cli("run", str(path), "--steps", "3", "--warmup", "1", "--json", "--timeout", PG_TIMEOUT)
    assert res.returncode == 0, res.stderr[-2000:]
    report = json.loads(res.stdout)
    assert report["verdict"] == "pass" and report["plan"]["cp"] == 2 and report["settings"]["world_size"] == 2


# --------------------------------------------------------------------------- layout


def test_each_rank_holds_an_early_and_a_late_chunk():
    from planner.executor.context import chunk_positions

    assert chunk_positions(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert chunk_positions(8, 2, 1).tolist() == [2, 3, 4, 5]
    held = torch.cat([chunk_positions(32, 4, r) for r in range(4)])
    assert sorted(held.tolist()) == list(range(32))  # every token once
    # causal work per rank: keys at or before each query, the same on every rank
    work = {sum(p + 1 for p in chunk_positions(32, 4, r).tolist()) for r in range(4)}
    assert len(work) == 1


@pytest.mark.parametrize(
    "plan",
    [
        Plan(dp=2, cp=2, tp=2, pp=1, micro_batch_size=1, num_micro_batches=2),
        Plan(dp=1, cp=2, tp=2, pp=2, micro_batch_size=1, num_micro_batches=4, mesh_order=["dp", "tp", "pp"]),
        Plan(dp=2, cp=4, tp=1, pp=2, micro_batch_size=1, num_micro_batches=2, mesh_order=["pp", "dp", "tp"]),
    ],
)
def test_mesh_puts_every_rank_where_the_placement_picture_does(plan):
    """build_mesh on a fake process group, as each rank in turn: its dp, cp, tp and pp
    coordinates are those planner/pictures.py:placement draws (cp innermost in the dp axis),
    and the dp x cp group it averages gradients over is every rank of its tp and pp position."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from hardware_profiles import load_cluster
    from planner.executor.parallelize import build_mesh, place, replica_mesh
    from planner.pictures import placement

    drawn = placement(plan, load_cluster("dgx-a100-80gb")).ranks
    if dist.is_initialized():
        dist.destroy_process_group()
    for r in range(plan.world_size):
        dist.init_process_group("fake", rank=r, world_size=plan.world_size, store=FakeStore())
        try:
            mesh = build_mesh(plan, "cpu")
            where = place(mesh, plan)
            assert (where.dp, where.cp, where.tp, where.pp) == tuple(drawn[r][a] for a in ("dp", "cp", "tp", "pp"))
            replicas = sorted(replica_mesh(mesh, plan).mesh.flatten().tolist())
            assert replicas == [d["rank"] for d in drawn if (d["tp"], d["pp"]) == (drawn[r]["tp"], drawn[r]["pp"])]
        finally:
            dist.destroy_process_group()


# --------------------------------------------------------------------------- the ring


def _ring_worker(rank: int, world: int, init_file: str) -> None:
    """Every rank: (1) RingAttention on its chunks of q, k, v against full causal attention
    of the whole sequence (float64): its rows of the output and of the q, k, v gradients;
    (2) a whole Attention layer (rotary, grouped-query) given the CP layout against the same
    layer on the whole sequence: output rows, input-gradient rows, and weight gradients
    summed over the ranks."""
    import torch.distributed as dist
    import torch.nn.functional as F

    from planner.distributed.reference_model import Attention
    from planner.executor.context import ContextParallel
    from planner.specs import ModelSpec

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world, timeout=timedelta(seconds=30)
    )
    try:
        B, H, S, D = 2, 3, 24, 8
        ctx = ContextParallel(dist.group.WORLD, world, rank, S, torch.device("cpu"))
        pos = ctx.positions
        g = torch.Generator().manual_seed(0)
        q, k, v, upstream = (torch.randn(B, H, S, D, generator=g, dtype=torch.float64) for _ in range(4))
        full = [t.clone().requires_grad_() for t in (q, k, v)]
        expected = F.scaled_dot_product_attention(*full, is_causal=True)
        (expected * upstream).sum().backward()
        mine = [t[:, :, pos].clone().requires_grad_() for t in (q, k, v)]
        out = ctx.attention(*mine)
        (out * upstream[:, :, pos]).sum().backward()
        torch.testing.assert_close(out, expected[:, :, pos], rtol=1e-12, atol=1e-12)
        for m, f in zip(mine, full, strict=True):
            torch.testing.assert_close(m.grad, f.grad[:, :, pos], rtol=1e-12, atol=1e-12)

        spec = ModelSpec(
            name="t",
            num_layers=1,
            hidden_size=32,
            num_heads=4,
            num_kv_heads=2,
            vocab_size=16,
            max_seq_len=S,
            learned_position_embeddings=False,
        )
        torch.manual_seed(0)
        whole = Attention(spec).double()
        split = Attention(spec).double()
        split.load_state_dict(whole.state_dict())
        split.context = ctx
        x = torch.randn(B, S, 32, generator=g, dtype=torch.float64)
        up = torch.randn(B, S, 32, generator=g, dtype=torch.float64)
        xs = [x.clone().requires_grad_(), x[:, pos].clone().requires_grad_()]
        outs = [whole(xs[0]), split(xs[1])]
        (outs[0] * up).sum().backward()
        (outs[1] * up[:, pos]).sum().backward()
        torch.testing.assert_close(outs[1], outs[0][:, pos], rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(xs[1].grad, xs[0].grad[:, pos], rtol=1e-10, atol=1e-12)
        for pw, ps in zip(whole.parameters(), split.parameters(), strict=True):
            summed = ps.grad.clone()
            dist.all_reduce(summed)
            torch.testing.assert_close(summed, pw.grad, rtol=1e-10, atol=1e-12)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_ring_attention_equals_full_causal_attention(tmp_path, world):
    import torch.multiprocessing as mp

    ctx = mp.start_processes(
        _ring_worker,
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
            pytest.fail("the ring attention test did not finish in 120 s")


# --------------------------------------------------------------------------- refusals


def test_a_launch_of_the_wrong_size_names_every_factor():
    plan = Plan(dp=2, cp=2, tp=1, pp=1, micro_batch_size=1, num_micro_batches=2)
    with pytest.raises(UsageError) as err:
        check_world(plan, 2, "--nproc-per-node 2 x --nnodes 1")
    assert str(err.value).startswith("the plan needs dp x cp x tp x pp = 2 x 2 x 1 x 1 = 4 processes")


@pytest.mark.parametrize(
    "device, capability, refused",
    [
        ("cpu", None, True),
        ("cuda", (8, 0), True),
        ("cuda", (8, 6), True),
        ("cuda", (8, 9), False),
        ("cuda", (9, 0), False),
    ],
)
def test_fp8_needs_fp8_tensor_cores(device, capability, refused):
    problem = fp8_problem(device, capability, "NVIDIA A100-SXM4-80GB" if capability == (8, 0) else "GPU")
    assert (problem is not None) == refused
    if refused:
        assert "FP8 GEMMs need a GPU with FP8 tensor cores" in problem and "rehearse the plan without fp8" in problem
        assert "\n" not in problem


def test_plan_run_refuses_an_fp8_plan_on_cpu_in_one_line(tmp_path, model_files):
    """On this machine (CPU, gloo): exit 2, one line, before any worker starts."""
    path = tmp_path / "fp8.json"
    doc = _plan_doc(model_files["llama"], 1, ["--fp8"], cluster="dgx-h100-80gb")
    assert doc["plan"]["fp8"] is True
    path.write_text(json.dumps(doc))
    if torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9):
        pytest.skip("this machine has FP8 tensor cores")
    res = cli("run", str(path), "--steps", "2", "--warmup", "1", "--timeout", PG_TIMEOUT)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "FP8 GEMMs need a GPU with FP8 tensor cores" in lines[0], res.stderr
    assert "rehearse the plan without fp8" in lines[0] and "Traceback" not in res.stderr and res.stdout == ""


def test_an_fp8_plan_is_rehearsed_in_fp32_where_it_runs():
    """Where the device has FP8, the run computes fp32 like the reference and says so."""
    from planner.executor.prepare import prepare_case
    from planner.specs import JobSpec, ModelSpec

    model = ModelSpec(
        name="t", num_layers=2, hidden_size=32, num_heads=4, vocab_size=64, max_seq_len=32, param_dtype="fp32"
    )
    case = prepare_case(
        model,
        JobSpec(global_batch_size=2, seq_len=32, precision="bf16"),
        Plan(dp=1, tp=1, pp=1, micro_batch_size=1, num_micro_batches=2, fp8=True),
    )
    assert case.fp8 and not case.plan.fp8
    assert any("FP8 GEMMs computed in fp32" in n for n in case.notes)
