"""The planner's recommendation against the practitioners' published layout, same model and batch.

    python benchmarks/recommendations.py

For each setting: `plan solve` (target megatron: Transformer Engine kernels and TP overlap, as
the practitioners ran) and the estimate of the published layout; the speed-up and whether the
two step-time intervals overlap (then the prediction cannot tell them apart).
Practitioners' layouts (layouts only; their throughputs are held out and never used here):
GPT-3 175B on 1,024 A100 and the 530B model on 2,240 A100 as Megatron-LM ran them (TP 8 PP 16,
batch 1,536; TP 8 PP 35, batch 1,920); Llama 3 70B as NVIDIA's DGX Cloud recipe lays it out
(TP 4 PP 4 VP 5) without its context parallelism, which the cost model does not cover yet;
Llama 3 405B on 1,024 H100 in the shape Meta published for 8K-token pre-training (TP 8, PP 16,
micro-batch 1, no context parallelism: Dubey et al. 2024, table 4; layout only), with the layer
split and per-stage recompute our search finds for that shape (the paper's own uneven split and
schedule changes are not stated in enough detail to copy).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # runnable as a script from anywhere
from cost_models.estimate import estimate  # noqa: E402
from hardware_profiles import load_cluster  # noqa: E402
from planner.cli.render import plan_summary  # noqa: E402
from planner.presets import load_model  # noqa: E402
from planner.search.candidates import SearchSpace  # noqa: E402
from planner.search.solve import solve  # noqa: E402
from planner.specs import Axis, JobSpec, ModelSpec, Plan, Schedule  # noqa: E402
from benchmarks.stack_recommendations import largest_saving  # noqa: E402

MT_NLG = ModelSpec(
    name="530b",
    num_layers=105,
    hidden_size=20480,
    num_heads=128,
    vocab_size=51200,
    max_seq_len=2048,
    dropout=False,
    source="Smith et al. 2022 (MT-NLG), model dimensions",
)
SETTINGS = [
    (
        "GPT-3 175B, 1,024 A100",
        "gpt3-175b",
        "dgx-a100-80gb",
        1024,
        1536,
        2048,
        dict(
            dp=8,
            tp=8,
            pp=16,
            vpp=1,
            micro_batch_size=1,
            num_micro_batches=192,
            sequence_parallel=True,
            zero_stage=1,
            recompute="selective",
        ),
    ),
    (
        "530B, 2,240 A100",
        MT_NLG,
        "dgx-a100-80gb",
        2240,
        1920,
        2048,
        dict(
            dp=8,
            tp=8,
            pp=35,
            vpp=1,
            micro_batch_size=1,
            num_micro_batches=240,
            sequence_parallel=True,
            zero_stage=1,
            recompute="selective",
        ),
    ),
    (
        "Llama 3 70B, 512 H100",
        "llama3-70b",
        "dgx-h100-80gb",
        512,
        1024,
        8192,
        dict(
            dp=32,
            tp=4,
            pp=4,
            vpp=5,
            micro_batch_size=1,
            num_micro_batches=32,
            sequence_parallel=True,
            zero_stage=1,
            schedule="interleaved-1f1b",
            tp_comm_overlap=True,
        ),
    ),
    (
        "Llama 3 405B, 1,024 H100",
        "llama3-405b",
        "dgx-h100-80gb",
        1024,
        512,
        8192,
        dict(tp=8, pp=16, vpp=1, micro_batch_size=1, sequence_parallel=True, zero_stage=1, tp_comm_overlap=True),
    ),
]


def main() -> None:
    print(f"{'setting':26s} {'step s':>8s} {'interval s':>15s} {'MFU':>6s}  layout")
    for title, model, cluster_name, gpus, batch, seq, practice in SETTINGS:
        model = load_model(model) if isinstance(model, str) else model
        cluster = load_cluster(cluster_name)
        job = JobSpec(global_batch_size=batch, seq_len=seq, target="megatron")
        res = solve(
            model,
            cluster,
            job,
            SearchSpace(num_gpus=gpus, global_batch_size=batch, tp_comm_overlap=(False, True)),
            top_k=1,
        )
        if "dp" in practice:
            practice_plan = Plan(**practice)
        else:  # a published shape: its best split and recompute under the cost model
            fixed = dict(practice, schedule=Schedule.one_f_one_b, mesh_order=(Axis.tp, Axis.dp, Axis.pp))
            space = SearchSpace(num_gpus=gpus, global_batch_size=batch, fixed=fixed, tp_comm_overlap=(True,))
            practice_plan = solve(model, cluster, job, space, top_k=0).best.plan
        ref = estimate(model, cluster, job, practice_plan)
        best = res.best.estimate
        for name, plan, est in (("planner", res.best.plan, best), ("practice", practice_plan, ref)):
            lo, hi = est.step_time_interval_s
            fits = "" if est.fits else " (does not fit)"
            print(
                f"{title if name == 'planner' else '':26s} {est.step_time_s:8.2f} {lo:7.2f}-{hi:7.2f} "
                f"{100 * est.mfu:5.1f}%  {name}: {plan_summary(plan)}{fits}"
            )
        overlap = best.step_time_interval_s[1] >= ref.step_time_interval_s[0]
        term, saved = largest_saving(best, ref)
        print(
            f"{'':26s} speed-up {ref.step_time_s / best.step_time_s:.2f}x; intervals "
            f"{'overlap: not a proven win' if overlap else 'apart'}; largest saving: {term.replace('_', ' ')} "
            f"({saved:.2f} s)\n"
        )


if __name__ == "__main__":
    main()
