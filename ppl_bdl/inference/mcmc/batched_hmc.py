"""Metropolis-adjusted HMC over a batch of independent targets, one chain per row, with its noise
given: the refinement of an amortized guide's draws (:mod:`ppl_bdl.inference.vi.guides.amortized_refine`).

Row r runs its own chain on log π_r(u) = log p_r(loc_r + scale_r ⊙ u), from u_0 = (z_0 − loc) / scale:
the chain moves in the coordinates the per-row affine map standardises (an affine map leaves the
target in z invariant, so z_T = loc + scale ⊙ u_T has the law the chain gives in u; its effect
is HMC in z with the mass matrix diag(scale⁻²), one step size fitting rows of any scale). One
step draws a momentum p ~ N(0, I), runs ``leapfrog`` leapfrog steps of size ε (Neal 2011,
Eq. 5.18-5.20) and accepts the end point with probability min(1, exp(−ΔH)) (Neal 2011,
Section 5.3.2; Duane et al. 1987), row by row: each row's chain leaves its own π_r invariant.
Each row's ε is drawn afresh at each step, uniformly within ±20% of the step size given (Neal
2011, Section 5.4.2.2): a fixed ε and number of leapfrog steps can return near the start along
some direction of a Gaussian-like target every time (a trajectory near one period), and such a
chain then mixes there barely at all.
One leapfrog step is the Metropolis-adjusted Langevin algorithm (MALA; Roberts & Tweedie 1996):
the proposal u + (ε²/2) ∇log π(u) + ε ξ, with the same acceptance (Neal 2011, Section 5.5.3).

The noise is an input (standard normal, (T, R, d + 4)): the momentum, then two pairs of normals e
whose −(e₁² + e₂²)/2 is the log of a Uniform(0, 1) (e₁² + e₂² is χ²₂, twice an Exp(1)): the
acceptance's uniform and the step size's jitter; so a traced step draws nothing.

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl.inference.mcmc.batched_hmc import hmc_chains
>>> backend = bdl.backends.get("numpyro")
>>> with backend.activate():
...     m = backend.math
...     log_density = lambda z: -0.5 * m.sum((z - 3.0) ** 2, axis=-1)  # N(3, I) per row
...     ones = backend.asarray(np.ones((1000, 1)))
...     noise = backend.random.normal(backend.random.key(0), (20, 1000, 5))
...     z, accept = hmc_chains(log_density, 0.0 * ones, ones, 0.0 * ones, noise, 0.5, 3, backend)
>>> z = np.asarray(z)
>>> bool(abs(z.mean() - 3.0) < 0.15), bool(abs(z.std() - 1.0) < 0.15), bool(float(accept) > 0.8)
(True, True, True)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ppl_bdl.inference.mcmc.hmc_kernel import leapfrog as leapfrog_steps

#: Each step's ε is uniform on step_size · [1 − JITTER, 1 + JITTER].
JITTER = 0.2
#: Standard normals per row and step beyond the momentum's: the acceptance's, the jitter's.
EXTRA_NORMALS = 4


def hmc_chains(
    log_density: Callable,
    loc,
    scale,
    z0,
    noise,
    step_size,
    leapfrog: int,
    backend,
) -> tuple[Any, Any]:
    """T Metropolis-adjusted HMC steps of R independent chains (see the module docstring).

    Parameters
    ----------
    log_density : callable
        ``z (R, d) -> log p_r(z_r) (R,)``, the rows' unnormalised log densities, each row's
        value depending on its own row of z only (its gradient is taken of their sum).
    loc, scale : array (R, d)
        The affine map z = loc + scale ⊙ u the chains run in (constants).
    z0 : array (R, d)
        The starting points.
    noise : array (T, R, d + 4)
        Standard normal noise of the T steps.
    step_size : float or scalar array
        ε, in the standardised coordinates u.
    leapfrog : int
        Leapfrog steps per HMC step (1: MALA).
    backend : Backend

    Returns
    -------
    (z_T (R, d), the mean acceptance probability over the rows and steps, a scalar)
    """
    m = backend.math
    d = int(z0.shape[-1])
    steps = int(noise.shape[0])

    def log_target(u):
        per_row = log_density(loc + scale * u)
        return m.sum(per_row), per_row

    value_and_grad = backend.value_and_grad(log_target, has_aux=True)

    def evaluate(u):
        (_, per_row), grad = value_and_grad(u)
        return per_row, grad

    def potential(u):  # U = −log π, for the shared leapfrog
        log_p, grad = evaluate(u)
        return -log_p, -grad

    def transition(t, carry):
        u, log_p, grad, accept_sum = carry
        momentum, accept_normals, jitter_normals = (
            noise[t][:, :d],
            noise[t][:, d : d + 2],
            noise[t][:, d + 2 :],
        )
        jitter = m.exp(-0.5 * m.sum(jitter_normals * jitter_normals, axis=-1, keepdims=True))
        step = step_size * (1.0 + JITTER * (2.0 * jitter - 1.0))  # (R, 1)
        (u_new, neg_log_p_new, neg_grad_new), p_new = leapfrog_steps(
            backend, potential, (u, -log_p, -grad), momentum, step, 1.0, leapfrog
        )
        log_p_new, grad_new = -neg_log_p_new, -neg_grad_new
        # log of the acceptance ratio: −H(end) + H(start), H = −log π(u) + |p|²/2
        delta = (log_p_new - 0.5 * m.sum(p_new * p_new, axis=-1)) - (
            log_p - 0.5 * m.sum(momentum * momentum, axis=-1)
        )
        delta = m.where(m.isfinite(delta), delta, m.zeros_like(delta) - np.inf)
        log_uniform = -0.5 * m.sum(accept_normals * accept_normals, axis=-1)
        accept = m.expand_dims(log_uniform < delta, -1)
        u = m.where(accept, u_new, u)
        grad = m.where(accept, grad_new, grad)
        log_p = m.where(accept[:, 0], log_p_new, log_p)
        accept_sum = accept_sum + m.mean(m.exp(m.minimum(delta, m.zeros_like(delta))))
        return u, log_p, grad, accept_sum

    u0 = (z0 - loc) / scale
    log_p0, grad0 = evaluate(u0)
    zero = m.sum(m.zeros_like(log_p0))
    u, _, _, accept_sum = backend.fori_loop(steps, transition, (u0, log_p0, grad0, zero))
    return loc + scale * u, accept_sum / max(steps, 1)


__all__ = ["hmc_chains"]
