"""A Gaussian mixture whose assignments are discrete latent sites, summed out by the backend.

``z[i] ~ Categorical(weights)``, ``y[i] ~ Normal(locs[z[i]], scale)``. ``fit`` marginalises
``z`` (NUTS, HMC, VI and full-batch SG-MCMC see only ``weights``, ``locs`` and ``scale``) and
draws it afterwards from p(z | θ, y), so ``post.samples["z"]`` holds one assignment per point
and draw. The components are told apart by their priors (``prior_locs``, in increasing order),
which keeps the posterior from switching labels.

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl.models import mixture
>>> y = np.array([-2.1, -1.9, -2.3, 2.0, 2.2])
>>> bound = mixture.gaussian_mixture(y, np.array([-2.0, 2.0]))
>>> from ppl_bdl.inference.common import prepare
>>> setup = prepare(bound, "numpyro", "float32", seed=0)
>>> setup.layout.names, setup.layout.discrete   # z is summed out, then drawn after the fit
(['weights', 'locs', 'scale'], ['z'])
"""

from __future__ import annotations

from typing import Any

import numpy as np

import ppl_bdl as bdl
from ppl_bdl import dist


@bdl.model
def gaussian_mixture(y, prior_locs, prior_scale: float = 2.0):
    """K = len(prior_locs) components: ``weights ~ Dirichlet(1)``,
    ``locs[k] ~ Normal(prior_locs[k], prior_scale)``, ``scale ~ HalfNormal(2)``; per point
    ``z ~ Categorical(weights)`` (enumerated), ``y ~ Normal(locs[z], scale)``."""
    num_components = prior_locs.shape[0]
    weights = bdl.sample("weights", dist.Dirichlet(np.ones(num_components)))
    locs = bdl.sample("locs", dist.Normal(prior_locs, prior_scale))
    scale = bdl.sample("scale", dist.HalfNormal(2.0))
    with bdl.plate("data", y.shape[0]) as idx:
        z = bdl.sample("z", dist.Categorical(probs=weights))
        bdl.sample("y", dist.Normal(locs[z], scale), obs=y[idx])


def simulate(num_points: int, weights, locs, scale: float, seed: int = 0) -> np.ndarray:
    """Points from the mixture (for examples and tests)."""
    rng = np.random.default_rng(seed)
    z = rng.choice(len(weights), size=num_points, p=np.asarray(weights))
    return np.asarray(locs)[z] + scale * rng.normal(size=num_points)


def examples() -> dict[str, Any]:
    """A small mixture for the conformance suite."""
    y = simulate(10, [0.5, 0.5], [-2.0, 2.0], 0.7, seed=3)
    return {"gaussian_mixture": gaussian_mixture(y, np.array([-2.0, 2.0]))}
