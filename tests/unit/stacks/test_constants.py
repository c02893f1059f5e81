"""Per-stack constants (planner/specs/cluster.py:StackConstants, ClusterSpec.for_target), the one fit
function (cost_models/fit.py) and the out-of-group interval of benchmarks/fidelity_published.py."""

from __future__ import annotations

import math
import random

import pytest

from cost_models import fit as fitlib
from cost_models.estimate import estimate
from hardware_profiles import load_cluster
from planner.presets import load_model
from planner.specs import JobSpec, Plan, StackConstants, Target


def _case(target="generic", tp=1, pp=1, dp=8, zero=1, gbs=64, mbs=1):
    model = load_model("llama3-8b")
    job = JobSpec(global_batch_size=gbs, seq_len=2048, target=target)
    plan = Plan(
        dp=dp,
        tp=tp,
        pp=pp,
        micro_batch_size=mbs,
        num_micro_batches=gbs // (dp * mbs),
        zero_stage=zero,
        sequence_parallel=tp > 1,
    )
    return model, job, plan


def test_a_stack_entry_replaces_the_device_constants_for_that_stack_only():
    base = load_cluster("dgx-h100-80gb").model_copy(update={"stack_constants": {}})
    slow = StackConstants(sustained_fraction=0.5, kernel_overhead_us=20.0, overlap_efficiency=0.5)
    cl = base.model_copy(update={"stack_constants": {Target.megatron: slow}})
    model, job, plan = _case("megatron")
    t_mega = estimate(model, cl, job, plan).step_time_s
    t_base = estimate(model, base, job, plan).step_time_s
    assert t_mega > 1.1 * t_base  # a lower sustained rate, a larger gap
    # the same entry applied by hand to the device gives the same time: for_target is the whole effect
    dev = base.device.model_copy(update={"sustained_fraction": 0.5, "kernel_overhead_us": 20.0})
    by_hand = base.model_copy(update={"device": dev, "overlap_efficiency": 0.5})
    assert math.isclose(t_mega, estimate(model, by_hand, job, plan).step_time_s, rel_tol=1e-12)
    # another stack is untouched, and resolving twice changes nothing
    model, job_t, plan = _case("torchtitan")
    assert estimate(model, cl, job_t, plan).step_time_s == estimate(model, base, job_t, plan).step_time_s
    once = cl.for_target("megatron")
    assert once.for_target("megatron") is once


def test_shipped_presets_carry_constants_per_stack():
    for name in ("dgx-a100-80gb", "dgx-h100-80gb"):
        cl = load_cluster(name)
        for t in ("megatron", "deepspeed", "torchtitan"):
            k = cl.stack_constants.get(Target(t))
            assert k is not None, f"{name} has no constants for {t}"
            assert k.provenance and "fidelity_published" in k.provenance
            assert k.uncertainty is not None and k.uncertainty.coverage == 0.8


def _synthetic(true, cases):
    """Step times 'measured' under constants `true`: each case's prediction with them."""
    out = []
    for i, (cl, model, job, plan) in enumerate(cases):
        measured = estimate(model, fitlib.with_constants(cl, job.target, true), job, plan).step_time_s
        out.append((f"g{i % 3}", cl, model, job, plan, measured))
    return out


def _residuals(obs):
    def res(theta):
        for g, cl, model, job, plan, measured in obs:
            t = estimate(model, fitlib.with_constants(cl, job.target, theta), job, plan).step_time_s
            yield g, math.log(t / measured)

    return res


def _cases():
    cl = load_cluster("dgx-a100-80gb")
    out = []
    for tp, pp, dp, zero, mbs in (
        (1, 1, 16, 3, 1),
        (2, 1, 8, 1, 2),
        (4, 2, 2, 1, 1),
        (1, 1, 16, 0, 4),
        (8, 1, 2, 1, 1),
        (1, 4, 4, 1, 2),
    ):
        model, job, plan = _case("torchtitan", tp, pp, dp, zero, 64, mbs)
        out.append((cl, model, job, plan))
    return out


def test_the_fit_recovers_the_constants_that_made_the_data():
    true = (0.66, 12.0, 0.55)
    obs = _synthetic(true, _cases())
    got = fitlib.fit_constants(_residuals(obs), sweeps=4)
    assert got[0] == pytest.approx(true[0], abs=0.01)
    assert got[1] == pytest.approx(true[1], abs=1.5)
    assert fitlib.loss(_residuals(obs), got) < 1e-4


def test_a_prior_holds_where_the_data_say_nothing_and_yields_as_its_weight_says():
    prior = fitlib.Prior((0.8, 5.0, 0.9), (0.1, 15.0, 0.3), 0.01)
    assert fitlib.fit_constants(lambda th: (), prior=prior) == pytest.approx(prior.centre, abs=0.01)
    obs = _synthetic((0.62, 5.0, 0.9), _cases())
    got = {}
    for w in (1e-5, 1e-2, 10.0):
        p = fitlib.Prior(prior.centre, prior.width, w)
        got[w] = fitlib.fit_constants(_residuals(obs), sweeps=2, prior=p, free=("sustained_fraction",))
        assert got[w][1:] == prior.centre[1:]
    assert got[1e-5][0] == pytest.approx(0.62, abs=0.01)  # a weak prior: the data decide
    assert got[10.0][0] == pytest.approx(0.8, abs=0.01)  # a strong one: the prior does
    assert 0.62 < got[1e-2][0] < 0.8


def test_out_of_group_coverage_is_measured_not_assumed():
    from benchmarks import fidelity_published as fp

    rng = random.Random(0)

    class _C:
        def __init__(self, g, pub):
            self.group, self.published = g, pub

    def held(offsets):
        out = []
        for g, off in enumerate(offsets):
            for _ in range(10):
                r = rng.gauss(off, 0.05)
                out.append(fp.Held(_C(f"g{g}", 1.0), "megatron", math.exp(r), math.exp(r), 1.0, 0.1))
        return out

    _, cov_iid, n = fp.stack_interval(held([0.0] * 6), "megatron")
    assert n == 60 and 0.65 <= cov_iid <= 0.95
    # one group far off: the interval fitted on every run holds 80% of them in sample, but fitted
    # without that group it cannot hold it, and the measured coverage counts its 10 runs out
    bad = held([0.0] * 5 + [0.6])
    iv, cov_bad, _ = fp.stack_interval(bad, "megatron")
    in_sample = sum(abs(math.log(h.model)) <= iv.halfwidth(h.comm_share) + 1e-12 for h in bad) / len(bad)
    assert in_sample >= 0.8
    assert cov_bad <= 50 / 60 + 1e-9
    assert all(abs(math.log(h.model)) > 0.3 for h in bad if h.case.group == "g5")


def test_zero3_reduce_calls_are_each_stacks_own_and_the_export_writes_the_modelled_bucket():
    """FSDP reduce-scatters each block in one call; DeepSpeed per bucket of its default 5e8
    gradient elements (its ZeRO config docs), the bucket its exported config states."""
    from cost_models.tables import zero3_reduce_calls
    from cost_models.terms import DEEPSPEED_REDUCE_BUCKET_ELEMENTS
    from planner.stacks import export

    model = load_model("gpt3-175b")
    layer = 12 * model.hidden_size**2  # ~1.8e9 parameters per layer of GPT-3 175B (Narayanan et al. 2021 eq. 2)
    for target in ("torchtitan", "accelerate", "generic"):
        assert zero3_reduce_calls(JobSpec(global_batch_size=8, seq_len=2048, target=target), layer) == 1.0
    ds = JobSpec(global_batch_size=1024, seq_len=2048, target="deepspeed")
    assert zero3_reduce_calls(ds, layer) == pytest.approx(layer / 5e8)
    plan = Plan(dp=1024, tp=1, pp=1, micro_batch_size=1, num_micro_batches=1, zero_stage=3, recompute="full")
    cfg = export("deepspeed", plan, model, ds, 1024).data
    assert cfg["zero_optimization"]["reduce_bucket_size"] == DEEPSPEED_REDUCE_BUCKET_ELEMENTS
    # more calls on the same ring cost more: DeepSpeed's 3.6 calls per layer against FSDP's one
    cl = load_cluster("dgx-a100-80gb")
    t = {
        s: estimate(model, cl, JobSpec(global_batch_size=1024, seq_len=2048, target=s), plan)
        for s in ("deepspeed", "torchtitan")
    }
    same = fitlib.with_constants(cl, "deepspeed", fitlib.constants_of(cl, "torchtitan"))
    t_ds_same = estimate(model, same, ds, plan).time_breakdown_s.dp_communication_exposed
    assert t_ds_same > t["torchtitan"].time_breakdown_s.dp_communication_exposed


@pytest.mark.parametrize(
    "pp,zero,precision,reduce",
    [
        # its ZeRO-1 optimizer reduces each rank's shard, in BF16 too (BF16_Optimizer, which all-reduces,
        # needs grad_accum_dtype fp32, which the export does not set)
        (4, 1, "bf16", "reduce_scatter"),
        (4, 1, "fp16", "reduce_scatter"),
        (4, 0, "bf16", "all_reduce"),
        (1, 0, "bf16", "all_reduce"),  # engine.backward all-reduces once backward is done
    ],
)
def test_deepspeed_reduces_gradients_after_backward_where_its_engine_does(pp, zero, precision, reduce):
    """DeepSpeed reduces ZeRO 0-1 gradients after the backward pass (its pipeline engine's
    ReduceGrads after the last micro-batch; at ZeRO-0 engine.backward's all-reduce): the whole
    reduction is exposed, plus ZeRO-1's weight gather: DP collectives of the rank's gradient bytes
    at the DP link's cost (alpha + bytes / bandwidth), nothing hidden. Megatron, with the same
    constants, reduces beside the last micro-batch's backward and exposes less."""
    from cost_models.tables import layout_costs
    from planner.specs import Collective

    model, cl = load_model("gpt3-13b"), load_cluster("dgx-a100-80gb")
    dp = 64 // (2 * pp)
    plan = Plan(dp=dp, tp=2, pp=pp, micro_batch_size=1, num_micro_batches=16, zero_stage=zero, recompute="full")
    jobs = {
        t: JobSpec(global_batch_size=16 * dp, seq_len=2048, precision=precision, target=t)
        for t in ("deepspeed", "megatron")
    }
    same = fitlib.with_constants(cl, "deepspeed", fitlib.constants_of(cl, "megatron"))
    ds = estimate(model, same, jobs["deepspeed"], plan)
    mg = estimate(model, same, jobs["megatron"], plan)
    pc = layout_costs(model, same.for_target("deepspeed"), jobs["deepspeed"], plan.layout)
    # the step waits for the rank with the most parameters: its layers and its stage's extras
    # (embedding, head)
    nbytes = 2 * max(pc.terms.rank_params(r)((model.num_layers // pp, 0, 0)) for r in range(pp))
    want = pc.dp_link.time(Collective[reduce], nbytes) + (
        pc.dp_link.time(Collective.all_gather, nbytes) if zero == 1 else 0.0
    )
    assert ds.time_breakdown_s.dp_communication_exposed == pytest.approx(want, rel=1e-6)
    # Megatron hides at least half of its reduce-scatter (its ZeRO-1 gather is exposed as well)
    assert mg.time_breakdown_s.dp_communication_exposed < want - 0.5 * pc.dp_link.time(
        Collective.reduce_scatter, nbytes
    )


def test_deepspeed_zero3_buckets_spanning_layers_expose_the_reduction_not_the_gathers():
    """DeepSpeed's ZeRO-3 reduce bucket can hold several layers (tables.zero3_reduce_calls < 1): a
    rank whose gradients do not fill one reduces them in that last bucket after backward, so all of
    its reduce-scatter is exposed while its prefetched gathers still hide; at the bucket's edge the
    two cases meet (no jump), and what never hides grows with the layers, as the bounds assume
    (planner/search/bounds.py:exposure_floor_at_least)."""
    from cost_models.terms import DataParallel, Linear, dp_exposure
    from planner.search.bounds import exposure_floor_at_least
    from planner.specs import Collective

    layer, eta = 10e6, 0.7  # parameters per layer; 2 bytes each on the wire
    costs = ((20e-6, 1 / 40e9), (10e-6, 1 / 45e9), (10e-6, 1 / 45e9))  # all-reduce, all-gather, reduce-scatter
    dp = DataParallel(64, 3, eta, 2, 2 * layer, costs, reduce_calls=0.1)  # a bucket of 10 layers
    ex = dp_exposure(dp, Linear.per_layer(0.0, layer), Linear.per_layer(0.0, 0.0), Linear.per_layer(0.0, 1.0))
    back = ex.per_micro_batch[1]
    for n in (1, 4, 9):  # under one bucket: the whole reduction exposed, the gathers but the first hidden
        rs = dp.per_layer_calls(Collective.reduce_scatter, Linear.per_layer(0.0, 2 * layer), 0.1)((n, 0, 0))
        first = dp.time(Collective.all_gather, 2 * layer)
        comm = back.comm((n, 0, 0))
        assert back.never_hidden((n, 0, 0)) == pytest.approx((1 - eta) * comm + eta * (first + rs), rel=1e-12)
        assert back.never_hidden((n, 0, 0)) < comm or n == 1  # one layer: its gather is the first, which never hides
    edge = [back.never_hidden((n, 0, 0)) for n in (9.999999, 10.0)]
    assert edge[0] == pytest.approx(edge[1], rel=1e-6)
    values = [back.never_hidden((n / 4, 0, 0)) for n in range(4, 120)]
    assert values == sorted(values)
    for n in (1, 5, 9.5, 10, 20):  # a floor at n layers holds at every larger count
        floor = exposure_floor_at_least(ex, n, 0)[0]
        assert all(
            floor <= sum(t.never_hidden((m, 0, 0)) for t in ex.per_micro_batch) + 1e-15 for m in (n, n + 0.5, n + 1, 30)
        )


@pytest.mark.slow
def test_a_split_stack_fits_a_sustained_fraction_per_generation_and_the_others_one():
    """benchmarks/fidelity_published.py: a stack of SPLIT fits the A100s' sustained fraction apart
    from Hopper's; any other stack (and the pooled fit) one fraction for every device."""
    import json

    from benchmarks import fidelity_published as fp
    from benchmarks.published_cases import Case

    true = (
        0.70,
        12.0,
        0.6,
        0.78,
        0.0,
    )  # CONSTANTS' order: Hopper's fraction, gap, overlap, Ampere's fraction, host time
    cases = []
    for name in ("dgx-a100-80gb", "dgx-h100-80gb"):
        cl = load_cluster(name)
        for i, (_, model, job, plan) in enumerate(_cases()):
            c = Case(f"{name} {i}", f"g{i % 3}", model, cl, job, plan, "tokens_per_s_per_gpu", 1.0)
            cases.append(Case(c.name, c.group, model, cl, job, plan, c.metric, fp.predict(c, true)[0]))
    # the case's device picks its fraction, through the constants the cost model reads
    for c in cases[:: len(cases) - 1]:
        got = fp.with_constants(c, true).cluster.for_target(c.job.target).device.sustained_fraction
        assert got == (0.78 if c.cluster.name in fp.AMPERE else 0.70)
    split = fp._fit(fp.residuals(cases), True, sweeps=4)
    assert split[0] == pytest.approx(0.70, abs=0.01) and split[3] == pytest.approx(0.78, abs=0.01)
    tied = fp._fit(fp.residuals(cases), False, sweeps=4)
    assert tied[3] == tied[0] and 0.70 < tied[0] < 0.78
    assert fitlib.loss(fp.residuals(cases), split) < fitlib.loss(fp.residuals(cases), tied)
    # stack_fit splits torchtitan's (pulled towards a pooled fit of one fraction), not deepspeed's
    pooled = (0.74, 12.0, 0.6, 0.74, 0.0)
    own = fp.stack_fit(cases, pooled, sweeps=2)
    assert own[3] - own[0] > 0.02  # 0.08 apart, less the prior's pull
    other = [
        Case(
            c.name,
            c.group,
            c.model,
            c.cluster,
            c.job.model_copy(update={"target": Target.deepspeed}),
            c.plan,
            c.metric,
            c.published,
        )
        for c in cases
    ]
    assert fp.stack_fit(other, pooled, sweeps=1)[3] == fp.stack_fit(other, pooled, sweeps=1)[0]
    # as shipped: the split stacks' A100 presets take their own entry, Hopper's the "*" one; every
    # other stack one entry for all
    a100, h100 = load_cluster("dgx-a100-80gb"), load_cluster("dgx-h100-80gb")
    for t in ("megatron", "deepspeed", "torchtitan", "accelerate"):
        entries = json.loads((fp.STACK_DIR / t / "constants.json").read_text())
        fa, fh = (c.for_target(t).device.sustained_fraction for c in (a100, h100))
        assert fh == entries["*"]["sustained_fraction"]
        assert fa == entries.get(a100.device.name, entries["*"])["sustained_fraction"]
        assert (fa != fh) == (fp.SHARED.get(t, t) in fp.SPLIT), t


def test_a_stack_host_time_per_step_is_paid_once_per_step_by_that_stack_only():
    """StackConstants.step_overhead_s: added once to the step (in the optimizer term), whatever the
    layout (pipeline ranks, micro-batches); another stack, or a cluster without the field, pays none."""
    base = load_cluster("dgx-h100-80gb")
    theta = fitlib.constants_of(base, "torchtitan")
    none, some = (fitlib.with_constants(base, "torchtitan", theta, step_overhead_s=s) for s in (0.0, 0.25))
    assert some.step_overhead_s("torchtitan") == 0.25 and some.step_overhead_s("megatron") == base.step_overhead_s(
        "megatron"
    )
    for layout in ((1, 1, 8, 3, 1), (2, 4, 1, 1, 1), (1, 2, 4, 1, 2)):
        tp, pp, dp, zero, mbs = layout
        model, job, plan = _case("torchtitan", tp, pp, dp, zero, 32, mbs)
        a, b = estimate(model, none, job, plan), estimate(model, some, job, plan)
        assert b.step_time_s - a.step_time_s == pytest.approx(0.25, abs=1e-9)
        assert b.time_breakdown_s.optimizer - a.time_breakdown_s.optimizer == pytest.approx(0.25, abs=1e-9)
        model, job_m, plan = _case("megatron", tp, pp, dp, zero, 32, mbs)
        assert estimate(model, some, job_m, plan).step_time_s == estimate(model, none, job_m, plan).step_time_s
    # an entry written before schema 1.12 reads without one, and a cluster without an entry has none
    old = StackConstants.model_validate(
        {"sustained_fraction": 0.7, "kernel_overhead_us": 10.0, "overlap_efficiency": 0.7}
    )
    assert old.step_overhead_s == 0.0
    bare = base.model_copy(update={"stack_constants": {}})
    assert bare.step_overhead_s("torchtitan") == 0.0
    model, job, plan = _case("torchtitan", gbs=32)
    by_hand = bare.model_copy(update={"device": none.for_target("torchtitan").device, "overlap_efficiency": theta[2]})
    assert estimate(model, by_hand, job, plan).step_time_s == pytest.approx(
        estimate(model, none, job, plan).step_time_s, rel=1e-12
    )
    # `plan tune` refits the three constants and keeps the entry's host time
    assert fitlib.with_constants(some, "torchtitan", theta).step_overhead_s("torchtitan") == 0.25


@pytest.mark.slow
def test_a_split_stack_fits_a_host_time_per_step_and_the_others_none():
    """benchmarks/fidelity_published.py: runs measured with a host time per step (short steps and
    long ones) give it back to a stack of SPLIT; the tied fit (other stacks, pooled) has none;
    as shipped, torchtitan's and Accelerate's entries carry the fitted one and the others none."""
    import json

    from benchmarks import fidelity_published as fp
    from benchmarks.published_cases import Case

    true = (0.72, 12.0, 0.7, 0.72, 0.08)
    cl = load_cluster("dgx-h100-80gb")
    cases = []
    for i, (layout, gbs) in enumerate(
        (
            ((1, 1, 16, 3, 1), 16),
            ((1, 1, 16, 3, 1), 256),
            ((2, 1, 8, 1, 2), 16),
            ((2, 1, 8, 1, 2), 128),
            ((1, 1, 16, 0, 1), 32),
            ((1, 1, 16, 0, 4), 512),
        )
    ):
        tp, pp, dp, zero, mbs = layout
        model, job, plan = _case("torchtitan", tp, pp, dp, zero, gbs, mbs)
        c = Case(f"c{i}", f"g{i % 3}", model, cl, job, plan, "tokens_per_s_per_gpu", 1.0)
        cases.append(Case(c.name, c.group, model, cl, job, plan, c.metric, fp.predict(c, true)[0]))
    steps = [fp.predict(c, true)[1].step_time_s for c in cases]
    assert min(steps) < 0.5 * max(steps)  # short steps and long ones: the host time is told apart
    split = fp._fit(fp.residuals(cases), True, sweeps=10)  # the gap trades against the host time: slow to settle
    assert split[4] == pytest.approx(0.08, abs=0.01) and split[0] == pytest.approx(0.72, abs=0.015)
    tied = fp._fit(fp.residuals(cases), False, sweeps=4)
    assert fitlib.loss(fp.residuals(cases), split) < fitlib.loss(fp.residuals(cases), tied)
    # stack_fit fits it for torchtitan, not for deepspeed (whose runs, here the same, show it as well)
    pooled = (0.72, 12.0, 0.7, 0.72, 0.0)
    assert fp.stack_fit(cases, pooled, sweeps=2)[4] > 0.04
    other = [
        Case(
            c.name,
            c.group,
            c.model,
            c.cluster,
            c.job.model_copy(update={"target": Target.deepspeed}),
            c.plan,
            c.metric,
            c.published,
        )
        for c in cases
    ]
    assert fp.stack_fit(other, pooled, sweeps=1)[4] == 0.0
    # as shipped, on every calibrated device
    for name in ("dgx-a100-40gb", "dgx-a100-80gb", "dgx-h100-80gb"):
        cl = load_cluster(name)
        for t in ("megatron", "deepspeed", "torchtitan", "accelerate"):
            entries = json.loads((fp.STACK_DIR / t / "constants.json").read_text())
            shipped = cl.step_overhead_s(t)
            assert shipped == entries.get(cl.device.name, entries["*"]).get("step_overhead_s", 0.0)
            assert (shipped > 0) == (fp.SHARED.get(t, t) in fp.SPLIT), (name, t)
