"""HMC tuned by the ELBO (``bdl.HMC(adapt="elbo")``, Campbell et al. 2021) against NUTS and
HMC with dual-averaging warmup: effective samples per gradient evaluation.

Two targets: eight schools (non-centred, posteriordb) and an ill-conditioned linear regression
with known noise (features of scales 0.1 to 10, pairwise correlated), whose posterior is
Gaussian and known exactly (``models.regression.conjugate_posterior``).

For each method: the smallest bulk ESS over the coordinates, the gradients of the sampling
phase (kept and burn-in draws; ``n_steps`` per draw) and of the warmup or tuning (NUTS: the
warmup draws counted at the sampling draws' mean ``n_steps``, an estimate; HMC: ``num_steps``
per draw; ELBO: ``elbo_steps × particles × (T·L + 2)`` potential gradients, each also
differentiated backwards, which costs about twice as much again), and ESS per gradient for the
sampling phase and for the whole run. On the regression also the largest error of the
posterior means and standard deviations in posterior standard deviations.

Run::

    PYTHONPATH=. python benchmarks/elbo_hmc.py [--backend numpyro] [--samples 2000]
    PYTHONPATH=. python benchmarks/elbo_hmc.py --backend pyro --targets regression --chains 2 \
        --samples 1000 --methods nuts "hmc elbo"

Each run uses one thread (torch's intra-op threads; XLA's CPU client, when JAX starts).
"""

from __future__ import annotations

import argparse
import os
import time

import arviz as az
import numpy as np

import ppl_bdl as bdl
from ppl_bdl.models import posteriordb, regression

#: One thread for XLA's CPU client (read when JAX starts).
XLA_ONE_THREAD = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


def ill_conditioned(seed: int = 0, n: int = 200, d: int = 6):
    """A regression whose posterior has scales over two orders of magnitude and correlations."""
    rng = np.random.default_rng(seed)
    base = rng.normal(size=(n, d))
    mixed = base + 0.8 * base[:, :1]  # every feature shares a common part: correlated
    X = mixed * np.logspace(-1, 1, d)
    y = X @ rng.normal(size=d) + 0.5 * rng.normal(size=n)
    mean, cov = regression.conjugate_posterior(X, y, noise=0.5, prior_scale=3.0)
    bound = regression.linear_regression_known_noise(X, y, noise=0.5, prior_scale=3.0)
    return bound, mean, cov


def methods(samples: int, leapfrog: int, chains: int = 4) -> dict:
    return {
        "nuts": bdl.NUTS(num_warmup=500, num_samples=samples, num_chains=chains),
        "hmc dual averaging": bdl.HMC(
            num_warmup=500, num_samples=samples, num_chains=chains, num_steps=leapfrog
        ),
        "hmc elbo": bdl.HMC(
            adapt="elbo", num_warmup=10, num_samples=samples, num_chains=chains, num_steps=leapfrog
        ),
    }


def tuned(method) -> bool:
    return getattr(method, "adapt", None) == "elbo"


def cost(method, post) -> tuple[float, float]:
    """(gradients of the sampling phase, gradients of the warmup or tuning)."""
    steps = np.asarray(post.sample_stats["n_steps"], float)
    chains = post.num_chains
    if tuned(method):
        config = method.elbo_config()
        tuning = config.steps * config.particles * (config.chain_length * config.num_steps + 2)
        return steps.sum() + chains * method.num_warmup * method.num_steps, float(tuning)
    return steps.sum(), chains * method.num_warmup * steps.mean()


def row(name, method, bound, backend, exact=None, seed: int = 0) -> str:
    start = time.perf_counter()
    post = bdl.fit(bound, backend=backend, method=method, progress=False, seed=seed)
    seconds = time.perf_counter() - start
    ess = az.ess(post.to_arviz())
    min_ess = min(float(np.min(ess[v].values)) for v in ess.data_vars if v in post.samples)
    sampling, warmup = cost(method, post)
    text = (
        f"| {name} | {min_ess:7.0f} | {sampling:9.0f} | {warmup:9.0f} | "
        f"{min_ess / sampling:.4f} | {min_ess / (sampling + warmup):.4f} | {seconds:5.1f} |"
    )
    if exact is not None:
        mean, cov = exact
        w = np.asarray(post.samples["w"]).reshape(-1, len(mean))
        sd = np.sqrt(np.diag(cov))
        error = max(np.max(np.abs(w.mean(0) - mean) / sd), np.max(np.abs(w.std(0) / sd - 1)))
        text += f" {error:.3f} |"
    if tuned(method):
        mass = np.asarray(post.settings["elbo_inverse_mass"])
        text += f"  (ε {post.settings['elbo_step_size']:.3g}, m {np.round(mass, 3).tolist()})"
    return text


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="numpyro")
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--leapfrog", type=int, default=10)
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--methods",
        nargs="+",
        default=list(methods(1, 1)),
        choices=list(methods(1, 1)),
        help="the rows to run",
    )
    parser.add_argument(
        "--targets",
        nargs="+",
        default=["eight_schools", "regression"],
        choices=["eight_schools", "regression"],
    )
    args = parser.parse_args()
    os.environ.setdefault("XLA_FLAGS", XLA_ONE_THREAD)
    bdl.backends.get(args.backend).set_threads(1)
    es = posteriordb.eight_schools_noncentered(**posteriordb.eight_schools_data())
    reg, mean, cov = ill_conditioned()
    sd = np.sqrt(np.diag(cov))
    print(f"regression posterior sds {np.round(sd, 4).tolist()}")
    print(f"condition number of its covariance {np.linalg.cond(cov):.3g}")
    header = (
        "| method | min ESS | sampling grads | warmup/tuning grads | ESS/grad sampling | "
        "ESS/grad total | seconds |"
    )
    targets = {
        "eight_schools": ("eight schools", es, None),
        "regression": ("regression", reg, (mean, cov)),
    }
    for target, bound, exact in (targets[name] for name in args.targets):
        print(f"\n{target} ({args.backend}, {args.chains} chains x {args.samples} draws)")
        print(header + (" max error (sd) |" if exact else ""))
        chosen = methods(args.samples, args.leapfrog, args.chains)
        for name in args.methods:
            method = chosen[name]
            print(row(name, method, bound, args.backend, exact, args.seed), flush=True)


if __name__ == "__main__":
    main()
