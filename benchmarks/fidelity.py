"""Can the numbers be trusted? Profile this machine, solve, run the top plans, compare.

    python benchmarks/fidelity.py [--top-k 3] [--steps 7] [--worlds 2] [--repeats 2] [--pinned zero=3,tp=2] [--keep DIR]

For each world size (CPU processes standing in for GPUs, each pinned to its own core where the
machine has one per rank: `plan run` pins them; default 2 ranks, this machine's cores): `plan profile` measures this
machine and a small GPT model, `plan solve --cluster profile.json` ranks the layouts, and
`plan run` trains each of the top-k plans (verification against one process included), then
the best plan of each pinned family (`plan solve --fix zero=3`, `--fix tp=2`) that the top-k
lacks, so that the layouts with many small collective calls are checked even when the
solver (rightly) ranks them lower.
Each plan is measured --repeats times, interleaved (every plan once, then every plan again in
reverse order, ...), so that a drift of the machine's load falls on all of them alike.
Printed per plan (pinned families marked +): predicted and measured step time (the median of
its measurements, and each) and their error; the repeatability (two measurements of one plan)
and the noise sigma pooled over the plans, against which the errors are read; then, over all of them, the mean absolute error, the Spearman rank correlation between
predicted and measured times, and the regret: how much slower the recommended plan ran than
the fastest plan measured, said to be within noise or beyond it. Above the table: the profile's per-call overheads of collectives
(LinkTier.call_overhead_us), what each call costs beyond the back-to-back fits. Everything goes
through the real commands (subprocesses), as a user would run them.

Measured step time: per step the slowest rank's time, median over the timed steps (the
profile's layer times are medians over repetitions too, so a neighbour's burst of load
during one step weighs the same on both sides). `plan run`'s report also holds the mean.

Conditions: on a shared machine a profile and the runs it predicts are only comparable if
they saw the same load. The benchmark measures, for the profile and for each run, how many
cores other processes kept busy meanwhile ("others"): busy CPU time of the whole machine
(/proc/stat) minus the CPU time of our own commands and their workers (getrusage of
children), over the wall time.
"""

from __future__ import annotations

import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODEL = {
    "name": "fidelity-gpt",
    "num_layers": 8,
    "hidden_size": 256,
    "num_heads": 8,
    "vocab_size": 2048,
    "max_seq_len": 128,
    "dropout": False,
    "source": "a small GPT for CPU fidelity runs",
}
GLOBAL_BATCH = 16
# Micro-batch sizes profiled: the plans at this batch on 2-4 ranks run 4-8 sequences per
# micro-batch, and the profile times its TP / ZeRO-3 stacks at the largest (calls.py).
MICRO_BATCHES = "1,2,4,8"


def _machine_busy_s() -> float:
    """CPU seconds the whole machine spent busy since boot (all cores), from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [float(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal (guest is inside user)
    return (total - idle) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    """CPU seconds of this process and of its finished children (the plan commands and their
    workers, which the commands wait for)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


class OtherLoad:
    """Cores that other processes kept busy during a `with` block (measured, not estimated)."""

    def __enter__(self):
        self.t, self.busy, self.own = time.perf_counter(), _machine_busy_s(), _own_cpu_s()
        return self

    def __exit__(self, *exc):
        wall = time.perf_counter() - self.t
        others = (_machine_busy_s() - self.busy) - (_own_cpu_s() - self.own)
        self.cores = max(0.0, others / wall) if wall > 0 else 0.0
        return False


def measured_step(report: dict) -> float:
    """Median over timed steps of the slowest rank's step time."""
    ranks = report["ranks"]
    return statistics.median(max(r["step_times_s"][i] for r in ranks) for i in range(len(ranks[0]["step_times_s"])))


def pinning(ranks: int) -> str:
    """Whether `plan run` can give each rank its own core here."""
    cores = len(os.sched_getaffinity(0))
    return (
        f"ranks pinned, {cores // ranks} core(s) each"
        if cores >= ranks
        else f"{ranks} ranks share {cores} cores: noisy"
    )


def plan_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "planner.cli.main", *args]


def run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if out.returncode not in (0,):
        tail = (out.stderr or out.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"{' '.join(cmd[3:6])} failed ({out.returncode}): {' | '.join(tail)}")
    return out


def solve(model_path: Path, profile: Path, world: int, top_k: int, *fix: str) -> dict:
    """`plan solve --json` on the profile: the best plan and `top_k` alternatives."""
    return json.loads(
        run(
            plan_cmd(
                "solve",
                "--model",
                str(model_path),
                "--cluster",
                str(profile),
                "--gpus",
                str(world),
                "--global-batch",
                str(GLOBAL_BATCH),
                "--top-k",
                str(top_k),
                "--target",
                "generic",  # what `plan run` executes (PyTorch eager); without it the alternatives are stacks' bests
                "--json",
                *fix,
            ),
            timeout=600,
        ).stdout
    )


def spearman(xs: list[float], ys: list[float]) -> float:
    def ranks(v):
        order = sorted(range(len(v)), key=v.__getitem__)
        r = [0.0] * len(v)
        for pos, i in enumerate(order):
            r[i] = pos
        return r

    rx, ry = ranks(xs), ranks(ys)
    n = len(xs)
    if n < 2:
        return float("nan")
    mx, my = sum(rx) / n, sum(ry) / n
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sx = math.sqrt(sum((a - mx) ** 2 for a in rx))
    sy = math.sqrt(sum((b - my) ** 2 for b in ry))
    return cov / (sx * sy) if sx and sy else float("nan")


def plan_files(solution: dict, workdir: Path, stem: str) -> list[Path]:
    """The recommended plan and each alternative as a plan file `plan run` reads."""
    docs = [{k: solution[k] for k in ("schema_version", "model", "cluster", "num_gpus", "job", "plan", "estimate")}]
    for alt in solution["alternatives"]:
        job = dict(solution["job"], global_batch_size=alt["global_batch_size"])
        docs.append(dict(docs[0], job=job, plan=alt["plan"], estimate=alt["estimate"]))
    paths = []
    for i, doc in enumerate(docs):
        p = workdir / f"{stem}-{i}.json"
        p.write_text(json.dumps(doc))
        paths.append(p)
    return paths


def call_overheads(profile: Path) -> str:
    """The profile's per-call overheads (LinkTier.call_overhead_us) and overlap efficiency."""
    doc = json.loads(profile.read_text())
    got = doc["intra_node"].get("call_overhead_us") or {}
    calls = ", ".join(f"{c} {us / 1e3:.1f} ms" for c, us in sorted(got.items())) or "none"
    return f"call overhead beyond the fits: {calls}; overlap efficiency {doc['overlap_efficiency']:.2f}"


def describe(plan: dict) -> str:
    s = f"dp{plan['dp']} tp{plan['tp']} pp{plan['pp']}"
    if plan["vpp"] > 1:
        s += f" v{plan['vpp']}"
    s += f" mbs{plan['micro_batch_size']}x{plan['num_micro_batches']} z{plan['zero_stage']}"
    if plan.get("sequence_parallel"):
        s += " sp"
    if plan["pp"] > 1:
        s += f" {plan['schedule']}"
    return s


def main() -> None:
    args = sys.argv[1:]

    def opt(name: str, default: str) -> str:
        return args[args.index(name) + 1] if name in args else default

    top_k = int(opt("--top-k", "3"))
    steps = opt("--steps", "7")
    worlds = [int(w) for w in opt("--worlds", "2").split(",")]
    pinned = [f for f in opt("--pinned", "zero=3,tp=2").split(",") if f]
    repeats = int(opt("--repeats", "2"))
    workdir = Path(opt("--keep", "")) if "--keep" in args else Path(tempfile.mkdtemp(prefix="plan-fidelity-"))
    workdir.mkdir(parents=True, exist_ok=True)
    model_path = workdir / "model.json"
    model_path.write_text(json.dumps(MODEL))
    for world in worlds:
        t0 = time.perf_counter()
        profile = workdir / f"profile-{world}.json"
        with OtherLoad() as profile_load:
            run(
                plan_cmd(
                    "profile",
                    "--model",
                    str(model_path),
                    "--nproc-per-node",
                    str(world),
                    "--micro-batch-sizes",
                    MICRO_BATCHES,
                    "-o",
                    str(profile),
                ),
                timeout=1800,
            )
        t_profile = time.perf_counter() - t0
        paths = plan_files(solve(model_path, profile, world, top_k - 1), workdir, f"plan-{world}")
        plans = [json.loads(p.read_text())["plan"] for p in paths]
        for fix in pinned:
            key, value = fix.split("=")
            if any(str(p[{"zero": "zero_stage"}.get(key, key)]) == value for p in plans):
                continue  # the top-k already has one
            paths += plan_files(
                solve(model_path, profile, world, 0, "--fix", fix), workdir, f"plan-{world}-{key}{value}"
            )[:1]  # the family's best only
        # Every plan measured `repeats` times, interleaved (the plans in order, then reversed, ...),
        # so that a drift of the machine's load falls on all of them alike.
        runs: dict[Path, list] = {path: [] for path in paths}
        for r in range(repeats):
            for path in paths if r % 2 == 0 else list(reversed(paths)):
                report_path = path.with_suffix(f".report-{r}.json")
                cmd = plan_cmd(
                    "run",
                    str(path),
                    "--nproc-per-node",
                    str(world),
                    "--steps",
                    steps,
                    "--warmup",
                    "2",
                    "-o",
                    str(report_path),
                )
                with OtherLoad() as load:
                    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
                if not report_path.exists():
                    tail = (out.stderr or out.stdout).strip().splitlines()[-1:]
                    runs[path].append((None, None, False, load.cores, " ".join(tail)))
                    continue
                rep = json.loads(report_path.read_text())
                runs[path].append(
                    (
                        rep["time"]["predicted_step_time_s"],
                        measured_step(rep),
                        rep["verification"]["passed"],
                        load.cores,
                        "",
                    )
                )
        rows = []
        for path in paths:
            doc = json.loads(path.read_text())
            got = runs[path]
            times = [m for _, m, _, _, _ in got if m is not None]
            pred = next((p for p, _, _, _, _ in got if p is not None), doc["estimate"]["step_time_s"])
            notes = " ".join(n for *_, n in got if n)
            rows.append(
                (
                    describe(doc["plan"]),
                    pred,
                    times,
                    all(ok for _, _, ok, _, _ in got),
                    max(c for _, _, _, c, _ in got),
                    notes,
                )
            )
        print(
            f"\n{world} ranks (profile {t_profile:.0f} s, {profile.name}; other processes used {profile_load.cores:.2f} "
            f"of {os.cpu_count()} cores meanwhile; {pinning(world)}); global batch {GLOBAL_BATCH} x "
            f"{MODEL['max_seq_len']} tokens; each plan measured {repeats} times, interleaved"
        )
        print(call_overheads(profile))
        print(
            f"{'#':>2} {'plan':44s} {'predicted s':>12s} {'measured s (median; each)':>34s} {'error':>7s} "
            f"{'verified':>8s} {'others':>6s}"
        )
        for i, (name, pred, times, ok, others, note) in enumerate(rows):
            i = i if i < len(plans) else "+"  # best plan of a pinned family
            meas = statistics.median(times) if times else None
            each = " ".join(f"{t:.4f}" for t in times)
            err = f"{100 * (pred - meas) / meas:+6.1f}%" if meas else "   -  "
            cell = f"{meas:.4f} ({each})" if meas else "-"
            print(f"{i:>2} {name:44s} {pred:12.4f} {cell:>34s} {err:>7s} {str(ok):>8s} {others:6.2f} {note}")
        done = [(p, statistics.median(ts), ts) for _, p, ts, _, _, _ in rows if ts]
        pairs = [(ts[0], ts[1]) for _, _, ts in done if len(ts) > 1]
        logs = [[math.log(t) for t in ts] for _, _, ts in done if len(ts) > 1]
        dof = sum(len(x) - 1 for x in logs)
        sigma = (
            math.sqrt(sum(sum((v - statistics.mean(x)) ** 2 for v in x) for x in logs) / dof) if dof else float("nan")
        )
        if pairs:
            repeat = statistics.mean(abs(a / b - 1) for a, b in pairs)
            print(
                f"repeatability: two measurements of one plan differ by {100 * repeat:.1f} % on average "
                f"(mean |a / b - 1| over {len(pairs)} plans); sigma of one measurement {100 * math.expm1(sigma):.1f} %, "
                f"so a prediction cannot be judged closer than that"
            )
        if len(done) >= 2:
            mae = sum(abs(p - m) / m for p, m, _ in done) / len(done)
            rho = spearman([p for p, _, _ in done], [m for _, m, _ in done])
            fastest = min(m for _, m, _ in done)
            first = statistics.median(rows[0][2]) if rows[0][2] else float("nan")
            regret = first / fastest - 1
            # two medians of `repeats` measurements each differ by 2 sigma sqrt(2 / repeats) by chance
            noise = math.expm1(2 * sigma * math.sqrt(2 / repeats)) if dof else float("nan")
            verdict = "within noise" if regret <= noise else "beyond noise"
            print(
                f"mean absolute error {100 * mae:.1f}% (against the median of each plan; noise sigma "
                f"{100 * math.expm1(sigma):.1f} %); Spearman rank correlation {rho:+.2f}; regret of the recommended "
                f"plan {100 * regret:.1f}% (ratio {first / fastest:.2f} to the fastest measured; {verdict}: two medians "
                f"differ by up to {100 * noise:.1f} % by chance)"
            )
    print(f"\nfiles in {workdir}")


if __name__ == "__main__":
    main()
