"""Behaviour unchanged: `plan solve --json` answers the same documents as another git revision.

    python benchmarks/same_answers.py --baseline GIT-REV [--size N] [--timeout S]

For the README's quick start and the first N instances (default 12) of
benchmarks/solve_population.py's seeded population (its memory-tight limits as `--max-memory-gib`,
random models as spec files), runs `plan solve --json` (every stack) with the code of this tree
and with REV's (a temporary worktree), drops what measures the machine rather than the answer
(each search's `solve_time_s`), and compares the documents field by field. Prints one line per
instance (the first differing field where one differs) and last
`same answers: K of N documents equal to REV's`; exits 1 where one differs. For a refactor that
must change nothing (issue 42); a deliberate change of the cost model shows here first.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.solve_population import arg, finish, population, worktree  # noqa: E402

QUICK_START = dict(model="gpt3-175b", cluster="dgx-a100-80gb", gpus=1024, batch=1536, seq=2048)
MACHINE_FIELDS = ("solve_time_s",)


def argv_of(case: dict, work: Path, i: int) -> list[str]:
    model = case["model"]
    if isinstance(model, dict):  # a random model: a spec file both trees read
        path = work / f"model-{i}.json"
        path.write_text(json.dumps(model))
        model = str(path)
    out = ["solve", "--model", model, "--cluster", case["cluster"], "--gpus", str(case["gpus"])]
    out += ["--global-batch", str(case["batch"]), "--seq-len", str(case["seq"]), "--json"]
    return out + (["--max-memory-gib", repr(case["limit"])] if case.get("limit") else [])


def answer(tree: Path, argv: list[str], timeout: float):
    """The document `plan solve` prints in `tree`, without the machine's fields; or its error line."""
    try:
        res = subprocess.run(
            [sys.executable, "-m", "planner.cli.main", *argv], cwd=tree, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return {"timeout": timeout}
    if res.returncode != 0:
        return {"exit": res.returncode, "error": res.stderr.strip()}
    return strip(json.loads(res.stdout))


def strip(doc):
    if isinstance(doc, dict):
        return {k: strip(v) for k, v in doc.items() if k not in MACHINE_FIELDS}
    if isinstance(doc, list):
        return [strip(v) for v in doc]
    return doc


def first_difference(a, b, path: str = "") -> str | None:
    if type(a) is not type(b):
        return f"{path or '.'}: {type(a).__name__} against {type(b).__name__}"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{path}.{k}: only in {'this tree' if k in a else 'the baseline'}"
            d = first_difference(a[k], b[k], f"{path}.{k}")
            if d:
                return d
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} items against {len(b)}"
        return next((d for i, (x, y) in enumerate(zip(a, b)) if (d := first_difference(x, y, f"{path}[{i}]"))), None)
    return None if a == b else f"{path}: {a!r} against {b!r}"


def main() -> None:
    if "--baseline" not in sys.argv:
        sys.exit("usage: python benchmarks/same_answers.py --baseline GIT-REV [--size N] [--timeout S]")
    rev, size, timeout = arg("--baseline", ""), arg("--size", 12), arg("--timeout", 120.0)
    cases = [QUICK_START] + [finish(c) for c in population(22, size)]
    with tempfile.TemporaryDirectory() as tmp, worktree(rev) as base:
        work, same = Path(tmp), 0
        for i, case in enumerate(cases):
            argv = argv_of(case, work, i)
            diff = first_difference(answer(ROOT, argv, timeout), answer(base, argv, timeout))
            same += diff is None
            name = case["model"] if isinstance(case["model"], str) else case["model"]["name"]
            print(
                f"{i:3} {name} on {case['gpus']} x {case['cluster']}: {'same' if diff is None else 'differs at ' + diff}",
                flush=True,
            )
    print(f"same answers: {same} of {len(cases)} documents equal to {rev}'s")
    sys.exit(0 if same == len(cases) else 1)


if __name__ == "__main__":
    main()
