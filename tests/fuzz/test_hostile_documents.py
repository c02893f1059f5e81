"""Hostile documents (issue 19, items 6-9): a valid model spec, cluster profile, plan document and
Hugging Face config.json with one field, at any depth, replaced by a hostile value (a huge or tiny
number, an integer past float range, a bool, a number as a string, a list, a mapping, null).

Every such document is refused in one line by the command that reads it (tests/hostile.py's
promise), or, where the value is a legitimate one, accepted cleanly: exit 0, every number it
prints finite. Where the replacement changes the JSON kind of a field the planner reads (a
string or bool where a number was, a number where a yes/no was, a float where an integer was) or
puts a number beyond any physical bound, acceptance is a failure: such a value is never valid.

Also: the device tables the cost model needs (item 8) and the one plan-document validation every
command shares (item 9)."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings, strategies as st

from planner import api
from planner.cli.main import cli
from planner.errors import UsageError
from planner.presets.hf_config import FIELD_KINDS
from planner.specs import ClusterSpec, ModelSpec
from tests.hostile import assert_refused
from tests.paths import ROOT

WORLD = ["--gpus", "8", "--global-batch", "16", "--seq-len", "512"]
MODEL = {"name": "m", "num_layers": 4, "hidden_size": 256, "num_heads": 4, "vocab_size": 1000, "max_seq_len": 512}
HOSTILE = [
    1e308,
    -1e308,
    1e-300,
    5e-324,
    10**309,
    10**400,
    -(10**309),
    2**63,
    2**64,
    10**19,
    -1,
    0,
    6.0,
    0.5,
    True,
    False,
    "8",
    "80",
    "1e3",
    "false",
    "nan",
    "NaN",
    "inf",
    "-Infinity",
    ["6", "6"],
    [True, 11],
    [6.0, 6.0],
    [],
    {},
    {"a": 1},
    None,
    "",
]
values = st.sampled_from(HOSTILE) | st.floats(allow_nan=False, allow_infinity=False) | st.integers(-(2**70), 2**70)
# 25 examples a document kind, the same every run; HOSTILE_EXAMPLES=N for N new ones (a longer hunt).
_HUNT = int(os.environ.get("HOSTILE_EXAMPLES", "0"))
FAST = settings(
    max_examples=_HUNT or 25, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=not _HUNT
)


def _kind(value) -> str:
    """A JSON value's kind: what a reader of the field expects, whatever its value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "integer"
    return {float: "number", str: "string", list: "list", dict: "mapping"}[type(value)]


def _paths(doc, prefix=()):
    """Every field of `doc`, at any depth (mappings by key, lists by index), outermost first."""
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in items:
        yield prefix + (key,)
        yield from _paths(value, prefix + (key,))


def _replaced(doc, path, value):
    out = json.loads(json.dumps(doc))
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


def _get(doc, path):
    for key in path:
        doc = doc[key]
    return doc


def never_valid(old, new) -> bool:
    """Whether no reader may accept `new` where a document held `old`: another JSON kind (null
    aside: an optional field may take it; an integer may stand for a float, not the reverse),
    or a number no physical quantity of a spec reaches (negative, or 10^31 and beyond)."""
    if new is None or old is None:
        return False
    a, b = _kind(old), _kind(new)
    if a != b and not (a == "number" and b == "integer"):
        return True
    return b in ("integer", "number") and (new < 0 or new >= 1e31)


def _finite(text: str) -> None:
    """Every number of a JSON output is finite (read without NaN / Infinity literals)."""

    def no_constant(name):
        raise AssertionError(f"output holds {name}")

    json.loads(text, parse_constant=no_constant, parse_float=lambda s: _check_float(float(s)))


def _check_float(x: float) -> float:
    assert math.isfinite(x), x
    return x


def check_document(name: str, doc, args: list[str], must_refuse: bool) -> None:
    """Write `doc` as `name` in a fresh directory and run `plan ARGS` there: refused as
    tests/hostile.py requires, or (unless `must_refuse`) accepted cleanly."""
    with tempfile.TemporaryDirectory() as d:
        directory = Path(d)
        target = directory / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(doc))
        if must_refuse:
            assert_refused(directory, args, name=f"{name}: {args}")
            return
        cwd = os.getcwd()
        os.chdir(directory)
        try:
            r = CliRunner().invoke(cli, args)
        finally:
            os.chdir(cwd)
        if r.exit_code != 0:
            assert_refused(directory, args, name=f"{name}: {args}")
            return
        assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
        assert "Traceback" not in r.output and "error:" not in r.stderr, r.output
        if "--json" in args:
            _finite(r.stdout)


# --------------------------------------------------------------------------- the base documents


def _model_doc() -> dict:
    return ModelSpec(**MODEL).model_dump(mode="json")


def _cluster_doc() -> dict:
    return api.load_cluster("dgx-h100-80gb").model_dump(mode="json")


def _plan_doc() -> dict:
    doc = api.estimate("gpt2-124m", "dgx-a100-80gb", gpus=8, global_batch=16, seq_len=512, pp=2, tp=2).model_dump(
        mode="json"
    )
    return {k: doc[k] for k in ("schema_version", "model", "cluster", "num_gpus", "job", "plan")}


def _solve_doc() -> dict:
    """A `plan solve` document with what the readers of --alternative take of it (not its estimates)."""
    doc = api.solve("gpt2-124m", "dgx-a100-80gb", gpus=8, global_batch=16, seq_len=512, target="generic", top_k=2)
    doc = doc.model_dump(mode="json")
    alternatives = [{k: a[k] for k in ("plan", "global_batch_size", "target")} for a in doc["alternatives"]]
    return {
        **{k: doc[k] for k in ("schema_version", "model", "cluster", "num_gpus", "job", "plan")},
        "alternatives": alternatives,
    }


def _hf_doc() -> dict:
    return json.loads((ROOT / "tests/data/hf_configs/llama-3-8b.json").read_text())


MODEL_DOC, CLUSTER_DOC, PLAN_DOC, SOLVE_DOC, HF_DOC = _model_doc(), _cluster_doc(), _plan_doc(), _solve_doc(), _hf_doc()


@FAST
@given(path=st.sampled_from(list(_paths(MODEL_DOC))), value=values)
def test_a_model_spec_with_one_hostile_field(path, value):
    doc = _replaced(MODEL_DOC, path, value)
    check_document(
        "m.json",
        doc,
        ["estimate", "--model", "m.json", "--cluster", "dgx-a100-80gb", *WORLD, "--json"],
        never_valid(_get(MODEL_DOC, path), value),
    )


@FAST
@given(path=st.sampled_from(list(_paths(CLUSTER_DOC))), value=values)
def test_a_cluster_profile_with_one_hostile_field(path, value):
    doc = _replaced(CLUSTER_DOC, path, value)
    check_document(
        "c.json",
        doc,
        ["estimate", "--model", "gpt2-124m", "--cluster", "c.json", *WORLD, "--json"],
        never_valid(_get(CLUSTER_DOC, path), value),
    )


PLAN_COMMANDS = [
    ["estimate", "--plan", "p.json", "--json"],
    ["show", "p.json", "--json"],
    ["export", "p.json", "--to", "megatron"],
]


@FAST
@given(
    path=st.sampled_from([p for p in _paths(PLAN_DOC) if p[0] != "schema_version"]),
    value=values,
    command=st.sampled_from(PLAN_COMMANDS),
)
def test_a_plan_document_with_one_hostile_field(path, value, command):
    doc = _replaced(PLAN_DOC, path, value)
    check_document("p.json", doc, command, never_valid(_get(PLAN_DOC, path), value))


ALTERNATIVE_COMMANDS = [
    ["estimate", "--plan", "p.json", "--alternative", "1", "--json"],
    ["export", "p.json", "--alternative", "1", "--to", "deepspeed"],
]


@FAST
@given(
    path=st.sampled_from([p for p in _paths(SOLVE_DOC) if p[:2] == ("alternatives", 0)]),
    value=values,
    command=st.sampled_from(ALTERNATIVE_COMMANDS),
)
def test_a_solve_documents_alternative_with_one_hostile_field(path, value, command):
    doc = _replaced(SOLVE_DOC, path, value)
    check_document("p.json", doc, command, never_valid(_get(SOLVE_DOC, path), value))


def hf_never_valid(path, old, new) -> bool:
    """A field the config reader reads (planner/presets/hf_config.py:FIELD_KINDS) of another
    kind, or a number beyond any model; one name for `architectures` is read as a list of it, and
    what a mapping (quantization_config) holds is not read."""
    if (
        path[0] not in FIELD_KINDS
        or FIELD_KINDS[path[0]][0] == "mapping"
        or (path == ("architectures",) and isinstance(new, str))
    ):
        return False
    return never_valid(old, new)


def _readable_configs() -> dict[str, dict]:
    """Every config of tests/data/hf_configs that is read (a multimodal one is refused whole)."""
    out = {}
    for path in sorted((ROOT / "tests/data/hf_configs").glob("*.json")):
        try:
            api.load_model(path)
        except UsageError:
            continue
        out[path.stem] = json.loads(path.read_text())
    return out


HF_CONFIGS = _readable_configs()


@st.composite
def hf_field(draw):
    """A config of any family read, and one of its fields at any depth."""
    config = HF_CONFIGS[draw(st.sampled_from(sorted(HF_CONFIGS)))]
    return config, draw(st.sampled_from(list(_paths(config))))


@FAST
@given(where=hf_field(), value=values)
def test_a_hugging_face_config_with_one_hostile_field(where, value):
    config, path = where
    doc = _replaced(config, path, value)
    check_document(
        "hf/config.json",
        doc,
        ["estimate", "--model", "hf", "--cluster", "dgx-h100-80gb", *WORLD, "--json"],
        hf_never_valid(path, _get(config, path), value),
    )


def test_every_field_a_family_reads_has_a_kind():
    """A field added to a family (planner/presets/hf_config.py:FAMILIES) is checked by kind too."""
    from planner.presets.hf_config import FAMILIES

    assert set().union(*(f.fields for f in FAMILIES.values())) <= set(FIELD_KINDS)


def test_the_properties_can_fail():
    """What the generated tests count as never valid is what they claim."""
    assert never_valid(6, "6") and never_valid(6, 6.0) and never_valid(True, 1) and never_valid(80.0, "80")
    assert never_valid(80.0, 1e308) and never_valid(4, 10**309) and never_valid(4, -1) and never_valid({"a": 1}, 5)
    assert (
        not never_valid(80.0, 80) and not never_valid(4, 5) and not never_valid(None, "x") and not never_valid(4, None)
    )
    assert hf_never_valid(("tie_word_embeddings",), False, "false") and not hf_never_valid(
        ("architectures",), ["X"], "X"
    )
    assert not hf_never_valid(("rope_theta",), 500000.0, "abc")  # cost-free: not read
    assert not hf_never_valid(("quantization_config", "quant_method"), "fp8", 5) and hf_never_valid(
        ("architectures", 0), "X", 5
    )


# --------------------------------------------------------------------------- item 6 and 7: the issue's examples


def _device(**changes) -> dict:
    return {**CLUSTER_DOC, "device": {**CLUSTER_DOC["device"], **changes}}


def _gemm(**changes) -> dict:
    return _device(gemm={**CLUSTER_DOC["device"]["gemm"], **changes})


def _llama(**changes) -> dict:
    return {**HF_DOC, **changes}


def _plan(**changes) -> dict:
    return {**PLAN_DOC, "plan": {**PLAN_DOC["plan"], **changes}}


EXAMPLES = [  # (what, file name, document, the words the error line has)
    ("overhead 1e308", "c.json", _device(framework_overhead_gib=1e308), "framework_overhead_gib"),
    ("bandwidth 1e-300", "c.json", _device(memory_bandwidth_gbps=1e-300), "memory_bandwidth_gbps"),
    ("sm_count 10**400", "c.json", _gemm(sm_count=10**400), "sm_count"),
    ("ffn 10**309", "m.json", {**MODEL, "ffn_hidden_size": 10**309}, "ffn_hidden_size"),
    (
        "global batch 2e12",
        "p.json",
        {**PLAN_DOC, "job": {**PLAN_DOC["job"], "global_batch_size": 2 * 10**12}},
        "global_batch_size",
    ),
    ("seq 1e12", "p.json", {**PLAN_DOC, "job": {**PLAN_DOC["job"], "seq_len": 10**12}}, "seq_len"),
    ("split as strings", "p.json", _plan(layers_per_stage=["1", "1", "1", "9"]), "layers_per_stage"),
    ("split with a bool", "p.json", _plan(layers_per_stage=[True, 11]), "layers_per_stage"),
    ("split as floats", "p.json", _plan(layers_per_stage=[6.0, 6.0]), "layers_per_stage"),
    ("num_gpus as a string", "p.json", {**PLAN_DOC, "num_gpus": "8"}, "num_gpus"),
    (
        "memory as a string",
        "p.json",
        {
            **PLAN_DOC,
            "cluster": {**PLAN_DOC["cluster"], "device": {**PLAN_DOC["cluster"]["device"], "memory_gib": "80"}},
        },
        "memory_gib",
    ),
    ("sequence_parallel 1", "p.json", _plan(sequence_parallel=1), "sequence_parallel"),
    ("hf architectures 5", "llama/config.json", _llama(architectures=5), "architectures"),
    ("hf architectures true", "llama/config.json", _llama(architectures=True), "architectures"),
    ("hf dims as a mapping", "llama/config.json", _llama(hidden_size={"value": 4096}), "hidden_size"),
    ("hf tie as a string", "llama/config.json", _llama(tie_word_embeddings="false"), "tie_word_embeddings"),
    ("hf no kv heads", "llama/config.json", _llama(num_key_value_heads=0), "num_key_value_heads"),
    ("hf float64", "llama/config.json", _llama(torch_dtype="float64"), "float64"),
    ("hf int8", "llama/config.json", _llama(torch_dtype="int8"), "int8"),
    ("hf activation a mapping", "llama/config.json", _llama(hidden_act={}), "hidden_act"),
    ("hf hidden 10**200", "llama/config.json", _llama(hidden_size=10**200), "hidden_size"),
    (
        "hf qwen2_moe expert width 0",
        "llama/config.json",
        {
            **_llama(model_type="qwen2_moe", architectures=["Qwen2MoeForCausalLM"]),
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 0,
            "shared_expert_intermediate_size": 0,
        },
        "moe_intermediate_size",
    ),
]


def _reader(name: str) -> list[str]:
    if name == "p.json":
        return ["estimate", "--plan", "p.json"]
    model = "llama" if name.startswith("llama") else "m.json" if name == "m.json" else "gpt2-124m"
    return ["estimate", "--model", model, "--cluster", "c.json" if name == "c.json" else "dgx-a100-80gb", *WORLD]


@pytest.mark.parametrize("what,name,doc,words", EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_the_issues_examples_are_refused_naming_the_field(tmp_path, what, name, doc, words):
    (tmp_path / name).parent.mkdir(exist_ok=True)
    (tmp_path / name).write_text(json.dumps(doc))
    line = assert_refused(tmp_path, _reader(name), name=what)
    assert words in line, line


def test_a_number_out_of_range_states_the_range(tmp_path):
    (tmp_path / "c.json").write_text(json.dumps(_device(framework_overhead_gib=1e308)))
    line = assert_refused(tmp_path, _reader("c.json"))
    assert "at least 0 and at most 1,000,000 GiB" in line, line


def test_one_architecture_name_is_read_as_one_name(tmp_path):
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama/config.json").write_text(json.dumps(_llama(architectures="LlamaForCausalLM")))
    assert api.load_model(tmp_path / "llama") == api.load_model(
        ROOT / "tests/data/hf_configs/llama-3-8b.json"
    ).model_copy(update={"name": "llama"})
    (tmp_path / "llama/config.json").write_text(json.dumps(_llama(architectures="BertModel")))
    with pytest.raises(UsageError, match=r"\['BertModel'\]"):
        api.load_model(tmp_path / "llama")


# --------------------------------------------------------------------------- item 8: tables the cost model reads

H100 = api.load_cluster("dgx-h100-80gb").model_dump(mode="json")


def _h100(**device) -> dict:
    return {**H100, "device": {**H100["device"], **device}}


TABLES = {
    "attention cudnn only": (_h100(attention={"cudnn": H100["device"]["attention"]["cudnn"]}), "flash2"),
    "attention empty": (_h100(attention={}), "flash2"),
    "attention unknown kernel": (
        _h100(attention={**H100["device"]["attention"], "flash3": {"forward": 0.7, "backward": 0.6}}),
        "flash3",
    ),
    "fp8 without its efficiency": (
        _h100(gemm={k: v for k, v in H100["device"]["gemm"].items() if k != "fp8_max_efficiency"}),
        "fp8_max_efficiency",
    ),
}


def _plan_on(cluster: dict) -> dict:
    return {**PLAN_DOC, "cluster": cluster}


@pytest.mark.parametrize("what", list(TABLES))
@pytest.mark.parametrize("command", ["estimate", "solve", "show"])
def test_a_device_table_the_cost_model_needs_is_required(tmp_path, what, command):
    cluster, words = TABLES[what]
    (tmp_path / "c.json").write_text(json.dumps(cluster))
    (tmp_path / "p.json").write_text(json.dumps(_plan_on(cluster)))
    args = {
        "estimate": ["estimate", "--model", "gpt2-124m", "--cluster", "c.json", *WORLD, "--fp8"],
        "solve": ["solve", "--model", "gpt2-124m", "--cluster", "c.json", *WORLD, "--fp8"],
        "show": ["show", "p.json"],
    }[command]
    line = assert_refused(tmp_path, args, code=2, name=what)
    assert words in line, line


@pytest.mark.parametrize("command", ["estimate", "solve", "show"])
def test_without_an_attention_table_attention_is_costed_as_gemms(tmp_path, monkeypatch, command):
    """`attention` left out on a device with the GEMM shape model only: attention runs as its
    GEMMs (cost_models/compute.py:attention_times), slower than the fused kernel, no crash."""
    cluster = _h100(attention=None)
    (tmp_path / "c.json").write_text(json.dumps(cluster))
    (tmp_path / "p.json").write_text(json.dumps(_plan_on(cluster)))
    args = {
        "estimate": ["estimate", "--model", "gpt2-124m", "--cluster", "c.json", *WORLD, "--json"],
        "solve": ["solve", "--model", "gpt2-124m", "--cluster", "c.json", *WORLD, "--time-limit", "20", "--json"],
        "show": ["show", "p.json", "--json"],
    }[command]
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0 and r.exception is None, (r.output, r.exception)
    _finite(r.stdout)
    if command == "estimate":
        fused = api.estimate("gpt2-124m", "dgx-h100-80gb", gpus=8, global_batch=16, seq_len=512)
        assert json.loads(r.stdout)["estimate"]["step_time_s"] > fused.estimate.step_time_s


# --------------------------------------------------------------------------- item 9: one validation of a plan document

INCONSISTENT = {
    "fp8 on an A100": (_plan(fp8=True), "no FP8 tensor cores"),
    "micro-batches that do not make the batch": (
        _plan(num_micro_batches=PLAN_DOC["plan"]["num_micro_batches"] + 1),
        "global batch",
    ),
    "precision the device has no peak for": (
        {
            **PLAN_DOC,
            "job": {**PLAN_DOC["job"], "precision": "fp16"},
            "cluster": {
                **PLAN_DOC["cluster"],
                "device": {**PLAN_DOC["cluster"]["device"], "peak_tflops": {"bf16": 312.0}},
            },
        },
        "no fp16 throughput",
    ),
    # the checks --gpus gets against --cluster (planner/inputs.py:check_cluster_holds), on the document's own pair
    "a cluster of fewer GPUs than the plan's": (
        {**PLAN_DOC, "cluster": {**PLAN_DOC["cluster"], "gpus_per_node": 4, "num_nodes": 1}},
        "fewer than its num_gpus 8",
    ),
    "GPUs that are no whole number of nodes": (
        {**PLAN_DOC, "cluster": {**PLAN_DOC["cluster"], "gpus_per_node": 3}},
        "not a whole number of",
    ),
    # a version as a number: 1.10 would read 1.1 (was accepted)
    "a schema_version that is a number": ({**PLAN_DOC, "schema_version": 1.1}, "schema_version is 1.1, not a string"),
}


@pytest.mark.parametrize("what", list(INCONSISTENT))
def test_every_command_refuses_the_same_plan_document_with_the_same_line(tmp_path, what):
    doc, words = INCONSISTENT[what]
    (tmp_path / "p.json").write_text(json.dumps(doc))
    lines = {
        assert_refused(tmp_path, args, code=2, name=what)
        for args in (
            ["estimate", "--plan", "p.json"],
            ["estimate", "--plan", "p.json", "--tp", "1"],
            ["show", "p.json"],
            ["export", "p.json", "--to", "megatron"],
            ["export", "p.json", "--to", "deepspeed"],
            ["run", "p.json"],
        )
    }
    assert len(lines) == 1 and words in lines.pop(), lines
    for call in (
        lambda: api.read_plan(tmp_path / "p.json"),
        lambda: api.export_plan(tmp_path / "p.json", "megatron"),
        lambda: api.what_if(tmp_path / "p.json", tp=1),
    ):
        with pytest.raises(UsageError, match=words):
            call()


def test_a_document_in_memory_is_checked_as_a_file_is():
    doc = api.estimate("gpt2-124m", "dgx-a100-80gb", gpus=8, global_batch=16, seq_len=512)
    bad = doc.model_copy(update={"plan": doc.plan.model_copy(update={"fp8": True})})
    for call in (lambda: api.export_plan(bad, "megatron"), lambda: api.what_if(bad, tp=2)):
        with pytest.raises(UsageError, match="no FP8 tensor cores"):
            call()


def test_every_preset_cluster_still_reads():
    """The bounds hold every shipped profile (tests/unit/presets/test_hf_configs.py reads the configs)."""
    for path in (ROOT / "hardware_profiles/presets").glob("*.json"):
        ClusterSpec.model_validate_json(path.read_text())


@pytest.mark.parametrize(
    "suffix,text,line",
    [
        (".yaml", "name: m\nnum_layers: 4\nhidden_size: 256\nnum_layers: 8\n", 4),
        (".json", '{"name": "m",\n "num_layers": 4,\n "hidden_size": 256,\n "num_layers": 8}', 4),
        (".yaml", "name: m\nparallel:\n  tp: 2\n  tp: 4\n", 4),  # inside a nested mapping too
    ],
)
def test_a_key_given_twice_is_refused_at_its_second_line(tmp_path, suffix, text, line):
    """JSON and YAML parsers keep the last of two equal keys silently; which the author meant is
    not ours to guess, so the document is refused at the second, naming the key."""
    from planner.datafile import read_mapping
    from planner.errors import UsageError

    path = tmp_path / f"dup{suffix}"
    path.write_text(text)
    with pytest.raises(
        UsageError, match=rf"{path.name}:{line}: .*the key '(num_layers|tp)' appears twice in one mapping; keep one"
    ):
        read_mapping(path)


def test_yaml_merge_keys_still_let_explicit_keys_override(tmp_path):
    from planner.datafile import read_mapping

    path = tmp_path / "merge.yaml"
    path.write_text("base: &b\n  num_heads: 4\n  hidden_size: 64\nm:\n  <<: *b\n  num_heads: 8\n")
    assert read_mapping(path)[0]["m"] == {"num_heads": 8, "hidden_size": 64}
