"""Every rich table the CLI prints. Human output goes to stdout; with --json the commands
print only JSON and never call into here."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Optional

import click
from rich.console import Console
from rich.errors import MarkupError
from rich.markup import escape
from rich.segment import Segment
from rich.table import Table

from cost_models.compute import total_params
from planner.presets import HUB_SOURCE
from planner.units import gib
from planner.specs import ClusterSpec, DType, Estimate, ModelSpec, Plan, PlanDocument, SolveDocument, Target

import os
import sys

if TYPE_CHECKING:  # imported where a bar is made (progress_bar), not at the CLI's start
    from rich.progress import Progress, TaskID

# What never reaches the terminal as it is, from any text the CLI prints (a model's name, a key
# or a value from a spec file, a path): C0 and C1 control characters (ESC starts a terminal
# escape sequence; a newline in an error would start a second "error:" line), the line and
# paragraph separators (str.splitlines splits there too), the bidirectional overrides and
# isolates (they reorder what is shown), and lone surrogates (an undecodable byte of a name,
# which no encoding can write). Each is shown as Python writes it in a literal: \x1b, \n, \udc80.
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_UNSAFE_IN_LINES = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def printable(text: str, lines: bool = False) -> str:
    """`text` with the characters above escaped; with `lines`, newlines and tabs are kept (text
    laid out in lines by rich, whose own line breaks are newlines)."""
    return (_UNSAFE_IN_LINES if lines else _UNSAFE).sub(lambda m: repr(m[0])[1:-1], text)


def token_count(n: float) -> str:
    """Tokens in the unit --tokens takes: 15T, 300B, 2P (three significant digits)."""
    unit, suffix = next(((u, s) for u, s in ((1e15, "P"), (1e12, "T"), (1e9, "B")) if n >= u), (1e6, "M"))
    text = f"{n / unit:.3g}"
    return (f"{n / unit:,.0f}" if "e" in text else text) + suffix


def note(text: str) -> None:
    """One line on stderr (a message beside the output: a file written, what a what-if changed)."""
    click.echo(printable(text), err=True)


class SafeConsole(Console):
    """Every rich console of the CLI. Whatever it renders (a table cell, a title, markup), the
    text reaches the output with printable()'s characters escaped and with the characters the
    output's encoding cannot write (PYTHONIOENCODING=ascii) as \\x.. escapes: rich's own styles
    are segments' styles, written apart from their text, so they are kept."""

    def render_str(self, text: str, **kwargs):
        """A string as rich markup where it is markup; text that is not (a name such as '[/x]') as
        it is, rather than a MarkupError."""
        try:
            return super().render_str(text, **kwargs)
        except MarkupError:
            return super().render_str(text, **{**kwargs, "markup": False})

    def render(self, renderable, options=None):
        encoding = self.encoding
        for segment in super().render(renderable, options):
            text = segment.text
            if segment.control or (text.isascii() and text.isprintable()):
                yield segment
                continue
            text = printable(text, lines=True)
            if not encoding.startswith("utf"):
                text = text.encode(encoding, "backslashreplace").decode(encoding)
            yield Segment(text, segment.style, segment.control)


# Wide enough for the tables when piped into a file or a CI log (rich falls back to 80), unless
# COLUMNS says otherwise (rich reads it when no width is given). With stdout closed (`plan ...
# >&-`) sys.stdout is None: the guard in planner/cli/main.py reports the first write.
_terminal = sys.stdout is not None and sys.stdout.isatty()
console = SafeConsole(highlight=False, width=None if _terminal or os.environ.get("COLUMNS") else 160)


def _narrow() -> bool:
    """A terminal too narrow for the tables' long headers (the memory table's need 105 columns)."""
    return console.width < 105


def _fmt_time(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} us"


def _human(n: float) -> str:
    for unit, div in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.2f}{unit}"
    return f"{n:.0f}"


def presets(models: list[ModelSpec], clusters: list[ClusterSpec]) -> None:
    # Names never wrap (rich would cut them to "llama…" in 80 columns); the tables are kept
    # narrow enough for that: the MLP's activation shares a cell with its width, and the link
    # descriptions, which wrap well, have a table of their own.
    t = Table(title="Model presets", pad_edge=False)
    for col in ("name", "params", "layers", "hidden", "heads (kv)", "mlp", "vocab", "seq"):
        t.add_column(col, justify="left" if col in ("name", "mlp") else "right", no_wrap=col == "name")
    for m in models:
        t.add_row(
            m.name,
            _human(total_params(m)),
            str(m.num_layers),
            str(m.hidden_size),
            f"{m.num_heads} ({'MLA' if m.mla else m.kv_heads})",
            f"{m.activation.value} {m.ffn}",
            str(m.vocab_size),
            str(m.max_seq_len),
        )
    console.print(t)
    c = Table(title="Cluster presets")
    for col in ("name", "device", "bf16 TFLOP/s", "memory GiB", "GPUs/node"):
        c.add_column(col, no_wrap=col in ("name", "device"))
    links = Table(title="Cluster links")
    for col in ("name", "intra-node", "inter-node"):
        links.add_column(col, no_wrap=col == "name")
    for cl in clusters:
        c.add_row(
            cl.name,
            cl.device.name,
            f"{cl.device.peak_tflops.get(DType.bf16, 0):g}",
            gib(cl.device.memory_gib),
            str(cl.gpus_per_node),
        )
        links.add_row(cl.name, cl.intra_node.name, cl.inter_node.name)
    console.print(c)
    console.print(links)


def plan_summary(plan: Plan) -> str:
    parts = (
        [f"dp={plan.dp}"]
        + ([f"cp={plan.cp}"] if plan.cp > 1 else [])
        + [f"tp={plan.tp}", f"pp={plan.pp}"]
        + ([f"ep={plan.ep}"] if plan.ep > 1 else [])
    )
    if plan.vpp > 1:
        parts.append(f"vpp={plan.vpp}")
    parts += [
        f"mbs={plan.micro_batch_size}",
        f"micro-batches={plan.num_micro_batches}"
        + (f" ({plan.num_micro_batches / plan.pp:g} x pp)" if plan.pp > 1 else ""),
        f"schedule={plan.schedule.value}",
        f"recompute={plan.recompute.value if plan.stage_recompute is None else _recompute_mix(plan)}"
        + ("+norm-act" if plan.recompute_norm_act else ""),
        f"zero={plan.zero_stage}"
        + (f" (shard {plan.dp_shard} x {plan.dp // plan.dp_shard} replicas)" if plan.dp_shard else ""),
    ]
    if plan.sequence_parallel:
        parts.append("sp")
    if plan.tp_comm_overlap:
        parts.append("tp-overlap")
    if plan.fp8:
        parts.append("fp8")
    return " ".join(parts)


def _recompute_mix(plan: Plan) -> str:
    """Partial recompute in a few characters: layers under none/selective/full, summed."""
    sr = plan.stage_recompute
    assert sr is not None  # called where the plan has one (plan_summary)
    return f"mixed({sum(r.none for r in sr)} none/{sum(r.selective for r in sr)} sel/{sum(r.full for r in sr)} full)"


def time_table(est: Estimate) -> Table:
    title = f"Step time {_fmt_time(est.step_time_s)}"
    if est.step_time_interval_s:
        lo, hi = est.step_time_interval_s
        assert est.interval_coverage is not None  # set with the interval (cost_models/estimate.py:evaluate)
        title += f" ({_fmt_time(lo)} - {_fmt_time(hi)}, {100 * est.interval_coverage:.0f}% interval)"
    caption = f"bottleneck: pipeline rank {est.bottleneck_pipeline_rank}"
    if est.interval_widened:  # outside the calibrated region: say which widening applied
        caption += "\ninterval widened: " + "; ".join(est.interval_widened)
    t = Table(title=title, caption=caption)
    t.add_column("component")
    t.add_column("time", justify="right")
    t.add_column("share", justify="right")
    spread = est.time_uncertainty_s.model_dump() if est.time_uncertainty_s else None
    if spread:
        t.add_column("+/-", justify="right")
    for name, value in est.time_breakdown_s.model_dump().items():
        row = [name.replace("_", " "), _fmt_time(value), f"{100 * value / est.step_time_s:.1f}%"]
        t.add_row(*row, *([_fmt_time(spread[name])] if spread else []))
    return t


def throughput_table(est: Estimate) -> Table:
    t = Table(title="Throughput")
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_row("tokens/s (cluster)", f"{est.tokens_per_s:,.0f}")
    t.add_row("model TFLOP/s per GPU", f"{est.model_tflops_per_gpu:.1f}")
    t.add_row("hardware TFLOP/s per GPU", f"{est.hardware_tflops_per_gpu:.1f}")
    t.add_row("MFU", f"{100 * est.mfu:.1f}%")
    return t


def memory_table(est: Estimate) -> Table:
    verdict = "fits" if est.fits else "DOES NOT FIT"
    t = Table(
        title=f"Memory per GPU, GiB (peak {est.peak_memory_gib:.1f} of {gib(est.memory_capacity_gib)}: {verdict})"
    )
    # Values of at most five characters, and in a narrow terminal short headers, keep the nine
    # columns within 80 (rich would cut the long headers to "weigh…").
    cols = (
        ("pp rank", "layers", "weights", "grads", "optim", "activ", "temp", "overhead", "total")
        if _narrow()
        else (
            "pipeline rank",
            "layers",
            "weights",
            "gradients",
            "optimizer",
            "activations",
            "temporary",
            "overhead",
            "total",
        )
    )
    for col in cols:
        t.add_column(col, justify="right")
    for sm in est.memory_gib_per_pipeline_rank:
        style = "bold red" if sm.total > est.memory_capacity_gib else None
        t.add_row(
            str(sm.pipeline_rank),
            str(sm.layers),
            *(
                _gib(x)
                for x in (
                    sm.weights,
                    sm.gradients,
                    sm.optimizer_states,
                    sm.activations,
                    sm.temporary,
                    sm.overhead,
                    sm.total,
                )
            ),
            style=style,
        )
    return t


def _gib(x: float) -> str:
    """Four significant figures or so in at most five characters: 16.12, 140.4, 1234."""
    return f"{x:.2f}" if x < 99.995 else f"{x:.1f}" if x < 999.95 else f"{x:.0f}"


def stage_layout(plan: Plan) -> str:
    """Layers per stage, and recompute per stage when it varies."""
    if plan.layers_per_stage is None:
        return ""
    text = "layers per stage: " + ",".join(map(str, plan.layers_per_stage))
    if plan.stage_recompute is not None:
        text += "; recompute per stage (none/selective/full): " + " ".join(
            f"{r.none}/{r.selective}/{r.full}" for r in plan.stage_recompute
        )
    return text


def layout_details(plans: list[Plan], num_layers: int) -> list[str]:
    """What plan_summary leaves out (mesh order, layer split, recompute per stage), for each
    plan whose summary another plan shares, and only the fields that tell those plans apart;
    '' for the others. Splits are the effective ones (an even split shown as its counts)."""

    def fields(plan: Plan) -> dict[str, str]:
        mix = plan.stage_recompute  # without it every layer has the one mode the summary shows
        return {
            "mesh": ",".join(a.value for a in plan.mesh_order),
            "split": ",".join(map(str, plan.stage_layers(num_layers))),
            "recompute per stage": " ".join(f"{r.none}/{r.selective}/{r.full}" for r in mix) if mix else "",
        }

    summaries = [plan_summary(p) for p in plans]
    details = []
    for plan, summary in zip(plans, summaries):
        twins = [fields(p) for p, s in zip(plans, summaries) if s == summary]
        mine = fields(plan)
        differ = [k for k in mine if mine[k] and any(t[k] != mine[k] for t in twins)]
        details.append(" ".join(f"{k}={mine[k]}" for k in differ))
    return details


def _with_details(summary: str, details: str) -> str:
    return f"{summary} {details}" if details else summary


def solve_report(doc: SolveDocument, limit_gib: float) -> None:
    job, est = doc.job, doc.estimate
    _header(
        doc.model,
        f"on {doc.num_gpus} x {escape(doc.cluster.device.name)} ({escape(_cluster_label(doc.cluster))}); "
        f"sequence {job.seq_len}, {job.precision.value}, {job.optimizer.value}, memory limit {gib(limit_gib)} GiB",
    )
    details = layout_details([doc.plan] + [a.plan for a in doc.alternatives], doc.model.num_layers)
    console.print(
        f"[bold]recommended[/bold] {escape(_runs_on(doc))}: {_with_details(plan_summary(doc.plan), details[0])}; "
        f"global batch {job.global_batch_size}"
    )
    if doc.tie_rule is not None:
        faster = doc.tie_rule.faster_alternatives
        console.print(
            f"{_numbered(faster)} predicted faster, but {'their intervals overlap' if len(faster) > 1 else 'its interval overlaps'} "
            f"this plan's and this plan's worst case is lower: {doc.tie_rule.rule}"
        )
    if stage_layout(doc.plan):
        console.print(stage_layout(doc.plan))
    console.print(time_table(est))
    console.print(throughput_table(est))
    console.print(memory_table(est))
    ex = doc.explanation
    console.print(f"[bold]memory bottleneck[/bold]: {ex.memory_bottleneck}")
    console.print(f"[bold]time bottleneck[/bold]: {ex.compute_bottleneck}")
    comm = Table(title="Communication of the recommended plan")
    for col in ("dimension", "degree", "link", "bus GB/s", "GiB per GPU per step"):
        comm.add_column(col, justify="right" if col not in ("dimension", "link") else "left")
    for v in ex.communication:
        comm.add_row(
            v.axis.value, str(v.degree), escape(v.link), f"{v.bandwidth_gbps:.0f}", f"{v.gib_per_gpu_per_step:.2f}"
        )
    console.print(comm)
    if doc.alternatives:
        console.print(_alternatives_table(doc, details))
        tied = [
            i
            for i, a in enumerate(doc.alternatives, start=1)
            if est.step_time_interval_s
            and a.estimate.step_time_interval_s
            and a.estimate.step_time_interval_s[0] <= est.step_time_interval_s[1]
        ]
        if tied:
            console.print(
                f"{_numbered(tied, 'lies', 'lie')} within the recommended plan's interval: the prediction cannot "
                "tell them apart; measure them (`plan run`) before committing to one"
            )
    if len(doc.stacks) > 1:  # one stack (a profile tuned for one): its best is the recommendation
        console.print(_stacks_table(doc))
    s = doc.search
    infeasible = ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in s.infeasible.items()) or "none"
    skipped = ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in s.skipped.items()) or "none"
    over = f" over {_searched(doc)}" if doc.stacks else ""
    console.print(
        f"searched {s.candidates_considered:,} candidate layouts{over}; about 10^{s.layouts_represented_log10:.0f} with every layer "
        f"split and per-stage recompute; infeasible: {infeasible}; skipped: {skipped}; pruned by bound: {s.pruned_by_bound:,}; "
        f"{s.ilps_solved} ILPs over {s.ilp_candidates} candidates ({s.solver}) in {s.solve_time_s:.2f} s; "
        + (
            "proven optimal"
            if s.optimal
            else f"[bold red]not proven optimal (time limit): {_gap(s.optimality_gap)}[/bold red]"
        )
    )


def _gap(gap: float) -> str:
    """How far from the optimum a plan the time limit left unproven may be."""
    if gap >= 1:  # a lower bound of 0: a search the limit cut before it bounded its layouts
        return "no bound on how far from the optimum (a search ran out of time before bounding its layouts; give more time)"
    return f"within {100 * gap:.2g}% of the optimum"


def _runs_on(doc: SolveDocument) -> str:
    """Which stack runs the recommendation, in parentheses after 'recommended'."""
    target, tuned = doc.job.target, " tuned" if doc.cluster.tuned_stacks else ""
    if target == Target.generic:
        if doc.stacks:  # searched without --target on a profile tuned for generic (stacks.py:default_targets)
            return (
                "(generic, a stack the profile was tuned for: the PyTorch-eager optimum, which no `plan export` "
                "stack runs as is)"
            )
        return (
            "(generic: the PyTorch-eager optimum, which no `plan export` stack runs as is; without --target, "
            "`plan solve` recommends the best plan a stack runs)"
        )
    searched = sum(s.search is not None for s in doc.stacks)
    best_of = (
        ""
        if len(doc.stacks) < 2
        else (
            f", the best of the {searched}{tuned} stacks searched"
            if searched == len(doc.stacks)
            else f", the best of the {searched} of {len(doc.stacks)}{tuned} stacks searched"
        )
    )
    return f"(for {target.value}{best_of}: `plan export PLAN --to {target.value}`)"


def _searched(doc: SolveDocument) -> str:
    """'the 4 stacks', '2 of the 4 stacks, the others unsearched (see the table)'; on a tuned
    profile 'the tuned stack generic', 'the 2 tuned stacks'."""
    searched, n = sum(s.search is not None for s in doc.stacks), len(doc.stacks)
    tuned = " tuned" if doc.cluster.tuned_stacks else ""
    if n == 1:
        return f"the{tuned} stack {doc.stacks[0].target.value}"
    if searched == n:
        return f"the {n}{tuned} stacks"
    return f"{searched} of the {n}{tuned} stacks, the others unsearched (see the table)"


def _numbered(alternatives: list[int], one: str = "is", many: str = "are") -> str:
    """'alternative 2 is', 'alternatives 1 and 2 are', 'alternatives 1, 2 and 3 are'."""
    if len(alternatives) == 1:
        return f"alternative {alternatives[0]} {one}"
    *head, last = map(str, alternatives)
    return f"alternatives {', '.join(head)} and {last} {many}"


def _versus(best: Estimate, e: Estimate) -> str:
    """A step time and how much longer per token than the recommended plan's."""
    return f"{_fmt_time(e.step_time_s)} ({100 * (best.tokens_per_s / e.tokens_per_s - 1):+.1f}%)"


def _alternatives_table(doc: SolveDocument, details: list[str]) -> Table:
    # rich narrows the widest columns first; in a narrow terminal, capping the numbers' columns
    # (they wrap at spaces) leaves the layout about 30 of 80 columns, room for its longest word
    # (schedule=interleaved-1f1b); a longer one (a split of many stages) folds instead of being cut.
    narrow = _narrow()
    alt = Table(title="Alternatives")
    alt.add_column("#", justify="right")
    several = len(doc.stacks) > 1  # one stack (a profile tuned for one): each row's is the recommendation's
    if several:
        alt.add_column("stack")
    alt.add_column("layout", overflow="fold")
    alt.add_column("step time (vs best)", justify="right", max_width=9 if narrow else None)
    alt.add_column("tokens/s", justify="right")
    alt.add_column("MFU", justify="right")
    alt.add_column("peak GiB", justify="right", max_width=6 if narrow else None)
    for i, a in enumerate(doc.alternatives, start=1):
        e = a.estimate
        stack = [(a.target or doc.job.target).value] if several else []
        alt.add_row(
            str(i),
            *stack,
            _with_details(plan_summary(a.plan), details[i]),
            _versus(doc.estimate, e),
            f"{e.tokens_per_s:,.0f}",
            f"{100 * e.mfu:.1f}%",
            f"{e.peak_memory_gib:.1f}",
        )
    return alt


def _stacks_table(doc: SolveDocument) -> Table:
    """Each stack's own recommendation (what `plan solve --target STACK` gives), or why it has none."""
    t = Table(title="Best plan per stack (`plan solve --target STACK`)")
    for col in ("stack", "plan", "step time (vs best)", "tokens/s"):
        t.add_column(
            col,
            justify="right" if col in ("step time (vs best)", "tokens/s") else "left",
            overflow="fold",
            max_width=9 if col == "step time (vs best)" and _narrow() else None,
        )
    for s in doc.stacks:
        if s.alternative is None:
            t.add_row(s.target.value, escape(f"none: {s.reason}"), "-", "-")
            continue
        e = doc.estimate if s.alternative == 0 else doc.alternatives[s.alternative - 1].estimate
        t.add_row(
            s.target.value,
            "recommended" if s.alternative == 0 else f"alternative {s.alternative}",
            _versus(doc.estimate, e),
            f"{e.tokens_per_s:,.0f}",
        )
    return t


POOR_FIT = 0.25  # a collective fit off by more than this at some measured size is flagged


def progress_bar(description: str) -> Progress:
    """A rich progress bar on stderr (stdout stays for results); the time left is the
    caller's estimate, in the description (rich's own extrapolates from the steps done,
    which a first slow step or a long last phase misleads)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn(f"{description} [progress.description]{{task.description}}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=SafeConsole(stderr=True),
        transient=True,
    )


# Off a terminal: a report a line of its own when this long after the last line (seconds;
# quicker ones are thinned out), and a phase that goes on a line at least every PLAIN_EVERY_S.
PLAIN_STEP_S, PLAIN_EVERY_S = 2.0, 10.0


class ProgressLines:
    """Progress of long work on stderr, as a rich bar on a terminal, else as plain lines: one
    when the phase changes (the message with its numbers left out: 'block b=1 tp=2' is the
    phase of 'block b=2 tp=1'), for the last report, for any report PLAIN_STEP_S after the
    last line, and every PLAIN_EVERY_S while a phase goes on (a heartbeat thread renders the
    last report again, with `left(done, total, message)`, the caller's estimate of the time
    left, recomputed). `say` prints a line either way
    (above the bar on a terminal)."""

    def __init__(self, label: str, terminal: bool, left=None, clock=None, heartbeat: bool = True):
        import threading
        import time

        self.label, self.terminal, self.left, self.clock = label, terminal, left, clock or time.monotonic
        self.start = self.printed_at = self.clock()
        self.bar: Optional[Progress] = None
        self.task: Optional[TaskID] = None
        self.last: Optional[tuple[int, int, str]] = None  # the last report (update's arguments)
        self.printed: Optional[str] = None  # the phase of the last plain line
        self.lock, self.stop = threading.Lock(), threading.Event()
        self.beater = threading.Thread(target=self._beat, name="plan-progress-beat", daemon=True) if heartbeat else None

    def __enter__(self) -> "ProgressLines":
        if self.terminal:
            self.bar = progress_bar(self.label)
            self.bar.__enter__()
            self.task = self.bar.add_task("starting", total=None)
        if self.beater is not None:
            self.beater.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        if self.beater is not None:
            self.beater.join(timeout=2)
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def elapsed(self) -> float:
        return self.clock() - self.start

    def say(self, text: str) -> None:
        line = f"{self.label} {text}"
        if self.bar is not None:
            self.bar.console.print(escape(line), highlight=False, soft_wrap=True)
        else:
            print(line, file=sys.stderr, flush=True)

    def update(self, done: int, total: int, message: str) -> None:
        with self.lock:
            self.last = (done, total, message)
            self._render(fresh=True)

    def _beat(self) -> None:
        while not self.stop.wait(1.0 if self.terminal else PLAIN_EVERY_S / 4):
            self.beat()

    def beat(self) -> None:
        """The last report again, with the time left recomputed (the heartbeat thread's)."""
        with self.lock:
            if self.last is not None:
                self._render(fresh=False)

    def _render(self, fresh: bool) -> None:
        import re

        assert self.last is not None  # rendered after a report (update, beat)
        done, total, message = self.last
        left = self.left(done, total, message) if self.left else ""
        text = f"{message}{f'; {left}' if left else ''}"
        if self.bar is not None:
            assert self.task is not None  # added with the bar (__enter__)
            self.bar.update(self.task, completed=done, total=total or None, description=escape(text))
            return
        now, phase = self.clock(), re.sub(r"\d+", "#", message)
        news = fresh and (phase != self.printed or done >= total or now - self.printed_at >= PLAIN_STEP_S)
        if news or now - self.printed_at >= PLAIN_EVERY_S:
            self.printed, self.printed_at = phase, now
            self.say(f"[{_clock(now - self.start)}] {done}/{total} {text}")


def _clock(seconds: float) -> str:
    minutes, s = divmod(int(seconds), 60)
    return f"{minutes}:{s:02d}"


def duration(seconds: float) -> str:
    """'0.4 s', '45 s', '2.5 min', '7 min', '1 h 20 min': an estimate's precision, no more."""
    if seconds < 10:
        return f"{max(seconds, 0.1):.1f} s"
    if seconds < 90:
        return f"{round(seconds)} s"
    if seconds < 600:
        return f"{round(seconds / 30) / 2:g} min"
    if seconds < 5400:
        return f"{round(seconds / 60)} min"
    hours, minutes = divmod(round(seconds / 60), 60)
    return f"{hours} h {minutes} min"


def profile_report(cluster: ClusterSpec) -> None:
    """A measured profile (or a preset) as tables; poor alpha-beta fits are flagged."""
    dev, m = cluster.device, cluster.measured
    peaks = ", ".join(f"{k.value} {v:.3g} TFLOP/s" for k, v in dev.peak_tflops.items())
    console.print(
        f"[bold]{escape(cluster.name)}[/bold]: {cluster.num_nodes or 'any'} node(s) x {cluster.gpus_per_node} x {escape(dev.name)}"
    )
    console.print(
        f"peak {peaks}; memory {gib(dev.memory_gib)} GiB per rank; copy bandwidth {dev.memory_bandwidth_gbps:.1f} GB/s; "
        f"framework overhead {dev.framework_overhead_gib:.2f} GiB; communication hidden behind compute: "
        f"{100 * cluster.overlap_efficiency:.0f}%"
    )
    if m is not None:
        e = m.environment
        console.print(
            f"measured {escape(e.date)} on {escape(e.hostname)}: torch {escape(e.torch_version)}, {escape(e.backend)}, "
            f"{escape(e.device_type)}, {e.dtype.value}, "
            f"{e.world_size} ranks ({e.nnodes} x {e.nproc_per_node}){', quick' if e.quick else ''}; model {escape(m.model.name)}"
        )
    links = Table(title="Collectives: alpha-beta fits (time = latency + volume / bus bandwidth)")
    for col in ("tier", "collective", "group", "latency us", "bus GB/s", "per call us", "max fit error"):
        links.add_column(col, justify="left" if col in ("tier", "collective") else "right")
    sweeps = {(s.collective, s.group_size, s.inter_node): s for s in (m.collectives if m else [])}
    for tier_name, tier, inter in (("intra-node", cluster.intra_node, False), ("inter-node", cluster.inter_node, True)):
        for f in tier.collectives:
            s = sweeps.get((f.collective, f.group_size, inter))
            err = "-" if s is None else f"{100 * s.max_relative_error:.0f}%"
            style = "bold red" if s is not None and s.max_relative_error > POOR_FIT else None
            per_call = tier.call_overhead(f.collective)
            inherited = f.collective not in (tier.call_overhead_us or {})  # the all-to-all's, the all-gather's
            shown = "-" if per_call is None else f"{per_call:.0f}" + (" (all-gather's)" if inherited else "")
            links.add_row(
                escape(tier_name),
                f.collective.value,
                str(f.group_size or "any"),
                f"{f.latency_us:.1f}",
                f"{f.bandwidth_gbps:.3g}",
                shown,
                err + (" POOR FIT" if style else ""),
                style=style,
            )
    console.print(links)
    if m is None:
        return
    layers = Table(title=f"Per-layer measurements ({escape(m.model.name)}, medians over ranks)")
    for col in ("layer", "mbs", "seq", "tp", "forward", "backward", "saved MiB", "GFLOP fwd", "FLOPs / model"):
        layers.add_column(col, justify="left" if col == "layer" else "right")
    for x in m.layers:
        ratio = f"{x.flops_forward / x.analytic_flops_forward:.3f}" if x.analytic_flops_forward else "-"
        layers.add_row(
            x.kind,
            str(x.micro_batch_size),
            str(x.seq_len),
            str(x.tp),
            _fmt_time(x.forward_s),
            _fmt_time(x.backward_s),
            f"{x.activation_bytes / 2**20:.1f}",
            f"{x.flops_forward / 1e9:.2f}",
            ratio,
        )
    console.print(layers)
    mm = Table(title="GEMM sweep (efficiency = achieved / peak)")
    for col in ("n", "TFLOP/s", "efficiency"):
        mm.add_column(col, justify="right")
    peak = max(dev.peak_tflops.values())
    for p in m.matmul:
        mm.add_row(str(p.n), f"{p.tflops:.4g}", f"{p.tflops / peak:.2f}")
    console.print(mm)


def _cluster_label(cluster: ClusterSpec) -> str:
    """The cluster's name in a report's first line, and the stacks it was tuned for where `plan
    tune` wrote it (ClusterSpec.tuned_stacks): 'dgx-a100-80gb, tuned for generic'."""
    tuned = cluster.tuned_stacks
    return f"{cluster.name}, tuned for {' and '.join(t.value for t in tuned)}" if tuned else cluster.name


def _header(model: ModelSpec, rest: str) -> None:
    """The report's first line; a model from the Hugging Face cache also says which revision."""
    console.print(f"[bold]{escape(model.name)}[/bold] {rest}")  # a directory's name may hold [brackets]
    if model.source and HUB_SOURCE in model.source:
        console.print(f"model: {model.source}", markup=False)


def estimate_report(doc: PlanDocument) -> None:
    job = doc.job
    _header(
        doc.model,
        f"on {doc.num_gpus} x {escape(doc.cluster.device.name)} ({escape(_cluster_label(doc.cluster))}); "
        f"global batch {job.global_batch_size} x {job.seq_len} tokens, {job.precision.value}, {job.optimizer.value}",
    )
    console.print(f"layout: {plan_summary(doc.plan)}")
    console.print(time_table(doc.estimate))
    console.print(throughput_table(doc.estimate))
    console.print(memory_table(doc.estimate))


# ----- plan run


def _bytes(n: float) -> str:
    for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n:.0f} B"


def _pct(x: float) -> str:
    if abs(x) >= 1e6:
        return "n/a"
    return f"{x:+.1f}%" if abs(x) < 10 else f"{x:+.0f}%"


def run_verification_table(v) -> Table:
    """Every step's loss and gradient norm against the reference, with what each step allows
    (the tolerance at step 0, plus the references' measured rounding spread later)."""
    verdict = "[bold green]PASS[/bold green]" if v.passed else "[bold red]FAIL[/bold red]"
    t = Table(title=f"Verification against one process: {verdict}", caption=v.message)
    for col in ("step", "loss", "reference", "rel. diff", "grad norm", "reference", "rel. diff", "allowed"):
        t.add_column(col, justify="right")
    rows = zip(v.losses, v.reference_losses, v.grad_norms, v.reference_grad_norms)
    for i, (loss, ref, norm, ref_norm) in enumerate(rows):
        ok = [x[i] for x in (v.allowed_loss_rel_error, v.allowed_grad_norm_rel_error) if i < len(x)]
        t.add_row(
            str(i),
            f"{loss:.7f}",
            f"{ref:.7f}",
            f"{abs(loss - ref) / abs(ref):.1e}",
            f"{norm:.6f}",
            f"{ref_norm:.6f}",
            f"{abs(norm - ref_norm) / abs(ref_norm):.1e}",
            " / ".join(f"{x:.1e}" for x in ok) or f"{v.tolerance:.0e}",
        )
    return t


def run_time_table(report) -> Table:
    tm = report.time
    t = Table(
        title=f"Step time, predicted ({escape(report.cluster.name)}) against measured (median of {tm.measured_steps} steps, slowest rank)",
        caption=prediction_verdict(tm.predicted_step_time_s, tm.measured_step_time_s),
    )
    for col in ("", "predicted", "measured", "predicted / measured"):
        t.add_column(col, justify="left" if not col else "right")
    t.add_row(
        "step time",
        _fmt_time(tm.predicted_step_time_s),
        _fmt_time(tm.measured_step_time_s),
        _ratio(tm.predicted_step_time_s, tm.measured_step_time_s),
    )
    t.add_row(
        "tokens/s",
        f"{tm.predicted_tokens_per_s:,.0f}",
        f"{tm.measured_tokens_per_s:,.0f}",
        _ratio(tm.predicted_tokens_per_s, tm.measured_tokens_per_s),
    )
    return t


def _ratio(predicted: float, measured: float) -> str:
    return f"{predicted / measured:.2f}x" if measured else "n/a"


def prediction_verdict(predicted_s: float, measured_s: float) -> str:
    """One phrase for both rows: a step predicted at 0.34x is a throughput predicted at 2.9x,
    the same error, which signed percentages (-66 % against +198 %) hide."""
    if not measured_s or not predicted_s:
        return "no measurement"
    r = measured_s / predicted_s
    if abs(r - 1) < 0.005:
        return "the prediction matches the measurement"
    return f"the prediction is {max(r, 1 / r):.2f}x too {'fast' if r > 1 else 'slow'} (steps take {r:.2f}x the predicted time)"


def run_memory_table(report) -> Table:
    """Per pipeline rank, each kind as 'predicted / measured' (the largest of the ranks at that pipeline position)."""
    largest = max(max(s.predicted.total_bytes, s.measured.total_bytes) for s in report.pipeline_ranks)
    unit, div = ("GiB", 2**30) if largest >= 2**30 else ("MiB", 2**20)
    t = Table(title=f"Memory per pipeline rank, {unit}: predicted / measured", caption=report.ranks[0].memory_method)
    for col in ("pipeline rank", "layers", "weights", "gradients", "optimizer", "activations", "total", "error"):
        t.add_column(col, justify="right")
    kinds = ("weights_bytes", "gradients_bytes", "optimizer_states_bytes", "activations_bytes", "total_bytes")
    for s in report.pipeline_ranks:
        cells = [f"{getattr(s.predicted, k) / div:.2f} / {getattr(s.measured, k) / div:.2f}" for k in kinds]
        t.add_row(str(s.pipeline_rank), str(s.layers), *cells, _pct(s.error_pct))
    return t


def run_ranks_table(report) -> Table:
    import statistics

    t = Table(title="Per rank (measured; step time: median over the timed steps)")
    for col in ("rank", "dp", "tp", "pp", "stages", "layers", "step time", "peak memory"):
        t.add_column(col, justify="right")
    for r in report.ranks:
        step = statistics.median(r.step_times_s)
        t.add_row(
            str(r.rank),
            str(r.dp_rank),
            str(r.tp_rank),
            str(r.pp_rank),
            ",".join(map(str, r.virtual_stages)),
            str(r.layers),
            _fmt_time(step),
            _bytes(r.peak_memory_bytes),
        )
    return t


def run_report(report) -> None:
    s, job = report.settings, report.job
    console.print(
        f"[bold]{escape(report.model.name)}[/bold] ({_human(total_params(report.model))} parameters) on {s.world_size} ranks "
        f"({s.backend}, {s.device}, {s.nnodes} node{'s' if s.nnodes > 1 else ''}); global batch {job.global_batch_size} x "
        f"{job.seq_len} tokens, {job.precision.value}; {s.steps} steps ({s.warmup_steps} warm-up), seed {s.seed}"
    )
    console.print(f"layout: {plan_summary(report.plan)}")
    if stage_layout(report.plan):
        console.print(stage_layout(report.plan))
    if s.changes:
        console.print("changed from the plan file: " + "; ".join(s.changes))
    console.print(run_verification_table(report.verification))
    console.print(run_time_table(report))
    console.print(run_memory_table(report))
    console.print(run_ranks_table(report))


def tune_report(result, profile_path, plan_path) -> None:
    """`plan tune`: a row per trial (planner/tune/loop.py), then the answer and how it was proven."""
    from planner.tune.loop import layout_label, predicted_before_after, verdict

    req = result.request
    _header(
        req.model,
        f"tuned on {req.gpus} ranks of {escape(req.cluster.name)}, stack {req.target}; "
        f"{len(result.records)} trials of {'' if result.exhaustive_complete else 'at least '}{result.exhaustive} layouts",
    )
    import math

    t = Table()
    for col in ("#", "layout", "why", "predicted before", "after refit", "measured", "spread", "memory", "verdict"):
        t.add_column(col, justify="left" if col in ("layout", "why", "verdict") else "right")
    for r in result.records:
        before, after = predicted_before_after(result, r)
        measured = _fmt_time(r.step_time_s) if r.step_time_s is not None else "-"
        memory = _bytes(r.peak_memory_gib * 2**30) if r.peak_memory_gib is not None else "-"
        t.add_row(
            str(r.index + 1),
            layout_label(r.plan),
            r.why.split(":")[0] + (f" of #{r.repeat_of + 1}" if r.repeat_of is not None else ""),
            _fmt_time(before),
            _fmt_time(after),
            measured,
            _step_spread(r.steps_s),
            memory,
            verdict(result, r),
        )
    console.print(t)
    from cost_models.fit import NAMES

    console.print(
        "refit constants: "
        + ", ".join(f"{n} {v:.4g}" for n, v in zip(NAMES, result.refit.constants))
        + f"; interval x/ {math.exp(result.refit.log_halfwidth):.3f}",
        markup=False,
    )
    for line in tune_summary(result):
        console.print(line, markup=False)
    for what, path in (("tuned profile", profile_path), ("winner's plan", plan_path)):
        if path:
            note(f"{what} written to {path}")


def _step_spread(steps: list[float]) -> str:
    """The interquartile range of a trial's timed steps relative to their median ('-' with fewer than 3)."""
    if len(steps) < 3:
        return "-"
    import statistics

    q1, _, q3 = statistics.quantiles(steps, n=4)
    return f"{100 * (q3 - q1) / statistics.median(steps):.1f} %"


def tune_summary(result) -> list[str]:
    """The answer (the best, or a tie within noise with the layouts named), the noise it was
    measured under, its margin, and how it ended (also on stderr at the end of a --json run)."""
    import math

    from planner.tune.loop import layout_label

    if result.best is None:
        return [f"no trial ran to the end ({result.stop}); nothing measured to recommend"]
    best = result.measured[0]
    times = f"{len(best.values)} measurement{'s' if len(best.values) > 1 else ''}"
    lines = [
        f"measured best: {layout_label(best.first.plan)}, {_fmt_time(best.step_time_s)} a step "
        f"(median of {times}; trial {best.first.index + 1})"
    ]
    if result.tied:
        others = "; ".join(
            f"{layout_label(m.first.plan)} (+{100 * (m.per_token / best.per_token - 1):.1f} %)" for m in result.tied[1:]
        )
        lines.append(
            f"tied within noise with: {others}; the measurements cannot order them, so choose among them by memory "
            "headroom or simplicity"
        )
    lines.append(f"noise: {result.noise.describe()}; {result.repeats} of {len(result.records)} trials were repeats")
    margin = result.margin or 0.0
    limit = max(result.tolerance, result.noise.level)
    if result.stop in ("proven", "exhausted"):
        lines.append(
            f"proven: no untried layout's interval beats it by more than {100 * max(margin, 0):.1f} % "
            f"(the margin {100 * limit:.1f} %: the tolerance {100 * result.tolerance:.1f} % or the noise, whichever is wider)"
            if result.stop == "proven"
            else "every layout was tried"
        )
    else:
        lines.append(
            f"stopped: the {'trial' if result.stop == 'trials' else 'time'} budget is spent; an untried layout "
            f"could still be up to {100 * max(margin, 0):.1f} % faster"
            + (f" ({layout_label(result.challenger.plan)})" if result.challenger is not None and margin > 0 else "")
        )
    if result.held_out_error is not None:
        lines.append(
            f"refit error on each measured layout left out of the fit: {100 * result.held_out_error:.1f} % "
            f"(one measurement's noise, sigma {100 * math.expm1(result.noise.sigma):.1f} %, is what no model beats)"
        )
    count = f"{result.exhaustive:,}" if result.exhaustive_complete else f"at least {result.exhaustive:,}"
    lines.append(f"an exhaustive sweep would have run {count} trials; this tune ran {len(result.records)}")
    return lines


def _days(d: float) -> str:
    return f"{d:,.1f}" if d < 100 else f"{d:,.0f}"


def _short_layout(plan: Plan) -> str:
    """dp x tp x pp (and ep, cp, vpp where used), mbs, ZeRO, recompute: a size table's cell."""
    parts = [f"dp{plan.dp} tp{plan.tp} pp{plan.pp}"] + [
        f"{k}{v}" for k, v in (("vpp", plan.vpp), ("ep", plan.ep), ("cp", plan.cp)) if v > 1
    ]
    return " ".join(
        parts
        + [f"mbs{plan.micro_batch_size} z{plan.zero_stage}"]
        + ([f"shard{plan.dp_shard}"] if plan.dp_shard else [])
        + [plan.recompute.value]
    )


def size_report(doc) -> None:
    """`plan size`: every point, the front marked, then what the front and the scaling say."""
    m = doc.model
    console.print(
        printable(
            f"{m.name}: {token_count(doc.tokens)} tokens = {doc.steps:,} steps of {doc.global_batch_size:,} x "
            f"{doc.seq_len:,} tokens; {'stack ' + doc.target if doc.target else 'every stack searched'}"
        ),
        markup=False,
    )
    priced = bool(doc.prices)
    t = Table(title=f"Time to train against {'cost' if doc.front_axis == 'cost' else 'GPU-hours'} (* on the front)")
    for col, justify in (
        ("", "left"),
        ("cluster", "left"),
        ("GPUs", "right"),
        ("stack", "left"),
        ("layout", "left"),
        ("step s (interval)", "right"),
        ("days (interval)", "right"),
        ("GPU-hours", "right"),
        *((("cost", "right"),) if priced else ()),
        ("MFU", "right"),
        ("scaling", "right"),
    ):
        t.add_column(col, justify=justify, no_wrap=col in ("cluster", "GPUs"))
    for p in doc.points:
        gpus = f"{p.gpus:,}" + ("" if p.gpus == p.gpus_asked else f" ({p.gpus_asked:,})")
        if not p.feasible:
            t.add_row(
                "",
                escape(p.cluster),
                gpus,
                "",
                escape(f"no plan: {p.reason}"),
                "",
                "",
                "",
                *(("",) if priced else ()),
                "",
                "",
            )
            continue
        lo, hi = p.step_time_interval_s
        dlo, dhi = p.days_interval
        scaling = (
            "" if p.scaling_efficiency is None else f"{p.scaling_efficiency:.3f}" + (" stops" if p.stops_paying else "")
        )
        cost = (f"{p.cost:,.0f}" if p.cost is not None else "",) if priced else ()
        late = " late" if p.within_deadline is False else ""
        over = " over" if p.within_budget is False else ""
        t.add_row(
            "*" if p.on_front else "",
            escape(p.cluster),
            gpus,
            p.target or "",
            _short_layout(p.plan),
            f"{p.step_time_s:.2f} ({lo:.2f}-{hi:.2f})",
            f"{_days(p.days)} ({_days(dlo)}-{_days(dhi)}){late}",
            f"{p.gpu_hours:,.0f}",
            *(tuple(c + over for c in cost)),
            f"{100 * p.mfu:.1f}%",
            scaling,
        )
    console.print(t)
    for line in size_summary(doc):
        console.print(printable(line), markup=False)


def size_summary(doc) -> list[str]:
    """The front from fastest to cheapest, where scaling stops paying, and the deadline / budget verdicts."""
    ok = [p for p in doc.points if p.feasible]
    out = []
    front = sorted((p for p in ok if p.on_front), key=lambda p: p.days)
    axis = (lambda p: f"${p.cost:,.0f}") if doc.front_axis == "cost" else (lambda p: f"{p.gpu_hours:,.0f} GPU-hours")
    if front:
        out.append(
            "front, fastest first: "
            + "; ".join(f"{p.gpus:,} x {p.cluster} {_days(p.days)} days, {axis(p)}" for p in front)
        )
    stops: dict[str, list] = {}
    for p in ok:
        if p.stops_paying:
            stops.setdefault(p.cluster, []).append(p)
    for cluster, ps in stops.items():
        out.append(
            f"adding GPUs stops paying on {cluster} from {ps[0].gpus:,} GPUs: scaling "
            f"{', '.join(f'{p.scaling_efficiency:.3f} at {p.gpus:,}' for p in ps)} (below --min-scaling {doc.min_scaling:g})"
        )
    if doc.deadline_days is not None:
        inside = [p for p in ok if p.within_deadline]
        best = min(
            inside,
            key=lambda p: p.cost if p.cost is not None and doc.front_axis == "cost" else p.gpu_hours,
            default=None,
        )
        out.append(
            f"within {doc.deadline_days:g} days: "
            + (
                f"{_points(len(inside))}; the least {('cost' if doc.front_axis == 'cost' else 'GPU-hours')}: "
                f"{best.gpus:,} x {best.cluster}, {_days(best.days)} days, {axis(best)}"
                if best
                else "no point; more GPUs or a faster cluster"
            )
        )
    if doc.budget is not None:
        inside = [p for p in ok if p.within_budget]
        best = min(inside, key=lambda p: p.days, default=None)
        cheapest = min((p for p in ok if p.cost is not None), key=lambda p: p.cost, default=None)
        money = f"${doc.budget:,.2f}" if doc.budget < 100 else f"${doc.budget:,.0f}"
        out.append(
            f"within {money}: "
            + (
                f"the fastest priced point is {best.gpus:,} x {best.cluster}, {_days(best.days)} days"
                if best
                else f"no point; the cheapest priced one is {cheapest.gpus:,} x {cheapest.cluster}, ${cheapest.cost:,.0f} in {_days(cheapest.days)} days"
                if cheapest
                else "no priced point"
            )
        )
    infeasible = [p for p in doc.points if not p.feasible]
    if infeasible:
        meaning = {
            "memory": "no layout fits",
            "batch": "the batch cannot be split over that many GPUs",
            "time": "none found within --time-limit",
            "layout": "no layout of the model divides that many GPUs",
        }
        reasons = dict.fromkeys(p.reason for p in infeasible)
        out.append(
            f"{len(infeasible)} of {_points(len(doc.points))} {'has' if len(infeasible) == 1 else 'have'} no plan ("
            + "; ".join(f"{r}: {meaning.get(r, r)}" for r in reasons)
            + ")"
        )
    out.append(f"{_points(len(doc.points))} solved in {doc.wall_time_s:.1f} s")
    return out


def _points(n: int) -> str:
    return f"{n:,} point{'s' if n != 1 else ''}"
