"""Link measurements: collectives timed over message sizes for every group shape the
solver uses, each fitted to the alpha-beta model of cost_models.communication.

Timing: every member of a group synchronises (barrier), runs the collective several
times back to back (as a training step does; up to 64 calls for small messages, so that
scheduler noise averages out), and the per-call time of the slowest rank, median over
repetitions, is the point (all-reduce MAX over the group). The
fit minimises relative error (weights 1/t^2), because sizes span six orders of magnitude:
    t(bytes) = alpha + k(n) bytes / B,   k = 2(n-1)/n all-reduce, (n-1)/n gather/scatter and
    all-to-all, 1 p2p.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Optional

import torch
import torch.distributed as dist

from cost_models.communication import VOLUME_FACTOR
from planner.specs import Collective, CollectiveSweep, TimedPoint


def fit_alpha_beta(
    collective: Collective, group_size: int, points: list[tuple[int, float]]
) -> tuple[float, float, float]:
    """(alpha seconds, bus bandwidth GB/s, max relative error) of a weighted least-squares fit."""
    k = VOLUME_FACTOR[collective](group_size)
    xs = [k * b for b, _ in points]
    ts = [t for _, t in points]
    ws = [1.0 / (t * t) for t in ts]
    sw = sum(ws)
    sx = sum(w * x for w, x in zip(ws, xs))
    sy = sum(w * t for w, t in zip(ws, ts))
    sxx = sum(w * x * x for w, x in zip(ws, xs))
    sxy = sum(w * x * t for w, x, t in zip(ws, xs, ts))
    det = sw * sxx - sx * sx
    beta = (sw * sxy - sx * sy) / det if det else 0.0
    alpha = (sy - beta * sx) / sw
    if beta <= 0:  # flat curve: pure latency; bandwidth from the largest point
        beta = max(ts) / max(xs)
        alpha = min(ts)
    if alpha < 0:  # refit the slope through the origin
        alpha = 0.0
        beta = sum(w * x * t for w, x, t in zip(ws, xs, ts)) / sxx
    err = max(abs(alpha + beta * x - t) / t for x, t in zip(xs, ts))
    return alpha, 1.0 / beta / 1e9, err


def _run(collective: Collective, group, members: list[int], rank: int, numel: int, dtype, device, per_host: int = 1):
    """A closure running one call of `collective` for this rank in `group` (`per_host`: how many of
    the members share a host, for the point-to-point pairs)."""
    n = len(members)
    if collective == Collective.all_reduce:
        buf = torch.ones(numel, dtype=dtype, device=device)
        return lambda: dist.all_reduce(buf, group=group)
    if collective == Collective.all_gather:
        shard = torch.ones(numel // n, dtype=dtype, device=device)
        full = torch.empty(shard.numel() * n, dtype=dtype, device=device)
        return lambda: dist.all_gather_into_tensor(full, shard, group=group)
    if collective == Collective.reduce_scatter:
        full = torch.ones((numel // n) * n, dtype=dtype, device=device)
        shard = torch.empty(numel // n, dtype=dtype, device=device)
        return lambda: dist.reduce_scatter_tensor(shard, full, group=group)
    if collective == Collective.all_to_all:  # a distinct piece to every member, as a MoE dispatch sends
        inp = torch.ones((numel // n) * n, dtype=dtype, device=device)
        out = torch.empty_like(inp)
        return lambda: dist.all_to_all_single(out, inp, group=group)
    # point-to-point, as pipeline stages send: every pair at once
    buf = torch.ones(numel, dtype=dtype, device=device)
    pair = p2p_peer(members, rank, per_host)
    if pair is None:  # the odd one out
        return lambda: None
    peer, sends = pair
    if sends:
        return lambda: dist.send(buf, peer, group=group)
    return lambda: dist.recv(buf, peer, group=group)


def p2p_peer(members: list[int], rank: int, per_host: int = 1) -> Optional[tuple[int, bool]]:
    """(peer, whether this rank sends) in the point-to-point sweep over `members`, or None where it
    sits out. The members come in blocks of `per_host` (one host's share of the group, in rank
    order; 1 inside a host), and blocks pair up 0 with 1, 2 with 3, member by member: across
    hosts every pair then spans two hosts (pairing neighbouring ranks would time the link
    inside a host instead). With an odd number of blocks the last sits out."""
    i = members.index(rank)
    block = i // per_host
    if block % 2:
        return members[i - per_host], False
    if (block + 1) * per_host < len(members):
        return members[i + per_host], True
    return None


def time_collective(
    collective: Collective,
    group,
    members: list[int],
    rank: int,
    nbytes: int,
    reps: int,
    warmup: int,
    device: torch.device,
    sync: Callable[[], None],
    per_host: int = 1,
) -> float:
    """Median over reps of the slowest member's time for one call (members only)."""
    dtype = torch.float32
    numel = max(len(members), nbytes // 4)
    fn = _run(collective, group, members, rank, numel, dtype, device, per_host)
    for _ in range(warmup):
        fn()
    sync()
    calls = max(1, min(64, 2**20 // max(nbytes, 1)))
    times = []
    for _ in range(reps):
        dist.barrier(group=group)
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        times.append((time.perf_counter() - t) / calls)
    local = torch.tensor([statistics.median(times)], dtype=torch.float64, device=device)
    dist.all_reduce(local, op=dist.ReduceOp.MAX, group=group)
    return float(local.item())


def group_shapes(world: int, nproc_per_node: int) -> list[tuple[list[int], bool]]:
    """(ranks, spans nodes) for every group size the solver can form: inside a node, k
    consecutive ranks for each k | nproc_per_node; across nodes, one rank per node and, when
    there is room, the whole world."""
    shapes = []
    for k in range(2, nproc_per_node + 1):
        if nproc_per_node % k == 0:
            shapes.append((list(range(k)), False))
    nnodes = world // nproc_per_node
    if nnodes > 1:
        shapes.append(([i * nproc_per_node for i in range(nnodes)], True))
        if nproc_per_node > 1:
            shapes.append((list(range(world)), True))
    return shapes


def swept(members: list[int], inter: bool, nnodes: int) -> list[Collective]:
    """The collectives timed over one group shape: all of them (point-to-point over the pairs
    p2p_peer forms), but the all-to-all across nodes over one rank per node only, so that its bus
    bandwidth is what a rank's traffic to other nodes gets (cost_models/tables.py:all_to_all_time)."""
    return [c for c in Collective if not (c == Collective.all_to_all and inter and len(members) != nnodes)]


def sweep(
    rank: int,
    world: int,
    nproc_per_node: int,
    sizes: list[int],
    reps: int,
    warmup: int,
    device: torch.device,
    sync: Callable[[], None],
    progress: Callable[[str], None] = lambda s: None,
) -> list[CollectiveSweep]:
    """Every collective over every group shape; every rank must call this (groups are
    created collectively). Returns the fits on rank 0, [] elsewhere."""
    results = []
    nnodes = world // nproc_per_node
    for members, inter in group_shapes(world, nproc_per_node):
        group = dist.new_group(members)
        for collective in swept(members, inter, nnodes):
            points = []
            for nbytes in sizes:
                progress(f"{collective.value} x{len(members)}{' across nodes' if inter else ''} {nbytes} B")
                if rank in members:
                    t = time_collective(
                        collective,
                        group,
                        members,
                        rank,
                        nbytes,
                        reps,
                        warmup,
                        device,
                        sync,
                        len(members) // nnodes if inter else 1,
                    )
                else:
                    t = 0.0
                points.append((nbytes, t))
            dist.barrier()
            if rank == 0:
                alpha, bw, err = fit_alpha_beta(collective, len(members), points)
                results.append(
                    CollectiveSweep(
                        collective=collective,
                        group_size=len(members),
                        inter_node=inter,
                        points=[TimedPoint(nbytes=b, seconds=s) for b, s in points],
                        latency_us=alpha * 1e6,
                        bandwidth_gbps=bw,
                        max_relative_error=err,
                    )
                )
    return results


def overlap_efficiency(rank: int, group, device: torch.device, reps: int, sync: Callable[[], None]) -> float:
    """How much of a collective hides behind compute on this machine: time an all-reduce
    alone (t_m), a GEMM loop sized to take about as long alone (t_c), and both at once (the
    collective issued asynchronously, as DDP and FSDP issue theirs): efficiency =
    (t_c + t_m - t_both) / min(t_c, t_m), clipped to [0, 1], median over ranks."""
    buf = torch.ones(2**21, dtype=torch.float32, device=device)  # 8 MiB
    a = torch.randn(256, 256, device=device)

    def median_time(fn) -> float:
        fn()
        sync()
        times = []
        for _ in range(reps):
            dist.barrier(group=group)
            t = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - t)
        return statistics.median(times)

    t_m = median_time(lambda: dist.all_reduce(buf, group=group))
    t_one = median_time(lambda: a @ a)
    calls = max(1, int(t_m / max(t_one, 1e-9)))

    def compute():
        for _ in range(calls):
            a @ a

    t_c = median_time(compute)

    def both():
        work = dist.all_reduce(buf, group=group, async_op=True)
        compute()
        work.wait()

    t_both = median_time(both)
    eta = (t_c + t_m - t_both) / min(t_c, t_m)
    values: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(values, max(0.0, min(1.0, eta)), group=group)
    return statistics.median(values)
