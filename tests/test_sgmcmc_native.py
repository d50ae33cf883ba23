"""Our SG-MCMC kernels as native kernels: numpyro.infer.MCMC and pyro.infer.MCMC drive them."""

from __future__ import annotations

import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import dist


@bdl.model
def blr(X, y):
    w = bdl.sample("w", dist.Normal(0.0, 1.0), shape=(X.shape[1],))
    with bdl.plate("data", X.shape[0]) as idx:
        bdl.sample("y", dist.Normal(X[idx] @ w, 1.0), obs=y[idx])


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(100, 2))
    y = X @ np.array([0.5, -0.3]) + rng.normal(size=100)
    cov = np.linalg.inv(X.T @ X + np.eye(2))
    return X, y, cov @ X.T @ y, np.sqrt(np.diag(cov))


SETTINGS = {
    "sgld": dict(step_size=5e-4),
    "sghmc": dict(step_size=2e-4, momentum_decay=0.5),
    "psgld": dict(step_size=5e-3),
    "csgld": dict(step_size=5e-4, num_steps=1000),
}


@pytest.mark.parametrize("method", sorted(SETTINGS))
def test_numpyro_mcmc_drives_our_kernel(data, method):
    import jax
    from numpyro.infer import MCMC
    from numpyro.infer.mcmc import MCMCKernel

    X, y, mean, sd = data
    kernel = bdl.native_kernel(blr(X, y), "numpyro", method, batch_size=50, **SETTINGS[method])
    assert isinstance(kernel, MCMCKernel)
    mcmc = MCMC(
        kernel,
        num_warmup=300,
        num_samples=700,
        num_chains=2,
        chain_method="sequential",
        progress_bar=False,
    )
    mcmc.run(jax.random.PRNGKey(0))
    w = np.asarray(mcmc.get_samples()["w"])
    assert w.shape == (1400, 2)
    np.testing.assert_array_less(np.abs(w.mean(0) - mean) / sd, 0.6)


@pytest.mark.parametrize("method", sorted(SETTINGS))
def test_pyro_mcmc_drives_our_kernel(data, method):
    from pyro.infer import MCMC
    from pyro.infer.mcmc.mcmc_kernel import MCMCKernel

    X, y, mean, sd = data
    kernel = bdl.native_kernel(blr(X, y), "pyro", method, batch_size=50, **SETTINGS[method])
    assert isinstance(kernel, MCMCKernel)
    mcmc = MCMC(kernel, num_samples=700, warmup_steps=300, disable_progbar=True)
    mcmc.run()
    w = mcmc.get_samples()["w"].numpy()
    assert w.shape == (700, 2)
    np.testing.assert_array_less(np.abs(w.mean(0) - mean) / sd, 0.6)


def test_native_kernel_errors(data):
    X, y, _, _ = data
    with pytest.raises(bdl.ConfigError, match="needs num_steps"):
        bdl.native_kernel(blr(X, y), "numpyro", "csgld", step_size=1e-3)
    with pytest.raises(bdl.ConfigError, match="backend's own sampler"):
        bdl.native_kernel(blr(X, y), "numpyro", "nuts", step_size=1e-3)
    with pytest.raises(bdl.ConfigError, match="batch_size=500 is larger"):
        bdl.native_kernel(blr(X, y), "pyro", "sgld", step_size=1e-3, batch_size=500)
