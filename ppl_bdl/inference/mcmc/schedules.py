"""Step-size schedules for SG-MCMC, written once and usable by every kernel.

A schedule maps the step counter ``t`` (0-based, an int or an array of ints) to a step size.
Every schedule is written with :mod:`ppl_bdl.dsl.math`, so it runs on any backend, inside a compiled
loop (``t`` traced) or ahead of time on a whole array of steps. The SG-MCMC driver evaluates the
schedule once for the steps of a chunk and feeds the step sizes to the kernel.

- :func:`constant_step_size`: α_t = α_0.
- :func:`polynomial_step_size`: α_t = a (b + t)^(−γ), γ ∈ (0.5, 1], so Σ α_t = ∞ and Σ α_t² < ∞
  (Welling and Teh, 2011; "Bayesian Computation in Deep Learning", after Eq. 2.9). ``a`` is set so that α_0 = ``step_size``.
- :func:`cyclical_step_size`: α_t = α_0/2 [cos(π mod(t, ⌈T/M⌉) / ⌈T/M⌉) + 1] (Eq. 2.10 of
  "Bayesian Computation in Deep Learning", Zhang et al. 2020, with the counter shifted to start at 0), M = ``num_cycles``.
- :func:`cyclical_exploring`: whether step ``t`` lies in the exploration stage of its cycle (the
  first fraction β of each cycle, Zhang et al. 2020, Algorithm 1).

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl.inference.mcmc.schedules import make_schedule
>>> backend = bdl.backends.get("numpyro")
>>> with backend.activate():
...     schedule = make_schedule("cyclical", 0.1, num_steps=8, num_cycles=2)
...     sizes = np.asarray(schedule(backend.arange(8)), dtype=float)
>>> np.round(sizes, 4).tolist()
[0.1, 0.0854, 0.05, 0.0146, 0.1, 0.0854, 0.05, 0.0146]
"""

from __future__ import annotations

import math as _pymath
from collections.abc import Callable
from typing import Any

import numpy as np

from ppl_bdl.dsl import math as bm
from ppl_bdl.errors import ConfigError, one_of

#: The schedule names ``fit(..., schedule=...)`` accepts.
SCHEDULES = ("constant", "polynomial", "cyclical")

Schedule = Callable[[Any], Any]


def _check_step_size(step_size: Any) -> float:
    if isinstance(step_size, bool) or not isinstance(step_size, int | float | np.floating):
        raise ConfigError(f"step_size must be a positive number, got {step_size!r}.")
    if not step_size > 0 or not np.isfinite(step_size):
        raise ConfigError(
            f"step_size must be a positive finite number, got {step_size!r}. SG-MCMC step sizes are "
            "small: start near 1e-4 / N-ish values for big data (e.g. 1e-5) and increase while the "
            "chains stay finite."
        )
    return float(step_size)


def constant_step_size(step_size: float) -> Schedule:
    """α_t = α_0 for every step.

    Example
    -------
    >>> import ppl_bdl as bdl
    >>> from ppl_bdl.inference.mcmc.schedules import constant_step_size
    >>> with bdl.backends.get("numpyro").activate():
    ...     round(float(constant_step_size(0.01)(5)), 6)
    0.01
    """
    step_size = _check_step_size(step_size)

    def schedule(t):
        return bm.zeros_like(bm.asarray(t) * 1.0) + step_size

    return schedule


def polynomial_step_size(
    step_size: float, decay_offset: float = 1.0, decay_power: float = 0.55
) -> Schedule:
    """α_t = a (b + t)^(−γ) with a = α_0 b^γ, so α_0 = ``step_size`` (Welling and Teh, 2011).

    Parameters
    ----------
    step_size : float
        α_0, the step size at t = 0.
    decay_offset : float
        b > 0; larger b decays later.
    decay_power : float
        γ in (0.5, 1]: Σ α_t = ∞ (the chain reaches everywhere) and Σ α_t² < ∞ (the
        discretisation error vanishes).

    Example
    -------
    >>> import ppl_bdl as bdl
    >>> from ppl_bdl.inference.mcmc.schedules import polynomial_step_size
    >>> with bdl.backends.get("numpyro").activate():
    ...     round(float(polynomial_step_size(0.1, decay_offset=1.0, decay_power=1.0)(1)), 4)
    0.05
    """
    step_size = _check_step_size(step_size)
    if not 0.5 < decay_power <= 1.0:
        raise ConfigError(
            f"decay_power (γ of the polynomial schedule a(b + t)^-γ) must be in (0.5, 1], got "
            f"{decay_power!r}; outside it the step sizes either do not sum to infinity or their "
            "squares do not converge."
        )
    if not decay_offset > 0:
        raise ConfigError(f"decay_offset (b of a(b + t)^-γ) must be > 0, got {decay_offset!r}.")
    b, gamma = float(decay_offset), float(decay_power)

    def schedule(t):
        return step_size * bm.exp(-gamma * bm.log1p(bm.asarray(t) * 1.0 / b))

    return schedule


def cycle_length(num_steps: int, num_cycles: int) -> int:
    """⌈T / M⌉, the number of steps per cycle."""
    return int(_pymath.ceil(num_steps / num_cycles))


def _cycle_fraction(t, num_steps: int, num_cycles: int):
    """mod(t, L) / L for a step counter t (an integer, possibly held as a float)."""
    length = cycle_length(num_steps, num_cycles)
    t = bm.asarray(t) * 1.0
    # (t + ½) / L is never within rounding of an integer: a compiler that divides by multiplying
    # with 1/L (XLA does) made floor(107 / 107) = 0, a fraction of 1 and a step size of 0 at the
    # first step of every cycle after the first.
    return (t - bm.floor((t + 0.5) / length) * length) / length


def cyclical_step_size(step_size: float, num_steps: int, num_cycles: int) -> Schedule:
    """The cosine cyclical schedule of Eq. 2.10 of "Bayesian Computation in Deep Learning" (Zhang et al., 2020).

    α_t = α_0/2 [cos(π mod(t, ⌈T/M⌉) / ⌈T/M⌉) + 1] for t = 0, ..., T − 1 (Eq. 2.10 counts from 1).

    Example
    -------
    >>> import ppl_bdl as bdl
    >>> from ppl_bdl.inference.mcmc.schedules import cyclical_step_size
    >>> with bdl.backends.get("numpyro").activate():
    ...     [round(float(cyclical_step_size(1.0, 4, 2)(t)), 3) for t in range(4)]
    [1.0, 0.5, 1.0, 0.5]
    """
    step_size = _check_step_size(step_size)
    _check_cycles(num_steps, num_cycles)

    def schedule(t):
        return (
            0.5 * step_size * (bm.cos(_pymath.pi * _cycle_fraction(t, num_steps, num_cycles)) + 1.0)
        )

    return schedule


def cyclical_exploring(t, num_steps: int, num_cycles: int, exploration: float):
    """True where step ``t`` is in the exploration stage (first fraction β of its cycle)."""
    return _cycle_fraction(t, num_steps, num_cycles) < exploration


def sampling_stage_mask(num_steps: int, num_cycles: int, exploration: float) -> np.ndarray:
    """NumPy bool array over the T steps: True in sampling stages (the complement of exploring)."""
    t = np.arange(num_steps)
    length = cycle_length(num_steps, num_cycles)
    return (t % length) / length >= exploration


def _check_cycles(num_steps: int, num_cycles: int) -> None:
    if isinstance(num_cycles, bool) or not isinstance(num_cycles, int) or num_cycles < 1:
        raise ConfigError(f"num_cycles must be a positive int, got {num_cycles!r}.")
    if num_cycles > num_steps:
        raise ConfigError(
            f"num_cycles={num_cycles} is more than the {num_steps} steps of the run; use fewer cycles "
            "or more steps."
        )


def check_exploration(exploration: Any) -> float:
    """Validate β, the exploration fraction of each cycle."""
    if (
        isinstance(exploration, bool)
        or not isinstance(exploration, int | float)
        or not 0.0 <= exploration < 1.0
    ):
        raise ConfigError(
            f"exploration (the fraction β of each cycle spent exploring) must be in [0, 1), got "
            f"{exploration!r}; Zhang et al. (2020) use 0.8."
        )
    return float(exploration)


def make_schedule(
    name: str,
    step_size: float,
    *,
    num_steps: int,
    num_cycles: int = 4,
    decay_offset: float = 1.0,
    decay_power: float = 0.55,
) -> Schedule:
    """The schedule called ``name`` ("constant", "polynomial" or "cyclical") for a run of
    ``num_steps`` steps.

    Example
    -------
    >>> import ppl_bdl as bdl
    >>> from ppl_bdl.inference.mcmc.schedules import make_schedule
    >>> with bdl.backends.get("numpyro").activate():
    ...     float(make_schedule("constant", 0.5, num_steps=10)(3))
    0.5
    """
    if name == "constant":
        return constant_step_size(step_size)
    if name == "polynomial":
        return polynomial_step_size(step_size, decay_offset, decay_power)
    if name == "cyclical":
        return cyclical_step_size(step_size, num_steps, num_cycles)
    raise one_of("schedule", name, list(SCHEDULES))
