"""How long one `plan estimate` takes, against baselines measured in the same run.

    python benchmarks/estimate_speed.py [--repeat N]

1. Model time: the library call `cost_models.estimate.estimate` (what `plan solve` and
   `plan run` call), per plan, against a baseline of constructing and validating the
   same `Plan` object in pydantic: the ratio says how many plan validations one estimate
   costs, which does not depend on how loaded this shared machine is.
2. Command time: the whole `plan estimate --json` process against `python -c "import
   planner.cli.main"` (interpreter start and imports): what the user waits for.
Prints medians of several repetitions.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

from cost_models.estimate import estimate
from hardware_profiles import load_cluster
from planner.presets import load_model
from planner.specs import JobSpec, Plan

CASES = [
    (
        "gpt3-175b",
        "dgx-a100-80gb",
        dict(global_batch_size=1536, seq_len=2048),
        dict(dp=8, tp=8, pp=16, micro_batch_size=1, num_micro_batches=192, recompute="full"),
    ),
    (
        "llama3-70b",
        "dgx-h100-80gb",
        dict(global_batch_size=512, seq_len=8192),
        dict(dp=64, tp=8, pp=1, micro_batch_size=1, num_micro_batches=8, recompute="full", zero_stage=3),
    ),
    (
        "llama3-405b",
        "dgx-h100-80gb",
        dict(global_batch_size=2048, seq_len=8192),
        dict(
            dp=16,
            tp=8,
            pp=16,
            vpp=2,
            micro_batch_size=1,
            num_micro_batches=128,
            schedule="interleaved-1f1b",
            recompute="selective",
            sequence_parallel=True,
            zero_stage=1,
        ),
    ),
    (
        "gpt2-124m",
        "dgx-a100-80gb",
        dict(global_batch_size=512, seq_len=1024),
        dict(dp=8, tp=1, pp=1, micro_batch_size=16, num_micro_batches=4),
    ),
]


def per_call(fn, min_time: float = 0.3) -> float:
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < min_time:
        fn()
        n += 1
    return (time.perf_counter() - start) / n


def main() -> None:
    repeat = int(sys.argv[sys.argv.index("--repeat") + 1]) if "--repeat" in sys.argv else 5
    print(f"{'model':12s} {'layout':28s} {'estimate us':>12s} {'baseline us':>12s} {'ratio':>7s}")
    for model_name, cluster_name, job_kw, plan_kw in CASES:
        model, cluster, job = load_model(model_name), load_cluster(cluster_name), JobSpec(**job_kw)
        plan = Plan(**plan_kw)
        est_t, base_t = [], []
        for _ in range(repeat):
            est_t.append(per_call(lambda: estimate(model, cluster, job, plan)))
            base_t.append(per_call(lambda: Plan(**plan_kw)))
        e, b = statistics.median(est_t), statistics.median(base_t)
        layout = f"dp{plan.dp} tp{plan.tp} pp{plan.pp}" + (f" v{plan.vpp}" if plan.vpp > 1 else "")
        print(f"{model_name:12s} {layout:28s} {e * 1e6:12.1f} {b * 1e6:12.1f} {e / b:7.1f}")

    cmd = [
        sys.executable,
        "-m",
        "planner.cli.main",
        "estimate",
        "--model",
        "gpt3-175b",
        "--cluster",
        "dgx-a100-80gb",
        "--gpus",
        "1024",
        "--global-batch",
        "1536",
        "--seq-len",
        "2048",
        "--tp",
        "8",
        "--pp",
        "16",
        "--micro-batch-size",
        "1",
        "--recompute",
        "full",
        "--json",
    ]
    base = [sys.executable, "-c", "import planner.cli.main"]

    def wall(c):
        t = time.perf_counter()
        subprocess.run(c, check=True, capture_output=True)
        return time.perf_counter() - t

    cli_t = statistics.median(wall(cmd) for _ in range(repeat))
    imp_t = statistics.median(wall(base) for _ in range(repeat))
    print(
        f"\n`plan estimate --json` process: {cli_t * 1e3:.0f} ms; interpreter + imports alone: {imp_t * 1e3:.0f} ms; "
        f"ratio {cli_t / imp_t:.2f}"
    )


if __name__ == "__main__":
    main()
