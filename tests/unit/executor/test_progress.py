"""Long work is never silent: `plan run` and `plan profile` say how long they will take before
they start, and report progress on stderr whether or not it is a terminal (plain lines off a
terminal), with the time left refined from what has been measured. Fake clocks here; one
`plan run` launch on 2 processes with stderr a pipe: tests/distributed/test_progress_launch.py."""

import pytest

from planner.cli import render
from planner.executor.duration import ItemClock, RunClock, RunEstimate, estimate_run
from planner.executor.prepare import prepare_case
from planner.presets import load_model
from planner.specs import JobSpec, Plan


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def lines_of(capsys) -> list[str]:
    return [ln for ln in capsys.readouterr().err.splitlines() if ln]


# --------------------------------------------------------------------------- plain lines


def test_off_a_terminal_a_line_per_phase_per_slow_step_and_at_the_end(capsys):
    """Issue 18 (9): off a terminal `plan run` and `plan profile` printed nothing until the end."""
    clock = FakeClock()
    with render.ProgressLines("plan run:", terminal=False, clock=clock, heartbeat=False) as lines:
        lines.say("estimate before starting: about 2 min")
        lines.update(0, 3, "starting 2 workers")
        clock.now += 20
        for step in (1, 2, 3):
            lines.update(step, 3, "distributed run on 2 ranks, step")
            clock.now += 5
        lines.update(0, 1, "single-process reference runs")
    out = lines_of(capsys)
    assert out[0] == "plan run: estimate before starting: about 2 min"
    assert out[1] == "plan run: [0:00] 0/3 starting 2 workers"
    assert out[2:5] == [f"plan run: [0:{20 + 5 * i:02d}] {i + 1}/3 distributed run on 2 ranks, step" for i in range(3)]
    assert out[5] == "plan run: [0:35] 0/1 single-process reference runs"


def test_quick_reports_are_thinned_but_phases_and_the_end_are_kept(capsys):
    clock = FakeClock()
    with render.ProgressLines("plan profile:", terminal=False, clock=clock, heartbeat=False) as lines:
        for i in range(30):  # 30 collective sizes, 0.1 s apart: one line for the phase, then one per 2 s
            lines.update(i, 40, f"all_reduce x2 {2 ** (10 + i)} B")
            clock.now += 0.1
        lines.update(30, 40, "communication/compute overlap")
        lines.update(40, 40, "gathering the measurements")
    out = lines_of(capsys)
    assert 2 <= sum("all_reduce" in ln for ln in out) <= 3
    assert out[-2].endswith("30/40 communication/compute overlap") and out[-1].endswith(
        "40/40 gathering the measurements"
    )


def test_a_long_phase_gets_a_line_every_ten_seconds_with_the_time_left(capsys):
    clock = FakeClock()
    left = lambda done, total, message: f"about {render.duration(60 - (clock.now - 100))} left"  # noqa: E731
    with render.ProgressLines("plan run:", terminal=False, left=left, clock=clock, heartbeat=False) as lines:
        lines.update(0, 1, "single-process reference runs")
        for _ in range(25):
            clock.now += 1
            lines.beat()
    out = lines_of(capsys)
    assert out == [
        "plan run: [0:00] 0/1 single-process reference runs; about 60 s left",
        "plan run: [0:10] 0/1 single-process reference runs; about 50 s left",
        "plan run: [0:20] 0/1 single-process reference runs; about 40 s left",
    ]


@pytest.mark.parametrize(
    "seconds, words",
    [
        (0.04, "0.1 s"),
        (3.21, "3.2 s"),
        (44.6, "45 s"),
        (150, "2.5 min"),
        (428, "7 min"),
        (1740, "29 min"),
        (5400, "1 h 30 min"),
    ],
)
def test_durations_are_said_with_an_estimates_precision(seconds, words):
    assert render.duration(seconds) == words


# --------------------------------------------------------------------------- the time left

EST = RunEstimate(startup_s=10.0, step_s=20.0, steps=5, reference_s=60.0, step_basis="from FLOPs")


def test_the_time_left_uses_measured_steps_once_there_are_any():
    clock = FakeClock()
    run = RunClock(EST, render.duration, clock=clock)
    assert run.update(0, 5, "starting") == "about 3 min left (estimated)"  # 10 + 5 x 20 + 60 = 170 s
    clock.now += 40  # start-up 10 s as estimated, first step 30 s
    assert run.update(1, 5, "step") == "about 3 min left (30 s a step, measured)"  # 4 x 30 + 60
    clock.now += 8  # steps are 8 s apart
    assert run.update(2, 5, "step") == "about 84 s left (8.0 s a step, measured)"  # 3 x 8 + 60
    clock.now += 16  # the follower may see two steps at once
    assert run.update(4, 5, "step") == "about 68 s left (8.0 s a step, measured)"
    clock.now += 8
    assert run.update(5, 5, "step").startswith("about 60 s left")
    clock.now += 5
    assert run.update(0, 1, "single-process reference runs") == "about 60 s left (estimated)"
    clock.now += 45
    assert run.update(0, 1, "single-process reference runs") == "about 15 s left (estimated)"
    clock.now += 30
    assert run.update(0, 1, "single-process reference runs") == "taking longer than estimated"


def test_item_clock_scales_what_is_left_by_how_the_finished_items_went():
    clock = FakeClock()
    items = [10.0, 10.0, 0.5, 30.0]
    left = ItemClock(items, render.duration, clock=clock)
    assert left.update(0, 4, "block") == "about 50 s left"  # 50.5 s: nothing measured yet
    clock.now += 20  # the first item took twice its estimate
    assert left.update(1, 4, "block") == "about 81 s left"  # (10 + 0.5 + 30) x 2
    clock.now += 5
    assert left.update(1, 4, "block") == "about 76 s left"  # 5 s into the second item
    assert left.update(0, 9, "another total") == ""


# --------------------------------------------------------------------------- estimates


def test_the_estimate_grows_with_the_work_and_shrinks_with_the_rate():
    gpt2 = load_model("gpt2-124m")
    plan = Plan(dp=2, tp=1, pp=1, micro_batch_size=1, num_micro_batches=1)
    small = prepare_case(gpt2, JobSpec(global_batch_size=2, seq_len=256, precision="fp32"), plan, steps=3, warmup=1)
    big = prepare_case(gpt2, JobSpec(global_batch_size=2, seq_len=1024, precision="fp32"), plan, steps=3, warmup=1)
    rates = (90e9, 45e9)
    a, b = estimate_run(small, rates, cores=2), estimate_run(big, rates, cores=2)
    assert b.step_s > 3.5 * a.step_s and b.reference_s > 3.5 * a.reference_s  # 4x the tokens, a little more attention
    assert estimate_run(small, (180e9, 90e9), cores=2).total_s < a.total_s
    # GPT-2 124M, 2 x 256 tokens: measured here 6-13 s a step and 53-66 s of reference runs (planner/executor/duration.py)
    assert 4 < a.step_s < 20 and 35 < a.reference_s < 100
    crowded = estimate_run(
        prepare_case(
            gpt2,
            JobSpec(global_batch_size=8, seq_len=256, precision="fp32"),
            Plan(dp=8, tp=1, pp=1, micro_batch_size=1, num_micro_batches=1),
            steps=3,
            warmup=1,
        ),
        rates,
        cores=2,
    )
    assert "8 ranks on 2 cores" in crowded.step_basis and crowded.step_s == pytest.approx(4 * a.step_s, rel=0.05)


def test_the_profile_reports_as_many_items_as_it_estimates():
    """The workers' progress lines (planner/profiler/profile.py: Progress) count against
    work_items: a quick profile of GPT-2 on 2 processes is 48 items, the LM head and the
    stacks of blocks the heaviest (measured: 52 s and 65 s of 145 s, docs in profile.py)."""
    torch = pytest.importorskip("torch")  # noqa: F841
    from planner.profiler.profile import ProfileRequest, _tp_shards, describe_work, work_items

    gpt2 = load_model("gpt2-124m")
    req = ProfileRequest(model=gpt2, seq_len=1024, micro_batches=(1,), quick=True, backend="gloo")
    items = work_items(req, _tp_shards(gpt2, 2), 2, 2, 100e9, 2)
    assert len(items) == 48 and items[-1][0] == "stacks"
    # the sweep's items, as sweep() times them: 8 sizes of 5 collectives over the one group of 2
    from planner.profiler.links import group_shapes, swept

    assert [(g, [c.value for c in swept(g, inter, 1)]) for g, inter in group_shapes(2, 2)] == [
        ([0, 1], ["all_reduce", "all_gather", "reduce_scatter", "p2p", "all_to_all"])
    ]
    # 2 nodes of 4: groups of 2 and 4 inside a node, one rank per node, the whole world (no all-to-all)
    assert [len(swept(g, inter, 2)) for g, inter in group_shapes(8, 4)] == [5, 5, 5, 4]
    assert [len(swept(g, inter, 1)) for g, inter in group_shapes(3, 3)] == [5]  # 3 ranks: one pair, one sits out
    assert [len(swept(g, inter, 3)) for g, inter in group_shapes(3, 1)] == [
        5
    ]  # 3 hosts of one rank (tests/unit/profiler/test_profile.py)
    seconds = [s for _, s in items]
    assert sorted(seconds)[-2:] == sorted([seconds[3], seconds[-1]])  # the head, the stacks
    words = describe_work(items, 100e9, render.duration)
    assert words.startswith("about 2.5 min") and "100 GFLOP/s" in words
