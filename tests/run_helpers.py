"""What the `plan run` test files share: the CLI in a subprocess with a timeout, plan documents
from `plan estimate --json` for small spec files, and a batch of plans launched at once
(planner/executor/batch.py) with each report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

LAUNCH_TIMEOUT = 240  # seconds for one subprocess (start-up ~10 s, a batch of plans ~30 s)
PG_TIMEOUT = "30"  # process-group timeout inside the workers


def cli(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "planner.cli.main", *args], capture_output=True, text=True, timeout=LAUNCH_TIMEOUT, **kw
    )


def write_specs(root: Path, specs: dict) -> dict:
    """Each YAML spec text as root/NAME.yaml; {name: path}."""
    files = {}
    for name, text in specs.items():
        files[name] = root / f"{name}.yaml"
        files[name].write_text(text)
    return files


def plan_doc(
    model_file: Path, gpus: int, global_batch: int, seq_len: int, options: list[str], cluster: str = "dgx-a100-80gb"
) -> dict:
    """A plan document of `plan estimate --json` in fp32 (what the CPU run computes)."""
    res = cli(
        "estimate",
        "--model",
        str(model_file),
        "--cluster",
        cluster,
        "--gpus",
        str(gpus),
        "--global-batch",
        str(global_batch),
        "--seq-len",
        str(seq_len),
        "--precision",
        "fp32",
        *options,
        "--json",
    )
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def run_batch(tmp_path: Path, docs: list[dict], nproc: int, steps: int = 3) -> list[dict]:
    """Run every plan document on `nproc` processes (`steps` steps, 1 warm-up); their reports.
    A document's `seed`, `learning_rate` and `fault` (planner/executor/batch.py) go along."""
    extra = ("seed", "learning_rate", "fault")
    items = [
        {k: doc[k] for k in ("model", "job", "plan")}
        | {k: doc[k] for k in extra if k in doc}
        | {"steps": steps, "warmup": 1}
        for doc in docs
    ]
    src, out = tmp_path / "cases.json", tmp_path / "reports.json"
    src.write_text(json.dumps(items))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "planner.executor.batch",
            str(src),
            str(out),
            "--nproc-per-node",
            str(nproc),
            "--timeout",
            PG_TIMEOUT,
        ],
        capture_output=True,
        text=True,
        timeout=LAUNCH_TIMEOUT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())
