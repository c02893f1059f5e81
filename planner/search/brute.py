"""Brute-force enumeration of the whole search space: the reference the ILP search is
tested against, and the same-run baseline of benchmarks/solve_scaling.py.

Every candidate, dominated ones included (all six mesh orders, GPipe, ZeRO stages over
one-rank shard groups, which shard nothing), every split of the layers into stages and every
per-stage count of layers under each recompute mode, each evaluated by
cost_models.estimate.evaluate. Exponential: for small instances only.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Iterator, Optional

from cost_models.estimate import evaluate
from cost_models.terms import MODES
from planner.specs import ClusterSpec, JobSpec, ModelSpec
from planner.specs import memory_limit_gib as memory_limit_gib_of

from planner.specs import Layout

from .candidates import CostTables, SearchSpace, candidate_modes, enumerate_candidates


def compositions(total: int, parts: int) -> Iterator[tuple[int, ...]]:
    """Ordered splits of `total` into `parts` positive integers."""
    for cuts in itertools.combinations(range(1, total), parts - 1):
        bounds = (0, *cuts, total)
        yield tuple(bounds[i + 1] - bounds[i] for i in range(parts))


def mode_splits(n: int, modes: tuple = MODES) -> list[tuple[int, int, int]]:
    """Every (none, selective, full) split of n layers that uses only `modes`."""
    splits = [(a, b, n - a - b) for a in range(n + 1) for b in range(n + 1 - a)]
    return [x for x in splits if all(x[i] == 0 or MODES[i] in modes for i in range(3))]


@dataclass
class BruteResult:
    value: Optional[float]  # best seconds per token, None if nothing fits
    candidate: Optional[Layout]
    counts: Optional[tuple]
    evaluated: int
    seconds: float


def balanced_chunks(layers: int, chunks: int) -> list[tuple]:
    """Every split of `layers` over interleaved model chunks of layers // chunks or one more
    (planner/search/ilp.py:_layer_split's domain): which chunks take the extra layers."""
    n, extra = divmod(layers, chunks)
    return [
        tuple(n + (j in more) for j in range(chunks)) for more in map(set, itertools.combinations(range(chunks), extra))
    ]


def brute_force(
    model: ModelSpec,
    cluster: ClusterSpec,
    job: JobSpec,
    space: SearchSpace,
    memory_limit_gib: Optional[float] = None,
    deadline_s: Optional[float] = None,
) -> BruteResult:
    start = time.perf_counter()
    limit = memory_limit_gib_of(cluster, memory_limit_gib)
    full = SearchSpace(**{**space.__dict__, "include_dominated": True})
    cands, _ = enumerate_candidates(model, cluster, full)
    tables = CostTables(model, cluster, job)
    best: tuple[Optional[float], Optional[Layout], Optional[tuple]] = (None, None, None)  # (value, layout, counts)
    evaluated = 0
    for c in cands:
        pc = tables.pipeline(c)
        P = c.pp * c.vpp
        splits = compositions(model.num_layers, P) if c.vpp == 1 else balanced_chunks(model.num_layers, P)
        for split in splits:
            if split[0] < model.first_dense_layers:
                continue  # the first stage must hold the dense layers
            for counts in itertools.product(*(mode_splits(n, candidate_modes(space, c)) for n in split)):
                if space.rules is not None and space.rules.counts_problems(counts):
                    continue  # the target stack cannot run this split / recompute
                evaluated += 1
                est = evaluate(pc, list(counts))
                if est.peak_memory_gib > limit:
                    continue
                value = 1.0 / est.tokens_per_s
                if best[0] is None or value < best[0]:
                    best = (value, c, counts)
                if deadline_s is not None and time.perf_counter() - start > deadline_s:
                    return BruteResult(None, None, None, evaluated, time.perf_counter() - start)
    return BruteResult(best[0], best[1], best[2], evaluated, time.perf_counter() - start)
