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
    assert api.estimate("llama3-70b", tapered(2, 4.0), **dense).estimate == api.estimate("llama3-70b", H100, **dense).estimate


def test_every_preset_is_non_blocking_and_a_taper_below_one_is_refused():
    for path in sorted(PRESET_DIR.glob("*.json")):
        assert load_cluster(path.stem).spine is None, path.stem
    with pytest.raises(ValidationError, match="oversubscription"):
        H100.model_validate({**H100.model_dump(mode="json"), "spine": {"nodes_per_leaf": 32, "oversubscription": 0.5}})
    read = ClusterSpec.model_validate({**H100.model_dump(mode="json"), "spine": {"nodes_per_leaf": 32, "oversubscription": 2}})
    assert read.spine == Spine(nodes_per_leaf=32, oversubscription=2.0)
