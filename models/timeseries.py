"""Time series written with ``bdl.scan``: an AR(K) model and a stochastic-volatility model.

``ar_k`` is posteriordb's arK (``y[t] ~ Normal(alpha + sum_k beta[k] y[t-k-1], sigma)``, the
same priors and Stan's names) as a loop over time: its posterior is the vectorised
:func:`ppl_bdl.models.posteriordb.arK`'s. ``stochastic_volatility`` is the model of Kim, Shephard
& Chib (1998), as in Stan's User's Guide (§2.5), non-centred: a latent log-volatility per time
step, ``h[t] = mu + phi (h[t-1] - mu) + sigma h_std[t]`` (``h[0]`` from the stationary law),
``y[t] ~ Normal(0, exp(h[t] / 2))``.

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl.models import timeseries
>>> y = timeseries.simulate_volatility(30, mu=-1.0, phi=0.9, sigma=0.3, seed=0)
>>> from ppl_bdl.trace.layout import trace_model
>>> sites = trace_model(timeseries.stochastic_volatility(y), bdl.backends.get("numpyro"))
>>> sites["h_std"].value.shape, sites["h"].value.shape   # a log-volatility per step
((30,), (30,))
"""

from __future__ import annotations

from typing import Any

import numpy as np

import ppl_bdl as bdl
from ppl_bdl import dist
from ppl_bdl import math as bm


@bdl.model
def ar_k(y, K: int):  # noqa: N803 - Stan's name
    """AR(K) with posteriordb's arK priors (``alpha, beta ~ Normal(0, 10)``,
    ``sigma ~ HalfCauchy(2.5)``): one ``bdl.scan`` step per observation after the first K,
    carrying the last K values (most recent first)."""
    T = y.shape[0]
    alpha = bdl.sample("alpha", dist.Normal(0.0, 10.0))
    beta = bdl.sample("beta", dist.Normal(0.0, 10.0), shape=(K,))
    sigma = bdl.sample("sigma", dist.HalfCauchy(2.5))

    def step(lags, t):
        bdl.sample("y", dist.Normal(alpha + bm.sum(beta * lags), sigma), obs=y[t])
        return bm.concatenate([y[t][None], lags[: K - 1]]), None

    bdl.scan(step, bm.stack([y[K - 1 - k] for k in range(K)]), np.arange(K, T))


@bdl.model
def stochastic_volatility(y):
    """``mu ~ Cauchy(0, 10)``, ``phi ~ Uniform(-1, 1)``, ``sigma ~ HalfCauchy(5)``,
    ``h_std[t] ~ Normal(0, 1)``; ``h`` (deterministic) is the log-volatility."""
    mu = bdl.sample("mu", dist.Cauchy(0.0, 10.0))
    phi = bdl.sample("phi", dist.Uniform(-1.0, 1.0))
    sigma = bdl.sample("sigma", dist.HalfCauchy(5.0))

    def step(h_prev, t):
        h_std = bdl.sample("h_std", dist.Normal(0.0, 1.0))
        # h[0] has the stationary sd sigma / sqrt(1 - phi^2); h_prev = mu at t = 0.
        scale = bm.where(t == 0, sigma / bm.sqrt(1.0 - phi**2), sigma)
        h = bdl.deterministic("h", mu + phi * (h_prev - mu) + scale * h_std)
        bdl.sample("y", dist.Normal(0.0, bm.exp(h / 2.0)), obs=y[t])
        return h, None

    bdl.scan(step, mu, np.arange(y.shape[0]))


def simulate_ar(num_steps: int, alpha: float, beta, sigma: float, seed: int = 0) -> np.ndarray:
    """A series from the AR(K) model (started at zeros)."""
    rng = np.random.default_rng(seed)
    beta = np.asarray(beta, dtype=float)
    y = np.zeros(num_steps)
    for t in range(len(beta), num_steps):
        y[t] = alpha + beta @ y[t - len(beta) : t][::-1] + sigma * rng.normal()
    return y


def simulate_volatility(num_steps: int, mu: float, phi: float, sigma: float, seed: int = 0):
    """Returns from the stochastic-volatility model."""
    rng = np.random.default_rng(seed)
    h = mu + sigma / np.sqrt(1 - phi**2) * rng.normal()
    y = np.zeros(num_steps)
    for t in range(num_steps):
        if t > 0:
            h = mu + phi * (h - mu) + sigma * rng.normal()
        y[t] = np.exp(h / 2.0) * rng.normal()
    return y


def examples() -> dict[str, Any]:
    """Short series for the conformance suite."""
    return {
        "ar_k": ar_k(simulate_ar(14, 0.0, [0.5, -0.2], 0.1, seed=0), 2),
        "stochastic_volatility": stochastic_volatility(
            simulate_volatility(10, -1.0, 0.9, 0.3, seed=0)
        ),
    }
