"""Predicted against published: every calibration run the cost model covers.

    python benchmarks/calibration.py

Prints, per run, the published figure, our prediction and their ratio, then the
geometric-mean ratio and the worst ratio. tests/test_calibration.py asserts the same
ratios stay within the tolerance stated in the README.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # runnable as a script from anywhere
from benchmarks.calibration_cases import CASES, EXCLUDED, MEMORY_CASES, load_records, run_case  # noqa: E402


def main() -> None:
    records = load_records()
    rows = [run_case(c, records) for c in CASES + MEMORY_CASES]
    print(f"{'run':78s} {'metric':24s} {'published':>10s} {'predicted':>10s} {'ratio':>6s}")
    for r in rows:
        print(f"{r.case.record[:78]:78s} {r.case.metric:24s} {r.published:10.3f} {r.predicted:10.3f} {r.ratio:6.2f}")
    thr = [r for r in rows if r.case.metric != "peak_memory_gib" and "h100-500w" not in r.case.tags]
    gm = math.exp(sum(math.log(r.ratio) for r in thr) / len(thr))
    worst = max(thr, key=lambda r: abs(math.log(r.ratio)))
    print(f"\nthroughput, A100 runs: geometric-mean ratio {gm:.3f}, worst {worst.ratio:.3f} ({worst.case.record})")
    print("excluded:", "; ".join(f"{k}: {v}" for k, v in EXCLUDED.items()))


if __name__ == "__main__":
    main()
