"""The training job and its layout: JobSpec, Plan (StageRecompute, PlanError), their enums (Target,
LossKernel, Schedule, Recompute, Axis, Optimizer) and the layout rules (tp_problem, cp_problem, ...)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Optional, cast

from pydantic import Field, field_validator, model_serializer, model_validator

from planner.specs.base import MAX_GLOBAL_BATCH, MAX_GPUS, MAX_LAYERS, MAX_SEQ_LEN, Integer, _Spec
from planner.specs.model import DType, ModelSpec

# The fused-attention kernels a device table (DeviceSpec.attention) may list, each stack running
# one (planner/stacks: Stack.attention_kernel; a job may name another, JobSpec.attention_kernel):
# FlashAttention-2 (through SDPA) and Transformer Engine's cuDNN attention.
ATTENTION_KERNELS = ("flash2", "cudnn")


# --------------------------------------------------------------------------- enums


class Optimizer(str, Enum):
    adam = "adam"
    sgd = "sgd"


class Target(str, Enum):
    """The training stack a plan will run on: its kernels, overlap and what it can express are
    stated in planner/stacks/<value>/."""

    generic = "generic"  # PyTorch eager: FlashAttention-2 through SDPA, no TP overlap
    megatron = "megatron"  # Megatron-Core / NeMo with Transformer Engine: cuDNN fused attention, TP comm overlap
    deepspeed = "deepspeed"
    torchtitan = "torchtitan"
    accelerate = "accelerate"  # Hugging Face Accelerate with FSDP2 (and its ParallelismConfig TP)


class LossKernel(str, Enum):
    """How the cross-entropy over the vocabulary is computed, which sets what the loss holds
    per logit (cost_models/memory.py:loss_bytes_per_logit)."""

    eager = "eager"  # PyTorch eager: logits upcast to fp32, log-softmax saved, fp32 gradient
    vocab_parallel = "vocab-parallel"  # Megatron's fused vocab-parallel cross-entropy: fp32 softmax in place
    fused = (
        "fused"  # a fused kernel (flash-attn's cross_entropy, llm-foundry's default): 16-bit logits, in-kernel softmax
    )


class Schedule(str, Enum):
    """Pipeline schedule (Narayanan et al. 2021, sec. 2.2)."""

    gpipe = "gpipe"
    one_f_one_b = "1f1b"
    interleaved_1f1b = "interleaved-1f1b"


class Recompute(str, Enum):
    """Activation recomputation (Korthikanti et al. 2022).

    none: keep every activation; selective: recompute only the core attention
    (QK^T, softmax, dropout, AV); full: keep only each layer's input and rerun its forward
    during backward.
    """

    none = "none"
    selective = "selective"
    full = "full"
    mixed = "mixed"  # layers under different modes: Plan.stage_recompute says which (schema 1.3)


class Axis(str, Enum):
    """Parallel axes, one per degree of a layout (Plan.dp, .tp, .pp, .cp, .ep). Glossary
    (docs/glossary.md): dp = data parallel (replicas of the model, each on a slice of the batch);
    tp = tensor parallel (each weight matrix split across GPUs); pp = pipeline parallel
    (consecutive layers on different GPUs); cp = context parallel (each sequence split across
    GPUs, inside the dp axis of the mesh); ep = expert parallel (a MoE layer's experts split
    across GPUs of tp x dp x cp). The first three are the mesh's axes (MESH_AXES), which
    mesh_order orders."""

    dp = "dp"
    tp = "tp"
    pp = "pp"
    cp = "cp"
    ep = "ep"


MESH_AXES = (Axis.dp, Axis.tp, Axis.pp)  # what mesh_order orders; cp and ep live inside them


# --------------------------------------------------------------------------- job


class JobSpec(_Spec):
    """The training job: what must be computed per optimizer step."""

    global_batch_size: Integer(1, MAX_GLOBAL_BATCH) = Field(
        description="Sequences per optimizer step, summed over data-parallel replicas."
    )
    seq_len: Integer(1, MAX_SEQ_LEN) = Field(description="Tokens per sequence.")
    precision: DType = Field(
        default=DType.bf16, description="Compute dtype (bf16/fp16 = mixed precision with fp32 master weights)."
    )
    optimizer: Optimizer = Field(
        default=Optimizer.adam, description="Optimizer; Adam keeps two fp32 moments per parameter."
    )
    target: Target = Field(
        default=Target.generic,
        description="Training stack the plan will run on: selects its kernels (fused attention) and overlap features.",
    )
    flash_attention: bool = Field(
        default=True,
        description="Fused attention kernel (FlashAttention / SDPA): no s x s score matrix is stored; False reproduces Korthikanti et al.'s unfused accounting.",
    )
    moe_dispatcher: str = Field(
        default="alltoall",
        description="How MoE tokens reach their experts across nodes: 'alltoall' (one copy per routed expert: Megatron's "
        "alltoall dispatcher, torchtitan) or 'deepep' (DeepEP: one copy per destination node, fanned out over NVLink "
        "there) (schema 1.4).",
    )
    grad_reduce_bf16: bool = Field(
        default=False,
        description="Gradients accumulated and reduced in bf16 where the stack's default is fp32: Megatron-LM's "
        "--grad-reduce-in-bf16 (without it Megatron keeps fp32 main gradients under --bf16, 4 bytes a parameter; "
        "Megatron-Bridge's and NeMo's performance recipes set it). The other stacks keep their own gradient dtype "
        "whatever this says (DeepSpeed and Accelerate: 16-bit; torchtitan: fp32 shards). (schema 1.14)",
    )
    loss_kernel: Optional[LossKernel] = Field(
        default=None,
        description="Cross-entropy implementation (what the loss keeps per logit); None: the target's (megatron: vocab-parallel, others: eager).",
    )
    attention_kernel: Optional[str] = Field(
        default=None,
        description="Fused attention kernel the job runs, one of the device table's ('flash2': FlashAttention-2 through SDPA, "
        "'cudnn': Transformer Engine's cuDNN attention); None: the target's (megatron: cudnn, others: flash2). (schema 1.8)",
    )

    @field_validator("attention_kernel")
    @classmethod
    def _attention_kind(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and v not in ATTENTION_KERNELS:
            raise ValueError(f"attention_kernel must be one of {', '.join(ATTENTION_KERNELS)}, not {v!r}")
        return v

    @field_validator("moe_dispatcher")
    @classmethod
    def _dispatcher_kind(cls, v: str) -> str:
        if v not in ("alltoall", "deepep"):
            raise ValueError(f"moe_dispatcher must be 'alltoall' or 'deepep', not {v!r}")
        return v


# --------------------------------------------------------------------------- plan


class StageRecompute(_Spec):
    """How many layers of one pipeline stage run under each recompute mode (Megatron-style partial recompute)."""

    none: Integer(0, MAX_LAYERS) = Field(default=0, description="Layers that keep all activations.")
    selective: Integer(0, MAX_LAYERS) = Field(default=0, description="Layers that recompute only the core attention.")
    full: Integer(0, MAX_LAYERS) = Field(
        default=0, description="Layers that keep only their input and rerun the forward in backward."
    )

    @property
    def layers(self) -> int:
        return self.none + self.selective + self.full


class PlanError(ValueError):
    """A plan that cannot be laid out; the message names the factor to change."""


def world_size_problem(dp: int, cp: int, tp: int, pp: int, num_gpus: int) -> Optional[str]:
    """Why dp x cp x tp x pp does not make `num_gpus` GPUs (naming the factors to change), or None."""
    if dp * cp * tp * pp == num_gpus:
        return None
    names, values = (
        ("dp x cp x tp x pp", f"{dp} x {cp} x {tp} x {pp}") if cp > 1 else ("dp x tp x pp", f"{dp} x {tp} x {pp}")
    )
    return (
        f"{names} = {values} = {dp * cp * tp * pp}, but the cluster has {num_gpus} GPUs; "
        f"change {names.replace(' x ', ', ')} so that their product is {num_gpus}"
    )


def shard_problem(dp: int, dp_shard: Optional[int], zero_stage: int) -> Optional[str]:
    """Why `dp_shard` ranks per ZeRO shard group do not fit dp and the ZeRO stage (naming what to
    change), or None; None and dp itself are the plain layout."""
    if not dp_shard or dp_shard == dp:
        return None
    if dp % dp_shard:
        fits = [d for d in range(1, dp) if dp % d == 0]
        return f"dp_shard {dp_shard} does not divide dp {dp}; use one of {', '.join(map(str, fits[-6:]))} or {dp} (no replicas)"
    if zero_stage == 0:
        return f"dp_shard {dp_shard} below dp {dp} shards the model states: it needs ZeRO stage 1, 2 or 3 (zero_stage 0 shards nothing)"
    return None


# Plan fields (booleans) that only some stacks run: a Plan with one on refuses a target without it
# (Plan's check below), and a what-if to such a target drops it (planner/inputs.py:what_if_layout).
STACK_FEATURES = ("tp_comm_overlap", "recompute_norm_act")


class Plan(_Spec):
    """A parallel layout of one training job on one cluster."""

    dp: Integer(1, MAX_GPUS) = Field(description="Data-parallel degree (model replicas).")
    cp: Integer(1, MAX_GPUS) = Field(
        default=1,
        description="Context-parallel degree: each sequence split over cp ranks (ring attention: keys/values passed around "
        "the ring, load-balanced causal chunks); cp sits inside the dp axis of mesh_order (ranks tp, then cp, then dp); "
        "weights are replicated over dp x cp, which gradients are reduced and ZeRO shards over (schema 1.4).",
    )
    fp8: bool = Field(
        default=False,
        description="GEMMs in FP8 (Transformer Engine / torchao style: E4M3 forward, E5M2 gradients, per-tensor scales), "
        "attention, norms and communication in the job's 16-bit precision; needs a device with FP8 (schema 1.4).",
    )
    ep: Integer(1, MAX_GPUS) = Field(
        default=1,
        description="Expert-parallel degree (mixture-of-experts): each MoE layer's experts are split over ep ranks of the "
        "tp x dp block (Megatron-Core's parallel folding with expert-TP 1); ep divides tp x dp and the expert count (schema 1.4).",
    )
    tp: Integer(1, MAX_GPUS) = Field(description="Tensor-parallel degree (each weight matrix split this many ways).")
    pp: Integer(1, MAX_GPUS) = Field(description="Pipeline-parallel degree (pipeline ranks).")
    vpp: Integer(1, MAX_LAYERS) = Field(
        default=1,
        description="Virtual pipeline stages (model chunks) per pipeline rank; >1 only with the interleaved schedule.",
    )
    micro_batch_size: Integer(1, MAX_GLOBAL_BATCH) = Field(
        description="Sequences per micro-batch per data-parallel replica."
    )
    num_micro_batches: Integer(1, MAX_GLOBAL_BATCH) = Field(
        description="Micro-batches per optimizer step per replica (gradient accumulation)."
    )
    schedule: Schedule = Field(default=Schedule.one_f_one_b, description="Pipeline schedule.")
    recompute: Recompute = Field(
        default=Recompute.none,
        description="Recompute mode of every layer; 'mixed' when stage_recompute puts layers under different modes. With "
        "stage_recompute it must agree with it (the one mode used, or 'mixed'); left out, it is derived from it.",
    )
    stage_recompute: Optional[list[StageRecompute]] = Field(
        default=None,
        description="Per virtual stage, how many layers run under each recompute mode (none, selective, full).",
    )
    recompute_norm_act: bool = Field(
        default=False,
        description="In the layers not fully recomputed, also recompute in backward the outputs of the norms that run as kernels "
        "of their own (not fused into the linear layer after them) and of the MoE experts' activation (a clamped GLU's clamps "
        "with it), instead of keeping them: Megatron-Core's --recompute-modules layernorm moe_act, output-discarding "
        "checkpoints. Saves those tensors, runs their kernels again; no full recompute with it; needs a target that has it "
        "(schema 1.11).",
    )
    zero_stage: Integer(0, 3) = Field(
        default=0, description="ZeRO stage: 1 shards optimizer states, 2 also gradients, 3 also parameters (FSDP)."
    )
    dp_shard: Optional[Integer(1, MAX_GPUS)] = Field(
        default=None,
        description="Hybrid sharding: data-parallel ranks per ZeRO shard group (with cp: dp_shard x cp ranks); the states are "
        "sharded within the group and dp / dp_shard replicas of it each hold them whole; gradients are reduce-scattered "
        "within the group and all-reduced across replicas (torchtitan's data_parallel_shard_degree, DeepSpeed MiCS, "
        "Megatron's distributed-optimizer instances, FSDP HYBRID_SHARD). Divides dp; below dp only with ZeRO stage 1-3. "
        "Left out (or dp): one group of all dp ranks (schema 1.15).",
    )
    sequence_parallel: bool = Field(
        default=False, description="Megatron sequence parallelism: norms/dropout sharded over the TP group."
    )
    tp_comm_overlap: bool = Field(
        default=False,
        description="Overlap TP all-gathers / reduce-scatters with the GEMMs beside them (Megatron --tp-comm-overlap, torchtitan async "
        "TP): needs sequence parallelism and a target that has it; costs communication buffers.",
    )
    layers_per_stage: Optional[list[Integer(0, MAX_LAYERS)]] = Field(
        default=None,
        description="Transformer layers of each virtual stage in pipeline order (length pp*vpp; virtual stage j runs on pipeline rank j % pp); None = as even as possible.",
    )
    mesh_order: list[Axis] = Field(
        default=[Axis.tp, Axis.dp, Axis.pp],
        description="Mesh axes from innermost (consecutive ranks, inside a node) to outermost.",
        json_schema_extra={"items": {"enum": [a.value for a in MESH_AXES], "type": "string"}},  # cp, ep live inside
    )

    @property
    def world_size(self) -> int:
        return self.dp * self.cp * self.tp * self.pp

    @property
    def virtual_stages(self) -> int:
        return self.pp * self.vpp

    @model_validator(mode="before")
    @classmethod
    def _one_shard_spelling(cls, data):
        """dp_shard equal to dp is the plain layout: one spelling (left out) for it."""
        if isinstance(data, dict) and data.get("dp_shard") is not None and data.get("dp_shard") == data.get("dp"):
            data = {k: v for k, v in data.items() if k != "dp_shard"}
        return data

    @model_serializer(mode="wrap")
    def _without_default_shard(self, handler):
        """A plan without hybrid sharding is written as before dp_shard existed."""
        out = handler(self)
        if isinstance(out, dict) and out.get("dp_shard") is None:
            out.pop("dp_shard", None)
        return out

    @model_validator(mode="before")
    @classmethod
    def _derive_recompute(cls, data):
        """`recompute` left out next to `stage_recompute`: the mode every layer uses, or mixed."""
        if isinstance(data, dict) and data.get("stage_recompute") and "recompute" not in data:
            modes = {m for r in data["stage_recompute"] for m, k in _recompute_items(r) if k}
            data = {**data, "recompute": modes.pop() if len(modes) == 1 else Recompute.mixed.value}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> "Plan":
        if self.stage_recompute is None and self.recompute == Recompute.mixed:
            raise PlanError(
                "recompute 'mixed' needs stage_recompute (how many layers of each stage run under each mode)"
            )
        if self.stage_recompute is not None:
            used = [m for m in ("none", "selective", "full") if any(getattr(r, m) for r in self.stage_recompute)]
            want = used[0] if len(used) == 1 else Recompute.mixed.value
            if self.recompute.value != want:
                raise PlanError(
                    f"recompute says {self.recompute.value!r} but stage_recompute puts layers under {', '.join(used) or 'no mode'}; "
                    f"set recompute to {want!r} or leave it out"
                )
        if sorted(a.value for a in self.mesh_order) != ["dp", "pp", "tp"]:
            raise PlanError(f"mesh_order must name dp, tp and pp once each, got {[a.value for a in self.mesh_order]}")
        if self.vpp > 1 and self.schedule != Schedule.interleaved_1f1b:
            raise PlanError(f"vpp={self.vpp} needs schedule 'interleaved-1f1b', not {self.schedule.value!r}")
        if self.schedule == Schedule.interleaved_1f1b and self.pp == 1:
            raise PlanError("the interleaved schedule needs pp > 1")
        if self.sequence_parallel and self.tp == 1:
            raise PlanError("sequence_parallel needs tp > 1")
        problem = shard_problem(self.dp, self.dp_shard, self.zero_stage)
        if problem:
            raise PlanError(problem)
        if self.recompute_norm_act and self.stage_recompute_has_full():
            raise PlanError(
                "recompute_norm_act recomputes the norms and the experts' activation of layers that keep their activations; "
                "a fully recomputed layer reruns its whole forward already: drop recompute_norm_act or use recompute 'none' "
                "or 'selective'"
            )
        if self.tp_comm_overlap and not self.sequence_parallel:
            raise PlanError(
                "tp_comm_overlap needs sequence_parallel (and tp > 1): the overlap pipelines its all-gathers and reduce-scatters"
            )
        if self.layers_per_stage is not None:
            if len(self.layers_per_stage) != self.virtual_stages:
                raise PlanError(
                    f"layers_per_stage has {len(self.layers_per_stage)} entries but pp x vpp = {self.pp} x {self.vpp} = {self.virtual_stages}"
                )
            if min(self.layers_per_stage) < 1:
                raise PlanError(
                    f"every pipeline stage needs at least one layer, got layers_per_stage={self.layers_per_stage}"
                )
        if self.stage_recompute is not None:
            if len(self.stage_recompute) != self.virtual_stages:
                raise PlanError(
                    f"stage_recompute has {len(self.stage_recompute)} entries but pp x vpp = {self.virtual_stages}"
                )
            if self.layers_per_stage is not None:
                for j, (n, r) in enumerate(zip(self.layers_per_stage, self.stage_recompute)):
                    if r.layers != n:
                        raise PlanError(
                            f"stage {j}: stage_recompute counts {r.layers} layers but layers_per_stage says {n}"
                        )
        return self

    def stage_recompute_has_full(self) -> bool:
        """Whether any layer is fully recomputed."""
        if self.stage_recompute is not None:
            return any(r.full for r in self.stage_recompute)
        return self.recompute == Recompute.full

    def stage_layers(self, num_layers: int) -> list[int]:
        """Layers per virtual stage: the explicit split, or the default as-even-as-possible one
        (extra layers go to middle stages: the first carries the embedding, the last the LM head)."""
        if self.layers_per_stage is not None:
            return list(self.layers_per_stage)
        return even_split(num_layers, self.virtual_stages)

    def stage_recompute_counts(self, num_layers: int) -> list[StageRecompute]:
        if self.stage_recompute is not None:
            return list(self.stage_recompute)
        mode = self.recompute.value
        return [
            StageRecompute.model_construct(**cast("dict[str, Any]", {"none": 0, "selective": 0, "full": 0, mode: n}))
            for n in self.stage_layers(num_layers)
        ]

    @property
    def layout(self) -> Layout:
        """The plan's layout, less its layer split and recompute (what the cost model prices)."""
        return Layout(
            dp=self.dp,
            tp=self.tp,
            pp=self.pp,
            vpp=self.vpp,
            micro_batch_size=self.micro_batch_size,
            num_micro_batches=self.num_micro_batches,
            schedule=self.schedule,
            zero_stage=self.zero_stage,
            sequence_parallel=self.sequence_parallel,
            mesh_order=tuple(self.mesh_order),
            tp_comm_overlap=self.tp_comm_overlap,
            ep=self.ep,
            fp8=self.fp8,
            cp=self.cp,
            recompute_norm_act=self.recompute_norm_act,
            dp_shard=self.dp_shard or 0,
        )

    def validate_for(self, model: ModelSpec, job: JobSpec, num_gpus: Optional[int] = None) -> None:
        """Check the plan against a model, job and GPU count; raise PlanError naming the factor to change."""
        problem = None if num_gpus is None else world_size_problem(self.dp, self.cp, self.tp, self.pp, num_gpus)
        if problem:
            raise PlanError(problem)
        problem = tp_problem(model, self.tp)
        if problem:
            raise PlanError(problem)
        if model.num_layers < self.virtual_stages:
            raise PlanError(
                f"{model.name} has {model.num_layers} layers, fewer than pp x vpp = {self.pp} x {self.vpp} = {self.virtual_stages} pipeline stages"
            )
        if self.layers_per_stage is not None and sum(self.layers_per_stage) != model.num_layers:
            raise PlanError(
                f"layers_per_stage sums to {sum(self.layers_per_stage)} but {model.name} has {model.num_layers} layers"
            )
        if self.stage_recompute is not None and sum(r.layers for r in self.stage_recompute) != model.num_layers:
            raise PlanError(
                f"stage_recompute counts {sum(r.layers for r in self.stage_recompute)} layers but {model.name} has {model.num_layers}"
            )
        per_step = self.dp * self.micro_batch_size * self.num_micro_batches
        if per_step != job.global_batch_size:
            raise PlanError(
                f"dp x micro_batch_size x micro_batches = {self.dp} x {self.micro_batch_size} x {self.num_micro_batches} = {per_step}, "
                f"but the global batch is {job.global_batch_size}"
            )
        if self.schedule == Schedule.interleaved_1f1b and self.num_micro_batches % self.pp:
            raise PlanError(
                f"the interleaved schedule needs micro-batches ({self.num_micro_batches}) to be a multiple of pp ({self.pp})"
            )
        problem = seq_problem(model, job.seq_len)
        if problem:
            raise PlanError(problem)
        problem = ep_problem(model, self.dp * self.cp, self.tp, self.ep, self.sequence_parallel)
        if problem:
            raise PlanError(problem)
        problem = cp_problem(self.cp, self.tp, self.sequence_parallel, job)
        if problem:
            raise PlanError(problem)
        if model.first_dense_layers and self.stage_layers(model.num_layers)[0] < model.first_dense_layers:
            raise PlanError(
                f"the first pipeline stage holds {self.stage_layers(model.num_layers)[0]} layers, fewer than the "
                f"{model.first_dense_layers} dense layers {model.name} starts with; give it at least that many"
            )


def _recompute_items(r) -> list:
    """(mode, layers) pairs of a StageRecompute or its dict form."""
    if isinstance(r, dict):
        return [(m, r.get(m, 0)) for m in ("none", "selective", "full")]
    return [(m, getattr(r, m, 0)) for m in ("none", "selective", "full")]


def cp_problem(cp: int, tp: int, sequence_parallel: bool, job: JobSpec) -> Optional[str]:
    """Why context parallelism `cp` cannot split this job's sequences, or None."""
    if cp == 1:
        return None
    if job.seq_len % (2 * cp):
        return (
            f"cp={cp}: the sequence ({job.seq_len} tokens) must split into 2 x cp = {2 * cp} equal chunks "
            "(causal load balancing gives each rank one early and one late chunk)"
        )
    if not job.flash_attention:
        return f"cp={cp} needs a fused attention kernel (ring attention runs blockwise); drop --no-flash-attention"
    if sequence_parallel and (job.seq_len // cp) % tp:
        return f"cp={cp}: each rank's {job.seq_len // cp} tokens do not split over tp={tp} for sequence parallelism"
    return None


def ep_problem(model: ModelSpec, dp: int, tp: int, ep: int, sequence_parallel: bool) -> Optional[str]:
    """Why expert parallelism `ep` cannot split this model's experts over the layout, or None."""
    if not model.is_moe:
        return f"ep={ep}: {model.name} has no experts (a dense model); use ep=1" if ep > 1 else None
    assert model.num_experts is not None  # model.is_moe
    if model.num_experts % ep:
        return f"ep={ep} does not divide the {model.num_experts} experts of {model.name}"
    if (tp * dp) % ep:
        return f"ep={ep} does not divide tp x dp = {tp} x {dp}: expert-parallel groups are carved from those ranks"
    if tp > 1 and not sequence_parallel:
        return "a mixture-of-experts layer with tp > 1 needs sequence_parallel (each TP rank dispatches its sequence shard)"
    return None


def tp_problem(model: ModelSpec, tp: int) -> Optional[str]:
    """Why `tp` cannot shard this model's heads and FFN (Megatron's column/row split), or None."""
    if model.num_heads % tp:
        return f"tp={tp} does not divide the {model.num_heads} attention heads of {model.name}"
    if model.kv_heads % tp and tp % model.kv_heads:
        return f"tp={tp} and the {model.kv_heads} KV heads of {model.name} do not divide each other"
    if model.ffn % tp:
        return f"tp={tp} does not divide the FFN width {model.ffn} of {model.name}"
    return None


def seq_problem(model: ModelSpec, seq_len: int) -> Optional[str]:
    """Why this model cannot train on `seq_len` tokens (beyond its learned position table), or None."""
    if model.learned_position_embeddings and seq_len > model.max_seq_len:
        return f"seq_len {seq_len} exceeds the {model.max_seq_len} learned positions of {model.name}"
    return None


def even_split(total: int, parts: int) -> list[int]:
    """Split `total` items into `parts` counts differing by at most one, extras to the middle."""
    base, extra = divmod(total, parts)
    counts = [base] * parts
    # Hand the remainder out from the centre outwards.
    order = sorted(range(parts), key=lambda i: (abs(i - (parts - 1) / 2), i))
    for i in order[:extra]:
        counts[i] += 1
    return counts


@dataclass(frozen=True, order=True)
class Layout:
    """A layout: every parallel degree, the micro-batching and schedule, ZeRO sharding and the
    kernels' switches; everything a Plan fixes but the layer split and recompute. The search
    enumerates these (planner/search/candidates.py) and the cost model prices one
    (cost_models/tables.py:layout_costs); the names are Plan's, one per concept
    (docs/glossary.md)."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    vpp: int = 1
    micro_batch_size: int = 1
    num_micro_batches: int = 1
    schedule: Schedule = Schedule.one_f_one_b
    zero_stage: int = 0
    sequence_parallel: bool = False
    mesh_order: tuple = (Axis.tp, Axis.dp, Axis.pp)  # Plan's default
    tp_comm_overlap: bool = False
    ep: int = 1  # expert parallelism (MoE models): experts split over ep ranks of tp x dp
    fp8: bool = False  # GEMMs in FP8
    cp: int = 1  # context parallelism: each sequence split over cp ranks (inside the dp axis)
    recompute_norm_act: bool = False  # Plan.recompute_norm_act (its layers never fully recomputed)
    dp_shard: int = 0  # Plan.dp_shard: dp ranks per ZeRO shard group; 0 = all of dp (also what dp itself becomes)

    def __post_init__(self):
        if self.dp_shard and (self.dp_shard == self.dp or self.zero_stage == 0):
            object.__setattr__(self, "dp_shard", 0)  # one spelling of the plain layout

    @property
    def shard_dp(self) -> int:
        """Data-parallel ranks per ZeRO shard group (all of dp unless hybrid)."""
        return self.dp_shard or self.dp

    @property
    def replicas(self) -> int:
        """Replicas of the shard group (1 unless hybrid)."""
        return self.dp // self.shard_dp

    def plan(self, layers_per_stage=None, stage_recompute=None, recompute: Recompute = Recompute.none) -> Plan:
        return Plan(
            dp=self.dp,
            tp=self.tp,
            pp=self.pp,
            vpp=self.vpp,
            micro_batch_size=self.micro_batch_size,
            ep=self.ep,
            fp8=self.fp8,
            cp=self.cp,
            num_micro_batches=self.num_micro_batches,
            schedule=self.schedule,
            zero_stage=self.zero_stage,
            sequence_parallel=self.sequence_parallel,
            mesh_order=list(self.mesh_order),
            tp_comm_overlap=self.tp_comm_overlap,
            recompute_norm_act=self.recompute_norm_act,
            dp_shard=self.dp_shard or None,
            layers_per_stage=layers_per_stage,
            stage_recompute=stage_recompute,
            recompute=recompute,
        )

    @property
    def global_batch_size(self) -> int:
        return self.dp * self.micro_batch_size * self.num_micro_batches
