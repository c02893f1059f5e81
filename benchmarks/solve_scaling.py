"""`plan solve` scaling: solve time and candidates for 7B to 1T models on 8 to 4,096 GPUs,
with brute-force enumeration as the same-run baseline.

    python benchmarks/solve_scaling.py [--quick]

Brute force (planner/search/brute.py) evaluates every layout, layer split and per-stage
recompute choice with cost_models.estimate.evaluate. It is run for real on the small
instances (and must find the same optimum); for the large ones its time is extrapolated
from the number of layouts the search space holds times the measured cost of one
evaluation in this run.
"""

from __future__ import annotations

import math
import sys
import time

from cost_models.estimate import evaluate
from hardware_profiles import load_cluster
from planner.presets import load_model
from planner.cli.render import plan_summary
from planner.search.brute import brute_force
from planner.search.candidates import CostTables, SearchSpace
from planner.search.solve import solve
from planner.specs import JobSpec, ModelSpec

GPT_1T = ModelSpec(
    name="gpt-1t", num_layers=128, hidden_size=25600, num_heads=160, vocab_size=51200, max_seq_len=2048,
    tied_embeddings=True, source="Narayanan et al. 2021, Table 1 (1T row: 128 layers, h 25,600, 160 heads)",
)
SMALL = ModelSpec(name="small-4l", num_layers=4, hidden_size=1024, num_heads=8, vocab_size=32000, max_seq_len=2048)

LARGE = [  # model, cluster, GPUs, global batch, sequence
    ("llama2-7b", "dgx-a100-80gb", 8, 64, 4096),
    ("gpt3-13b", "dgx-a100-80gb", 64, 512, 2048),
    ("llama3-70b", "dgx-h100-80gb", 512, 1024, 8192),
    ("gpt3-175b", "dgx-a100-80gb", 1024, 1536, 2048),
    ("llama3-405b", "dgx-h100-80gb", 2048, 2048, 8192),
    ("gpt-1t", "dgx-a100-80gb", 4096, 3072, 2048),
]


def small_cluster(memory_gib: float):
    base = load_cluster("dgx-a100-80gb")
    device = base.device.model_copy(update={"framework_overhead_gib": 0.0, "memory_gib": memory_gib})
    return base.model_copy(update={"gpus_per_node": 2, "device": device})


def eval_seconds(model, cluster, job, cand) -> float:
    """Measured cost of one brute-force evaluation on this machine, now."""
    pc = CostTables(model, cluster, job).pipeline(cand)
    counts = [(n, 0, 0) for n in [model.num_layers // (cand.pp * cand.vpp)] * (cand.pp * cand.vpp)]
    counts[0] = (counts[0][0] + model.num_layers - sum(c[0] for c in counts), 0, 0)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < 0.2:
        evaluate(pc, counts)
        n += 1
    return (time.perf_counter() - start) / n


def main() -> None:
    quick = "--quick" in sys.argv
    print("Small instances: brute force runs to the end (same optimum required)")
    print(f"{'instance':34s} {'layouts':>9s} {'brute s':>8s} {'solve s':>8s} {'ratio':>7s} {'same optimum':>13s}")
    for gpus, batch, mem in ([(4, 2, 1.0)] if quick else [(4, 2, 1.0), (4, 2, 0.7), (4, 4, 1.0), (2, 4, 0.9)]):
        job = JobSpec(global_batch_size=batch, seq_len=2048)
        space = SearchSpace(num_gpus=gpus, global_batch_size=batch)
        cluster = small_cluster(mem)
        t = time.perf_counter()
        res = solve(SMALL, cluster, job, space)
        ts = time.perf_counter() - t
        ref = brute_force(SMALL, cluster, job, space)
        same = (res.best is None and ref.value is None) or (
            res.best is not None and ref.value is not None and math.isclose(1 / res.best.estimate.tokens_per_s, ref.value, rel_tol=1e-7)
        )
        name = f"4-layer 1k-wide, {gpus} GPUs, B={batch}, {mem} GiB"
        print(f"{name:34s} {ref.evaluated:9,d} {ref.seconds:8.2f} {ts:8.3f} {ref.seconds / ts:7.0f}x {str(same):>13s}")

    print("\nLarge instances: brute force extrapolated (layouts x measured seconds per evaluation)")
    print(f"{'model':12s} {'GPUs':>5s} {'candidates':>10s} {'layouts':>9s} {'ILPs':>5s} {'solve s':>8s} {'brute (est.)':>14s} "
          f"{'optimal':>7s}  recommended (predicted step, MFU)")
    for name, cluster_name, gpus, batch, seq in (LARGE[:2] if quick else LARGE):
        model = GPT_1T if name == "gpt-1t" else load_model(name)
        cluster = load_cluster(cluster_name)
        job = JobSpec(global_batch_size=batch, seq_len=seq)
        t = time.perf_counter()
        res = solve(model, cluster, job, SearchSpace(num_gpus=gpus, global_batch_size=batch))
        ts = time.perf_counter() - t
        st = res.stats
        per_eval = eval_seconds(model, cluster, job, res.best.candidate)
        brute_log10 = math.log10(st.layouts_represented) + math.log10(per_eval)
        best = res.best
        print(f"{name:12s} {gpus:5d} {st.candidates_considered:10,d} {'1e%d' % round(math.log10(st.layouts_represented)):>9s} "
              f"{st.ilps_solved:5d} {ts:8.2f} {'1e%d s' % round(brute_log10):>14s} {str(st.optimal):>7s}  "
              f"{plan_summary(best.plan)} ({best.estimate.step_time_s:.2f} s, {100 * best.estimate.mfu:.1f}%)")


if __name__ == "__main__":
    main()
