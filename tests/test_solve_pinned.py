"""`plan solve`'s answers for the README's examples, pinned: the same plans (every field) and
step times equal to 1e-9 relative. A refactor of the cost model or the search must not move
them; a deliberate change of the cost model regenerates the file and says why:

    python -m tests.test_solve_pinned --write
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from hardware_profiles import load_cluster
from planner.models import load_model
from planner.search.candidates import SearchSpace
from planner.search.solve import solve
from planner.specs import JobSpec, ModelSpec

PINNED = Path(__file__).parent / "data" / "solve_pinned.json"

GPT_1T = ModelSpec(
    name="gpt-1t", num_layers=128, hidden_size=25600, num_heads=160, vocab_size=51200, max_seq_len=2048,
    tied_embeddings=True, source="Narayanan et al. 2021, Table 1 (1T row: 128 layers, h 25,600, 160 heads)",
)

# (name, model, cluster, GPUs, global batch, sequence, fixed fields): the README's quick start,
# its Megatron-shape comparison, and the large instances of benchmarks/solve_scaling.py.
CASES = [
    ("quick-start", "gpt3-175b", "dgx-a100-80gb", 1024, 1536, 2048, {}),
    ("megatron-shape", "gpt3-175b", "dgx-a100-80gb", 1024, 1536, 2048, {"tp": 8, "pp": 16}),
    ("llama2-7b", "llama2-7b", "dgx-a100-80gb", 8, 64, 4096, {}),
    ("gpt3-13b", "gpt3-13b", "dgx-a100-80gb", 64, 512, 2048, {}),
    ("llama3-70b", "llama3-70b", "dgx-h100-80gb", 512, 1024, 8192, {}),
    ("llama3-405b", "llama3-405b", "dgx-h100-80gb", 2048, 2048, 8192, {}),
    ("gpt-1t", "gpt-1t", "dgx-a100-80gb", 4096, 3072, 2048, {}),
]


def run_case(name: str) -> list[dict]:
    """The best plan and the alternatives (top 3) of one case, as plain data."""
    _, model_name, cluster_name, gpus, batch, seq, fixed = next(c for c in CASES if c[0] == name)
    model = GPT_1T if model_name == "gpt-1t" else load_model(model_name)
    job = JobSpec(global_batch_size=batch, seq_len=seq)
    space = SearchSpace(num_gpus=gpus, global_batch_size=batch, fixed=fixed)
    res = solve(model, load_cluster(cluster_name), job, space)
    found = [res.best, *res.alternatives]
    return [{"plan": f.plan.model_dump(mode="json"), "step_time_s": f.estimate.step_time_s} for f in found]


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_solve_answers_are_pinned(name):
    expected = json.loads(PINNED.read_text())[name]
    got = run_case(name)
    assert [g["plan"] for g in got] == [e["plan"] for e in expected]
    for g, e in zip(got, expected):
        assert math.isclose(g["step_time_s"], e["step_time_s"], rel_tol=1e-9), (name, g["step_time_s"], e["step_time_s"])


if __name__ == "__main__" and "--write" in sys.argv:
    PINNED.write_text(json.dumps({c[0]: run_case(c[0]) for c in CASES}, indent=1) + "\n")
    print(f"wrote {PINNED}")
