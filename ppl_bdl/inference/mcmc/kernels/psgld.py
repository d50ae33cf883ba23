"""Preconditioned SGLD with an RMSprop preconditioner (Li, Chen, Carlson and Carin, 2016).

V ← ρ V + (1 − ρ) ḡ ⊙ ḡ,  G = diag(1 / (λ + √V)),
θ ← θ − α_t G ∇Ũ(θ) + √(2 α_t T G) ε,

i.e. Li et al.'s Algorithm 1 in the step-size convention of Eq. 2.9 of "Bayesian Computation in Deep Learning" (their ε_t/2
is our α_t). The preconditioner is in the drift and in the noise; as in their experiments the
correction term Γ(θ) (derivatives of G, small when ρ is close to 1) is left out. V averages the
squared gradient of Ũ itself (Li et al. average the per-datum mean gradient, N times smaller),
so ``step_size`` acts like an RMSprop learning rate.

V starts at 0, so in the first 1/(1 − ρ) steps √V underestimates the gradient's scale (by
√(1 − ρ^t) at step t: 10x at the first step for ρ = 0.99) and G overstates it, with the injected
noise √(2 α_t G): G reads V / (1 − ρ^t), the moving average with weights that sum to 1 (the bias
correction of Kingma & Ba 2015, Algorithm 1), which is ḡ ⊙ ḡ at the first step.
"""

from __future__ import annotations

from ppl_bdl.dsl import math as bm
from ppl_bdl.errors import ConfigError
from ppl_bdl.inference.mcmc import blocks as bt
from ppl_bdl.inference.mcmc.kernels.base import Kernel, ValueAndGrad
from ppl_bdl.inference.mcmc.kernels.registry import register
from ppl_bdl.inference.mcmc.kernels.sgld import check_temperature


@register("psgld", blocks=True, pilot_margin=0.01)
def psgld(
    value_and_grad: ValueAndGrad,
    temperature: float = 1.0,
    decay: float = 0.99,
    epsilon: float = 1e-5,
) -> Kernel:
    """RMSprop-preconditioned SGLD (Li et al., 2016, Algorithm 1).

    Parameters
    ----------
    value_and_grad : callable
        ``(position, minibatch) -> (Ũ, ∇Ũ)`` (supplied by the driver).
    temperature : float
        T scales the injected noise.
    decay : float
        ρ in [0, 1), the RMSprop moving-average weight of squared gradients (0.99).
    epsilon : float
        λ > 0, added to √V so the preconditioner stays bounded (1e-5).

    Example
    -------
    >>> import ppl_bdl as bdl
    >>> quadratic = lambda x, batch: (0.5 * (x * x).sum(), x)
    >>> kernel = bdl.kernels.get("psgld").factory(quadratic)
    >>> backend = bdl.backends.get("numpyro")
    >>> with backend.activate():
    ...     state = kernel.init(backend.asarray([1.0, -1.0]))
    ...     state, info = kernel.step(bdl.random.key(0), state, None, 1e-3)
    >>> sorted(state)
    ['count', 'position', 'square_avg']
    """
    temperature = check_temperature(temperature)
    if not isinstance(decay, int | float) or not 0.0 <= decay < 1.0:
        raise ConfigError(f"decay (ρ of RMSprop) must be in [0, 1), got {decay!r}.")
    if not isinstance(epsilon, int | float) or not epsilon > 0:
        raise ConfigError(f"epsilon (λ of pSGLD) must be > 0, got {epsilon!r}.")

    def init(position):
        return {
            "position": position,
            "square_avg": bt.zeros_like(position),
            "count": bt.scalar_zero(position),
        }

    def step(key, state, minibatch, step_size):
        position = state["position"]
        potential, grad = value_and_grad(position, minibatch)
        square_avg = bt.tree_map(
            lambda v, g: decay * v + (1.0 - decay) * g * g, state["square_avg"], grad
        )
        count = state["count"] + 1
        correction = 1.0 - decay**count  # V's weights sum to this (Kingma & Ba 2015, Alg. 1)
        precond = bt.tree_map(lambda v: 1.0 / (epsilon + bm.sqrt(v / correction)), square_avg)
        noise = bt.normal_like(key, position)

        def update(p, g, e, c):
            return p - step_size * c * g + bm.sqrt(2.0 * step_size * temperature * c) * e

        position = bt.tree_map(update, position, grad, noise, precond)
        info = {
            "step_size": step_size,
            "grad_norm": bt.norm(grad),
            "potential": potential,
            "preconditioner_mean": bt.mean(precond),
        }
        return {"position": position, "square_avg": square_avg, "count": count}, info

    return Kernel(init, step)
