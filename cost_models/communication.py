"""Alpha-beta communication costs and where each parallel group lands on the topology.

A collective of `nbytes` (the full, unsharded buffer) over n ranks on a link with latency
alpha and bus bandwidth B costs alpha + k(n) x nbytes / B, with the ring volume factors
k = 2(n-1)/n for all-reduce and (n-1)/n for all-gather and reduce-scatter (Thakur et al.
2005; the NCCL-tests "bus bandwidth" convention), and k = 1 for point-to-point.
A group whose ranks sit on more than one node pays the inter-node tier; when k of its
ranks share a node, NCCL drives k NICs at once (one channel per rail), so the inter-node
bus bandwidth is k x the per-GPU figure, capped by the intra-node link.
"""

from __future__ import annotations

from planner.specs import Axis, ClusterSpec, Collective, LinkTier, Plan

VOLUME_FACTOR = {
    Collective.all_reduce: lambda n: 2.0 * (n - 1) / n,
    Collective.all_gather: lambda n: (n - 1) / n,
    Collective.reduce_scatter: lambda n: (n - 1) / n,
    Collective.p2p: lambda n: 1.0,
}


def collective_time(tier: LinkTier, collective: Collective, group_size: int, nbytes: float) -> float:
    """Seconds for one collective of `nbytes` over `group_size` ranks on `tier`."""
    if group_size <= 1 or nbytes <= 0:
        return 0.0
    fit = tier.fit(collective, group_size)
    return fit.latency_us * 1e-6 + VOLUME_FACTOR[collective](group_size) * nbytes / (fit.bandwidth_gbps * 1e9)


def axis_strides(plan: Plan) -> dict[Axis, int]:
    """Rank distance between neighbours of each axis: the product of the degrees inside it."""
    degrees = {Axis.dp: plan.dp, Axis.tp: plan.tp, Axis.pp: plan.pp}
    strides, stride = {}, 1
    for axis in plan.mesh_order:
        strides[axis] = stride
        stride *= degrees[axis]
    return strides


def axis_spans_nodes(plan: Plan, axis: Axis, gpus_per_node: int) -> bool:
    """True when the ranks of one group of `axis` sit on more than one node (ranks are laid
    node by node, gpus_per_node consecutive ranks per node)."""
    degree = {Axis.dp: plan.dp, Axis.tp: plan.tp, Axis.pp: plan.pp}[axis]
    if degree == 1:
        return False
    extent = axis_strides(plan)[axis] * degree
    return extent > gpus_per_node or gpus_per_node % extent != 0


def axis_tier(plan: Plan, axis: Axis, cluster: ClusterSpec) -> LinkTier:
    """The link tier a group of `axis` communicates over."""
    return cluster.inter_node if axis_spans_nodes(plan, axis, cluster.gpus_per_node) else cluster.intra_node


def axis_degree(plan: Plan, axis: Axis) -> int:
    return {Axis.dp: plan.dp, Axis.tp: plan.tp, Axis.pp: plan.pp}[axis]


class GroupLink:
    """Alpha-beta costs of every collective over the groups of one mesh axis: tier, rails and
    volume factor resolved once per collective, so that many message sizes are cheap."""

    __slots__ = ("size", "inter_node", "_cluster", "_rails", "_coef")

    def __init__(self, cluster: ClusterSpec, plan: Plan, axis: Axis):
        n = self.size = axis_degree(plan, axis)
        self.inter_node = n > 1 and axis_spans_nodes(plan, axis, cluster.gpus_per_node)
        self._cluster = cluster
        self._rails = max(1, min(n, cluster.gpus_per_node // axis_strides(plan)[axis])) if self.inter_node else 1
        self._coef: dict[Collective, tuple[float, float]] = {}  # (alpha s, seconds per byte of the full buffer)

    def _resolve(self, c: Collective) -> tuple[float, float]:
        n, cluster = self.size, self._cluster
        fit = (cluster.inter_node if self.inter_node else cluster.intra_node).fit(c, n)
        bw = fit.bandwidth_gbps
        if self.inter_node and c != Collective.p2p:
            bw = min(bw * self._rails, cluster.intra_node.fit(c, n).bandwidth_gbps)
        coef = self._coef[c] = (fit.latency_us * 1e-6, VOLUME_FACTOR[c](n) / (bw * 1e9))
        return coef

    def time(self, collective: Collective, nbytes: float) -> float:
        if self.size <= 1 or nbytes <= 0:
            return 0.0
        alpha, beta = self._coef.get(collective) or self._resolve(collective)
        return alpha + beta * nbytes


def axis_time(cluster: ClusterSpec, plan: Plan, axis: Axis, collective: Collective, nbytes: float) -> float:
    """Seconds for one collective of `nbytes` over a group of `axis`, on the tier it lands on."""
    return GroupLink(cluster, plan, axis).time(collective, nbytes)


def overlapped(total: float, edge: float, window: float) -> float:
    """Exposed time of communication `total` that runs beside compute `window`, except for a
    piece `edge` (the last gradient bucket, the first layer's gather) that cannot overlap."""
    edge = min(edge, total)
    return edge + max(0.0, total - edge - window)
