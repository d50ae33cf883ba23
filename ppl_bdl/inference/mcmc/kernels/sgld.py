"""Stochastic gradient Langevin dynamics (Welling and Teh, 2011; Eq. 2.9 of "Bayesian Computation in Deep Learning").

θ_{t+1} = θ_t − α_t ∇Ũ(θ_t) + √(2 α_t T) ε_t,  ε_t ~ N(0, I),

where Ũ is the minibatch potential of Eq. 2.8 and T the temperature (T = 1 samples the posterior,
T < 1 a "cold" posterior p(θ | D)^(1/T)).
"""

from __future__ import annotations

from ppl_bdl.dsl import math as bm
from ppl_bdl.errors import ConfigError
from ppl_bdl.inference.mcmc import blocks as bt
from ppl_bdl.inference.mcmc.kernels.base import Kernel, ValueAndGrad
from ppl_bdl.inference.mcmc.kernels.registry import register


def check_temperature(temperature) -> float:
    if isinstance(temperature, bool) or not isinstance(temperature, int | float) or temperature < 0:
        raise ConfigError(
            f"temperature must be a number >= 0, got {temperature!r} (1 samples the posterior, "
            "values below 1 a cold posterior, 0 is plain SGD)."
        )
    return float(temperature)


def langevin_update(key, position, grad, step_size, noise_scale):
    """θ − α g + √(2 α s) ε: the update SGLD and its variants share (s scales the noise); each
    of them an array or a tuple of blocks (:mod:`ppl_bdl.inference.mcmc.blocks`), ε one flat draw split."""
    noise = bt.normal_like(key, position)
    scale = bm.sqrt(2.0 * step_size * noise_scale)
    return bt.tree_map(lambda p, g, e: p - step_size * g + scale * e, position, grad, noise)


@register("sgld", blocks=True)
def sgld(value_and_grad: ValueAndGrad, temperature: float = 1.0) -> Kernel:
    """SGLD (Welling and Teh, 2011): θ ← θ − α_t ∇Ũ(θ) + √(2 α_t T) ε (Eq. 2.9 of "Bayesian Computation in Deep Learning").

    Parameters
    ----------
    value_and_grad : callable
        ``(position, minibatch) -> (Ũ, ∇Ũ)`` (supplied by the driver).
    temperature : float
        T in the noise √(2 α_t T); 1 for the posterior, < 1 for a cold posterior.

    Example
    -------
    >>> import ppl_bdl as bdl
    >>> quadratic = lambda x, batch: (0.5 * (x * x).sum(), x)
    >>> kernel = bdl.kernels.get("sgld").factory(quadratic, temperature=1.0)
    >>> backend = bdl.backends.get("numpyro")
    >>> with backend.activate():
    ...     state = kernel.init(backend.asarray([0.0, 0.0]))
    ...     state, info = kernel.step(bdl.random.key(0), state, None, 0.01)
    >>> sorted(info)
    ['grad_norm', 'potential', 'step_size']
    """
    temperature = check_temperature(temperature)

    def init(position):
        return {"position": position}

    def step(key, state, minibatch, step_size):
        potential, grad = value_and_grad(state["position"], minibatch)
        position = langevin_update(key, state["position"], grad, step_size, temperature)
        info = {"step_size": step_size, "grad_norm": bt.norm(grad), "potential": potential}
        return {"position": position}, info

    return Kernel(init, step)
