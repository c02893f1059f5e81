"""The single-process reference and the comparison a distributed run must pass.

The reference builds the same model from the same seed, takes the whole global batch of
every step at once (the synthetic data of planner.distributed.reference_model, same seed), and
minimises the mean loss over it with the same Adam. A correct layout computes the same
function: micro-batch losses are averaged (gradient accumulation scales each by 1/m, the
pipeline schedules average gradients over micro-batches) and data-parallel gradients are
averaged over replicas, so every step's loss and gradient norm must agree up to the order
of floating-point reductions. In fp32 that is ~1e-7 relative; after a few Adam steps the
default tolerance of 1e-5 leaves room for the order to differ, not for a wrong gradient.
The gradient norm is the global 2-norm over all parameters, before the optimizer step,
accumulated in float64 on both sides.
"""

from __future__ import annotations

import math

from planner.executor.prepare import RunCase
from planner.specs import Verification

DEFAULT_TOLERANCE = 1e-5  # fp32; see the module docstring
# Rounding differences compound as training goes on: each step's parameters inherit the
# previous steps' differences, which Adam's normalised updates carry forward rather than damp.
# The tolerance at step i is tolerance x (1 + i / STEPS_PER_TOLERANCE): the stated tolerance over
# the first steps, where a wrong gradient shows at once, twice it by step 10, 30x by step 290.
STEPS_PER_TOLERANCE = 10


def step_tolerance(tolerance: float, step: int) -> float:
    """The relative difference allowed at `step` (0-based)."""
    return tolerance * (1 + step / STEPS_PER_TOLERANCE)


def reference_run(case: RunCase) -> tuple[list[float], list[float]]:
    """(loss, gradient norm) of every step on one process."""
    import torch

    from planner.distributed.reference_model import build_model, lm_loss, synthetic_batch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a rehearsal-sized model; matches the workers' arithmetic
    try:
        model = build_model(case.model, seed=case.seed, tie=case.tie)
        optimizer = torch.optim.Adam(model.parameters(), lr=case.learning_rate)
        losses, norms = [], []
        for step in range(case.steps):
            tokens, targets = synthetic_batch(case.model, case.job.global_batch_size, case.job.seq_len, case.seed, step)
            loss = lm_loss(model(tokens), targets)
            loss.backward()
            sq = sum(p.grad.detach().double().pow(2).sum() for p in model.parameters() if p.grad is not None)
            losses.append(loss.item())
            norms.append(math.sqrt(float(sq)))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return losses, norms
    finally:
        torch.set_num_threads(threads)


def relative_error(value: float, reference: float) -> float:
    if value == reference:
        return 0.0
    return abs(value - reference) / max(abs(reference), 1e-30)


def compare(
    losses: list[float], norms: list[float], ref_losses: list[float], ref_norms: list[float], tolerance: float
) -> Verification:
    """Pass when every step's loss and gradient norm is within `tolerance` (relative)."""
    loss_err = [relative_error(a, b) for a, b in zip(losses, ref_losses)]
    norm_err = [relative_error(a, b) for a, b in zip(norms, ref_norms)]
    bad = [(i, "loss", losses[i], ref_losses[i], e) for i, e in enumerate(loss_err) if not e <= step_tolerance(tolerance, i)]
    bad += [(i, "gradient norm", norms[i], ref_norms[i], e) for i, e in enumerate(norm_err) if not e <= step_tolerance(tolerance, i)]
    complete = len(losses) == len(ref_losses) and len(norms) == len(ref_norms)
    passed = complete and not bad
    if not complete:
        message = f"the run reported {len(losses)} steps, the reference {len(ref_losses)}"
    elif bad:
        i, what, got, ref, err = min(bad)
        message = (f"step {i}: {what} {got:.8g} against the reference's {ref:.8g} (relative {err:.1e} > {step_tolerance(tolerance, i):.2g}, "
                   f"the tolerance {tolerance:g} grown by 1 + step/{STEPS_PER_TOLERANCE})")
    else:
        message = (
            f"all {len(losses)} steps match the single-process reference: loss within {max(loss_err):.1e}, "
            f"gradient norm within {max(norm_err):.1e} (tolerance {tolerance:g}, x (1 + step/{STEPS_PER_TOLERANCE}))"
        )
    return Verification(
        passed=passed, tolerance=tolerance, losses=losses, reference_losses=ref_losses, grad_norms=norms,
        reference_grad_norms=ref_norms, max_loss_rel_error=max(loss_err, default=0.0),
        max_grad_norm_rel_error=max(norm_err, default=0.0), message=message,
    )
