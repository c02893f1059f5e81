"""`plan solve`: exact against brute-force enumeration, respects memory and divisibility,
finds uneven splits where they win, beats the hand-tuned GPT-3 layout."""

import pytest

from cost_models.estimate import estimate
from hardware_profiles import load_cluster
from planner.errors import InfeasibleError
from planner.presets import load_model
from planner.search.brute import brute_force
from planner.search.candidates import SearchSpace
from planner.search.solve import infeasibility, solve
from planner.specs import MEMORY_HEADROOM, Axis, JobSpec, ModelSpec, Plan, Recompute, Schedule

SMALL = ModelSpec(name="small", num_layers=4, hidden_size=1024, num_heads=8, vocab_size=32000, max_seq_len=2048)


def tiny_cluster(memory_gib: float, gpus_per_node: int = 2, overlap: float = 1.0, preset: str = "dgx-a100-80gb"):
    """A node of 2 GPUs (A100 unless `preset` says) with no framework overhead, so that small
    models feel the limit."""
    base = load_cluster(preset)
    # `memory_gib` is the limit the search works to: the device is that plus the default headroom.
    device = base.device.model_copy(
        update={"framework_overhead_gib": 0.0, "memory_gib": memory_gib / (1 - MEMORY_HEADROOM)}
    )
    return base.model_copy(update={"gpus_per_node": gpus_per_node, "device": device, "overlap_efficiency": overlap})


def assert_same_optimum(model, cluster, job, space):
    res = solve(model, cluster, job, space, top_k=2)
    ref = brute_force(model, cluster, job, space)
    if ref.value is None:
        assert res.best is None
        return res
    assert res.best is not None, f"brute force found {ref.candidate} {ref.counts}"
    got = 1 / res.fastest.estimate.tokens_per_s
    assert got == pytest.approx(ref.value, rel=1e-7), (res.fastest.plan, ref.candidate, ref.counts)
    assert res.stats.optimal
    # The recommendation is the fastest, or a plan whose interval overlaps the fastest's.
    lo = res.best.estimate.step_time_interval_s[0] / (res.best.job.global_batch_size * res.best.job.seq_len)
    hi = res.fastest.estimate.step_time_interval_s[1] / (res.fastest.job.global_batch_size * res.fastest.job.seq_len)
    assert lo <= hi
    return res


@pytest.mark.slow
@pytest.mark.parametrize("memory_gib", [1.5, 1.0, 0.7, 0.6])
def test_matches_brute_force_whole_space(memory_gib):
    """4 GPUs on 2-GPU nodes, every dp/tp/pp, micro-batch, ZeRO, SP, mesh order, layer split
    and per-stage recompute. The limits go from roomy to nothing fits."""
    res = assert_same_optimum(
        SMALL,
        tiny_cluster(memory_gib),
        JobSpec(global_batch_size=2, seq_len=2048),
        SearchSpace(num_gpus=4, global_batch_size=2),
    )
    if memory_gib == 0.7:  # tight: the optimum mixes recompute modes and splits unevenly
        assert res.best.plan.stage_recompute is not None


@pytest.mark.slow
@pytest.mark.parametrize("overlap", [0.0, 0.4])
def test_matches_brute_force_partial_overlap(overlap):
    """A cluster where DP communication hides only partly behind compute (as gloo on CPU)."""
    assert_same_optimum(
        SMALL,
        tiny_cluster(1.0, overlap=overlap),
        JobSpec(global_batch_size=2, seq_len=2048),
        SearchSpace(num_gpus=4, global_batch_size=2),
    )


@pytest.mark.slow
@pytest.mark.parametrize("memory_gib", [80, 1.0, 0.9])
def test_matches_brute_force_interleaved(memory_gib):
    """Two pipeline stages on one node and 4 micro-batches: interleaving (v = 2, 4) shrinks
    the bubble and wins while memory allows (a small vocabulary keeps stages even)."""
    model = SMALL.model_copy(update={"num_layers": 8, "vocab_size": 1024})
    fixed = {"tp": 1, "pp": 2, "micro_batch_size": 1, "zero_stage": 0, "mesh_order": (Axis.tp, Axis.dp, Axis.pp)}
    space = SearchSpace(num_gpus=2, global_batch_size=4, fixed=fixed)
    res = assert_same_optimum(model, tiny_cluster(memory_gib), JobSpec(global_batch_size=4, seq_len=2048), space)
    if memory_gib == 80:
        assert res.best.plan.vpp > 1 and res.best.plan.schedule.value == "interleaved-1f1b"
        assert res.best.plan.stage_recompute is None and res.best.plan.recompute.value == "none"


@pytest.mark.slow
def test_matches_brute_force_micro_batch_mode():
    """Batch not fixed: micro-batch size 1, micro-batches 3 x pp; compared per token."""
    space = SearchSpace(num_gpus=4, micro_batch_size=1)
    res = assert_same_optimum(SMALL, tiny_cluster(0.8), JobSpec(global_batch_size=1, seq_len=2048), space)
    plan = res.best.plan
    assert plan.num_micro_batches == 3 * plan.pp


def test_micro_batches_override():
    space = SearchSpace(num_gpus=4, micro_batch_size=1, micro_batches=8)
    res = solve(SMALL, tiny_cluster(80), JobSpec(global_batch_size=1, seq_len=2048), space)
    assert res.best.plan.num_micro_batches == 8


def test_recompute_fix_is_respected():
    space = SearchSpace(num_gpus=4, global_batch_size=4, recompute_modes=(Recompute.full,))
    res = assert_same_optimum(SMALL, tiny_cluster(0.8), JobSpec(global_batch_size=4, seq_len=2048), space)
    assert res.best.plan.recompute.value == "full" and res.best.plan.stage_recompute is None


def test_every_returned_plan_fits_and_divides():
    model, cluster = load_model("llama2-13b"), load_cluster("dgx-a100-40gb")
    job = JobSpec(global_batch_size=256, seq_len=4096)
    res = solve(model, cluster, job, SearchSpace(num_gpus=32, global_batch_size=256), memory_limit_gib=30, top_k=5)
    assert len(res.alternatives) == 5
    for found in [res.best, *res.alternatives]:
        plan, est = found.plan, found.estimate
        assert est.peak_memory_gib <= 30
        assert plan.world_size == 32 and plan.tp <= 8
        assert model.num_heads % plan.tp == 0
        plan.validate_for(model, job, 32)
        assert estimate(model, cluster, job, plan).step_time_s == pytest.approx(est.step_time_s, rel=1e-12)
    # the fastest first, but for a recommendation whose interval overlaps it (the tie rule); the rest in order
    times = [f.estimate.step_time_s for f in [res.best, *res.alternatives]]
    assert min(times) == res.fastest.estimate.step_time_s and times[1:] == sorted(times[1:])
    lo, hi = res.best.estimate.step_time_interval_s[0], res.fastest.estimate.step_time_interval_s[1]
    assert res.best is res.fastest or lo <= hi


def test_uneven_split_when_the_head_is_heavy():
    """A 256k vocabulary makes the last stage's LM head and loss cost several layers."""
    model = ModelSpec(
        name="big-vocab",
        num_layers=16,
        hidden_size=2048,
        num_heads=16,
        vocab_size=256000,
        max_seq_len=2048,
        activation="swiglu",
        learned_position_embeddings=False,
        linear_bias=False,
        norm="rmsnorm",
        dropout=False,
    )
    res = solve(
        model,
        load_cluster("dgx-a100-80gb"),
        JobSpec(global_batch_size=64, seq_len=2048),
        SearchSpace(num_gpus=4, global_batch_size=64, fixed={"pp": 4, "tp": 1, "vpp": 1}),
    )
    layers = res.best.plan.layers_per_stage
    assert sum(layers) == 16 and layers[-1] < layers[1], layers
    even = res.best.plan.model_copy(update={"layers_per_stage": [4, 4, 4, 4], "stage_recompute": None})
    slower = estimate(model, load_cluster("dgx-a100-80gb"), JobSpec(global_batch_size=64, seq_len=2048), even)
    assert res.best.estimate.step_time_s < slower.step_time_s


@pytest.mark.slow
def test_gpt3_175b_at_least_as_fast_as_megatron_layout():
    """Narayanan et al. 2021 trained GPT-3 175B on 1,024 A100s with TP=8, PP=16 (batch 1,536)."""
    model, cluster = load_model("gpt3-175b"), load_cluster("dgx-a100-80gb")
    job = JobSpec(global_batch_size=1536, seq_len=2048)
    best = solve(model, cluster, job, SearchSpace(num_gpus=1024, global_batch_size=1536)).best
    megatron = estimate(
        model, cluster, job, Plan(dp=8, tp=8, pp=16, micro_batch_size=1, num_micro_batches=192, recompute="full")
    )
    assert best.estimate.fits and megatron.fits
    assert best.estimate.step_time_s <= megatron.step_time_s
    # the best plan of Megatron's shape: the solver improves on its hand-set details too
    shaped = solve(
        model, cluster, job, SearchSpace(num_gpus=1024, global_batch_size=1536, fixed={"tp": 8, "pp": 16})
    ).best
    assert best.estimate.step_time_s <= shaped.estimate.step_time_s <= megatron.step_time_s


def test_time_limit_marks_not_optimal():
    res = solve(
        load_model("gpt3-13b"),
        load_cluster("dgx-a100-80gb"),
        JobSpec(global_batch_size=512, seq_len=2048),
        SearchSpace(num_gpus=64, global_batch_size=512),
        time_limit=0.0,
    )
    assert not res.stats.optimal


@pytest.mark.slow
@pytest.mark.parametrize("ilps", [1, 3, 1000])
def test_time_limit_gives_a_plan_and_a_proven_gap(monkeypatch, ilps):
    """Stopped early (a deadline that passes after `ilps` ILPs, so the stop is reproducible),
    the search returns its best plan and a gap that the true optimum obeys."""
    from planner.search.deadline import Deadline

    model, cluster = load_model("gpt3-13b"), load_cluster("dgx-a100-80gb")
    job, space = JobSpec(global_batch_size=512, seq_len=2048), SearchSpace(num_gpus=64, global_batch_size=512)
    exact = solve(model, cluster, job, space)
    assert exact.stats.ilps_solved > 3
    best = 1 / exact.best.estimate.tokens_per_s
    import planner.search.solve as search

    solved, real = [0], search.attempt_candidate

    def counted(*args, **kwargs):
        out = real(*args, **kwargs)
        solved[0] += 1
        return out

    class AfterILPs(Deadline):
        def expired(self) -> bool:
            return solved[0] >= ilps

    monkeypatch.setattr(search, "attempt_candidate", counted)
    res = solve(model, cluster, job, space, deadline=AfterILPs())
    assert res.best is not None
    assert res.stats.optimal is (ilps == 1000)  # 1 and 3 ILPs stop it; 1000 let it finish
    got = 1 / res.best.estimate.tokens_per_s
    gap = res.stats.optimality_gap
    assert 0 <= gap < 1
    assert got >= best * (1 - 1e-9)  # nothing beats the optimum
    assert got * (1 - gap) <= best * (1 + 1e-9)  # and the optimum is within the gap


def test_infeasible_says_by_how_much_and_what_helps():
    model, cluster = load_model("gpt3-175b"), load_cluster("dgx-a100-80gb")
    job = JobSpec(global_batch_size=16, seq_len=2048)
    space = SearchSpace(num_gpus=8, global_batch_size=16)
    assert solve(model, cluster, job, space).best is None
    err = infeasibility(model, cluster, job, space, 80.0)
    assert isinstance(err, InfeasibleError)
    text = str(err)
    assert "over" in text and "GiB" in text and "GPUs" in text


def test_tie_rule_prefers_the_plan_that_depends_least_on_communication():
    """Among plans whose intervals overlap, the recommendation is the one with the best worst
    case: a communication-heavy plan ~1% faster loses to a compute-bound one (communication's
    error is wider), while a plan outside the interval never wins, however narrow."""
    import math

    from planner.search.solve import Found, break_ties
    from planner.specs import TimeBreakdown, Uncertainty

    u = Uncertainty(relative=0.15, coverage=0.8, compute=0.15, communication=1.5)
    job = JobSpec(global_batch_size=64, seq_len=1024)

    def found(step, comm_share):
        b = TimeBreakdown(
            compute=step * (1 - comm_share),
            recompute=0.0,
            pipeline_bubble=0.0,
            tp_communication=step * comm_share,
            pp_communication=0.0,
            dp_communication_exposed=0.0,
            optimizer=0.0,
        )
        w = u.log_halfwidth(1 - comm_share, comm_share)
        est = estimate(
            load_model("gpt2-124m"),
            load_cluster("dgx-a100-80gb"),
            job,
            Plan(dp=8, tp=1, pp=1, micro_batch_size=8, num_micro_batches=1),
        )
        est = est.model_copy(
            update={
                "step_time_s": step,
                "time_breakdown_s": b,
                "step_time_interval_s": [step * math.exp(-w), step * math.exp(w)],
            }
        )
        return Found(candidate=None, plan=est, job=job, estimate=est)

    comm_heavy, compute_bound, far = found(1.00, 0.30), found(1.01, 0.0), found(1.30, 0.0)
    assert break_ties([comm_heavy, compute_bound, far])[0] is compute_bound
    assert break_ties([comm_heavy, far])[0] is comm_heavy  # 1.30 lies outside the interval
    # No communication difference: the fastest stays first.
    a, b = found(1.00, 0.0), found(1.01, 0.0)
    assert break_ties([a, b])[0] is a


@pytest.mark.slow
@pytest.mark.parametrize("memory_gib", [1.5, 0.7])
def test_matches_brute_force_with_tp_comm_overlap_choice(memory_gib):
    """Target megatron: TP comm overlap is a plan choice (with SP); the ILP search and brute
    force agree over it, and with room to spare an overlapped TP plan is at least as fast."""
    job = JobSpec(global_batch_size=2, seq_len=2048, target="megatron")
    space = SearchSpace(num_gpus=4, global_batch_size=2, tp_comm_overlap=(False, True))
    assert_same_optimum(SMALL, tiny_cluster(memory_gib), job, space)


def test_tp_comm_overlap_saves_time_and_costs_buffers():
    """Overlapping the TP collectives hides them behind the layer's GEMMs (up to the compute
    slowdown beside them) and adds eight s b h 16-bit userbuffers per GPU."""
    model, cluster = load_model("gpt3-175b"), load_cluster("dgx-h100-80gb")
    job = JobSpec(global_batch_size=64, seq_len=2048, target="megatron")
    base = dict(
        dp=2, tp=8, pp=8, micro_batch_size=1, num_micro_batches=32, sequence_parallel=True, recompute="selective"
    )
    off = estimate(model, cluster, job, Plan(**base))
    on = estimate(model, cluster, job, Plan(**base, tp_comm_overlap=True))
    assert on.time_breakdown_s.tp_communication < 0.5 * off.time_breakdown_s.tp_communication
    assert on.step_time_s < off.step_time_s
    extra = (on.peak_memory_gib - off.peak_memory_gib) * 2**30
    assert extra == pytest.approx(8 * 2 * 2048 * 1 * model.hidden_size, rel=1e-6)


@pytest.mark.parametrize(
    "fields,target,message",
    [
        (dict(tp=2, sequence_parallel=False, tp_comm_overlap=True), "megatron", "needs sequence_parallel"),
        (dict(tp=2, sequence_parallel=True, tp_comm_overlap=True), "generic", "not available in target generic"),
    ],
)
def test_tp_comm_overlap_is_refused_where_it_cannot_run(fields, target, message):
    from planner.specs import PlanError
    from planner.stacks import validate_plan

    job = JobSpec(global_batch_size=4, seq_len=1024, target=target)
    with pytest.raises((PlanError, ValueError), match=message):
        validate_plan(Plan(dp=2, pp=1, micro_batch_size=2, num_micro_batches=1, **fields), load_model("gpt2-124m"), job)


@pytest.mark.parametrize("memory_gib", [80, 8])
def test_matches_brute_force_gpipe(memory_gib):
    """GPipe alone (a dominated schedule, searched only when fixed): its time takes a slowest
    stage per direction (cost_models/pipeline.py:gpipe_time), which the ILP models with two
    maxima; a large vocabulary makes the head's stage the slowest forward while recomputed
    layers make another stage the slowest backward."""
    model = SMALL.model_copy(update={"num_layers": 6, "vocab_size": 128000})
    fixed = {
        "tp": 1,
        "pp": 2,
        "micro_batch_size": 1,
        "zero_stage": 0,
        "schedule": Schedule.gpipe,
        "mesh_order": (Axis.tp, Axis.dp, Axis.pp),
    }
    space = SearchSpace(num_gpus=2, global_batch_size=4, fixed=fixed, include_dominated=True)
    res = assert_same_optimum(model, tiny_cluster(memory_gib), JobSpec(global_batch_size=4, seq_len=2048), space)
    assert res.best.plan.schedule == Schedule.gpipe


def test_huge_batch_reports_the_estimate_of_its_plan():
    """At 10^8 sequences per step (the bound) the ILP's coefficients are large; what solve
    reports is still exactly `plan estimate` of the plan it returns."""
    model, cluster = load_model("gpt3-1.3b"), load_cluster("dgx-a100-80gb")
    job = JobSpec(global_batch_size=10**8, seq_len=2048)
    res = solve(model, cluster, job, SearchSpace(num_gpus=8, global_batch_size=10**8), top_k=2)
    for found in [res.best, *res.alternatives]:
        assert found.estimate == estimate(model, cluster, found.job, found.plan)
    assert res.stats.optimal


@pytest.mark.slow
@pytest.mark.parametrize("stages,layers", [(1, 1), (1, 7), (2, 5), (3, 9), (4, 4), (4, 12), (5, 3), (6, 17)])
def test_layouts_represented_counts_every_split_and_recompute_mix(stages, layers):
    """The number `plan solve` reports (about 10^N layouts) against direct enumeration: every
    split of `layers` into `stages` parts >= 1, each part's layers over 3 recompute modes."""
    import itertools as it

    from planner.search.solve import layouts_represented

    def mixes(n):
        return (n + 2) * (n + 1) // 2

    want = 0
    for split in it.product(range(1, layers + 1), repeat=stages):
        if sum(split) == layers:
            prod = 1
            for n in split:
                prod *= mixes(n)
            want += prod
    assert layouts_represented(stages, layers) == want


@pytest.mark.slow
@pytest.mark.parametrize(
    "split,recompute",
    [
        ("free", "uniform"),
        ("even", "per_stage"),
        ("first_last", "same_per_stage"),
        ("even", "uniform"),
        ("free", "same_per_stage"),
    ],
)
@pytest.mark.parametrize("memory_gib", [1.1, 1.2, 1.4])
def test_stack_rules_match_brute_force(split, recompute, memory_gib):
    """`plan solve --target`: the ILP's split / recompute rows (ilp.py:_stack_rules) find the
    same optimum as brute force over only the splits the rules allow; the answer breaks no
    rule and is never faster than the free search."""
    from planner.stacks.stack import Rules

    rules = Rules(stack="test", split=split, recompute=recompute)
    model = SMALL.model_copy(update={"num_layers": 6})
    job, cluster = JobSpec(global_batch_size=2, seq_len=2048), tiny_cluster(memory_gib)
    fixed = {"tp": 1, "mesh_order": (Axis.tp, Axis.dp, Axis.pp)}
    free = solve(model, cluster, job, SearchSpace(num_gpus=4, global_batch_size=2, fixed=fixed), top_k=0)
    res = assert_same_optimum(
        model, cluster, job, SearchSpace(num_gpus=4, global_batch_size=2, fixed=fixed, rules=rules)
    )
    if res.best is not None:
        for found in [res.best, *res.alternatives]:
            assert rules.plan_problems(found.plan, model) == []
        assert res.fastest.estimate.tokens_per_s <= free.fastest.estimate.tokens_per_s * (1 + 1e-9)
    if memory_gib == 1.1:  # tight: the free optimum (5 + 1 layers, 2 of them fully recomputed) breaks every rule
        assert rules.plan_problems(free.fastest.plan, model)
    if (memory_gib, recompute, split) == (1.1, "uniform", "free"):  # ... and one mode for all costs 15%
        assert res.fastest.estimate.step_time_s > 1.1 * free.fastest.estimate.step_time_s


MOE_SMALL = SMALL.model_copy(
    update={
        "name": "small-moe",
        "num_layers": 5,
        "activation": "swiglu",
        "num_experts": 4,
        "experts_per_token": 2,
        "moe_ffn_hidden_size": 1024,
        "first_dense_layers": 2,
    }
)


@pytest.mark.slow
@pytest.mark.parametrize("memory_gib", [80, 2.0, 1.2])
def test_matches_brute_force_moe(memory_gib):
    """Mixture-of-experts: every expert-parallel degree (1, 2, 4 over tp x dp), the first two
    layers dense on the first stage, with splits and recompute: the ILP finds the brute-force
    optimum from roomy to tight memory."""
    fixed = {"mesh_order": (Axis.tp, Axis.dp, Axis.pp), "micro_batch_size": 1}
    space = SearchSpace(num_gpus=4, global_batch_size=4, fixed=fixed)
    res = assert_same_optimum(MOE_SMALL, tiny_cluster(memory_gib), JobSpec(global_batch_size=4, seq_len=2048), space)
    if res.best is not None:
        plan = res.best.plan
        assert MOE_SMALL.num_experts % plan.ep == 0 and (plan.tp * plan.dp) % plan.ep == 0
        assert plan.stage_layers(5)[0] >= 2


@pytest.mark.slow
@pytest.mark.parametrize("layers,memory_gib", [(5, 1.0), (5, 0.9), (6, 1.0), (6, 0.9)])
def test_zero_at_one_replica_still_shards_replicated_experts(layers, memory_gib):
    """dp 1 leaves ZeRO nothing to shard of a dense model, but routed experts with ep < tp x dp
    are replicated over their expert-data-parallel group (tp x dp / ep ranks), which ZeRO shards:
    such layouts are searched, not skipped as dominated, and the search still meets brute force
    (Megatron's rules, every split and recompute)."""
    from planner.search.stacks import target_space

    job = JobSpec(global_batch_size=4, seq_len=2048, target="megatron")
    base = SearchSpace(
        num_gpus=4, global_batch_size=4, fixed={"mesh_order": (Axis.tp, Axis.dp, Axis.pp), "micro_batch_size": 1}
    )
    model = MOE_SMALL.model_copy(update={"num_layers": layers})
    res = assert_same_optimum(model, tiny_cluster(memory_gib), job, target_space(base, model, job))
    if (
        memory_gib == 0.9
    ):  # what only ZeRO over the experts' group fits (brute force's optimum; skipped as dominated before)
        assert (res.fastest.plan.dp, res.fastest.plan.zero_stage) == (1, 1)
