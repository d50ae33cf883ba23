"""Discrete latent sites, summed out by the backend's own enumeration machinery.

A latent site with finite support (``Bernoulli``, ``Categorical``, ``DiscreteUniform``,
``Binomial``, ...) has no gradient, so NUTS, HMC, VI and SG-MCMC cannot move it. Instead the
potential of the continuous latents θ is the marginal

    U(θ) = −log Σ_z p(θ, z, D) − log|J(θ)|,

summed exactly by the backend: the model is lowered with its continuous sites conditioned on θ
and its discrete sites marked for parallel enumeration (:class:`~ppl_bdl.trace.lowering.Lowering`),
and the backend contracts the enumerated factors (NumPyro: ``enum`` + funsor ``log_density``;
Pyro: ``poutine.enum`` and its HMC's einsum evaluator). Sites in a plate are summed per element;
sites in a ``bdl.scan`` depend on the step before only (an HMM costs the forward algorithm's
O(T K²), Rabiner 1989, Eq. 19-21). After the fit each draw of θ gets one draw of the discrete
sites from p(z | θ, D) (``infer_discrete``: forward filtering, backward sampling), so
``Posterior.samples`` holds them like any other site.

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import dist
>>> @bdl.model
... def mixture(y):
...     mu = bdl.sample("mu", dist.Normal(np.array([-3.0, 3.0]), 1.0))
...     with bdl.plate("data", y.shape[0]) as idx:
...         z = bdl.sample("z", dist.Categorical(probs=np.array([0.6, 0.4])))
...         bdl.sample("y", dist.Normal(mu[z], 1.0), obs=y[idx])
>>> y = np.array([-3.2, -2.5, 2.9, 3.4])
>>> post = bdl.fit(mixture(y), backend="numpyro", num_warmup=20, num_samples=10, num_chains=1,
...                progress=False)
>>> post.samples["z"].shape, post.samples["mu"].shape
((1, 10, 4), (1, 10, 2))
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ppl_bdl.dsl.bound_data import fill_data
from ppl_bdl.errors import ModelError
from ppl_bdl.trace.interpreter import SiteRecord
from ppl_bdl.trace.lowering import Lowering

#: Posterior draws whose discrete sites are drawn per compiled call.
DRAWS_PER_CALL = 256


def discrete_latents(sites: dict[str, SiteRecord]) -> list[str]:
    """The model's discrete latent sites, checked for enumeration: finite support, one scalar
    value per plate element (per step in a scan)."""
    names = []
    for name, site in sites.items():
        if site.kind != "latent" or not site.is_discrete:
            continue
        if not getattr(site.native, "has_enumerate_support", False):
            raise ModelError(
                f"discrete latent site {name!r} ({site.spec.name}) has an infinite support, so "
                "it cannot be summed out. Observe it, give it a finite support (Categorical, "
                "Bernoulli, Binomial, DiscreteUniform), or marginalise it by hand with "
                "bdl.factor."
            )
        step = site.extra.get("step_shape", site.shape)
        if step.extra or step.event:
            raise ModelError(
                f"discrete latent site {name!r} has {step.extra + step.event} values per draw "
                "outside plates; enumeration sums out one scalar at a time. Put the site in a "
                "bdl.plate (one element per value) instead of shape=, or use one site per value."
            )
        names.append(name)
    return names


def max_plate_nesting(sites: dict[str, SiteRecord]) -> int:
    """The number of plate dims of the model: enumeration uses the dims left of them."""
    return max((-f.dim for site in sites.values() for f in site.plates), default=0)


class Enumeration:
    """The marginal log density of a model's continuous latents and draws of its discrete ones.

    Parameters
    ----------
    bound : BoundModel
    backend : Backend
    sites : dict
        A validating trace of the model (:func:`ppl_bdl.trace.model_trace.trace_model`).
    template : Any
        The data template of :meth:`BoundModel.data_arrays` (the arrays are passed per call).
    exclude : frozenset of str
        Continuous sites whose own log density is left out (a closed-form KL adds it).
    """

    def __init__(self, bound, backend, sites: dict, template: Any, exclude=frozenset()):
        self.bound, self.backend, self.sites = bound, backend, sites
        self.template, self.exclude = template, frozenset(exclude)
        self.discrete = discrete_latents(sites)
        self.nesting = max_plate_nesting(sites)
        # Compiled once: the backends' samplers also call the potential outside their compiled
        # loops (NumPyro's initial step size), where an enumerated scan run op by op is slow.
        self._log_density = backend.jit(self._marginal)

    def _native(self, data, jacobian: bool, unroll: bool | None):
        def model(inputs):
            lowering = Lowering(
                self.backend,
                sites=self.sites,
                unconstrained=inputs["latent"],
                params=inputs["params"],
                enumerated=frozenset(self.discrete),
                exclude=self.exclude,
                jacobian=jacobian,
                unroll=unroll,
            )
            self.bound.run_with(lowering, fill_data(self.template, data))

        return model

    def log_density(self, unconstrained: dict, data: list, params: dict | None):
        """log Σ_z p(θ, z, D) + log|J| at unconstrained values θ of the continuous sites."""
        return self._log_density(unconstrained, data, dict(params or {}))

    def _marginal(self, unconstrained: dict, data: list, params: dict):
        inputs = {"latent": unconstrained, "params": params}
        native = self._native(data, jacobian=True, unroll=None)
        return self.backend.enumerated_log_density(native, inputs, self.nesting)

    def draw(self, unconstrained: dict, data: list, params: dict | None, key) -> dict:
        """One draw of every discrete site from p(z | θ, D), by site name (stacked over time
        for sites in a scan)."""
        backend = self.backend
        inputs = {"latent": unconstrained, "params": dict(params or {})}
        # infer_discrete needs the loop unrolled under markov on every backend.
        native = self._native(data, jacobian=False, unroll=True)
        drawn = backend.infer_discrete(native, inputs, self.nesting, key)
        out = {}
        for name in self.discrete:
            site = self.sites[name]
            steps = site.extra.get("steps")
            if steps is None:
                value = drawn[name]
            else:
                value = backend.math.stack([drawn[f"{name}_{t}"] for t in range(steps)])
            out[name] = backend.math.reshape(value, tuple(site.shape.value))
        return out


def posterior_draws(density, flat: np.ndarray, seed: int) -> dict[str, np.ndarray]:
    """Draws of the discrete sites, one per flat draw of θ shaped (chain, draw, dim): a dict
    of NumPy arrays shaped ``(chain, draw, *site shape)``. ``density`` is the model's
    :class:`~ppl_bdl.trace.layout.ModelDensity` (with its enumeration)."""
    enum, backend, layout = density.enumeration, density.backend, density.layout
    chains, draws, dim = flat.shape
    rows = flat.reshape(chains * draws, dim)
    size = min(DRAWS_PER_CALL, len(rows))
    params = density.params

    def one(row, key, data):
        return enum.draw(layout.unflatten(row), data, params, key)

    parts = []
    with backend.scope(), backend.activate():
        compiled = backend.jit(backend.vmap(one, in_axes=(0, 0, None)))
        for start in range(0, len(rows), size):
            chunk = rows[start : start + size]
            real = len(chunk)
            if real < size:  # one compiled shape: pad the last chunk
                chunk = np.concatenate([chunk, np.repeat(chunk[-1:], size - real, axis=0)])
            keys = backend.random.keys(backend.random.key(seed + start), size)
            out = compiled(backend.asarray(chunk), keys, density.data)
            parts.append({k: backend.to_numpy(v)[:real] for k, v in out.items()})
    return {
        k: np.concatenate([p[k] for p in parts]).reshape((chains, draws) + parts[0][k].shape[1:])
        for k in parts[0]
    }
