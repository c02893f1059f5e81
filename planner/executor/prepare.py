"""From a plan file to what `plan run` executes, and the checks made before any launch.

No torch here: a plan that cannot run is refused in a fraction of a second, before worker
processes start (each costs seconds of importing torch).

What runs differs from the plan file only where a rehearsal needs it, and every change is
recorded as a note for the report:
- `--scale-*` shrink the model (layers, width, heads, vocabulary, sequence) so a plan for a
  large cluster can be rehearsed on small hardware; KV heads follow the heads (the query:KV
  ratio, or the nearest count tp can shard, said in the notes); an explicit layer split and
  per-stage recompute counts are rescaled in proportion (largest remainder, at least one
  layer a stage), so the plan's shape is kept. The scaled model is named as such
  ("llama3-8b scaled to 2 layers, ...") in every message and in the report, and a
  refusal names the --scale-* value that would work.
- `--rehearse-dp N` shrinks the world: the same layout with N data-parallel replicas, each
  keeping its micro-batch size and count (the global batch follows), and with hybrid sharding
  the plan's shard group where it divides N (else the largest that does: rehearsed_shard).
  A launch of the wrong size is told which --rehearse-dp / --nproc-per-node fit it (world_hint).
- The reference model has no dropout (so a distributed run can be compared with one
  process); the spec says so, which is also what the prediction must cost.
- Tied embeddings are untied when pp > 1 (input embedding and LM head live on different
  pipeline ranks); the reference run uses the same untied model.
- Computation is fp32 (the verification tolerance is for fp32), whatever the plan's
  precision; the prediction is made for fp32 too. FP8 GEMMs likewise run in fp32, and only
  on a device that has them (fp8_problem, checked before launch): elsewhere the plan is
  refused rather than rehearsed without what it was costed for.
"""

from __future__ import annotations

import math
import os
import sys

from dataclasses import dataclass, field
from typing import Callable, Optional

from planner.errors import UsageError
from planner.stacks import validate_plan
from cost_models.terms import MODES
from planner.specs import DType, JobSpec, ModelSpec, Plan, PlanError, Schedule, StageRecompute, cp_problem


@dataclass(frozen=True)
class Rehearsal:
    """What a rehearsal on small hardware shrinks; None keeps the plan's value."""

    layers: Optional[int] = None
    hidden: Optional[int] = None
    heads: Optional[int] = None  # KV heads follow (scaled_kv_heads)
    vocab: Optional[int] = None
    seq_len: Optional[int] = None
    dp: Optional[int] = None  # data-parallel replicas (rehearse_world): fewer processes, the same layout otherwise


@dataclass(frozen=True)
class RunCase:
    """One plan to execute: everything a worker needs, picklable, read by every rank."""

    model: ModelSpec  # the model that runs (scaled, no dropout, untied when pp > 1)
    job: JobSpec  # fp32
    plan: Plan
    steps: int = 4  # optimizer steps, warm-up included
    warmup: int = 1  # first steps left out of the timing (shape inference, allocation)
    seed: int = 0  # weights and synthetic data
    learning_rate: float = 1e-3  # Adam
    notes: tuple[str, ...] = field(default=())  # what differs from the plan file, for the report
    fp8: bool = False  # the plan file asks for FP8 GEMMs (run in fp32; refused where the device has none)

    @property
    def tie(self) -> bool:
        return self.model.tied_embeddings


def prepare_case(
    model: ModelSpec,
    job: JobSpec,
    plan: Plan,
    rehearsal: Rehearsal = Rehearsal(),
    *,
    steps: int = 4,
    warmup: int = 1,
    seed: int = 0,
    learning_rate: float = 1e-3,
) -> RunCase:
    """Shrink the world and the model, adapt the plan to them, and check that the result can run."""
    if not 1 <= steps <= MAX_STEPS or warmup < 0 or warmup >= steps:
        raise UsageError(
            f"--steps must be in 1-{MAX_STEPS:,} and --warmup in [0, steps - 1], got steps {steps}, warmup {warmup}"
        )
    check_rehearsal(rehearsal)
    notes: list[str] = []
    run_plan, run_job = rehearse_world(plan, job, rehearsal.dp, notes)
    run_model = scale_model(model, rehearsal, run_plan.tp, notes)
    run_job = scale_job(run_job, rehearsal, notes)
    run_model = run_model.model_copy(update={"name": scaled_name(model, run_model, job, run_job)})
    run_plan = scale_plan(run_plan, model.num_layers, run_model.num_layers, notes)
    run_model = runnable_model(run_model, run_plan, notes)
    if run_job.precision != DType.fp32:
        notes.append(f"computed in fp32 (the plan's job says {run_job.precision.value}); predictions are for fp32")
        run_job = run_job.model_copy(update={"precision": DType.fp32})
    if run_plan.fp8:
        notes.append("FP8 GEMMs computed in fp32 like the reference; predictions are for fp32 without FP8")
        run_plan = run_plan.model_copy(update={"fp8": False})
    if run_plan.recompute_norm_act:
        notes.append(
            "the norms' and the experts' activation outputs kept, as the executor's layers keep them (no "
            "output-discarding checkpoints); predictions are for keeping them"
        )
        run_plan = run_plan.model_copy(update={"recompute_norm_act": False})
    if run_plan.dp * run_plan.cp == 1 and run_plan.zero_stage:
        notes.append(f"ZeRO-{run_plan.zero_stage} at dp=1 shards nothing: run without a data-parallel wrapper")
    elif run_plan.layout.shard_dp * run_plan.cp == 1 and run_plan.zero_stage:
        notes.append(
            f"ZeRO-{run_plan.zero_stage} in shard groups of one rank (dp_shard 1) shards nothing: every one of the "
            f"{run_plan.dp} replicas holds the model states whole"
        )
    problem = rehearsal_problem(model, run_model, run_job, run_plan)
    if problem:
        raise UsageError(problem)
    check_runnable(run_model, run_job, run_plan)
    return RunCase(run_model, run_job, run_plan, steps, warmup, seed, learning_rate, tuple(notes), fp8=plan.fp8)


# --------------------------------------------------------------------------- the rehearsal world


def layout_factors(plan: Plan, dp: Optional[int] = None) -> str:
    """'dp 8 x tp 4 x pp 2' (cp where it is not 1, the shard group with hybrid sharding): the
    factors of the plan's world, or of the same layout with `dp` replicas."""
    cp = f" x cp {plan.cp}" if plan.cp > 1 else ""
    layout = plan.layout
    shard = f" (shard {layout.shard_dp} x {layout.replicas} replicas)" if dp is None and layout.replicas > 1 else ""
    return f"dp {plan.dp if dp is None else dp}{shard}{cp} x tp {plan.tp} x pp {plan.pp}"


def smallest_dp(plan: Plan) -> int:
    """The fewest data-parallel replicas the plan's layout runs with: 1, or what expert
    parallelism needs (ep divides tp x dp x cp: its groups are carved from those ranks)."""
    return plan.ep // math.gcd(plan.ep, plan.tp * plan.cp)


def rehearse_world(plan: Plan, job: JobSpec, dp: Optional[int], notes: list[str]) -> tuple[Plan, JobSpec]:
    """`--rehearse-dp`: the plan's layout with `dp` data-parallel replicas, everything else
    kept (tp, pp, cp, ep, schedule, split, recompute, ZeRO, mesh order). Each replica keeps its
    micro-batch size and count, so a replica's work is the plan's; the global batch follows."""
    if dp is None or dp == plan.dp:
        return plan, job
    _positive(dp, "--rehearse-dp")
    least = smallest_dp(plan)
    if dp % least:
        raise UsageError(
            f"--rehearse-dp {dp}: the plan's ep={plan.ep} must divide tp x dp x cp = {plan.tp} x {dp} x {plan.cp}; "
            f"use --rehearse-dp {least} (or a multiple of it)"
        )
    batch = dp * plan.micro_batch_size * plan.num_micro_batches
    rehearsed = _plan(plan.model_dump() | {"dp": dp, "dp_shard": rehearsed_shard(plan, dp, notes)})
    notes.append(
        f"rehearsal world (--rehearse-dp {dp}): {layout_factors(rehearsed)} = {rehearsed.world_size} processes instead of "
        f"{layout_factors(plan)} = {plan.world_size}; global batch {job.global_batch_size} -> {batch} (each replica keeps its "
        f"{plan.num_micro_batches} micro-batch{'es' if plan.num_micro_batches > 1 else ''} of {plan.micro_batch_size})"
    )
    return rehearsed, job.model_copy(update={"global_batch_size": batch})


def rehearsed_shard(plan: Plan, dp: int, notes: list[str]) -> Optional[int]:
    """Plan.dp_shard at `dp` data-parallel ranks: the plan's shard group where it divides dp
    (fewer replicas of it), else the largest group that divides both, said in the notes (a
    group of all of dp is the plain layout). None where the plan has no hybrid sharding."""
    if not plan.dp_shard:
        return None
    shard = math.gcd(plan.dp_shard, dp)
    if shard != plan.dp_shard:
        now = "all of them (no replicas)" if shard == dp else f"{shard} ({dp // shard} replicas)"
        notes.append(
            f"hybrid sharding: the plan's shard group of dp_shard {plan.dp_shard} does not divide the rehearsal's dp {dp}; "
            f"ZeRO-{plan.zero_stage} shards over {now}"
        )
    return shard


def world_hint(plan: Plan, world_size: int) -> str:
    """Which options make a launch of `world_size` processes run this plan's layout."""
    unit = plan.world_size // plan.dp  # processes per data-parallel replica: tp x pp x cp
    least = smallest_dp(plan)
    fits = world_size // unit // least * least
    if fits == plan.dp:
        return f"launch it on {plan.world_size} processes (--nproc-per-node {plan.world_size} on one node)"
    if fits >= least:
        launch = "" if fits * unit == world_size else f" --nproc-per-node {fits * unit}"
        unsharded = (
            f"; ZeRO-{plan.zero_stage} shards nothing at dp 1: --rehearse-dp 2 on {2 * unit} keeps it"
            if fits == 1 and plan.cp == 1 and plan.zero_stage and plan.dp > 1
            else ""
        )
        return (
            f"rehearse it on {fits * unit} with --rehearse-dp {fits}{launch} (dp {plan.dp} -> {fits}, the rest of the "
            f"layout kept, the global batch scaled to keep each replica's micro-batches){unsharded}"
        )
    return (
        f"the smallest rehearsal of this layout is {least * unit} processes ({layout_factors(plan, least)}): "
        f"--rehearse-dp {least} --nproc-per-node {least * unit}; on {world_size}, re-solve for {world_size} GPUs "
        f"(plan solve --gpus {world_size}) and run that plan"
    )


# --------------------------------------------------------------------------- scaling


def scale_model(model: ModelSpec, r: Rehearsal, tp: int, notes: list[str]) -> ModelSpec:
    """The model with the rehearsal's layers, width, heads (KV heads follow) and vocabulary."""
    update: dict = {}
    if r.layers is not None and r.layers != model.num_layers:
        _positive(r.layers, "--scale-layers")
        if r.layers <= model.first_dense_layers:
            raise UsageError(
                f"--scale-layers {r.layers} leaves no mixture-of-experts layer after {model.name}'s "
                f"{model.first_dense_layers} dense ones; use --scale-layers {model.first_dense_layers + 1} or more"
            )
        update["num_layers"] = r.layers
        notes.append(f"layers {model.num_layers} -> {r.layers}")
    heads = model.num_heads
    if r.heads is not None:
        _positive(r.heads, "--scale-heads")
        heads = r.heads
        kv, why = scaled_kv_heads(model, heads, tp)
        if heads != model.num_heads or kv != model.kv_heads:
            update["num_heads"], update["num_kv_heads"] = heads, (kv if model.num_kv_heads or kv != heads else None)
            notes.append(f"heads {model.num_heads} -> {heads} (KV heads {model.kv_heads} -> {kv}{why})")
    hidden = r.hidden if r.hidden is not None else model.hidden_size
    if r.heads is not None and (heads % tp or not _head_dim_ok(model, hidden, heads)):
        why = (
            f"tp={tp} does not divide the {heads} attention heads"
            if heads % tp
            else f"it does not split hidden {hidden}{'' if model.learned_position_embeddings else ' into even widths (rotary embeddings)'}"
        )
        raise UsageError(
            f"--scale-heads {heads}: {why}; use {_heads_hint(model, hidden, tp, heads)}"
            + ("" if r.hidden is not None else " or change --scale-hidden")
        )
    if not _head_dim_ok(model, hidden, heads):
        raise UsageError(
            f"--scale-hidden {hidden} does not split into the {heads} attention heads of {model.name}"
            f"{'' if model.learned_position_embeddings else ' (even widths, for rotary embeddings)'}; use "
            f"--scale-hidden {_hidden_hint(model, hidden, heads)} or change --scale-heads"
        )
    if r.hidden is not None and r.hidden != model.hidden_size:
        _positive(r.hidden, "--scale-hidden")
        ffn = scaled_ffn(model, r.hidden)
        update["hidden_size"], update["ffn_hidden_size"] = r.hidden, ffn
        notes.append(f"hidden {model.hidden_size} -> {r.hidden} (FFN {model.ffn} -> {ffn})")
        if model.moe_ffn_hidden_size:
            update["moe_ffn_hidden_size"] = max(1, round(model.moe_ffn_hidden_size * r.hidden / model.hidden_size))
            notes.append(f"expert FFN {model.moe_ffn_hidden_size} -> {update['moe_ffn_hidden_size']}")
    if r.vocab is not None and r.vocab != model.vocab_size:
        _positive(r.vocab, "--scale-vocab")
        update["vocab_size"] = r.vocab
        notes.append(f"vocabulary {model.vocab_size} -> {r.vocab}")
    if r.seq_len is not None:
        _positive(r.seq_len, "--scale-seq-len")
        update["max_seq_len"] = r.seq_len  # the learned position table shrinks with it
    return model.model_copy(update=update) if update else model


def scaled_ffn(model: ModelSpec, hidden: int) -> int:
    """The FFN width in the plan's proportion to the hidden size."""
    return max(1, round(model.ffn * hidden / model.hidden_size))


def scaled_kv_heads(model: ModelSpec, heads: int, tp: int) -> tuple[int, str]:
    """KV heads for `heads` query heads: the model's query:KV ratio where it gives a count
    that divides the heads and that tp divides (the reference model shards KV heads over tp,
    never replicates them); else the nearest such count (by ratio), with why, for the notes.
    When tp does not divide the heads no count fits: the ratio's, for the refusal to name."""
    exact = model.kv_heads * heads / model.num_heads
    divisors = [k for k in range(1, heads + 1) if heads % k == 0]
    fitting = [k for k in divisors if k % tp == 0]
    if exact == int(exact) and int(exact) in fitting:
        return int(exact), ""
    best = min(fitting or divisors, key=lambda k: (abs(math.log(k / exact)), -k))
    if not fitting:
        return best, ""
    gives = f"{exact:g}, which tp={tp} does not divide" if exact == int(exact) else f"{exact:.3g} (not a whole number)"
    return best, (
        f": the {model.num_heads}:{model.kv_heads} query:KV ratio gives {gives}; {best} is the nearest "
        f"count that divides the {heads} heads and that tp={tp} divides"
    )


def scaled_name(model: ModelSpec, scaled: ModelSpec, job: JobSpec, scaled_job: JobSpec) -> str:
    """'llama3-8b scaled to 2 layers, hidden 256, 8 heads / 2 KV heads', naming what changed."""
    parts = []
    if scaled.num_layers != model.num_layers:
        parts.append(f"{scaled.num_layers} layers")
    if scaled.hidden_size != model.hidden_size:
        parts.append(f"hidden {scaled.hidden_size}")
    if (scaled.num_heads, scaled.kv_heads) != (model.num_heads, model.kv_heads):
        kv = (
            f" / {scaled.kv_heads} KV head{'s' if scaled.kv_heads > 1 else ''}"
            if scaled.kv_heads != scaled.num_heads
            else ""
        )
        parts.append(f"{scaled.num_heads} heads{kv}")
    if scaled.vocab_size != model.vocab_size:
        parts.append(f"vocabulary {scaled.vocab_size}")
    if scaled_job.seq_len != job.seq_len:
        parts.append(f"sequence {scaled_job.seq_len}")
    return f"{model.name} scaled to {', '.join(parts)}" if parts else model.name


def scale_job(job: JobSpec, r: Rehearsal, notes: list[str]) -> JobSpec:
    if r.seq_len is None or r.seq_len == job.seq_len:
        return job
    notes.append(f"sequence {job.seq_len} -> {r.seq_len} tokens")
    return job.model_copy(update={"seq_len": r.seq_len})


def scale_plan(plan: Plan, old_layers: int, new_layers: int, notes: list[str]) -> Plan:
    """Keep an explicit layer split (and per-stage recompute) in proportion on fewer layers."""
    if new_layers == old_layers or (plan.layers_per_stage is None and plan.stage_recompute is None):
        return plan
    stages = plan.virtual_stages
    if new_layers < stages:
        raise UsageError(
            f"--scale-layers {new_layers} leaves fewer layers than the plan's {stages} pipeline stages; "
            f"use --scale-layers {stages} or more"
        )
    split = proportional(plan.stage_layers(old_layers), new_layers, minimum=1)
    update: dict = {"layers_per_stage": split}
    if plan.stage_recompute is not None:
        update["stage_recompute"] = [
            StageRecompute(**{m.value: k for m, k in zip(MODES, proportional([r.none, r.selective, r.full], n))})
            for r, n in zip(plan.stage_recompute, split)
        ]
    notes.append(f"layer split {plan.stage_layers(old_layers)} -> {split}")
    fields = plan.model_dump() | update
    if "stage_recompute" in update:
        del fields["recompute"]  # derived again: scaling may empty a mode
    return _plan(fields)


def proportional(counts: list[int], total: int, minimum: int = 0) -> list[int]:
    """Integers in proportion to `counts` summing to `total` (largest remainder), each at
    least `minimum` (taken from the largest)."""
    weight = sum(counts)
    shares = [total * c / weight if weight else total / len(counts) for c in counts]
    out = [int(s) for s in shares]
    order = sorted(range(len(counts)), key=lambda i: (-(shares[i] - out[i]), i))
    for i in order[: total - sum(out)]:
        out[i] += 1
    for i in range(len(out)):
        while out[i] < minimum:
            out[max(range(len(out)), key=out.__getitem__)] -= 1
            out[i] += 1
    return out


def runnable_model(model: ModelSpec, plan: Plan, notes: list[str]) -> ModelSpec:
    update: dict = {}
    if model.dropout:
        update["dropout"] = False
        notes.append("dropout left out (the reference model has none, so runs compare exactly)")
    if model.tied_embeddings and plan.pp > 1:
        update["tied_embeddings"] = False
        notes.append("embedding and LM head untied (they sit on different pipeline ranks); the reference is untied too")
    # What the reference model (planner/distributed/reference_model.py) does not build: left out
    # of what runs, said, and left out of the prediction too (it is made for the model that ran).
    missing = []
    if model.norms_per_layer > 2:
        update["norms_per_layer"] = 2
        missing.append(f"{model.norms_per_layer} norms per layer run as 2")
    if model.qk_norm:
        update["qk_norm"] = False
        missing.append("QK-norm left out")
    if model.sliding_window is not None:
        update["sliding_window"], update["sliding_window_layers"] = None, 0
        if model.sliding_window < model.max_seq_len:
            missing.append(
                f"the {model.sliding_window}-token sliding window of {model.sliding_window_layers} layers left out "
                "(every layer attends to the whole sequence)"
            )
    if model.logit_softcapping:
        update["logit_softcapping"] = False
        missing.append("logit soft-capping left out")
    if model.mtp_layers:
        update["mtp_layers"] = 0
        missing.append(f"the {model.mtp_layers} multi-token-prediction module(s) left out")
    if model.glu_limit is not None:
        update["glu_limit"] = None
        missing.append(f"the MLP's clamp at {model.glu_limit:g} left out")
    if model.rope_attention_factor != 1.0:  # a scale on cos and sin: the same work in the reference's rotary
        update["rope_attention_factor"] = 1.0
        missing.append(f"the rotary embedding's attention factor {model.rope_attention_factor:g} left out")
    if model.mla:
        update.update(kv_lora_rank=None, q_lora_rank=None, qk_rope_head_dim=0, v_head_dim=None)
        missing.append(
            f"multi-head latent attention run as multi-head attention of {model.num_heads} heads of {model.head_dim}"
        )
    if missing:
        notes.append("; ".join(missing) + ": the reference model does not build them (the prediction is for what runs)")
    return model.model_copy(update=update) if update else model


def _nearest(value: int, ok: Callable[[int], bool], most: Optional[int] = None) -> Optional[int]:
    """The positive integer nearest to `value` (the larger on a tie), at most `most`, that
    `ok` accepts; None when none is."""
    most = most if most is not None else 4 * value + 1_000
    for distance in range(0, most + value + 1):
        for candidate in (value + distance, value - distance):
            if 1 <= candidate <= most and ok(candidate):
                return candidate
    return None


def _head_dim_ok(model: ModelSpec, hidden: int, heads: int) -> bool:
    """`heads` split `hidden` (unless the head width is fixed), into even widths for rotary
    embeddings (planner/distributed/reference_model.py rotates pairs of features)."""
    if model.attention_head_dim is not None:
        return model.learned_position_embeddings or model.attention_head_dim % 2 == 0
    return hidden % heads == 0 and (model.learned_position_embeddings or (hidden // heads) % 2 == 0)


def _heads_hint(model: ModelSpec, hidden: int, tp: int, heads: int) -> str:
    """'--scale-heads N': the head count nearest to `heads` that tp divides and that splits
    `hidden`; where none does, '--scale-heads tp --scale-hidden H' as well."""
    fit = _nearest(heads, lambda a: a % tp == 0 and _head_dim_ok(model, hidden, a), most=hidden)
    if fit is not None:
        return f"--scale-heads {fit}"
    return f"--scale-heads {tp} --scale-hidden {_hidden_hint(model, hidden, tp)}"


def _hidden_hint(model: ModelSpec, hidden: int, heads: int) -> Optional[int]:
    return _nearest(hidden, lambda h: _head_dim_ok(model, h, heads))


# Training steps of one run: each is verified against the reference, which runs them all again.
MAX_STEPS = 100_000


def check_rehearsal(r: Rehearsal) -> None:
    """Each --scale-* / --rehearse-dp given is a count the model and plan documents accept
    (planner/specs/base.py's bounds), before anything is computed from it."""
    from planner.specs import MAX_GPUS, MAX_LAYERS, MAX_SEQ_LEN, MAX_VOCAB, MAX_WIDTH

    for value, option, most in [
        (r.layers, "--scale-layers", MAX_LAYERS),
        (r.hidden, "--scale-hidden", MAX_WIDTH),
        (r.heads, "--scale-heads", MAX_LAYERS),
        (r.vocab, "--scale-vocab", MAX_VOCAB),
        (r.seq_len, "--scale-seq-len", MAX_SEQ_LEN),
        (r.dp, "--rehearse-dp", MAX_GPUS),
    ]:
        if value is not None and not 1 <= value <= most:
            raise UsageError(f"{option} must be between 1 and {most:,}, got {value if abs(value) < 10**20 else 'more'}")


def _positive(value: int, option: str) -> None:
    if value < 1:
        raise UsageError(f"{option} must be at least 1, got {value}")


def _plan(fields: dict) -> Plan:
    try:
        return Plan(**fields)
    except (ValueError, PlanError) as exc:
        raise UsageError(str(exc).splitlines()[-1].strip()) from None


# --------------------------------------------------------------------------- checks


def rehearsal_problem(original: ModelSpec, model: ModelSpec, job: JobSpec, plan: Plan) -> Optional[str]:
    """What of the model as scaled (named as such) or of the sequence the plan's layout cannot
    shard, with the --scale-* value that would work (computed); None when nothing."""
    tp, name = plan.tp, model.name
    if model.num_heads % tp:
        return (
            f"tp={tp} does not divide the {model.num_heads} attention heads of {name}; rehearse with "
            f"{_heads_hint(model, model.hidden_size, tp, model.num_heads)}"
        )
    if model.kv_heads % tp:
        kv, _ = scaled_kv_heads(model, model.num_heads, tp)
        return (
            f"tp={tp} does not divide the {model.kv_heads} KV heads of {name} (the reference model shards KV heads, "
            f"never replicates them); rehearse with --scale-heads {model.num_heads}: the KV heads then follow ({kv})"
        )
    if not _head_dim_ok(model, model.hidden_size, model.num_heads):
        return (
            f"rotary embeddings need an even head width, and {name} has {model.hidden_size} / {model.num_heads}; "
            f"rehearse with --scale-hidden {_hidden_hint(model, model.hidden_size, model.num_heads)}"
        )
    if model.ffn % tp:
        hidden = _nearest(
            model.hidden_size, lambda h: _head_dim_ok(model, h, model.num_heads) and scaled_ffn(original, h) % tp == 0
        )
        # assumed found, as the message below always has (scaled_ffn needs a width)
        assert hidden is not None
        return (
            f"tp={tp} does not divide the FFN width {model.ffn} of {name}; rehearse with --scale-hidden {hidden} "
            f"(FFN {scaled_ffn(original, hidden)})"
        )
    if model.vocab_size % tp:
        return (
            f"tp={tp} does not divide the vocabulary of {model.vocab_size} of {name}; pad it or rehearse with "
            f"--scale-vocab {_nearest(model.vocab_size, lambda v: v % tp == 0)}"
        )
    sp = tp if plan.sequence_parallel else 1
    step = math.lcm(sp, 2 * plan.cp if plan.cp > 1 else 1, plan.cp * sp)  # cp_problem's chunks, SP's shards of them
    if job.seq_len % step:
        problem = (
            f"sequence parallelism needs tp={tp} to divide the sequence length {job.seq_len}"
            if job.seq_len % sp
            else cp_problem(plan.cp, tp, plan.sequence_parallel, job)
        )
        return f"{problem}; rehearse with --scale-seq-len {_nearest(job.seq_len, lambda n: n % step == 0)}"
    if model.num_layers < plan.virtual_stages:
        return (
            f"{name} has {model.num_layers} layers, fewer than pp x vpp = {plan.pp} x {plan.vpp} = {plan.virtual_stages} "
            f"pipeline stages; rehearse with --scale-layers {max(plan.virtual_stages, model.first_dense_layers + 1)}"
        )
    return None


def check_runnable(model: ModelSpec, job: JobSpec, plan: Plan) -> None:
    """Refuse what the reference model or torch.distributed cannot run, naming what to change
    (what --scale-* can change is rehearsal_problem's, checked first)."""
    try:
        validate_plan(plan, model, job)
    except PlanError as exc:
        raise UsageError(str(exc)) from None
    tp, m, pp = plan.tp, plan.num_micro_batches, plan.pp
    if model.is_moe and tp > 1:
        raise UsageError(
            f"plan run does not run tensor parallelism in mixture-of-experts layers (tp={tp}); rehearse the plan with tp=1"
        )
    if plan.ep > 1 and plan.zero_stage >= 2:
        raise UsageError(
            f"plan run shards expert-parallel experts with ZeRO-0 or 1 only (ep={plan.ep} with ZeRO-{plan.zero_stage}); "
            "use --zero 1, or ep=1"
        )
    if plan.ep > 1 and plan.layout.replicas > 1:
        raise UsageError(
            f"plan run shards expert-parallel plans over all of dp x cp only (ep={plan.ep} with dp_shard {plan.dp_shard} "
            f"of dp {plan.dp}); leave dp_shard out of the plan, or use ep=1"
        )
    if plan.schedule == Schedule.one_f_one_b and pp > 1 and m < pp:
        raise UsageError(
            f"1F1B needs at least as many micro-batches as pipeline stages (torch.distributed.pipelining): "
            f"{m} < pp={pp}; use --schedule gpipe or more micro-batches"
        )
    if plan.schedule == Schedule.interleaved_1f1b and m < pp:
        raise UsageError(f"interleaved 1F1B needs at least pp={pp} micro-batches, got {m}")


def check_world(plan: Plan, world_size: int, how: str) -> None:
    """The launch must have exactly dp x (cp x) tp x pp processes; print every factor when
    not, and which options make the layout fit the launch (world_hint)."""
    if plan.world_size != world_size:
        names, values = (
            ("dp x cp x tp x pp", f"{plan.dp} x {plan.cp} x {plan.tp} x {plan.pp}")
            if plan.cp > 1
            else ("dp x tp x pp", f"{plan.dp} x {plan.tp} x {plan.pp}")
        )
        raise UsageError(
            f"the plan needs {names} = {values} = {plan.world_size} processes "
            f"but the launch has {world_size} ({how}); {world_hint(plan, world_size)}"
        )


# FP8 tensor cores: NVIDIA compute capability 8.9 (Ada: L4, L40, RTX 40) and 9.0 (Hopper:
# H100, H200) and later (CUDA C++ Programming Guide, "Compute Capabilities": __nv_fp8 MMA).
FP8_CAPABILITY = (8, 9)


def fp8_problem(device: str, capability: Optional[tuple[int, int]] = None, name: Optional[str] = "") -> Optional[str]:
    """Why this machine cannot run a plan's FP8 GEMMs (`device` "cpu" or "cuda", the GPU's
    compute capability and name), or None."""
    if device == "cuda" and capability is not None and tuple(capability) >= FP8_CAPABILITY:
        return None
    if device != "cuda":
        here = "on CPU processes (gloo), which have none"
    else:
        assert capability is not None  # a CUDA device's, always given (planner/executor/runner.py:check_fp8)
        here = f"on a {name or 'GPU'} of compute capability {capability[0]}.{capability[1]}, which has none"
    return (
        f"the plan has fp8: FP8 GEMMs need a GPU with FP8 tensor cores (compute capability 8.9+: H100/H200, L40); "
        f"this machine runs them {here}; rehearse the plan without fp8 (plan estimate/solve without --fp8)"
    )


def host_memory_bytes() -> Optional[int]:
    """Memory available on this machine (Linux /proc/meminfo), or None when unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


# What one CPU worker holds before any model: the interpreter, torch and gloo (about 0.25 GiB
# resident, the framework overhead `plan profile` measures on CPU; docs/notebook.md).
TORCH_PROCESS_BYTES = 0.3 * 2**30
# CPU processes standing in for GPUs, per core: beyond this a rehearsal only measures contention.
RANKS_PER_CORE = 8
RESOLVE = "re-solve for fewer GPUs (plan solve --gpus N) and run that plan"


def fewer_ranks_hint(plan: Plan, most: int) -> Optional[str]:
    """How to run this layout on at most `most` processes with --rehearse-dp, or None."""
    unit, least = plan.world_size // plan.dp, smallest_dp(plan)
    dp = most // unit // least * least
    if not least <= dp < plan.dp:
        return None
    upto = f"; this machine takes up to --rehearse-dp {dp}" if dp > least else ""
    return f"--rehearse-dp {least} runs its layout on {least * unit} processes ({layout_factors(plan, least)}){upto}"


def check_cpu_ranks(nproc_per_node: int, hint: Optional[str] = None) -> None:
    """CPU processes standing in for GPUs: at most RANKS_PER_CORE a core."""
    cores = os.cpu_count() or 1
    if nproc_per_node > RANKS_PER_CORE * cores:
        raise UsageError(
            f"{nproc_per_node} CPU processes on {cores} cores is more than this machine can run ({RANKS_PER_CORE} per core at most); "
            + (hint or f"use --nproc-per-node {RANKS_PER_CORE * cores} or fewer")
        )


def check_host_memory(case: RunCase, cluster, nproc_per_node: int, available: Optional[int]) -> None:
    """On CPU, refuse a run that cannot fit this machine's memory: every rank first builds
    the whole model (fp32, 4 bytes a parameter) from the seed, then holds its share
    (predicted weights, gradients, optimizer states and activations of its stage)."""
    cores = os.cpu_count() or 1
    check_cpu_ranks(
        nproc_per_node,
        "rehearse the plan on fewer ranks: " + (fewer_ranks_hint(case.plan, RANKS_PER_CORE * cores) or RESOLVE),
    )
    if available is None:
        return
    from cost_models.compute import total_params
    from cost_models.estimate import estimate

    est = estimate(case.model, cluster, case.job, case.plan)
    stage = max(
        sm.weights + sm.gradients + sm.optimizer_states + sm.activations for sm in est.memory_gib_per_pipeline_rank
    )
    per_rank = TORCH_PROCESS_BYTES + 4 * total_params(case.model) + stage * 2**30
    if per_rank * nproc_per_node > 0.9 * available:
        fewer = fewer_ranks_hint(case.plan, int(0.9 * available / per_rank))
        raise UsageError(
            f"{case.model.name} needs about {per_rank / 2**30:.1f} GiB per rank x {nproc_per_node} ranks here, but this machine "
            f"has {available / 2**30:.1f} GiB available; rehearse a smaller model with --scale-layers/--scale-hidden/--scale-vocab"
            + (f", or on fewer ranks: {fewer}" if fewer else "")
        )


# --------------------------------------------------------------------------- the reference run

# The single-process reference (planner/executor/verify.py:reference_runs) runs in this process
# after the workers have exited: the whole model and the whole global batch at once, without
# recompute, in float64 and then again in fp32 (the float64 run is the peak: 8 bytes a value).
FLOAT64_BYTES = 8
# What of MemAvailable a run may plan on using: the rest is for the page cache and the others.
USABLE_MEMORY = 0.9


def reference_bytes(model: ModelSpec, job: JobSpec) -> float:
    """Peak memory of the float64 reference run: weights, gradients and Adam's two moments (8
    bytes each a parameter), and what backward keeps for the whole global batch: every layer's
    activations (no recompute; PyTorch's CPU scaled_dot_product_attention keeps no score
    matrix), the final norm's and LM head's inputs, and the logits with their log-softmax and
    gradient: cost_models/memory.py's fp32 byte counts, doubled. A 2-layer, 256-wide GPT with
    a 1,024-token vocabulary on 256 x 512 tokens measured 11.7 GiB (peak RSS); this gives 11.6."""
    from cost_models.compute import over_layers, total_params
    from cost_models.memory import head_activation_bytes, layer_activation_bytes, logits_temporary_bytes
    from planner.specs import Recompute

    b, s, fp32 = job.global_batch_size, job.seq_len, DType.fp32
    layers = over_layers(
        model, lambda dense: layer_activation_bytes(model, b, s, 1, False, Recompute.none, True, fp32, dense=dense)
    )
    head = head_activation_bytes(model, b, s, 1, False, fp32) + logits_temporary_bytes(model, b, s, 1, fp32)
    states = 4 * FLOAT64_BYTES * total_params(model)  # weights, gradients, Adam's first and second moments
    return TORCH_PROCESS_BYTES + states + 2 * (layers + head)


def check_reference_memory(case: RunCase, rehearsal: Rehearsal, available: Optional[int], copies: int = 1) -> None:
    """Refuse, before any launch, a run whose single-process reference (`copies` of it: one a
    process inside an enclosing launcher) cannot fit this machine's memory, saying by how much
    and which --scale-* (or --rehearse-dp) would fit."""
    if available is None:
        return
    budget = USABLE_MEMORY * available / copies
    need = reference_bytes(case.model, case.job)
    if need <= budget:
        return
    where = f" each, {copies} processes here" if copies > 1 else ""
    hints = _reference_hints(case, rehearsal, budget)
    raise UsageError(
        f"the single-process reference run that checks the result (the whole global batch of {case.job.global_batch_size} x "
        f"{case.job.seq_len} tokens at once, in float64) needs about {need / 2**30:.1f} GiB{where}, {(need - budget) / 2**30:.1f} GiB "
        f"more than the {budget / 2**30:.1f} GiB this machine has for it ({USABLE_MEMORY:.0%} of {available / 2**30:.1f} GiB available); "
        + (
            f"rehearse with {' or '.join(hints)}"
            if hints
            else "rehearse a smaller model with --scale-layers/--scale-hidden/--scale-vocab "
            "and a shorter --scale-seq-len"
        )
    )


def _reference_hints(case: RunCase, rehearsal: Rehearsal, budget: float) -> list[str]:
    """'--scale-layers 2', '--scale-seq-len 256', '--scale-vocab 1024', '--rehearse-dp 1': each one change to the
    rehearsal (the others kept) whose run prepares and whose reference fits `budget`."""
    model, job = case.model, case.job
    # (option, Rehearsal field, current value, the model and job at a value n)
    options: list[tuple[str, str, int, Callable[[int], tuple[ModelSpec, JobSpec]]]] = [
        ("--scale-layers", "layers", model.num_layers, lambda n: (model.model_copy(update={"num_layers": n}), job)),
        (
            "--scale-seq-len",
            "seq_len",
            job.seq_len,
            lambda n: (
                model.model_copy(update={"max_seq_len": n}) if model.learned_position_embeddings else model,
                job.model_copy(update={"seq_len": n}),
            ),
        ),
    ]
    options.append(
        ("--scale-vocab", "vocab", model.vocab_size, lambda n: (model.model_copy(update={"vocab_size": n}), job))
    )
    if case.plan.dp > 1:  # fewer replicas, a smaller global batch
        per_replica = job.global_batch_size // case.plan.dp
        options.append(
            (
                "--rehearse-dp",
                "dp",
                case.plan.dp,
                lambda n: (model, job.model_copy(update={"global_batch_size": n * per_replica})),
            )
        )
    hints = []
    for option, name, current, shrunk in options:

        def fits_budget(n: int, shrunk: Callable[[int], tuple[ModelSpec, JobSpec]] = shrunk) -> bool:
            return reference_bytes(*shrunk(n)) <= budget

        most = _largest(current, fits_budget)
        fits = (
            next((n for n in range(most, max(most - 256, 0), -1) if _prepares(case, rehearsal, name, n)), None)
            if most
            else None
        )
        if fits:
            hints.append(f"{option} {fits}")
    return hints


def _largest(current: int, fits: Callable[[int], bool]) -> int:
    """The largest n below `current` for which fits(n) (true up to some n, then false), or 0."""
    lo, hi = 0, current
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def _prepares(case: RunCase, rehearsal: Rehearsal, name: str, value: int) -> bool:
    """The rehearsal with `name` set to `value` makes a case that can run."""
    from dataclasses import replace

    try:
        prepare_case(
            case.model, case.job, case.plan, replace(rehearsal, **{name: value}), steps=case.steps, warmup=case.warmup
        )
    except UsageError:
        return False
    return True


# --------------------------------------------------------------------------- options checked before any launch

# Seeds: torch.manual_seed takes 64 bits, and the synthetic data's generator is seeded with
# seed x 1,000,003 + step (planner/distributed/reference_model.py:synthetic_batch); 32 bits
# keep both in range, as numpy's seeds are.
SEED_LIMIT = 2**32
# The process-group timeout (seconds): workers take seconds to import torch and join, so less
# than this fails every run at its start; more than a day no longer notices a lost rank (and
# torch keeps it in milliseconds in a 32-bit int: 24.8 days at most).
TIMEOUT_RANGE_S = (5.0, 86_400.0)


def check_seed(seed: int) -> None:
    if not 0 <= seed < SEED_LIMIT:
        got = f"{seed}" if abs(seed) < 10**20 else f"{'-' if seed < 0 else ''}a number of {len(str(abs(seed)))} digits"
        raise UsageError(f"--seed must be in 0-{SEED_LIMIT - 1} (32 bits), got {got}")


def check_timeout(timeout_s: float) -> None:
    lo, hi = TIMEOUT_RANGE_S
    if not lo <= timeout_s <= hi:
        raise UsageError(
            f"--timeout must be between {lo:g} and {hi:,.0f} seconds (a rank that stops answering fails the run "
            f"after it; workers take seconds to start), got {timeout_s:g}"
        )


def gpu_absent() -> bool:
    """No NVIDIA or AMD GPU device on this Linux machine (/dev/nvidia0, /dev/kfd): torch would
    see none, so --backend auto means CPU processes (gloo). Known without importing torch;
    False where unsure."""
    import glob

    if not sys.platform.startswith("linux"):
        return False
    return not (glob.glob("/dev/nvidia[0-9]*") or os.path.exists("/dev/kfd"))


def profile_rank_bytes(model: ModelSpec, micro_batches: tuple[int, ...], seq_len: int) -> float:
    """The most one CPU process of `plan profile` holds (fp32): a block, the embedding, and the LM
    head with loss, each with its activations and gradients for the largest micro-batch (the
    timed stacks build a small model: their blocks, embedding and head, the same sizes)."""
    from cost_models.compute import embedding_params, head_params, layer_params
    from cost_models.memory import head_activation_bytes, layer_activation_bytes, logits_temporary_bytes
    from planner.specs import Recompute

    b, s, fp32 = max(micro_batches), seq_len, DType.fp32
    stack = min(4, model.num_layers)  # planner/profiler/calls.py:STACK_LAYERS
    params = stack * layer_params(model).total + embedding_params(model) + head_params(model)
    block = layer_activation_bytes(model, b, s, 1, False, Recompute.none, True, fp32)
    head = head_activation_bytes(model, b, s, 1, False, fp32) + logits_temporary_bytes(model, b, s, 1, fp32)
    return TORCH_PROCESS_BYTES + 2 * 4 * params + stack * block + head + 4 * b * s * model.hidden_size


def check_profile_memory(
    model: ModelSpec, micro_batches: tuple[int, ...], seq_len: int, nproc_per_node: int, available: Optional[int]
) -> None:
    """Refuse a CPU profile whose processes cannot fit this machine's memory, naming sizes that fit."""
    if available is None:
        return
    budget = USABLE_MEMORY * available / nproc_per_node
    need = profile_rank_bytes(model, micro_batches, seq_len)
    if need <= budget:
        return
    mbs = _largest(max(micro_batches) + 1, lambda b: profile_rank_bytes(model, (b,), seq_len) <= budget)
    seq = _largest(seq_len + 1, lambda n: profile_rank_bytes(model, micro_batches, n) <= budget)
    fits = ([f"--micro-batch-sizes up to {mbs}"] if mbs else []) + ([f"--seq-len {seq}"] if seq else [])
    raise UsageError(
        f"measuring {model.name} at micro-batch {max(micro_batches)} x {seq_len} tokens needs about {need / 2**30:.1f} GiB in each of "
        f"{nproc_per_node} CPU processes, {(need - budget) * nproc_per_node / 2**30:.1f} GiB more than this machine has for them "
        f"({USABLE_MEMORY:.0%} of {available / 2**30:.1f} GiB available); "
        + (f"use {' or '.join(fits)}" if fits else "use fewer --nproc-per-node or a smaller model")
    )
