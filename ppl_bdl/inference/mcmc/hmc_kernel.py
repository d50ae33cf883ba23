"""Hamiltonian Monte Carlo written in the core: a diagonal-mass leapfrog and its Metropolis step.

This kernel is the one ``bdl.HMC`` runs: with Stan's warmup adaptation
(:mod:`~ppl_bdl.inference.mcmc.hmc_warmup`), or as ``bdl.HMC(adapt="elbo")``
tunes (:mod:`~ppl_bdl.inference.mcmc.elbo_tuning`) and then samples with: its step takes its
noise as arguments (:func:`hmc_move`), so the same code is differentiated with respect to the
step size and mass (the tuning objective) and driven by the core's loop (:func:`hmc_transition`).

One move (Neal 2011, Sec. 5.3.2-5.3.3): draw a momentum p ~ N(0, M), M⁻¹ the inverse mass (a
vector: diagonal; a matrix: dense); run ``num_steps`` leapfrog steps of size ε on H(z, p) = U(z) + ½ pᵀ M⁻¹ p;
accept the end point with probability min(1, exp(−ΔH)). Each move costs ``num_steps`` gradients
of the potential (the gradient at the end of one leapfrog step is the start of the next).

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl.inference.mcmc.hmc_kernel import hmc_move
>>> backend = bdl.backends.get("numpyro")
>>> def potential_and_grad(z):  # a standard normal
...     return 0.5 * (z * z).sum(), z
>>> with backend.activate():
...     z = backend.asarray(np.ones(2))
...     state = (z, *potential_and_grad(z))
...     move, info = hmc_move(backend, potential_and_grad, state, backend.asarray(np.zeros(2)),
...                           backend.asarray(-1.0), backend.asarray(0.1),
...                           backend.asarray(np.ones(2)), num_steps=5)
>>> bool(info["accepted"]), round(float(info["acceptance_rate"]), 3)
(True, 1.0)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ppl_bdl.backend_protocol import Batch, Transition

#: Leapfrog steps per HMC draw when ``num_steps`` is not given (NumPyro's and Pyro's default).
DEFAULT_LEAPFROG_STEPS = 10
#: An energy error above this marks a divergent trajectory (NumPyro's and Stan's threshold).
DIVERGENCE_THRESHOLD = 1000.0


def velocity(m, inverse_mass, momentum):
    """dz/dt = M⁻¹ p, for a diagonal inverse mass (a vector or a number) or a dense one (a
    matrix)."""
    if not _dense(inverse_mass):
        return inverse_mass * momentum
    return m.matmul(inverse_mass, momentum)


def _dense(inverse_mass) -> bool:
    return len(getattr(inverse_mass, "shape", ())) == 2


def draw_momentum(m, inverse_mass, noise):
    """A momentum p ~ N(0, M) from ξ ~ N(0, I): ξ / √m for a diagonal inverse mass m; for a
    dense one Σ = L Lᵀ, p = L⁻ᵀ ξ (its covariance L⁻ᵀ L⁻¹ = Σ⁻¹ = M)."""
    if not _dense(inverse_mass):
        return noise / m.sqrt(inverse_mass)
    root = m.cholesky(inverse_mass)
    return m.triangular_solve(m.transpose(root), noise[:, None], lower=False)[:, 0]


def leapfrog(
    backend,
    potential_and_grad: Callable,
    state: tuple,
    momentum,
    step_size,
    inverse_mass,
    num_steps: int,
):
    """``num_steps`` leapfrog steps of size ``step_size`` from ``state`` = (z, U(z), ∇U(z)) and
    ``momentum``; the end (z, U, ∇U) and momentum. Written with the backend's ``fori_loop`` (one
    loop in the compiled program on JAX, reverse-differentiable: its trip count is fixed)."""

    def body(_, carry):
        z, p, _u, g = carry
        p = p - 0.5 * step_size * g
        z = z + step_size * velocity(backend.math, inverse_mass, p)
        u, g = potential_and_grad(z)
        p = p - 0.5 * step_size * g
        return (z, p, u, g)

    z, p, u, g = backend.fori_loop(num_steps, body, (state[0], momentum, state[1], state[2]))
    return (z, u, g), p


def hmc_move(
    backend,
    potential_and_grad: Callable,
    state: tuple,
    momentum_noise,
    log_uniform,
    step_size,
    inverse_mass,
    num_steps: int,
) -> tuple[tuple, dict]:
    """One HMC move from ``state`` = (z, U(z), ∇U(z)) with its noise given: ``momentum_noise``
    ξ ~ N(0, I) (the momentum is ξ / √m) and ``log_uniform`` = log u, u ~ U(0, 1) (accept when
    log u < −ΔH). The new state and the info (``accepted``, ``acceptance_rate`` = min(1,
    exp(−ΔH)), ``diverging``, ``energy``).

    The accept decision is a boolean that selects the proposal or the current state: a gradient
    of the new state flows through the selected one and never through the decision (the
    accept/reject step as a stop-gradient mask, as Campbell et al. 2021 treat it)."""
    m = backend.math
    momentum = draw_momentum(m, inverse_mass, momentum_noise)
    energy = state[1] + 0.5 * m.sum(momentum * velocity(m, inverse_mass, momentum))
    proposal, p = leapfrog(
        backend, potential_and_grad, state, momentum, step_size, inverse_mass, num_steps
    )
    new_energy = proposal[1] + 0.5 * m.sum(p * velocity(m, inverse_mass, p))
    error = new_energy - energy
    error = m.where(m.isfinite(error), error, m.zeros_like(error) + float("inf"))
    accepted = log_uniform < -error
    new = tuple(m.where(accepted, a, b) for a, b in zip(proposal, state, strict=True))
    info = {
        "accepted": accepted,
        "acceptance_rate": m.exp(m.minimum(-error, m.zeros_like(error))),
        "diverging": error > DIVERGENCE_THRESHOLD,
        "energy": m.where(accepted, new_energy, energy),
    }
    return new, info


def hmc_transition(
    backend,
    potential_and_grad: Callable,
    step_size: float,
    inverse_mass: Any,
    num_steps: int,
) -> Transition:
    """HMC with a fixed step size, diagonal inverse mass and number of leapfrog steps as a
    :class:`~ppl_bdl.backend_protocol.Transition` of the core's loop: state (z, U, ∇U), noise
    drawn from the step's key; ``potential_and_grad(z, batch)``. Info as NUTS
    gives it (``acceptance_rate``, ``diverging``, ``n_steps``, ``step_size``, ``lp``,
    ``energy``); ``emit``: the position.

    Example
    -------
    >>> import numpy as np, ppl_bdl as bdl
    >>> from ppl_bdl.inference.mcmc.hmc_kernel import hmc_transition
    >>> backend = bdl.backends.get("numpyro")
    >>> kernel = hmc_transition(backend, lambda z, batch: (0.5 * (z * z).sum(), z), 0.3,
    ...                         np.ones(2), num_steps=5)
    >>> with backend.activate():
    ...     state = kernel.init(None, backend.asarray(np.zeros(2)), None)
    ...     state, info = kernel.step(backend.random.key(0), state, None, None)
    >>> sorted(info)
    ['acceptance_rate', 'diverging', 'energy', 'lp', 'n_steps', 'step_size']
    """
    with backend.scope():
        eps = backend.asarray(float(step_size))
        mass = backend.asarray(inverse_mass)

    def init(key, position, data):
        del key
        return (position, *potential_and_grad(position, Batch(data, None)))

    def step(key, state, batch, rate):
        del rate
        return random_move(
            backend, lambda z: potential_and_grad(z, batch), state, key, eps, mass, num_steps
        )

    return Transition(init, step, lambda state: state[0])


def random_move(backend, potential_and_grad, state, key, step_size, inverse_mass, num_steps):
    """:func:`hmc_move` with its noise drawn from ``key`` (the momentum, the acceptance's
    uniform); the new state and the info as NUTS gives it (``acceptance_rate``, ``diverging``,
    ``energy``, ``n_steps``, ``step_size``, ``lp``)."""
    random = backend.random
    noise_key, accept_key = random.split(key)
    new, info = hmc_move(
        backend,
        potential_and_grad,
        state,
        random.normal(noise_key, state[0].shape),
        backend.math.log(random.uniform(accept_key, (), 0.0, 1.0)),
        step_size,
        inverse_mass,
        num_steps,
    )
    del info["accepted"]
    info.update(n_steps=num_steps + 0 * step_size, step_size=step_size, lp=-new[1])
    return new, info
