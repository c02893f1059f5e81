"""The classic pipeline experiment, measured and predicted side by side.

    python benchmarks/pipeline_classic.py [--cluster NAME|PROFILE.json] [--steps K] [--hidden H] [--seq-len S]

A 12-layer transformer split over 4 pipeline stages (3 layers each) on 4 ranks, the same
global batch of 12 sequences run two ways:
- 1 micro-batch of 12: plain model parallelism, one stage busy at a time;
- 12 micro-batches of 1: a pipeline (GPipe: 1F1B refuses fewer micro-batches than
  stages), stages busy at once after the fill.
Both run in one launch (`plan run`'s machinery, every step verified against one process).
The baseline is the 1-micro-batch run of the same launch; the script prints each
throughput and the speed-up, measured and predicted by the cost model on `--cluster` (a
preset, or a CPU profile from `plan profile`). GPipe's ideal speed-up with p stages and m
micro-batches is p m / (m + p - 1) = 3.2 here (Huang et al. 2019), and on a machine with
fewer cores than ranks the processes share cores, which caps what the measurement can show.
"""

from __future__ import annotations

import argparse
import os

from hardware_profiles import load_cluster
from planner.executor.prepare import prepare_case
from planner.executor.runner import RunOptions, run_plans
from planner.distributed.launch import LaunchSpec
from planner.specs import JobSpec, ModelSpec, Plan

STAGES, LAYERS, BATCH = 4, 12, 12


def cases(hidden: int, seq_len: int, steps: int):
    model = ModelSpec(
        name=f"gpt-{LAYERS}L-{hidden}h",
        num_layers=LAYERS,
        hidden_size=hidden,
        num_heads=max(1, hidden // 64),
        vocab_size=1024,
        max_seq_len=seq_len,
        dropout=False,
        param_dtype="fp32",
    )
    job = JobSpec(global_batch_size=BATCH, seq_len=seq_len, precision="fp32")
    out = []
    for micro_batches in (1, BATCH):
        plan = Plan(
            dp=1,
            tp=1,
            pp=STAGES,
            micro_batch_size=BATCH // micro_batches,
            num_micro_batches=micro_batches,
            schedule="gpipe",
        )
        out.append(prepare_case(model, job, plan, steps=steps, warmup=1))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", default="dgx-a100-80gb", help="preset name or hardware profile for the prediction")
    parser.add_argument("--steps", type=int, default=4, help="steps per case, the first a warm-up")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--seq-len", type=int, default=128)
    args = parser.parse_args()
    cluster = load_cluster(args.cluster)
    runs = cases(args.hidden, args.seq_len, args.steps)
    reports = run_plans(runs, [cluster] * len(runs), LaunchSpec(nproc_per_node=STAGES), RunOptions(timeout_s=300))
    model = runs[0].model
    print(
        f"{model.name}: {LAYERS} layers over {STAGES} pipeline stages on {STAGES} ranks ({os.cpu_count()} CPU cores), "
        f"global batch {BATCH} x {args.seq_len} tokens, GPipe; predicted on {cluster.name}"
    )
    print(
        f"{'micro-batches':>13} {'verified':>8} {'measured step':>14} {'measured tok/s':>15} {'predicted step':>15} "
        f"{'predicted tok/s':>16} {'predicted bubble':>17}"
    )
    for r in reports:
        est = r.estimate
        print(
            f"{r.plan.num_micro_batches:>13} {r.verdict:>8} {r.time.measured_step_time_s:>13.3f}s "
            f"{r.time.measured_tokens_per_s:>15,.0f} {est.step_time_s:>14.4f}s {est.tokens_per_s:>16,.0f} "
            f"{est.time_breakdown_s.pipeline_bubble / est.step_time_s:>16.0%}"
        )
    base, pipe = reports
    measured = pipe.time.measured_tokens_per_s / base.time.measured_tokens_per_s
    predicted = pipe.estimate.tokens_per_s / base.estimate.tokens_per_s
    ideal = STAGES * BATCH / (BATCH + STAGES - 1)
    cap = min(STAGES, os.cpu_count() or 1)
    print(
        f"speed-up of {BATCH} micro-batches over 1: measured {measured:.2f}x, predicted {predicted:.2f}x "
        f"(GPipe ideal {ideal:.2f}x; {cap} cores can run at most {cap} stages at once)"
    )
    print(
        f"measured / predicted throughput: 1 micro-batch {base.time.measured_tokens_per_s / base.estimate.tokens_per_s:.3g}, "
        f"{BATCH} micro-batches {pipe.time.measured_tokens_per_s / pipe.estimate.tokens_per_s:.3g}"
    )


if __name__ == "__main__":
    main()
