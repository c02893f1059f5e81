"""`plan solve` scaling: solve time and candidates for 7B to 1T models on 8 to 4,096 GPUs,
awkward GPU counts and memory-tight models, against two same-run baselines.

    python benchmarks/solve_scaling.py [--quick] [--repeat N] [--baseline GIT-REV] [--baseline-timeout S]

1. Brute force (planner/search/brute.py) evaluates every layout, layer split and per-stage
   recompute choice with cost_models/estimate.py:evaluate. It is run for real on the small
   instances (and must find the same optimum); for the large ones its time is extrapolated
   from the number of layouts the search space holds times the measured cost of one
   evaluation in this run.
2. `--baseline REV`: the same large instances solved by the code of git revision REV (a
   temporary worktree of this repository), each in its own process with the same driver as
   this code's, in this run; the ratio is this code's solve time over REV's. Each time is
   the least of --repeat runs (default 3; this machine is shared and noisy). A baseline run
   longer than --baseline-timeout (default 120 s) is stopped and shown as "> S".

Every large instance must be solved within 10 s and proven optimal (the target of the
search): the script exits 1 when one is not.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cost_models.estimate import evaluate
from hardware_profiles import load_cluster
from planner.cli.render import plan_summary
from planner.cli.solve import cp_degrees
from planner.presets import load_model
from planner.search.brute import brute_force
from planner.specs import Layout
from planner.search.candidates import CostTables, SearchSpace
from planner.search.solve import solve
from planner.specs import JobSpec, ModelSpec, Plan

ROOT = Path(__file__).resolve().parent.parent
TARGET_S = 10.0

GPT_1T = dict(
    name="gpt-1t",
    num_layers=128,
    hidden_size=25600,
    num_heads=160,
    vocab_size=51200,
    max_seq_len=2048,
    tied_embeddings=True,
    source="Narayanan et al. 2021, Table 1 (1T row: 128 layers, h 25,600, 160 heads)",
)
MT_NLG = dict(
    name="mt-nlg-530b",
    num_layers=105,
    hidden_size=20480,
    num_heads=128,
    vocab_size=51200,
    max_seq_len=2048,
    tied_embeddings=True,
    source="Smith et al. 2022 (MT-NLG), sec. 2: 105 layers, hidden 20,480, 128 heads, sequence 2,048",
)
SMALL = ModelSpec(name="small-4l", num_layers=4, hidden_size=1024, num_heads=8, vocab_size=32000, max_seq_len=2048)

# (model preset name or spec, cluster, GPUs, global batch, sequence, why it is here)
LARGE = [
    ("llama2-7b", "dgx-a100-80gb", 8, 64, 4096, ""),
    ("gpt3-13b", "dgx-a100-80gb", 64, 512, 2048, ""),
    ("llama3-70b", "dgx-h100-80gb", 512, 1024, 8192, ""),
    ("gpt3-175b", "dgx-a100-80gb", 1024, 1536, 2048, ""),
    ("llama3-405b", "dgx-h100-80gb", 2048, 2048, 8192, ""),
    (GPT_1T, "dgx-a100-80gb", 4096, 3072, 2048, ""),
    (MT_NLG, "dgx-a100-80gb", 2240, 1920, 2048, "2^6 x 5 x 7 GPUs, MT-NLG's setting"),
    (MT_NLG, "dgx-a100-80gb", 2520, 1920, 2048, "2^3 x 3^2 x 5 x 7"),
    (MT_NLG, "dgx-a100-80gb", 1920, 1920, 2048, "2^7 x 3 x 5"),
    (MT_NLG, "dgx-a100-80gb", 1536, 1920, 2048, "2^9 x 3"),
    ("gpt3-175b", "dgx-a100-80gb", 96, 1536, 2048, "2^5 x 3, memory-tight"),
    ("gpt3-175b", "dgx-a100-40gb", 128, 1536, 2048, "memory-tight"),
    ("llama3-405b", "dgx-h100-80gb", 256, 2048, 8192, "memory-tight"),
    ("llama3-70b", "dgx-a100-40gb", 64, 512, 4096, "memory-tight"),
    # Mixture-of-experts (every expert-parallel degree) and long context (context parallelism):
    # solved by this code only (older revisions know neither), within the same budget.
    ("mixtral-8x7b", "dgx-h100-80gb", 64, 512, 4096, "MoE"),
    ("deepseek-v3", "dgx-h100-80gb", 1024, 8192, 4096, "MoE, 256 experts"),
    ("deepseek-v3", "dgx-h100-80gb", 2048, 15360, 4096, "MoE, 256 experts"),
    ("llama3-8b", "dgx-h100-80gb", 8, 8, 131072, "long context: cp 1-8"),
    ("llama3-70b", "dgx-h100-80gb", 256, 256, 65536, "long context: cp 1-8"),
]
# Instances that only this code can solve (no baseline for them).
NEW_DIMENSIONS = {"mixtral-8x7b", "deepseek-v3"}

# One solve, timed around the library call, in a fresh process; it must run against this
# code and against older revisions (whose model preset loader was planner.models). A case may
# carry a memory limit (benchmarks/solve_population.py's memory-tight instances).
DRIVER = r"""
import json, sys, time
case = json.loads(sys.argv[1])
try:
    from planner.presets import load_model
except ImportError:
    from planner.models import load_model
from hardware_profiles import load_cluster
from planner.search.candidates import SearchSpace
from planner.search.solve import solve
from planner.specs import JobSpec, ModelSpec, Plan
model = ModelSpec(**case["model"]) if isinstance(case["model"], dict) else load_model(case["model"])
job = JobSpec(global_batch_size=case["batch"], seq_len=case["seq"])
extra = {"cp_degrees": tuple(case["cp"]), "seq_len": case["seq"]} if case.get("cp") else {}
space = SearchSpace(num_gpus=case["gpus"], global_batch_size=case["batch"], **extra)
start, cpu = time.perf_counter(), time.process_time()
res = solve(model, load_cluster(case["cluster"]), job, space, **({"memory_limit_gib": case["limit"]} if case.get("limit") else {}))
seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
# an older baseline kept the exact count (layouts_represented)
layouts_log10 = getattr(res.stats, "layouts_represented_log10", None)
if layouts_log10 is None:
    import math
    layouts_log10 = math.log10(res.stats.layouts_represented)
best = res.best
print(json.dumps({
    "seconds": seconds, "cpu_seconds": cpu_seconds, "optimal": res.stats.optimal, "ilps": res.stats.ilps_solved,
    "candidates": res.stats.candidates_considered, "layouts_log10": layouts_log10,
    "plan": best.plan.model_dump(mode="json") if best else None,
    "step": best.estimate.step_time_s if best else None, "mfu": best.estimate.mfu if best else None,
    # the ILP optimum (an older baseline has no `fastest`): what benchmarks/solve_population.py compares
    "fastest_step": (getattr(res, "fastest", None) or best).estimate.step_time_s if best else None,
    "model_name": model.name,
}))
"""


def fastest_of(repeat: int, case: dict, root: Path, timeout: float) -> dict | None:
    """The run with the least solve time of `repeat` (None as soon as one runs past `timeout`)."""
    best = None
    for _ in range(repeat):
        got = solve_in_process(case, root, timeout)
        if got is None:
            return None
        if best is None or got["seconds"] < best["seconds"]:
            best = got
    return best


def solve_in_process(case: dict, root: Path, timeout: float) -> dict | None:
    """Run DRIVER against the code under `root`; None when it ran past `timeout`."""
    env = {**os.environ, "PYTHONPATH": str(root)}
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
        raise SystemExit(f"solve failed under {root}: {out.stderr.strip().splitlines()[-1]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def small_cluster(memory_gib: float):
    base = load_cluster("dgx-a100-80gb")
    device = base.device.model_copy(update={"framework_overhead_gib": 0.0, "memory_gib": memory_gib})
    return base.model_copy(update={"gpus_per_node": 2, "device": device})


def eval_seconds(model, cluster, job, plan) -> float:
    """Measured cost of one brute-force evaluation on this machine, now."""
    cand = Layout(
        plan.dp,
        plan.tp,
        plan.pp,
        plan.vpp,
        plan.micro_batch_size,
        plan.num_micro_batches,
        plan.schedule,
        plan.zero_stage,
        plan.sequence_parallel,
        tuple(plan.mesh_order),
        plan.tp_comm_overlap,
        plan.ep,
        plan.fp8,
        plan.cp,
    )
    pc = CostTables(model, cluster, job).pipeline(cand)
    P = cand.pp * cand.vpp
    counts = [(model.num_layers // P, 0, 0)] * P
    counts[0] = (counts[0][0] + model.num_layers - sum(c[0] for c in counts), 0, 0)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < 0.2:
        evaluate(pc, counts)
        n += 1
    return (time.perf_counter() - start) / n


def small_instances(quick: bool) -> None:
    print("Small instances: brute force runs to the end (same optimum required)")
    print(f"{'instance':34s} {'layouts':>9s} {'brute s':>8s} {'solve s':>8s} {'ratio':>7s} {'same optimum':>13s}")
    for gpus, batch, mem in [(4, 2, 1.0)] if quick else [(4, 2, 1.0), (4, 2, 0.7), (4, 4, 1.0), (2, 4, 0.9)]:
        job = JobSpec(global_batch_size=batch, seq_len=2048)
        space = SearchSpace(num_gpus=gpus, global_batch_size=batch)
        cluster = small_cluster(mem)
        t = time.perf_counter()
        res = solve(SMALL, cluster, job, space)
        ts = time.perf_counter() - t
        ref = brute_force(SMALL, cluster, job, space)
        same = (res.best is None and ref.value is None) or (
            res.fastest is not None
            and ref.value is not None
            and math.isclose(1 / res.fastest.estimate.tokens_per_s, ref.value, rel_tol=1e-7)
        )
        name = f"4-layer 1k-wide, {gpus} GPUs, B={batch}, {mem} GiB"
        print(f"{name:34s} {ref.evaluated:9,d} {ref.seconds:8.2f} {ts:8.3f} {ref.seconds / ts:7.0f}x {str(same):>13s}")


def baseline_worktree(rev: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix="solve-baseline-"))
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(path), rev], check=True, capture_output=True
    )
    return path


def large_instances(quick: bool, baseline: str | None, baseline_timeout: float, repeat: int) -> bool:
    base_root = baseline_worktree(baseline) if baseline else None
    ok = True
    try:
        print(
            "\nLarge instances: brute force extrapolated (layouts x measured seconds per evaluation)"
            + (f"; baseline: revision {baseline} in the same run" if baseline else "")
        )
        head = (
            f"{'model':12s} {'GPUs':>5s} {'candidates':>10s} {'layouts':>8s} {'ILPs':>4s} {'solve s':>8s} {'brute (est.)':>12s} "
            f"{'optimal':>7s}"
        )
        if baseline:
            head += f" {'baseline s':>10s} {'ratio':>6s}"
        print(head + "  recommended (predicted step, MFU)")
        for model, cluster_name, gpus, batch, seq, _why in LARGE[:2] if quick else LARGE:
            case = dict(model=model, cluster=cluster_name, gpus=gpus, batch=batch, seq=seq)
            cps = cp_degrees(seq, gpus, None)
            new = (isinstance(model, str) and model in NEW_DIMENSIONS) or len(cps) > 1
            if len(cps) > 1:
                case["cp"] = list(cps)  # the context-parallel degrees `plan solve` would try
            got = fastest_of(repeat, case, ROOT, timeout=600)
            if got is None:  # did not finish within the driver's 600 s
                name = model["name"] if isinstance(model, dict) else model
                print(f"{name[:12]:12s} {gpus:5d} {'':10s} {'':8s} {'':4s} {'> 600':>8s}  not solved within 600 s")
                ok = False
                continue
            spec = ModelSpec(**model) if isinstance(model, dict) else load_model(model)
            job = JobSpec(global_batch_size=batch, seq_len=seq)
            plan = Plan.model_validate(got["plan"])
            per_eval = eval_seconds(spec, load_cluster(cluster_name), job, plan)
            brute_log10 = got["layouts_log10"] + math.log10(per_eval)
            line = (
                f"{got['model_name'][:12]:12s} {gpus:5d} {got['candidates']:10,d} {'1e%d' % round(got['layouts_log10']):>8s} "
                f"{got['ilps']:4d} {got['seconds']:8.2f} {'1e%d s' % round(brute_log10):>12s} {str(got['optimal']):>7s}"
            )
            if base_root is not None and new:
                line += f" {'(new)':>10s} {'':>6s}"
            elif base_root is not None:
                old = fastest_of(repeat, case, base_root, timeout=baseline_timeout)
                if old is None:
                    line += f" {'> %g' % baseline_timeout:>10s} {'< %.3f' % (got['seconds'] / baseline_timeout):>6s}"
                else:
                    line += f" {old['seconds']:10.2f} {got['seconds'] / old['seconds']:6.2f}"
                    if not old["optimal"]:
                        line += " (baseline not optimal)"
            print(line + f"  {plan_summary(plan)} ({got['step']:.2f} s, {100 * got['mfu']:.1f}%)", flush=True)
            ok = ok and got["optimal"] and got["seconds"] <= TARGET_S
    finally:
        if base_root is not None:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base_root)], capture_output=True
            )
    return ok


def main() -> None:
    quick = "--quick" in sys.argv
    baseline = sys.argv[sys.argv.index("--baseline") + 1] if "--baseline" in sys.argv else None
    timeout = float(sys.argv[sys.argv.index("--baseline-timeout") + 1]) if "--baseline-timeout" in sys.argv else 120.0
    repeat = int(sys.argv[sys.argv.index("--repeat") + 1]) if "--repeat" in sys.argv else 3
    small_instances(quick)
    if not large_instances(quick, baseline, timeout, repeat):
        print(f"\nFAIL: a large instance took over {TARGET_S:g} s or was not proven optimal")
        sys.exit(1)
    print(f"\nevery large instance solved within {TARGET_S:g} s and proven optimal")


if __name__ == "__main__":
    main()
