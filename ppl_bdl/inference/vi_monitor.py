"""Watching a VI run's loss: the best state so far, and a loss that diverges.

The run goes in segments of steps (one call of the compiled loop each; see
:func:`segment_length`). After each segment the monitor takes the segment's mean loss as the
smoothed loss (a windowed mean: Adam's loss curve is too noisy step by step). It keeps a host
copy of the parameters at the end of the segment with the lowest smoothed loss, which is what
the fit returns; and it calls the run diverging when, for :data:`PATIENCE` segments in a row,
the smoothed loss stays above its best by more than half of everything the run had gained
(the first segment's mean minus the best) and by more than :data:`DIVERGENCE_SE` standard errors
of the best segment's mean. A loss that rises but stays finite (a too-large learning rate on a
flow, say) then stops the run at once, where it would otherwise be reported at its diverged end.

Example
-------
>>> import numpy as np
>>> monitor = LossMonitor()
>>> rng = np.random.default_rng(0)
>>> for start, level in [(0, 100.0), (100, 50.0), (200, 20.0), (300, 80.0), (400, 90.0)]:
...     verdict = monitor.update(start + 100, level + rng.normal(size=100), lambda: {"x": level})
>>> verdict, monitor.best_step, monitor.best_params
('diverging', 300, {'x': 20.0})
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

#: Segments in a row above the divergence threshold before the run is stopped.
PATIENCE = 2
#: The divergence threshold's floor, in standard errors of the best segment's mean loss.
DIVERGENCE_SE = 5.0
#: The threshold's main part: this fraction of what the run had gained (first mean - best).
DIVERGENCE_FRACTION = 0.5
#: ``num_steps=None``: run until the loss has converged (:meth:`LossMonitor.converged`), at
#: least AUTO_MIN_STEPS steps and at most AUTO_MAX_STEPS.
AUTO_MIN_STEPS, AUTO_MAX_STEPS = 2_000, 50_000
#: Converged: over the last quarter of the steps run, the best smoothed loss improved by less
#: than this fraction of everything the run gained (the first segment's mean minus the best).
CONVERGED_FRACTION = 0.003
#: A VI run is watched in about this many segments (each one call of the compiled loop).
SEGMENTS = 20
#: The shortest and longest segment: one call costs the host a read-back, which a toy model's
#: steps (tens of microseconds) must outweigh.
MIN_SEGMENT, MAX_SEGMENT = 100, 1000


def segment_length(num_steps: int, chunk_size: int | None = None) -> int:
    """Steps per segment: ``chunk_size`` if given, else about ``num_steps / SEGMENTS`` within
    [MIN_SEGMENT, MAX_SEGMENT] (and never more than ``num_steps``).

    Example
    -------
    >>> segment_length(1000), segment_length(50_000), segment_length(30)
    (100, 1000, 30)
    """
    if chunk_size is not None:
        return min(chunk_size, num_steps)
    length = min(max(math.ceil(num_steps / SEGMENTS), MIN_SEGMENT), MAX_SEGMENT)
    return min(length, num_steps)


class LossMonitor:
    """The best smoothed loss, the step and parameters where it was reached, and divergence."""

    def __init__(self):
        self.first: float | None = None
        self.best = math.inf
        self.best_se = 0.0
        self.best_step = 0
        self.best_params: dict | None = None
        self._above = 0
        self._history: list[tuple[int, float]] = []

    def converged(self) -> bool:
        """Whether the best smoothed loss has stopped improving (see CONVERGED_FRACTION)."""
        if len(self._history) < 4:
            return False
        step, best = self._history[-1]
        earlier = [b for s, b in self._history if s <= 0.75 * step]
        if not earlier:
            return False
        gained = max(self.first - best, 0.0)
        return earlier[-1] - best <= CONVERGED_FRACTION * gained

    def update(self, step: int, losses: np.ndarray, params: Callable[[], dict]) -> str | None:
        """Take the losses of the segment that ended at ``step``; ``params()`` gives a host copy
        of the parameters there (called only when they are the best so far). Returns
        "diverging" or None."""
        losses = np.asarray(losses, dtype=float)
        if losses.size == 0:
            return None
        mean = float(losses.mean())
        if self.first is None:
            self.first = mean
        self._history.append((step, min(mean, self.best)))
        if mean < self.best:
            self.best, self.best_step, self.best_params = mean, step, params()
            self.best_se = float(losses.std() / math.sqrt(losses.size))
            self._above = 0
            return None
        gained = max(self.first - self.best, 0.0)
        threshold = max(DIVERGENCE_FRACTION * gained, DIVERGENCE_SE * self.best_se)
        self._above = self._above + 1 if mean - self.best > threshold else 0
        return "diverging" if self._above >= PATIENCE else None
