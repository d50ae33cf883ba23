"""Watching a VI run's loss: the best state so far, a loss that diverges, and when to cut the lr.

The run goes in segments of steps (one call of the compiled loop each; see
:func:`segment_length`). After each segment the monitor takes the segment's mean loss as the
smoothed loss (a windowed mean: Adam's loss curve is too noisy step by step). It keeps a host
copy of the parameters at the end of the latest segment whose smoothed loss is the lowest so far
or within :data:`TIE_SE` standard errors of it, which is what the fit returns (on a flat loss the
lowest of many noisy segment means is an early segment by chance, before a decaying lr has
settled the parameters; within the noise, the latest is the one to keep); and it calls the run
diverging when, for :data:`PATIENCE` segments in a row, the smoothed loss stays above its best by
more than half of everything the run had gained (the mean of its first :data:`START_STEPS` steps
minus the best) and by more than :data:`DIVERGENCE_SE` standard errors of the best segment's
mean. A segment's standard error is :func:`segment_se`: the step losses' sd about the
segment's linear trend, over sqrt(steps). A loss that rises but stays finite (a too-large learning rate on a
flow, say) then stops the run at once, where it would otherwise be reported at its diverged end.

With a :class:`Plateau` rule (``schedule="plateau"``, VI's default with ``num_steps=None``) it
also decides when the learning rate is cut: Keras's and PyTorch's ReduceLROnPlateau, on the
smoothed loss. At constant lr Adam's loss flattens at a noise floor set by the lr (a full-rank
guide on the shipped BNN regression converged 4 nats above what lr / 3 reaches); a smaller lr
from there goes on down. The test (:func:`plateau_test`) is a two-sample comparison: the loss is
flat when the mean of the last ``patience`` segments is below the mean of the ``patience``
before them by no more than max(CONVERGED_FRACTION x gained, PLATEAU_SE x the standard error of
that difference). The noise term keeps a chance wobble from counting as progress; it is the
segment means' standard error, not the sd of one step, because a fall well beyond the noise is
progress however slow: on the shipped BNN regression the flow guide's loss creeps 0.06 nats a
segment (6 standard errors a window) on a plateau near 45 for 35,000 steps, and a run at lr / 3
creeps there as long (at 3 lr, longer), so this is no noise floor; cut there, the run ends near
45 where the default lr reaches 21 by step ~72,000 (one segment against the last improving one,
Keras's form, with the same margins, has too little power: it cut at 21,000, 25,000 and 35,000
and stopped at 39,000 at 43.6; two windows of 3 segments see the creep at 6 standard errors). Near the cap a backstop makes the cuts left, ``patience`` segments apart, so that a run
still falling at its end ends at the smallest lr (annealing at the end of a budget: the "decay"
phase of warmup-stable-decay schedules, Hägele et al. 2024, "Scaling Laws and Compute-Optimal
Training Beyond Fixed Training Durations"). The rule is written here once; the factor
(:attr:`LossMonitor.lr_scale`)
scales the run's rates (:class:`~ppl_bdl.inference.loop.driver.Rates`), an input of the compiled
loop, so a cut compiles nothing.

Example
-------
>>> import numpy as np
>>> monitor = LossMonitor()
>>> rng = np.random.default_rng(0)
>>> for start, level in [(0, 100.0), (100, 50.0), (200, 20.0), (300, 80.0), (400, 90.0)]:
...     verdict = monitor.update(start + 100, level + rng.normal(size=100), lambda: {"x": level})
>>> verdict, monitor.best_step, monitor.best_params
('diverging', 300, {'x': 20.0})

A loss that flattens gets its lr cut (patience 2 segments: the last two segments' mean is no
lower than the two before; at most 1 cut here), and is converged once it is flat again after
the last cut:

>>> monitor = LossMonitor(Plateau.build(factor=0.3, patience=2, max_cuts=1))
>>> levels = [100.0, 50.0, 40.0, 40.0, 40.0, 40.0, 30.0, 30.0, 30.0, 30.0]
>>> verdicts = [monitor.update(100 * (i + 1), np.full(10, v), lambda: None)
...             for i, v in enumerate(levels)]
>>> verdicts.index("lr_cut"), monitor.cuts, monitor.lr_scale, monitor.converged()
(5, [600], 0.3, True)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ppl_bdl.errors import ConfigError

#: Segments in a row above the divergence threshold before the run is stopped.
PATIENCE = 2
#: The divergence threshold's floor, in standard errors of the best segment's mean loss.
DIVERGENCE_SE = 5.0
#: The threshold's main part: this fraction of what the run had gained (first mean - best).
DIVERGENCE_FRACTION = 0.5
#: A segment whose mean loss is within this many standard errors (:func:`tie_se`) of the best
#: is a tie with it, and the later state is kept.
TIE_SE = 3.0
#: ``num_steps=None``: run until the loss has converged (:meth:`LossMonitor.converged`), at
#: least AUTO_MIN_STEPS steps and at most AUTO_MAX_STEPS.
AUTO_MIN_STEPS, AUTO_MAX_STEPS = 2_000, 100_000
#: Converged: over the last quarter of the steps run, the best smoothed loss improved by less
#: than this fraction of everything the run gained (the mean of the first START_STEPS steps
#: minus the best); the plateau test's floor, per window of ``patience`` segments, too.
CONVERGED_FRACTION = 0.003
#: What the run gained is measured from its start: the mean loss of its first START_STEPS steps
#: (not of its first segment, whose length depends on num_steps and which on a loss that falls
#: fast already sits near the floor).
START_STEPS = 100
#: The plateau test's noise margin: the last window's mean must be below the one before by more
#: than this many standard errors of the difference to count as a fall (one-sided, ~2.3% of
#: flat windows called falling by chance).
PLATEAU_SE = 2.0
#: A VI run is watched in about this many segments (each one call of the compiled loop).
SEGMENTS = 20
#: The shortest and longest segment: one call costs the host a read-back, which a toy model's
#: steps (tens of microseconds) must outweigh.
MIN_SEGMENT, MAX_SEGMENT = 100, 1000
#: Reduce-on-plateau's defaults: the factor a cut multiplies the lr by, the segments of each of
#: the plateau test's two windows and the fewest segments between two cuts (Keras's patience),
#: and the most cuts (the lr ends at 0.5**3 = 12.5% of its start). A half, not Keras's tenth:
#: after a cut a BNN's loss may keep drifting down at a speed set by the lr (the full-rank guide
#: on the shipped BNN regression, cut once at step 12,000, reached 28.0 by step 50,000
#: at 0.5 and 30.4 at 0.3, where 100,000 steps at lr / 3 reach 28.7); a half is still below
#: the noise floor that flattened it, and on the other shipped models 0.3 and 0.5 end alike.
PLATEAU_FACTOR, PLATEAU_PATIENCE, PLATEAU_CUTS = 0.5, 3, 3


@dataclass(frozen=True)
class Plateau:
    """Reduce-on-plateau: when the loss is flat by :func:`plateau_test` (the last ``patience``
    segments against the ``patience`` before them) and ``patience`` segments have passed since
    the last cut, multiply the lr by ``factor``, at most ``max_cuts`` times (as Keras's
    ``ReduceLROnPlateau`` with its ``min_delta`` set from the loss's own noise and gain).

    Example
    -------
    >>> Plateau.build()
    Plateau(factor=0.5, patience=3, max_cuts=3)
    """

    factor: float = PLATEAU_FACTOR
    patience: int = PLATEAU_PATIENCE
    max_cuts: int = PLATEAU_CUTS

    @classmethod
    def build(
        cls,
        factor: Any = PLATEAU_FACTOR,
        patience: Any = PLATEAU_PATIENCE,
        max_cuts: Any = PLATEAU_CUTS,
    ) -> Plateau:
        """Validate the settings (options ``plateau_factor``, ``plateau_patience``,
        ``plateau_cuts`` of ``fit(method="vi", schedule="plateau")``)."""
        real = isinstance(factor, int | float) and not isinstance(factor, bool)
        if not real or not 0.0 < factor < 1.0:
            raise ConfigError(
                f"plateau_factor must be a number in (0, 1) (the lr is multiplied by it at each "
                f"cut), got {factor!r}. Try {PLATEAU_FACTOR} (the default) or 0.1 (Keras's)."
            )
        for name, value, low, meaning in (
            ("plateau_patience", patience, 1, "segments without improvement before a cut"),
            ("plateau_cuts", max_cuts, 0, "the most lr cuts; 0 stops at the first plateau"),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(
                    f"{name} must be an int >= {low} ({meaning}), got {value!r}. The defaults: "
                    f"plateau_patience={PLATEAU_PATIENCE}, plateau_cuts={PLATEAU_CUTS}."
                )
        return cls(float(factor), patience, max_cuts)


def segment_se(losses: np.ndarray) -> float:
    """The standard error of a segment's mean loss: the sd of the step losses about the
    segment's straight-line trend (the noise of one step; a loss still falling inside the
    segment would inflate a plain sd), over sqrt(steps).

    Example
    -------
    >>> rng = np.random.default_rng(0)
    >>> falling = np.linspace(50.0, 10.0, 400) + rng.normal(size=400)
    >>> round(segment_se(falling), 3), round(float(falling.std()) / 20, 3)  # 1 / sqrt(400)
    (0.05, 0.584)
    """
    losses = np.asarray(losses, dtype=float)
    if losses.size < 3:
        return 0.0
    steps = np.arange(losses.size)
    residual = losses - np.polyval(np.polyfit(steps, losses, 1), steps)
    return float(residual.std() / math.sqrt(losses.size))


def tie_se(se: float, best_se: float) -> float:
    """The standard error of a segment's mean minus the best segment's, for the tie test: the
    segment's own SE counts only up to the best's, so a segment noisier than the best (a loss
    that now and then blows up by orders of magnitude: its SE is as large as its excess) is no
    tie by its own noise.

    Example
    -------
    >>> round(tie_se(0.1, 0.1), 4), tie_se(500.0, 0.1) == tie_se(0.1, 0.1)
    (0.1414, True)
    """
    return math.hypot(min(se, best_se), best_se)


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
    """The best smoothed loss, the step and parameters where it was reached, divergence, and
    with a ``plateau`` rule the lr's cuts (``cuts``: the steps; ``lr_scale``: the factor now)."""

    def __init__(self, plateau: Plateau | None = None, num_steps: int | None = None):
        self.plateau, self.num_steps = plateau, num_steps
        self.cuts: list[int] = []
        self.lr_scale = 1.0
        self.diverged = False
        self._segments: list[tuple[float, float, int]] = []  # each segment's mean, SE, steps
        self._since_cut = 0  # segments since the last cut (or the start)
        self._flat = False  # the plateau test's latest verdict
        self.first: float | None = None
        self.best = math.inf
        self.best_se = 0.0
        self.best_step = 0
        self.best_params: dict | None = None
        self._above = 0
        self._history: list[tuple[int, float]] = []

    def converged(self) -> bool:
        """Whether the best smoothed loss has stopped improving (see CONVERGED_FRACTION); with a
        plateau rule: whether the loss is flat by :func:`plateau_test` ``patience`` segments or
        more after the last cut (at the smallest lr). Never after a divergence."""
        if self.diverged:
            return False
        if self.plateau is not None:
            done = len(self.cuts) >= self.plateau.max_cuts
            return done and self._flat and self._since_cut >= self.plateau.patience
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
        "diverging", "lr_cut" (the plateau rule cut the lr: ``lr_scale`` is the new factor) or
        None."""
        losses = np.asarray(losses, dtype=float)
        if losses.size == 0:
            return None
        mean = float(losses.mean())
        if self.first is None:
            self.first = float(losses[:START_STEPS].mean())
        self._history.append((step, min(mean, self.best)))
        se = segment_se(losses)
        self._segments.append((mean, se, losses.size))
        if mean < self.best:
            self.best, self.best_step, self.best_params = mean, step, params()
            self.best_se = se
            self._above = 0
        elif mean - self.best <= TIE_SE * tie_se(se, self.best_se):
            self.best_step, self.best_params = step, params()  # a tie: keep the later state
            self._above = 0
        else:
            gained = max(self.first - self.best, 0.0)
            threshold = max(DIVERGENCE_FRACTION * gained, DIVERGENCE_SE * self.best_se)
            self._above = self._above + 1 if mean - self.best > threshold else 0
            if self._above >= PATIENCE:
                self.diverged = True
                return "diverging"
        return self._plateau(step)

    def _plateau(self, step: int) -> str | None:
        if self.plateau is None:
            return None
        patience, left = self.plateau.patience, self.plateau.max_cuts - len(self.cuts)
        self._since_cut += 1
        self._flat = plateau_test(self._segments, patience, self.first - self.best)
        # The backstop: the cuts left are made in the run's last part, patience segments apart,
        # so that a run still falling at its end (its cap) ends at the smallest lr.
        steps_left = math.inf if self.num_steps is None else self.num_steps - step
        late = steps_left <= left * patience * self._segments[-1][2]
        if left <= 0 or self._since_cut < patience or not (self._flat or late):
            return None
        self.cuts.append(step)
        self.lr_scale *= self.plateau.factor
        self._since_cut = 0
        return "lr_cut"


def plateau_test(segments: list[tuple[float, float, int]], patience: int, gained: float) -> bool:
    """Whether the loss is flat: the mean loss of the last ``patience`` segments (``segments``:
    each one's mean, standard error and steps) is below that of the ``patience`` before them by
    no more than max(CONVERGED_FRACTION x ``gained``, PLATEAU_SE x the standard error of that
    difference). False until there are two windows.

    Example
    -------
    >>> creeping = [(45.0 - 0.06 * i, 0.035, 1000) for i in range(6)]  # 0.06 a segment
    >>> plateau_test(creeping, 3, 20.0), plateau_test(creeping[:5], 3, 20.0)
    (False, False)
    >>> plateau_test([(45.0 - 0.01 * i, 0.035, 1000) for i in range(6)], 3, 20.0)
    True
    """
    if len(segments) < 2 * patience:
        return False
    last, before = _window(segments[-patience:]), _window(segments[-2 * patience : -patience])
    fall = before[0] - last[0]
    noise = PLATEAU_SE * math.hypot(before[1], last[1])
    return fall <= max(CONVERGED_FRACTION * max(gained, 0.0), noise)


def _window(segments) -> tuple[float, float]:
    """The mean loss of consecutive segments (over all their steps) and its standard error."""
    steps = np.array([n for _, _, n in segments], dtype=float)
    means = np.array([m for m, _, _ in segments])
    ses = np.array([se for _, se, _ in segments])
    total = steps.sum()
    return float(means @ steps / total), float(np.sqrt(np.sum((ses * steps) ** 2)) / total)
