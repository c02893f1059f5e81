"""A scale-up domain wider than a node (ClusterSpec.scaleup_domain_gpus: GB200 NVL72's 72 GPUs
of 18 hosts of 4): groups inside it are priced on the fast link, groups across it on the
network; a cluster without the field reads as before (one domain per node); TP may fill the
domain; placement says where each axis runs; a domain that is not whole nodes is refused."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from cost_models.communication import GroupLink
from hardware_profiles import load_cluster
from planner import api
from planner.pictures import placement

H100 = load_cluster("dgx-h100-80gb")  # 8 GPUs a node, NVLink inside
HOSTS_OF_4 = H100.model_copy(
    update={"name": "h100-hosts-of-4", "gpus_per_node": 4}
)  # the same GPUs, 4 a host, no domain
DOMAIN_8 = HOSTS_OF_4.model_copy(
    update={"name": "h100-domain-8", "scaleup_domain_gpus": 8}
)  # hosts of 4, NVLink over 8


def test_a_group_inside_the_domain_takes_the_fast_link():
    for size, stride in ((8, 1), (4, 2), (2, 4)):
        inside, split = GroupLink(DOMAIN_8, size, stride), GroupLink(HOSTS_OF_4, size, stride)
        assert not inside.inter_node and split.inter_node == (size * stride > 4)
        assert inside.signature == GroupLink(H100, size, stride).signature
    assert GroupLink(DOMAIN_8, 16, 1).inter_node and GroupLink(DOMAIN_8, 16, 1).rails == 8


def test_a_domain_prices_tp_8_as_one_dgx_node_and_hosts_of_4_do_not():
    kw = dict(gpus=32, global_batch=64, seq_len=4096, tp=8, pp=2, sequence_parallel=True, target="megatron")
    on_dgx, on_domain, on_hosts = (api.estimate("llama3-70b", c, **kw).estimate for c in (H100, DOMAIN_8, HOSTS_OF_4))
    assert math.isclose(on_domain.step_time_s, on_dgx.step_time_s, rel_tol=1e-12)
    assert on_hosts.time_breakdown_s.tp_communication > 1.5 * on_domain.time_breakdown_s.tp_communication


def test_without_the_field_a_cluster_is_one_domain_per_node():
    assert H100.scaleup_domain_gpus is None and H100.domain_gpus == H100.gpus_per_node
    same = H100.model_copy(update={"scaleup_domain_gpus": 8})
    kw = dict(gpus=64, global_batch=256, seq_len=4096, tp=4, pp=4, target="megatron")
    assert api.estimate("llama3-70b", same, **kw).estimate == api.estimate("llama3-70b", H100, **kw).estimate


def test_tp_may_fill_the_domain_but_not_cross_it():
    on_domain = api.solve(
        "llama3-70b", DOMAIN_8, gpus=32, global_batch=64, seq_len=4096, target="megatron", top_k=0, fixes=["tp=8"]
    )
    assert on_domain.plan.tp == 8
    with pytest.raises(Exception, match="no layout"):  # TP stays inside the 4-GPU hosts there
        api.solve(
            "llama3-70b", HOSTS_OF_4, gpus=32, global_batch=64, seq_len=4096, target="megatron", top_k=0, fixes=["tp=8"]
        )


def test_placement_names_the_domain():
    doc = api.estimate("llama3-70b", DOMAIN_8, gpus=32, global_batch=64, seq_len=4096, tp=8, pp=2, target="megatron")
    axes = {a["axis"]: a for a in placement(doc.plan, DOMAIN_8).axes}
    assert axes["tp"]["where"].startswith("inside a scale-up domain of 8 GPUs")
    assert axes["pp"]["where"].startswith("across scale-up domains")


def test_a_domain_of_part_of_a_node_is_refused():
    with pytest.raises(ValidationError, match="not a whole number of nodes"):
        HOSTS_OF_4.model_validate({**HOSTS_OF_4.model_dump(), "scaleup_domain_gpus": 6})


def test_a_group_over_part_of_a_second_domain_spans_two():
    nvl = load_cluster("gb200-nvl72")
    assert GroupLink(nvl, 128, 1).nodes == 2 and GroupLink(nvl, 144, 1).nodes == 2 and GroupLink(nvl, 24, 1).nodes == 1
    assert GroupLink(H100, 12, 1).nodes == 2  # 12 ranks on nodes of 8: two nodes, not one


def test_deepseek_v3_experts_inside_an_nvl72_rack_cross_the_network_on_b200():
    """The README's comparison: the NVL72 plan's expert all-to-alls (EP 64, TP 4, no pipeline) stay
    on NVLink there and cross nodes on DGX B200 (8 nodes of 8)."""
    kw = dict(
        gpus=1024,
        global_batch=8192,
        seq_len=4096,
        tp=4,
        pp=1,
        ep=64,
        micro_batch_size=4,
        zero=1,
        sequence_parallel=True,
        tp_comm_overlap=True,
        recompute="selective",
        target="megatron",
    )
    nvl, b200 = (api.estimate("deepseek-v3", c, **kw).estimate for c in ("gb200-nvl72", "dgx-b200"))
    assert b200.time_breakdown_s.tp_communication > 5 * nvl.time_breakdown_s.tp_communication
