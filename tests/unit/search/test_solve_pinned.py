"""`plan solve`'s answers for the README's examples, pinned: the same plans (every field) and
step times equal to 1e-9 relative. A refactor of the cost model or the search must not move
them; a deliberate change of the cost model regenerates the files and says why:

    python -m tests.unit.search.test_solve_pinned --write [generic|default]

Two sets: data/solve_pinned.json, the free search (`--target generic`, what `plan solve` did
without --target before every stack was searched), and data/solve_pinned_default.json, the
answer without --target (planner/search/stacks.py: the best plan of megatron, deepspeed,
torchtitan and accelerate, each plan with the stack it was costed for, and which plan each
stack's own recommendation is), written by the commit that made that the default.

data/solve_pinned.json was written by commit f5c088a, before the cost model was stated once
(cost_models/terms.py). Where several splits of one layout tie exactly (recompute on a stage
off an interleaved schedule's critical path), which one a MILP solver returns depends on its
path; the search now returns one canonical representative (planner/search/solve.py:settle),
so the pinned plans are mapped through the same tie-break before comparing: the layout, the
step time and the canonical split must all be equal.

Both files were rewritten by issue 41's change: each stack's model states priced as it
allocates them (cost_models/memory.py STATE_RECIPES: Megatron's fp32 main gradients, 6 + 12/d
bytes per parameter with the distributed optimizer, so the default answers moved: the quick
start's Megatron plan is now dp 32 tp 4 pp 8 vpp 6 at 58.7 GiB), and interleaved pipelines whose
chunks hold L // (pp v) layers or one more (new candidates, priced as if every chunk were the
slowest: cost_models/pipeline.py; the free search's recommendations are those of before, some
alternatives changed).

Both were rewritten again by issue 43's change: hybrid sharding searched (Plan.dp_shard: shard
groups of 1, 2, 4 and 8 nodes beside all of dp, new candidates) and the constants refitted on the
published runs with two added (the FSDP paper's) and intervals fitted leaving each source out.
"""

from __future__ import annotations

import json
import math
import sys

import pytest

from hardware_profiles import load_cluster
from planner.presets import load_model
from cost_models.estimate import evaluate, recompute_counts
from cost_models.terms import MODES
from planner.search.candidates import CostTables, SearchSpace
from planner.search.ilp import default_solver
from planner.search.solve import decode, settle, solve
from planner.search.report import solve_document
from planner.search.stacks import solve_stacks
from planner.specs import JobSpec, ModelSpec, Plan, memory_limit_gib
from tests.paths import DATA

pytestmark = pytest.mark.slow  # CONTRIBUTING.md: the quick tier leaves it out

PINNED = DATA / "solve_pinned.json"
PINNED_DEFAULT = DATA / "solve_pinned_default.json"

GPT_1T = ModelSpec(
    name="gpt-1t",
    num_layers=128,
    hidden_size=25600,
    num_heads=160,
    vocab_size=51200,
    max_seq_len=2048,
    tied_embeddings=True,
    source="Narayanan et al. 2021, Table 1 (1T row: 128 layers, h 25,600, 160 heads)",
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


def _setting(name: str):
    _, model_name, cluster_name, gpus, batch, seq, fixed = next(c for c in CASES if c[0] == name)
    model = GPT_1T if model_name == "gpt-1t" else load_model(model_name)
    return model, load_cluster(cluster_name), JobSpec(global_batch_size=batch, seq_len=seq), gpus, fixed


def run_case(name: str) -> list[dict]:
    """The best plan and the alternatives (top 3) of one case, as plain data."""
    model, cluster, job, gpus, fixed = _setting(name)
    res = solve(model, cluster, job, SearchSpace(num_gpus=gpus, global_batch_size=job.global_batch_size, fixed=fixed))
    found = [res.best, *res.alternatives]
    return [{"plan": f.plan.model_dump(mode="json"), "step_time_s": f.estimate.step_time_s} for f in found]


def run_default_case(name: str) -> dict:
    """The answer of every stack's search (no --target) of one case, as plain data: its plans
    with their stacks, and where each stack's own recommendation is among them (0: the plan)."""
    model, cluster, job, gpus, fixed = _setting(name)
    res = solve_stacks(
        model, cluster, job, SearchSpace(num_gpus=gpus, global_batch_size=job.global_batch_size, fixed=fixed)
    )
    doc = solve_document(model, cluster, gpus, res)
    return {
        "plans": [
            {
                "target": f.job.target.value,
                "plan": f.plan.model_dump(mode="json"),
                "step_time_s": f.estimate.step_time_s,
            }
            for f in [res.best, *res.alternatives]
        ],
        "stacks": {a.target.value: a.alternative for a in doc.stacks},
    }


def canonical(name: str, plan_json: dict) -> dict:
    """A pinned plan with its split replaced by the canonical one of equal step time."""
    model, cluster, job, _, _ = _setting(name)
    plan = Plan.model_validate(plan_json)
    cand = plan.layout  # every layout field, dp_shard included
    pc = CostTables(model, cluster, job).pipeline(cand)
    counts = settle(pc, recompute_counts(plan, model.num_layers), memory_limit_gib(cluster), MODES, default_solver())
    assert math.isclose(
        evaluate(pc, list(counts)).step_time_s,
        evaluate(pc, recompute_counts(plan, model.num_layers)).step_time_s,
        rel_tol=1e-12,
    )
    return decode(cand, counts).model_dump(mode="json")


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_solve_answers_are_pinned(name):
    expected = json.loads(PINNED.read_text())[name]
    got = run_case(name)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g["plan"] == canonical(name, e["plan"]), name
        assert math.isclose(g["step_time_s"], e["step_time_s"], rel_tol=1e-9), (
            name,
            g["step_time_s"],
            e["step_time_s"],
        )


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_default_answers_are_pinned(name):
    """Without --target: the same plans of the same stacks, in the same order."""
    expected = json.loads(PINNED_DEFAULT.read_text())[name]
    got = run_default_case(name)
    assert got["stacks"] == expected["stacks"], name
    assert [(g["target"], g["plan"]) for g in got["plans"]] == [(e["target"], e["plan"]) for e in expected["plans"]], (
        name
    )
    for g, e in zip(got["plans"], expected["plans"]):
        assert math.isclose(g["step_time_s"], e["step_time_s"], rel_tol=1e-9), (
            name,
            g["step_time_s"],
            e["step_time_s"],
        )


if __name__ == "__main__" and "--write" in sys.argv:
    which = sys.argv[sys.argv.index("--write") + 1 :] or ["generic", "default"]
    for kind, path, run in (("generic", PINNED, run_case), ("default", PINNED_DEFAULT, run_default_case)):
        if kind in which:
            path.write_text(json.dumps({c[0]: run(c[0]) for c in CASES}, indent=1) + "\n")
            print(f"wrote {path}")
