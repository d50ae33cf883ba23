"""``fit``: one call for every inference method, on the backend named at fit time."""

from __future__ import annotations

import os
import sys
from typing import Any

from . import kernels
from .errors import ConfigError
from .inference.common import prepare


def _want_progress(progress: bool | None) -> bool:
    if progress is not None:
        return bool(progress)
    return sys.stderr.isatty() and not os.environ.get("CI")


def _positive_int(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name} must be an int >= {minimum}, got {value!r}.")
    return value


def fit(
    bound,
    backend: str = "numpyro",
    method: str = "nuts",
    *,
    num_warmup: int = 1000,
    num_samples: int = 1000,
    num_chains: int = 4,
    thinning: int = 1,
    seed: int = 0,
    init: Any = "uniform",
    precision: str = "float32",
    progress: bool | None = None,
    **options: Any,
):
    """Fit a bound model on ``backend`` ("pyro" or "numpyro") with ``method``.

    Parameters
    ----------
    bound : BoundModel
        A model with its data, ``my_model(X, y)``.
    backend : str
        "numpyro" or "pyro" (see :func:`ppl_bdl.backends.available`).
    method : str
        "nuts", "hmc", a registered SG-MCMC kernel (see :func:`ppl_bdl.kernels.available`), or "vi".
    num_warmup, num_samples, num_chains, thinning : int
        ``num_samples`` draws are kept per chain; a chain runs ``num_warmup + num_samples * thinning``
        steps on every method and backend.
    seed : int
        Same seed, same backend: same draws.
    init : "uniform" | "prior" | "median" | dict
        Initial point of each chain.
    precision : "float32" | "float64"
    progress : bool, optional
        A progress bar (default: on a terminal, off in CI).
    **options
        Method settings: for NUTS/HMC ``target_accept`` (0.8), ``max_tree_depth`` (10),
        ``dense_mass``, ``num_steps`` and ``step_size`` (HMC), ``chain_method`` (NumPyro:
        "sequential", "vectorized" or "parallel"); for SG-MCMC and VI see their docs.

    Returns
    -------
    Posterior

    Example
    -------
    >>> import numpy as np, ppl_bdl as bdl
    >>> from ppl_bdl import dist
    >>> @bdl.model
    ... def mean_model(y):
    ...     mu = bdl.sample("mu", dist.Normal(0.0, 10.0))
    ...     with bdl.plate("data", y.shape[0]) as idx:
    ...         bdl.sample("y", dist.Normal(mu, 1.0), obs=y[idx])
    >>> post = bdl.fit(mean_model(np.array([0.9, 1.1, 1.0])), backend="numpyro", method="nuts",
    ...                num_warmup=200, num_samples=200, num_chains=2, progress=False)
    >>> post.samples["mu"].shape
    (2, 200)
    """
    if method == "vi":
        from .inference.vi import run_vi

        setup = prepare(bound, backend, precision, seed)
        return run_vi(
            setup, num_samples=_positive_int("num_samples", num_samples), seed=seed,
            progress=_want_progress(progress), **options
        )  # fmt: skip
    entry = kernels.get(method)
    num_samples = _positive_int("num_samples", num_samples)
    num_warmup = _positive_int("num_warmup", num_warmup, minimum=0)
    num_chains = _positive_int("num_chains", num_chains)
    thinning = _positive_int("thinning", thinning)
    setup = prepare(bound, backend, precision, seed)
    common = dict(
        num_warmup=num_warmup,
        num_samples=num_samples,
        num_chains=num_chains,
        thinning=thinning,
        seed=seed,
        init=init,
        progress=_want_progress(progress),
    )
    if entry.kind == "native":
        from .inference.native_mcmc import run_native_mcmc

        allowed = {
            "target_accept", "max_tree_depth", "num_steps", "step_size", "dense_mass", "chain_method"
        }  # fmt: skip
        unknown = set(options) - allowed
        if unknown:
            raise ConfigError(
                f"unknown option(s) {sorted(unknown)} for method {method!r}; expected some of "
                f"{sorted(allowed)}."
            )
        return run_native_mcmc(setup, method, **common, **options)
    from .inference.sgmcmc import run_sgmcmc

    return run_sgmcmc(setup, entry, **common, **options)
