"""What a training stack is, as data: `Stack` (its kernels, its overlap, how it shards ZeRO-3,
what it can express and where its exporter is) and `Rules` (what it can express, as fields),
with the `Export` an exporter returns. Each stack's folder builds one of each
(planner/stacks/<name>/); the package docstring (planner/stacks/__init__.py) says who reads
what. Rules are read by `plan export` (refuse what breaks a rule), by the search (`plan solve
--target`: candidates.py filters layouts, ilp.py constrains the layer split and recompute) and
by docs/export.md's table."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import import_module
from typing import Callable, Optional

from planner.specs import (
    ATTENTION_KERNELS,
    Activation,
    Axis,
    Collective,
    Layout,
    LossKernel,
    ModelSpec,
    Plan,
    Schedule,
    Target,
)

ZERO3 = ("deepspeed", "fsdp2", "none")  # Stack.zero3's values


def _nothing(*_args) -> list[str]:
    return []


@dataclass(frozen=True, eq=False)
class Stack:
    """One training stack, everything the planner knows of it. Built once, in the stack's folder
    (planner/stacks/<name>/__init__.py); read through planner.stacks.get."""

    name: str  # the Target value (`--target`, `--to`) and the folder's name
    attention_kernel: str  # the device table's fused-attention entry its attention runs (one of ATTENTION_KERNELS)
    loss_kernel: LossKernel  # the cross-entropy it runs (a job's loss_kernel overrides it)
    tp_comm_overlap: bool  # whether it overlaps TP communication with the GEMMs beside it (Plan.tp_comm_overlap)
    # How it shards ZeRO-3 (weights, gradients and optimizer state): "deepspeed" (DeepSpeed's
    # ZeRO-3 engine), "fsdp2" (torch's fully_shard, per block), "none" (it has no ZeRO-3)
    zero3: str
    rules: Optional[Rules] = None  # what it can express; None: every layout the cost model prices
    # ModelSpec -> the architecture fields it cannot build: a stack with any is not searched at all
    model_problems: Callable = _nothing
    # (layout, model, job) -> what it cannot run of a layout beyond `rules`; the layout is a Plan
    # or a search candidate (a Layout), so only the fields both have are read
    layout_problems: Callable = _nothing
    problems: Callable = _nothing  # (plan, model, job) -> layout_problems and what depends on the layer split
    # The module that writes its configuration: export(plan, model, job, num_gpus[, gpus_per_node])
    # -> Export, and read_back; imported on first use. None: `plan export` has no such stack.
    exporter: Optional[str] = None
    kernels: Optional[Kernels] = None  # the kernels a layer of its code launches; None: generic's (the executor's)
    # Multi-head latent attention under TP: True, each rank applies the (duplicated) down-
    # projections to its own tokens under sequence parallelism and TP gathers the latents
    # (Megatron-Core's MLASelfAttention); False, TP gathers the layer input and every rank
    # projects all tokens (torchtitan's deepseek_v3: wq_a and wkv_a NoParallel)
    mla_local_down_projections: bool = False
    # Whether it recomputes the norms' and the experts' activation outputs in backward instead of
    # keeping them (Plan.recompute_norm_act)
    recompute_norm_act: bool = False
    # Where it reduces the data-parallel gradients of ZeRO 0-1 (gradient_reduce): beside the last
    # micro-batch's backward, bucket by bucket (False), or after the backward pass, where nothing
    # hides it (True): at ZeRO-0 (`zero0`), and whenever pp > 1 (`pipeline`)
    reduce_after_backward_zero0: bool = False
    reduce_after_pipeline: bool = False
    # How it holds weights, gradients and optimizer states and what shards them: one of
    # cost_models/memory.py:STATE_RECIPES, whose comment cites each stack's code (checked by
    # tests/unit/stacks/test_memory.py: cost_models imports this package, not the other way round)
    model_states: str = "zero"

    def __post_init__(self):  # internal invariants of a stack's folder, not user input
        if self.kernels is None:
            object.__setattr__(self, "kernels", EAGER)
        if self.attention_kernel not in ATTENTION_KERNELS or self.zero3 not in ZERO3:
            raise ValueError(f"stack {self.name}: attention_kernel {self.attention_kernel!r}, zero3 {self.zero3!r}")
        r = self.rules
        if r is not None and (r.stack, r.tp_comm_overlap, 3 in r.zero_stages, r.recompute_norm_act) != (
            self.name,
            self.tp_comm_overlap,
            self.zero3 != "none",
            self.recompute_norm_act,
        ):
            raise ValueError(
                f"stack {self.name}: its Rules are {r.stack}'s or disagree on TP overlap, ZeRO-3 or norm/act recompute"
            )

    @property
    def target(self) -> Target:
        return Target(self.name)

    def gradient_reduce(self, pp: int, zero_stage: int) -> tuple[bool, Collective]:
        """(whether its ZeRO 0-1 gradient reduction hides beside backward, the collective that
        reduces them: ZeRO-0 all-reduces, ZeRO-1 reduce-scatters) for a layout of `pp` stages."""
        after = (zero_stage == 0 and self.reduce_after_backward_zero0) or (pp > 1 and self.reduce_after_pipeline)
        return not after, Collective.all_reduce if zero_stage == 0 else Collective.reduce_scatter

    def export(self, plan: Plan, model: ModelSpec, job, num_gpus: int, gpus_per_node: Optional[int] = None) -> Export:
        """Its exporter's configuration for `plan` (no checks: planner.stacks.export checks first).
        `gpus_per_node` goes to exporters that name the node count (accelerate)."""
        assert self.exporter is not None  # planner.stacks.export exports only the stacks that have one
        module = import_module(self.exporter)
        if "gpus_per_node" in inspect.signature(module.export).parameters:
            return module.export(plan, model, job, num_gpus, gpus_per_node=gpus_per_node)
        return module.export(plan, model, job, num_gpus)


@dataclass(frozen=True)
class Kernels:
    """The kernels one transformer layer launches in forward as a stack's code runs it, by
    operator (backward launches about twice as many); cost_models/compute.py:layer_kernels adds
    them up for a model and charges each a gap (DeviceSpec.kernel_overhead_us). What a stack
    fuses shows here as one kernel where eager PyTorch launches several."""

    separate_qkv: bool  # q, k and v projections as three GEMMs (else one fused QKV GEMM)
    separate_gate_up: bool  # a gated MLP's gate and up projections as two GEMMs (else one)
    layernorm: int  # per LayerNorm
    rmsnorm: int  # per RMSNorm (QK-norm's too)
    rotary: int  # rotating q and k, both (with any copy their rotated layout costs later)
    activation: int  # GELU after fc1
    gated_activation: int  # act(gate x) * up x
    residual: int  # one residual add, with the dropout before it where the stack fuses them
    dropout: int  # a dropout before a residual add, where not fused into it (models with dropout)
    kv_repeat: int  # per K and V tensor under grouped-query attention (0: the kernel reads shared heads)
    softmax: int  # unfused attention between its two batched GEMMs: scale, mask, softmax (+ casts)
    attention_out: int  # copies of the attention output into the output projection's layout
    # A mixture-of-experts layer (cost_models/compute.py:moe_kernels): its router, routing
    # bookkeeping, dispatch and combine (all-to-alls and permutations), the experts' GEMMs and
    # activation excluded; one count per stack, as its default dispatch path launches them
    # (approximated alike for another dispatcher, e.g. DeepEP, and at ep 1, with no all-to-all)
    moe_dispatch: int = 4
    # How the local experts' MLPs are launched: "grouped", one grouped GEMM per projection and one
    # activation kernel for all of them; "gemm_per_expert", one GEMM per local expert and projection
    # (a grouped linear layer that loops over cuBLAS), one activation kernel; "loop", each expert's
    # MLP on its own (its GEMMs and activation)
    experts: str = "grouped"
    expert_extra: int = 0  # kernels per local expert besides its MLP (a loop's gather and scatter)
    expert_bias: int = 0  # kernels per local expert that add a biased expert's output bias outside its GEMM
    # forward passes over the experts' output (assignments x h, each a read or a write) adding that
    # bias costs, backward the same (the bias's and the routing weights' gradients, two reductions)
    expert_bias_passes: int = 0
    # A clamped gated MLP (ModelSpec.glu_limit, GPT-OSS): kernels clamping the gate and linear halves
    # before the activation, and their forward passes over one half (tokens x f, each a read or a
    # write): two clamps, each reading and writing its half
    glu_clamp: int = 2
    glu_clamp_passes: int = 4
    # Rotary embedding with an attention factor (ModelSpec.rope_attention_factor, YaRN): where the
    # stack's fused kernel cannot apply it, the kernels rotating q and k (both) instead and their
    # forward passes over q and k (the fused kernel's 2: one read, one write); 0: as without it (the
    # factor folded into the cos and sin tables)
    scaled_rotary: int = 0
    scaled_rotary_passes: int = 0
    # The norms before the attention's and a dense MLP's first linear layers fused into those layers,
    # which keep the normalised input themselves (Transformer Engine's LayerNormLinear): no norm
    # output of its own to discard (Plan.recompute_norm_act). A MoE layer's pre-MLP norm (it feeds
    # the router and the dispatch) and multi-head latent attention's input norm stay separate.
    norm_in_linear: bool = False

    def __post_init__(self):
        if self.experts not in ("grouped", "gemm_per_expert", "loop"):
            raise ValueError(f"Kernels.experts is 'grouped', 'gemm_per_expert' or 'loop', not {self.experts!r}")


# PyTorch eager as `plan run`'s executor runs a layer (planner/distributed/reference_model.py:
# Block), what generic states; tests/unit/stacks/test_registry.py counts the executor's operators to check it.
EAGER = Kernels(
    separate_qkv=True,
    separate_gate_up=True,
    layernorm=1,
    rmsnorm=6,  # x * rsqrt(mean(x^2) + eps) * w: pow, mean, add, rsqrt, two products
    rotary=15,  # per tensor 4 products, a difference, a sum, the interleaving stack; then the
    # rotated head-major q makes the attention output need one copy back to token order
    activation=1,
    gated_activation=2,
    residual=1,
    dropout=0,  # the executor has no dropout
    kv_repeat=1,  # repeat_interleave of the shared heads
    softmax=1,
    attention_out=0,
    # its MoE (reference_model.py:MoE): router GEMM, top-k, softmax, sort, bincount, the
    # copies' source rows (divide, gather); after the experts their concatenation, the
    # inverse sort and its gather, the weighting and the sum over choices (12); each
    # local expert an MLP module of its own
    moe_dispatch=12,
    experts="loop",
)

# A Hugging Face transformers model (modeling_llama.py and kin) run eagerly, what DeepSpeed and
# Accelerate train (the user's module): q, k, v and gate, up as separate projections;
# LlamaRMSNorm in eager ops (upcast, pow, mean, add, rsqrt, product, downcast, weight: 8);
# nn.LayerNorm one kernel; apply_rotary_pos_emb (q cos + rotate_half(q) sin: product, negation,
# concatenation, product, sum: 5 per tensor); act(gate) * up (2); dropout beside each residual
# add; SDPA with enable_gqa when there is no mask (integrations/sdpa_attention.py: no K/V
# repeat), its output transposed contiguous (1); eager attention's scale, mask, fp32 softmax,
# downcast (4) between its two matmuls. Its sparse MoE blocks (modeling_mixtral.py
# MixtralSparseMoeBlock and kin): router GEMM, softmax, top-k, the weights' renormalisation (sum,
# divide) and cast, one-hot routing mask and its permute, the experts hit (sum, compare, nonzero)
# (11); then a Python loop over the experts hit: the token rows (where, gather), the expert MLP,
# the routing weights' gather and the product by them, index_add into the output (5 besides the MLP).
TRANSFORMERS = Kernels(
    separate_qkv=True,
    separate_gate_up=True,
    layernorm=1,
    rmsnorm=8,
    rotary=10,
    activation=1,
    gated_activation=2,
    residual=1,
    dropout=1,
    kv_repeat=0,
    softmax=4,
    attention_out=1,
    moe_dispatch=11,
    experts="loop",
    expert_extra=5,
)


@dataclass(frozen=True)
class Export:
    """A stack's configuration for one plan."""

    stack: str
    text: str  # what `plan export` prints / writes: shell arguments, JSON or YAML
    data: object  # the same as structured data (argument list, dict) for --json and tests
    kind: str  # "args" | "json" | "yaml"


# A feature (a boolean Plan field) a stack may lack, as layout_problems names it.
_FEATURES = {
    "fp8": "FP8 GEMMs (this export of {stack} has no FP8 recipe)",
    "sequence_parallel": "sequence parallelism ({stack} has none)",
    "tp_comm_overlap": "TP communication overlap ({stack} has none)",
    "recompute_norm_act": "recompute of the norms and the experts' activation ({stack} has none)",
}


@dataclass(frozen=True)
class Rules:
    """What one stack can express. Layout-level fields filter candidates; `split` and
    `recompute` constrain the ILP's layer split and per-stage recompute."""

    stack: str
    zero_stages: tuple = (0, 1, 2, 3)  # ZeRO stages the stack has at all
    zero_stages_with_pp: tuple = (0, 1, 2, 3)  # ... when pp > 1
    zero_stages_with_tp: tuple = (0, 1, 2, 3)  # ... when tp > 1
    # ZeRO stages the stack runs with hybrid sharding (Plan.dp_shard below dp: shard within a
    # group, replicate across groups); () none
    hybrid_zero_stages: tuple = (1, 2, 3)
    max_pp: Optional[int] = None  # None: any; 1: no pipeline parallelism
    max_tp: Optional[int] = None
    tp_with_pp: bool = True  # tensor and pipeline parallelism together
    max_ep: Optional[int] = None  # expert parallelism (MoE): None any, 1 none
    max_cp: Optional[int] = None  # context parallelism (a ring over sequence chunks): None any, 1 none
    fp8: bool = False  # FP8 GEMMs (Plan.fp8) exportable
    schedules: tuple = tuple(Schedule)
    interleaved: bool = True  # vpp > 1
    sequence_parallel: bool = True
    tp_comm_overlap: bool = False
    recompute_norm_act: bool = False  # Plan.recompute_norm_act
    recompute_norm_act_fp8: bool = True  # ... together with FP8 GEMMs
    mesh_orders: Optional[tuple] = None  # allowed mesh orders (innermost first); None: any
    # "free": any layers per stage; "first_last": equal middle stages, first and last may differ;
    # "even": every stage the same (L divisible by the stages)
    split: str = "free"
    # "per_stage": any (none, selective, full) counts per stage; "same_per_stage": every layer
    # selective, or the first min(N, layers) layers of every stage fully recomputed for one N
    # (Megatron's --recompute-method block --recompute-num-layers N); "uniform": one mode for all layers
    recompute: str = "per_stage"
    recompute_modes: tuple = ("none", "selective", "full")  # the recompute modes the stack has
    notes: dict = field(default_factory=dict)  # feature -> one line for docs/export.md's table

    def value_problem(self, field: str, value) -> Optional[str]:
        """Why one layout field (a Plan field's name) cannot take `value` whatever the rest of the
        layout: a degree over the stack's maximum, a ZeRO stage, schedule or feature it lacks;
        None where some layout has it. layout_problems starts from these, and `plan solve --fix`
        refuses a stack with them before searching it (planner/search/stacks.py:target_space)."""
        degrees = {
            "tp": ("tensor", self.max_tp),
            "pp": ("pipeline", self.max_pp),
            "ep": ("expert", self.max_ep),
            "cp": ("context", self.max_cp),
        }
        if field in degrees:
            what, most = degrees[field]
            if most is not None and value > most:
                return (
                    f"{what} parallelism {field}={value} ({self.stack} has none)"
                    if most == 1
                    else f"{field}={value} (at most {most})"
                )
        elif field == "zero_stage" and value not in self.zero_stages:
            return f"ZeRO stage {value} ({self.stack} has stages {_list(self.zero_stages)})"
        elif field == "schedule" and self.schedules and value not in self.schedules:  # none: no pipeline
            return f"schedule {Schedule(value).value} ({self.stack} has {_list(s.value for s in self.schedules)})"
        elif field == "vpp" and value > 1 and not self.interleaved:
            return f"interleaved virtual stages vpp={value} ({self.stack} has none)"
        elif field in _FEATURES and value is True and not getattr(self, field):
            return _FEATURES[field].format(stack=self.stack)
        return None

    def layout_problems(self, layout: Layout) -> list[str]:
        """Why a layout (everything but the layer split and recompute) cannot be expressed."""
        dp, tp, pp, vpp, cp, ep, fp8 = layout.dp, layout.tp, layout.pp, layout.vpp, layout.cp, layout.ep, layout.fp8
        zero_stage, schedule, mesh_order = layout.zero_stage, layout.schedule, layout.mesh_order
        sequence_parallel, recompute_norm_act = layout.sequence_parallel, layout.recompute_norm_act

        def check(**fields) -> list[str]:
            return [p for p in (self.value_problem(k, v) for k, v in fields.items()) if p]

        out = check(cp=cp, fp8=fp8, ep=ep, zero_stage=zero_stage)
        if zero_stage in self.zero_stages:
            if pp > 1 and zero_stage not in self.zero_stages_with_pp:
                out.append(
                    f"ZeRO stage {zero_stage} with pipeline parallelism ({self.stack} allows stages {_list(self.zero_stages_with_pp)} with pp > 1)"
                )
            elif tp > 1 and zero_stage not in self.zero_stages_with_tp:
                out.append(
                    f"ZeRO stage {zero_stage} with tensor parallelism ({self.stack} allows stages {_list(self.zero_stages_with_tp)} with tp > 1)"
                )
        if layout.dp_shard and zero_stage not in self.hybrid_zero_stages:
            out.append(
                f"hybrid sharding dp_shard={layout.dp_shard} with ZeRO stage {zero_stage} ("
                + (
                    f"{self.stack} has it with stages {_list(self.hybrid_zero_stages)})"
                    if self.hybrid_zero_stages
                    else f"{self.stack} has none)"
                )
            )
        if layout.dp_shard and ep > 1 and (layout.dp_shard * cp * tp) % ep:
            # the stacks cut the expert data-parallel group by the replicas too (planner/export/megatron.py)
            out.append(
                f"expert parallelism ep={ep} across shard groups (ep must divide dp_shard x cp x tp = "
                f"{layout.dp_shard * cp * tp} with hybrid sharding)"
            )
        out += check(pp=pp)
        if tp > 1 and pp > 1 and not self.tp_with_pp:
            out.append(f"tensor parallelism together with pipeline parallelism ({self.stack} has one or the other)")
        out += check(
            tp=tp,
            **({"schedule": schedule} if pp > 1 else {}),
            vpp=vpp,  # a schedule without a pipeline is no choice
            sequence_parallel=sequence_parallel,
            tp_comm_overlap=layout.tp_comm_overlap,
            recompute_norm_act=recompute_norm_act,
        )
        if recompute_norm_act and fp8 and self.recompute_norm_act and not self.recompute_norm_act_fp8:
            out.append(
                f"recompute of the norms and the experts' activation with FP8 ({self.stack}'s FP8 recipe refuses it)"
            )
        dpw = dp * cp  # the mesh's dp axis holds the cp ranks too
        if self.mesh_orders is not None and not _order_allowed(
            self.mesh_orders, tuple(mesh_order), dpw > 1, tp > 1, pp > 1
        ):
            out.append(
                f"mesh order {','.join(Axis(a).value for a in mesh_order)} ({self.stack} lays ranks out as "
                f"{' or '.join(','.join(a.value for a in o) for o in self.mesh_orders)}, innermost first)"
            )
        return out

    def plan_problems(self, plan: Plan, model: ModelSpec) -> list[str]:
        out = self.layout_problems(plan.layout)
        counts = [(r.none, r.selective, r.full) for r in plan.stage_recompute_counts(model.num_layers)]
        return out + self.counts_problems(counts)

    def counts_problems(self, counts) -> list[str]:
        """Why a layer split and recompute choice (per virtual stage: layers under none,
        selective, full) cannot be expressed. The ILP (planner/search/ilp.py:_stack_rules)
        states the same rules as constraints."""
        out = []
        layers = [sum(c) for c in counts]
        if len(set(layers)) > 1:
            if self.split == "even":
                out.append(f"uneven layers per stage {_list(layers)} ({self.stack} splits layers evenly)")
            elif self.split == "first_last" and len(set(layers[1:-1])) > 1:
                out.append(
                    f"uneven middle stages {_list(layers)} ({self.stack} lets only the first and last stage differ)"
                )
        used = [i for i in range(3) if any(c[i] for c in counts)]
        total = sum(layers)
        missing = [
            ("none", "selective", "full")[i]
            for i in used
            if ("none", "selective", "full")[i] not in self.recompute_modes
        ]
        if missing:
            out.append(f"{missing[0]} recompute ({self.stack} has {_list(self.recompute_modes)})")
        if self.recompute == "uniform" and len(used) > 1:
            out.append(f"recompute mixing modes across layers ({self.stack} applies one mode to every layer)")
        elif self.recompute == "same_per_stage":
            selective = sum(c[1] for c in counts)
            if 0 < selective < total:
                out.append(f"selective recompute on some layers only ({self.stack} applies it to every layer)")
            else:
                n = max(c[2] for c in counts)
                if any(c[2] != min(n, sum(c)) for c in counts):
                    out.append(
                        f"a different number of fully recomputed layers per stage {_list(c[2] for c in counts)} "
                        f"({self.stack} recomputes the first N layers of every stage, all of a shorter one)"
                    )
        return out


def _effective(order: tuple, dp: int, tp: int, pp: int) -> tuple:
    """A mesh order with degree-1 axes dropped: those do not change where ranks go."""
    degree = {Axis.dp: dp, Axis.tp: tp, Axis.pp: pp}
    return tuple(Axis(a) for a in order if degree[Axis(a)] > 1)


@lru_cache(maxsize=None)
def _order_allowed(allowed: tuple, order: tuple, dp_used: bool, tp_used: bool, pp_used: bool) -> bool:
    """Whether `order` lays ranks out as one of `allowed` does, given which axes have degree
    > 1 (the search asks this of every candidate: a few distinct questions, asked once each)."""
    degrees = (int(dp_used) + 1, int(tp_used) + 1, int(pp_used) + 1)
    return _effective(order, *degrees) in {_effective(o, *degrees) for o in allowed}


def _list(xs) -> str:
    return ", ".join(str(x) for x in xs)


def rope_phrase(model: ModelSpec) -> Optional[str]:
    """The rotary embedding's base and scaling in words (None for learned positions): what a
    model built outside the export (DeepSpeed's and Accelerate's user code, torchtitan's own
    config) must have for the stack to train the planned model."""
    if model.learned_position_embeddings:
        return None
    out = f"rotary base {model.rope_theta:,.0f}"
    r = model.rope_scaling
    if r is None:
        return out + ", no rotary scaling"
    if r.rope_type == "llama3":
        low, high, original = r.band()
        return (
            out
            + f", Llama 3.1 rotary scaling (factor {r.factor:g}, low_freq_factor {low:g}, high_freq_factor {high:g}, original {original})"
        )
    parts = [f"factor {r.factor:g}"] + [
        f"{k} {getattr(r, k):g}"
        for k in ("original_max_position_embeddings", "beta_fast", "beta_slow", "mscale", "mscale_all_dim")
        if getattr(r, k) is not None
    ]
    return out + f", {r.rope_type} rotary scaling ({', '.join(parts)})"


def architecture(model: ModelSpec) -> list[str]:
    """What the model is beyond a plain GPT / Llama decoder, as ModelSpec states it (the rotary
    base and scaling, q/k/v biases, activation geglu, norms_per_layer, qk_norm, sliding_window,
    logit_softcapping), one phrase each: what a
    stack whose configuration holds no architecture (DeepSpeed, Accelerate: the model is the
    user's code) must be given, and what a model written for torchtitan must have."""
    rope = rope_phrase(model)
    out = [rope] if rope else []
    if model.qkv_bias:
        out.append("biases on the query, key and value projections only")
    if Activation(model.activation) == Activation.geglu:
        out.append("GeGLU MLP (the gate through tanh-approximated GELU)")
    if model.norms_per_layer != 2:
        out.append(
            f"{model.norms_per_layer} norms per layer"
            + (" (before and after attention and the MLP)" if model.norms_per_layer == 4 else "")
        )
    if model.qk_norm:
        out.append(f"QK-norm (an RMSNorm of head_dim {model.head_dim} on each query and key head)")
    if model.sliding_window is not None:
        out.append(f"a sliding window of {model.sliding_window} keys (the query's own included) on {windowed(model)}")
    if model.logit_softcapping:
        out.append("soft-capped logits (c tanh(logits / c))")
    return out


def windowed(model: ModelSpec) -> str:
    """Which layers attend within the window, as far as the spec says: it holds only how many."""
    if model.sliding_window_layers == model.num_layers:
        return f"every layer ({model.num_layers})"
    return f"{model.sliding_window_layers} of {model.num_layers} layers"
