"""Per-gradient time of a ``bdl.scan`` model against the same model written with NumPyro's own
``numpyro.contrib.control_flow.scan``: the stochastic-volatility model
(:func:`ppl_bdl.models.timeseries.stochastic_volatility`) at T steps.

Ours is the core's log density (:class:`~ppl_bdl.trace.layout.ModelDensity`, the potential NUTS,
VI and SG-MCMC differentiate), its ``bdl.scan`` one ``lax.scan``; the anchor is NumPyro's
``potential_energy`` of its scan model. Both are ``jax.jit(jax.value_and_grad(...))`` at the same
point; the ratio is ours / native, median of ``--repeats`` timed blocks of ``--calls`` calls each
(compilation not included; its time is printed apart).

On Pyro (``--pyro``, at the same T) ours traces the step once and calls its graph at every step
(:mod:`ppl_bdl.backends.pyro.scan`); the anchor is the Python loop that runs the step eagerly at
every step. Each is timed as ``torch.func.grad_and_value`` of the potential (VI's and SG-MCMC's
gradient) and by autograd (Pyro NUTS's), and, up to ``--whole-max`` steps, traced whole
(:meth:`~ppl_bdl.backends.pyro.backend.PyroBackend.trace`: ``make_fx`` then TorchScript, the loop
unrolled, as NUTS, VI and SG-MCMC trace their gradient up to
:data:`~ppl_bdl.backends.pyro.scan.UNROLL_LIMIT` steps). "first" is the first call's seconds
(the step's trace, or the whole trace's build).

    python benchmarks/scan.py [--steps 100 10000] [--repeats 5] [--calls 20] [--pyro]
        [--whole-max 100] [--no-numpyro]
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


def pyro_gradients(steps: int):
    """(value_and_grad by torch.func, by autograd, the point, the backend) of the Pyro potential."""
    import torch

    y = timeseries.simulate_volatility(steps, -1.0, 0.9, 0.3, seed=0)
    setup = prepare(timeseries.stochastic_volatility(y), bdl.backends.get("pyro"), "float32", 0)
    backend, layout = setup.backend, setup.layout
    density = ModelDensity(setup.bound, backend, layout, setup.params)
    point = backend.asarray(np.random.default_rng(0).normal(size=layout.dim) * 0.1)

    def by_autograd(flat):
        flat = flat.detach().requires_grad_(True)
        value = density.potential(flat)
        return value, torch.autograd.grad(value, flat)[0]

    return density.value_and_grad, by_autograd, point, backend


def _eager_loop(backend, on: bool) -> None:
    """Pyro's bdl.scan as the Python loop (the step run eagerly at every step), or as it is."""
    from ppl_bdl.backends.pyro.scan import eager_scan

    if on:
        backend.scan = lambda fn, init, xs, length: eager_scan(fn, init, xs, length)
    else:
        backend.__dict__.pop("scan", None)


def run_pyro(steps_list, repeats: int, calls: int, whole_max: int) -> None:
    """Ours on Pyro (the step traced once) against the Python loop, plain and traced whole."""
    from ppl_bdl.backends.pyro import scan as pyro_scan

    print(
        "Pyro: seconds of the first call, ms per gradient (torch.func | autograd); "
        "ours: the step traced once, anchor: the step run eagerly at every step"
    )
    for steps in steps_list:
        value_and_grad, by_autograd, point, backend = pyro_gradients(steps)
        n = max(1, calls * 100 // steps)
        rows = {}
        with backend.scope(), backend.activate():
            for name, eager in (("eager loop", True), ("traced step", False)):
                _eager_loop(backend, eager)
                backend.step_programs = pyro_scan.StepPrograms()
                start = time.perf_counter()
                value_and_grad(point)
                first = time.perf_counter() - start
                _, (t_func, t_auto) = timed_together(
                    [value_and_grad, by_autograd], point, repeats, n
                )
                rows[name] = (first, t_func, t_auto)
            _eager_loop(backend, False)
            if steps <= whole_max:  # the loop unrolled into one trace (either way the same)
                limit, pyro_scan.UNROLL_LIMIT = pyro_scan.UNROLL_LIMIT, steps
                start = time.perf_counter()
                whole = backend.trace(value_and_grad, (point,))
                whole(point)
                rows["whole trace"] = (
                    time.perf_counter() - start,
                    timed(whole, point, 1, n)[1],
                    None,
                )
                pyro_scan.UNROLL_LIMIT = limit
        for name, (first, t_func, t_auto) in rows.items():
            auto = "" if t_auto is None else f" | {1e3 * t_auto:9.1f}"
            print(f"T={steps:>6}  {name:<12} first {first:7.1f} s   {1e3 * t_func:9.1f}{auto}")
        ratio = rows["eager loop"][1] / rows["traced step"][1]
        print(f"T={steps:>6}  eager loop / traced step (torch.func): {ratio:5.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[100, 10_000])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--pyro", action="store_true", help="also time the Pyro loop")
    parser.add_argument(
        "--whole-max", type=int, default=100, help="Pyro: trace the whole potential up to T steps"
    )
    parser.add_argument("--no-numpyro", action="store_true", help="time the Pyro loop only")
    args = parser.parse_args()
    if not args.no_numpyro:
        run_numpyro(args.steps, args.repeats, args.calls)
    if args.pyro:
        run_pyro(args.steps, args.repeats, args.calls, args.whole_max)


if __name__ == "__main__":
    main()
