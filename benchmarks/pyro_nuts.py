"""Cost per gradient of ours under Pyro's NUTS against Pyro's own NUTS on the posteriordb models.

For each posteriordb model (the shipped ones; diamonds too where the shared data has it) the
same model written by hand with ``pyro.sample``/``pyro.plate`` runs under
``pyro.infer.NUTS(model, jit_compile=False)`` and ``jit_compile=True``, and ours under
``bdl.fit(bound, backend="pyro", method="nuts")``; same warmup, draws, maximum tree depth, one chain, seed 0.

* **run**: ms per gradient = wall time from the ``--skip``-th gradient to the last, over the
  gradients in between. Gradients are counted where Pyro's leapfrog takes them (its
  ``potential_grad``), the same place for all three, so compilation and setup are left out and
  the tree building, adaptation and (ours) the driver between gradients are in.
* **grad**: ms per call of ``potential_grad`` alone at the initial point, best of ``--rounds``
  rounds of ``--calls`` calls (steadier): ours' traced potential against Pyro's ``potential_fn``
  from ``pyro.infer.mcmc.util.initialize_model``.

Runs alternate ours and Pyro's so a loaded machine slows both alike; ratios are ours / Pyro's.

    python benchmarks/pyro_nuts.py [--warmup 100] [--draws 100] [--models kidiq arK ...]
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import pyro
import pyro.distributions as pd
import pyro.infer.mcmc.nuts as pyro_nuts
import pyro.ops.integrator as integrator
import torch
from pyro.infer import MCMC, NUTS
from pyro.infer.mcmc.util import initialize_model

import ppl_bdl as bdl
from ppl_bdl.backends.pyro.mcmc import _traced_energy
from ppl_bdl.dsl.effects import use_backend
from ppl_bdl.errors import DataError
from ppl_bdl.inference.setup import prepare
from ppl_bdl.models import posteriordb as pdb
from ppl_bdl.trace.layout import ModelDensity

NAMES = {
    "es_centered": "eight_schools-eight_schools_centered",
    "es_noncentered": "eight_schools-eight_schools_noncentered",
    "kidiq": "kidiq-kidscore_momiq",
    "arK": "arK-arK",
    "diamonds": "diamonds-diamonds",
}


# -- the models by hand in Pyro ------------------------------------------------------------------
def _t(x):
    return torch.as_tensor(np.asarray(x), dtype=torch.float32)


def _flat(size: int):
    # A flat prior on R^size: Pyro's ImproperUniform cannot draw the initial trace's value.
    return pd.Normal(0.0, 1.0).expand([size]).to_event(1).mask(False)


def native_model(short: str, d: dict):
    """The posteriordb model ``short`` written with pyro.sample / pyro.plate, on data ``d``."""
    if short.startswith("es_"):
        sigma, y, J = _t(d["sigma"]), _t(d["y"]), d["J"]
        centred = short == "es_centered"

        def model():
            mu = pyro.sample("mu", pd.Normal(0.0, 5.0))
            tau = pyro.sample("tau", pd.HalfCauchy(5.0))
            with pyro.plate("school", J):
                if centred:
                    theta = pyro.sample("theta", pd.Normal(mu, tau))
                else:
                    theta = mu + tau * pyro.sample("theta_trans", pd.Normal(0.0, 1.0))
                pyro.sample("y", pd.Normal(theta, sigma), obs=y)

        return model
    if short == "kidiq":
        mom_iq, kid = _t(d["mom_iq"]), _t(d["kid_score"])

        def model():
            beta = pyro.sample("beta", _flat(2))
            sigma = pyro.sample("sigma", pd.HalfCauchy(2.5))
            with pyro.plate("data", mom_iq.shape[0]):
                pyro.sample("kid_score", pd.Normal(beta[0] + beta[1] * mom_iq, sigma), obs=kid)

        return model
    if short == "arK":
        y, K = _t(d["y"]), d["K"]
        T = y.shape[0]
        lags = torch.stack([y[K - k - 1 : T - k - 1] for k in range(K)], dim=-1)

        def model():
            alpha = pyro.sample("alpha", pd.Normal(0.0, 10.0))
            beta = pyro.sample("beta", pd.Normal(0.0, 10.0).expand([K]).to_event(1))
            sigma = pyro.sample("sigma", pd.HalfCauchy(2.5))
            with pyro.plate("time", T - K):
                pyro.sample("y", pd.Normal(alpha + lags @ beta, sigma), obs=y[K:])

        return model
    X, Y = _t(d["X"]), _t(d["Y"])
    return _diamonds_model(X[:, 1:] - X[:, 1:].mean(0), Y)


def _diamonds_model(Xc, Y):
    # sigma ~ HalfStudentT(3, 10): |StudentT(3, 0, 10)| on (0, inf), density doubled.
    half_t = pd.FoldedDistribution(pd.StudentT(3.0, 0.0, 10.0))

    def model():
        b = pyro.sample("b", pd.Normal(0.0, 1.0).expand([Xc.shape[1]]).to_event(1))
        intercept = pyro.sample("Intercept", pd.StudentT(3.0, 8.0, 10.0))
        sigma = pyro.sample("sigma", half_t)
        with pyro.plate("data", Xc.shape[0]):
            pyro.sample("Y", pd.Normal(intercept + Xc @ b, sigma), obs=Y)

    return model


# -- counting gradients where Pyro's NUTS takes them ---------------------------------------------
class GradClock:
    """Wraps Pyro's ``potential_grad`` (in the leapfrog and in NUTS): counts the calls and keeps
    the time at the end of the ``skip``-th call and of the last one."""

    def __init__(self, skip: int):
        self.skip, self.calls, self.start, self.end = skip, 0, None, None
        self._original = integrator.potential_grad

    def __enter__(self):
        original = self._original

        def counted(potential_fn, z):
            out = original(potential_fn, z)
            self.calls += 1
            now = time.perf_counter()
            if self.calls == self.skip:
                self.start = now
            self.end = now
            return out

        integrator.potential_grad = pyro_nuts.potential_grad = counted
        return self

    def __exit__(self, *exc):
        integrator.potential_grad = pyro_nuts.potential_grad = self._original

    def ms_per_grad(self) -> float:
        return 1e3 * (self.end - self.start) / (self.calls - self.skip)


def run_native(model, jit: bool, args) -> GradClock:
    pyro.set_rng_seed(0)
    kernel = NUTS(
        model, jit_compile=jit, ignore_jit_warnings=True, max_tree_depth=args.max_tree_depth
    )
    mcmc = MCMC(kernel, num_samples=args.draws, warmup_steps=args.warmup, disable_progbar=True)
    with GradClock(args.skip) as clock:
        mcmc.run()
    return clock


def run_ours(bound, args) -> GradClock:
    # Short capped runs of the centred funnel do not converge: only their cost is read here.
    with GradClock(args.skip) as clock, warnings.catch_warnings():
        warnings.simplefilter("ignore", bdl.ConvergenceWarning)
        bdl.fit(
            bound,
            backend="pyro",
            method="nuts",
            num_warmup=args.warmup,
            num_samples=args.draws,
            num_chains=1,
            seed=0,
            progress=False,
            log_likelihood=False,
            max_tree_depth=args.max_tree_depth,
        )
    return clock


# -- one gradient alone ---------------------------------------------------------------------------
def ours_potential(bound, fused: bool = True):
    """Ours' potential as our NUTS hands it to Pyro, and the initial point; ``fused=False``: the
    traced potential alone, autograd through its graph (how ours ran before)."""
    setup = prepare(bound, "pyro", "float32", 0)
    backend = setup.backend
    density = ModelDensity(setup.bound, backend, setup.layout, setup.params)
    z0 = torch.zeros(setup.layout.dim)
    with backend.scope():
        if fused:
            energy = _traced_energy(backend, density.potential, density.data, z0)
        else:
            energy = backend.trace(lambda z: density.potential(z, density.data), (z0,))

    def potential_fn(params):
        with use_backend(backend):
            return energy(params["theta"])

    return potential_fn, {"theta": z0}, backend


def time_grad(potential_fn, z, args, scope=None) -> float:
    with scope() if scope else _nothing():
        start = time.perf_counter()
        for _ in range(args.calls):
            integrator.potential_grad(potential_fn, z)
        return 1e3 * (time.perf_counter() - start) / args.calls


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def grad_row(bound, model, args) -> list[float]:
    """ms per gradient: ours, ours before (autograd through the traced U), Pyro, Pyro jit."""
    ours = [ours_potential(bound, fused) for fused in (True, False)]
    natives = []
    for jit in (False, True):
        pyro.set_rng_seed(0)
        params, native_fn, _, _ = initialize_model(model, jit_compile=jit, skip_jit_warnings=True)
        natives.append((native_fn, params))
    for fn, z, backend in ours:
        with backend.scope():
            integrator.potential_grad(fn, z)  # warm
    for fn, z in natives:
        integrator.potential_grad(fn, z)  # traces it when jit
    best = [float("inf")] * 4
    for _ in range(args.rounds):  # interleaved, so load hits all alike
        for i, (fn, z, backend) in enumerate(ours):
            best[i] = min(best[i], time_grad(fn, z, args, backend.scope))
        for i, (fn, z) in enumerate(natives):
            best[2 + i] = min(best[2 + i], time_grad(fn, z, args))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(NAMES))
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--draws", type=int, default=100)
    # Capped so the centred funnel's trees stay short: the cost per gradient is what is timed.
    parser.add_argument("--max-tree-depth", type=int, default=5)
    parser.add_argument("--skip", type=int, default=20, help="gradients left out at the start")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-runs", action="store_true", help="time one gradient only")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(
        f"NUTS {args.warmup} warmup + {args.draws} draws, max tree depth {args.max_tree_depth}, "
        "1 chain, seed 0; ms per gradient"
    )
    print(
        f"{'model':<16}{'what':<6}{'ours':>8}{'pyro':>8}{'pyro jit':>10}"
        f"{'ours/pyro':>11}{'ours/jit':>10}{'grads o/p/j, before':>26}"
    )
    for short in args.models:
        try:
            d = pdb.load_data(NAMES[short])
        except DataError:
            print(f"{short:<16}skipped: no data")
            continue
        bound, model = pdb.POSTERIORS[NAMES[short]].model(**d), native_model(short, d)
        ours_g, before_g, pyro_g, jit_g = grad_row(bound, model, args)
        _print(short, "grad", ours_g, pyro_g, jit_g, f"before: {before_g:.3f}")
        if args.no_runs:
            continue
        native = run_native(model, False, args)
        ours = run_ours(bound, args)
        jitted = run_native(model, True, args)
        counts = f"{ours.calls}/{native.calls}/{jitted.calls}"
        _print(short, "run", *(c.ms_per_grad() for c in (ours, native, jitted)), counts)


def _print(short, what, ours, native, jitted, counts):
    print(
        f"{short:<16}{what:<6}{ours:>8.3f}{native:>8.3f}{jitted:>10.3f}"
        f"{ours / native:>11.2f}{ours / jitted:>10.2f}{counts:>26}"
    )


if __name__ == "__main__":
    main()
