"""`plan show`: the pictures are the estimate's numbers (planner/pictures.py, planner/draw.py).

- the schedule replay equals the published closed forms for equal stages (every schedule),
  and the estimate's bubble share to 1% of the step over a matrix of plans;
- the memory bars are the estimate's memory_gib_per_pipeline_rank;
- the placement shows every rank once, at the coordinates torch's DeviceMesh gives it.
That every picture is readable (nothing clipped or overlapping, zoom windows) is
tests/unit/pictures/test_picture_layout.py.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys

import pytest

from cost_models import pipeline
from cost_models.estimate import estimate
from hardware_profiles import load_cluster
from planner import pictures
from planner.inputs import JobRequest, make_job
from planner.presets import load_model
from planner.specs import Axis, Plan, PlanError, Schedule


def _replay_uniform(schedule: Schedule, pp: int, vpp: int, m: int, f: float, b: float) -> float:
    """Pipeline end of the schedule's op order with every stage taking f forward, b backward."""
    segments = {
        (k, j): [("forward" if k == "F" else "backward", f if k == "F" else b)] for k in "FB" for j in range(pp * vpp)
    }
    return max(op.end for op in pictures.replay(schedule, pp, vpp, m, segments))


_UNIFORM = [(s, pp, m, 1) for s in ("gpipe", "1f1b") for pp, m in [(2, 2), (4, 8), (8, 24), (4, 3), (8, 5)]] + [
    ("interleaved-1f1b", pp, m, v) for pp, m, v in [(2, 4, 2), (4, 8, 2), (4, 4, 3), (8, 16, 4), (4, 12, 2)]
]


@pytest.mark.parametrize("schedule,pp,m,vpp", _UNIFORM)
def test_replay_equals_published_pipeline_time_for_equal_stages(schedule, pp, m, vpp):
    """Narayanan et al. 2021 sec. 2.2: (m + p - 1) t for GPipe and 1F1B; (m + (p - 1)/v) v t_chunk
    interleaved; f = 1, b = 2 per chunk (backward twice the forward)."""
    f, b = 1.0, 2.0
    got = _replay_uniform(Schedule(schedule), pp, vpp, m, f, b)
    t_chunk = f + b
    assert got == pytest.approx((m + (pp - 1) / vpp) * vpp * t_chunk, rel=1e-12)
    assert got == pytest.approx(pipeline.pipeline_time([t_chunk] * (pp * vpp), pp, m, vpp), rel=1e-12)


def test_gpipe_closed_form_is_exact_when_slowest_forward_and_backward_differ():
    """Slowest forward on the last stage, slowest backward on the first: the replay of GPipe's
    order takes sum S + (m - 1)(max F + max B), longer than the one-slowest-stage form."""
    F, B, m = [1.0, 1.0, 3.0], [5.0, 2.0, 2.0], 6
    S = [f + b for f, b in zip(F, B)]
    want = pipeline.gpipe_time(S, F, m)
    assert want == pytest.approx(sum(S) + (m - 1) * (3.0 + 5.0))
    assert want > pipeline.pipeline_time(S, 3, m)


def _job(model, cluster, gb):
    return make_job(model, JobRequest(gb, min(2048, model.max_seq_len or 2048), "bf16"), cluster)


def _matrix():
    for name, cname, gpus, gb in [("llama3-8b", "dgx-a100-80gb", 16, 64), ("gpt3-175b", "dgx-a100-80gb", 1024, 1536)]:
        model, cluster = load_model(name), load_cluster(cname)
        job = _job(model, cluster, gb)
        for tp, pp, sched, vpp, zero, rec in itertools.product(
            [1, 8], [2, 4, 8], ["gpipe", "1f1b", "interleaved-1f1b"], [1, 2], [0, 3], ["none", "full"]
        ):
            if (vpp > 1) != (sched == "interleaved-1f1b") or gpus % (tp * pp) or model.num_layers % (pp * vpp):
                continue
            dp = gpus // (tp * pp)
            if gb % dp:
                continue
            plan = Plan(
                dp=dp,
                tp=tp,
                pp=pp,
                vpp=vpp,
                micro_batch_size=1,
                num_micro_batches=gb // dp,
                schedule=Schedule(sched),
                recompute=rec,
                zero_stage=zero,
            )
            try:
                plan.validate_for(model, job, gpus)
            except PlanError:
                continue
            yield pytest.param(model, cluster, job, plan, id=f"{name}-tp{tp}-pp{pp}-v{vpp}-{sched}-z{zero}-{rec}")


@pytest.mark.parametrize("model,cluster,job,plan", list(_matrix()))
def test_timeline_bubble_share_equals_the_estimates(model, cluster, job, plan):
    """The replayed schedule's bubble on the estimate's bottleneck rank, as a share of the step,
    equals the estimate's pipeline_bubble / step_time_s to 1% of the step; its step to 1%.
    GPipe is exact; 1F1B and interleaved are closed forms of the replay (cost_models/pipeline.py)."""
    est = estimate(model, cluster, job, plan)
    tl = pictures.timeline(model, cluster, job, plan, est)
    share = est.time_breakdown_s.pipeline_bubble / est.step_time_s
    assert tl.bubble_share == pytest.approx(share, abs=0.01)
    assert tl.step_time == pytest.approx(est.step_time_s, rel=0.01)
    if plan.schedule == Schedule.gpipe:
        assert tl.pipeline_end == pytest.approx(
            est.step_time_s - est.time_breakdown_s.optimizer - _per_step_dp(tl), rel=1e-9
        )
    # every micro-batch passes every virtual stage once each way
    assert len(tl.ops) == 2 * plan.num_micro_batches * plan.virtual_stages
    assert {(o.kind, o.stage, o.micro_batch) for o in tl.ops} == {
        (k, j, i) for k in "FB" for j in range(plan.virtual_stages) for i in range(plan.num_micro_batches)
    }


def _per_step_dp(tl) -> float:
    return max((s for tail in tl.tails for k, _, s in tail if k == "dp_comm"), default=0.0)


@pytest.mark.slow
def test_quick_start_plan_bubble_to_one_percent_relative(tmp_path):
    """The README's quick-start recommendation: its picture's bubble share equals the
    estimate's to 1% of itself."""
    out = tmp_path / "plan.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "planner.cli.main",
            "solve",
            "--model",
            "gpt3-175b",
            "--cluster",
            "dgx-a100-80gb",
            "--gpus",
            "1024",
            "--global-batch",
            "1536",
            "--seq-len",
            "2048",
            "-o",
            str(out),
        ],
        check=True,
        capture_output=True,
    )
    doc = json.loads(run_show(out, "--json").stdout)["timeline"]
    assert doc["bubble_share"] == pytest.approx(doc["estimate_bubble_share"], rel=0.01)


def run_show(plan_path, *args, check=True):
    return subprocess.run(
        [sys.executable, "-m", "planner.cli.main", "show", str(plan_path), *args],
        capture_output=True,
        text=True,
        check=check,
        env={**_env(), "COLUMNS": "120"},
    )


def _env():
    import os

    return dict(os.environ)


@pytest.fixture(scope="module")
def small_plan(tmp_path_factory):
    path = tmp_path_factory.mktemp("show") / "plan.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "planner.cli.main",
            "estimate",
            "--model",
            "llama3-8b",
            "--cluster",
            "dgx-a100-80gb",
            "--gpus",
            "16",
            "--global-batch",
            "32",
            "--seq-len",
            "2048",
            "--tp",
            "2",
            "--pp",
            "4",
            "--recompute",
            "selective",
            "--mesh-order",
            "dp,tp,pp",
            "-o",
            str(path),
        ],
        check=True,
        capture_output=True,
    )
    return path


@pytest.mark.slow
def test_memory_bars_are_the_estimates(small_plan):
    from planner.plan_file import read_plan_file

    doc = read_plan_file(small_plan)
    est = estimate(doc.model, doc.cluster, doc.job, doc.plan)
    bars = pictures.memory_bars(est)
    for bar, mem in zip(bars, est.memory_gib_per_pipeline_rank, strict=True):
        assert sum(bar.values()) == pytest.approx(mem.total, rel=1e-12)
        for kind, gib in bar.items():
            assert gib == getattr(mem, kind)
    shown = json.loads(run_show(small_plan, "--json").stdout)["memory_gib_per_pipeline_rank"]
    assert len(shown) == len(bars)
    for got, want in zip(shown, bars):
        assert got.keys() == want.keys() and all(got[k] == pytest.approx(want[k], rel=1e-12) for k in want)


def test_memory_figure_bar_heights(small_plan):
    pytest.importorskip("matplotlib")
    from planner import draw
    from planner.plan_file import read_plan_file

    doc = read_plan_file(small_plan)
    est = estimate(doc.model, doc.cluster, doc.job, doc.plan)
    fig = draw.memory_figure(pictures.memory_bars(est), est.memory_capacity_gib, "t")
    ax = fig.axes[0]
    tops = {}
    for patch in ax.patches:
        x = round(patch.get_x() + patch.get_width() / 2)
        tops[x] = max(tops.get(x, 0.0), patch.get_y() + patch.get_height())
    assert [tops[r] for r in range(doc.plan.pp)] == pytest.approx(
        [m.total for m in est.memory_gib_per_pipeline_rank], rel=1e-9
    )


@pytest.mark.parametrize("order", ["tp,dp,pp", "dp,tp,pp", "pp,tp,dp", "tp,pp,dp"])
def test_placement_every_rank_once_at_devicemesh_coordinates(order):
    """Ranks laid out as the executor's init_device_mesh lays them (planner/executor/parallelize.py:
    build_mesh: axes in reversed mesh order, the last varying fastest)."""
    torch = pytest.importorskip("torch")
    plan = Plan(
        dp=4, tp=2, pp=2, micro_batch_size=1, num_micro_batches=4, mesh_order=[Axis(a) for a in order.split(",")]
    )
    cluster = load_cluster("dgx-a100-80gb")
    pl = pictures.placement(plan, cluster)
    assert sorted(r["rank"] for r in pl.ranks) == list(range(plan.world_size))
    names = [a.value for a in reversed(plan.mesh_order)]
    degree = {"dp": plan.dp, "tp": plan.tp, "pp": plan.pp}
    mesh = torch.arange(plan.world_size).reshape([degree[n] for n in names])
    for idx in itertools.product(*(range(degree[n]) for n in names)):
        rank = int(mesh[idx])
        got = pl.ranks[rank]
        assert {n: got[n] for n in names} == dict(zip(names, idx))
        assert (got["node"], got["gpu"]) == divmod(rank, cluster.gpus_per_node)


@pytest.mark.slow
def test_show_writes_pictures_every_rank_once_in_the_svg(small_plan, tmp_path):
    pytest.importorskip("matplotlib")
    tl, mem, pl = tmp_path / "t.svg", tmp_path / "m.png", tmp_path / "p.svg"
    res = run_show(small_plan, "--timeline", str(tl), "--memory", str(mem), "--placement", str(pl))
    assert mem.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = pl.read_text()
    cells = re.findall(r'<g id="rank-(\d+)">\s*<text[^>]*>r(\d+)</text>\s*<text[^>]*>d(\d+) t(\d+) p(\d+)</text>', text)
    assert sorted(int(c[0]) for c in cells) == list(range(16))  # every rank once
    assert all(c[0] == c[1] for c in cells)
    svg = tl.read_text()
    assert svg.startswith("<?xml") and "pipeline bubble" in svg
    # text version: one row per pipeline rank, the memory table, the axes
    assert len(re.findall(r"^pp \d+ +\|", res.stdout, flags=re.M)) == 4
    assert "Memory per GPU" in res.stdout and "Placement: 16 ranks on 2 node(s)" in res.stdout
    # each file confirmed on stderr, as every command's -o, none on stdout
    assert res.stderr.splitlines() == [
        f"{k} picture written to {f}" for k, f in (("timeline", tl), ("memory", mem), ("placement", pl))
    ]
    assert "written to" not in res.stdout


@pytest.mark.slow
def test_timeline_figure_outlines_every_pass(small_plan):
    pytest.importorskip("matplotlib")
    from planner import draw
    from planner.plan_file import read_plan_file

    doc = read_plan_file(small_plan)
    est = estimate(doc.model, doc.cluster, doc.job, doc.plan)
    tl = pictures.timeline(doc.model, doc.cluster, doc.job, doc.plan, est)
    fig = draw.timeline_figure(tl, "t", est.step_time_s, 0.0)
    outlines = [c for c in fig.axes[0].collections if (c.get_gid() or "").startswith("ops-rank")]
    assert sum(len(c.get_paths()) for c in outlines) == len(tl.ops) == 2 * doc.plan.num_micro_batches * doc.plan.pp


@pytest.mark.slow
@pytest.mark.parametrize(
    "args,message",
    [
        (["--timeline", "x.pdf"], "use .svg or .png"),
        (["--timeline", "same.svg", "--memory", "same.svg"], "give each picture its own file"),
        (["--alternative", "1"], "has no alternatives"),
    ],
)
def test_show_bad_input_one_line(small_plan, tmp_path, args, message):
    args = [str(tmp_path / a) if a.endswith((".pdf", ".svg")) else a for a in args]
    res = run_show(small_plan, *args, check=False)
    assert res.returncode == 2, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and message in res.stderr
    assert not list(tmp_path.iterdir())


def _uneven_rounds(seed: str, count: int):
    """Random interleaved schedules whose chunks hold b or b + 1 layers (forward 1, backward 2
    per layer): (replay's pipeline time, the rank-paced form, each round paced by its slowest
    chunk, every chunk as slow as the slowest)."""
    import random

    from cost_models.pipeline import pipeline_time
    from planner.pictures import replay
    from planner.specs import Schedule

    rng = random.Random(seed)
    for _ in range(count):
        pp, v = rng.choice([2, 4, 8, 16]), rng.choice([2, 3, 4, 6])
        m, P, base = pp * rng.choice([1, 2, 4, 6]), pp * v, rng.randint(1, 4)
        longer = set(rng.sample(range(P), rng.randint(1, P - 1)))
        layers = [base + (j in longer) for j in range(P)]
        segments = {
            **{("F", j): [("forward", 1.0 * n)] for j, n in enumerate(layers)},
            **{("B", j): [("backward", 2.0 * n)] for j, n in enumerate(layers)},
        }
        end = max(op.end for op in replay(Schedule.interleaved_1f1b, pp, v, m, segments))
        stages = [3.0 * n for n in layers]
        rounds = (m - 1 / v) * sum(max(stages[c : c + pp]) for c in range(0, P, pp)) + sum(stages) / v
        yield end, pipeline_time(stages, pp, m, v), rounds, pipeline_time(stages, pp, m, v, padded=True)


@pytest.mark.slow
def test_chunks_of_unequal_length_are_priced_as_the_slowest():
    """cost_models/pipeline.py's figures: against the replay of Megatron's interleaved order with
    chunks of unequal length, the rank-paced form falls up to 28 % short, pacing each round by
    its slowest chunk 8 %; every chunk as slow as the slowest never (an upper bound), up to 75 %
    above."""
    ratios = [
        (end / ranks, end / rounds, end / padded) for end, ranks, rounds, padded in _uneven_rounds("uneven chunks", 400)
    ]
    assert 1.27 < max(r[0] for r in ratios) < 1.29 and 1.08 < max(r[1] for r in ratios) < 1.09
    assert max(r[2] for r in ratios) <= 1 + 1e-12 and 0.57 < min(r[2] for r in ratios) < 0.58


def test_placement_shows_the_shard_groups_and_their_replicas():
    """Hybrid sharding on 4 nodes of 8: dp 32 (tp 1) as 4 replicas of a node-wide shard group; the
    group stays on NVLink, the replicas cross nodes one rank per node (one rail each)."""
    plan = Plan(dp=32, tp=1, pp=1, micro_batch_size=1, num_micro_batches=1, zero_stage=3, dp_shard=8)
    rows = {a["axis"]: a for a in pictures.placement(plan, load_cluster("dgx-a100-80gb")).axes}
    shard, replicas = rows["dp shard (ZeRO group)"], rows["dp replicas"]
    assert (shard["degree"], shard["stride"], shard["inter_node"]) == (8, 1, False)
    assert (replicas["degree"], replicas["stride"], replicas["inter_node"], replicas["rails"]) == (4, 8, True, 1)
