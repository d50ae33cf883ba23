"""Importance log-weights of a fitted VI guide against its model, for the Pareto k̂ check.

At draws θ_s ~ q of the flat unconstrained vector, log w_s = log p(x, θ_s) − log q(θ_s) =
−U(θ_s) − log q(θ_s), with U the model's full-data potential (the Jacobian of the constraining
maps included, as in q's own space). The Pareto k̂ of these weights (PSIS, Vehtari et al. 2024;
Yao et al. 2018 for its use as a VI diagnostic) says how far q is from the posterior where it
matters: :func:`ppl_bdl.posterior.diagnostics.pareto_khat`.

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import dist
>>> from ppl_bdl.posterior.diagnostics import pareto_khat
>>> from ppl_bdl.inference.common import prepare
>>> @bdl.model
... def m(y):
...     mu = bdl.sample("mu", dist.Normal(0.0, 10.0))
...     with bdl.plate("data", y.shape[0]) as idx:
...         bdl.sample("y", dist.Normal(mu, 1.0), obs=y[idx])
>>> bound = m(np.random.default_rng(0).normal(size=50))
>>> post = bdl.fit(bound, backend="numpyro", method="vi", num_steps=2000, lr=0.05,
...                num_samples=10, progress=False)
>>> setup = prepare(bound, "numpyro", "float32", 0)
>>> pareto_khat(importance_log_weights(setup, post)) < 0.7  # a Gaussian guide, a Gaussian posterior
True
"""

from __future__ import annotations

import numpy as np

from ppl_bdl.inference.posterior_from_draws import pad_rows, replay_chunk_size
from ppl_bdl.inference.setup import Setup
from ppl_bdl.trace.layout import ModelDensity

#: Draws from the guide that the weights are computed at (PSIS's k̂ is reliable from a few
#: hundred draws on; Vehtari et al. 2024, Section 3.2.4).
NUM_DRAWS = 256


def importance_log_weights(setup: Setup, post, num_draws: int = NUM_DRAWS, seed: int = 0):
    """log p(x, θ_s) − log q(θ_s) at ``num_draws`` draws of ``post.guide`` (NumPy, shape (S,)),
    or None for a guide that is a point mass (``"delta"``, MAP: it has no density to weigh) or
    amortized (a joint weight is a product over the N points of per-point weights, so its k̂
    grows with N however good each q(z_i|x_i) is: ``post.log_marginal(X).ess`` is the check
    per point); a list of them, one per fit, for several fits (``num_chains``)."""
    fitted = post.guide
    if isinstance(fitted, list):  # several fits (num_chains): each one's weights
        return [_of_guide(setup, post.params, g, num_draws, seed) for g in fitted]
    return _of_guide(setup, post.params, fitted, num_draws, seed)


def _of_guide(setup: Setup, fitted_params: dict, fitted, num_draws: int, seed: int):
    if fitted is None or fitted.name in ("delta", "amortized"):
        return None
    backend = setup.backend
    theta = fitted.sample_unconstrained(num_draws, seed=seed)
    log_q = fitted.log_prob(theta)
    with backend.scope(), backend.activate():
        params = {k: backend.asarray(v) for k, v in fitted_params.items()}
        density = ModelDensity(setup.bound, backend, setup.layout, params or setup.params)
        size = replay_chunk_size(setup, most=num_draws)
        potential = backend.jit(
            backend.vmap(lambda row, data: density.potential(row, data), in_axes=(0, None))
        )
        out = np.empty(num_draws)
        for start in range(0, num_draws, size):
            chunk = theta[start : start + size]
            real = len(chunk)
            values = potential(backend.asarray(pad_rows(chunk, size)), density.data)
            out[start : start + real] = np.asarray(backend.to_numpy(values), dtype=float)[:real]
    return -out - np.asarray(log_q, dtype=float)
