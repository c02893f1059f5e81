"""An oversubscribed spine (ClusterSpec.spine): an all-to-all over more nodes than a leaf serves
is slowed by the share of its bytes that cross leaves times the taper; rings, pipeline sends and
groups under one leaf are not; a cluster without a spine (every preset) estimates as before."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from cost_models.communication import GroupLink
from cost_models.tables import all_to_all_time, spine_factor
from hardware_profiles import PRESET_DIR, load_cluster
from planner import api
from planner.specs import ClusterSpec, Collective, Spine

H100 = load_cluster("dgx-h100-80gb")


def tapered(leaf: int, ratio: float) -> ClusterSpec:
    return H100.model_copy(update={"spine": Spine(nodes_per_leaf=leaf, oversubscription=ratio)})


def test_the_factor_is_the_crossing_share_times_the_taper():
    # 16 nodes in leaves of 4, 2:1: of each node's traffic to the 15 others, 12/15 leaves its leaf
    link = GroupLink(H100, 128, 1)
    assert link.nodes == 16
    assert math.isclose(spine_factor(tapered(4, 2.0), link), 2.0 * 12 / 15, rel_tol=1e-12)
    # a mild taper the NICs hide: 1.2 x 12/15 < 1
    assert spine_factor(tapered(4, 1.2), link) == 1.0
    # under one leaf, inside a node, or no spine at all: unchanged
    assert spine_factor(tapered(16, 4.0), link) == 1.0
    assert spine_factor(tapered(4, 4.0), GroupLink(H100, 8, 1)) == 1.0
    assert spine_factor(H100, link) == 1.0


def test_an_all_to_all_across_leaves_pays_the_network_part_times_the_factor():
    link, nbytes = GroupLink(H100, 128, 1), 64e6
    flat, slow = all_to_all_time(link, nbytes, H100), all_to_all_time(link, nbytes, tapered(4, 2.0))
    fit = H100.inter_node.fit(Collective.p2p, 128)
    network = nbytes * (128 - 8) / 128 / (fit.bandwidth_gbps * 1e9)  # the NIC's share, no spine
    assert math.isclose(slow - flat, network * (2.0 * 12 / 15 - 1), rel_tol=1e-9)


def test_moe_with_expert_parallelism_across_leaves_is_slower_and_dense_is_not():
    moe = dict(gpus=256, global_batch=512, seq_len=4096, tp=1, pp=8, ep=32, zero=1, target="megatron")
    flat = api.estimate("deepseek-v3", H100, **moe).estimate
    leaf_2 = api.estimate("deepseek-v3", tapered(2, 3.0), **moe).estimate  # EP 32 spans 4 nodes, leaves of 2
    leaf_4 = api.estimate("deepseek-v3", tapered(4, 3.0), **moe).estimate  # EP 32 under one leaf of 4
    assert leaf_2.step_time_s > flat.step_time_s
    assert math.isclose(leaf_4.step_time_s, flat.step_time_s, rel_tol=1e-12)
    dense = dict(gpus=256, global_batch=512, seq_len=4096, tp=8, pp=4, target="megatron")
    assert (
        api.estimate("llama3-70b", tapered(2, 4.0), **dense).estimate
        == api.estimate("llama3-70b", H100, **dense).estimate
    )


def test_every_preset_is_non_blocking_and_a_taper_below_one_is_refused():
    for path in sorted(PRESET_DIR.glob("*.json")):
        assert load_cluster(path.stem).spine is None, path.stem
    with pytest.raises(ValidationError, match="oversubscription"):
        H100.model_validate({**H100.model_dump(mode="json"), "spine": {"nodes_per_leaf": 32, "oversubscription": 0.5}})
    read = ClusterSpec.model_validate(
        {**H100.model_dump(mode="json"), "spine": {"nodes_per_leaf": 32, "oversubscription": 2}}
    )
    assert read.spine == Spine(nodes_per_leaf=32, oversubscription=2.0)


@pytest.mark.slow
def test_placement_shows_the_expert_groups_and_the_leaves(tmp_path):
    """plan show's placement: an "ep" row after the mesh axes with the link the cost model prices
    and what the spine does to its all-to-all; every rank's place in its expert group (each group
    of ep consecutive ranks holds each place once) and its leaf; node names carry the leaf."""
    import json
    import subprocess
    import sys

    from cost_models.tables import ep_link_of
    from planner.pictures import placement

    cluster = tapered(2, 3.0)  # leaves of 2 nodes (16 GPUs), 3:1
    doc = api.estimate(
        "qwen3-30b-a3b", cluster, gpus=64, global_batch=256, seq_len=4096, pp=2, ep=32, target="megatron"
    )
    pl = placement(doc.plan, cluster)
    ep = {a["axis"]: a for a in pl.axes}["ep"]
    link = ep_link_of(cluster, doc.plan.dp, doc.plan.tp, doc.plan.pp, 32, doc.plan.mesh_order)
    assert ep["degree"] == 32 and ep["inter_node"] == link.inter_node is True
    assert "crosses the spine (2 nodes a leaf, 3:1), network part x2.00" in ep["where"]  # 3 x (4 - 2) / (4 - 1)
    assert spine_factor(cluster, link) == pytest.approx(2.0)
    groups: dict = {}
    for rk in pl.ranks:
        groups.setdefault((rk["pp"], rk["dp"] // 32), []).append(rk["ep"])
        assert rk["leaf"] == rk["node"] // 2
    assert all(sorted(v) == list(range(32)) for v in groups.values()) and len(groups) == 2
    # without a spine: no leaves, and the ep row says nothing of one
    flat = placement(doc.plan, H100)
    assert flat.nodes_per_leaf is None and "spine" not in {a["axis"]: a for a in flat.axes}["ep"]["where"]
    # the command: text, JSON and the picture
    path, plan_path, svg = tmp_path / "tapered.json", tmp_path / "plan.json", tmp_path / "p.svg"
    path.write_text(cluster.model_dump_json())
    base = [sys.executable, "-m", "planner.cli.main"]
    subprocess.run(
        [
            *base,
            "estimate",
            "--model",
            "qwen3-30b-a3b",
            "--cluster",
            str(path),
            "--gpus",
            "64",
            "--global-batch",
            "256",
            "--seq-len",
            "4096",
            "--pp",
            "2",
            "--ep",
            "32",
            "--target",
            "megatron",
            "-o",
            str(plan_path),
        ],
        check=True,
        capture_output=True,
    )
    res = subprocess.run(
        [*base, "show", str(plan_path), "--placement", str(svg)],
        check=True,
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "COLUMNS": "200"},
    )
    assert "64 ranks on 8 node(s) of 8 GPUs, 4 leaf switch(es) of 2 nodes" in res.stdout
    assert "r1(d1 t0 p0 e1)" in res.stdout and "crosses the spine" in res.stdout
    shown = json.loads(
        subprocess.run([*base, "show", str(plan_path), "--json"], check=True, capture_output=True, text=True).stdout
    )
    assert shown["placement"]["nodes_per_leaf"] == 2 and shown["placement"]["axes"][-1]["axis"] == "ep"
    text = svg.read_text()
    assert "node 7 leaf 3" in text and "d1 t0 p0 e1" in text


@pytest.mark.parametrize("order", ["tp,dp,pp", "dp,tp,pp"])
def test_expert_groups_in_the_placement_are_the_priced_ones(order):
    """Each expert group the placement shows is ep ranks at the stride the cost model prices
    (cost_models/tables.py:ep_stride), holding each place once, whichever of tp and dp is inner."""
    from cost_models.tables import ep_stride
    from planner.pictures import placement
    from planner.specs import Axis, Plan

    plan = Plan(
        dp=4, tp=2, pp=2, ep=8, micro_batch_size=1, num_micro_batches=4, mesh_order=[Axis(a) for a in order.split(",")]
    )
    pl = placement(plan, H100)
    stride = ep_stride(plan.dp, plan.tp, plan.pp, plan.mesh_order)
    assert {a["axis"]: a for a in pl.axes}["ep"]["stride"] == stride == 1
    for start in range(0, plan.world_size, 8):  # stride 1: each group is 8 consecutive ranks
        assert [pl.ranks[r]["ep"] for r in range(start, start + 8)] == list(range(8))
