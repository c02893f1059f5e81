"""`plan solve` over a seeded random population: the distribution of solve time, not a hand-picked list.

    python benchmarks/solve_population.py [--seed S] [--size N] [--quick N] [--from I] [--timeout S]
                                          [--baseline GIT-REV] [--baseline-timeout S]
    python benchmarks/solve_population.py --summarise OUTPUT [OUTPUT ...]

The population (issue 22): --size instances (default 240) drawn with --seed (default 22):
preset models and random dense and mixture-of-experts models of 1B to 1T parameters, GPU
counts from 8 to 16,384 (powers of two, primes times powers of two, and 96, 1,536, 2,240,
3,072), the cluster presets of POPULATION_CLUSTERS, global batches of 64-16,384 sequences and sequence lengths of
2,048-32,768 tokens (context parallelism past 8,192, as `plan solve` tries it); every third
instance memory-tight: its memory limit (`--max-memory-gib`) is 1.00-1.10 x the peak memory of
a real layout that fits (frugal_peak_gib), capped at the device. The first
two instances are issue 22's: GPT-3 175B on 128 A100-40GB and Llama 3 405B on 256 H100.
`--quick N` runs the first N; `--from I` starts at instance I (a population split over
processes); `--summarise` prints the distribution and slowest ten over such runs' outputs.

Each instance is one solve (the default target, generic) in a fresh process, timed around the
library call, stopped after --timeout seconds (default 60) and then shown as "> 60 s". It
prints the median, p95, p99 and maximum solve time (wall and CPU: the machine may be shared), the slowest ten with what made them slow
(candidates, ILPs, memory-tight), and exits 1 when one took over 10 s or was not proven
optimal. `--baseline REV` solves the same instances with the code of git revision REV (a
temporary worktree, the same driver, --baseline-timeout per instance, default 60 s) and checks
that the step time of every answer equals it to 1e-7 (relative) wherever REV finished.
"""

from __future__ import annotations

import heapq
import json
import math
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cost_models.compute import total_params  # noqa: E402
from cost_models.estimate import evaluate  # noqa: E402
from hardware_profiles import load_cluster  # noqa: E402
from planner.cli.solve import cp_degrees  # noqa: E402
from planner.presets import load_model, model_presets  # noqa: E402
from planner.search.bounds import min_peak_memory  # noqa: E402
from planner.search.candidates import CostTables, SearchSpace, enumerate_candidates  # noqa: E402
from planner.specs import JobSpec, ModelSpec, memory_limit_gib  # noqa: E402

from benchmarks.solve_scaling import DRIVER  # noqa: E402  (the one timed solve, a case's memory limit included)

TARGET_S = 10.0
REL_TOL = 1e-7
ISSUE_CASES = [
    dict(model="gpt3-175b", cluster="dgx-a100-40gb", gpus=128, batch=1536, seq=2048, why="issue 22: 256 s before"),
    dict(model="llama3-405b", cluster="dgx-h100-80gb", gpus=256, batch=2048, seq=8192, why="issue 22: 52 s before"),
]
AWKWARD = [96, 1536, 2240, 3072]
LAYERS = [16, 24, 28, 32, 40, 48, 60, 64, 80, 96, 105, 118, 126, 128]


def gpu_counts() -> list[int]:
    counts = {2**k for k in range(3, 15)} | set(AWKWARD)
    counts |= {p * 2**k for p in (3, 5, 7, 11, 13) for k in range(1, 13) if 8 <= p * 2**k <= 16384}
    return sorted(counts)


def random_model(rng: random.Random, i: int) -> dict:
    """A dense or mixture-of-experts model of 1B-1T parameters (total), Llama-shaped."""
    moe = rng.random() < 0.35
    params = 10 ** rng.uniform(9, 12)
    layers = rng.choice(LAYERS)
    spec = dict(
        name=f"random-{i}",
        num_layers=layers,
        vocab_size=rng.choice([32000, 50257, 128256]),
        max_seq_len=32768,
        activation="swiglu",
        norm="rmsnorm",
        tied_embeddings=False,
        learned_position_embeddings=False,
        linear_bias=False,
    )
    if moe:
        experts = rng.choice([8, 16, 32, 64, 128, 256])
        top = min(experts, rng.choice([1, 2, 4, 8]))
        share = rng.uniform(0.2, 1.0)  # expert width relative to the hidden size
        # ~ layers x (4 h^2 attention + experts x 3 share h^2): solve for h
        h = math.sqrt(params / (layers * (4 + experts * 3 * share)))
        spec.update(num_experts=experts, experts_per_token=top)
    else:
        h = math.sqrt(params / (12 * layers))
    heads = max(8, round(h / 128))
    hidden = heads * 128
    spec.update(
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=8 if heads % 8 == 0 else heads,
        ffn_hidden_size=128 * round(hidden * 3.5 / 128),
    )
    if moe:
        spec["moe_ffn_hidden_size"] = max(128, 128 * round(hidden * share / 128))
    return spec


def draw(rng: random.Random, i: int, presets: list[str], clusters: list[str], gpus: list[int]) -> dict:
    model = rng.choice(presets) if rng.random() < 0.5 else random_model(rng, i)
    n = rng.choice(gpus)
    batch = rng.choice([64, 128, 256, 512, 768, 1024, 1536, 2048, 3072, 4096, 8192, 16384])
    seq = rng.choice([2048, 2048, 4096, 4096, 8192, 8192, 16384, 32768])
    if isinstance(model, str) and load_model(model).learned_position_embeddings:
        seq = min(seq, load_model(model).max_seq_len)  # no more tokens than its learned positions
    return dict(
        model=model,
        cluster=clusters[i % len(clusters)],
        gpus=n,
        batch=max(batch, n // 64 or 1),
        seq=seq,
        tight=i % 3 == 0,
        why="",
    )


# The clusters the population draws from, in draw order: the presets shipped when the population
# was fixed (issue 22). A named list, not every preset, so that adding a preset (dgx-b300 and
# gb300-nvl72 came later) leaves every instance as it was and a run stays comparable with the
# README's; tests/unit/benchmarks/test_solve_population.py checks each still loads.
POPULATION_CLUSTERS = (
    "dgx-a100-40gb",
    "dgx-a100-80gb",
    "dgx-b200",
    "dgx-h100-80gb",
    "dgx-h200",
    "gb200-nvl72",
    "mi300x",
    "mi325x",
    "mi355x",
)


def population(seed: int, size: int) -> list[dict]:
    rng = random.Random(seed)
    presets, clusters, gpus = sorted(model_presets()), list(POPULATION_CLUSTERS), gpu_counts()
    cases = [dict(c, tight=False) for c in ISSUE_CASES]
    cases += [draw(rng, i, presets, clusters, gpus) for i in range(len(cases), size)]
    return cases


def finish(case: dict) -> dict:
    """The instance as the driver takes it: context-parallel degrees, and for a memory-tight one
    its limit: 1.00-1.10 x (seeded by the instance) the peak memory of a layout that fits
    (:func:`frugal_peak_gib`), so that a plan exists and needs recompute or a careful split.
    Where even that layout exceeds the device, the device's limit stays (no plan: counted)."""
    out = {k: v for k, v in case.items() if k not in ("tight", "why")}
    cps = cp_degrees(case["seq"], case["gpus"], None)
    if len(cps) > 1:
        out["cp"] = list(cps)
    if case["tight"]:
        model = ModelSpec(**case["model"]) if isinstance(case["model"], dict) else load_model(case["model"])
        cluster = load_cluster(case["cluster"])
        extra = {"cp_degrees": tuple(cps), "seq_len": case["seq"]} if len(cps) > 1 else {}
        need = frugal_peak_gib(
            model,
            cluster,
            JobSpec(global_batch_size=case["batch"], seq_len=case["seq"]),
            SearchSpace(num_gpus=case["gpus"], global_batch_size=case["batch"], **extra),
        )
        if need is not None and need <= memory_limit_gib(cluster):
            u = random.Random(json.dumps(out, sort_keys=True)).uniform(1.0, 1.1)
            out["limit"] = min(memory_limit_gib(cluster), need * u)
            out["fits_at"] = need
    return out


FRUGAL_TRIES = 8  # layouts with the least memory floor whose real frugal split is costed


def frugal_peak_gib(model: ModelSpec, cluster, job: JobSpec, space: SearchSpace) -> float | None:
    """The least peak memory (GiB) of a real split: of the FRUGAL_TRIES layouts (micro-batches of one) with the least
    floor (planner/search/bounds.py:min_peak_memory), each with every layer in its most frugal
    recompute mode and the layers dealt one at a time to the rank whose memory grows least
    (interleaved: equal chunks), costed by cost_models/estimate.py:evaluate. A layout that
    fits in that much exists; the least any layout needs is at most this and at least the floor."""
    cands, _ = enumerate_candidates(model, cluster, space)
    # Micro-batches of one hold the fewest activations; the mesh order moves no byte: one order each.
    cands = list({replace(c, mesh_order=()): c for c in cands if c.micro_batch_size == 1}.values())
    tables = CostTables(model, cluster, job)
    floors = sorted((min_peak_memory(pc), i, pc) for i, pc in ((i, tables.pipeline(c)) for i, c in enumerate(cands)))
    peaks = [evaluate(pc, frugal_split(pc)).peak_memory_gib for _, _, pc in floors[:FRUGAL_TRIES]]
    return min(peaks, default=None)


def frugal_split(pc) -> list[tuple[int, int, int]]:
    """Per virtual stage (none, selective, full) counts: every layer in the mode that keeps the
    fewest bytes, each stage its fewest layers, then one layer at a time to the stage whose
    rank's memory (terms.py's rank rows) ends lowest."""
    t, L, P = pc.terms, pc.num_layers, pc.num_stages
    ranks = t.ranks()
    mode = min(range(3), key=lambda i: ranks[0].memory.linear.slope[i])
    if pc.vpp > 1:
        return [tuple(L // P if i == mode else 0 for i in range(3))] * P
    n = [max(1, pc.first_stage_min_layers if j == 0 else 1) for j in range(P)]

    def after(j: int, k: int) -> float:
        mem = ranks[j].memory
        return (
            mem.linear(tuple(k if i == mode else 0 for i in range(3))) + max(mem.temporary) + mem.full_recompute_buffer
        )

    heap = [(after(j, n[j] + 1), j) for j in range(P)]
    heapq.heapify(heap)
    for _ in range(L - sum(n)):
        _, j = heapq.heappop(heap)
        n[j] += 1
        heapq.heappush(heap, (after(j, n[j] + 1), j))
    return [tuple(k if i == mode else 0 for i in range(3)) for k in n]


def run(case: dict, root: Path, timeout: float) -> dict | None:
    """DRIVER under `root`; None past `timeout`, {"error": line} when it failed."""
    env = {"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}
    try:
        out = subprocess.run(
            [sys.executable, "-c", DRIVER, json.dumps(case)],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return None
    if out.returncode:
        return {"error": (out.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def coverage(cases: list[dict]) -> str:
    """What the population spans, against the issue's list."""
    models = [ModelSpec(**c["model"]) if isinstance(c["model"], dict) else load_model(c["model"]) for c in cases]
    params = [total_params(m) for m in models]
    random_ = [m for c, m in zip(cases, models) if isinstance(c["model"], dict)]
    gpus = sorted({c["gpus"] for c in cases})
    odd = [g for g in gpus if g & (g - 1)]  # not a power of two
    clusters = Counter(c["cluster"] for c in cases)
    tight = [c for c in cases if c.get("tight")]
    return "\n".join(
        [
            f"population: {len(cases)} instances; models: {len(cases) - len(random_)} preset ({len({m.name for m in models} - {m.name for m in random_})} "
            f"distinct), {sum(not m.is_moe for m in random_)} random dense, {sum(m.is_moe for m in random_)} random MoE; "
            f"{min(params) / 1e9:.1f}B-{max(params) / 1e9:,.0f}B parameters",
            f"GPUs: {len(gpus)} counts from {gpus[0]} to {gpus[-1]:,}, {len(odd)} not a power of two ({', '.join(f'{g:,}' for g in odd[:12])} ...)",
            "clusters: "
            + ", ".join(f"{k} {v}" for k, v in sorted(clusters.items()))
            + f"; global batch {min(c['batch'] for c in cases)}-{max(c['batch'] for c in cases):,}"
            + f"; sequence {min(c['seq'] for c in cases):,}-{max(c['seq'] for c in cases):,}",
            f"memory-tight: {len(tight)}, of which {sum('limit' in c for c in tight)} with a limit 1.00-1.10 x the peak of a layout "
            "that fits (the rest: even that layout exceeds the device)",
        ]
    )


def describe(case: dict) -> str:
    m = case["model"]
    if isinstance(m, dict):
        experts = f" {m['num_experts']}E" if m.get("num_experts") else ""
        name = f"{m['name']} ({m['num_layers']}L h{m['hidden_size']}{experts})"
    else:
        name = m
    tight = f", limit {case['limit']:.1f} GiB (tight)" if "limit" in case else ""
    return f"{name} {case['cluster']} {case['gpus']} GPUs B={case['batch']} S={case['seq']}{tight}"


def quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, math.ceil(q * len(xs)) - 1)]


def arg(name: str, default):
    return type(default)(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


LINE = re.compile(
    r"^ *(\d+) (.{96}) +(\S+(?: \S+)?) s \(cpu +(\S+(?: \S+)?)\)(?: +(\d+) ILPs +(\S+(?: plan)?))?"
    r"(?:  baseline +(\S+(?: \S+)?) s)?(  DIFFERENT STEP.*)?$"
)


def summarise(paths: list[str]) -> None:
    """The distribution and the slowest ten over the instance lines of earlier runs' outputs (a
    population split over processes with --from): each instance once, from the first file that has it."""
    rows: dict[int, tuple] = {}
    for path in paths:
        for text in Path(path).read_text().splitlines():
            m = LINE.match(text)
            if m and int(m[1]) not in rows:
                rows[int(m[1])] = m.groups()
    finished = [r for r in rows.values() if r[2] != "error" and not r[2].startswith(">")]
    for name, k in (("wall", 2), ("cpu", 3)):
        times = [float(r[k]) for r in finished]
        print(
            f"{len(rows)} instances ({len(finished)} finished), {name} seconds: median {statistics.median(times):.2f}, "
            f"p95 {quantile(times, 0.95):.2f}, p99 {quantile(times, 0.99):.2f}, max {max(times):.2f}"
        )
    slow = [r for r in rows.values() if r not in finished or float(r[2]) > TARGET_S]
    differ = [r for r in rows.values() if r[7]]
    print(
        f"over {TARGET_S:g} s or unfinished: {len(slow)}; steps differing from the baseline's: {len(differ)}; "
        f"baseline unfinished: {sum(1 for r in rows.values() if r[6] and r[6].startswith('>'))}"
    )
    print("slowest ten (wall):")
    for r in sorted(rows.values(), key=lambda r: float(r[2].lstrip("> ")) if r[2] != "error" else 1e9, reverse=True)[
        :10
    ]:
        print(f"  {r[2]:>7s} s (cpu {r[3]}) #{r[0]} {r[1].strip()}: {r[4]} ILPs; baseline {r[6]} s")


@contextmanager
def worktree(rev: str):
    """A temporary git worktree of revision `rev` of this repository (None when `rev` is empty),
    removed on the way out."""
    if not rev:
        yield None
        return
    root = Path(tempfile.mkdtemp(prefix="baseline-"))
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(root), rev], check=True, capture_output=True
    )
    try:
        yield root
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(root)], capture_output=True)


def main() -> None:
    if "--summarise" in sys.argv:
        summarise(sys.argv[sys.argv.index("--summarise") + 1 :])
        return
    seed, size, timeout = arg("--seed", 22), arg("--size", 240), arg("--timeout", 60.0)
    quick, baseline, base_timeout = arg("--quick", 0), arg("--baseline", ""), arg("--baseline-timeout", 60.0)
    first = arg("--from", 0)  # run instances first.. only (a population split over processes)
    raw = population(seed, size)[: quick or None]
    cases = [dict(finish(c), tight=c["tight"]) for c in raw[first:]]
    print(("" if first == 0 else f"instances {first}-{len(raw) - 1} of the ") + coverage(cases), flush=True)
    print("load average (1, 5, 15 min) at the start: %.1f %.1f %.1f" % os.getloadavg(), flush=True)
    with worktree(baseline) as base_root:
        rows, mismatches = [], 0
        for i, case in enumerate(cases, start=first):
            case = {k: v for k, v in case.items() if k != "tight"}
            got = run(case, ROOT, timeout)
            old = run(case, base_root, base_timeout) if base_root is not None else None
            line, differs = instance_line(i, case, got, old, base_root is not None, timeout, base_timeout)
            mismatches += differs
            print(line, flush=True)
            rows.append((seconds(got, timeout), i, case, got, old))
    print("load average (1, 5, 15 min) at the end: %.1f %.1f %.1f" % os.getloadavg())
    report(rows, timeout, base_root is not None, base_timeout)
    ok = all(
        got is not None and "error" not in got and got["optimal"] and got["seconds"] <= TARGET_S
        for _, _, _, got, _ in rows
    )
    if mismatches:
        print(f"FAIL: {mismatches} answers differ from the baseline's")
    if not ok or mismatches:
        print(f"FAIL: an instance took over {TARGET_S:g} s, failed or was not proven optimal")
        sys.exit(1)


def seconds(got: dict | None, timeout: float) -> float:
    return timeout if got is None or "error" in got else got["seconds"]


def outcome(got: dict | None, timeout: float, cpu: bool = False) -> str:
    if got is None:
        return f"> {timeout:g}"
    return "error" if "error" in got else f"{got['cpu_seconds' if cpu else 'seconds']:.2f}"


def instance_line(
    i: int, case: dict, got, old, with_baseline: bool, timeout: float, base_timeout: float
) -> tuple[str, bool]:
    """One instance's line (wall and CPU seconds, ILPs, the optimum's step) and whether its step
    differs from the baseline's (compared where both finished)."""
    line = f"{i:4d} {describe(case)[:96]:96s} {outcome(got, timeout):>7s} s (cpu {outcome(got, timeout, True):>6s})"
    if got is not None and "error" not in got:
        line += f" {got['ilps']:4d} ILPs {got['fastest_step'] if got['fastest_step'] else 'no plan'!s:>20s}"
    if not with_baseline:
        return line, False
    line += f"  baseline {outcome(old, base_timeout):>7s} s"
    if old is None or got is None or "error" in old or "error" in got:
        return line, False
    a, b = old["fastest_step"], got["fastest_step"]
    same = (a is None and b is None) or (a is not None and b is not None and math.isclose(a, b, rel_tol=REL_TOL))
    return line + ("" if same else f"  DIFFERENT STEP (baseline {a})"), not same


def report(rows: list, timeout: float, with_baseline: bool, base_timeout: float) -> None:
    done = [r for r in rows if r[3] is None or "error" not in r[3]]  # a failed solve has no time
    for name, key in (("wall", "seconds"), ("cpu", "cpu_seconds")):
        times = [timeout if got is None else got[key] for _, _, _, got, _ in done]
        print(
            f"\n{len(rows)} instances, {name} seconds: median {statistics.median(times):.2f}, p95 {quantile(times, 0.95):.2f}, "
            f"p99 {quantile(times, 0.99):.2f}, max {max(times):.2f}",
            end="",
        )
    plans = sum(got is not None and "error" not in got and got["fastest_step"] is not None for _, _, _, got, _ in rows)
    tight = [got for _, _, case, got, _ in rows if "limit" in case]
    print(
        f"\n{plans} with a plan; memory-tight with a fitting limit: {len(tight)}, "
        f"{sum(g is not None and 'error' not in g and g['fastest_step'] is not None for g in tight)} with a plan"
    )
    print("slowest ten (wall):")
    for _, i, case, got, old in sorted(rows, key=lambda r: r[:2], reverse=True)[:10]:
        why = (
            "timed out"
            if got is None
            else got["error"]
            if "error" in got
            else f"cpu {got['cpu_seconds']:.2f} s, {got['candidates']:,} candidates, {got['ilps']} ILPs"
            + ("" if got["fastest_step"] else ", no plan")
            + ("" if got["optimal"] else ", not proven optimal")
        )
        base = f"; baseline {outcome(old, base_timeout)} s" if with_baseline else ""
        print(f"  {outcome(got, timeout):>7s} s  #{i} {describe(case)}: {why}{base}")


if __name__ == "__main__":
    main()
