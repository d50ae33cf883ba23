"""Cyclical SG-MCMC: cSGLD and cSGHMC (Zhang, Li, Zhang, Chen and Wilson, 2020).

The step size follows the cosine cycles of Eq. 2.10 of "Bayesian Computation in Deep Learning" with M = ``num_cycles``; the
first fraction β (``exploration``) of each cycle explores (large steps, no injected noise, as
SGD/SGD-with-momentum) and the rest samples (SGLD/SGHMC steps, draws kept). The driver keeps draws
only in sampling stages and lengthens the run so that ``num_samples`` draws are kept.

Both are registered as cyclical (``register(..., cyclical=True)``): the driver gives them
``num_steps`` and ``num_cycles`` and the cyclical step sizes; each keeps its own step counter
(which stage it is in), so it also runs under the native drivers.
"""

from __future__ import annotations

from ppl_bdl.dsl import math as bm
from ppl_bdl.inference.mcmc import blocks as bt
from ppl_bdl.inference.mcmc.kernels.base import Kernel, ValueAndGrad
from ppl_bdl.inference.mcmc.kernels.registry import register
from ppl_bdl.inference.mcmc.kernels.sghmc import make_sghmc_step, sghmc_init, sghmc_parameters
from ppl_bdl.inference.mcmc.kernels.sgld import check_temperature, langevin_update
from ppl_bdl.inference.mcmc.schedules import check_exploration, cyclical_exploring


@register("csgld", cyclical=True, blocks=True)
def csgld(
    value_and_grad: ValueAndGrad,
    *,
    num_steps: int,
    num_cycles: int = 4,
    exploration: float = 0.8,
    temperature: float = 1.0,
) -> Kernel:
    """Cyclical SGLD (Zhang et al., 2020, Algorithm 1 with SGLD as the sampler).

    Parameters
    ----------
    value_and_grad : callable
        ``(position, minibatch) -> (Ũ, ∇Ũ)`` (supplied by the driver).
    num_steps : int
        T, the total number of steps the cycles span (set by the driver).
    num_cycles : int
        M, the number of cycles.
    exploration : float
        β in [0, 1): the fraction of each cycle that explores without noise.
    temperature : float
        T of the noise in sampling stages.

    Example
    -------
    >>> import ppl_bdl as bdl
    >>> quadratic = lambda x, batch: (0.5 * (x * x).sum(), x)
    >>> kernel = bdl.kernels.get("csgld").factory(quadratic, num_steps=100, num_cycles=2)
    >>> backend = bdl.backends.get("numpyro")
    >>> with backend.activate():
    ...     state = kernel.init(backend.asarray([0.0]))
    ...     state, info = kernel.step(bdl.random.key(0), state, None, 0.1)
    >>> float(info["exploring"])
    1.0
    """
    temperature = check_temperature(temperature)
    exploration = check_exploration(exploration)

    def init(position):
        return {"position": position, "count": bt.scalar_zero(position)}

    def step(key, state, minibatch, step_size):
        exploring = cyclical_exploring(state["count"], num_steps, num_cycles, exploration)
        noise_scale = bm.where(exploring, 0.0, temperature)
        potential, grad = value_and_grad(state["position"], minibatch)
        position = langevin_update(key, state["position"], grad, step_size, noise_scale)
        info = {
            "step_size": step_size,
            "grad_norm": bt.norm(grad),
            "potential": potential,
            "exploring": exploring * 1.0,
        }
        return {"position": position, "count": state["count"] + 1}, info

    return Kernel(init, step)


@register("csghmc", cyclical=True, blocks=True)
def csghmc(
    value_and_grad: ValueAndGrad,
    *,
    num_steps: int,
    num_cycles: int = 4,
    exploration: float = 0.8,
    friction: float | None = None,
    momentum_decay: float | None = None,
    mass=1.0,
    temperature: float = 1.0,
    noise_estimate: float = 0.0,
) -> Kernel:
    """Cyclical SGHMC (Zhang et al., 2020, with SGHMC as the sampler).

    Exploration stages are SGD with momentum (SGHMC without noise); sampling stages are SGHMC
    (see :func:`ppl_bdl.inference.mcmc.kernels.sghmc.sghmc` for ``friction``, ``momentum_decay``, ``mass``).

    Example
    -------
    >>> import ppl_bdl as bdl
    >>> quadratic = lambda x, batch: (0.5 * (x * x).sum(), x)
    >>> kernel = bdl.kernels.get("csghmc").factory(quadratic, num_steps=100, num_cycles=2)
    >>> backend = bdl.backends.get("numpyro")
    >>> with backend.activate():
    ...     state = kernel.init(backend.asarray([0.0]))
    ...     state, info = kernel.step(bdl.random.key(0), state, None, 0.1)
    >>> sorted(info)
    ['exploring', 'grad_norm', 'kinetic_energy', 'potential', 'step_size']
    """
    exploration = check_exploration(exploration)
    settings = sghmc_parameters(friction, momentum_decay, noise_estimate, temperature, mass)
    transition = make_sghmc_step(*settings, None)

    def step(key, state, minibatch, step_size):
        exploring = cyclical_exploring(state["count"], num_steps, num_cycles, exploration)
        noise = bm.where(exploring, 0.0, 1.0)
        new, info = transition(key, state, value_and_grad, minibatch, step_size, noise)
        info["exploring"] = exploring * 1.0
        return new, info

    return Kernel(sghmc_init, step)
