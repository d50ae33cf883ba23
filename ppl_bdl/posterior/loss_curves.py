"""The loss-curve checks of VI and ensembles (:mod:`ppl_bdl.posterior.diagnostics` turns them into
findings): on windows of 10% of the steps, did the loss end far above its running minimum, does
it still fall?

Example
-------
>>> import numpy as np
>>> from ppl_bdl.posterior.loss_curves import loss_curve_checks
>>> sorted(loss_curve_checks(np.linspace(100.0, 0.0, 200)))
['not_flat']
>>> loss_curve_checks(np.full(200, 5.0))
{}
"""

from __future__ import annotations

import numpy as np

#: VI: the loss "has not flattened" when over the last 10% of the steps it fell (the mean of the
#: last 10% against the mean of the 10% before them) by more than this fraction of its whole fall
#: so far (the smoothed loss's first value minus its minimum; the 1% of ADVI's relative-change
#: stopping rule, Kucukelbir et al. 2017, Section 3.5, made independent of the loss's arbitrary
#: offset), and by more than 3 standard errors of the loss's noise.
VI_RELATIVE_CHANGE = 0.01
#: VI: the loss "ended far above its running minimum" when the mean of its last 10% of steps is
#: above the lowest mean of any such window by more than this many standard errors of a window
#: mean (and by more than 0.1% of the minimum's size).
VI_ABOVE_MINIMUM_SE = 5.0


def loss_curve_checks(losses) -> dict[str, tuple[float, float]]:
    """The loss curve's two checks, on windows of 10% of the steps: the loss ended far above its
    running minimum ("above_minimum"), or it still falls ("not_flat"; see the thresholds above).
    Only the failed checks are returned, each as (value, threshold)."""
    n = losses.size
    window = max(10, n // 10)
    tail = losses[-window:]
    # The noise of one step's loss around the tail's trend; a window mean has it / sqrt(window).
    steps = np.arange(window)
    residual = tail - np.polyval(np.polyfit(steps, tail, 1), steps)
    noise = float(residual.std())
    smoothed = np.convolve(losses, np.ones(window) / window, mode="valid")
    lowest, fall = float(smoothed.min()), float(smoothed[0] - smoothed.min())
    checks = {}
    above = float(smoothed[-1] - lowest)
    limit = max(VI_ABOVE_MINIMUM_SE * noise / np.sqrt(window), 1e-3 * abs(lowest))
    if above > limit:
        checks["above_minimum"] = (above, limit)
    before = losses[-2 * window : -window]
    decrease = float(before.mean() - tail.mean()) if before.size == window else 0.0
    change = decrease / fall if fall > 0 else 0.0
    if change > VI_RELATIVE_CHANGE and decrease > 3 * noise * np.sqrt(2.0 / window):
        checks["not_flat"] = (change, VI_RELATIVE_CHANGE)
    return checks


#: What to try when a loss curve fails a check, by check.
CURVE_ADVICE = {
    "above_minimum": "the loss rose after its minimum; lower lr or use schedule='cosine'",
    "not_flat": "the fit has not converged; run more num_steps (or a larger lr)",
}
