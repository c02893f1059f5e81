"""Run several plans in one launch, for tests and benchmarks (`plan run` runs one).

    python -m planner.executor.batch CASES.json REPORTS.json --nproc-per-node N [--timeout S]

CASES.json is a list of objects with `model`, `job`, `plan` (as in a plan file), `cluster`
(a preset name or a hardware-profile object) and optionally `steps`, `warmup`, `seed`,
`learning_rate`, `tolerance` and `fault` (an error to inject, planner.executor.train.FAULTS: the
verifier's own tests). REPORTS.json receives the list of RunReports, in order. Worker start-up
(importing torch) is paid once for the whole list. Exit codes as `plan`: 2 bad input,
1 a failure, 0 otherwise (verdicts are in the reports).
"""

from __future__ import annotations

import argparse
import json
import sys

from planner.datafile import write_atomic
from planner.errors import PlannerError, UsageError
from planner.executor.prepare import prepare_case
from planner.executor.runner import RunOptions, run_plans
from planner.executor.verify import DEFAULT_TOLERANCE
from planner.distributed.launch import LaunchSpec
from planner.specs import ClusterSpec, JobSpec, ModelSpec, Plan


def _cluster(value) -> ClusterSpec:
    if isinstance(value, str):
        from hardware_profiles import load_cluster

        return load_cluster(value)
    return ClusterSpec.model_validate(value)


def _fault(name):
    from planner.executor.train import FAULTS

    if name is not None and name not in FAULTS:
        raise UsageError(f"fault {name!r}: expected one of {', '.join(FAULTS)}")
    return name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases")
    parser.add_argument("reports")
    parser.add_argument("--nproc-per-node", type=int, required=True)
    parser.add_argument("--timeout", type=float, default=120.0, help="process-group timeout, seconds")
    args = parser.parse_args(argv)
    try:
        items = json.loads(open(args.cases).read())
        cases = [
            prepare_case(
                ModelSpec.model_validate(it["model"]),
                JobSpec.model_validate(it["job"]),
                Plan.model_validate(it["plan"]),
                steps=it.get("steps", 4),
                warmup=it.get("warmup", 1),
                seed=it.get("seed", 0),
                learning_rate=it.get("learning_rate", 1e-3),
            )
            for it in items
        ]
        clusters = [_cluster(it.get("cluster", "dgx-a100-80gb")) for it in items]
        tolerance = min(it.get("tolerance", DEFAULT_TOLERANCE) for it in items)
        faults = tuple(_fault(it.get("fault")) for it in items)
        options = RunOptions(tolerance, args.timeout, faults=faults)
        reports = run_plans(cases, clusters, LaunchSpec(nproc_per_node=args.nproc_per_node), options)
    except PlannerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    write_atomic(args.reports, json.dumps([json.loads(r.model_dump_json()) for r in reports], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
