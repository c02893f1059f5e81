"""`plan tune`: measure a few layouts on the machines at hand, refit the cost model, re-solve, stop when proven."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Optional

import click

from planner import api
from planner.cli import render
from planner.cli.common import api_keywords, check_outputs, require_names, require_torch, target_options
from planner.cli.types import MEMORY_GIB, SECONDS, SEQUENCES, TOKENS, Real, Whole
from planner.datafile import write_atomic
from planner.distributed.launch import signals_interrupt
from planner.errors import Interrupted
from planner.errors import PlannerError, UsageError
from planner.inputs import cluster_size
from planner.tune import journal
from planner.tune.loop import Budget, TuneRequest, header, layout_label, request_of, tune as run_tune
from planner.tune.output import tuned_profile, winner_document
from planner.tune.run_executor import RunExecutor


SCALE = Whole(1, 10**7)  # --scale-*: `plan run` checks them against the model as it does its own


@click.command()
@target_options
@click.option("--global-batch", type=SEQUENCES, help="Sequences per optimizer step (fixes the batch).")
@click.option(
    "--micro-batch-size", type=SEQUENCES, help="Sequences per micro-batch per replica, when the batch is not fixed."
)
@click.option("--micro-batches", type=SEQUENCES, help="Micro-batches per step with --micro-batch-size.")
@click.option("--fix", "fixes", multiple=True, help="Pin a choice, as `plan solve --fix` (narrows what is tuned).")
@click.option(
    "--max-memory-gib", type=MEMORY_GIB, help="Memory limit per GPU for the search [default: 95% of the device's]."
)
@click.option("--allow-cross-node-tp", is_flag=True, help="Let tensor parallelism span nodes.")
@click.option("--fp8", is_flag=True, help="Let the search run GEMMs in FP8.")
@click.option(
    "--trials",
    type=Whole(1, 1000),
    default=8,
    show_default=True,
    help="Most trials to run (a resumed journal's count).",
)
@click.option("--time-budget", type=SECONDS, help="Seconds: start no trial after this much wall time.")
@click.option(
    "--tolerance",
    type=Real(0, 0.5, low_allowed=True),
    default=0.02,
    show_default=True,
    help="Stop when no untried layout's interval beats the best measured by more than this fraction.",
)
@click.option(
    "--journal",
    "journal_path",
    type=click.Path(dir_okay=False),
    help="Journal to write (JSON lines) [default: plan-tune-TIME.jsonl].",
)
@click.option(
    "--resume",
    "resume_path",
    type=click.Path(dir_okay=False),
    help="Continue this journal (its inputs; finished trials are not run again).",
)
@click.option(
    "--steps", type=Whole(2, 1000), default=4, show_default=True, help="Training steps per trial, warm-up included."
)
@click.option(
    "--warmup", type=Whole(1, 999), default=2, show_default=True, help="First steps of a trial left out of its time."
)
@click.option(
    "--trial-timeout",
    type=SECONDS,
    default=600.0,
    show_default=True,
    help="Seconds a trial may take before it is stopped.",
)
@click.option(
    "--trial-memory-gib",
    type=MEMORY_GIB,
    help="Out of memory when a rank's measured peak exceeds this [default: --max-memory-gib or none].",
)
@click.option(
    "--launcher",
    type=click.Choice(["auto", "local", "srun"]),
    default="auto",
    show_default=True,
    help="How a trial starts its ranks: local processes, or srun (auto: srun inside a Slurm allocation).",
)
@click.option("--scale-layers", type=SCALE, help="Trials run this many layers (`plan run --scale-layers`).")
@click.option("--scale-hidden", type=SCALE, help="Trials run this hidden size.")
@click.option("--scale-heads", type=SCALE, help="Trials run this many heads.")
@click.option("--scale-vocab", type=SCALE, help="Trials run this vocabulary.")
@click.option("--scale-seq-len", type=TOKENS, help="Trials run this sequence length.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False),
    help="Write the tuned profile (a cluster JSON every command reads).",
)
@click.option(
    "--plan-out", type=click.Path(dir_okay=False), help="Write the winner as a plan file (`plan export`, `plan run`)."
)
@signals_interrupt()  # SIGTERM / SIGHUP: the running trial stopped, the journal whole, one line, exit 143 / 129
def tune(as_json: bool, output: Optional[str], plan_out: Optional[str], **options) -> None:
    """Measure a few layouts with `plan run` on this machine's ranks (or under srun), refit
    the cost model's constants to them, and stop when no untried layout can beat the best
    measured; write the tuned profile (-o) and the winner (--plan-out)."""
    o = options
    journal_path, resume_path = o["journal_path"], o["resume_path"]
    if journal_path is not None and not journal_path.strip():
        raise UsageError("--journal is empty; give a file name (or leave it out for plan-tune-TIME.jsonl)")
    # a journal in no writable place: refused now
    check_outputs({"-o": output, "--plan-out": plan_out, "--journal": journal_path})
    if resume_path:  # the journal resumed is read, and appended to: no output may replace it (refused now)
        check_outputs({"-o": output, "--plan-out": plan_out}, read=(resume_path,))
    if journal_path is not None and not resume_path:
        journal.check_new(Path(journal_path))  # and one that exists, before the search, not after it
    if o["warmup"] >= o["steps"]:
        raise UsageError(
            f"--warmup {o['warmup']} leaves no timed step of --steps {o['steps']}; give fewer warm-up steps"
        )
    scale = {
        k: o[f"scale_{k}"] for k in ("layers", "hidden", "heads", "vocab", "seq_len") if o[f"scale_{k}"] is not None
    }
    executor = RunExecutor(
        steps=o["steps"],
        warmup=o["warmup"],
        timeout_s=o["trial_timeout"],
        memory_limit_gib=o["trial_memory_gib"] or o["max_memory_gib"],
        scale=scale,
        launcher=o["launcher"],
    )
    request, path, done = _resumed(o) if resume_path else _new(o)
    if scale:  # what no layout changes (heads that do not split the width), refused before a trial is launched
        from planner.executor.prepare import Rehearsal, scale_model

        scale_model(request.model, Rehearsal(**scale), 1, [])
    require_torch("tune")
    if not resume_path:
        journal.start(path, header(request, executor))
    result = _run(
        request, executor, Budget(trials=o["trials"], time_s=o["time_budget"], tolerance=o["tolerance"]), path, done
    )
    _report(result, path, as_json, output, plan_out)


def _resumed(o: dict) -> tuple[TuneRequest, Path, list]:
    """A resumed tune: the journal's request (its header's search, checked as a new tune's is,
    before any trial or repair) and its finished trials."""
    if o["model_name"] or o["cluster_name"]:
        raise UsageError(
            "--resume continues the journal's own inputs; drop --model and --cluster (or start a new tune)"
        )
    path = Path(o["resume_path"])

    def runnable(head) -> None:
        request = request_of(head)
        try:
            api.solve(request.model, request.cluster, gpus=request.gpus, top_k=0, **request.search_keywords())
        except (ValueError, UsageError) as exc:  # a value of the right kind that names nothing (a target 'jax'), a
            # count out of range (gpus -4); the kinds are journal.py's. Said of the journal: the user gave only --resume
            raise UsageError(f"the journal {path} has a damaged header (its search options): {exc}") from None

    head, done = journal.read(path, render.note, check=runnable)
    return request_of(head), path, done


def _new(o: dict) -> tuple[TuneRequest, Path, list]:
    """A new tune: its request (the search's keywords, planner/api.py:SolveOptions, as given)
    checked by a search before any trial, and its journal's path."""
    require_names(o["model_name"], o["cluster_name"])
    model, cluster = api.load_model(o["model_name"]), api.load_cluster(o["cluster_name"])
    n = cluster_size(cluster, o["gpus"], o["nodes"], o["cluster_name"])
    searched = api.SolveOptions.__optional_keys__ - {"gpus", "nodes"}
    keywords = {k: v for k, v in api_keywords(o).items() if k in searched} | {"fixes": list(o["fixes"])}
    flash = {"flash_attention": keywords["flash_attention"]}
    request = TuneRequest(model, cluster, n, {k: v for k, v in keywords.items() if v not in (None, [], False)} | flash)
    api.solve(
        model, cluster, gpus=n, top_k=0, **request.search_keywords()
    )  # a bad request fails here, before any trial
    return request, Path(o["journal_path"] or time.strftime("plan-tune-%Y%m%d-%H%M%S.jsonl")), []


def _run(request: TuneRequest, executor: RunExecutor, budget: Budget, path: Path, done: list):
    """The tune itself, its progress on stderr (so --json keeps stdout clean); an interrupt said
    with the journal to resume."""
    say = render.note
    say(f"plan tune: journal {path} ({len(done)} trials done)")
    try:
        return run_tune(
            request,
            executor,
            budget,
            path,
            done,
            say=lambda line: say(f"plan tune: {line}"),
            trial_hook=lambda r, fit: say(_trial_line(request, r)),
        )
    except KeyboardInterrupt:
        raise Interrupted(
            f"interrupted by Ctrl-C; the journal {path} holds every finished trial (--resume {path})"
        ) from None
    except Interrupted as exc:  # SIGTERM, SIGHUP (signals_interrupt), the running trial stopped
        raise Interrupted(
            f"{exc}; the journal {path} holds every finished trial (--resume {path})", exc.exit_code - 128
        ) from None


def _trial_line(request: TuneRequest, r) -> str:
    """A finished trial in one line: measured, against the one prediction the table shows for it
    (the prior's, for what ran: a scaled model where --scale-* ran one)."""
    from cost_models.estimate import estimate as predict

    line = f"plan tune: trial {r.index + 1} {layout_label(r.plan)}: {r.status}"
    if r.step_time_s:
        what = r.ran
        model, job, plan = (what.model, what.job, what.plan) if what else (request.model, r.job, r.plan)
        predicted = predict(model, request.cluster, job, plan).step_time_s
        spread = f", {len(r.steps_s)} steps" if r.steps_s else ""
        line += f", measured {r.step_time_s:.4g} s (median{spread}); predicted {predicted:.4g} s before the refit"
    return line + (f" ({r.detail})" if r.detail else "")


def _report(result, path: Path, as_json: bool, output: Optional[str], plan_out: Optional[str]) -> None:
    """The tuned profile (-o) and the winner (--plan-out) written, and the report."""
    profile = tuned_profile(result, time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    winner = winner_document(result, profile)
    measured = result.best is not None  # every trial failed: a failure, and no tuned profile fitted to nothing
    if output and measured:
        write_atomic(output, profile.model_dump_json(indent=2) + "\n")
    if plan_out and winner is not None:
        write_atomic(plan_out, winner.model_dump_json(indent=2) + "\n")
    written = output if measured else None
    if as_json:
        click.echo(_json(result, profile, path, written, plan_out if winner is not None else None))
        for line in render.tune_summary(result):
            print(f"plan tune: {line}", file=sys.stderr)
    else:
        render.tune_report(result, written, plan_out if winner is not None else None)
    if not measured:
        raise PlannerError(
            f"no trial ran to the end, so nothing was written; each one's error is in the journal {path}"
        )


def _json(result, profile, journal_path, output, plan_out) -> str:
    import json
    import math

    from cost_models.fit import NAMES
    from planner.tune.loop import predicted_before_after, verdict

    trials = []
    for r in result.records:
        before, after = predicted_before_after(result, r)
        trials.append(
            {
                **r.model_dump(
                    mode="json",
                    include={
                        "index",
                        "key",
                        "label",
                        "why",
                        "status",
                        "step_time_s",
                        "steps_s",
                        "repeat_of",
                        "peak_memory_gib",
                        "detail",
                        "wall_s",
                    },
                ),
                "predicted_before_s": before,
                "predicted_after_s": after,
                "verdict": verdict(result, r),
            }
        )
    best = result.best
    return json.dumps(
        {
            "stop": result.stop,
            "margin": result.margin,
            "noise": {
                "sigma": result.noise.sigma,
                "level": result.noise.level,
                "source": result.noise.source,
                "repeats": result.noise.repeats,
            },
            "tied": [
                {"label": m.first.label, "index": m.first.index, "median_step_time_s": m.step_time_s}
                for m in result.tied
            ],
            "held_out_error": result.held_out_error,
            "tolerance": result.tolerance,
            "exhaustive_trials": result.exhaustive,
            "exhaustive_counted_whole": result.exhaustive_complete,
            "best": None
            if best is None
            else {
                "index": best.index,
                "label": best.label,
                "step_time_s": result.best_step_time_s,
                "measurements": len(result.measured[0].values),
                "plan": best.plan.model_dump(mode="json"),
            },
            "constants": dict(zip(NAMES, result.refit.constants)),
            "interval_factor_on_slice": math.exp(result.refit.log_halfwidth),
            "trials": trials,
            "journal": str(journal_path),
            "profile": output,
            "plan": plan_out,
        },
        indent=2,
    )
