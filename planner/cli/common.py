"""Options shared by the commands; their values are checked where the API builds specs (planner/inputs.py)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Callable, Optional

import click

from planner.cli.types import GPUS, TOKENS
from planner.errors import PlannerError, UsageError
from planner.inputs import check_plan, check_profile_size, check_real  # noqa: F401 (planner/cli/run.py, show.py)
from planner.specs import ATTENTION_KERNELS, LossKernel, Target


# --target of `plan estimate` (one layout, costed as one stack runs it) and of `plan solve`
# (which without --target searches every stack: planner/search/stacks.py).
_TARGET_HELP = (
    "Training stack the plan will run on: its attention kernel and TP communication overlap (megatron: "
    "Transformer Engine's cuDNN attention and --tp-comm-overlap)"
)
ESTIMATE_TARGET = click.option(
    "--target",
    "stack",
    type=click.Choice([t.value for t in Target]),
    default="generic",
    show_default=True,
    help=_TARGET_HELP
    + "; generic: PyTorch eager, no stack's kernels or overlap. The plan document records it (job.target).",
)
SOLVE_TARGET = click.option(
    "--target",
    "stack",
    type=click.Choice([t.value for t in Target]),
    default=None,
    help=_TARGET_HELP
    + ", and only what it can express [default: search megatron, deepspeed, torchtitan and accelerate, "
    "each as it runs, and recommend the best; generic: the PyTorch-eager optimum, which no `plan export` stack runs as is].",
)


def target_options(fn: Callable, target: Callable = ESTIMATE_TARGET) -> Callable:
    """--model, --cluster, --gpus/--nodes, --seq-len, precision, optimizer and `target` (--target)."""
    options = [
        click.option(
            "--model",
            "model_name",
            help="Model preset name; or a .json/.yaml spec, a Hugging Face config.json or model directory; or a hub id "
            "(ORG/NAME) whose config.json is in the local Hugging Face cache (nothing is downloaded).",
        ),
        click.option(
            "--cluster", "cluster_name", help="Cluster preset name, or a hardware profile .json (from `plan profile`)."
        ),
        click.option("--gpus", type=GPUS, help="Total GPUs."),
        click.option("--nodes", type=GPUS, help="Nodes (GPUs = nodes x GPUs per node of the cluster)."),
        click.option("--seq-len", type=TOKENS, help="Tokens per sequence."),
        click.option(
            "--precision",
            type=click.Choice(["bf16", "fp16", "fp32"]),
            default=None,
            help="Compute dtype [default: the model's].",
        ),
        click.option("--optimizer", type=click.Choice(["adam", "sgd"]), default="adam", show_default=True),
        click.option(
            "--no-flash-attention",
            is_flag=True,
            help="Cost unfused attention (s x s scores stored), as Megatron-LM without FlashAttention.",
        ),
        target,
        click.option(
            "--loss-kernel",
            type=click.Choice([k.value for k in LossKernel]),
            default=None,
            help="Cross-entropy implementation, which sets the loss's memory per logit [default: the target's: "
            "megatron vocab-parallel, others eager; fused = a fused kernel such as flash-attn's].",
        ),
        click.option(
            "--attention-kernel",
            type=click.Choice(list(ATTENTION_KERNELS)),
            default=None,
            help="Fused attention kernel the training runs [default: the target's: megatron cudnn (Transformer Engine), "
            "others flash2]; e.g. cudnn for a torchtitan or FSDP run on Transformer Engine's attention.",
        ),
        click.option(
            "--moe-dispatcher",
            type=click.Choice(["alltoall", "deepep"]),
            default="alltoall",
            show_default=True,
            help="Mixture-of-experts token exchange across nodes: one copy per routed expert (alltoall), or one per "
            "destination node fanned out over NVLink there (deepep).",
        ),
        click.option(
            "--grad-reduce-bf16",
            is_flag=True,
            default=None,
            help="Accumulate and reduce gradients in bf16 where the stack keeps fp32 (Megatron: --grad-reduce-in-bf16, "
            "2 bytes a parameter less; its performance recipes set it). Other stacks keep their own gradient dtype.",
        ),
    ]
    return functools.reduce(lambda f, opt: opt(f), reversed(options), fn)


def api_keywords(options: dict) -> dict:
    """The Python API's keywords (planner/api.py) of a command's options: the same names
    (docs/glossary.md), but for --target (`stack`) and --no-flash-attention."""
    out = dict(options)
    if "stack" in out:
        out["target"] = out.pop("stack")
    if "no_flash_attention" in out:
        out["flash_attention"] = not out.pop("no_flash_attention")
    if "grad_reduce_bf16" in out:  # a flag without a default: None where not given
        out["grad_reduce_bf16"] = bool(out["grad_reduce_bf16"])
    return out


def solve_target_options(fn: Callable) -> Callable:
    """target_options with `plan solve`'s --target (no default: every stack)."""
    return target_options(fn, SOLVE_TARGET)


def require_names(model_name: Optional[str], cluster_name: Optional[str]) -> None:
    """--model and --cluster, which `plan estimate` (without --plan) and `plan solve` need."""
    if not model_name:
        raise UsageError("--model is required (a preset name such as gpt3-175b, or a spec file)")
    if not cluster_name:
        raise UsageError("--cluster is required (a preset name such as dgx-a100-80gb, or a profile file)")


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


def check_outputs(files: dict, read: tuple = (), what: str = "output") -> None:
    """Before any work, every file a command will write ({option as typed: path}, None: not
    asked for): each a writable place that is none of the files `read` (datafile.check_output),
    and no two the same file."""
    from planner.datafile import check_output

    seen: dict[str, str] = {}
    for option, f in files.items():
        if f is None:
            continue
        target = str(check_output(f, read).resolve())
        if target in seen:
            raise UsageError(f"{seen[target]} and {option} both write {f}; give each {what} its own file")
        seen[target] = option


def check_picture_files(files: dict, read: tuple = (), others: Optional[dict] = None) -> None:
    """Before any work, the picture files of `plan show` and `plan size` ({option: path}): known
    extensions, distinct files, writable places that are none of the files `read`, matplotlib;
    `others`: the command's other outputs ({option as typed: path}), checked with them."""
    from planner.draw import FORMATS, require_matplotlib

    for k, f in files.items():
        ext = Path(f).suffix.lower().lstrip(".")
        name = Path(f).name.lower()
        if name.startswith(".") and name[1:] in FORMATS:  # '.svg' is a name without an extension
            raise UsageError(
                f"--{k} {f}: give the picture a name before its extension, e.g. {Path(f).with_name(f'{k}{name}')}"
            )
        if ext not in FORMATS:
            raise UsageError(f"--{k} {f}: the picture's format comes from the extension; use .svg or .png")
    check_outputs(
        {**(others or {}), **{f"--{k}": f for k, f in files.items()}}, read, "output" if others else "picture"
    )
    if files:
        require_matplotlib()
