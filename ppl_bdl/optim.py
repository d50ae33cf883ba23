"""Optimizer settings and learning-rate schedules for the core's own VI (and anything else that
optimises a flat parameter vector).

The schedules are written once here; each backend builds its own optimizer from an
:class:`OptimizerConfig` (optax on NumPyro, ``torch.optim`` on Pyro), so the update rules are the
backends' tested implementations.

Example
-------
>>> from ppl_bdl.optim import OptimizerConfig, learning_rate
>>> cfg = OptimizerConfig.build(optimizer="adam", lr=1e-2, schedule="cosine", num_steps=100)
>>> round(learning_rate(cfg, 50), 4)
0.005
"""

from __future__ import annotations

import math as _pymath
from dataclasses import dataclass
from typing import Any

from ppl_bdl.dsl import math as bm
from ppl_bdl.errors import ConfigError, one_of

OPTIMIZERS = ("adam", "sgd")
SCHEDULES = ("constant", "exponential", "cosine", "plateau")


@dataclass(frozen=True)
class OptimizerConfig:
    """What to build: ``optimizer`` ("adam" | "sgd"), ``lr``, ``momentum`` (sgd), ``schedule``
    ("constant" | "exponential" | "cosine" | "plateau"), ``decay`` (the factor the exponential
    schedule reaches at the last step), ``clip_norm`` (global gradient-norm clipping, None for
    none) and ``num_steps`` (the schedule's horizon).

    A backend's optimizer takes each step's lr as an argument of its update (the driver's
    :class:`~ppl_bdl.inference.loop.driver.Rates`: ``lr`` × a factor the run may change, times the
    schedule's shape, :func:`unit_schedule`, at the step counter): the "plateau" schedule is
    the constant lr times the factor the VI monitor cuts when the loss flattens
    (:class:`ppl_bdl.inference.vi.monitor.Plateau`)."""

    optimizer: str = "adam"
    lr: float = 1e-2
    momentum: float = 0.0
    schedule: str = "constant"
    decay: float = 0.1
    clip_norm: float | None = None
    num_steps: int = 1000

    @classmethod
    def build(
        cls,
        optimizer: str = "adam",
        lr: float = 1e-2,
        momentum: float = 0.0,
        schedule: str = "constant",
        decay: float = 0.1,
        clip_norm: float | None = None,
        num_steps: int = 1000,
    ) -> OptimizerConfig:
        """Validate the settings and build a config (every bad value gets a clear error)."""
        if optimizer not in OPTIMIZERS:
            raise one_of("optimizer", optimizer, OPTIMIZERS)
        if schedule not in SCHEDULES:
            raise one_of("schedule", schedule, SCHEDULES)
        for name, value, low in (("lr", lr, 0.0), ("decay", decay, 0.0)):
            if not _is_real(value) or not value > low or not _pymath.isfinite(value):
                raise ConfigError(f"{name} must be a finite number > {low}, got {value!r}.")
        if not _is_real(momentum) or not 0.0 <= momentum < 1.0:
            raise ConfigError(f"momentum must be in [0, 1), got {momentum!r}.")
        if clip_norm is not None and (not _is_real(clip_norm) or not clip_norm > 0):
            raise ConfigError(f"clip_norm must be a number > 0 or None, got {clip_norm!r}.")
        return cls(
            optimizer,
            float(lr),
            float(momentum),
            schedule,
            float(decay),
            None if clip_norm is None else float(clip_norm),
            int(num_steps),
        )


def _is_real(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def learning_rate(config: OptimizerConfig, step: Any, xp: Any = _pymath) -> Any:
    """The learning rate at ``step`` (0-based).

    ``xp`` supplies ``cos`` and ``minimum`` for traced steps (pass the backend's math namespace
    inside a compiled loop); for Python ints the default uses the ``math`` module.

    - constant, plateau: ``lr`` (the plateau's cuts scale the run's rates)
    - exponential: ``lr * decay ** (step / num_steps)`` (reaches ``lr * decay`` at the end)
    - cosine: ``lr * (1 + cos(pi * min(step, T) / T)) / 2`` (Loshchilov & Hutter 2017)
    """
    lr, horizon = config.lr, max(config.num_steps, 1)
    if config.schedule in ("constant", "plateau"):
        return lr + 0.0 * step
    if config.schedule == "exponential":
        return lr * config.decay ** (step / horizon)
    frac = step / horizon
    frac = xp.minimum(frac, 1.0) if xp is not _pymath else min(frac, 1.0)
    return lr * 0.5 * (1.0 + xp.cos(_pymath.pi * frac))


def unit_schedule(config: OptimizerConfig):
    """The schedule's shape, ``learning_rate / lr`` as a function of a (traced) step counter
    written with :mod:`ppl_bdl.dsl.math`; None for a constant shape (constant, plateau).

    Example
    -------
    >>> from ppl_bdl.optim import OptimizerConfig, unit_schedule
    >>> unit_schedule(OptimizerConfig.build(schedule="plateau")) is None
    True
    """
    if config.schedule in ("constant", "plateau"):
        return None
    return lambda step: learning_rate(config, step, xp=bm) * (1.0 / config.lr)
