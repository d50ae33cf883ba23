"""Stochastic gradient Hamiltonian Monte Carlo (Chen et al., 2014; Eq. 2.11-2.12 of "Bayesian Computation in Deep Learning").

Eq. 2.12 is second-order Langevin dynamics with friction C and a diagonal mass M:
dθ = M⁻¹ r dt,  dr = −∇U(θ) dt − C M⁻¹ r dt + √(2C) dW.
With a time step ε, its standard discretisation (Chen et al. 2014, Eq. 15, gradient noise
estimate B̂, temperature T) is

    r ← r − ε ∇Ũ(θ) − ε C M⁻¹ r + N(0, 2 (C − B̂) ε T),    θ ← θ + ε M⁻¹ r.

Substituting v = ε M⁻¹ r gives the learning-rate / momentum-decay form (Chen et al. 2014,
Sec. 3.3), which is what ``step_size`` means here:

    v ← (1 − α) v − η ∇Ũ(θ) + N(0, 2 (α − β̂) η T),    θ ← θ + v,

with learning rate η = ε² M⁻¹ (``step_size``), momentum decay α = ε C M⁻¹ (``momentum_decay``)
and β̂ = ε M⁻¹ B̂. Pass ``friction`` C (with ``mass`` M) instead of ``momentum_decay`` to
state the friction of Eq. 2.12 directly: then α = C √(η / M) at each step. The state keeps the
velocity v (as SGD with momentum does), so a step-size schedule that jumps back up at the start of
a cycle does not blow up a momentum accumulated at tiny steps.
"""

from __future__ import annotations

from ppl_bdl.dsl import math as bm
from ppl_bdl.dsl import random as br
from ppl_bdl.errors import ConfigError
from ppl_bdl.inference.mcmc import blocks as bt
from ppl_bdl.inference.mcmc.kernels.base import Kernel, ValueAndGrad
from ppl_bdl.inference.mcmc.kernels.registry import register
from ppl_bdl.inference.mcmc.kernels.sgld import check_temperature


def _positive(name: str, value, allow_zero: bool = False) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if ok:
        ok = value >= 0 if allow_zero else value > 0
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"{name} must be a number {bound}, got {value!r}.")


def check_mass(mass):
    """A scalar or a diagonal (1-D array-like) mass, all entries > 0."""
    if isinstance(mass, int | float) and not isinstance(mass, bool):
        _positive("mass", mass)
        return float(mass)
    import numpy as np

    values = np.asarray(mass, dtype=float)
    if values.ndim != 1 or not np.all(values > 0):
        raise ConfigError(
            f"mass must be a positive number or a 1-D array of positive numbers (the diagonal of "
            f"M, one per unconstrained coordinate), got shape {values.shape}."
        )
    return values


def sghmc_parameters(friction, momentum_decay, noise_estimate, temperature, mass):
    """Validate SGHMC settings; return them normalised (see the module docstring)."""
    temperature = check_temperature(temperature)
    mass = check_mass(mass)
    _positive("noise_estimate", noise_estimate, allow_zero=True)
    if friction is not None and momentum_decay is not None:
        raise ConfigError(
            "pass either friction (C of Eq. 2.12) or momentum_decay (α = ε C / M), not both."
        )
    if friction is not None:
        _positive("friction", friction, allow_zero=True)  # 0: "naive" SGHMC, no friction
        if noise_estimate > friction:
            raise ConfigError(
                f"noise_estimate B̂={noise_estimate} must not exceed friction C={friction}: the "
                "injected noise has variance 2 (C − B̂) ε."
            )
    else:
        momentum_decay = 0.1 if momentum_decay is None else momentum_decay
        if not isinstance(momentum_decay, int | float) or not 0 <= momentum_decay <= 1:
            raise ConfigError(f"momentum_decay must be in [0, 1], got {momentum_decay!r}.")
        if noise_estimate > momentum_decay:
            raise ConfigError(
                f"noise_estimate β̂={noise_estimate} must not exceed momentum_decay α={momentum_decay}."
            )
    return friction, momentum_decay, float(noise_estimate), temperature, mass


def make_sghmc_step(friction, momentum_decay, noise_estimate, temperature, mass, resample_every):
    """The SGHMC transition; ``noise_factor`` (0 or 1) lets cyclical variants switch noise off.
    The position and velocity are an array or a tuple of blocks (:mod:`ppl_bdl.inference.mcmc.blocks`); a
    diagonal ``mass`` (one entry per coordinate, flat) is split into the position's blocks."""
    mass_is_array = not isinstance(mass, float)

    def transition(key, state, value_and_grad, minibatch, step_size, noise_factor):
        key_noise, key_resample = br.split(key)
        position, velocity = state["position"], state["velocity"]
        if resample_every is not None:  # r ~ N(0, M) is v = ε M⁻¹ r ~ N(0, η)
            fresh = bt.normal_like(key_resample, velocity)
            redraw = state["count"] % resample_every == 0
            velocity = bt.tree_map(
                lambda f, v: bm.where(redraw, f * bm.sqrt(step_size * 1.0), v), fresh, velocity
            )
        if mass_is_array:
            if len(mass) != bt.size(position):
                raise ConfigError(
                    f"mass has {len(mass)} entries, but the position has {bt.size(position)} "
                    "unconstrained coordinates: pass one mass per coordinate, or a number."
                )
            masses = bt.split_like(bm.asarray(mass), position)
        else:
            masses = bt.tree_map(lambda _: mass, position)
        potential, grad = value_and_grad(position, minibatch)
        noise = bt.normal_like(key_noise, position)

        def update(v, g, e, m):
            if friction is not None:  # α = ε C M⁻¹ with ε = √(η M)
                scale = bm.sqrt(step_size * m) / m
                alpha, beta = friction * scale, noise_estimate * scale
            else:
                alpha, beta = momentum_decay, noise_estimate
            sd = bm.sqrt(2.0 * (alpha - beta) * step_size * temperature * noise_factor)
            return (1.0 - alpha) * v - step_size * g + sd * e

        velocity = bt.tree_map(update, velocity, grad, noise, masses)
        position = bt.tree_map(lambda p, v: p + v, position, velocity)
        new = {"position": position, "velocity": velocity, "count": state["count"] + 1}
        info = {
            "step_size": step_size,
            "grad_norm": bt.norm(grad),
            "potential": potential,
            # ½ rᵀ M⁻¹ r with r = M v / ε and ε² = η M
            "kinetic_energy": 0.5 * bt.sum_squares(velocity) / step_size,
        }
        return new, info

    return transition


def sghmc_init(position):
    return {
        "position": position,
        "velocity": bt.zeros_like(position),
        "count": bt.scalar_zero(position),
    }


@register("sghmc", blocks=True)
def sghmc(
    value_and_grad: ValueAndGrad,
    friction: float | None = None,
    momentum_decay: float | None = None,
    mass=1.0,
    temperature: float = 1.0,
    noise_estimate: float = 0.0,
    resample_every: int | None = None,
) -> Kernel:
    """SGHMC (Chen et al., 2014): Eq. 2.12 discretised in the learning-rate / momentum-decay form.

    ``step_size`` is the learning rate η = ε² M⁻¹; the update is
    v ← (1 − α) v − η ∇Ũ(θ) + N(0, 2 (α − β̂) η T), θ ← θ + v (see the module docstring).

    Parameters
    ----------
    value_and_grad : callable
        ``(position, minibatch) -> (Ũ, ∇Ũ)`` (supplied by the driver).
    friction : float, optional
        C of Eq. 2.12; the momentum decay is then α = C √(η / M). Mutually exclusive with
        ``momentum_decay``.
    momentum_decay : float, optional
        α in (0, 1] (default 0.1 when ``friction`` is not given); Chen et al. suggest 0.01-0.1.
    mass : float or 1-D array
        The diagonal mass M.
    temperature : float
        T scales the injected noise (1 for the posterior).
    noise_estimate : float
        B̂ (with ``friction``) or β̂ (with ``momentum_decay``): the estimated gradient-noise
        variance term subtracted from the injected noise; 0 by default, as in practice.
    resample_every : int, optional
        Redraw the momentum r ~ N(0, M) every k steps (Chen et al.'s Algorithm 2); never by default.

    Example
    -------
    >>> import ppl_bdl as bdl
    >>> double_well = lambda x, batch: ((x**4 - 2 * x**2).sum(), 4 * x**3 - 4 * x)
    >>> kernel = bdl.kernels.get("sghmc").factory(double_well, friction=3.0)
    >>> backend = bdl.backends.get("numpyro")
    >>> with backend.activate():
    ...     state = kernel.init(backend.asarray([0.5]))
    ...     state, info = kernel.step(bdl.random.key(0), state, None, 0.01)
    >>> sorted(info)
    ['grad_norm', 'kinetic_energy', 'potential', 'step_size']
    """
    settings = sghmc_parameters(friction, momentum_decay, noise_estimate, temperature, mass)
    if resample_every is not None and (not isinstance(resample_every, int) or resample_every < 1):
        raise ConfigError(f"resample_every must be a positive int or None, got {resample_every!r}.")
    transition = make_sghmc_step(*settings, resample_every)

    def step(key, state, minibatch, step_size):
        return transition(key, state, value_and_grad, minibatch, step_size, 1.0)

    return Kernel(sghmc_init, step)
