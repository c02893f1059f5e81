"""Step time of the pipeline schedules from per-stage forward+backward times.

Narayanan et al. 2021, sec. 2.2: with p stages of equal time t per micro-batch and m
micro-batches, GPipe and 1F1B take (m + p - 1) t, a bubble fraction (p - 1)/m; the
interleaved schedule with v model chunks per rank takes (m + (p - 1)/v) x (v t_chunk),
bubble (p - 1)/(v m). For unequal stages the steady state runs at the pace of the slowest
stage, and filling plus draining costs one pass through every other stage:
    T = sum_j S_j + (m - 1) max_j S_j.
"""

from __future__ import annotations


def pipeline_time(stage_times: list[float], pp: int, num_micro_batches: int, vpp: int = 1) -> float:
    """Time for `num_micro_batches` micro-batches through the pipeline.

    stage_times: forward+backward time of one micro-batch in each virtual stage (pp x vpp,
    pipeline order; virtual stage j runs on rank j % pp).
    """
    m = num_micro_batches
    if vpp == 1:
        return sum(stage_times) + (m - 1) * max(stage_times)
    rank_times = [sum(stage_times[r::pp]) for r in range(pp)]
    return m * max(rank_times) + (pp - 1) * max(stage_times)


def rank_times(stage_times: list[float], pp: int) -> list[float]:
    """Work of one micro-batch on each pipeline rank (sum of its virtual stages)."""
    return [sum(stage_times[r::pp]) for r in range(pp)]
