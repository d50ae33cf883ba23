"""SG-MCMC step sizes: a user's α_0 checked, or one chosen by a short pilot (``step_size="auto"``).

The pilot tries step sizes α_0 from a geometric grid, 1, 10^-½, 10^-1, ..., 10^-10, each in a run
of :data:`PILOT_STEPS` steps of the kernel itself (every chain from its own start, with its
minibatches and schedule), and keeps the largest that passes:

- every step's potential and gradient stay finite (the run does not stop), and
- the potential does not climb: the median of its last quarter is not above its start (the
  first step's potential, or the first quarter's median where that is lower) by more than a
  sampler at temperature T = 1 can climb, d/2 + 5 √(d/2) for d latent dimensions (from a mode,
  U rises by about d/2 as the chain fills the posterior, with standard deviation √(d/2)), plus
  three inter-quartile ranges of the first or the last quarter, the smaller (the noise of the
  minibatch estimate of U). A chain that is still settling goes down; an unstable one climbs,
  within its first few steps (the first quarter already high and spread) or without bound.

The largest step that passes is near the edge of stability (for a Gaussian posterior with
curvature λ, SGLD is stable for α λ < 2, and its stationary variance is inflated by
1 / (1 − α λ / 2)): the step size used is the one that passed times :data:`SAFETY_FACTOR` (0.1:
α λ ≤ 0.2, so the draws' spread is inflated by 5% at most on such a target, and the chain keeps a
margin where the potential is steeper than the pilot saw); pSGLD's margin is 0.01 (its
RMSprop preconditioner shrinks the steps of a chain that grows unstable, so the pilot's largest
stable step already inflates the draws: the posterior mean of the demo BNN's noise σ is 67% high
at 0.1 of it, 0.4% at 0.01; a kernel's margin is set when it is registered). Assuming
that a step size smaller than one that passes also passes, a bisection of the grid finds it in
about five pilots. The chosen value is ``post.settings["step_size"]`` and, per draw,
``sample_stats["step_size"]``.

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import dist
>>> @bdl.model
... def mean_model(y):
...     mu = bdl.sample("mu", dist.Normal(0.0, 10.0))
...     with bdl.plate("data", y.shape[0]) as idx:
...         bdl.sample("y", dist.Normal(mu, 1.0), obs=y[idx])
>>> y = np.random.default_rng(0).normal(size=1000)
>>> post = bdl.fit(mean_model(y), backend="numpyro", method="sgld", batch_size=100,
...                num_warmup=200, num_samples=200, num_chains=1, progress=False)
>>> 1e-5 < post.settings["step_size"] < 1e-2
True
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ppl_bdl.backend_protocol import Transition
from ppl_bdl.errors import ConfigError, InferenceError, RunInterrupted
from ppl_bdl.inference.loop.driver import Rates, RunPlan, run_chains
from ppl_bdl.inference.mcmc.schedules import _check_step_size

#: Steps of one pilot run.
PILOT_STEPS = 100
#: The candidate step sizes, largest first.
GRID = tuple(10.0 ** (-k / 2) for k in range(21))
#: The chosen step size is the largest that passed, times this.
SAFETY_FACTOR = 0.1


def check_step_size(step_size: Any) -> float:
    """A user's α_0: a positive finite number (or "auto", handled by the caller)."""
    if isinstance(step_size, str):
        raise ConfigError(f"step_size must be a positive number or 'auto', got {step_size!r}.")
    return _check_step_size(step_size)


def choose_step_size(
    backend,
    transition: Transition,
    positions: np.ndarray,
    data,
    batches,
    schedule: Rates,
    seed: int,
    name: str,
    margin: float = SAFETY_FACTOR,
) -> float:
    """The pilot's step size (see the module docstring) for chains starting at ``positions``
    (chain, d); ``schedule`` holds the run's schedule at α_0 = 1 (its ``unit`` and ``key``; the
    pilot's steps take its start; the pilot shares the run's compiled program, α_0 being a
    loop input); the step size used is the largest that passed times ``margin``."""
    positions = np.atleast_2d(positions)
    plan = RunPlan(np.zeros(PILOT_STEPS, bool), PILOT_STEPS, 0)
    results: dict[int, bool] = {}

    def passes(index: int) -> bool:
        if index not in results:
            run = run_chains(
                backend,
                transition,
                positions,
                seed + 7919,
                plan,
                data,
                batches,
                f"{name} step-size pilot",
                rates=schedule._replace(scale=GRID[index]),
                trace=True,
            )
            if run.failure is not None and run.failure.reason == "interrupted":
                raise RunInterrupted(
                    f"{name}'s step-size pilot (step_size='auto') was interrupted before the run "
                    "started; no draws were made (error.partial is None).",
                )
            results[index] = run.failure is None and not climbs(
                run.step_infos["potential"], positions.shape[1]
            )
        return results[index]

    if passes(0):
        return GRID[0] * margin
    low, high = 0, len(GRID) - 1  # GRID[low] fails; find the first index that passes
    if not passes(high):
        raise InferenceError(
            f"step_size='auto' found no step size for {name!r} down to {GRID[high]:.0e}: every "
            "pilot run reached a non-finite potential or gradient, or its potential grew. Check "
            "the model (priors, scales of the data) and the starting point (init=...), or pass a "
            "step_size."
        )
    while high - low > 1:
        middle = (low + high) // 2
        if passes(middle):
            high = middle
        else:
            low = middle
    return GRID[high] * margin


def climbs(potentials: np.ndarray, dim: int) -> bool:
    """Whether any chain's potential (chain, step) climbed over the pilot (module docstring)."""
    potentials = np.asarray(potentials, dtype=float)
    potentials = potentials.reshape(-1, potentials.shape[-1])
    quarter = max(1, potentials.shape[1] // 4)
    for chain in potentials:
        first, last = chain[:quarter], chain[-quarter:]
        allowance = dim / 2 + 5 * math.sqrt(dim / 2) + 3 * min(_spread(first), _spread(last))
        if np.median(last) - min(chain[0], np.median(first)) > allowance:
            return True
    return False


def _spread(potentials: np.ndarray) -> float:
    """The inter-quartile range: the minibatch noise of U where the chain is stationary."""
    q25, q75 = np.percentile(potentials, [25, 75])
    return float(q75 - q25)
