"""Step time of the pipeline schedules from per-stage forward+backward times.

Narayanan et al. 2021, sec. 2.2: with p stages of equal time t per micro-batch and m
micro-batches, GPipe and 1F1B take (m + p - 1) t, a bubble fraction (p - 1)/m; the
interleaved schedule with v model chunks per rank takes (m + (p - 1)/v) x (v t_chunk),
bubble (p - 1)/(v m). For unequal stages the steady state runs at the pace of the slowest
stage, and filling plus draining costs one pass through every other stage:
    T = sum_j S_j + (m - 1) max_j S_j.
With v model chunks per rank, the slowest rank (work W_r = the sum of its chunks) sets the
pace and the fill and drain pass through the other stages' chunks, 1/v of a rank's work each:
    T = (m - 1/v) max_r W_r + sum_j S_j / v,
which is the v = 1 formula at v = 1 and Narayanan's (m + (p - 1)/v) x (v t_chunk) for equal
stages. It matches a replay of Megatron-LM's interleaved order op by op (planner/pictures.py;
tests/unit/pictures/test_pictures.py), where a heavier last stage (the LM head) made the earlier form,
m max_r W_r + (p - 1) max_j S_j, charge the head p - 1 times (3% of the step of Llama 3 8B
on pp=8, v=2).

Chunks of unequal length (L // (p v) layers and one more, where p v does not divide L) break
that: Megatron's order runs the p micro-batches of one chunk round back to back on every rank,
the ranks' warm-ups differ, so a long chunk's forward meets a short one's backward at
different times on neighbouring ranks and they wait. On 400 random such schedules
(tests/unit/pictures/test_pictures.py) the replay took up to 28 % longer than the form above, and 8 % longer
than pacing each round by its slowest chunk. What holds for every one of them is the schedule
of equal chunks each as slow as the slowest,
    T = (m v + p - 1) max_j S_j,
an upper bound (a pass that takes longer never lets any pass end sooner) that is exact for
equal chunks and was up to 75 % above the replay (few micro-batches, half the
chunks one layer, the other two). Chunks of unequal length are priced so: a
plan never promises a step its schedule cannot keep, and such a split wins only where it wins
by that much (Llama 3.1 405B's 126 layers over 32 chunks: 4 layers each, 2 of them 3).
"""

from __future__ import annotations


def pipeline_time(
    stage_times: list[float], pp: int, num_micro_batches: int, vpp: int = 1, padded: bool = False
) -> float:
    """Time for `num_micro_batches` micro-batches through the pipeline.

    stage_times: forward+backward time of one micro-batch in each virtual stage (pp x vpp,
    pipeline order; virtual stage j runs on rank j % pp). padded: every chunk as slow as the
    slowest (chunks of unequal length; the module docstring).
    """
    m = num_micro_batches
    if padded:
        return (m * vpp + pp - 1) * max(stage_times)
    return (m - 1 / vpp) * max(rank_times(stage_times, pp)) + sum(stage_times) / vpp


def gpipe_time(stage_times: list[float], forward_times: list[float], num_micro_batches: int) -> float:
    """GPipe runs every forward, then every backward: two flows of identical jobs through the
    stages, each taking the sum of its stages plus (m - 1) passes of its own slowest stage,
        T = sum_j S_j + (m - 1) (max_j F_j + max_j B_j),
    which is the 1F1B form when one stage is slowest both ways, and longer when the slowest
    forward and the slowest backward are on different stages (a heavy LM head forward and
    fully recomputed layers' backward)."""
    backward = [s - f for s, f in zip(stage_times, forward_times)]
    return sum(stage_times) + (num_micro_batches - 1) * (max(forward_times) + max(backward))


def rank_times(stage_times: list[float], pp: int) -> list[float]:
    """Work of one micro-batch on each pipeline rank (sum of its virtual stages)."""
    return [sum(stage_times[r::pp]) for r in range(pp)]
