"""`plan profile`'s worker and the assembly of its measurements into a ClusterSpec.

Every rank measures compute in lockstep with the others (each repetition starts on all
ranks at once and counts as long as the slowest rank took, as a training step does), with
the thread count `plan run` uses, so that the numbers carry the contention of a real run;
then all ranks time collectives group by group, and a few blocks as `plan run` executes them
with TP and with ZeRO-3, for what each call costs beyond the fits (calls.py); rank 0 gathers
everything and returns it to the launcher, which writes a hardware profile in the schema of
the shipped presets plus the raw measurements (`measured`).
"""

from __future__ import annotations

import datetime
import os
import socket
import statistics
from dataclasses import dataclass
from typing import Callable, Optional

from torch.distributed.elastic.multiprocessing.errors import record

from planner.errors import PlannerError
from planner.profiler.calls import fit_call_overheads
from planner.specs import (
    REQUIRED_COLLECTIVES,
    ClusterSpec,
    CollectiveFit,
    DeviceSpec,
    DType,
    EfficiencyPoint,
    JobSpec,
    LayerMeasurement,
    LinkTier,
    MeasuredProfile,
    ModelSpec,
    ProfileEnvironment,
    tp_problem,
)


@dataclass(frozen=True)
class ProfileRequest:
    model: ModelSpec
    seq_len: int
    micro_batches: tuple
    quick: bool
    backend: str
    progress_path: Optional[str] = None
    model_factory: Optional[str] = None  # "package.module:function"
    blocks_attr: Optional[str] = None

    @property
    def reps(self) -> int:
        return 2 if self.quick else 5

    @property
    def layer_reps(self) -> int:
        """Repetitions per layer timing: layers are short (milliseconds on a CPU), and the
        median of more of them resists a neighbour's bursts of load."""
        return 5 if self.quick else 11

    @property
    def warmup(self) -> int:
        return 1 if self.quick else 2

    @property
    def matmul_sizes(self) -> list[int]:
        return [64, 128, 256, 512, 1024] + ([] if self.quick else [2048, 4096])

    @property
    def message_sizes(self) -> list[int]:
        exps = range(10, 25, 2) if self.quick else range(8, 27)
        return [2**e for e in exps]


def stack_tp(tps: list[int]) -> int:
    """The TP degree the collective-call stacks are timed at: the smallest above 1, or 1."""
    return min((t for t in tps if t > 1), default=1)


# Of one core's fp32 GEMM rate (planner/executor/duration.py:core_gemm_rates), what the
# profile's timed modules keep per rank, all ranks measuring at once: GPT-2 124M at 1,024
# tokens on 2 processes of a 2-core machine ran its blocks at 0.41, its LM head at 0.40 and
# its stacks of 4 blocks at 0.6 of that rate (a --quick run of 145 s, November 2026).
PROFILE_EFFICIENCY = 0.45
# What takes time without FLOPs, measured in the same run (seconds): starting the workers;
# the GEMM sweep, the copy, the collective sweeps and the overlap together.
START_S, MEASURE_S = 4.0, 4.0


def work_items(
    req: ProfileRequest, tps: list[int], world: int, nproc: int, flops_per_s: float, cores: int
) -> list[tuple[str, float]]:
    """(phase, estimated seconds) of every item profile_worker reports, in its order: the
    layers, then the matmul sweep, copy bandwidth, each collective size and overlap
    ('other'), then the stacks of blocks timed as plan run issues their collective calls."""
    from cost_models.compute import head_flops_forward, layer_flops_forward
    from planner.profiler.calls import STACK_LAYERS
    from planner.profiler.links import group_shapes, swept

    rate = flops_per_s * PROFILE_EFFICIENCY / max(1.0, nproc / cores)  # one rank's, ranks sharing cores
    runs = (
        3 * req.warmup + 4 * req.layer_reps + 2
    )  # forward-equivalents of measure_module: warm-up and timed (fwd, fwd+bwd), saved bytes, FLOPs
    m, s = req.model, req.seq_len
    layers: list[float] = []
    for b in req.micro_batches:
        shards = [1] if req.model_factory else tps
        layers += [runs * layer_flops_forward(m, b, s) / t / rate for t in shards] + [0.0] * (
            len(tps) - len(shards) + 1
        )
        layers.append(0.0 if req.model_factory else runs * head_flops_forward(m, b, s) / rate)
    links = sum(
        len(req.message_sizes) * len(swept(g, inter, world // nproc)) for g, inter in group_shapes(world, nproc)
    )
    stacks = 0.0
    if world > 1 and not req.model_factory:  # plain and ZeRO-3, then TP and its local twin: fwd + bwd each
        tp = stack_tp(tps)
        stack_runs = 2 + (2 / tp if tp > 1 else 0)
        stacks = (
            (req.warmup + req.layer_reps)
            * 3
            * STACK_LAYERS
            * layer_flops_forward(m, max(req.micro_batches), s)
            * stack_runs
            / rate
        )
    return (
        [("layers", x) for x in layers]
        + [("other", MEASURE_S / (links + 3))] * (links + 3)  # + matmul, copy, overlap
        + [("stacks", stacks)]
    )


def describe_work(items: list[tuple[str, float]], flops_per_s: float, fmt: Callable[[float], str]) -> str:
    """The estimate in words: the whole, and its phases."""
    phase = {name: sum(s for n, s in items if n == name) for name in ("layers", "other", "stacks")}
    total = START_S + sum(phase.values())
    stacks = f", blocks timed as plan run calls their collectives ~{fmt(phase['stacks'])}" if phase["stacks"] else ""
    return (
        f"about {fmt(total)} (an estimate from FLOPs at the {flops_per_s / 1e9:.0f} GFLOP/s one core multiplies here): "
        f"the layers ~{fmt(phase['layers'])}{stacks}, starting, GEMM sweep and collectives ~{fmt(START_S + phase['other'])}"
    )


class Progress:
    """Rank 0 appends 'done/total message' lines to a file the launcher renders: each item as
    it starts (done: the items before it), and the end."""

    def __init__(self, path: Optional[str], total: int, enabled: bool):
        self.path, self.total, self.done, self.enabled = path, total, 0, enabled

    def __call__(self, message: str) -> None:
        self._write(message)
        self.done += 1

    def skip(self, items: int) -> None:
        self.done += items

    def finish(self, message: str) -> None:
        self.done = self.total
        self._write(message)

    def _write(self, message: str) -> None:
        if not self.enabled:
            return
        line = f"{min(self.done, self.total)}/{self.total} {message}\n"
        if self.path:
            with open(self.path, "a") as f:
                f.write(line)
        else:
            import sys

            sys.stderr.write(line)


def _device_name(device) -> str:
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip() + " (one CPU process per rank)"
    except OSError:
        pass
    return "CPU (one process per rank)"


def _memory_and_overhead(device, nproc: int) -> tuple[float, float]:
    """(capacity GiB per rank, framework overhead GiB per rank)."""
    import torch

    gib = 2**30
    if device.type == "cuda":
        free, total_bytes = torch.cuda.mem_get_info(device)
        overhead = (total_bytes - free - torch.cuda.memory_allocated(device)) / gib
        return total_bytes / gib, max(overhead, 0.0)
    total = rss = 0.0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                total = float(line.split()[1]) * 1024
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = float(line.split()[1]) * 1024
    return total / nproc / gib, rss / gib


def _tp_shards(model: ModelSpec, nproc: int) -> list[int]:
    return [t for t in range(1, nproc + 1) if nproc % t == 0 and not tp_problem(model, t)]


@record
def profile_worker(req: ProfileRequest) -> Optional[dict]:
    import torch
    import torch.distributed as dist

    from planner.distributed.launch import init_process_group
    from planner.profiler import calls, compute, links

    import warnings

    # torch 2.13 prefers all_gather_single / reduce_scatter_single; the older names time the same kernels
    warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
    rank, world, device = init_process_group(req.backend)
    nproc = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if device.type == "cpu":
        torch.set_num_threads(1)  # as plan run's workers (planner/executor/train.py): one thread per rank
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    lockstep = compute.Lockstep(None, world > 1)
    dtype = DType.bf16 if device.type == "cuda" else DType.fp32
    capacity, overhead = _memory_and_overhead(device, nproc)
    tps = _tp_shards(req.model, nproc)
    progress = Progress(req.progress_path, len(work_items(req, tps, world, nproc, 1.0, 1)), rank == 0)

    timing = compute.Timing(req.warmup, req.layer_reps, sync, progress, lockstep)
    layers = _layers(req, dtype, device, tps, timing)
    progress("matmul sweep")
    matmul = compute.matmul_sweep(dtype, device, req.matmul_sizes, req.reps, sync, lockstep)
    progress("memory bandwidth")
    bandwidth = compute.copy_bandwidth(device, (64 if req.quick else 256) * 2**20, req.reps, sync, lockstep)
    tables = _kernel_tables(device, req.reps, sync, matmul) if device.type == "cuda" else {}
    dist.barrier()
    sweeps = links.sweep(rank, world, nproc, req.message_sizes, req.reps + 1, req.warmup, device, sync, progress)
    progress("communication/compute overlap")
    overlap = links.overlap_efficiency(rank, None, device, req.reps + 2, sync) if world > 1 else 1.0
    progress("collective calls as plan run issues them (a stack of blocks with TP and with ZeRO-3)")
    stacks = []
    if world > 1 and not req.model_factory:  # the executor shards the reference model's blocks only
        stacks = calls.time_stacks(req.model, device, max(req.micro_batches), req.seq_len, stack_tp(tps), timing)
    progress.finish("gathering the measurements")

    gathered: list = [None] * world
    dist.all_gather_object(gathered, (layers, matmul, bandwidth, capacity, overhead))
    dist.barrier()
    if rank != 0:
        dist.destroy_process_group()
        return None
    env = _environment(req, device, dtype, world, nproc)
    dist.destroy_process_group()
    return {"env": env, "per_rank": gathered, "sweeps": sweeps, "overlap": overlap, "stacks": stacks, "kernels": tables}


def _layers(req: ProfileRequest, dtype: DType, device, tps: list[int], timing) -> list[LayerMeasurement]:
    """The layers measured: the user's blocks (--model-factory), or the reference model's."""
    from planner.profiler import compute

    if req.model_factory:
        micro = list(req.micro_batches)
        layers = compute.profile_factory_blocks(
            req.model_factory, req.blocks_attr or "layers", req.model, dtype, device, micro, req.seq_len, timing
        )
        timing.progress.skip(len(req.micro_batches) * (len(tps) + 1))  # the reference model's other layers
        return layers
    return compute.profile_layers(req.model, dtype, device, list(req.micro_batches), req.seq_len, tps, timing)


def _kernel_tables(device, reps: int, sync, matmul) -> dict:
    """The presets' kernel tables, measured on a GPU (planner/profiler/kernels.py)."""
    import torch

    from planner.profiler import kernels

    peak = known_peak(known_cluster(_device_name(device)), max(p.tflops for p in matmul))
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return kernels.device_tables(
        torch, device, torch.bfloat16, reps, sync, [(p.flops, p.seconds) for p in matmul], peak, sms
    )


def _environment(req: ProfileRequest, device, dtype: DType, world: int, nproc: int) -> ProfileEnvironment:
    """Where and how the profile was measured."""
    import torch
    import torch.distributed as dist

    return ProfileEnvironment(
        torch_version=torch.__version__,
        backend=dist.get_backend(),
        device_type=device.type,
        device_name=_device_name(device),
        dtype=dtype,
        world_size=world,
        nproc_per_node=nproc,
        nnodes=world // nproc,
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        hostname=socket.gethostname(),
        quick=req.quick,
    )


def _median_layers(per_rank: list[list[LayerMeasurement]]) -> list[LayerMeasurement]:
    """The median over ranks of each measurement (ranks measured the same shapes in order)."""
    out = []
    for ms in zip(*per_rank):
        first = ms[0]
        out.append(
            first.model_copy(
                update={
                    "forward_s": statistics.median(m.forward_s for m in ms),
                    "backward_s": statistics.median(m.backward_s for m in ms),
                }
            )
        )
    return out


# The shipped preset of each known part, first match by name ("GB200" before "B200" and "GB300"
# before "B300", which they contain): its datasheet peak is the profile's (known_peak), and a
# measured profile keeps its fitted sustained fraction (what a training loop keeps of the
# microbenchmarks: benchmarks/fidelity_published.py).
KNOWN_PRESETS = {
    "A100": "dgx-a100-80gb",
    "H100": "dgx-h100-80gb",
    "H200": "dgx-h200",
    "GB300": "gb300-nvl72",
    "B300": "dgx-b300",
    "GB200": "gb200-nvl72",
    "B200": "dgx-b200",
    "MI300X": "mi300x",
    "MI325X": "mi325x",
    "MI355X": "mi355x",
}


def known_peak(known: Optional[ClusterSpec], measured_tflops: float) -> float:
    """The datasheet dense bf16 peak of a known GPU (its preset's, `known`: known_cluster); CPUs
    and unknown devices use the best GEMM throughput measured, so efficiencies are relative to
    what the device demonstrably does."""
    return known.device.peak_tflops[DType.bf16] if known is not None else measured_tflops


def known_cluster(device_name: str) -> Optional[ClusterSpec]:
    """The shipped preset of a known GPU (KNOWN_PRESETS), loaded, else None."""
    preset = known_preset(device_name)
    if preset is None:
        return None
    from hardware_profiles import load_cluster

    return load_cluster(preset)


def known_preset(device_name: str) -> Optional[str]:
    """The shipped preset of a known GPU (KNOWN_PRESETS), else None."""
    return next((v for k, v in KNOWN_PRESETS.items() if k in device_name), None)


# A cross-host tier at least this share of the in-host bandwidth is the same fabric: the hosts
# share a scale-up domain (GB200 / GB300 NVL72 trays on one NVLink Switch fabric). No network tier
# comes near: the presets' NICs reach 45-90 GB/s of bus bandwidth against NVLink's 360-720 (at
# most 0.125 of it), so 0.5 tells the two apart with room either side.
DOMAIN_SHARE = 0.5


def shared_domain_share(sweeps) -> Optional[float]:
    """The median over collectives of cross-host over in-host bus bandwidth (each at its largest
    measured group), or None where either side was not measured."""

    def widest(inter: bool) -> dict:
        out: dict = {}
        for s in sweeps:
            if s.inter_node == inter and (s.collective not in out or s.group_size > out[s.collective].group_size):
                out[s.collective] = s
        return out

    inside, across = widest(False), widest(True)
    # the ring collectives and p2p (the all-to-all across hosts is timed over one rank per host only)
    shares = [
        across[c].bandwidth_gbps / inside[c].bandwidth_gbps for c in REQUIRED_COLLECTIVES if c in inside and c in across
    ]
    return statistics.median(shares) if shares else None


def _domain_network(
    env: ProfileEnvironment, inter: LinkTier, share: float, gpus: int, known: Optional[ClusterSpec]
) -> tuple[LinkTier, str]:
    """(the network tier, what the source says) of a profile whose hosts all share one NVLink
    domain of `gpus`: the domain is every measured GPU (at least: hosts beyond those measured
    may share it too), its fabric the in-host fits; the network beyond it was not measured, so
    the known part's preset tier (`known`: known_cluster) stands in."""
    note = (
        f" Hosts share a scale-up domain: collectives across the {env.nnodes} hosts ran at {share:.2f} of the in-host bus "
        f"bandwidth (median over collectives; at least {DOMAIN_SHARE} means the same fabric), so scaleup_domain_gpus is "
        f"{gpus}, every GPU measured (the domain may be larger)."
    )
    if known is not None:
        network = known.inter_node
        note += f" The network beyond the domain was not measured: the {known.name} preset's tier ({network.name}) stands in."
    else:
        network = inter.model_copy(
            update={"name": f"{inter.name}; the domain's fabric: the network beyond it was not measured"}
        )
        note += " The network beyond the domain was not measured and no preset is known for this part: its tier is the domain's."
    return network, note


def assemble(result: dict, name: str, model: ModelSpec) -> ClusterSpec:
    env: ProfileEnvironment = result["env"]
    per_rank = result["per_rank"]
    layers = _median_layers([r[0] for r in per_rank])
    matmul = per_rank[0][1]
    bandwidth = statistics.median(r[2] for r in per_rank)
    capacity = min(r[3] for r in per_rank)
    overhead = statistics.median(r[4] for r in per_rank)
    known = known_cluster(env.device_name) if env.device_type == "cuda" else None  # its preset, read once
    peak = known_peak(known, max(p.tflops for p in matmul))
    curve = [EfficiencyPoint(gemm_flops=p.flops, efficiency=min(1.0, p.tflops / peak)) for p in matmul]
    if overhead >= capacity:  # a DeviceSpec refuses it: said of the run, not as a validation error
        raise PlannerError(
            f"each of the {env.nproc_per_node} ranks per node has {capacity:.2f} GiB of memory (its share), not more "
            f"than the {overhead:.2f} GiB its framework alone takes; profile with fewer ranks per node"
        )
    device = DeviceSpec(
        name=env.device_name,
        peak_tflops={env.dtype: peak},
        memory_gib=capacity,
        memory_bandwidth_gbps=bandwidth,
        memory_bandwidth_efficiency=1.0,
        matmul_efficiency=curve,
        framework_overhead_gib=overhead,
    )
    if result.get("kernels"):  # a GPU: GEMMs by shape, fused attention, launch gap, as the presets
        sustained = known.device.sustained_fraction if known is not None else 1.0
        device = device.model_copy(update={**result["kernels"], "sustained_fraction": sustained})
    sweeps = result["sweeps"]
    intra, inter = _link_tiers(sweeps, env.backend)
    domain, note = None, ""
    share = shared_domain_share(sweeps)
    if env.device_type == "cuda" and env.nnodes > 1 and share is not None and share >= DOMAIN_SHARE:
        domain = env.nproc_per_node * env.nnodes
        inter, note = _domain_network(env, inter, share, domain, known)
    cluster = ClusterSpec(
        name=name,
        device=device,
        gpus_per_node=env.nproc_per_node,
        num_nodes=env.nnodes,
        intra_node=intra,
        inter_node=inter,
        overlap_efficiency=result.get("overlap", 1.0),
        scaleup_domain_gpus=domain,
        source=f"measured by `plan profile` on {env.hostname}, {env.date}, torch {env.torch_version}, {env.backend}"
        + note,
        measured=MeasuredProfile(
            environment=env,
            model=model,
            layers=layers,
            matmul=matmul,
            memory_bandwidth_gbps=bandwidth,
            collectives=sweeps,
        ),
    )
    stacks = result.get("stacks", [])
    if not stacks:
        return cluster
    job = JobSpec(global_batch_size=1, seq_len=stacks[0].seq_len, precision=env.dtype)
    return fit_call_overheads(cluster, model, job, stacks)


def _link_tiers(sweeps: list, backend: str) -> tuple[LinkTier, LinkTier]:
    """The intra- and inter-node link tiers the sweeps fit (a tier not measured takes the
    other's fits; a single rank measures neither)."""

    def tier(inter: bool, label: str) -> Optional[LinkTier]:
        fits = [
            CollectiveFit(
                collective=s.collective,
                group_size=s.group_size,
                latency_us=s.latency_us,
                bandwidth_gbps=s.bandwidth_gbps,
            )
            for s in sweeps
            if s.inter_node == inter
        ]
        missing = set(REQUIRED_COLLECTIVES) - {f.collective for f in fits}
        if not fits or missing:
            return None
        return LinkTier(name=label, collectives=fits)

    intra = tier(False, f"measured inside a node ({backend})")
    inter = tier(True, f"measured across nodes ({backend})")
    if intra is None and inter is None:  # a single rank: nothing to time
        intra = LinkTier(
            name="not measured (one rank)",
            collectives=[CollectiveFit(collective=c, latency_us=0.0, bandwidth_gbps=1e6) for c in REQUIRED_COLLECTIVES],
        )
    if inter is None:
        assert intra is not None  # set above where both were None
        inter = intra.model_copy(update={"name": "not measured (single node): the intra-node fits"})
    if intra is None:
        intra = inter.model_copy(update={"name": "not measured (one rank per node): the inter-node fits"})
    return intra, inter
