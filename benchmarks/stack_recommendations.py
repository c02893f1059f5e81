"""`plan solve` per training stack: the same job searched for Megatron and for torchtitan, each with its
own constants (fitted on its own runs: benchmarks/fidelity_published.py) and its own rules.

    python benchmarks/stack_recommendations.py

For each setting and stack: the recommended plan, its step time and interval, and the term that
decides it: against the fastest plan of another shape (tp, pp, ZeRO stage or recompute), the
component of the step time where the recommendation saves most. Then, between the two stacks'
recommendations, the term that separates them.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # runnable as a script from anywhere
from hardware_profiles import load_cluster  # noqa: E402
from planner.cli.render import plan_summary  # noqa: E402
from planner.presets import load_model  # noqa: E402
from planner.search.candidates import SearchSpace  # noqa: E402
from planner.search.solve import solve  # noqa: E402
from planner.search.stacks import target_space  # noqa: E402
from planner.specs import JobSpec  # noqa: E402

SETTINGS = [
    ("GPT-3 175B, 1,024 A100 80GB", "gpt3-175b", "dgx-a100-80gb", 1024, 1536, 2048),
    ("Llama 3 405B, 2,048 H100", "llama3-405b", "dgx-h100-80gb", 2048, 2048, 8192),
]
TARGETS = ("megatron", "torchtitan")


def shape(plan) -> tuple:
    return plan.tp, plan.pp, plan.zero_stage, plan.recompute.value


def largest_saving(best, other) -> tuple[str, float]:
    """The component of the step time (Estimate.time_breakdown_s) where estimate `best` saves
    most against estimate `other`, and the seconds saved."""
    a, b = best.time_breakdown_s, other.time_breakdown_s
    return max(((t, getattr(b, t) - getattr(a, t)) for t in type(a).model_fields), key=lambda x: x[1])


def deciding_term(best, other) -> tuple[str, float]:
    """The component where found plan `best` saves most against `other` (seconds saved)."""
    return largest_saving(best.estimate, other.estimate)


def main() -> None:
    for title, model_name, cluster_name, gpus, batch, seq in SETTINGS:
        model, cluster = load_model(model_name), load_cluster(cluster_name)
        print(f"\n{title}: global batch {batch} x {seq} tokens")
        best = {}
        for target in TARGETS:
            job = JobSpec(global_batch_size=batch, seq_len=seq, target=target)
            base = SearchSpace(num_gpus=gpus, global_batch_size=batch, tp_comm_overlap=(False, True))
            res = solve(model, cluster, job, target_space(base, model, job), top_k=12)
            b = res.best
            best[target] = b
            est = b.estimate
            lo, hi = est.step_time_interval_s
            k = cluster.for_target(target).stack_constants.get(job.target)
            print(
                f"  --target {target:10s} {est.step_time_s:7.2f} s ({lo:.2f}-{hi:.2f}) MFU {100 * est.mfu:4.1f}%  "
                f"{plan_summary(b.plan)}"
            )
            if k is not None:
                host = f", host {1000 * k.step_overhead_s:.0f} ms a step" if k.step_overhead_s else ""
                print(
                    f"  {'':21s} constants: sustained {k.sustained_fraction:.3f}, gap {k.kernel_overhead_us:.2f} us, "
                    f"overlap {k.overlap_efficiency:.3f}{host}"
                )
            others = [a for a in res.alternatives if shape(a.plan) != shape(b.plan)]
            if others:
                o = others[0]
                term, saved = deciding_term(b, o)
                if (
                    o.estimate.step_time_s < est.step_time_s
                ):  # the recommendation rule's best worst case (planner/search/solve.py)
                    print(
                        f"  {'':21s} recommended over a faster-predicted shape for its lower worst case ({hi:.2f} s against "
                        f"{o.estimate.step_time_interval_s[1]:.2f} s), and by {term.replace('_', ' ')} ({saved:.2f} s saved) "
                        f"against it ({o.estimate.step_time_s:.2f} s: {plan_summary(o.plan)})"
                    )
                else:
                    print(
                        f"  {'':21s} decided by {term.replace('_', ' ')}: {saved:.2f} s saved against the best other shape "
                        f"({o.estimate.step_time_s:.2f} s: {plan_summary(o.plan)})"
                    )
            else:
                print(f"  {'':21s} every alternative among the 12 next has the same tp, pp, ZeRO and recompute")
        m, t = best["megatron"], best["torchtitan"]
        term, saved = deciding_term(m, t) if m.estimate.step_time_s <= t.estimate.step_time_s else deciding_term(t, m)
        print(
            f"  megatron / torchtitan step {m.estimate.step_time_s / t.estimate.step_time_s:.3f}; the stacks differ most in "
            f"{term.replace('_', ' ')} ({saved:.2f} s)"
        )


if __name__ == "__main__":
    main()
