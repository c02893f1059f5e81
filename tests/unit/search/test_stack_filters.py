"""The stacks' candidate filters as the search runs them: each stack's layout_problems on a
search Layout (no Plan built per candidate, planner/search/stacks.py:target_space) says
exactly what its problems() says of the candidate's plan, over every layout of a few searches
(dense, mixture-of-experts, long-sequence context parallelism); and a model a stack cannot build
leaves that stack unsearched, with the stack's one-line reason."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hardware_profiles import load_cluster
from planner.cli.solve import cp_degrees
from planner.errors import UsageError
from planner.stacks import EXPORT_STACKS as STACKS, get, model_refusal
from planner.presets import load_model
from planner.search.candidates import SearchSpace, enumerate_candidates, enumerate_layouts
from planner.search.stacks import target_space
from planner.specs import JobSpec
from tests.paths import HF_CONFIGS

HF = HF_CONFIGS  # published Hugging Face configs (SOURCES.md)

SEARCHES = {  # (model, cluster, GPUs, global batch, sequence)
    "gpt3-175b-1024-a100": ("gpt3-175b", "dgx-a100-80gb", 1024, 1536, 2048),  # the README's quick start
    "mixtral-64-h100": ("mixtral-8x7b", "dgx-h100-80gb", 64, 512, 4096),
    "llama3-8b-128k-8-h100": ("llama3-8b", "dgx-h100-80gb", 8, 8, 131072),
    "mistral-window-32k-16-h100": (str(HF / "mistral-7b-v0.1.json"), "dgx-h100-80gb", 16, 16, 32768),
}


def _search(name: str):
    model_name, cluster_name, gpus, batch, seq = SEARCHES[name]
    model, cluster = load_model(model_name), load_cluster(cluster_name)
    base = SearchSpace(
        num_gpus=gpus,
        global_batch_size=batch,
        seq_len=seq,
        cp_degrees=cp_degrees(seq, gpus, None),
        tp_comm_overlap=(False, True),
        recompute_norm_act=(False, True),
    )
    return model, cluster, base, enumerate_layouts(model, cluster, base)


@pytest.mark.slow
@pytest.mark.parametrize("name", SEARCHES)
def test_the_search_filter_is_what_the_export_refuses(name):
    model, cluster, base, layouts = _search(name)
    for stack in STACKS:
        job = JobSpec(global_batch_size=base.global_batch_size, seq_len=base.seq_len, target=stack)
        mod = get(stack)
        for c in layouts.candidates:
            assert mod.layout_problems(c, model, job) == mod.problems(c.plan(), model, job), (stack, c)
        space = target_space(base, model, job)
        kept, _ = enumerate_candidates(model, cluster, space, layouts)

        def by_plan_problems(c, mod=mod, job=job):  # what the filter was: problems() of a Plan built per candidate
            return mod.problems(c.plan(), model, job)

        by_plan, _ = enumerate_candidates(model, cluster, replace(space, target_problems=by_plan_problems), layouts)
        assert kept == by_plan


def test_context_parallelism_over_a_window_is_filtered_where_the_stack_refuses_it():
    """Mistral v0.1 at 32k tokens: the search offers cp > 1; Megatron (Transformer Engine's p2p
    ring) and Accelerate (its context-parallel hooks) keep none of those; torchtitan does (its
    gpt_oss model runs context parallelism over windowed layers: models/gpt_oss/parallelize.py)."""
    model, cluster, base, layouts = _search("mistral-window-32k-16-h100")
    assert any(c.cp > 1 for c in layouts.candidates)
    for stack, keeps in (("megatron", False), ("accelerate", False), ("torchtitan", True)):
        job = JobSpec(global_batch_size=base.global_batch_size, seq_len=base.seq_len, target=stack)
        kept, _ = enumerate_candidates(model, cluster, target_space(base, model, job), layouts)
        assert any(c.cp > 1 for c in kept) == keeps, stack


def test_a_model_the_stack_cannot_build_is_not_searched():
    model = load_model(str(HF / "gemma-2-9b.json"))
    base = SearchSpace(num_gpus=64, global_batch_size=256, seq_len=4096)
    for stack in ("megatron", "torchtitan"):
        with pytest.raises(UsageError) as err:
            target_space(base, model, JobSpec(global_batch_size=256, seq_len=4096, target=stack))
        assert str(err.value) == model_refusal(stack, model) and str(err.value).startswith(
            f"{stack} cannot build gemma-2-9b:"
        )
    for stack in ("deepspeed", "accelerate"):
        assert model_refusal(stack, model) is None
        target_space(base, model, JobSpec(global_batch_size=256, seq_len=4096, target=stack))
