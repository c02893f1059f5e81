"""The stacks' registry (planner/stacks): every Target is one folder whose Stack states what it
runs, a stack's facts contradicting its Rules are refused, the cost model reads stacks without
loading an exporter, and a shipped preset takes each stack's constants.json entry for its device
unless it has its own (a profile file is read as written)."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import import_module

import pytest

from hardware_profiles import PRESET_DIR, cluster_presets, load_cluster, with_shipped_stack_constants
from planner import stacks
from planner.errors import PlannerError, UsageError
from planner.specs import ClusterSpec, LossKernel, StackConstants, Target
from planner.stacks.stack import Stack
from tests.paths import ROOT


def test_every_target_is_one_folder_with_its_stack():
    for target in Target:
        stack = stacks.get(target)
        assert stack is stacks.get(target.value) is stacks.STACKS[target] and stack.target == target
        folder = ROOT / "planner" / "stacks" / target.value
        assert (folder / "__init__.py").is_file() and (folder / "constants.json").is_file()
        if stack.exporter is not None:
            assert stack.exporter == f"planner.export.{target.value}" and stack.rules is not None
            assert callable(import_module(stack.exporter).read_back)
    assert stacks.EXPORT_STACKS == tuple(t.value for t in Target if t != Target.generic)
    assert stacks.get("generic").rules is None and stacks.get("generic").exporter is None


def test_an_unknown_stack_is_one_line_naming_the_stacks():
    with pytest.raises(
        UsageError, match=r"^unknown stack 'jax': choose one of generic, megatron, deepspeed, torchtitan, accelerate$"
    ):
        stacks.get("jax")
    with pytest.raises(
        UsageError, match=r"^--to 'generic': choose one of megatron, deepspeed, torchtitan, accelerate$"
    ):
        stacks.export("generic", None, None, None, 8)


def test_a_stack_whose_facts_contradict_its_rules_is_refused():
    """zero3 says "none" exactly where the Rules have no ZeRO-3; TP overlap is the Rules' own."""
    for stack in stacks.STACKS.values():
        if stack.rules is not None:
            assert (3 in stack.rules.zero_stages) == (stack.zero3 != "none"), stack.name
            assert stack.tp_comm_overlap == stack.rules.tp_comm_overlap, stack.name
    megatron = stacks.get("megatron")
    with pytest.raises(ValueError, match="ZeRO-3"):
        Stack("megatron", "cudnn", LossKernel.vocab_parallel, True, "fsdp2", rules=megatron.rules)
    with pytest.raises(ValueError, match="TP overlap"):
        Stack("megatron", "cudnn", LossKernel.vocab_parallel, False, "none", rules=megatron.rules)
    with pytest.raises(ValueError, match="attention_kernel"):
        Stack("new", "flex", LossKernel.eager, False, "fsdp2")


def test_the_cost_model_reads_stacks_without_an_exporter_or_torch():
    code = (
        "import sys, cost_models.estimate, cost_models.tables, hardware_profiles; "
        "print(sorted(m for m in sys.modules if m.endswith('.export') or m.split('.')[0] == 'torch'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "[]"


def _entry(fraction: float, note: str) -> StackConstants:
    return StackConstants(sustained_fraction=fraction, kernel_overhead_us=10.0, overlap_efficiency=0.9, provenance=note)


def test_a_preset_takes_the_shipped_constants_of_its_device(monkeypatch, tmp_path):
    shipped = {
        "megatron": {"A100-SXM4-80GB": _entry(0.8, "megatron on A100"), "*": _entry(0.6, "megatron anywhere")},
        "deepspeed": {"*": _entry(0.5, "deepspeed anywhere")},
        "torchtitan": {"H100-SXM5-80GB": _entry(0.7, "torchtitan on H100")},
    }
    monkeypatch.setattr(stacks, "_constants_file", lambda name: shipped.get(name, {}))
    a100 = load_cluster("dgx-a100-80gb")
    assert a100.stack_constants == {
        Target.megatron: shipped["megatron"]["A100-SXM4-80GB"],
        Target.deepspeed: shipped["deepspeed"]["*"],
    }
    assert a100.for_target("megatron").device.sustained_fraction == 0.8
    assert load_cluster("dgx-h100-80gb").stack_constants[Target.megatron].provenance == "megatron anywhere"
    own = a100.model_copy(update={"stack_constants": {Target.megatron: _entry(0.9, "the preset's own")}})
    assert with_shipped_stack_constants(own).stack_constants[Target.megatron].provenance == "the preset's own"
    profile = tmp_path / "measured.json"  # a profile file (not a shipped preset's): as written, whatever ships
    profile.write_text((PRESET_DIR / "dgx-a100-80gb.json").read_text().replace('"dgx-a100-80gb"', '"measured"', 1))
    assert load_cluster(str(profile)).stack_constants == {}


def test_presets_are_as_written_but_for_the_shipped_constants():
    """With the constants.json files as they are (empty today), a preset is its file plus the
    shipped entries for its device: no other number moves."""
    for name, path in cluster_presets().items():
        written = ClusterSpec.model_validate(json.loads(path.read_text()))
        loaded = load_cluster(name)
        assert loaded.stack_constants == {**stacks.stack_constants(written.device.name), **written.stack_constants}
        assert loaded.model_copy(update={"stack_constants": written.stack_constants}) == written


def test_a_malformed_constants_file_is_one_line_naming_it(tmp_path):
    path = tmp_path / "constants.json"
    path.write_text('{\n  "*": {"sustained_fraction": 1.5, "kernel_overhead_us": 10, "overlap_efficiency": 1}\n}\n')
    with pytest.raises(PlannerError, match=r"constants\.json:2.*sustained_fraction") as err:
        stacks.read_constants(path)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("target", [t for t in stacks.EXPORT_STACKS])
def test_a_single_value_refused_is_the_problem_the_layout_check_names(target):
    """Rules.value_problem (what `plan solve --fix` refuses a stack with before searching it) and
    Rules.layout_problems (what the search and the exporters refuse) are one check: every value
    one refuses, set in an otherwise plain layout, is named by the other in the same words."""
    from planner.specs import Layout, Plan, Schedule

    rules = stacks.get(target).rules
    plain = dict(
        dp=1,
        tp=1,
        pp=1,
        vpp=1,
        schedule=Schedule.one_f_one_b,
        zero_stage=rules.zero_stages[0],
        sequence_parallel=False,
        tp_comm_overlap=False,
        mesh_order=Plan(dp=1, tp=1, pp=1, micro_batch_size=1, num_micro_batches=1).mesh_order,
    )
    assert rules.layout_problems(Layout(**plain)) == []
    values = (
        [("zero_stage", z) for z in range(4)]
        + [(k, 8) for k in ("tp", "pp", "ep", "cp")]
        + [("vpp", 2)]
        + [(k, True) for k in ("fp8", "sequence_parallel", "tp_comm_overlap", "recompute_norm_act")]
        + [("schedule", s) for s in Schedule]
    )
    refused = 0
    for field, value in values:
        layout = dict(plain, **{field: value})
        if field in ("vpp", "schedule"):  # a pipeline to interleave or schedule
            layout.update(pp=2, vpp=layout["vpp"])
        if field in ("sequence_parallel", "tp_comm_overlap"):
            layout.update(tp=2, sequence_parallel=True)
        problem = rules.value_problem(field, value)
        if problem:
            assert problem in rules.layout_problems(Layout(**layout)), (field, value)
            refused += 1
    assert refused >= 3  # every exported stack lacks something


def test_a_preset_file_or_its_unedited_copy_is_the_preset(tmp_path):
    """The shipped constants come with a preset by name, by its path, or as an unedited copy (a
    copy gave another step time than the name: helper walkthrough, stop 39); an edited copy is
    read as written."""
    named = load_cluster("dgx-a100-80gb")
    copy = tmp_path / "mine.json"
    copy.write_text((PRESET_DIR / "dgx-a100-80gb.json").read_text())
    assert load_cluster(str(PRESET_DIR / "dgx-a100-80gb.json")) == named == load_cluster(str(copy))
    assert named.stack_constants  # the stacks' entries
    edited = json.loads(copy.read_text())
    edited["device"]["memory_gib"] = 64
    copy.write_text(json.dumps(edited))
    assert load_cluster(str(copy)).stack_constants == {}
