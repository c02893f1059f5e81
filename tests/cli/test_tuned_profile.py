"""A tuned profile says which stack it tunes, and is used or refused where it does not apply
(issue 44): `plan tune`'s profile marks its stack's constants tuned (StackConstants.tuned,
ClusterSpec.tuned_stacks); `plan solve` and `plan estimate` say in their first line that the
cluster is tuned and for which stack; `plan solve` without --target searches the tuned stacks
only (all of them where several were tuned) and says so in one line; a --target the profile
was not tuned for is refused in one line, exit 2, naming the stack it was tuned for."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from cost_models.fit import constants_of, with_constants
from planner import api
from planner.cli.main import cli
from planner.specs import ClusterSpec, SolveDocument, Target
from planner.tune.output import mark_tuned

JOB = ["--model", "gpt2-124m", "--gpus", "2", "--global-batch", "8", "--seq-len", "1024"]
HEADER = "(dgx-a100-80gb, tuned for {})"


def plan(*args) -> CliRunner:
    return CliRunner().invoke(cli, [str(a) for a in args])


def tuned_cluster(*targets: str) -> ClusterSpec:
    """The DGX A100 preset as a tune of each of `targets` leaves it: the stack's constants
    refit (here moved a little) and marked tuned, with a tune's provenance."""
    cluster = api.load_cluster("dgx-a100-80gb")
    for t in targets:
        theta = [x * 0.9 for x in constants_of(cluster, t)]
        cluster = mark_tuned(with_constants(cluster, t, theta, provenance=f"plan tune, test: {t}"), Target(t))
    return cluster


@pytest.fixture(scope="module")
def profiles(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("tuned")
    out = {}
    for name, targets in {"generic": ("generic",), "megatron": ("megatron",), "two": ("megatron", "deepspeed")}.items():
        out[name] = d / f"{name}.json"
        out[name].write_text(tuned_cluster(*targets).model_dump_json(indent=2))
    return out


def test_tuned_stacks_are_a_field_and_old_profiles_read_as_tuned(profiles, tmp_path):
    """The field is what readers act on; a profile written before it (no `tuned` key) reads
    as tuned for the stacks whose provenance is a tune's, the preset's other entries not."""
    doc = json.loads(profiles["generic"].read_text())
    assert doc["stack_constants"]["generic"]["tuned"] is True
    assert doc["stack_constants"]["megatron"]["tuned"] is False
    for entry in doc["stack_constants"].values():
        del entry["tuned"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(doc))
    assert api.load_cluster(str(old)).tuned_stacks == (Target.generic,)
    assert api.load_cluster("dgx-a100-80gb").tuned_stacks == ()


@pytest.mark.slow
def test_a_tune_writes_a_profile_tuned_for_its_stack():
    """The profile `plan tune` writes (planner/tune/output.py:tuned_profile) is tuned for the
    tune's stack only; a second tune of another stack on it keeps the first's mark."""
    from planner.tune.loop import Budget, TuneRequest, tune
    from planner.tune.output import tuned_profile
    from tests.fakes import FakeExecutor

    request = TuneRequest(
        api.load_model("gpt2-124m"),
        api.load_cluster("dgx-a100-80gb"),
        2,
        {"global_batch": 8, "seq_len": 1024, "fixes": ["sp=false", "recompute=none", "mbs=4"]},
    )
    result = tune(request, FakeExecutor((0.6, 20.0, 0.4)), Budget(trials=2, refit_rounds=0))
    profile = tuned_profile(result, "2026-12-02 07:00 UTC")
    assert profile.tuned_stacks == (Target.generic,)
    again = TuneRequest(request.model, profile, 2, {**request.solve, "target": "megatron"})
    result = tune(again, FakeExecutor((0.6, 20.0, 0.4)), Budget(trials=2, refit_rounds=0))
    assert set(tuned_profile(result, "2026-12-02 08:00 UTC").tuned_stacks) == {Target.generic, Target.megatron}


def test_solve_without_target_searches_the_tuned_stack_and_says_so(profiles):
    path = profiles["generic"]
    res = plan("solve", *JOB, "--cluster", path, "--top-k", "2")
    assert res.exit_code == 0, res.output
    assert HEADER.format("generic") in res.stdout.splitlines()[0]
    assert res.stderr == (
        f"note: {path} was tuned for --target generic: searched that stack only (the other stacks have no tuned "
        "constants here; `plan tune --target STACK` tunes one)\n"
    )
    assert "searched" in res.stdout and "over the tuned stack generic" in " ".join(res.stdout.split())
    res = plan("solve", *JOB, "--cluster", path, "--json")
    doc = SolveDocument.model_validate_json(res.stdout)
    assert [s.target for s in doc.stacks] == [Target.generic] and doc.job.target == Target.generic
    assert doc.cluster.tuned_stacks == (Target.generic,)


def test_solve_uses_every_tuned_stack(profiles):
    """Constants tuned for several stacks: each of them searched, the best of them recommended."""
    res = plan("solve", *JOB, "--cluster", profiles["two"], "--json")
    assert res.exit_code == 0, res.output
    doc = SolveDocument.model_validate_json(res.stdout)
    assert {s.target for s in doc.stacks} == {Target.megatron, Target.deepspeed}
    assert doc.job.target in (Target.megatron, Target.deepspeed)
    assert "tuned for --target megatron and deepspeed: searched those stacks only" in res.stderr


@pytest.mark.parametrize(
    "profile,target,tuned_for,passes",
    [
        ("generic", "megatron", "generic", "--target generic"),
        ("megatron", "generic", "megatron", "--target megatron"),
        ("two", "torchtitan", "megatron and deepspeed", "--target megatron or --target deepspeed"),
    ],
)
@pytest.mark.parametrize("command", ["solve", "estimate"])
def test_a_target_the_profile_was_not_tuned_for_is_refused(profiles, command, profile, target, tuned_for, passes):
    path = profiles[profile]
    res = plan(command, *JOB, "--cluster", path, "--target", target)
    assert res.exit_code == 2
    assert res.stdout == ""
    assert res.stderr == (
        f"error: {path} was tuned for --target {tuned_for}; its constants do not apply to {target}: pass {passes}, "
        f"or tune with --target {target}\n"
    )


def test_solve_and_estimate_with_the_tuned_target(profiles):
    for command in ("solve", "estimate"):
        res = plan(command, *JOB, "--cluster", profiles["megatron"], "--target", "megatron")
        assert res.exit_code == 0, res.output
        assert HEADER.format("megatron") in res.stdout.splitlines()[0]
        assert res.stderr == ""


def test_estimate_without_target_costs_the_tuned_stack(profiles, tmp_path):
    """`plan estimate` costs for generic by default: on a profile tuned for one other stack it
    costs for that one and says so; tuned for several, none of them generic, it asks for one;
    a re-estimate of the plan for an untuned stack is refused like a --target."""
    out = tmp_path / "plan.json"
    res = plan("estimate", *JOB, "--cluster", profiles["megatron"], "-o", out)
    assert res.exit_code == 0, res.output
    assert api.read_plan(out).job.target == Target.megatron
    assert f"note: costed for --target megatron, the stack {profiles['megatron']} was tuned for\n" in res.stderr
    res = plan("estimate", *JOB, "--cluster", profiles["two"])
    assert res.exit_code == 2
    assert res.stderr.startswith(f"error: {profiles['two']} was tuned for --target megatron and deepspeed;")
    assert res.stderr.endswith("(--target is generic by default)\n")
    res = plan("estimate", "--plan", out, "--target", "deepspeed")
    assert res.exit_code == 2
    assert res.stderr == (
        f"error: {out}'s cluster dgx-a100-80gb was tuned for --target megatron; its constants do not apply to "
        "deepspeed: pass --target megatron, or tune with --target deepspeed\n"
    )


def test_an_untuned_cluster_is_searched_as_before():
    res = plan("solve", *JOB, "--cluster", "dgx-a100-80gb", "--json")
    doc = SolveDocument.model_validate_json(res.stdout)
    assert len(doc.stacks) == 4 and res.stderr == ""
    res = plan("estimate", *JOB, "--cluster", "dgx-a100-80gb")
    assert "(dgx-a100-80gb);" in res.stdout.splitlines()[0] and "tuned" not in res.stdout
