"""Replica exchange SG-MCMC (Deng et al. 2020): a ladder of tempered SGLD or SGHMC replicas that
swap neighbours' states.

Replica k of a ladder runs the kernel on the tempered target exp(−U(θ)/τ_k), τ_0 = 1 < τ_1 < ...:
the SGLD and SGHMC updates with their injected noise scaled by τ_k (the tempered Langevin
dynamics of Deng et al. 2020, Sec. 2),

    θ ← θ − η ∇Ũ(θ) + √(2 η τ_k) ε                                       (SGLD)
    v ← (1 − α) v − η ∇Ũ(θ) + N(0, 2 (α − β̂) η τ_k),  θ ← θ + v          (SGHMC)

At a swap step the neighbours (k, k + 1) of the even pairs (0, 1), (2, 3), ... or of the odd
pairs (1, 2), (3, 4), ..., in turn (deterministic even-odd swaps, Okabe et al. 2001: the pairs
of one turn share no replica, so they are decided at once), exchange their states with
probability

    min(1, exp(Δβ_k (Ũ_k − Ũ_{k+1} − Δβ_k σ̂²_k / (2F)))),   Δβ_k = 1/τ_k − 1/τ_{k+1},

where Ũ_k is the potential at replica k's position on the step's minibatch, scaled to the whole
data. Without the correction term this is the Metropolis ratio of the product of the tempered
targets (exact on a full batch). On a minibatch Ũ_k − Ũ_{k+1} is noisy; Deng et al. (2020,
Sec. 3) take it as normal with variance σ²_k, and then exp(Δβ (Ũ_k − Ũ_{k+1}) − Δβ² σ²_k / 2) is
an unbiased estimate of the exact ratio's exp(Δβ (U_k − U_{k+1})): the corrected swap rate above
with F = 1. A correction factor F > 1 shrinks the correction (more swaps, some bias), as in
their experiments. σ̂²_k is estimated from the step's minibatch itself (see
:func:`difference_variance`).

A swap moves the positions, and the SGHMC velocities with them, each velocity rescaled by
√(τ_to / τ_from): a velocity in equilibrium at τ_from, N(0, η τ_from) per coordinate, is then in
equilibrium at its new temperature, the map has unit Jacobian and the kinetic energies cancel
from the acceptance ratio, which reads the potentials alone. The temperatures stay in their
slots, so slot 0 always holds the temperature-1 chain: the posterior's draws.

The ladder's positions are one (K, d) array: K replicas side by side in one step, their
potentials and gradients from one vectorised evaluation (``energies``, supplied by the driver).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ppl_bdl.dsl import math as bm
from ppl_bdl.dsl import random as br
from ppl_bdl.errors import ConfigError
from ppl_bdl.inference.mcmc.kernels.base import Kernel
from ppl_bdl.inference.mcmc.kernels.sghmc import make_sghmc_step
from ppl_bdl.inference.mcmc.kernels.sgld import langevin_update

#: ``energies(positions, minibatch) -> ((Σ_k Ũ_k, (Ũ, σ̂²)), ∇Ũ)``: at the ladder's positions
#: (K, d), the potentials Ũ (K,) and their sum, the estimated variances σ̂² (K − 1,) of the
#: neighbours' differences Ũ_k − Ũ_{k+1} (zeros on a full batch) and the gradients (K, d).
Energies = Callable[[Any, Any], tuple[Any, Any]]


def check_temperatures(temperatures: Any, where: str) -> tuple[float, ...]:
    """The ladder τ_0 = 1 < τ_1 < ... < τ_{K−1}, at least two, all finite; ``where`` names the
    option in the error (``"ReSGLD(temperatures=...)"``)."""
    if isinstance(temperatures, str) or not isinstance(temperatures, tuple | list):
        raise ConfigError(
            f"{where}: temperatures must be a tuple of numbers, the ladder τ_0 = 1.0 < τ_1 < ... "
            "(e.g. (1.0, 2.0, 4.0, 8.0))."
        )
    numbers = all(
        isinstance(t, int | float) and not isinstance(t, bool) and np.isfinite(t)
        for t in temperatures
    )
    values = tuple(float(t) for t in temperatures) if numbers else ()
    if (
        not numbers
        or len(values) < 2
        or values[0] != 1.0
        or any(b <= a for a, b in zip(values, values[1:], strict=False))
    ):
        raise ConfigError(
            f"{where}: temperatures must be at least two finite numbers, starting at 1.0 (the "
            "posterior's chain) and strictly increasing, e.g. (1.0, 2.0, 4.0, 8.0)."
        )
    return values


def swap_log_ratios(energies, betas, variances, factor: float):
    """log of the swap rate of each neighbour pair (k, k + 1), shape (K − 1,): Δβ_k (Ũ_k −
    Ũ_{k+1} − Δβ_k σ̂²_k / (2F)) (the module docstring; F = ``factor``). ``betas`` are 1/τ."""
    dbeta = betas[:-1] - betas[1:]
    return dbeta * (energies[:-1] - energies[1:] - dbeta * variances / (2.0 * factor))


def swap_plan(log_ratios, uniforms, active):
    """Which pairs swap: ``log u < log ratio`` on the ``active`` pairs (0/1 floats, pairs
    sharing no replica), as 0/1 floats (K − 1,); and each slot's source, as the masks ``up``
    (slot j takes slot j + 1's state) and ``down`` (slot j takes slot j − 1's), (K,) each."""
    accept = bm.where(bm.log(uniforms) < log_ratios, active, 0.0 * active)
    zero = bm.zeros_like(accept[:1])
    return accept, bm.concatenate([accept, zero]), bm.concatenate([zero, accept])


def permute(rows, up, down, scale_next=None, scale_prev=None):
    """``rows`` (K, ...) with the swapped slots' rows exchanged: slot j takes row j + 1 (times
    ``scale_next[j]``, if given) where ``up[j]``, row j − 1 (times ``scale_prev[j]``) where
    ``down[j]``."""
    shape = (-1,) + (1,) * (len(rows.shape) - 1)
    following = bm.concatenate([rows[1:], rows[-1:]])
    preceding = bm.concatenate([rows[:1], rows[:-1]])
    if scale_next is not None:
        following = following * bm.reshape(scale_next, shape)
        preceding = preceding * bm.reshape(scale_prev, shape)
    up, down = bm.reshape(up, shape) > 0, bm.reshape(down, shape) > 0
    return bm.where(up, following, bm.where(down, preceding, rows))


def difference_variance(points, scale: float, fraction: float):
    """σ̂² of each neighbours' Ũ_k − Ũ_{k+1} from the minibatch's per-point log densities
    ``points`` (K, B) at the K positions: the minibatch is a simple random sample without
    replacement of B of the N points, and Ũ_k − Ũ_{k+1} is −N times the mean of the per-point
    differences d_i = log p(x_i | θ_k) − log p(x_i | θ_{k+1}) (plus the prior's difference,
    exact), so its variance is N² (1 − B/N) S²_d / B, estimated with the sample variance s²_d of
    the B differences (Cochran 1977, Sec. 2.4-2.5, the variance of an estimated total).
    ``scale`` = N² / B, ``fraction`` = B / N."""
    return scale * (1.0 - fraction) * bm.var(points[:-1] - points[1:], axis=-1, ddof=1)


def active_pairs(count, swap_every: int, num: int):
    """The pairs (k, k + 1) proposed at step ``count`` (0/1 floats, (K − 1,)): none between
    swap turns; at turn n (every ``swap_every``-th step) the even pairs if n is even, else the
    odd ones."""
    turn = bm.floor(count / swap_every)
    on_time = bm.where(count - turn * swap_every < 0.5, 1.0, 0.0)
    parity = turn - 2.0 * bm.floor(turn / 2.0)
    return on_time * bm.where(bm.asarray(np.arange(num - 1) % 2) == parity, 1.0, 0.0)


def make_swap(taus: np.ndarray, swap_every: int, factor: float, momentum: bool):
    """A ladder's swap move ``swap(key, state, Ũ, σ̂², ∇Ũ) -> (state, Ũ, ∇Ũ)``: the state with
    the swapped slots' positions (and velocities, rescaled to their new temperatures) exchanged
    and the swaps counted, and the potentials and gradients that moved with them."""
    num = len(taus)
    # A velocity moving down (from slot j + 1 to j) or up (from j − 1 to j) is rescaled.
    from_next = np.sqrt(taus / np.append(taus[1:], taus[-1]))
    from_prev = np.sqrt(taus / np.insert(taus[:-1], 0, taus[0]))

    def swap(key, state, potentials, variances, grads):
        active = active_pairs(state["count"], swap_every, num)
        log_ratios = swap_log_ratios(potentials, bm.asarray(1.0 / taus), variances, factor)
        accept, up, down = swap_plan(log_ratios, br.uniform(key, (num - 1,)), active)
        moved = {**state, "position": permute(state["position"], up, down)}
        if momentum:
            scale_next, scale_prev = bm.asarray(from_next), bm.asarray(from_prev)
            moved["velocity"] = permute(state["velocity"], up, down, scale_next, scale_prev)
        moved["swaps_proposed"] = state["swaps_proposed"] + active
        moved["swaps_accepted"] = state["swaps_accepted"] + accept
        return moved, permute(potentials, up, down), permute(grads, up, down)

    return swap


def replica_exchange(
    energies: Energies,
    temperatures: tuple[float, ...],
    kind: str = "sgld",
    swap_every: int = 1,
    correction_factor: float = 1.0,
    sghmc_settings: tuple | None = None,
) -> Kernel:
    """The ladder kernel: ``init(positions (K, d))`` and ``step(key, state, minibatch,
    step_size)`` (the module docstring). ``kind``: "sgld" or "sghmc" (then ``sghmc_settings``,
    the checked ``sghmc_parameters`` at temperature 1); the state counts each pair's proposed
    and accepted swaps (``swaps_proposed``, ``swaps_accepted``); the info is the temperature-1
    replica's.

    Example
    -------
    >>> import ppl_bdl as bdl
    >>> from ppl_bdl import math as bm
    >>> def energies(x, batch):  # U(θ) = θ²/2 at each replica; no minibatch noise
    ...     u = 0.5 * bm.sum(x * x, axis=-1)
    ...     return (bm.sum(u), (u, bm.zeros_like(u[1:]))), x
    >>> kernel = replica_exchange(energies, (1.0, 2.0, 4.0))
    >>> backend = bdl.backends.get("numpyro")
    >>> with backend.activate():
    ...     state = kernel.init(backend.asarray([[0.0], [1.0], [2.0]]))
    ...     state, info = kernel.step(bdl.random.key(0), state, None, 0.01)
    >>> tuple(state["position"].shape), sorted(info)
    ((3, 1), ['grad_norm', 'potential', 'step_size'])
    """
    if kind not in ("sgld", "sghmc"):
        raise ConfigError(f"replica exchange runs 'sgld' or 'sghmc', got kind={kind!r}.")
    taus = np.asarray(temperatures, dtype=float)
    num = len(taus)
    momentum = kind == "sghmc"
    swap = make_swap(taus, swap_every, correction_factor, momentum)
    sghmc_step, mass = None, 1.0
    if momentum:  # a diagonal mass (one per coordinate) is the same in every replica's row
        *settings, mass = sghmc_settings
        mass_per_row = mass if isinstance(mass, float) else np.tile(mass, num)
        sghmc_step = make_sghmc_step(*settings, mass_per_row, None)

    def init(positions):
        if not isinstance(mass, float) and len(mass) != positions.shape[-1]:
            raise ConfigError(
                f"mass has {len(mass)} entries, but the position has {positions.shape[-1]} "
                "unconstrained coordinates: pass one mass per coordinate, or a number."
            )
        state = {"position": positions, "count": bm.sum(positions[0, :1] * 0.0)}
        if momentum:
            state["velocity"] = bm.zeros_like(positions)
        zeros = bm.zeros_like(positions[1:, 0])
        return {**state, "swaps_proposed": zeros, "swaps_accepted": zeros}

    def step(key, state, minibatch, step_size):
        key_swap, key_noise = br.split(key)
        (_, (potentials, variances)), grads = energies(state["position"], minibatch)
        state, potentials, grads = swap(key_swap, state, potentials, variances, grads)
        noise_scale = bm.reshape(bm.asarray(taus), (num, 1))  # τ_k: the tempered noise
        if momentum:
            inner = {k: state[k] for k in ("position", "velocity", "count")}
            new, _ = sghmc_step(
                key_noise, inner, lambda *_: (None, grads), minibatch, step_size, noise_scale
            )
            state = {**state, **new}
        else:
            position = langevin_update(key_noise, state["position"], grads, step_size, noise_scale)
            state = {**state, "position": position, "count": state["count"] + 1.0}
        info = {"step_size": step_size, "grad_norm": bm.norm(grads[0]), "potential": potentials[0]}
        return state, info

    return Kernel(init, step)
