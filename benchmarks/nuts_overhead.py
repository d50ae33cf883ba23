"""Overhead of ``bdl.fit(..., method="nuts")`` over the same model written by hand in the backend.

Both run the backend's own NUTS with the same settings in this process; the ratio is
time(ours) / time(native), best of ``--repeats`` runs each (compilation included in both).

    python benchmarks/nuts_overhead.py [--backends numpyro pyro] [--repeats 3]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import ppl_bdl as bdl
from ppl_bdl import dist

N, K = 200, 5
WARMUP, SAMPLES = 500, 500


@bdl.model
def linreg(X, y=None):
    w = bdl.sample("w", dist.Normal(0.0, 1.0), shape=(X.shape[1],))
    sigma = bdl.sample("sigma", dist.HalfNormal(1.0))
    with bdl.plate("data", X.shape[0]) as idx:
        bdl.sample("y", dist.Normal(X[idx] @ w, sigma), obs=None if y is None else y[idx])


def data(seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(N, K))
    y = X @ rng.normal(size=K) + 0.5 * rng.normal(size=N)
    return X, y


def native_numpyro(X, y):
    import jax
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as nd
    from numpyro.infer import MCMC, NUTS

    Xj, yj = jnp.asarray(X, jnp.float32), jnp.asarray(y, jnp.float32)

    def model():
        w = numpyro.sample("w", nd.Normal(0.0, 1.0).expand([K]).to_event(1))
        sigma = numpyro.sample("sigma", nd.HalfNormal(1.0))
        with numpyro.plate("data", N):
            numpyro.sample("y", nd.Normal(Xj @ w, sigma), obs=yj)

    mcmc = MCMC(NUTS(model), num_warmup=WARMUP, num_samples=SAMPLES, progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0))
    return {k: np.asarray(v) for k, v in mcmc.get_samples().items()}


def native_pyro(X, y):
    import pyro
    import pyro.distributions as pd
    import torch
    from pyro.infer import MCMC, NUTS

    Xt, yt = torch.as_tensor(X, dtype=torch.float32), torch.as_tensor(y, dtype=torch.float32)

    def model():
        w = pyro.sample("w", pd.Normal(0.0, 1.0).expand([K]).to_event(1))
        sigma = pyro.sample("sigma", pd.HalfNormal(1.0))
        with pyro.plate("data", N):
            pyro.sample("y", pd.Normal(Xt @ w, sigma), obs=yt)

    pyro.set_rng_seed(0)
    mcmc = MCMC(NUTS(model), num_samples=SAMPLES, warmup_steps=WARMUP, disable_progbar=True)
    mcmc.run()
    return {k: v.numpy() for k, v in mcmc.get_samples().items()}


def ours(backend, X, y):
    return bdl.fit(
        linreg(X, y),
        backend=backend,
        method="nuts",
        num_warmup=WARMUP,
        num_samples=SAMPLES,
        num_chains=1,
        seed=0,
        progress=False,
    )


def best_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=bdl.backends.available())
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    X, y = data()
    natives = {"numpyro": native_numpyro, "pyro": native_pyro}
    print(f"linear regression N={N}, K={K}; NUTS {WARMUP} warmup + {SAMPLES} draws, 1 chain")
    print(f"{'backend':<10}{'native s':>10}{'ppl_bdl s':>11}{'ratio':>8}")
    for backend in args.backends:
        t_native = best_time(lambda b=backend: natives[b](X, y), args.repeats)
        t_ours = best_time(lambda b=backend: ours(b, X, y), args.repeats)
        print(f"{backend:<10}{t_native:>10.2f}{t_ours:>11.2f}{t_ours / t_native:>8.2f}")


if __name__ == "__main__":
    main()
