"""What DeepSpeed 0.19.8 can express: its `RULES` (every one cites the installed package's
source, deepspeed/...), and what beyond them it cannot run of a model, a layout or a plan
(model_problems, layout_problems, problems: nothing today). The exporter (export.py) says how a
plan becomes its config JSON.
"""

from __future__ import annotations

from planner.specs import Axis, Layout, Schedule
from planner.stacks.stack import Rules

MESH_ORDER = (Axis.tp, Axis.dp, Axis.pp)  # innermost first

RULES = Rules(
    stack="deepspeed",
    # runtime/zero/config.py: DeepSpeedZeroConfig.stage is a ZeroStageEnum 0 (disabled) ... 3 (weights).
    zero_stages=(0, 1, 2, 3),
    # runtime/pipe/engine.py PipelineEngine.__init__: assert zero_optimization_stage() <
    # ZeroStageEnum.gradients, "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism".
    zero_stages_with_pp=(0, 1),
    # runtime/engine.py _configure_tensor_parallel_states: "AutoTP + ZeRO stage 3 is supported for
    # both inference and training"; ZeRO-3 places AutoTP shards over the DP group
    # (_resolve_zero3_param_placement); stages 1 and 2 take AutoTP shards like any parameter.
    zero_stages_with_tp=(0, 1, 2, 3),
    # No hybrid sharding in 0.19.8. MiCS (zero_optimization.mics_shard_size, ZeRO-3 sharded within
    # groups and replicated across them) is removed: runtime/config.py:_REMOVED_ZERO_CONFIG_KEYS
    # makes DeepSpeedConfig raise "MiCS ZeRO-3 sharding has been removed" for mics_shard_size and
    # mics_hierarchical_params_gather, and runtime/zero/mics.py is gone. ZeRO++'s hpZ
    # (zero_hpz_partition_size) is not it: a secondary copy of the parameters within a group, while
    # the parameters, gradients and optimizer states stay partitioned over all of dp
    # (runtime/zero/stage3.py, partition_parameters.py). Stages 1-2 have no shard group.
    hybrid_zero_stages=(),
    # Any pipeline depth (PipelineModule(num_stages=...)); any AutoTP size
    # (tensor_parallel.autotp_size, runtime/tensor_parallel/config.py:TPTrainingConfig), but
    # AutoTP only on a plain module: problems() refuses tp > 1 with pp > 1.
    max_pp=None,
    max_tp=None,
    # deepspeed/__init__.py initialize: a PipelineModule brings its own mpu (its grid) and AutoTP
    # (runtime/engine.py _configure_tensor_parallel_states) replaces it with a dp x tp mesh of
    # all ranks; TP inside a pipeline needs model-side TP layers (Megatron-DeepSpeed).
    tp_with_pp=False,
    # AutoEP (expert_parallel.autoep_size): module_inject/auto_ep_folding.py build_folding_spec
    # needs ep x expert-TP to divide a stage's ranks, auto_ep_config.py validate_autoep_post_detection
    # ep to divide the experts (specs.ep_problem states both); no rule on ZeRO (AutoEP has
    # ZeRO-3) or pp (the engine takes pp from the PipelineModule's grid). Its folding with AutoTP
    # needs ep > 1 and pp = 1, moot here: a MoE layer with tp > 1 needs sequence parallelism.
    max_ep=None,
    # No context parallelism in the plan's sense (each sequence cut into chunks whose K/V pass
    # around a ring): DeepSpeed's sequence parallelism is Ulysses, an all-to-all that trades the
    # sequence split for a split of the attention heads (sequence/layer.py DistributedAttention;
    # runtime/sequence_parallel/ulysses_sp.py UlyssesSPAttentionHF; sequence/fpdt_layer.py is
    # Ulysses with chunked offload), with other traffic, head-count limits and memory.
    max_cp=1,
    # No FP8 training recipe in DeepSpeedConfig (runtime/config.py and precision_config.py read
    # fp16, bf16 and torch_autocast, none with an FP8 type; its FP8 kernels, ops/fp_quantizer,
    # quantize weights for inference and QLoRA-style linears): FP8 GEMMs come from Transformer
    # Engine in model code, which the JSON cannot ask for.
    fp8=False,
    # DeepSpeed checkpoints whole layers (runtime/activation_checkpointing): no selective mode.
    recompute_modes=("none", "full"),
    # runtime/pipe/engine.py _train_schedule: always schedule.TrainSchedule, a 1F1B schedule
    # (stage s holds at most min(p - s, m) micro-batches; the tests count it); no GPipe.
    schedules=(Schedule.one_f_one_b,),
    # No looped virtual stages. DualPipeV (runtime/pipe/dualpipev.py) puts stages s and 2p-1-s
    # on rank s (a V), not stage j on rank j % p as interleaved-1f1b does.
    interleaved=False,
    # DeepSpeed's sequence parallelism is Ulysses (sequence_parallel_size: an all-to-all over
    # attention heads, runtime/sequence_parallel/ulysses_sp.py), not Megatron's norm/dropout
    # sharding over the TP group; AutoTP has no such mode.
    sequence_parallel=False,
    # tensor_parallel.tp_overlap_comm overlaps AutoTP's all-reduce only ("Currently, only
    # allreduce supports overlap", TPTrainingConfig); the plan's overlap is the SP one.
    tp_comm_overlap=False,
    # runtime/pipe/topology.py PipeModelDataParallelTopology: axes ['pipe', 'data', 'model'],
    # row-major, so model (tp) is innermost and pipe outermost; AutoTP without a pipeline:
    # utils/groups.py _init_tp_mesh_device meshes (data_parallel, tensor_parallel), tp innermost.
    mesh_orders=(MESH_ORDER,),
    # runtime/pipe/module.py _partition_layers: 'uniform' (all layer specs, embedding and head
    # included), 'parameters', 'type:REGEX' (balanced counts of matching layers); no list of
    # layers per stage. 'type:' splits the transformer blocks evenly when pp divides them.
    split="even",
    # pipeline.activation_checkpoint_interval checkpoints every N layers alike
    # (runtime/pipe/module.py forward); plain modules checkpoint whole layers in model code.
    # Whole-layer ("full") or none: problems() refuses selective.
    recompute="uniform",
    notes={
        "uneven stages": "no: PipelineModule(partition_method='type:<block class>') balances the blocks; pp must divide the layers",
        "per-stage recompute": "no: activation_checkpoint_interval=1 checkpoints every layer (full) or none; no selective recompute",
        "ZeRO": "stages 0-3; 0-1 with pp > 1 (pipe/engine.py assert); 0-3 with AutoTP",
        "tensor parallelism": "AutoTP (tensor_parallel.autotp_size) on a plain module: not with pp > 1; no Megatron sequence parallelism",
        "schedule": "1F1B (TrainSchedule); no GPipe, no interleaving (DualPipeV is a V placement, not vpp)",
        "mesh order": "tp innermost, then dp, then pp (PipeModelDataParallelTopology)",
        "DP overlap": "ZeRO 1-3 overlap_comm hides the gradient reduce at pp = 1; ZeRO-0 and every pp > 1 reduce after backward",
        "experts": "AutoEP (expert_parallel.autoep_size, expert-TP 1): ep consecutive data-parallel ranks, any ZeRO stage, "
        "with or without a pipeline",
        "context parallelism": "no: DeepSpeed's sequence parallelism is Ulysses (all-to-all over attention heads), not a ring of "
        "sequence chunks",
        "FP8": "no: the config has no FP8 training recipe (Transformer Engine is model code)",
        "hybrid sharding": "no: 0.19.8 removed MiCS (DeepSpeedConfig refuses zero_optimization.mics_shard_size); ZeRO++ hpZ "
        "only adds a per-group copy of the parameters, the states stay sharded over all of dp",
    },
)


def model_problems(model) -> list[str]:
    """None: DeepSpeed's config holds no architecture. deepspeed.initialize wraps the user's
    torch module as it is (a Hugging Face model: its modelling code builds GeGLU, the extra
    norms, QK-norm, windows and soft-capping from its config.json), and what the config switches
    on keeps them: ZeRO shards parameters whatever they are; pipeline stages run the user's layer
    objects (runtime/pipe/module.py); AutoTP shards only linear layers and, for a model whose
    Hugging Face tp_plan marks QK-norm weights replicated_with_grad_allreduce (Qwen3, Gemma 3),
    sums their gradients over the TP group (module_inject/tp_plan_converter.py,
    auto_tp.py:register_replicated_grad_hooks). The "planner" block names what the model must be."""
    return []


def layout_problems(layout: Layout, model, job) -> list[str]:
    """Nothing beyond RULES (tp with pp and selective recompute are rules there)."""
    return []


def problems(plan, model, job) -> list[str]:
    return layout_problems(plan.layout, model, job)
