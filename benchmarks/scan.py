"""Per-gradient time of a ``bdl.scan`` model against the same model written with NumPyro's own
``numpyro.contrib.control_flow.scan``: the stochastic-volatility model
(:func:`ppl_bdl.models.timeseries.stochastic_volatility`) at T steps.

Ours is the core's log density (:class:`~ppl_bdl.trace.layout.ModelDensity`, the potential NUTS,
VI and SG-MCMC differentiate), its ``bdl.scan`` one ``lax.scan``; the anchor is NumPyro's
``potential_energy`` of its scan model. Both are ``jax.jit(jax.value_and_grad(...))`` at the same
point; the ratio is ours / native, median of ``--repeats`` timed blocks of ``--calls`` calls each
(compilation not included; its time is printed apart). On Pyro (``--pyro``) ours runs the step
eagerly once per step; ``--pyro`` also times it with the step traced once (``torch.jit.trace``)
and called per step, the alternative a compiled loop on torch would be.

    python benchmarks/scan.py [--steps 100 10000] [--repeats 5] [--calls 20] [--pyro]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import ppl_bdl as bdl
from ppl_bdl.inference.common import prepare
from ppl_bdl.models import timeseries
from ppl_bdl.trace.layout import ModelDensity


def native_sv(y):
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as nd
    from numpyro.contrib.control_flow import scan

    mu = numpyro.sample("mu", nd.Cauchy(0.0, 10.0))
    phi = numpyro.sample("phi", nd.Uniform(-1.0, 1.0))
    sigma = numpyro.sample("sigma", nd.HalfCauchy(5.0))

    def step(h_prev, t):
        h_std = numpyro.sample("h_std", nd.Normal(0.0, 1.0))
        scale = jnp.where(t == 0, sigma / jnp.sqrt(1.0 - phi**2), sigma)
        h = mu + phi * (h_prev - mu) + scale * h_std
        numpyro.sample("y", nd.Normal(0.0, jnp.exp(h / 2.0)), obs=y[t])
        return h, None

    scan(step, mu, jnp.arange(y.shape[0]))


def timed(fn, arg, repeats: int, calls: int) -> tuple[float, float]:
    """(seconds of the first call: compilation, median seconds per call after it)."""
    first, (median,) = timed_together([fn], arg, repeats, calls)
    return first, median


def timed_together(fns, arg, repeats: int, calls: int) -> tuple[float, list[float]]:
    """The first call of each (compilation; the last one's seconds), then ``repeats`` blocks of
    ``calls`` calls, the functions taking turns (a loaded machine slows both alike): the median
    seconds per call of each."""
    for fn in fns:
        start = time.perf_counter()
        _block(fn(arg))
        first = time.perf_counter() - start
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, kept in zip(fns, times, strict=True):
            start = time.perf_counter()
            for _ in range(calls):
                out = fn(arg)
            _block(out)
            kept.append((time.perf_counter() - start) / calls)
    return first, [float(np.median(t)) for t in times]


def _block(out):
    for leaf in out if isinstance(out, tuple) else (out,):
        if hasattr(leaf, "block_until_ready"):
            leaf.block_until_ready()


def numpyro_pair(steps: int):
    """(ours, native, point): jitted value-and-grad functions of the flat unconstrained point."""
    import jax
    from numpyro.infer.util import potential_energy

    y = timeseries.simulate_volatility(steps, -1.0, 0.9, 0.3, seed=0)
    setup = prepare(timeseries.stochastic_volatility(y), bdl.backends.get("numpyro"), "float32", 0)
    backend, layout = setup.backend, setup.layout
    density = ModelDensity(setup.bound, backend, layout, setup.params)
    y_jax = jax.numpy.asarray(y, jax.numpy.float32)

    def theirs(flat):
        return potential_energy(native_sv, (y_jax,), {}, layout.unflatten(flat, backend))

    point = backend.asarray(np.random.default_rng(0).normal(size=layout.dim) * 0.1)
    ours = jax.jit(jax.value_and_grad(density.potential))
    return ours, jax.jit(jax.value_and_grad(theirs)), point, backend


def run_numpyro(steps_list, repeats: int, calls: int) -> None:
    print("ms per gradient (wall clock, the two taking turns); ours: ModelDensity, native: scan")
    for steps in steps_list:
        ours, native, point, backend = numpyro_pair(steps)
        with backend.scope(), backend.activate():
            c_ours = timed(ours, point, 0, calls)[0]
            c_native, (t_ours, t_native) = timed_together([ours, native], point, repeats, calls)
        print(
            f"T={steps:>6}  ours {1e3 * t_ours:9.3f}  native {1e3 * t_native:9.3f}  "
            f"ours/native {t_ours / t_native:5.2f} (<=1.5)   compile: ours {c_ours:.1f} s, "
            f"native {c_native:.1f} s"
        )


def run_pyro(steps: int, repeats: int, calls: int) -> None:
    """Ours on Pyro (the eager loop) against a loop around the step traced once."""
    import torch

    y = timeseries.simulate_volatility(steps, -1.0, 0.9, 0.3, seed=0)
    setup = prepare(timeseries.stochastic_volatility(y), bdl.backends.get("pyro"), "float32", 0)
    backend, layout = setup.backend, setup.layout
    density = ModelDensity(setup.bound, backend, layout, setup.params)
    point = backend.asarray(np.random.default_rng(0).normal(size=layout.dim) * 0.1)
    y_t = torch.as_tensor(y, dtype=torch.float32)
    normal = torch.distributions.Normal

    def step(h_prev, h_std, y_step, mu, phi, scale):
        h = mu + phi * (h_prev - mu) + scale * h_std
        log_p = normal(0.0, 1.0).log_prob(h_std) + normal(0.0, torch.exp(h / 2.0)).log_prob(y_step)
        return h, log_p

    args = [torch.tensor(0.1)] * 6
    traced_step = torch.jit.trace(step, tuple(args))

    def looped(one_step):
        def value_and_grad(flat):
            flat = flat.detach().requires_grad_(True)
            mu, phi, sigma = flat[0], torch.tanh(flat[1] / 2), torch.exp(flat[2])
            h, total = mu, 0.0
            for t in range(steps):
                scale = sigma / torch.sqrt(1 - phi**2) if t == 0 else sigma
                h, log_p = one_step(h, flat[3 + t], y_t[t], mu, phi, scale)
                total = total + log_p
            (grad,) = torch.autograd.grad(-total, flat)
            return -total, grad

        return value_and_grad

    print(f"Pyro, T={steps}: ms per gradient (the step's ops only, priors left out)")
    fns = [density.value_and_grad, looped(step), looped(traced_step)]
    ours, eager, traced = timed_together(fns, point, repeats, calls)[1]
    print(
        f"  ours (eager loop) {1e3 * ours:8.3f}   hand loop, eager step {1e3 * eager:8.3f}   "
        f"hand loop, traced step {1e3 * traced:8.3f}   traced/eager {traced / eager:5.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[100, 10_000])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--pyro", action="store_true", help="also time the Pyro loop (T=100)")
    args = parser.parse_args()
    run_numpyro(args.steps, args.repeats, args.calls)
    if args.pyro:
        run_pyro(100, args.repeats, args.calls)


if __name__ == "__main__":
    main()
