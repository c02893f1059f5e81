"""From a plan file to what `plan run` executes, and the checks made before any launch.

No torch here: a plan that cannot run is refused in a fraction of a second, before worker
processes start (each costs seconds of importing torch).

What runs differs from the plan file only where a rehearsal needs it, and every change is
recorded as a note for the report:
- `--scale-*` shrink the model (layers, width, heads, vocabulary, sequence) so a plan for a
  large cluster can be rehearsed on small hardware; an explicit layer split and per-stage
  recompute counts are rescaled in proportion (largest remainder, at least one layer a
  stage), so the plan's shape is kept.
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

import os

from dataclasses import dataclass, field
from typing import Optional

from planner.errors import UsageError
from cost_models.terms import MODES
from planner.specs import DType, JobSpec, ModelSpec, Plan, PlanError, Schedule, StageRecompute


@dataclass(frozen=True)
class Rehearsal:
    """Model shrinking for a rehearsal on small hardware; None keeps the plan's value."""

    layers: Optional[int] = None
    hidden: Optional[int] = None
    heads: Optional[int] = None
    vocab: Optional[int] = None
    seq_len: Optional[int] = None


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
    model: ModelSpec, job: JobSpec, plan: Plan, rehearsal: Rehearsal = Rehearsal(), *, steps: int = 4,
    warmup: int = 1, seed: int = 0, learning_rate: float = 1e-3,
) -> RunCase:
    """Scale the model, adapt the plan to it, and check that the result can run."""
    if steps < 1 or warmup < 0 or warmup >= steps:
        raise UsageError(f"--steps must be at least 1 and --warmup in [0, steps - 1], got steps {steps}, warmup {warmup}")
    notes: list[str] = []
    run_model = scale_model(model, rehearsal, notes)
    run_job = scale_job(job, rehearsal, notes)
    run_plan = scale_plan(plan, model.num_layers, run_model.num_layers, notes)
    run_model = runnable_model(run_model, run_plan, notes)
    if run_job.precision != DType.fp32:
        notes.append(f"computed in fp32 (the plan's job says {run_job.precision.value}); predictions are for fp32")
        run_job = run_job.model_copy(update={"precision": DType.fp32})
    if run_plan.fp8:
        notes.append("FP8 GEMMs computed in fp32 like the reference; predictions are for fp32 without FP8")
        run_plan = run_plan.model_copy(update={"fp8": False})
    if run_plan.dp * run_plan.cp == 1 and run_plan.zero_stage:
        notes.append(f"ZeRO-{run_plan.zero_stage} at dp=1 shards nothing: run without a data-parallel wrapper")
    check_runnable(run_model, run_job, run_plan)
    return RunCase(run_model, run_job, run_plan, steps, warmup, seed, learning_rate, tuple(notes), fp8=plan.fp8)


# --------------------------------------------------------------------------- scaling


def scale_model(model: ModelSpec, r: Rehearsal, notes: list[str]) -> ModelSpec:
    update: dict = {}
    if r.layers is not None and r.layers != model.num_layers:
        _positive(r.layers, "--scale-layers")
        if r.layers <= model.first_dense_layers:
            raise UsageError(f"--scale-layers {r.layers} leaves no mixture-of-experts layer after {model.name}'s "
                             f"{model.first_dense_layers} dense ones; keep more than {model.first_dense_layers}")
        update["num_layers"] = r.layers
        notes.append(f"layers {model.num_layers} -> {r.layers}")
    heads = model.num_heads
    if r.heads is not None and r.heads != model.num_heads:
        _positive(r.heads, "--scale-heads")
        heads = r.heads
        kv = model.kv_heads * r.heads // model.num_heads
        if kv < 1 or model.kv_heads * r.heads % model.num_heads:
            raise UsageError(
                f"--scale-heads {r.heads} cannot keep the {model.num_heads}:{model.kv_heads} query:KV head ratio; "
                f"use a multiple of {model.num_heads // model.kv_heads}"
            )
        update["num_heads"], update["num_kv_heads"] = heads, (kv if model.num_kv_heads else None)
        notes.append(f"heads {model.num_heads} -> {heads} (KV heads {model.kv_heads} -> {kv})")
    if r.hidden is not None and r.hidden != model.hidden_size:
        _positive(r.hidden, "--scale-hidden")
        if r.hidden % heads:
            raise UsageError(f"--scale-hidden {r.hidden} is not divisible by the {heads} attention heads; add --scale-heads")
        ffn = max(1, round(model.ffn * r.hidden / model.hidden_size))
        update["hidden_size"], update["ffn_hidden_size"] = r.hidden, ffn
        notes.append(f"hidden {model.hidden_size} -> {r.hidden} (FFN {model.ffn} -> {ffn})")
        if model.moe_ffn_hidden_size:
            update["moe_ffn_hidden_size"] = max(1, round(model.moe_ffn_hidden_size * r.hidden / model.hidden_size))
            notes.append(f"expert FFN {model.moe_ffn_hidden_size} -> {update['moe_ffn_hidden_size']}")
    elif "num_heads" in update and model.hidden_size % heads:
        raise UsageError(f"--scale-heads {heads} does not divide the hidden size {model.hidden_size}; add --scale-hidden")
    if r.vocab is not None and r.vocab != model.vocab_size:
        _positive(r.vocab, "--scale-vocab")
        update["vocab_size"] = r.vocab
        notes.append(f"vocabulary {model.vocab_size} -> {r.vocab}")
    if r.seq_len is not None:
        _positive(r.seq_len, "--scale-seq-len")
        update["max_seq_len"] = r.seq_len  # the learned position table shrinks with it
    return model.model_copy(update=update) if update else model


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
        raise UsageError(f"--scale-layers {new_layers} leaves fewer layers than the plan's {stages} pipeline stages")
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
    return model.model_copy(update=update) if update else model


def _positive(value: int, option: str) -> None:
    if value < 1:
        raise UsageError(f"{option} must be at least 1, got {value}")


def _plan(fields: dict) -> Plan:
    try:
        return Plan(**fields)
    except (ValueError, PlanError) as exc:
        raise UsageError(str(exc).splitlines()[-1].strip()) from None


# --------------------------------------------------------------------------- checks


def check_runnable(model: ModelSpec, job: JobSpec, plan: Plan) -> None:
    """Refuse what the reference model or torch.distributed cannot run, naming what to change."""
    try:
        plan.validate_for(model, job)
    except PlanError as exc:
        raise UsageError(str(exc)) from None
    tp, m, pp = plan.tp, plan.num_micro_batches, plan.pp
    if model.is_moe and tp > 1:
        raise UsageError(f"plan run does not run tensor parallelism in mixture-of-experts layers (tp={tp}); rehearse the plan with tp=1")
    if plan.ep > 1 and plan.zero_stage >= 2:
        raise UsageError(f"plan run shards expert-parallel experts with ZeRO-0 or 1 only (ep={plan.ep} with ZeRO-{plan.zero_stage}); "
                         "use --zero 1, or ep=1")
    if model.kv_heads % tp:
        raise UsageError(
            f"tp={tp} does not divide the {model.kv_heads} KV heads of {model.name} (the reference model does not replicate KV heads)"
        )
    if model.vocab_size % tp:
        raise UsageError(f"tp={tp} does not divide the vocabulary of {model.vocab_size}; pad it or use --scale-vocab")
    if plan.sequence_parallel and job.seq_len % tp:
        raise UsageError(f"sequence parallelism needs tp={tp} to divide the sequence length {job.seq_len}")
    if plan.schedule == Schedule.one_f_one_b and pp > 1 and m < pp:
        raise UsageError(
            f"1F1B needs at least as many micro-batches as pipeline stages (torch.distributed.pipelining): "
            f"{m} < pp={pp}; use --schedule gpipe or more micro-batches"
        )
    if plan.schedule == Schedule.interleaved_1f1b and m < pp:
        raise UsageError(f"interleaved 1F1B needs at least pp={pp} micro-batches, got {m}")


def check_world(plan: Plan, world_size: int, how: str) -> None:
    """The launch must have exactly dp x (cp x) tp x pp processes; print every factor when not."""
    if plan.world_size != world_size:
        names, values = ("dp x cp x tp x pp", f"{plan.dp} x {plan.cp} x {plan.tp} x {plan.pp}") if plan.cp > 1 else (
            "dp x tp x pp", f"{plan.dp} x {plan.tp} x {plan.pp}")
        raise UsageError(
            f"the plan needs {names} = {values} = {plan.world_size} processes "
            f"but the launch has {world_size} ({how}); change --nproc-per-node/--nnodes or the plan"
        )


# FP8 tensor cores: NVIDIA compute capability 8.9 (Ada: L4, L40, RTX 40) and 9.0 (Hopper:
# H100, H200) and later (CUDA C++ Programming Guide, "Compute Capabilities": __nv_fp8 MMA).
FP8_CAPABILITY = (8, 9)


def fp8_problem(device: str, capability: Optional[tuple[int, int]] = None, name: str = "") -> Optional[str]:
    """Why this machine cannot run a plan's FP8 GEMMs (`device` "cpu" or "cuda", the GPU's
    compute capability and name), or None."""
    if device == "cuda" and capability is not None and tuple(capability) >= FP8_CAPABILITY:
        return None
    here = "on CPU processes (gloo), which have none" if device != "cuda" else (
        f"on a {name or 'GPU'} of compute capability {capability[0]}.{capability[1]}, which has none")
    return (f"the plan has fp8: FP8 GEMMs need a GPU with FP8 tensor cores (compute capability 8.9+: H100/H200, L40); "
            f"this machine runs them {here}; rehearse the plan without fp8 (plan estimate/solve without --fp8)")


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


def check_host_memory(case: RunCase, cluster, nproc_per_node: int, available: Optional[int]) -> None:
    """On CPU, refuse a run that cannot fit this machine's memory: every rank first builds
    the whole model (fp32, 4 bytes a parameter) from the seed, then holds its share
    (predicted weights, gradients, optimizer states and activations of its stage)."""
    cores = os.cpu_count() or 1
    if nproc_per_node > RANKS_PER_CORE * cores:
        raise UsageError(
            f"{nproc_per_node} CPU processes on {cores} cores is more than this machine can run ({RANKS_PER_CORE} per core at most); "
            "rehearse the plan on fewer ranks: re-solve for fewer GPUs (plan solve --gpus N) and run that plan"
        )
    if available is None:
        return
    from cost_models.compute import total_params
    from cost_models.estimate import estimate

    est = estimate(case.model, cluster, case.job, case.plan)
    stage = max(sm.weights + sm.gradients + sm.optimizer_states + sm.activations for sm in est.memory_gib_per_pipeline_rank)
    per_rank = TORCH_PROCESS_BYTES + 4 * total_params(case.model) + stage * 2**30
    if per_rank * nproc_per_node > 0.9 * available:
        raise UsageError(
            f"{case.model.name} needs about {per_rank / 2**30:.1f} GiB per rank x {nproc_per_node} ranks here, but this machine "
            f"has {available / 2**30:.1f} GiB available; rehearse a smaller model with --scale-layers/--scale-hidden/--scale-vocab"
        )
