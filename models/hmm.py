"""A hidden Markov model with Gaussian emissions, written with ``bdl.scan``; its states are
discrete latent sites summed out by the backend (the forward algorithm's cost, O(T K²)).

The chain starts in state 0 before the first observation: ``z[0] ~ Categorical(trans[0])``,
``z[t] ~ Categorical(trans[z[t-1]])``, ``y[t] ~ Normal(locs[z[t]], scale)``. The posterior holds
one draw of the state path per draw of the parameters (``post.samples["z"]``, shape
(chain, draw, time)), drawn by forward filtering, backward sampling.

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl.models import hmm
>>> y = np.array([-1.1, -0.8, -1.2, 1.0, 0.9, 1.3])
>>> from ppl_bdl.trace.layout import trace_model
>>> sites = trace_model(hmm.gaussian_hmm(y, np.array([-1.0, 1.0])), bdl.backends.get("numpyro"))
>>> sites["z"].value.shape, sites["trans"].value.shape   # one state per step; K x K
((6,), (2, 2))
"""

from __future__ import annotations

from typing import Any

import numpy as np

import ppl_bdl as bdl
from ppl_bdl import dist


@bdl.model
def gaussian_hmm(y, prior_locs, prior_scale: float = 1.0):
    """K = len(prior_locs) states: rows ``trans[k] ~ Dirichlet(1)``,
    ``locs[k] ~ Normal(prior_locs[k], prior_scale)``, ``scale ~ HalfNormal(1)``; then the chain
    of states (enumerated) and the observations, one step of ``bdl.scan`` per time point."""
    num_states = prior_locs.shape[0]
    with bdl.plate("state", num_states):
        trans = bdl.sample("trans", dist.Dirichlet(np.ones(num_states)))
    locs = bdl.sample("locs", dist.Normal(prior_locs, prior_scale))
    scale = bdl.sample("scale", dist.HalfNormal(1.0))

    def step(z_prev, y_t):
        z = bdl.sample("z", dist.Categorical(probs=trans[z_prev]))
        bdl.sample("y", dist.Normal(locs[z], scale), obs=y_t)
        return z, None

    bdl.scan(step, 0, y)


def simulate(num_steps: int, trans, locs, scale: float, seed: int = 0):
    """A state path and observations from the HMM (starting from state 0): ``(z, y)``."""
    rng = np.random.default_rng(seed)
    trans, locs = np.asarray(trans), np.asarray(locs)
    z, state = np.zeros(num_steps, np.int64), 0
    for t in range(num_steps):
        state = rng.choice(len(locs), p=trans[state])
        z[t] = state
    return z, locs[z] + scale * rng.normal(size=num_steps)


def examples() -> dict[str, Any]:
    """A short HMM for the conformance suite."""
    _, y = simulate(6, [[0.9, 0.1], [0.2, 0.8]], [-1.0, 1.0], 0.5, seed=1)
    return {"gaussian_hmm": gaussian_hmm(y, np.array([-1.0, 1.0]))}
