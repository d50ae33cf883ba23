"""Replica exchange SGHMC against single-temperature SGHMC on a small BNN, in one process.

The 1-20-1 tanh network of the SG-MCMC page (``bnn.make_bnn_regression``) on the noisy sine
with a gap (``regression.make_sine_data``: 80 training points), each method with the same step
size (chosen by SGHMC's pilot), minibatch size, steps and chains (the ladder's replicas add work per step, not steps);
prints the held-out mean log predictive density and RMSE on 200 fresh points of the same
curve, the seconds, the ratios to SGHMC, and the ladder's swap rates.

Usage::

    python benchmarks/replica_exchange.py [--backend numpyro] [--steps 4000] [--seeds 3]
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np

import ppl_bdl as bdl
from ppl_bdl.models import bnn, regression
from ppl_bdl.posterior.diagnostics import ConvergenceWarning


def run(
    method, backend: str, steps: int, seed: int, data, step_size
) -> tuple[float, float, float, dict]:
    """One fit: (held-out log-likelihood, RMSE, seconds, settings)."""
    (X, y), (X_test, y_test) = data
    model = bnn.make_bnn_regression(hidden=(20,))
    start = time.perf_counter()
    with warnings.catch_warnings():  # R-hat across a BNN's symmetric modes is large, truly
        warnings.simplefilter("ignore", ConvergenceWarning)
        post = bdl.fit(
            model(X, y),
            backend=backend,
            method=method,
            step_size=step_size,
            batch_size=20,
            num_warmup=steps // 2,
            num_samples=steps // 20,
            thinning=10,
            num_chains=2,
            init="median",
            progress=False,
            seed=seed,
        )
    seconds = time.perf_counter() - start
    predictive = post.predict(model(X_test))
    return predictive.log_likelihood(y_test), predictive.rmse(y_test), seconds, post.settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="numpyro")
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    X, y = regression.make_sine_data(80, seed=0)
    x_test = np.linspace(-3.0, 3.0, 200)[:, None]
    y_test = np.sin(1.5 * x_test[:, 0]) + 0.15 * np.random.default_rng(1).normal(size=200)
    data = ((X, y), (x_test, y_test))
    methods = {
        "sghmc": bdl.SGHMC(momentum_decay=0.1),
        "resghmc": bdl.ReSGHMC(momentum_decay=0.1, temperatures=(1.0, 2.0, 4.0, 8.0)),
    }
    results = {name: [] for name in methods}
    for seed in range(args.seeds):
        # SGHMC's pilot picks the step size (a short fit, not timed); both run at it
        step_size = run(methods["sghmc"], args.backend, 40, seed, data, "auto")[3]["step_size"]
        for name, method in methods.items():
            results[name].append(run(method, args.backend, args.steps, seed, data, step_size))
    base = np.mean([r[2] for r in results["sghmc"]])
    print(f"{args.backend}, {args.steps} steps, 2 chains, {args.seeds} seeds (mean ± sd)")
    for name, rows in results.items():
        lls, rmses, secs = (np.array([r[i] for r in rows]) for i in range(3))
        line = (
            f"{name:8s} test log-lik {lls.mean():7.3f} ± {lls.std():.3f}  RMSE {rmses.mean():.3f}"
            f" ± {rmses.std():.3f}  {secs.mean():6.1f} s ({secs.mean() / base:.2f}x sghmc)"
        )
        if "swap_rates" in rows[0][3]:
            line += f"  swap rates {np.round(rows[0][3]['swap_rates'], 2).tolist()}"
        print(line)


if __name__ == "__main__":
    main()
