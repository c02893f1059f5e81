"""Does `plan tune` find the best layout, under noise, with a third of the trials an exhaustive sweep needs?

    python benchmarks/tune.py [--profile profile.json] [--ranks 2] [--trials K] [--steps 6] [--repeats 3]

On this machine's CPU processes (gloo), each rank pinned to its own core (`plan run` pins where
the machine has a core per rank): a small GPT (4 layers, hidden 256, sequence 128, global batch
16, fp32) over a search space of every layout the search lists without sequence parallelism:
dp x tp x pp, schedules, ZeRO 0-3, micro-batch sizes 1-16 (and recompute where memory asks for
it): 30 feasible layouts on 2 ranks, 29 that `plan run` executes. The cluster is a `plan profile` of this machine (made here
unless --profile gives one) whose stack constants are deliberately wrong: the DGX A100 preset's
fitted ones, as if the user had tuned on another machine. Then, in one run:
1. `plan tune` (planner.tune, the real executor: `plan run` of each trial) with a budget of a
   third of the layouts (--trials), repeats included;
2. the exhaustive sweep: every layout of the same space run by the same executor (steps,
   warm-up, timing, pinning), each --repeats times, interleaved (every layout once, then every
   layout again in reverse order, ...), a launch per round (startup paid once a round) with
   the host's own single-core GEMM speed probed between rounds. A layout's truth is
   the median of its measurements' medians.
Printed: the tune's trials and its answer (the best, or a tie within noise), the sweep, the
regret (the truth's time of the tuned answer, for a tie of the best of the tied layouts, over
the truth's best), the repeatability (mean |a / b - 1| between two measurements of one layout
in the sweep, and the noise sigma pooled over all of them), the prediction's error on the
layouts the tune did not measure (against their truth) with the wrong prior and refit, and
the wall time. Its last line is
`tune: regret R % with K of N trials, refit error E %, repeatability P %`.
"""

from __future__ import annotations

import argparse
import math
import os
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
from planner.cli.render import tune_summary  # noqa: E402
from planner.tune.loop import Budget, TuneRequest, header, layout_label, search, tune  # noqa: E402
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
SOLVE = {"global_batch": 16, "seq_len": 128, "precision": "fp32", "fixes": ["sp=false"]}


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


def _median_step(report: RunReport) -> float:
    """The slowest rank's time per step, median over the timed steps."""
    ranks = report.ranks
    return statistics.median(max(r.step_times_s[i] for r in ranks) for i in range(len(ranks[0].step_times_s)))


def _host_speed() -> float:
    """One core's fp32 GEMM rate, FLOP/s, over about a second (planner/executor/duration.py)."""
    from planner.executor.duration import core_gemm_rates

    return max(core_gemm_rates(0.5)[0] for _ in range(2))


def _sweep(space, prior, ranks: int, steps: int, repeats: int, directory: Path) -> dict:
    """Every layout of the space measured `repeats` times as a trial is (the same executor, steps
    and warm-up), interleaved: the space in order, then reversed, then in order ..., a launch
    per round (planner/executor/batch.py: workers start once a round), the host's single-core
    speed probed before each round and after the last (_host_speed). {key: (candidate, [median step of
    each measurement], what ran)} for the layouts whose every measurement passed verification."""
    import json

    from planner.tune.journal import Ran

    rounds = [list(space) if r % 2 == 0 else list(reversed(space)) for r in range(repeats)]
    results: list = []
    speeds = [_host_speed()]
    for r, one in enumerate(rounds):  # a launch per round, the host's own speed probed between them
        cases, reports = directory / f"cases-{r}.json", directory / f"reports-{r}.json"
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
                    for c in one
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
        results += zip(one, json.loads(reports.read_text()))
        speeds.append(_host_speed())
    print(
        "host speed, one core's fp32 GEMM before each round and after the last (GFLOP/s): "
        + ", ".join(f"{x / 1e9:.1f}" for x in speeds)
        + f"; max / min {max(speeds) / min(speeds):.2f} (what the machine itself varied, with no rank running)",
        flush=True,
    )
    times: dict[str, list[float]] = {}
    ran: dict[str, Ran] = {}
    failed: set[str] = set()
    for c, r in results:
        report = RunReport.model_validate(r)
        if not report.verification.passed:
            failed.add(c.key)
            continue
        times.setdefault(c.key, []).append(_median_step(report))
        ran[c.key] = Ran(model=report.model, job=report.job, plan=report.plan, num_gpus=ranks)
    out = {}
    for i, c in enumerate(space):
        if c.key in failed or c.key not in times:
            print(f"  sweep {i + 1}/{len(space)} {layout_label(c.plan):44} failed", flush=True)
            continue
        ts = times[c.key]
        out[c.key] = (c, ts, ran[c.key])
        print(
            f"  sweep {i + 1}/{len(space)} {layout_label(c.plan):44} "
            + " ".join(f"{t:.4f}" for t in ts)
            + f" s -> {statistics.median(ts):.4f} s (prior predicted {c.estimate.step_time_s:.4f} s)",
            flush=True,
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", help="a `plan profile` of this machine on --ranks ranks [default: made now]")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--trials", type=int, default=None, help="the tune's budget [default: a third of the layouts]")
    parser.add_argument("--steps", type=int, default=6, help="steps per trial, 2 of them warm-up")
    parser.add_argument("--repeats", type=int, default=3, help="measurements of each layout in the sweep")
    args = parser.parse_args()
    started = time.monotonic()
    directory = Path(tempfile.mkdtemp(prefix="tune-bench-"))
    cores = len(os.sched_getaffinity(0))
    print(
        f"machine: {cores} usable cores for {args.ranks} ranks ({'pinned, one core or more each' if cores >= args.ranks else 'shared: step times are noisy'})",
        flush=True,
    )
    t0 = time.monotonic()
    profile = Path(args.profile) if args.profile else _profile(args.ranks, directory)
    print(
        f"profile: {profile}{' (made now, %.0f s)' % (time.monotonic() - t0) if not args.profile else ''}", flush=True
    )
    prior = _wrong_prior(profile)
    request = TuneRequest(MODEL, prior, args.ranks, dict(SOLVE))
    listed, complete = search(request, prior, 1000)
    assert complete, "the benchmark's space must be listed whole"
    # `plan run` pipelines with torch.distributed.pipelining, whose 1F1B needs a micro-batch per
    # stage at least: the sweep cannot measure the layouts with fewer (nor could a tune)
    space = [c for c in listed if c.plan.pp == 1 or c.plan.num_micro_batches >= c.plan.pp]
    if len(space) < len(listed):
        print(
            f"space: {len(listed) - len(space)} of {len(listed)} listed layouts left out: 1F1B with fewer micro-batches than stages, which `plan run` cannot execute"
        )
    n = len(space)
    budget = Budget(trials=args.trials or n // 3)
    executor = RunExecutor(steps=args.steps, warmup=2, timeout_s=600)
    print(
        f"space: {n} layouts; tune budget {budget.trials} trials (repeats included); prior constants "
        f"{constants_of(prior, 'generic')}",
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
        trial_hook=lambda r, f: print(
            f"    -> {r.status} {r.step_time_s or 0:.4f} s"
            + (f" (steps {', '.join(f'{x:.4f}' for x in r.steps_s)})" if r.steps_s else ""),
            flush=True,
        ),
    )
    tune_s = time.monotonic() - t0
    for line in tune_summary(result):
        print(f"  {line}", flush=True)
    named = [m.key for m in result.tied] or ([result.best.key] if result.best else [])

    t0 = time.monotonic()
    measured = _sweep(space, prior, args.ranks, args.steps, args.repeats, directory)
    sweep_s = time.monotonic() - t0
    truth = {k: statistics.median(ts) for k, (_, ts, _) in measured.items()}
    best_key = min(truth, key=truth.get)
    best = truth[best_key]
    got = min((truth[k] for k in named if k in truth), default=float("inf"))
    regret = 100 * (got / best - 1)
    pairs = [(ts[0], ts[1]) for _, ts, _ in measured.values() if len(ts) > 1]
    repeat = _repeat(pairs) if pairs else float("nan")
    logs = [[math.log(t) for t in ts] for _, ts, _ in measured.values() if len(ts) > 1]
    dof = sum(len(x) - 1 for x in logs)
    sigma = math.sqrt(sum(sum((v - statistics.mean(x)) ** 2 for v in x) for x in logs) / dof) if dof else float("nan")
    tried = {r.key for r in result.records}
    held_out = [(ran.model, ran.job, ran.plan, truth[k]) for k, (_, _, ran) in measured.items() if k not in tried]
    before, after = _error(prior, held_out), _error(result.refit.cluster, held_out)
    answer = " / ".join(layout_label(measured[k][0].plan) for k in named if k in measured)
    print(f"sweep best: {layout_label(measured[best_key][0].plan)} {best:.4f} s")
    print(f"tuned answer{' (a tie)' if len(named) > 1 else ''}: {answer}; its truth {got:.4f} s, regret {regret:.1f} %")
    print(
        f"repeatability: two measurements of one layout differ by {repeat:.1f} % on average (mean |a / b - 1| over "
        f"{len(pairs)} layouts); sigma pooled over the sweep's {args.repeats} measurements each: "
        f"{100 * math.expm1(sigma):.1f} %; the tune estimated {100 * math.expm1(result.noise.sigma):.1f} % "
        f"({result.noise.source})"
    )
    print(
        f"prediction error on the {len(held_out)} layouts the tune did not measure (against their truth): "
        f"{before:.1f} % with the prior, {after:.1f} % refit"
    )
    per_trial = statistics.mean(r.wall_s for r in result.records)
    print(
        f"wall time: tune {tune_s:.0f} s ({len(result.records)} launches, {per_trial:.0f} s a trial); sweep "
        f"{sweep_s:.0f} s in {args.repeats} launches ({len(space) * args.repeats} measurements); whole benchmark "
        f"{time.monotonic() - started:.0f} s"
    )
    print(
        f"tune: regret {regret:.1f} % with {len(result.records)} of {n} trials, refit error {after:.1f} %, "
        f"repeatability {repeat:.1f} %"
    )


if __name__ == "__main__":
    main()
