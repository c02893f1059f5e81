"""Model presets (YAML files in models/ beside this module) and Hugging Face config.json import,
from a file, a model directory, or a hub id found in the local Hugging Face cache."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from planner.datafile import load_named, missing, parse_spec, read_input, read_mapping, short_text
from planner.errors import UsageError
from planner.presets.hf_config import FAMILIES, read_decoder, typed_fields, unread_field
from planner.specs import ModelSpec

PRESET_DIR = Path(__file__).parent / "models"


def model_presets() -> dict[str, Path]:
    return {p.stem: p for p in sorted(PRESET_DIR.glob("*.yaml"))}


def is_hf_config(data: dict) -> bool:
    return any(key in data for key in ("num_hidden_layers", "n_layer", "model_type", "architectures"))


# Mixture-of-experts configs are read by their model_type (the Hugging Face modelling code the
# field names belong to); expert fields on any other model_type are refused rather than planned
# as a dense decoder (a Mixtral costed as a 7B "fits" on 8 GPUs).
_MOE_FIELDS = (
    "num_local_experts",
    "num_experts",
    "n_routed_experts",
    "num_experts_per_tok",
    "experts_per_token",
    "moe_intermediate_size",
)
# Fields that place experts on only some layers; our model has them on every layer after
# first_dense_layers, so only these values (also the Hugging Face defaults) are planned.
# (Keyed by a family's `moe`: None for a dense family, which has no such fields.)
_EVERY_LAYER: dict[str | None, tuple[tuple[str, object], ...]] = {
    "qwen_moe": (("decoder_sparse_step", 1), ("mlp_only_layers", [])),
    "deepseek": (("moe_layer_freq", 1),),
}
_NOT_DECODERS = {
    "bert",
    "roberta",
    "deberta",
    "deberta-v2",
    "distilbert",
    "electra",
    "albert",
    "xlm-roberta",
    "t5",
    "mt5",
    "bart",
    "mbart",
    "pegasus",
    "whisper",
    "vit",
    "clip",
    "encoder-decoder",
}


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def unsupported(data: dict, name: str) -> str | None:
    """Why this Hugging Face config cannot be planned (one line naming the field), or None."""
    model_type = str(data.get("model_type", "")).lower()
    family = FAMILIES.get(model_type)
    experts = [key for key in _MOE_FIELDS if data.get(key) not in (None, 0, 1, False)]
    moe_types = sorted(t for t, f in FAMILIES.items() if f.moe)
    if experts and not (family and family.moe):
        return (
            f"{name}: field '{experts[0]}' = {data[experts[0]]!r} with model_type {model_type!r}: a mixture-of-experts architecture "
            f"that is not modelled (model types read: {', '.join(moe_types)}); planning it as a dense model would be wrong"
        )
    if model_type in _NOT_DECODERS or data.get("is_encoder_decoder"):
        field = "model_type" if model_type in _NOT_DECODERS else "is_encoder_decoder"
        return f"{name}: field '{field}' = {data.get(field)!r}: only decoder-only language models are planned"
    for key in ("vision_config", "audio_config", "text_config"):
        if key in data:
            return (
                f"{name}: field '{key}': multimodal configs are not modelled; give the language model's own config "
                "(its text_config as a config.json of its own: the other towers are not planned)"
            )
    archs = [a for a in data.get("architectures") or [] if isinstance(a, str)]
    if archs and not any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs):
        return f"{name}: field 'architectures' = {archs}: only causal language models (…ForCausalLM) are planned"
    if family is None:
        shown = repr(data["model_type"]) if "model_type" in data else "missing"
        return (
            f"{name}: field 'model_type' = {shown}: not a family this reader knows (it reads {', '.join(sorted(FAMILIES))}); "
            "write a model spec instead (planner/presets/models/*.yaml)"
        )
    why = unread_field(data, model_type)
    if why:
        return f"{name}: {why}"
    for key, planned in _EVERY_LAYER.get(family.moe, ()):
        if data.get(key) not in (None, planned):
            return (
                f"{name}: field '{key}' = {data[key]!r}: experts on only some layers are not modelled (only {key} = {planned!r}, "
                "experts on every layer after the first dense ones)"
            )
    head_dim = data.get("head_dim")
    if head_dim is not None and not (_int(head_dim) and head_dim > 0):
        return f"{name}: field 'head_dim' = {head_dim!r} is not a positive integer"
    return None


def from_hf_config(data: dict, name: str) -> dict:
    """Translate a Hugging Face config.json into ModelSpec fields: the families of
    planner/presets/hf_config.py (Llama, Mistral, Mixtral, Qwen2/2-MoE/3/3-MoE, Gemma 1-3,
    Phi-3, DeepSeek-V2/V3, GPT-OSS, OLMo 2, GPT-NeoX, GPT-2), every field their modelling code
    reads that changes the cost; whatever else is refused, naming the field."""
    data = typed_fields(data, name)  # every field read of its kind, before anything is computed from it
    why = unsupported(data, name)
    if why:
        raise UsageError(why)
    return read_decoder(data, str(data["model_type"]).lower(), name, _moe_fields)


# ----- mixture-of-experts configs: ModelSpec's expert fields, and what the spec approximates


def _moe_fields(data: dict, name: str, style: str, need) -> tuple[dict, list[str]]:
    """Expert fields of a mixture-of-experts config, under the names its Hugging Face modelling
    code uses, and the approximations made (phrases for the spec's `source`). ffn_hidden_size is
    the dense layers' MLP width, or the expert width where every layer has experts."""
    top_k = need("num_experts_per_tok", "experts_per_token") if style == "gpt_oss" else need("num_experts_per_tok")
    if style == "gpt_oss" and data.get("experts_per_token", top_k) != top_k:  # gpt-oss configs carry both spellings
        raise UsageError(
            f"{name}: field 'experts_per_token' = {data['experts_per_token']!r} contradicts num_experts_per_tok = {top_k!r}"
        )
    if style == "deepseek":  # intermediate_size: the first_k_dense_replace dense layers' width
        return dict(
            num_experts=need("n_routed_experts"),
            experts_per_token=top_k,
            moe_ffn_hidden_size=need("moe_intermediate_size"),
            num_shared_experts=data.get("n_shared_experts") or 0,
            first_dense_layers=data.get("first_k_dense_replace") or 0,
            ffn_hidden_size=need("intermediate_size"),
        ), _deepseek_notes(data)
    if style == "qwen_moe":  # every layer has experts (unsupported() checks it): intermediate_size is unused
        width = need("moe_intermediate_size")
        return dict(
            num_experts=need("num_experts"),
            experts_per_token=top_k,
            ffn_hidden_size=width,
            moe_ffn_hidden_size=width,
            num_shared_experts=_shared_experts(data, name, width),
        ), []
    width = need("intermediate_size")  # Mixtral, GPT-OSS: one expert's width, experts on every layer
    experts = dict(
        num_experts=need("num_local_experts"), experts_per_token=top_k, ffn_hidden_size=width, moe_ffn_hidden_size=width
    )
    return experts, _gpt_oss_notes(data) if style == "gpt_oss" else []


def _shared_experts(data: dict, name: str, width) -> int:
    """Qwen2-MoE's shared expert is one MLP of shared_expert_intermediate_size: whole experts of `width`."""
    shared = data.get("shared_expert_intermediate_size") or 0
    if not _int(shared) or not _int(width) or shared % width:
        raise UsageError(
            f"{name}: field 'shared_expert_intermediate_size' = {shared!r} is not a multiple of moe_intermediate_size "
            f"{width!r}: shared experts are modelled as whole experts"
        )
    return shared // width


def _deepseek_notes(data: dict) -> list[str]:
    """DeepSeek-V3's multi-token-prediction module, which transformers does not build: left out,
    said (ModelSpec.mtp_layers plans it)."""
    k = data.get("num_nextn_predict_layers")
    return (
        [
            f"the {k} multi-token-prediction module(s) (num_nextn_predict_layers) not planned: transformers builds none; "
            f"mtp_layers: {k} plans Megatron-Core's"
        ]
        if k
        else []
    )


def _gpt_oss_notes(data: dict) -> list[str]:
    """What of GPT-OSS the spec leaves out: parameters too few to matter (its sliding windows are costed)."""
    return ["attention sinks (one logit per head) and router biases not counted"]


# What `plan presets --json` adds to each model's spec: derived, not spec fields
DERIVED = ("parameters", "active_parameters")


def derived_counts(model: ModelSpec) -> dict[str, int]:
    """The DERIVED counts of `model`, as `plan presets --json` writes them beside its spec."""
    from cost_models.compute import active_params, total_params

    return {"parameters": total_params(model), "active_parameters": active_params(model)}


def _parse(data: dict, path: Path, text: str, name: str | None = None) -> ModelSpec:
    if is_hf_config(data):
        return parse_spec(ModelSpec, from_hf_config(data, name or _hf_name(path)), path, text)
    derived = {k: data[k] for k in DERIVED if k in data}
    model = parse_spec(ModelSpec, {k: v for k, v in data.items() if k not in DERIVED}, path, text)
    if derived:  # an entry of `plan presets --json` read back: its counts must be the spec's own
        own = derived_counts(model)
        wrong = [k for k, v in derived.items() if isinstance(v, bool) or v != own[k]]
        if wrong:
            k = wrong[0]
            kind = (
                "" if isinstance(derived[k], (int, float)) and not isinstance(derived[k], bool) else " (not a number)"
            )
            raise UsageError(
                f"{path}: {k} {short_text(json.dumps(derived[k]))}{kind} is not this spec's ({own[k]:,}); it is "
                f"derived from the other fields (`plan presets --json` writes it): drop it"
            )
    return model


def _hf_name(path: Path) -> str:
    """A config.json is named after its directory (a snapshot's, after its repository); another file after its stem.
    A byte of the path that is not UTF-8 (Python holds it as a lone surrogate, which no output can
    write) becomes U+FFFD, and so does a control character (a name may hold none: planner/specs/base.py)."""
    parts = Path(os.path.abspath(path)).parts  # '..' resolved, symlinks (a snapshot's into blobs/) not
    if path.name != "config.json":
        name = path.stem
    elif len(parts) >= 4 and parts[-3] == "snapshots" and parts[-4].startswith("models--"):
        name = parts[-4].removeprefix("models--").replace("--", "/")
    else:
        name = parts[-2]
    name = name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return re.sub(r"[\x00-\x1f\x7f-\x9f]", "\ufffd", name)


def load_model(name_or_path: str) -> ModelSpec:
    """A model preset by name; else an existing path: our JSON/YAML spec, a Hugging Face
    config.json, or a model directory holding one; else a hub id (ORG/NAME, or a NAME that one
    cached repository ends with) whose config.json is in the local Hugging Face cache.
    Nothing is downloaded."""
    path = Path(name_or_path)
    kind = _path_kind(path)
    if name_or_path not in model_presets() and kind == "directory":
        config = path / "config.json"
        if missing(config):  # anything else there (a FIFO, a loop) read_mapping refuses by name
            raise UsageError(
                f"{name_or_path} is a directory without a config.json; give a Hugging Face model directory, "
                "or the path of a .json/.yaml spec"
            )
        data, text = read_mapping(config)
        return _parse(data, config, text)
    if name_or_path in model_presets() or kind or path.suffix in (".json", ".yaml", ".yml"):
        return load_named(name_or_path, "model", model_presets(), _parse)
    snapshot = find_in_hub_cache(name_or_path)
    if snapshot is None:  # not an ORG/NAME, nor a cached NAME: the preset error, with its suggestions
        return load_named(name_or_path, "model", model_presets(), _parse)
    data, text = read_mapping(snapshot.config)
    model = _parse(data, snapshot.config, text, name=snapshot.repo_id)
    return model.model_copy(update={"source": "; ".join(filter(None, (snapshot.describe(), model.source)))})


def _path_kind(path: Path) -> str | None:
    """'directory', 'file' or None; a name the OS refuses (too long, a NUL byte) is no path."""
    try:
        return "directory" if path.is_dir() else "file" if path.exists() else None
    except (OSError, ValueError):
        return None


# ----- the local Hugging Face cache (the layout huggingface_hub writes; read without it)

# ORG/NAME as the Hub spells repository ids: letters, digits, '-', '_', '.'.
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")
_NAME = re.compile(r"[A-Za-z0-9][\w.-]*")
_COMMIT = re.compile(r"[0-9a-f]{40}")  # what refs/main holds: a commit hash, never a path
HUB_SOURCE = "local Hugging Face cache"


def hub_cache_dir() -> Path:
    """Where huggingface_hub keeps downloads, by its own rule: $HF_HUB_CACHE, else $HF_HOME/hub,
    else $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub."""
    env = os.environ
    if env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE"):  # the second is the older name
        return Path(env.get("HF_HUB_CACHE") or env["HUGGINGFACE_HUB_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    return Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "huggingface" / "hub"


@dataclass(frozen=True)
class HubSnapshot:
    """A model's config.json in the local cache: models--ORG--NAME/snapshots/REVISION/config.json."""

    repo_id: str
    revision: str
    chosen_by: str  # why this revision: refs/main, the only snapshot, or the newest of several
    config: Path

    def describe(self) -> str:
        return f"{self.repo_id} revision {self.revision} ({self.chosen_by}) from the {HUB_SOURCE}, {self.config}"


def find_in_hub_cache(name: str) -> HubSnapshot | None:
    """The cached config.json of hub id ORG/NAME, or of the one cached repository called NAME.
    None when `name` is not hub-id shaped, or is a bare NAME the cache does not hold."""
    if len(name) > 200 or not (HUB_ID.fullmatch(name) or _NAME.fullmatch(name)):  # the Hub allows 96 per part
        return None
    cache = hub_cache_dir()
    folder = "models--" + name.replace("/", "--")
    try:
        cached = [d.name for d in cache.iterdir() if d.name.startswith("models--")] if cache.is_dir() else []
    except OSError as exc:
        raise UsageError(f"cannot read the Hugging Face cache {cache}: {exc.strerror or exc}") from None
    if folder in cached:
        matches = [folder]
    elif "/" in name:  # the Hub treats ids case-insensitively; so do we, when unambiguous
        matches = [d for d in cached if d.lower() == folder.lower()]
    else:  # a bare NAME: the cached repositories ORG/NAME
        matches = [d for d in cached if d.lower().endswith("--" + name.lower()) or d.lower() == folder.lower()]
    ids = sorted(d.removeprefix("models--").replace("--", "/") for d in matches)
    if len(matches) > 1:
        raise UsageError(
            f"{name} is ambiguous: the Hugging Face cache {cache} holds {', '.join(ids)}; give one of them"
        )
    if not matches:
        if "/" not in name:
            return None
        raise UsageError(
            f"{name} is not a model preset, a file or a directory, and the Hugging Face cache has no {folder} (looked in "
            f"{cache}); fetch its config with `huggingface-cli download {name} config.json`, or give the path of its config.json"
        )
    return _snapshot(cache / matches[0], ids[0])


def _snapshot(repo: Path, repo_id: str) -> HubSnapshot:
    """The revision refs/main names; without it the only snapshot, or the most recently written."""
    fetch = f"`huggingface-cli download {repo_id} config.json`"
    ref = repo / "refs" / "main"
    try:
        if ref.is_file():
            revision = read_input(ref, 4096, "refs/main").decode("utf-8", errors="replace").strip()
            if not _COMMIT.fullmatch(revision):
                raise UsageError(f"{ref}: {revision[:40]!r} is not a commit hash; fetch the model again with {fetch}")
            chosen_by = "refs/main"
        else:
            snapshots = repo / "snapshots"
            found = [d for d in snapshots.iterdir() if (d / "config.json").is_file()] if snapshots.is_dir() else []
            if not found:
                raise UsageError(
                    f"{repo_id} is in the Hugging Face cache ({repo}) without a config.json; fetch it with {fetch}"
                )
            newest = max(found, key=lambda d: (d.stat().st_mtime, d.name))
            revision = newest.name
            chosen_by = (
                "the only snapshot"
                if len(found) == 1
                else f"the newest of {len(found)} snapshots, there is no refs/main"
            )
    except OSError as exc:
        raise UsageError(f"cannot read {repo} in the Hugging Face cache: {exc.strerror or exc}") from None
    config = repo / "snapshots" / revision / "config.json"
    if not config.is_file():
        raise UsageError(
            f"{repo_id} revision {revision} ({chosen_by}) has no config.json in the Hugging Face cache; fetch it with {fetch}"
        )
    return HubSnapshot(repo_id, revision, chosen_by, config)
