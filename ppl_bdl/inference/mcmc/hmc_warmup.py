"""HMC with its warmup adaptation, written in the core: Stan's windowed adaptation of the step size
(dual averaging) and the mass matrix (the draws' variance in doubling windows).

``bdl.HMC`` runs this kernel on every backend, in the core's compiled loop like the SG-MCMC
kernels: on JAX one program per chunk of steps, on torch a traced potential and a few dozen tensor
operations per draw around its leapfrog steps (Pyro's own HMC loop costs milliseconds of Python
per gradient). The warmup, as Stan runs it (Stan Reference Manual, "HMC algorithm parameters";
NumPyro's ``warmup_adapter`` follows it):

* **Step size**, every warmup step, by dual averaging (Hoffman & Gelman 2014, Algorithm 5;
  Nesterov 2009) of the acceptance rate α_t towards ``target_accept`` δ:
  H̄_t = (1 − 1/(t + t₀)) H̄_{t−1} + (δ − α_t) / (t + t₀),
  log ε_t = μ − √t / γ · H̄_t,
  log ε̄_t = t^{−κ} log ε_t + (1 − t^{−κ}) log ε̄_{t−1},
  with μ = log(10 ε₀), γ = 0.05, t₀ = 10, κ = 0.75. Sampling uses ε̄ at the end of warmup.
* **Mass**, in slow windows: after an initial buffer of 75 steps, windows of 25, 50, 100, ...
  steps (the last stretched to 50 steps before the end of warmup) gather the draws' running
  mean and (co)variance (Welford). At each window's end the inverse mass becomes the variance,
  shrunk towards 10⁻³ as Stan does, (n / (n + 5)) Σ̂ + 10⁻³ · 5 / (n + 5) · I, and the dual
  averaging restarts at μ = log(10 ε). A warmup shorter than 150 steps is split 15% / 75% / 10%;
  one shorter than 20 adapts the step size only.

Each draw jitters the step size uniformly within ±20% (Neal 2011, Section 5.4.2.2), so that a
trajectory cannot stay near one period of the (whitened) target; the step size reported is ε.
Every chain adapts its own step size and mass. The schedule is a function of the step count the
state carries, so the step is one fixed program: no Python branch on a value.

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl.inference.mcmc.hmc_warmup import adaptive_hmc_transition, slow_windows
>>> slow_windows(1000)
(75, [99, 149, 249, 449, 949])
>>> backend = bdl.backends.get("numpyro")
>>> scales = np.array([0.1, 3.0])  # N(0, diag(scales²))
>>> kernel = adaptive_hmc_transition(
...     backend, lambda z, batch: (0.5 * ((z / scales) ** 2).sum(), z / scales**2),
...     num_warmup=300, num_steps=10)
>>> with backend.activate():
...     state, step = kernel.init(None, backend.asarray(np.ones(2)), None), backend.jit(kernel.step)
...     for t in range(300):
...         state, info = step(backend.random.key(t), state, None, None)
>>> np.round(np.sqrt(np.asarray(state.inverse_mass)) / scales, 0)  # the mass found the scales
array([1., 1.])
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

from ppl_bdl.backend_protocol import Batch, Transition
from ppl_bdl.inference.mcmc.hmc_kernel import random_move

#: Dual averaging's constants (Hoffman & Gelman 2014, Section 3.2.1; Stan's and NumPyro's).
GAMMA, T0, KAPPA = 0.05, 10.0, 0.75
#: Stan's warmup buffers: the initial fast phase, the first slow window, the final fast phase.
INIT_BUFFER, BASE_WINDOW, TERM_BUFFER = 75, 25, 50
#: Each draw's step size is ε times a uniform draw within ±20% (Neal 2011, Section 5.4.2.2):
#: with a fixed ε and number of steps, a trajectory near one period of a Gaussian-like direction
#: of the target returns near its start every time (after a well-adapted mass, every direction).
STEP_SIZE_JITTER = 0.2
#: Below this many warmup steps the mass is not adapted (Stan's threshold).
MIN_MASS_WARMUP = 20
#: The shrinkage of a window's variance: (n / (n + w)) Σ̂ + s · w / (n + w) · I (Stan's).
SHRINK_WEIGHT, SHRINK_TARGET = 5.0, 1e-3


def slow_windows(num_warmup: int) -> tuple[int, list[int]]:
    """Where the mass is learnt: the first step of the slow phase and the last step of each of
    its windows (0-based; empty when the warmup is too short to adapt the mass)."""
    if num_warmup < MIN_MASS_WARMUP:
        return num_warmup, []
    init, term, base = INIT_BUFFER, TERM_BUFFER, BASE_WINDOW
    if init + base + term > num_warmup:
        init, term = int(0.15 * num_warmup), int(0.1 * num_warmup)
        base = num_warmup - init - term
    slow_end, start, size, ends = num_warmup - term, init, base, []
    while start < slow_end:
        end = start + size
        if end + 2 * size > slow_end:
            end = slow_end
        ends.append(end - 1)
        start, size = end, 2 * size
    return init, ends


class AdaptiveState(NamedTuple):
    """One chain's state: the position with its potential and gradient, the steps taken, the
    dual averaging's (log ε, log ε̄, H̄, its own step count, μ), the window's Welford sums and
    the inverse mass in use."""

    z: object
    potential: object
    grad: object
    step: object
    log_step_size: object
    log_step_size_avg: object
    h_bar: object
    averaging_steps: object
    mu: object
    window_count: object
    window_mean: object
    window_m2: object
    inverse_mass: object


def adaptive_hmc_transition(
    backend,
    potential_and_grad: Callable,
    *,
    num_warmup: int,
    num_steps: int,
    target_accept: float = 0.8,
    step_size: float = 1.0,
    dense_mass: bool = False,
) -> Transition:
    """HMC with ``num_steps`` leapfrog steps per draw whose step size and mass adapt over the
    first ``num_warmup`` steps (see the module), as a
    :class:`~ppl_bdl.backend_protocol.Transition` of the core's loop; ``potential_and_grad(z,
    batch)``. Info as NUTS gives it (``acceptance_rate``, ``diverging``,
    ``n_steps``, ``step_size``, ``lp``, ``energy``); ``emit``: the position."""
    m, random = backend.math, backend.random
    start, ends = slow_windows(num_warmup)

    def init(key, position, data):
        del key
        u, g = potential_and_grad(position, Batch(data, None))
        zero = m.zeros_like(u)
        ones = m.ones_like(position)
        eye = m.diag(ones) if dense_mass else ones
        log_eps = zero + math.log(step_size)
        return AdaptiveState(
            position, u, g, zero, log_eps, log_eps, zero, zero, log_eps + math.log(10.0),
            zero, m.zeros_like(position), m.zeros_like(eye), eye,
        )  # fmt: skip

    def step(key, state: AdaptiveState, batch, rate):
        del rate
        move_key, jitter_key = random.split(key)
        warming = state.step < num_warmup
        eps = m.exp(m.where(warming, state.log_step_size, state.log_step_size_avg))
        jitter = random.uniform(jitter_key, (), 1.0 - STEP_SIZE_JITTER, 1.0 + STEP_SIZE_JITTER)
        (z, u, g), info = random_move(
            backend,
            lambda z: potential_and_grad(z, batch),
            (state.z, state.potential, state.grad),
            move_key,
            eps * jitter,
            state.inverse_mass,
            num_steps,
        )
        adapted = _adapt(m, state, z, info["acceptance_rate"], target_accept, start, ends)
        new = AdaptiveState(  # the adaptation's fields (the 5th on) move during warmup only
            z, u, g, state.step + 1,
            *(m.where(warming, a, b) for a, b in zip(adapted, state[4:], strict=True)),
        )  # fmt: skip
        info["step_size"] = eps  # the adapted one, not this draw's jittered one
        return new, info

    return Transition(init, step, lambda state: state.z)


def _adapt(m, state: AdaptiveState, z, acceptance, target_accept, start, ends) -> tuple:
    """One warmup step's update of (log ε, log ε̄, H̄, averaging steps, μ, the window's count,
    mean and M2, the inverse mass)."""
    # Dual averaging of the acceptance rate.
    t = state.averaging_steps + 1
    eta = 1.0 / (t + T0)
    h_bar = (1.0 - eta) * state.h_bar + eta * (target_accept - acceptance)
    log_eps = state.mu - m.sqrt(t) / GAMMA * h_bar
    weight = t**-KAPPA
    log_eps_avg = weight * log_eps + (1.0 - weight) * state.log_step_size_avg
    # Welford's running mean and (co)variance of the draws inside the slow phase.
    collecting = (state.step >= start) & (state.step <= (ends[-1] if ends else -1))
    count = state.window_count + 1
    delta = z - state.window_mean
    mean = state.window_mean + delta / count
    after = z - mean
    spread = after * delta if len(state.window_m2.shape) == 1 else m.outer(delta, after)
    count = m.where(collecting, count, state.window_count)
    mean = m.where(collecting, mean, state.window_mean)
    m2 = m.where(collecting, state.window_m2 + spread, state.window_m2)
    # A window's end: the mass from its variance; the dual averaging starts again.
    closing = collecting & _any_equal(m, state.step, ends)
    ones = m.ones_like(mean)
    identity = ones if len(m2.shape) == 1 else m.diag(ones)
    shrunk = (count / (count + SHRINK_WEIGHT)) * (m2 / m.maximum(count - 1.0, 1.0)) + (
        SHRINK_TARGET * SHRINK_WEIGHT / (count + SHRINK_WEIGHT)
    ) * identity
    zero = m.zeros_like(h_bar)
    return (
        log_eps,
        m.where(closing, zero, log_eps_avg),
        m.where(closing, zero, h_bar),
        m.where(closing, zero, t),
        m.where(closing, log_eps + math.log(10.0), state.mu),
        m.where(closing, zero, count),
        m.where(closing, m.zeros_like(mean), mean),
        m.where(closing, m.zeros_like(m2), m2),
        m.where(closing, shrunk, state.inverse_mass),
    )


def _any_equal(m, step, values: list[int]):
    """Whether ``step`` (a 0-d array) equals one of ``values``, as an array (no Python branch)."""
    hit = step < 0  # False, as an array
    for value in values:
        hit = hit | (step == value)
    return hit
