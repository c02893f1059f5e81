"""Schemas: presets load, plans validate with messages that name the factor to change."""

from pathlib import Path

import pytest
from pydantic import ValidationError

from hardware_profiles import cluster_presets, load_cluster
from planner.errors import UsageError
from planner.presets import load_model, model_presets
from planner import specs
from planner.specs import ClusterSpec, JobSpec, ModelSpec, Plan, PlanError, even_split

REQUIRED_MODELS = {
    "gpt2-124m",
    "gpt3-1.3b",
    "gpt3-6.7b",
    "gpt3-13b",
    "gpt3-175b",
    "llama2-7b",
    "llama2-13b",
    "llama2-70b",
    "llama3-8b",
    "llama3-70b",
    "llama3-405b",
    "gpt-neox-20b",
    "bloom-176b",
}
REQUIRED_CLUSTERS = {
    "dgx-a100-40gb",
    "dgx-a100-80gb",
    "dgx-h100-80gb",
    "dgx-h200",
    "dgx-b200",
    "gb200-nvl72",
    "dgx-b300",
    "gb300-nvl72",
    "mi300x",
    "mi325x",
    "mi355x",
}


def test_all_presets_load_and_cite_a_source():
    assert REQUIRED_MODELS <= set(model_presets())
    assert REQUIRED_CLUSTERS <= set(cluster_presets())
    for name in model_presets():
        assert load_model(name).source
    for name in cluster_presets():
        c = load_cluster(name)
        # 8 GPUs a node; GB200 / GB300 NVL72: trays of 4 in a 72-GPU NVLink domain
        assert c.source and (c.gpus_per_node, c.domain_gpus) == ((4, 72) if name.endswith("-nvl72") else (8, 8))
        # InfiniBand: HDR 200 Gb/s per A100, 800 Gb/s per Blackwell Ultra (B300 / GB300), 400 Gb/s per GPU on
        # every other preset (bus bandwidth below line rate).
        ib = c.inter_node.fit("all_reduce", 2).bandwidth_gbps
        assert ib < (25 if "a100" in name else 100 if "b300" in name else 50)
        assert c.intra_node.fit("all_reduce", 8).bandwidth_gbps > 5 * ib


def test_cluster_preset_round_trips_through_schema():
    c = load_cluster("dgx-h100-80gb")
    assert ClusterSpec.model_validate_json(c.model_dump_json()) == c


def test_schema_rejects_unknown_fields():
    with pytest.raises(ValidationError, match="extra"):
        ModelSpec(name="x", num_layers=2, hidden_size=64, num_heads=4, vocab_size=10, max_seq_len=8, bogus=1)


def test_every_field_is_described():
    from planner import specs

    for cls in (
        specs.ModelSpec,
        specs.ClusterSpec,
        specs.DeviceSpec,
        specs.LinkTier,
        specs.CollectiveFit,
        specs.JobSpec,
        specs.Plan,
        specs.StageRecompute,
        specs.Estimate,
        specs.TimeBreakdown,
        specs.PipelineRankMemory,
        specs.PlanDocument,
    ):
        for name, field in cls.model_fields.items():
            assert field.description, f"{cls.__name__}.{name} has no description"


def _plan(**kw):
    base = dict(dp=8, tp=8, pp=16, micro_batch_size=1, num_micro_batches=192)
    base.update(kw)
    return Plan(**base)


def test_world_size_mismatch_prints_every_factor(gpt3_175b):
    job = JobSpec(global_batch_size=1536, seq_len=2048)
    with pytest.raises(PlanError, match=r"dp x tp x pp = 8 x 8 x 16 = 1024, but the cluster has 512 GPUs"):
        _plan().validate_for(gpt3_175b, job, 512)


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(tp=5), "tp=5 does not divide the 96 attention heads"),
        (dict(pp=128, dp=1), "fewer than pp x vpp"),
        (dict(num_micro_batches=10), "but the global batch is 1536"),
        (dict(layers_per_stage=[6] * 15 + [7]), "layers_per_stage sums to 97"),
    ],
)
def test_plan_rejects_impossible_layouts(gpt3_175b, kw, message):
    job = JobSpec(global_batch_size=1536, seq_len=2048)
    with pytest.raises(PlanError, match=message):
        _plan(**kw).validate_for(gpt3_175b, job)


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(vpp=2), "needs schedule 'interleaved-1f1b'"),
        (dict(sequence_parallel=True, tp=1), "sequence_parallel needs tp > 1"),
        (dict(layers_per_stage=[6] * 4), "layers_per_stage has 4 entries"),
        (dict(mesh_order=["tp", "tp", "pp"]), "mesh_order must name dp, tp and pp"),
    ],
)
def test_plan_field_combinations(kw, message):
    with pytest.raises(ValidationError, match=message):
        _plan(**kw)


def test_even_split_gives_extras_to_middle_stages():
    assert even_split(10, 4) == [2, 3, 3, 2]
    assert even_split(96, 16) == [6] * 16
    assert sum(even_split(126, 8)) == 126 and max(even_split(126, 8)) - min(even_split(126, 8)) == 1


def test_unknown_preset_lists_close_names():
    with pytest.raises(UsageError, match="did you mean gpt3-175b"):
        load_model("gpt3-175")


def test_schema_1_0_names_still_read():
    """1.1 renamed "stage" to "pipeline_rank" where it meant a rank; 1.0 documents still read."""
    from cost_models.estimate import estimate as predict
    from hardware_profiles import load_cluster
    from planner.presets import load_model

    model, cluster = load_model("gpt3-13b"), load_cluster("dgx-a100-80gb")
    est = predict(
        model,
        cluster,
        specs.JobSpec(global_batch_size=64, seq_len=2048),
        specs.Plan(dp=2, tp=2, pp=2, micro_batch_size=1, num_micro_batches=32),
    )
    new = est.model_dump(mode="json")
    old = dict(new)
    old["memory_gib_per_stage"] = [
        {("stage" if k == "pipeline_rank" else k): v for k, v in sm.items()}
        for sm in old.pop("memory_gib_per_pipeline_rank")
    ]
    old["bottleneck_stage"] = old.pop("bottleneck_pipeline_rank")
    assert specs.Estimate.model_validate(old) == est
    assert [sm.pipeline_rank for sm in specs.Estimate.model_validate(old).memory_gib_per_pipeline_rank] == [0, 1]


def test_yaml_numbers_in_exponent_form_read_as_numbers(tmp_path):
    """`1e15` is a float in YAML 1.2 (PyYAML's 1.1 resolver would make it a string, which the
    strict number type then refuses); a quoted "1e3" stays a string and is refused."""
    cluster = load_cluster("dgx-h100-80gb").model_dump(mode="json")
    import yaml

    text = yaml.safe_dump(cluster)
    assert "memory_gib: 79.6" in text
    path = tmp_path / "c.yaml"
    path.write_text(text.replace("memory_gib: 79.6", "memory_gib: 7.96e1"))
    assert load_cluster(str(path)).device.memory_gib == pytest.approx(79.6)
    path.write_text(text.replace("memory_gib: 79.6", "memory_gib: 8e1"))
    assert load_cluster(str(path)).device.memory_gib == 80.0
    path.write_text(text.replace("memory_gib: 79.6", 'memory_gib: "8e1"'))
    with pytest.raises(UsageError, match="memory_gib"):
        load_cluster(str(path))


@pytest.mark.parametrize(
    "written, read",
    [
        ("num_layers: 032", 32),  # YAML 1.1: octal 26
        ("num_layers: 0x20", 32),
        ("num_layers: 0o40", 32),  # YAML 1.1: refused (its octal has no 0o)
        ("num_layers: +32", 32),
        ("num_layers: 1:30", None),  # YAML 1.1: 90 (base 60)
        ("num_layers: 3_2", None),  # YAML 1.1: 32
        ("num_layers: 0b100000", None),  # YAML 1.1: 32
        ("tied_embeddings: no", None),  # YAML 1.1: false
        ("tied_embeddings: off", None),
        ("tied_embeddings: False", False),
    ],
)
def test_yaml_reads_numbers_and_yes_no_as_yaml_1_2_does(tmp_path, written, read):
    """YAML 1.2's core schema (planner/datafile.py): what YAML 1.1 would read as a number or a
    boolean the author did not write (base 60, octal by a leading zero, yes / no / on / off,
    underscores, binary) is a string, which the field refuses in one line naming it."""
    text = Path(model_presets()["llama3-8b"]).read_text()
    key = written.split(":")[0]
    line = next(x for x in text.splitlines() if x.startswith(key + ":"))
    path = tmp_path / "m.yaml"
    path.write_text(text.replace(line, written, 1))
    if read is None:
        with pytest.raises(UsageError, match=key):
            load_model(str(path))
    else:
        assert getattr(load_model(str(path)), key) == read


@pytest.mark.parametrize("name", ["m\nerror: injected", "m\x1b[31mred", "tab\there", "del\x7f", "c1\x9b31m"])
def test_a_name_with_control_characters_is_refused(name):
    """Names are printed in titles, tables and error lines: a newline would add a line (a second
    "error:"), an escape sequence would restyle the terminal."""
    good = load_model("gpt2-124m").model_dump(mode="json")
    with pytest.raises(ValidationError, match="control characters"):
        ModelSpec.model_validate({**good, "name": name})
    cluster = load_cluster("dgx-a100-80gb").model_dump(mode="json")
    with pytest.raises(ValidationError, match="control characters"):
        ClusterSpec.model_validate({**cluster, "device": {**cluster["device"], "name": name}})
    assert ModelSpec.model_validate({**good, "name": "modèle-λ 8B"}).name == "modèle-λ 8B"
