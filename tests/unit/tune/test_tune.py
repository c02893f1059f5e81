"""`plan tune` with a fake executor (tests/fakes.py:FakeExecutor: a machine whose true
constants are known, measuring the cost model's prediction under them): the loop finds the
true best within its budget and its refit converges; out-of-memory trials are results; the
journal survives a torn line and a resume runs nothing twice; the tuned profile is a cluster
`plan solve` reads. The real executor's tests are in tests/distributed/test_tune_run.py."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from cost_models.estimate import estimate as predict
from cost_models.fit import CONSTANTS, constants_of, fit_memory_overhead
from planner import api
from planner.errors import UsageError
from planner.tune import journal
from tests.fakes import FakeExecutor
from planner.tune.loop import Budget, header, search, tune
from planner.tune.output import tuned_profile, winner_document

from tests.unit.tune.conftest import MODEL, TRUE  # the fake machine and the space: conftest.py


def _true_times(request_, space, executor):
    truth = executor.truth(request_.cluster)
    return {c.key: predict(MODEL, truth, c.job, c.plan).step_time_s for c in space}


@pytest.fixture(scope="module")
def tuned(request_, space):
    executor = FakeExecutor(TRUE)
    budget = Budget(trials=max(4, len(space) // 3))
    return executor, budget, tune(request_, executor, budget)


@pytest.mark.slow
def test_finds_the_true_best_within_the_budget(request_, space, tuned):
    executor, budget, result = tuned
    true = _true_times(request_, space, executor)
    assert len(space) >= 12
    assert len(result.records) <= budget.trials < len(space)
    assert result.best.key == min(true, key=true.get)  # the fastest layout on the "true" machine
    firsts = [r for r in result.records if r.repeat_of is None]
    assert len({r.key for r in firsts}) == len(firsts)  # a layout runs again only as a marked repeat
    for r in result.records:
        if r.repeat_of is not None:
            assert result.records[r.repeat_of].key == r.key and result.records[r.repeat_of].repeat_of is None
    assert result.exhaustive == len(space) and result.exhaustive_complete


def test_refit_converges_to_the_true_constants(request_, space, tuned):
    executor, _, result = tuned
    true = _true_times(request_, space, executor)

    def error(cluster, c):
        return abs(predict(MODEL, cluster, c.job, c.plan).step_time_s / true[c.key] - 1)

    # every layout of the space, measured or not, is now predicted as the true machine runs it,
    assert max(error(result.refit.cluster, c) for c in space) < 0.05
    assert max(error(request_.cluster, c) for c in space) > 0.2  # (the prior was far off)

    # and the constants came most of the way from the prior to the truth (in units of each one's range)
    def distance(theta):
        return math.hypot(*((t - x) / (c.hi - c.lo) for t, x, c in zip(theta, TRUE, CONSTANTS)))

    assert distance(result.refit.constants) < 0.25 * distance(
        constants_of(request_.cluster, "generic")
    )  # 0.22 measured


def test_first_trials_spread_over_the_uncertain_terms(tuned):
    _, budget, result = tuned
    spread = [r for r in result.records if r.why.startswith("spread")]
    assert len(spread) >= 2
    # each brought a term no trial before it had (tp > 1, pp > 1, ZeRO-3)
    for i, r in enumerate(spread[1:], 1):
        before = {
            t for s in spread[:i] for t, on in zip("tpz", (s.plan.tp > 1, s.plan.pp > 1, s.plan.zero_stage == 3)) if on
        }
        now = {t for t, on in zip("tpz", (r.plan.tp > 1, r.plan.pp > 1, r.plan.zero_stage == 3)) if on}
        assert now - before, (r.label, before)


@pytest.mark.slow
def test_a_budget_of_six_measures_each_uncertain_term_once(request_, space):
    # the benchmark's budget (benchmarks/tune.py: a third of 20 layouts): the first trial, then
    # one each with tp, pp and ZeRO-3, so that no term the space holds is left to the prior
    assert {(c.plan.tp > 1, c.plan.pp > 1, c.plan.zero_stage == 3) for c in space} >= {
        (True, False, False),
        (False, True, False),
        (False, False, True),
    }
    result = tune(request_, FakeExecutor(TRUE), Budget(trials=6, refit_rounds=0))
    first = result.records[:4]
    assert [r.why.startswith("spread") for r in first] == [False, True, True, True]
    assert {
        t for r in first for t, on in zip("tpz", (r.plan.tp > 1, r.plan.pp > 1, r.plan.zero_stage == 3)) if on
    } == set("tpz")


@pytest.mark.slow
def test_a_large_tolerance_proves_the_answer_early(request_):
    result = tune(request_, FakeExecutor(TRUE), Budget(trials=12, tolerance=0.3, refit_rounds=0))
    assert result.stop == "proven" and len(result.records) < 12
    assert result.margin <= 0.3


@pytest.mark.slow
def test_out_of_memory_is_a_result_and_teaches_the_memory_model(request_, space):
    peaks = sorted({round(c.estimate.peak_memory_gib, 3) for c in space})
    limit = peaks[len(peaks) // 2]  # half the layouts need more than this on the "true" machine
    executor = FakeExecutor(TRUE, memory_limit_gib=limit)
    result = tune(request_, executor, Budget(trials=6, refit_rounds=0))
    statuses = [r.status for r in result.records]
    assert "oom" in statuses and "ok" in statuses
    assert statuses.index("ok") > statuses.index("oom") or statuses[-1] == "ok"  # the tune went on after it
    oom_peaks = [r.predicted_peak_gib for r in result.records if r.status == "oom"]
    assert result.refit.overhead_gib > request_.cluster.device.framework_overhead_gib
    # after the refit no layout the search returns is predicted to need what the one that ran out did
    listed, _ = search(request_, result.refit.cluster, 50)
    assert all(
        c.estimate.peak_memory_gib + 1e-9
        < min(oom_peaks) + (result.refit.overhead_gib - request_.cluster.device.framework_overhead_gib)
        for c in listed
    )


def test_memory_overhead_fit():
    assert fit_memory_overhead(2.0, 80.0, [(50.0, 51.5)], []) == pytest.approx(3.5)  # measured above predicted
    assert fit_memory_overhead(2.0, 80.0, [(40.0, 30.0)], [70.0]) == pytest.approx(
        12.0
    )  # 70 -> 80: the OOM reaches the limit
    assert fit_memory_overhead(2.0, 80.0, [(75.0, 30.0)], [70.0]) == pytest.approx(
        7.0
    )  # but the 75 that ran must still fit
    assert fit_memory_overhead(2.0, 80.0, [], []) == 2.0


@pytest.mark.slow
def test_journal_resume_runs_nothing_finished(request_, tmp_path):
    path = tmp_path / "j.jsonl"
    first = FakeExecutor(TRUE)
    journal.start(path, header(request_, first))
    done = tune(request_, first, Budget(trials=2, refit_rounds=0), path).records
    with open(path, "ab") as f:  # a record torn by a kill in the middle of its write
        f.write(b'{"kind": "trial", "index": 3, "key": "abc')
    warnings = []
    head, records = journal.read(path, warnings.append)
    assert len(warnings) == 1 and "cut off" in warnings[0]
    assert [r.key for r in records] == [r.key for r in done]
    assert path.read_bytes().endswith(b"\n")  # the torn line is gone, the whole ones kept
    second = FakeExecutor(TRUE)
    result = tune(request_, second, Budget(trials=4, refit_rounds=0), path, records)
    assert len(second.measured) == len(result.records) - 2 >= 1  # only new trials ran (it may stop early, proven)
    finished = {r.key for r in done}  # a finished layout runs again only as a marked repeat
    assert all(r.repeat_of is not None or r.key not in finished for r in result.records[2:])
    _, again = journal.read(path, warnings.append)
    assert [r.key for r in again] == [r.key for r in result.records]


def test_journal_damage_before_the_last_line_is_refused(request_, tmp_path):
    path = tmp_path / "j.jsonl"
    journal.start(path, header(request_, FakeExecutor(TRUE)))
    tune(request_, FakeExecutor(TRUE), Budget(trials=2, refit_rounds=0), path)
    lines = path.read_bytes().split(b"\n")
    lines[1] = b"garbage"
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(UsageError, match="damaged at line 2"):
        journal.read(path, lambda _: None)
    with pytest.raises(UsageError, match="exists"):
        journal.start(path, header(request_, FakeExecutor(TRUE)))


def test_tuned_profile_is_a_cluster_plan_solve_reads(request_, tuned, tmp_path):
    _, _, result = tuned
    profile = tuned_profile(result, "2026-12-02 07:00 UTC")
    k = profile.stack_constants[request_.target]
    assert (k.sustained_fraction, k.kernel_overhead_us, k.overlap_efficiency) == result.refit.constants
    assert "trials" in k.provenance and "generic" in k.provenance and "4 ranks" in k.provenance
    prior_u = request_.cluster.for_target("generic").uncertainty
    assert k.uncertainty.communication >= prior_u.communication  # one node: no inter-node ring was measured
    assert k.uncertainty.compute < prior_u.compute or k.uncertainty.compute < 0.2
    path = tmp_path / "tuned.json"
    path.write_text(profile.model_dump_json(indent=2))
    doc = api.solve(MODEL, str(path), gpus=4, global_batch=16, seq_len=2048, target="generic", fixes=["sp=false"])
    assert doc.estimate.step_time_s > 0
    winner = winner_document(result, profile)
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(winner.model_dump_json(indent=2))
    assert api.read_plan(plan_path).plan == result.best.plan  # a plan file `plan export` / `plan run` read


def _plan(*args):
    env = {**os.environ, "COLUMNS": "200"}  # the table's headers on one line
    return subprocess.run(
        [sys.executable, "-m", "planner.cli.main", "tune", *args], capture_output=True, text=True, timeout=60, env=env
    )


@pytest.mark.slow
@pytest.mark.parametrize("option", ["-o", "--plan-out"])
def test_an_output_onto_the_resumed_journal_is_refused_before_anything_runs(option, tmp_path):
    """The journal is read and appended to: an output that would replace it is refused at once
    (not after the tune, its trials run), the journal as it was."""
    j = tmp_path / "j.jsonl"
    j.write_text("not read yet\n")
    res = subprocess.run(
        [sys.executable, "-m", "planner.cli.main", "tune", "--resume", "j.jsonl", option, "./j.jsonl"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert res.returncode == 2 and "it is the input of this command" in res.stderr, res.stderr
    assert j.read_text() == "not read yet\n"


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, needle",
    [
        ([], "--model is required"),
        (["--resume", "/nonexistent/j.jsonl"], "cannot read the journal"),
        (
            [
                "--model",
                "gpt2-124m",
                "--cluster",
                "dgx-a100-80gb",
                "--gpus",
                "2",
                "--global-batch",
                "4",
                "--steps",
                "2",
                "--warmup",
                "2",
            ],
            "--warmup 2 leaves no timed step",
        ),
        (["--resume", "x.jsonl", "--model", "gpt2-124m"], "drop --model"),
        (["--resume", "x.jsonl", "-o", "a.json", "--plan-out", "a.json"], "-o and --plan-out both write a.json"),
        (
            [
                "--model",
                "gpt2-124m",
                "--cluster",
                "dgx-a100-80gb",
                "--gpus",
                "2",
                "--global-batch",
                "4",
                "--journal",
                "",
            ],
            "--journal is empty",
        ),
        (
            [
                "--model",
                "gpt2-124m",
                "--cluster",
                "dgx-a100-80gb",
                "--gpus",
                "2",
                "--global-batch",
                "4",
                "--launcher",
                "bogus",
            ],
            "bogus",
        ),
        (
            [
                "--model",
                "gpt2-124m",
                "--cluster",
                "dgx-a100-80gb",
                "--gpus",
                "2",
                "--global-batch",
                "4",
                "--journal",
                "no/such/dir/j.jsonl",
            ],
            "cannot write no/such/dir/j.jsonl: directory",
        ),
        # what no layout changes is refused before a trial launches (every trial failed on it, and the tune exited 0)
        (
            [
                "--model",
                "gpt2-124m",
                "--cluster",
                "dgx-a100-80gb",
                "--gpus",
                "2",
                "--global-batch",
                "4",
                "--seq-len",
                "128",
                "--scale-heads",
                "5",
            ],
            "--scale-heads 5: it does not split hidden 768; use --scale-heads 6",
        ),
    ],
)
def test_bad_inputs_are_one_line(args, needle, tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "planner.cli.main", "tune", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("error:") and needle in res.stderr, res.stderr
    assert not list(tmp_path.iterdir())  # no journal, no output


def test_an_existing_journal_is_refused_before_the_search_and_kept(tmp_path):
    path = tmp_path / "j.jsonl"
    path.write_text("earlier trials\n")
    res = _plan(
        "--model",
        "gpt2-124m",
        "--cluster",
        "dgx-a100-80gb",
        "--gpus",
        "2",
        "--global-batch",
        "4",
        "--journal",
        str(path),
    )
    assert res.returncode == 2 and f"the journal {path} exists: continue it with --resume" in res.stderr, res.stderr
    assert res.stderr.count("\n") == 1 and path.read_text() == "earlier trials\n"


def test_a_journal_of_something_else_is_refused(tmp_path):
    path = tmp_path / "j.jsonl"
    path.write_text(json.dumps({"kind": "trial"}) + "\n")
    res = _plan("--resume", str(path))
    assert res.returncode == 2 and "not a `plan tune` journal" in res.stderr and res.stderr.count("\n") == 1, res.stderr


def _edited_journal(request_, tmp_path, edit_header=None, edit_trial=None):
    """A journal of one finished trial, its header or trial record edited by hand."""
    path = tmp_path / "j.jsonl"
    journal.start(path, header(request_, FakeExecutor(TRUE)))
    tune(request_, FakeExecutor(TRUE), Budget(trials=1, refit_rounds=0), path)
    head, trial = (json.loads(line) for line in path.read_text().splitlines())
    (edit_header or (lambda _: None))(head)
    (edit_trial or (lambda _: None))(trial)
    path.write_text(json.dumps(head) + "\n" + json.dumps(trial) + "\n")
    return path


@pytest.mark.slow
@pytest.mark.parametrize(
    "edit, needle",
    [
        (lambda h: h["solve"].update(bogus=1), "unknown search option 'bogus'"),
        (lambda h: h["solve"].update(top_k=5), "unknown search option 'top_k'"),
        (lambda h: h["solve"].update(global_batch="x"), "global_batch is 'x'"),
        (lambda h: h["solve"].update(max_memory_gib="NaN"), "max_memory_gib is 'NaN'"),
        (lambda h: h["solve"].update(fixes=[1]), "not CHOICE=VALUE strings"),
        (lambda h: h.update(version=2), "journal version 2"),
        (lambda h: h.update(gpus=True), "gpus: Input should be a valid integer"),  # not read as 1
        (lambda h: h.update(gpus=2.0), "gpus: Input should be a valid integer"),
    ],
)
def test_a_hand_edited_header_is_refused_saying_what(request_, tmp_path, edit, needle):
    path = _edited_journal(request_, tmp_path, edit_header=edit)
    with pytest.raises(UsageError, match="no tune header") as exc:
        journal.read(path, lambda _: None)
    assert needle in str(exc.value)


@pytest.mark.slow
@pytest.mark.parametrize("step", [0.0, -1.0, float("inf"), float("nan"), None])
def test_a_trial_that_ran_without_a_positive_finite_time_is_damage(request_, tmp_path, step):
    path = _edited_journal(request_, tmp_path, edit_trial=lambda t: t.update(status="ok", step_time_s=step))
    with pytest.raises(UsageError, match="damaged at line 2"):
        journal.read(path, lambda _: None)


def test_a_journal_holding_a_layout_twice_is_refused(request_, tmp_path):
    path = _edited_journal(request_, tmp_path)
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines + [lines[1]]) + "\n")
    with pytest.raises(UsageError, match="twice \\(lines 2 and 3\\)"):
        journal.read(path, lambda _: None)


def test_a_journal_nested_past_the_parser_is_refused(tmp_path):
    path = tmp_path / "j.jsonl"
    path.write_text("[" * 200_000 + "]" * 200_000 + "\n")
    with pytest.raises(UsageError, match="not a `plan tune` journal"):
        journal.read(path, lambda _: None)


@pytest.mark.slow
@pytest.mark.parametrize(
    "edit",
    [
        lambda h: h["solve"].update(target="jax"),
        lambda h: h.update(gpus=-4),
        lambda h: h["solve"].update(global_batch=0),
        lambda h: h["solve"].update(fixes=["tp=2", "tp=4"]),
    ],
)
def test_a_header_whose_search_fails_is_refused_before_any_trial(request_, tmp_path, edit):
    """Said of the journal (the user gave only --resume J), and the file left as it was, a torn
    last line included (it used to be cut off before the header was checked)."""
    path = _edited_journal(request_, tmp_path, edit_header=edit)
    with open(path, "ab") as f:
        f.write(b'{"kind": "trial", "ind')
    before = path.read_bytes()
    res = _plan("--resume", str(path), "--trials", "2")
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.startswith(f"error: the journal {path} has a damaged header (its search options): "), res.stderr
    assert path.read_bytes() == before


@pytest.mark.slow
def test_resume_with_the_budget_spent_renders_and_writes(request_, tmp_path):
    """`plan tune --resume J` with its trials done runs nothing: the table, the profile, the plan."""
    path = tmp_path / "j.jsonl"
    journal.start(path, header(request_, FakeExecutor(TRUE)))
    tune(request_, FakeExecutor(TRUE), Budget(trials=2, refit_rounds=0), path)
    res = _plan(
        "--resume",
        str(path),
        "--trials",
        "2",
        "-o",
        str(tmp_path / "tuned.json"),
        "--plan-out",
        str(tmp_path / "p.json"),
    )
    assert res.returncode == 0, res.stderr
    assert "predicted before" in res.stdout and "measured best:" in res.stdout and "best" in res.stdout
    assert "an exhaustive sweep would have run" in res.stdout
    assert api.read_plan(tmp_path / "p.json").num_gpus == 4
    assert json.loads((tmp_path / "tuned.json").read_text())["stack_constants"]["generic"]["provenance"].startswith(
        "plan tune"
    )


def test_a_fixed_micro_batch_whose_batch_no_document_holds_is_refused_or_skipped():
    """dp x mbs x micro-batches above MAX_GLOBAL_BATCH: refused up front when no dp can hold
    it, else those layouts are skipped (found by fuzzing: the search crashed building them)."""
    with pytest.raises(UsageError, match="over the 100,000,000"):
        api.solve("gpt2-124m", "dgx-h100-80gb", gpus=8, micro_batch_size=2, micro_batches=50_000_001, top_k=0)
    doc = api.solve("gpt2-124m", "dgx-h100-80gb", gpus=8, micro_batch_size=1, micro_batches=100_000_000, top_k=3)
    assert all(a.global_batch_size <= 100_000_000 for a in doc.alternatives) and doc.plan.dp == 1


def test_the_journal_knows_every_search_option_of_api_solve():
    """journal.SOLVE_KEYWORDS restates api.solve's keywords with the JSON kinds a header may hold
    for them: a keyword added to api.solve without it would make a new tune's own header
    unreadable on --resume. The two lists stay the same (model, cluster, gpus and top_k are the
    header's own fields or the tune's)."""
    from planner.tune.journal import SOLVE_KEYWORDS

    keywords = set(api.SolveOptions.__optional_keys__) - {"gpus", "top_k"}
    assert set(SOLVE_KEYWORDS) == keywords
