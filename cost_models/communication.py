"""Alpha-beta communication costs and where each parallel group lands on the topology.

A collective of `nbytes` (the full, unsharded buffer) over n ranks on a link with latency
alpha and bus bandwidth B costs alpha + k(n) x nbytes / B (alpha growing with the group: one hop
latency per ring step, or per tree level, GroupLink.step_latency_us), with the ring volume factors
k = 2(n-1)/n for all-reduce and (n-1)/n for all-gather and reduce-scatter (Thakur et al.
2005; the NCCL-tests "bus bandwidth" convention), and k = 1 for point-to-point.
A group whose ranks sit on more than one node pays the inter-node tier; when k of its
ranks share a node, NCCL drives k NICs at once (one channel per rail), so the inter-node
bus bandwidth is k x the per-GPU figure, capped by the intra-node link.

Each call also pays the link tier's `call_overhead_us` for its collective, where a profile
measured one (planner/profiler/calls.py): what a call costs a training step beyond the fit of
calls timed back to back (ranks meeting, the framework's host work around the call). It enters
alpha, so it is charged once per call wherever the model counts calls (one per bucketed
stream, one per layer for ZeRO-3, four per layer for TP). The presets have none.
"""

from __future__ import annotations

import math

from planner.specs import Axis, ClusterSpec, Collective

VOLUME_FACTOR = {
    Collective.all_reduce: lambda n: 2.0 * (n - 1) / n,
    Collective.all_gather: lambda n: (n - 1) / n,
    Collective.reduce_scatter: lambda n: (n - 1) / n,
    Collective.p2p: lambda n: 1.0,
    Collective.all_to_all: lambda n: (n - 1) / n,  # every rank sends all but its own piece (nccl-tests' busbw)
}


def mesh_strides(degrees: dict[Axis, int], mesh_order) -> dict[Axis, int]:
    """Rank distance between neighbours of each axis: the product of the degrees inside it."""
    strides, stride = {}, 1
    for axis in mesh_order:
        strides[axis] = stride
        stride *= degrees[axis]
    return strides


def spans_nodes(degree: int, stride: int, gpus_per_node: int) -> bool:
    """True when one group (degree ranks, `stride` apart) sits on more than one node; ranks
    are laid node by node, gpus_per_node consecutive ranks per node. Called with the scale-up
    domain's size (ClusterSpec.domain_gpus): a group inside one domain stays on its fast link."""
    if degree == 1:
        return False
    extent = stride * degree
    return extent > gpus_per_node or gpus_per_node % extent != 0


class GroupLink:
    """Alpha-beta costs of every collective over one group shape (size, stride): tier, rails
    and volume factor resolved once per collective, so that many message sizes are cheap."""

    __slots__ = ("size", "inter_node", "rails", "_cluster", "_coef")

    def __init__(self, cluster: ClusterSpec, size: int, stride: int):
        self.size = size
        domain = cluster.domain_gpus  # "node" below: the scale-up domain (one node unless the cluster says more)
        self.inter_node = size > 1 and spans_nodes(size, stride, domain)
        self._cluster = cluster
        self.rails = max(1, min(size, domain // stride)) if self.inter_node else 1
        self._coef: dict[Collective, tuple[float, float]] = {}  # (alpha s, seconds per byte of the full buffer)

    @property
    def signature(self) -> tuple:
        """What the costs depend on: equal signatures give equal costs."""
        return (self.size, self.inter_node, self.rails)

    def coefficients(self, c: Collective) -> tuple[float, float]:
        """(alpha seconds, beta seconds per byte of the full buffer) of collective `c`."""
        coef = self._coef.get(c)
        if coef is None:
            n, cluster = self.size, self._cluster
            fit = (cluster.inter_node if self.inter_node else cluster.intra_node).fit(c, n)
            bw = fit.bandwidth_gbps
            if self.inter_node and c not in (Collective.p2p, Collective.all_to_all):  # rings share a node's NICs
                bw = min(bw * self.rails, cluster.intra_node.fit(c, n).bandwidth_gbps)
            alpha = fit.latency_us + self.step_latency_us(c) + self.call_overhead_us(c)
            coef = self._coef[c] = (alpha * 1e-6, VOLUME_FACTOR[c](n) / (bw * 1e9))
        return coef

    def call_overhead_us(self, c: Collective) -> float:
        """What one call costs beyond the fit of back-to-back calls (LinkTier.call_overhead_us;
        0 where the tier has no figure for `c`; LinkTier.call_overhead)."""
        tier = self._cluster.inter_node if self.inter_node else self._cluster.intra_node
        return tier.call_overhead(c) or 0.0

    @property
    def nodes(self) -> int:
        """Nodes the group spans (its ranks on one node each drive their own NIC): rounded up, so
        that a group of 128 over domains of 72 spans two, not one."""
        return max(1, -(-self.size // self.rails)) if self.inter_node else 1

    def step_latency_us(self, c: Collective) -> float:
        """Latency that grows with the group, on top of the per-call latency: a ring takes
        n-1 steps (all-gather, reduce-scatter) or 2(n-1) (all-reduce), the steps between
        nodes at the network's hop latency and the rest at the NVLink hop latency; an
        all-reduce may instead take NCCL's tree, 2((n/nodes - 1) intra + log2(nodes) inter)
        hops, whichever is shorter (NCCL's tuning model: src/graph/tuning.cc of NVIDIA/nccl).
        Zero for links without hop latencies (profiles fitted at one group size)."""
        if c in (Collective.p2p, Collective.all_to_all) or self.size <= 1:  # concurrent exchanges, not ring steps
            return 0.0
        intra, inter = self._cluster.intra_node, self._cluster.inter_node
        hop_intra = intra.hop_latency_us
        hop_inter = inter.hop_latency_us if self.inter_node else hop_intra
        if hop_intra is None or hop_inter is None:
            return 0.0
        n, nodes = self.size, self.nodes
        per = 2 if c == Collective.all_reduce else 1
        steps, inter_steps = per * (n - 1), per * (nodes - 1)
        ring = (steps - inter_steps) * hop_intra + inter_steps * hop_inter
        if c != Collective.all_reduce or intra.tree_hop_latency_us is None:
            return ring
        tree_inter = inter.tree_hop_latency_us if self.inter_node else 0.0
        if tree_inter is None:
            return ring
        tree = 2 * ((n // nodes - 1) * intra.tree_hop_latency_us + math.log2(nodes) * tree_inter)
        return min(ring, tree)

    def bandwidth_gbps(self, collective: Collective) -> float:
        """Bus bandwidth of `collective` on this group, GB/s."""
        _, beta = self.coefficients(collective)
        return VOLUME_FACTOR[collective](self.size) / beta / 1e9

    def time(self, collective: Collective, nbytes: float) -> float:
        if self.size <= 1 or nbytes <= 0:
            return 0.0
        alpha, beta = self.coefficients(collective)
        return alpha + beta * nbytes


def overlapped(total: float, edge: float, window: float, efficiency: float = 1.0) -> float:
    """Exposed time of communication `total` that runs beside compute `window`, except for a
    piece `edge` (the last gradient bucket, the first layer's gather) that cannot overlap,
    when only `efficiency` of the overlappable part actually hides (1 on GPUs):
    total - efficiency x min(total - edge, window)
      = max((1 - efficiency) total + efficiency min(edge, total), total - efficiency window)."""
    edge = min(edge, total)
    return max((1.0 - efficiency) * total + efficiency * edge, total - efficiency * window)
