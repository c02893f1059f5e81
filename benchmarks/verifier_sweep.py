"""Does `plan run`'s verifier tell correct plans from wrong ones? Both sides, measured.

    python benchmarks/verifier_sweep.py [--cases N] [--steps S] [--json FILE]

1. No false failure: N correct (model, plan, seed, learning rate) cases covering every parallel
   dimension the executor runs (DP with ZeRO 0-3, TP, SP, PP with GPipe / 1F1B / interleaved
   1F1B, CP, EP, recompute, and their products on 4 processes), seeds and learning rates drawn
   from a seeded generator, each trained S steps and verified against the single-process
   reference. Every one must pass.
2. Every injected error caught: each fault of planner.executor.train.FAULTS (a lost gradient
   shard, a wrong reduction scale, a layer on the wrong stage, micro-batches read one late)
   injected into every layout where it is meaningful. Every one must fail.

It also replays the verifier of the previous release (a fixed tolerance of 1e-5 x (1 + step/10)
on the loss and the global gradient norm against the fp32 reference, no per-parameter or layout
check) on the same runs, to show what it got wrong. Exits 1 if
a correct case fails or a fault passes. Two launches (2 and 4 processes), a few minutes on a
2-core machine.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.executor.verify import SENSITIVITY  # noqa: E402
from planner.specs import JobSpec, ModelSpec, Plan, StageRecompute  # noqa: E402

SEQ, BATCH = 32, 8
JOB = JobSpec(global_batch_size=BATCH, seq_len=SEQ, precision="fp32")
_TINY = dict(
    num_layers=4, hidden_size=64, num_heads=4, vocab_size=256, max_seq_len=SEQ, param_dtype="fp32", dropout=False
)
MODELS = {
    "gpt": ModelSpec(name="tiny-gpt", **_TINY),  # GELU, learned positions, LayerNorm, biases, tied
    "llama": ModelSpec(
        name="tiny-llama",
        **_TINY
        | dict(
            num_kv_heads=2,
            activation="swiglu",
            learned_position_embeddings=False,
            linear_bias=False,
            norm="rmsnorm",
            tied_embeddings=True,
        ),
    ),
    "wide": ModelSpec(
        name="wide-llama",
        **_TINY
        | dict(
            num_layers=6,
            hidden_size=128,
            num_heads=8,
            num_kv_heads=2,
            vocab_size=512,
            activation="swiglu",
            learned_position_embeddings=False,
            linear_bias=False,
            norm="rmsnorm",
        ),
    ),
    "moe": ModelSpec(
        name="tiny-moe",
        **_TINY
        | dict(
            num_kv_heads=2,
            activation="swiglu",
            learned_position_embeddings=False,
            linear_bias=False,
            norm="rmsnorm",
            num_experts=4,
            experts_per_token=2,
            moe_ffn_hidden_size=96,
            num_shared_experts=1,
            first_dense_layers=1,
        ),
    ),
}


def _plan(**kw) -> Plan:
    p = dict(dp=1, tp=1, pp=1, micro_batch_size=1) | kw
    p.setdefault("num_micro_batches", BATCH // (p["dp"] * p["micro_batch_size"]))
    return Plan(**p)


# (name, model, plan): every parallel dimension, alone and in products.
LAYOUTS = {
    2: [
        ("dp2 ddp", "gpt", _plan(dp=2, micro_batch_size=2)),
        ("dp2 zero1", "llama", _plan(dp=2, micro_batch_size=2, zero_stage=1)),
        ("dp2 zero2", "gpt", _plan(dp=2, micro_batch_size=1, zero_stage=2)),
        ("dp2 zero3 tied", "llama", _plan(dp=2, micro_batch_size=2, zero_stage=3)),
        ("dp2 full recompute", "wide", _plan(dp=2, micro_batch_size=4, recompute="full")),
        ("tp2", "gpt", _plan(tp=2, micro_batch_size=4)),
        ("tp2 sp", "llama", _plan(tp=2, micro_batch_size=2, sequence_parallel=True)),
        ("tp2 sp selective", "wide", _plan(tp=2, micro_batch_size=4, sequence_parallel=True, recompute="selective")),
        ("pp2 gpipe", "gpt", _plan(pp=2, micro_batch_size=2, schedule="gpipe")),
        ("pp2 1f1b uneven", "wide", _plan(pp=2, micro_batch_size=2, layers_per_stage=[2, 4])),
        ("pp2 interleaved", "llama", _plan(pp=2, vpp=2, micro_batch_size=2, schedule="interleaved-1f1b")),
        (
            "pp2 mixed recompute",
            "gpt",
            _plan(
                pp=2,
                micro_batch_size=2,
                layers_per_stage=[1, 3],
                stage_recompute=[StageRecompute(full=1), StageRecompute(none=1, selective=1, full=1)],
            ),
        ),
        ("cp2", "llama", _plan(cp=2, micro_batch_size=2, num_micro_batches=4)),
        ("cp2 gpt", "gpt", _plan(cp=2, micro_batch_size=4, num_micro_batches=2)),
        ("dp2 ep2", "moe", _plan(dp=2, ep=2, micro_batch_size=2)),
        ("dp2 ep2 zero1", "moe", _plan(dp=2, ep=2, micro_batch_size=1, zero_stage=1)),
    ],
    4: [
        ("dp2 tp2 zero1 sp", "gpt", _plan(dp=2, tp=2, micro_batch_size=2, zero_stage=1, sequence_parallel=True)),
        ("dp2 tp2 zero3 sp", "llama", _plan(dp=2, tp=2, micro_batch_size=2, zero_stage=3, sequence_parallel=True)),
        ("dp2 pp2 zero1", "wide", _plan(dp=2, pp=2, micro_batch_size=1, zero_stage=1)),
        ("dp2 pp2 zero3", "gpt", _plan(dp=2, pp=2, micro_batch_size=2, zero_stage=3)),
        ("tp2 pp2 sp", "wide", _plan(tp=2, pp=2, micro_batch_size=2, sequence_parallel=True)),
        ("pp4 1f1b", "llama", _plan(pp=4, micro_batch_size=2)),
        ("dp4 zero2", "gpt", _plan(dp=4, micro_batch_size=1, zero_stage=2)),
        ("dp2 cp2", "llama", _plan(dp=2, cp=2, micro_batch_size=2, num_micro_batches=2)),
        ("cp2 tp2", "gpt", _plan(cp=2, tp=2, micro_batch_size=2, num_micro_batches=4)),
        ("dp4 ep4", "moe", _plan(dp=4, ep=4, micro_batch_size=2)),
        ("dp2 pp2 ep2", "moe", _plan(dp=2, pp=2, ep=2, micro_batch_size=2)),
        ("dp2 pp2 vpp2 interleaved", "wide", _plan(dp=2, pp=2, vpp=2, micro_batch_size=1, schedule="interleaved-1f1b")),
    ],
}
LEARNING_RATES = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2)


def applies(fault: str, plan: Plan) -> bool:
    """Where a fault is a real error: a layer on the wrong stage needs two stages, micro-batches
    read one late need two of them in the step, a lost shard or scale anything."""
    if fault == "wrong-stage":
        return plan.pp > 1 and plan.stage_recompute is None
    if fault == "micro-batch":
        return plan.dp * plan.num_micro_batches >= 2
    return True


def build_cases(n: int, steps: int, rng: random.Random) -> dict[int, list[dict]]:
    """Per world size: n correct cases (round robin over the layouts, random seed and lr) and
    one case per (fault, layout) where the fault applies."""
    from planner.executor.train import FAULTS

    layouts = [(w, *layout) for w in sorted(LAYOUTS) for layout in LAYOUTS[w]]
    out: dict[int, list[dict]] = {w: [] for w in LAYOUTS}

    def case(world, name, model, plan, fault):
        seed, lr = rng.randrange(100), rng.choice(LEARNING_RATES)
        out[world].append(
            dict(
                name=name,
                model=json.loads(MODELS[model].model_dump_json()),
                job=json.loads(JOB.model_dump_json()),
                plan=json.loads(plan.model_dump_json()),
                steps=steps,
                warmup=1,
                seed=seed,
                learning_rate=lr,
                fault=fault,
            )
        )

    for i in range(n):
        case(*layouts[i % len(layouts)], None)
    for fault in FAULTS:
        for world, name, model, plan in layouts:
            if applies(fault, plan):
                case(world, name, model, plan, fault)
    return out


def run(world: int, items: list[dict], timeout_s: float) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "cases.json", Path(tmp) / "reports.json"
        src.write_text(json.dumps([{k: v for k, v in it.items() if k != "name"} for it in items]))
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "planner.executor.batch",
                str(src),
                str(dst),
                "--nproc-per-node",
                str(world),
                "--timeout",
                "60",
            ],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        if proc.returncode != 0:
            sys.exit(f"launch of {world} processes failed: {proc.stderr[-2000:]}")
        return json.loads(dst.read_text())


def old_verdict(v: dict) -> bool:
    """The previous release's rule: 1e-5 x (1 + step/10) on loss and global norm only."""
    ok = lambda a, b, i: abs(a - b) <= 1e-5 * (1 + i / 10) * abs(b)  # noqa: E731
    return all(ok(a, b, i) for i, (a, b) in enumerate(zip(v["losses"], v["fp32_reference_losses"]))) and all(
        ok(a, b, i) for i, (a, b) in enumerate(zip(v["grad_norms"], v["fp32_reference_grad_norms"]))
    )


def drift_ratio(v: dict) -> float:
    """Largest (difference - tolerance) / (the fp32 reference's drift so far) after step 0, over
    the loss and the global norm: how far SENSITIVITY is from being needed."""
    out = 0.0
    for got, want, drift in (
        (v["losses"], v["reference_losses"], v["reference_drift_losses"]),
        (v["grad_norms"], v["reference_grad_norms"], v["reference_drift_grad_norms"]),
    ):
        top = 0.0
        for i, (a, b, d) in enumerate(zip(got, want, drift)):
            top = max(top, d)
            if i and top > 0:
                out = max(out, (abs(a - b) / abs(b) - v["tolerance"]) / top)
    return out


def caught_by(message: str) -> str:
    """Which check failed, from the verifier's one line."""
    if message.startswith("rank "):
        return "layout"
    step, _, what = message.partition(": ")
    kind = (
        "parameter"
        if what.startswith("gradient norm of")
        else what.split(" ")[0]
        if what.startswith("loss")
        else "norm"
    )
    return f"{step} {kind}"


def used(v: dict) -> float:
    """Largest fraction of its allowance a check used (loss, global norm, step 0's parameters; > 1 fails)."""
    fr = []
    for got, want, allow in (
        (v["losses"], v["reference_losses"], v["allowed_loss_rel_error"]),
        (v["grad_norms"], v["reference_grad_norms"], v["allowed_grad_norm_rel_error"]),
    ):
        fr += [abs(a - b) / abs(b) / ok for a, b, ok in zip(got, want, allow)]
    return max(fr + [v["max_param_grad_rel_error"] / v["allowed_param_grad_rel_error"]])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=56, help="correct cases (at least 50 for the claim)")
    ap.add_argument("--steps", type=int, default=6, help="steps per case (plan run's default is 5)")
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--json", help="write every case's verdict here")
    args = ap.parse_args()
    t0 = time.time()
    by_world = build_cases(args.cases, args.steps, random.Random(args.seed))
    rows = []
    for world, items in by_world.items():
        for it, rep in zip(items, run(world, items, 1800)):
            rows.append(
                dict(
                    world=world,
                    name=it["name"],
                    seed=it["seed"],
                    lr=it["learning_rate"],
                    fault=it["fault"],
                    verdict=rep["verdict"],
                    old=old_verdict(rep["verification"]),
                    used=used(rep["verification"]),
                    drift=drift_ratio(rep["verification"]),
                    message=rep["verification"]["message"],
                )
            )
    clean = [r for r in rows if r["fault"] is None]
    faults = [r for r in rows if r["fault"] is not None]
    false_fail = [r for r in clean if r["verdict"] != "pass"]
    missed = [r for r in faults if r["verdict"] == "pass"]
    print(
        f"verifier sweep: {len(clean)} correct cases and {len(faults)} injected errors, {args.steps} steps each, "
        f"{time.time() - t0:.0f} s"
    )
    print(
        f"correct cases: {len(clean) - len(false_fail)}/{len(clean)} pass (false FAIL rate {len(false_fail) / len(clean):.0%}); "
        f"largest share of the allowance used: {max(r['used'] for r in clean):.2f}; largest drift against the fp32 "
        f"reference's: {max(r['drift'] for r in clean):.2f}x (allowed {SENSITIVITY:g}x); "
        f"the previous rule fails {sum(not r['old'] for r in clean)} of them"
    )
    for fault in dict.fromkeys(r["fault"] for r in faults):
        mine = [r for r in faults if r["fault"] == fault]
        caught = [r for r in mine if r["verdict"] == "fail"]
        how = Counter(caught_by(r["message"]) for r in caught)
        numeric = [r["used"] for r in caught if caught_by(r["message"]) != "layout"]
        print(
            f"fault {fault:16s}: {len(caught)}/{len(mine)} caught (previous rule: {sum(not r['old'] for r in mine)}/{len(mine)}); "
            f"by {', '.join(f'{k} {n}' for k, n in how.most_common())}"
            + (f"; smallest overshoot {min(numeric):.3g}x the allowance" if numeric else "")
        )
    for r in false_fail + missed:
        print(
            f"  WRONG: {r['world']} processes, {r['name']}, seed {r['seed']}, lr {r['lr']:g}, fault {r['fault']}: {r['message']}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 1 if false_fail or missed else 0


if __name__ == "__main__":
    sys.exit(main())
