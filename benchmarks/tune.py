"""Does `plan tune` find the best layout with a third of the trials an exhaustive sweep needs?

    python benchmarks/tune.py [--profile profile.json] [--ranks 4] [--trials K] [--steps 4]

On this machine's CPU processes (one thread each, gloo): a small GPT (4 layers, hidden 256,
sequence 128, global batch 16, fp32) over a search space of every layout with micro-batch 2
and no recompute or sequence parallelism (dp x tp x pp, schedules, ZeRO 0-3: 20 feasible
layouts on 4 ranks). The cluster is a `plan profile` of this machine (made here unless
--profile gives one) whose stack constants are deliberately wrong: the DGX A100 preset's
fitted ones (its sustained fraction, kernel gap and overlap efficiency), as if the user had
tuned on another machine. Then, in one run:
1. `plan tune` (planner.tune, the real executor: `plan run` of each trial) with a budget of
   a third of the layouts (--trials);
2. the exhaustive sweep: every layout of the same space run by the same executor (steps,
   warm-up, timing), in one launch rather than one per layout (startup paid once).
Printed: the tune's trials, then the sweep, the tuned answer's regret (its time in the sweep
against the sweep's fastest), the prediction's error on the sweep's layouts the tune did not
measure, with the wrong prior and with the refit constants (mean |predicted / measured - 1|),
the model's own floor on this machine (its constants refit to every layout of the sweep, in
sample: no choice of trials can do better), the repeatability of a measurement (the tune's
trials measured again in the sweep: what no model can predict), and the wall time of each. Its last line is
`tune: regret R % with K of N trials, refit error E %`.
"""

from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cost_models.estimate import estimate as predict  # noqa: E402
from cost_models.fit import constants_of, with_constants  # noqa: E402
from planner import api  # noqa: E402
from planner.specs import ModelSpec, RunReport  # noqa: E402
from planner.tune import journal  # noqa: E402
from planner.tune.refit import Observation, refit  # noqa: E402
from planner.tune.loop import Budget, TuneRequest, header, layout_key, layout_label, search, tune  # noqa: E402
from planner.tune.run_executor import RunExecutor  # noqa: E402

MODEL = ModelSpec(
    name="tune-gpt",
    num_layers=4,
    hidden_size=256,
    num_heads=8,
    vocab_size=2048,
    max_seq_len=128,
    dropout=False,
    source="a small GPT for the tune benchmark",
)
PROFILED = {
    "name": "profile-gpt",
    "num_layers": 4,
    "hidden_size": 384,
    "num_heads": 6,
    "vocab_size": 2048,
    "max_seq_len": 128,
    "dropout": False,
    "source": "the model whose layers the profile times (not the tuned one: compute is then analytic)",
}
SOLVE = {"global_batch": 16, "seq_len": 128, "precision": "fp32", "fixes": ["recompute=none", "sp=false", "mbs=2"]}


def _profile(ranks: int, directory: Path) -> Path:
    """`plan profile` of this machine with another small GPT (so that the tuned model's compute
    is costed from the measured GEMM curve, through the constants being tuned)."""
    import json

    spec, out = directory / "profiled.json", directory / "profile.json"
    spec.write_text(json.dumps(PROFILED))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "planner.cli.main",
            "profile",
            "--model",
            str(spec),
            "--nproc-per-node",
            str(ranks),
            "--micro-batch-sizes",
            "2,4,8",
            "--seq-len",
            "128",
            "--quick",
            "-o",
            str(out),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return out


def _wrong_prior(profile: Path):
    """The profile with the DGX A100 preset's constants (and interval) for PyTorch eager."""
    cluster, dgx = api.load_cluster(str(profile)), api.load_cluster("dgx-a100-80gb")
    return with_constants(
        cluster,
        "generic",
        constants_of(dgx, "generic"),
        provenance="the dgx-a100-80gb preset's (wrong on purpose)",
        uncertainty=dgx.for_target("generic").uncertainty,
    )


def _error(cluster, rows) -> float:
    """Mean |predicted / measured - 1| over (model, job, plan, measured) rows, percent."""
    return 100 * statistics.mean(abs(predict(m, cluster, j, p).step_time_s / t - 1) for m, j, p, t in rows)


def _repeat(pairs) -> float:
    """Mean |a / b - 1| over pairs of measurements of one layout, percent."""
    return 100 * statistics.mean(abs(a / b - 1) for a, b in pairs)


def _sweep(space, prior, ranks: int, steps: int, directory: Path) -> dict:
    """Every layout of the space measured as a trial is (the same executor, steps and warm-up),
    in one launch (planner/executor/batch.py: workers start once, not once per layout, which on
    this loaded 2-core machine costs minutes a launch). {key: (candidate, Measurement)}."""
    import json

    from planner.tune.executors import Measurement
    from planner.tune.journal import Ran

    cases, reports = directory / "cases.json", directory / "reports.json"
    cases.write_text(
        json.dumps(
            [
                {
                    "model": MODEL.model_dump(mode="json"),
                    "job": c.job.model_dump(mode="json"),
                    "plan": c.plan.model_dump(mode="json"),
                    "cluster": prior.model_dump(mode="json"),
                    "steps": steps,
                    "warmup": 2,
                }
                for c in space
            ]
        )
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "planner.executor.batch",
            str(cases),
            str(reports),
            "--nproc-per-node",
            str(ranks),
            "--timeout",
            "600",
        ],
        check=True,
    )
    out = {}
    for i, (c, r) in enumerate(zip(space, json.loads(reports.read_text()))):
        report = RunReport.model_validate(r)
        ok = report.verification.passed
        m = Measurement(
            "ok" if ok else "failed",
            step_time_s=report.time.measured_step_time_s,
            ran=Ran(model=report.model, job=report.job, plan=report.plan, num_gpus=ranks),
        )
        out[c.key] = (c, m)
        print(
            f"  sweep {i + 1}/{len(space)} {layout_label(c.plan):40} {m.status:6} {m.step_time_s:.4f} s "
            f"(prior predicted {c.estimate.step_time_s:.4f} s)",
            flush=True,
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", help="a `plan profile` of this machine on --ranks ranks [default: made now]")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--trials", type=int, default=None, help="the tune's budget [default: a third of the layouts]")
    parser.add_argument("--steps", type=int, default=4, help="steps per trial, 2 of them warm-up")
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="tune-bench-"))
    t0 = time.monotonic()
    profile = Path(args.profile) if args.profile else _profile(args.ranks, directory)
    print(
        f"profile: {profile}{' (made now, %.0f s)' % (time.monotonic() - t0) if not args.profile else ''}", flush=True
    )
    prior = _wrong_prior(profile)
    request = TuneRequest(MODEL, prior, args.ranks, dict(SOLVE))
    space, complete = search(request, prior, 1000)
    assert complete, "the benchmark's space must be listed whole"
    n = len(space)
    budget = Budget(trials=args.trials or n // 3)
    executor = RunExecutor(steps=args.steps, warmup=2, timeout_s=600)
    print(
        f"space: {n} layouts; tune budget {budget.trials} trials; prior constants {constants_of(prior, 'generic')}",
        flush=True,
    )

    t0 = time.monotonic()
    journal_path = directory / "tune.jsonl"  # `plan tune --resume` it to see the tune's table, write its profile
    journal.start(journal_path, header(request, executor))
    print(f"journal: {journal_path}", flush=True)
    result = tune(
        request,
        executor,
        budget,
        journal_path,
        say=lambda line: print(f"  tune {line}", flush=True),
        trial_hook=lambda r, f: print(f"    -> {r.status} {r.step_time_s or 0:.4f} s", flush=True),
    )
    tune_s = time.monotonic() - t0
    winner = result.best
    print(
        f"tuned: {winner.label if winner else None}; stop: {result.stop}; refit constants "
        f"{tuple(round(x, 4) for x in result.refit.constants)}; {tune_s:.0f} s",
        flush=True,
    )

    t0 = time.monotonic()
    measured = _sweep(space, prior, args.ranks, args.steps, directory)
    sweep_s = time.monotonic() - t0
    ok = {k: (c, m) for k, (c, m) in measured.items() if m.status == "ok"}
    best_key = min(ok, key=lambda k: ok[k][1].step_time_s)
    best = ok[best_key][1].step_time_s
    tuned_time = (
        ok[layout_key(winner.plan)][1].step_time_s if winner and layout_key(winner.plan) in ok else float("inf")
    )
    regret = 100 * (tuned_time / best - 1)
    tried = {r.key for r in result.records}
    held_out = [(m.ran.model, m.ran.job, m.ran.plan, m.step_time_s) for k, (c, m) in ok.items() if k not in tried]
    before, after = _error(prior, held_out), _error(result.refit.cluster, held_out)
    print(
        f"sweep best: {layout_label(ok[best_key][0].plan)} {best:.4f} s; tuned answer in the sweep: {tuned_time:.4f} s"
    )
    print(
        f"prediction error on the {len(held_out)} layouts the tune did not measure: {before:.1f} % with the prior, "
        f"{after:.1f} % refit"
    )
    every = [Observation(m.ran.model, m.ran.job, m.ran.plan, m.step_time_s, 0.0) for _, m in ok.values()]
    floor = refit(prior, "generic", every, [], prior.device.memory_gib, start=result.refit.constants).cluster
    print(
        f"the model's own floor: its constants refit to all {len(every)} layouts of the sweep (in sample, what no "
        f"choice of trials could beat) miss them by {_error(floor, [(o.model, o.job, o.plan, o.step_time_s) for o in every]):.1f} %"
    )
    twice = [(r.step_time_s, ok[r.key][1].step_time_s) for r in result.records if r.status == "ok" and r.key in ok]
    if twice:
        repeat = _repeat(twice)
        print(
            f"repeatability: the {len(twice)} layouts measured twice (in the tune and again in the sweep) differ by "
            f"{repeat:.1f} % on average (mean |tune / sweep - 1|); a model that knew each layout's mean exactly "
            f"would be about {repeat / math.sqrt(2):.1f} % off single measurements (1/sqrt 2 of it, for "
            f"independent errors of equal spread)"
        )
    per_trial = statistics.mean(r.wall_s for r in result.records)
    print(
        f"wall time: tune {tune_s:.0f} s ({len(result.records)} launches, {per_trial:.0f} s a trial); sweep {sweep_s:.0f} s in one "
        f"launch; as {n} trials like the tune's it would take about {n * per_trial:.0f} s ({tune_s / (n * per_trial):.2f}x)"
    )
    print(f"tune: regret {regret:.1f} % with {len(result.records)} of {n} trials, refit error {after:.1f} %")


if __name__ == "__main__":
    main()
