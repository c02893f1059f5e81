"""Options and input resolution shared by the commands (model, cluster, GPU count, job)."""

from __future__ import annotations

import functools
from typing import Callable, Optional

import click
from pydantic import ValidationError

from hardware_profiles import load_cluster
from planner.errors import PlannerError, UsageError
from planner.presets import load_model
from planner.specs import ClusterSpec, JobSpec, LossKernel, ModelSpec, Plan, PlanError, Target, seq_problem


# --target of `plan estimate` (one layout, costed as one stack runs it) and of `plan solve`
# (which without --target searches every stack: planner/search/stacks.py).
_TARGET_HELP = ("Training stack the plan will run on: its attention kernel and TP communication overlap (megatron: "
                "Transformer Engine's cuDNN attention and --tp-comm-overlap)")
ESTIMATE_TARGET = click.option(
    "--target", "stack", type=click.Choice([t.value for t in Target]), default="generic", show_default=True,
    help=_TARGET_HELP + "; generic: PyTorch eager, no stack's kernels or overlap. The plan document records it (job.target).",
)
SOLVE_TARGET = click.option(
    "--target", "stack", type=click.Choice([t.value for t in Target]), default=None,
    help=_TARGET_HELP + ", and only what it can express [default: search megatron, deepspeed, torchtitan and accelerate, "
    "each as it runs, and recommend the best; generic: the PyTorch-eager optimum, which no `plan export` stack runs as is].",
)


def target_options(fn: Callable, target: Callable = ESTIMATE_TARGET) -> Callable:
    """--model, --cluster, --gpus/--nodes, --seq-len, precision, optimizer and `target` (--target)."""
    options = [
        click.option(
            "--model", "model_name",
            help="Model preset name; or a .json/.yaml spec, a Hugging Face config.json or model directory; or a hub id "
            "(ORG/NAME) whose config.json is in the local Hugging Face cache (nothing is downloaded).",
        ),
        click.option("--cluster", "cluster_name", help="Cluster preset name, or a hardware profile .json (from `plan profile`)."),
        click.option("--gpus", type=int, help="Total GPUs."),
        click.option("--nodes", type=int, help="Nodes (GPUs = nodes x GPUs per node of the cluster)."),
        click.option("--seq-len", type=int, help="Tokens per sequence."),
        click.option("--precision", type=click.Choice(["bf16", "fp16", "fp32"]), default=None, help="Compute dtype [default: the model's]."),
        click.option("--optimizer", type=click.Choice(["adam", "sgd"]), default="adam", show_default=True),
        click.option(
            "--no-flash-attention",
            is_flag=True,
            help="Cost unfused attention (s x s scores stored), as Megatron-LM without FlashAttention.",
        ),
        target,
        click.option(
            "--loss-kernel", type=click.Choice([k.value for k in LossKernel]), default=None,
            help="Cross-entropy implementation, which sets the loss's memory per logit [default: the target's: "
            "megatron vocab-parallel, others eager; fused = a fused kernel such as flash-attn's].",
        ),
        click.option(
            "--moe-dispatcher", type=click.Choice(["alltoall", "deepep"]), default="alltoall", show_default=True,
            help="Mixture-of-experts token exchange across nodes: one copy per routed expert (alltoall), or one per "
            "destination node fanned out over NVLink there (deepep).",
        ),
    ]
    return functools.reduce(lambda f, opt: opt(f), reversed(options), fn)


def solve_target_options(fn: Callable) -> Callable:
    """target_options with `plan solve`'s --target (no default: every stack)."""
    return target_options(fn, SOLVE_TARGET)


# Bounds on what is physically meaningful: the largest clusters built have ~10^5 GPUs; no
# optimizer step holds 10^8 sequences; no context is 10^8 tokens. Beyond them an input is a typo.
MAX_GPUS = 2**20
MAX_GLOBAL_BATCH = 10**8
MAX_SEQ_LEN = 10**8
# Without --seq-len a model trains at its maximum length, unless that is a long-context
# extension (Qwen2.5's 131,072, Llama 3.1's 131,072): then --seq-len is required.
DEFAULT_SEQ_LIMIT = 16384


def check_count(name: str, value: Optional[int], limit: int, what: str) -> None:
    """A positive count within `limit`, else a one-line usage error."""
    if value is None:
        return
    if value < 1:
        raise UsageError(f"{name} must be positive, got {value}")
    if value > limit:
        raise UsageError(f"{name} {value:,} is more than {limit:,} {what}; check the value")


def check_real(name: str, value: Optional[float], positive: bool = True) -> None:
    """A finite (positive) number, else a one-line usage error: nan and inf are refused."""
    if value is None:
        return
    if value != value or value in (float("inf"), float("-inf")):
        raise UsageError(f"{name} must be a finite number, got {value}")
    if positive and value <= 0:
        raise UsageError(f"{name} must be positive, got {value:g}")


def resolve_target(
    model_name: Optional[str], cluster_name: Optional[str], gpus: Optional[int], nodes: Optional[int]
) -> tuple[ModelSpec, ClusterSpec, int]:
    if not model_name:
        raise UsageError("--model is required (a preset name such as gpt3-175b, or a spec file)")
    if not cluster_name:
        raise UsageError("--cluster is required (a preset name such as dgx-a100-80gb, or a profile file)")
    model = load_model(model_name)
    cluster = load_cluster(cluster_name)
    return model, cluster, cluster_size(cluster, gpus, nodes, cluster_name)


def cluster_size(cluster: ClusterSpec, gpus: Optional[int], nodes: Optional[int], cluster_name: str) -> int:
    """The GPUs asked for (--gpus or --nodes), checked against the cluster."""
    if gpus is not None and nodes is not None:
        if gpus != nodes * cluster.gpus_per_node:
            raise UsageError(
                f"--gpus {gpus} disagrees with --nodes {nodes} x {cluster.gpus_per_node} GPUs per node = {nodes * cluster.gpus_per_node}; give one of them"
            )
    if gpus is None and nodes is None:
        raise UsageError("give the cluster size with --gpus N or --nodes N")
    if gpus is None:
        if nodes < 1:
            raise UsageError(f"--nodes must be at least 1, got {nodes}")
        gpus = nodes * cluster.gpus_per_node
    if gpus < 1:
        raise UsageError(f"--gpus must be at least 1, got {gpus}")
    if gpus > MAX_GPUS:
        raise UsageError(f"--gpus {gpus:,} is beyond any cluster ({MAX_GPUS:,} GPUs at most); give the GPUs you will train on")
    check_profile_size(cluster, gpus, cluster_name)
    if gpus > cluster.gpus_per_node and gpus % cluster.gpus_per_node:
        raise UsageError(
            f"--gpus {gpus} is not a whole number of {cluster.name} nodes ({cluster.gpus_per_node} GPUs each); use a multiple of {cluster.gpus_per_node}"
        )
    if cluster.num_nodes is not None and gpus > cluster.num_nodes * cluster.gpus_per_node:
        raise UsageError(
            f"{cluster.name} has {cluster.num_nodes} nodes x {cluster.gpus_per_node} = {cluster.num_nodes * cluster.gpus_per_node} GPUs, fewer than the {gpus} asked for"
        )
    return gpus


def check_profile_size(cluster: ClusterSpec, gpus: int, where: str, backend: Optional[str] = None) -> None:
    """A measured profile plans for the world it measured: refuse another world size or backend."""
    m = cluster.measured
    if m is None:
        return
    env = m.environment
    if gpus != env.world_size:
        raise UsageError(
            f"{where} was measured on {env.world_size} ranks ({env.nnodes} node(s) x {env.nproc_per_node}), not {gpus}: "
            f"plan for --gpus {env.world_size}, or profile again with the world size you want"
        )
    if backend is not None and backend != env.backend:
        raise UsageError(f"{where} was measured with the {env.backend} backend, not {backend}: profile again with --backend {backend}")


def make_job(
    model: ModelSpec, global_batch: int, seq_len: Optional[int], precision: Optional[str], optimizer: str, no_flash: bool,
    cluster: Optional[ClusterSpec] = None, stack: str = "generic", loss_kernel: Optional[str] = None,
    moe_dispatcher: str = "alltoall",
) -> JobSpec:
    check_count("--global-batch", global_batch, MAX_GLOBAL_BATCH, "sequences per step")
    check_count("--seq-len", seq_len, MAX_SEQ_LEN, "tokens")
    if seq_len is None and model.max_seq_len > DEFAULT_SEQ_LIMIT:
        raise UsageError(
            f"{model.name} allows {model.max_seq_len:,} positions, more than a usual training length; give --seq-len "
            f"(e.g. --seq-len 4096 or 8192)"
        )
    seq = seq_len or model.max_seq_len
    problem = seq_problem(model, seq)  # the check Plan.validate_for makes, before any search
    if problem:
        raise UsageError(f"{problem}; give --seq-len {model.max_seq_len} or less")
    dtype = precision or model.param_dtype
    if cluster is not None:
        peaks = {k.value if hasattr(k, "value") else k for k in cluster.device.peak_tflops}
        name = dtype.value if hasattr(dtype, "value") else dtype
        if name not in peaks:
            if precision:
                raise UsageError(f"{cluster.name} has no {name} throughput (it has {', '.join(sorted(peaks))}); pass --precision accordingly")
            dtype = sorted(peaks)[0]  # e.g. a CPU profile measured in fp32
    try:
        return JobSpec(
            global_batch_size=global_batch,
            seq_len=seq,
            precision=dtype,
            optimizer=optimizer,
            flash_attention=not no_flash,
            target=stack,
            loss_kernel=loss_kernel,
            moe_dispatcher=moe_dispatcher,
        )
    except ValidationError as exc:
        raise UsageError(_first_error(exc)) from None


def make_plan(**fields) -> Plan:
    """Build a Plan from command-line values; a bad combination becomes a one-line UsageError."""
    try:
        return Plan(**fields)
    except ValidationError as exc:
        raise UsageError(_first_error(exc)) from None


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    msg = str(err["msg"]).removeprefix("Value error, ")
    loc = ".".join(str(p) for p in err["loc"])
    return f"{loc}: {msg}" if loc else msg


def check_plan(plan: Plan, model: ModelSpec, job: JobSpec, gpus: int) -> None:
    try:
        plan.validate_for(model, job, gpus)
    except PlanError as exc:
        raise UsageError(str(exc)) from None


def parse_int_list(text: Optional[str], what: str) -> Optional[list[int]]:
    if text is None:
        return None
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise UsageError(f"{what} must be comma-separated integers, got {text!r}") from None


def require_torch(command: str) -> None:
    """One line, not a ModuleNotFoundError traceback, when torch is not installed."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise PlannerError(
            f"`plan {command}` needs PyTorch, which is not installed: without a GPU pip install torch==2.13.0 --index-url "
            "https://download.pytorch.org/whl/cpu, with CUDA pip install torch==2.13.0 (or your site's build)"
        )
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("torch")
    except PackageNotFoundError:
        return
    if _version_tuple(found) < MIN_TORCH:
        raise PlannerError(
            f"`plan {command}` needs torch >= {'.'.join(map(str, MIN_TORCH))} (it uses fully_shard and replicate_with_fsdp), "
            f"found {found}; upgrade torch"
        )


MIN_TORCH = (2, 13)  # pyproject.toml's torch extra says why


def _version_tuple(text: str) -> tuple:
    """(major, minor) of a version string such as '2.13.0+cpu'."""
    parts = []
    for piece in text.split("+")[0].split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)
