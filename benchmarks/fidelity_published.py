"""Predicted against published: every calibration run, the fitted constants, and
leave-one-group-out cross-validation against a naive estimator.

    python benchmarks/fidelity_published.py            # the table, the fit, the cross-validation
    python benchmarks/fidelity_published.py --write    # also write the fitted constants into the presets

The cost model's figures come from kernel-level public data (hardware_profiles/presets/*.json:
datasheet peaks, measured maximum GEMM throughput, FlashAttention kernel efficiencies, NCCL's
latency model). Three constants, each with a physical meaning, are fitted to the published runs
of benchmarks/published_cases.py (least squares in log(predicted / published), each group of
runs weighted equally, so that one large table does not decide the fit):

- sustained_fraction: throughput a training loop sustains relative to microbenchmarks
  (clocks under sustained power, synchronisation), multiplying GEMM and attention rates (one
  value for A100 and H100: a fraction per generation cross-validated worse);
- kernel_overhead_us: the gap per modelled operator (launches, casts and copies around it);
- overlap_efficiency: the fraction of overlapped communication that is free (1 - the
  slowdown compute suffers while a collective runs beside it).

Naive estimator: a constant fraction of peak FLOP/s (model FLOPs), fitted to the same runs.
Cross-validation: for each group, fit both on the other groups and predict it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # runnable as a script from anywhere
from benchmarks.published_cases import Case, cases  # noqa: E402
from cost_models import fit as fitlib  # noqa: E402
from cost_models.estimate import estimate  # noqa: E402
from cost_models.fit import NAMES  # noqa: E402
from hardware_profiles import PRESET_DIR  # noqa: E402


def with_constants(c: Case, theta) -> Case:
    """Case c with theta as the constants of its stack (cost_models/fit.py)."""
    return Case(c.name, c.group, c.model, fitlib.with_constants(c.cluster, c.job.target, theta), c.job, c.plan, c.metric,
                c.published, c.peak_memory_gib)


def predict(c: Case, theta=None):
    """(predicted metric, estimate) of case c with constants theta (None: as the presets ship)."""
    cc = with_constants(c, theta) if theta is not None else c
    est = estimate(cc.model, cc.cluster, cc.job, cc.plan)
    return c.predicted(est), est


def naive(c: Case, fraction: float, est) -> float:
    """A constant fraction of peak: model FLOPs per token at `fraction` of the dense peak."""
    peak = c.cluster.device.peak_tflops[c.job.precision] * 1e12
    flops_per_token = est.model_flops_per_step / (c.job.global_batch_size * c.job.seq_len)
    tokens = fraction * peak / flops_per_token
    if c.metric == "tokens_per_s_per_gpu":
        return tokens
    return fraction * peak / 1e12 * est.hardware_tflops_per_gpu / est.model_tflops_per_gpu


def _groups(cs):
    g = defaultdict(list)
    for c in cs:
        g[c.group].append(c)
    return g


def residuals(cs):
    """The runs' (group, log(predicted / published)) as a function of the constants."""
    return lambda theta: ((c.group, math.log(predict(c, theta)[0] / c.published)) for c in cs)


def fit(cs, sweeps: int = 3):
    """The constants that fit runs cs best (cost_models/fit.py:fit_constants)."""
    return fitlib.fit_constants(residuals(cs), sweeps)


def fit_naive(cs) -> float:
    """Geometric-mean fraction of peak that reproduces the runs (groups weighted equally)."""
    per = defaultdict(list)
    for c in cs:
        _, est = predict(c)
        per[c.group].append(math.log(c.published / naive(c, 1.0, est)))
    return math.exp(sum(sum(v) / len(v) for v in per.values()) / len(per))


def mape(pairs) -> float:
    return 100 * sum(abs(p / q - 1) for p, q in pairs) / len(pairs)


def per_term_widths(resid, comm_share) -> tuple[float, float]:
    """(sd_compute, sd_communication) maximising the likelihood of the residuals under
    log(predicted / published) ~ N(0, ((1 - f) sd_c)^2 + (f sd_m)^2), f a run's communication
    share, with sd_c <= sd_m <= ln 2 (communication figures come from microbenchmarks on idle
    networks: never more certain than compute; exposed communication is what is left of a
    collective once compute hides part of it, so a factor 2 at one sd is a wide but physical
    bound, which the runs, at most ~15% communication, cannot pin down further). Grid search."""
    def nll(sc, sm):
        tot = 0.0
        for r, f in zip(resid, comm_share):
            var = ((1 - f) * sc) ** 2 + (f * sm) ** 2
            tot += 0.5 * math.log(var) + r * r / (2 * var)
        return tot
    grid = [0.005 * i for i in range(1, 139)]  # 0.005 .. 0.69 = ln 2
    return min(((sc, sm) for sc in grid for sm in grid if sm >= sc), key=lambda x: nll(*x))


def coverage_scale(resid, comm_share, sds, coverage: float) -> float:
    """The factor k such that `coverage` of the runs lie within k x their predicted sd: the
    intervals then hold the stated share of held-out runs whatever the residuals' shape."""
    z = sorted(abs(r) / math.hypot((1 - f) * sds[0], f * sds[1]) for r, f in zip(resid, comm_share))
    return z[min(len(z) - 1, math.ceil(coverage * len(z)) - 1)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="write the fitted constants into hardware_profiles/presets")
    args = ap.parse_args()
    cs, skipped = cases()
    groups = _groups(cs)
    theta = fit(cs)
    frac = fit_naive(cs)
    print("fitted on all", len(cs), "runs:", ", ".join(f"{n} {v:.3f}" for n, v in zip(NAMES, theta)),
          f"| naive: {frac:.3f} of peak")
    print(f"\n{'run':64s} {'metric':9s} {'published':>10s} {'model':>8s} {'naive':>7s}  compute  tp   pp  bubble dp-exp  fits")
    for c in cs:
        p, est = predict(c, theta)
        b, t = est.time_breakdown_s, est.step_time_s

        def share(x, t=t):
            return f"{100 * x / t:4.0f}%"
        fits = "yes" if est.fits else "NO"
        print(f"{c.name[:64]:64s} {'tok/s' if c.metric.startswith('tokens') else 'hw TF/s':9s} {c.published:10.1f} "
              f"{p / c.published:8.2f} {naive(c, frac, est) / c.published:7.2f}  {share(b.compute + b.recompute)} "
              f"{share(b.tp_communication)} {share(b.pp_communication)} {share(b.pipeline_bubble)} "
              f"{share(b.dp_communication_exposed)}  {fits} {est.peak_memory_gib:.1f}/{est.memory_capacity_gib:.0f}")

    print("\nleave-one-group-out cross-validation (fit without the group, predict it); ratio = predicted / published")
    print(f"{'group':26s} {'runs':>4s} {'fitted on the others':44s} {'model MAPE':>10s} {'naive MAPE':>10s}  better")
    resid, comm_share = [], []
    for g, gcs in groups.items():
        rest = [c for c in cs if c.group != g]
        th = fit(rest, sweeps=2)
        fr = fit_naive(rest)
        model_pairs, naive_pairs = [], []
        for c in gcs:
            p, est = predict(c, th)
            model_pairs.append((p, c.published))
            naive_pairs.append((naive(c, fr, est), c.published))
            resid.append(math.log(p / c.published))
            b = est.time_breakdown_s
            comm_share.append((b.tp_communication + b.pp_communication + b.dp_communication_exposed) / est.step_time_s)
        m, n = mape(model_pairs), mape(naive_pairs)
        consts = " ".join(f"{v:.3f}" for v in th)
        print(f"{g:26s} {len(gcs):4d} {consts:44s} {m:9.1f}% {n:9.1f}%  {'yes' if m < n else 'NO'}")
    per_term = per_term_widths(resid, comm_share)
    print(f"\nper-term error (maximum likelihood on the cross-validated residuals, communication no more certain than "
          f"compute): compute {per_term[0]:.3f}, communication {per_term[1]:.3f} (log sd; from {len(resid)} runs whose "
          f"communication share is at most {100 * max(comm_share):.0f}%, so the communication figure is weakly determined"
          + (", at its bound ln 2)" if per_term[1] >= 0.69 else ")"))
    k = coverage_scale(resid, comm_share, per_term, 0.8)
    a_c, a_m = k * per_term[0], k * per_term[1]
    print(f"per-term intervals at 80% coverage of the held-out runs: compute x/ {math.exp(a_c):.3f}, "
          f"communication x/ {math.exp(a_m):.3f}")
    resid.sort(key=abs)
    q80 = abs(resid[int(0.8 * (len(resid) - 1))])
    print(f"cross-validated |log ratio|: median {abs(resid[len(resid) // 2]):.3f}, 80th percentile {q80:.3f} "
          f"(one interval for every plan at 80% coverage: x/ {math.exp(q80):.3f})")
    print(f"\nexcluded {len(skipped)} records:")
    why = defaultdict(int)
    for _, w in skipped:
        why[w] += 1
    for w, k in sorted(why.items(), key=lambda x: -x[1]):
        print(f"  {k:3d}  {w}")
    if args.write:
        for f in sorted(PRESET_DIR.glob("*.json")):
            data = json.loads(f.read_text())
            data["device"]["sustained_fraction"] = round(theta[0], 4)
            data["device"]["kernel_overhead_us"] = round(theta[1], 3)
            data["overlap_efficiency"] = round(theta[2], 4)
            data["uncertainty"] = {"relative": round(math.exp(q80) - 1, 4), "coverage": 0.8,
                                   "compute": round(math.exp(a_c) - 1, 4), "communication": round(math.exp(a_m) - 1, 4)}
            f.write_text(json.dumps(data, indent=2) + "\n")
        print("wrote the constants into", PRESET_DIR)


if __name__ == "__main__":
    main()
