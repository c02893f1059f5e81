"""Context parallelism (Plan.cp): each rank holds s / cp tokens of every sequence; attention
meets all keys through a ring of K/V chunks (exposed where the attention does not hide it);
activations divide by cp; weights are replicated, reduced and ZeRO-sharded over dp x cp; the
search tries cp for long sequences and finds the brute-force optimum."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cost_models import compute
from cost_models.estimate import estimate
from cost_models.tables import pipeline_costs
from hardware_profiles import load_cluster
from tests.unit.search.test_solver import assert_same_optimum, tiny_cluster
from planner.presets import load_model
from planner.search.candidates import SearchSpace
from planner.specs import Axis, JobSpec, Layout, ModelSpec, Plan

H100 = load_cluster("dgx-h100-80gb")
LLAMA = load_model("llama3-8b")


def _pc(cp: int, seq: int = 65536, tp: int = 1, sp: bool = False, zero: int = 0):
    job = JobSpec(global_batch_size=8, seq_len=seq)
    plan = Plan(
        dp=8 // (cp * tp),
        cp=cp,
        tp=tp,
        pp=1,
        micro_batch_size=1,
        num_micro_batches=8 * cp * tp // 8,
        sequence_parallel=sp,
        zero_stage=zero,
    )
    return pipeline_costs(LLAMA, H100, job, plan), plan, job


def _job(seq_len: int) -> JobSpec:
    return JobSpec(global_batch_size=1, seq_len=seq_len, precision=LLAMA.param_dtype)


def test_attention_per_rank_is_one_cp_th_of_the_sequence():
    """Executed attention FLOPs per GPU: (causal) 2 b s^2 a d / cp: a rank's s / cp queries
    against all s keys (load-balanced chunks)."""
    s = 65536
    full = compute.layer_compute(LLAMA, H100.device, _job(s), Layout())
    for cp in (2, 4, 8):
        part = compute.layer_compute(LLAMA, H100.device, _job(s // cp), Layout(cp=cp))
        attn = 2.0 * s * s * LLAMA.q_width
        linear = full.flops_forward - attn
        assert part.flops_forward == pytest.approx(linear / cp + attn / cp, rel=1e-9)


def test_ring_passes_kv_chunks_and_exposes_what_attention_does_not_hide():
    """Forward: cp - 1 steps, each passing one rank's K and V (2 x 2 b (s/cp) d kv_heads bytes,
    bf16) to the next CP rank, beside the attention of a block: exposed max((1 - eta) C,
    C - eta A) with C the sends and A the blocks' attention (communication.overlapped);
    backward sends K, V and their gradients, twice the bytes, beside the backward blocks."""
    from cost_models.communication import GroupLink
    from planner.specs import Collective

    pc1, _, _ = _pc(1)
    pc4, _, _ = _pc(4)
    chunk = 65536 // 4
    link = GroupLink(H100, 4, 1)  # tp 1: the CP group is 4 consecutive ranks on one node
    step = link.time(Collective.p2p, 2 * 2 * chunk * LLAMA.head_dim * LLAMA.kv_heads)
    a_f, a_b = compute.attention_times(H100.device, LLAMA.param_dtype, 1, LLAMA.num_heads, chunk, LLAMA.head_dim, True)
    eta = H100.overlap_efficiency
    fwd = max((1 - eta) * 3 * step, 3 * step - eta * 3 * a_f)
    bwd = max((1 - eta) * 6 * step, 6 * step - eta * 3 * a_b)
    assert pc1.layer.tp_forward == 0.0
    assert pc4.layer.tp_forward == pytest.approx(fwd, rel=1e-9)
    assert pc4.layer.tp_backward == pytest.approx(bwd, rel=1e-9)


def test_activations_and_states():
    """A rank keeps the activations of s / cp tokens; ZeRO-1 shards optimizer states over dp x cp."""
    pc1, _, _ = _pc(1)
    pc4, _, _ = _pc(4, zero=1)
    assert pc4.layer.activation_bytes[0] == pytest.approx(pc1.layer.activation_bytes[0] / 4, rel=0.01)
    assert pc4.dp == 8 and pc4.state_bytes_per_param[2] == pytest.approx(12 / 8)


def test_batch_counts_data_replicas_only():
    _, plan, job = _pc(4)
    assert plan.world_size == 8 and plan.dp == 2
    est = estimate(LLAMA, H100, job, plan)
    assert est.tokens_per_s == pytest.approx(8 * 65536 / est.step_time_s)


SMALL = ModelSpec(
    name="small",
    num_layers=4,
    hidden_size=1024,
    num_heads=8,
    vocab_size=32000,
    max_seq_len=32768,
    activation="swiglu",
    learned_position_embeddings=False,
    linear_bias=False,
    norm="rmsnorm",
    dropout=False,
)


@pytest.mark.slow
@pytest.mark.parametrize("memory_gib", [80, 6, 3])
def test_cp_choice_matches_brute_force(memory_gib):
    """4 GPUs, 16k tokens: cp 1, 2, 4 against dp, tp, pp, splits and recompute; tight memory
    makes sharding the sequence pay."""
    job = JobSpec(global_batch_size=4, seq_len=16384)
    space = SearchSpace(
        num_gpus=4,
        global_batch_size=4,
        cp_degrees=(1, 2, 4),
        seq_len=16384,
        fixed={"mesh_order": (Axis.tp, Axis.dp, Axis.pp), "micro_batch_size": 1},
    )
    assert_same_optimum(
        SMALL, tiny_cluster(memory_gib, overlap=H100.overlap_efficiency, preset="dgx-h100-80gb"), job, space
    )


@pytest.mark.slow
def test_llama3_8b_at_128k_on_8_h100_uses_cp_and_bad_cp_is_one_line():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "planner.cli.main",
            "solve",
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
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    import json

    plan = json.loads(out.stdout)["plan"]
    assert plan["cp"] > 1
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "planner.cli.main",
            "estimate",
            "--model",
            "llama3-8b",
            "--cluster",
            "dgx-h100-80gb",
            "--gpus",
            "8",
            "--global-batch",
            "8",
            "--seq-len",
            "4100",
            "--cp",
            "8",
        ],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "2 x cp" in bad.stderr


@pytest.mark.slow
def test_what_if_on_a_cp_plan_keeps_cp_in_the_world(tmp_path):
    """`plan estimate --plan` recomputes dp from GPUs / (tp x pp x cp) when a degree changes."""
    path = tmp_path / "cp.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "planner.cli.main",
            "estimate",
            "--model",
            "llama3-8b",
            "--cluster",
            "dgx-h100-80gb",
            "--gpus",
            "8",
            "--global-batch",
            "8",
            "--seq-len",
            "65536",
            "--cp",
            "4",
            "-o",
            str(path),
        ],
        capture_output=True,
    )
    import json

    for change, want in ((["--tp", "2", "--sequence-parallel"], (1, 4, 2)), (["--cp", "2"], (4, 2, 1))):
        res = subprocess.run(
            [sys.executable, "-m", "planner.cli.main", "estimate", "--plan", str(path), *change, "--json"],
            capture_output=True,
            text=True,
        )
        doc = json.loads(res.stdout)
        assert res.returncode == (0 if doc["estimate"]["fits"] else 1), res.stderr  # a plan over its memory exits 1
        plan = doc["plan"]
        assert (plan["dp"], plan["cp"], plan["tp"]) == want
