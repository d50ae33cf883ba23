"""The potential, its outputs and its linearisation, as functions of the flat unconstrained
vector on a chunk of the data: what the Laplace curvatures differentiate.

U(θ) = −log p(θ, D) − log|J| (:class:`~ppl_bdl.trace.layout.ModelDensity`); the outputs f(θ)
are the location-type parameters of the observed sites (:data:`OUTPUTS`); G(θ) is U with every
output replaced by its linearisation at θ* (the generalised Gauss-Newton's surrogate:
:mod:`~ppl_bdl.inference.laplace.curvature`).

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import dist
>>> from ppl_bdl.inference.setup import prepare
>>> from ppl_bdl.inference.laplace.potentials import Potentials
>>> @bdl.model
... def m(y):
...     mu = bdl.sample("mu", dist.Normal(0.0, 1.0))
...     with bdl.plate("data", y.shape[0]) as idx:
...         bdl.sample("y", dist.Normal(mu, 0.5), obs=y[idx])
>>> setup = prepare(m(np.zeros(3)), "numpyro", "float32", seed=0)
>>> with setup.backend.scope(), setup.backend.activate():
...     out = Potentials(setup).outputs(setup.backend.asarray(np.ones(1)))
>>> float(out["y"]["loc"])                       # the model's mu, at θ = 1
1.0
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from ppl_bdl.dsl.bound_data import fill_data
from ppl_bdl.errors import ConfigError
from ppl_bdl.inference.setup import minibatch_plate
from ppl_bdl.trace.interpreter import Evaluator

#: The likelihood's outputs f linearised by ``curvature="ggn"``, by family: parameters in which
#: −log p(y | f) is convex, so that Λ is positive semi-definite.
OUTPUTS = {
    "Normal": ("loc",),
    "Bernoulli": ("logits", "probs"),
    "Categorical": ("logits", "probs"),
    "Binomial": ("logits", "probs"),
    "Poisson": ("rate",),
}


class OutputEvaluator(Evaluator):
    """An :class:`Evaluator` whose likelihood sites take their outputs (``outputs``: site name
    -> {parameter: value}) from the caller rather than from the model's code; it keeps each
    observed site's distribution (``observed_specs``) without recording the run."""

    def __init__(self, backend, *, outputs: dict | None = None, **kwargs: Any):
        super().__init__(backend, **kwargs)
        self.outputs = outputs or {}
        self.observed_specs: dict = {}

    def _sample(self, msg) -> None:
        new = self.outputs.get(msg.name)
        if new is not None:
            spec = copy.copy(msg.fn)
            spec.params = {**spec.params, **new}
            msg.fn = spec
        if msg.obs is not None:
            self.observed_specs[msg.name] = msg.fn
        super()._sample(msg)


def check_outputs(setup) -> None:
    """A ConfigError naming each observed site whose family has no output ``"ggn"`` can
    linearise."""
    bad = {
        n: s.spec.name
        for n, s in setup.sites.items()
        if s.kind == "observed" and s.spec is not None and s.spec.name not in OUTPUTS
    }
    if bad:
        raise ConfigError(
            f"curvature='ggn' linearises the likelihood's output (the parameter of "
            f"{sorted(OUTPUTS)} in which −log p is convex); observed site(s) {bad} have no "
            "such parameter. Use curvature='hessian' (the exact Hessian of the potential)."
        )


class Potentials:
    """U, its GGN surrogate G, and the outputs f, as functions of the flat unconstrained vector
    on one chunk of the data (``batch``: plate name -> indices, or None). ``data`` (the bound
    data's arrays) and ``params`` (the ``bdl.param`` values) default to the fit's; a compiled
    function passes its own arguments."""

    def __init__(self, setup, data: list | None = None, params: dict | None = None):
        self.setup, self.backend, self.layout = setup, setup.backend, setup.layout
        self.data, self.template = setup.bound.data_arrays(self.backend)
        self.data = self.data if data is None else data
        self.params = setup.params if params is None else params

    def _run(self, evaluator):
        self.setup.bound.run_with(evaluator, fill_data(self.template, self.data))
        return evaluator

    def potential(self, flat, batch=None, outputs=None, likelihood_only: bool = False):
        """U(θ) (``outputs`` replacing the model's); ``likelihood_only``: without the latent
        sites' own densities (what does not depend on the outputs: Λ needs none of it)."""
        ev = self._evaluator(flat, batch, outputs, likelihood_only)
        return -self._run(ev).log_joint

    def likelihood(self, flat, batch=None) -> dict:
        """Each observed site's distribution at θ, its parameters as the model computes them
        (the latent sites' densities not computed: an eager backend would pay for them)."""
        return self._run(self._evaluator(flat, batch, None, True)).observed_specs

    def outputs(self, flat, batch=None) -> dict:
        """f(θ): each observed site's outputs (:data:`OUTPUTS`) as the model computes them."""
        out = {}
        for name, spec in self.likelihood(flat, batch).items():
            if spec.name in OUTPUTS:
                keys = [k for k in OUTPUTS[spec.name] if k in spec.params]
                out[name] = {k: self.backend.asarray(spec.params[k]) for k in keys}
        return out

    def _evaluator(self, flat, batch, outputs, likelihood_only: bool) -> OutputEvaluator:
        return OutputEvaluator(
            self.backend,
            unconstrained=self.layout.unflatten(flat, self.backend),
            params=self.params,
            batch=batch,
            outputs=outputs,
            exclude=frozenset(self.layout.names) if likelihood_only else frozenset(),
        )

    def linearised(self, anchor, batch=None):
        """G(θ) = U(θ) with the outputs linearised at ``anchor`` (θ*)."""
        m = self.backend.math

        def value(flat):
            fstar, jv = self.backend.jvp(
                lambda a: self.outputs(a, batch), (anchor,), (flat - anchor,)
            )
            lin = {site: {k: fstar[site][k] + jv[site][k] for k in fstar[site]} for site in fstar}
            return m.sum(self.potential(flat, batch, lin))

        return value


def data_chunks(setup, batch_size: int | None):
    """The data chunks the curvature is summed over: (batch, weight B_k / N), or one full
    chunk."""
    plate = minibatch_plate(setup, batch_size)
    if plate is None:
        return [(None, 1.0)]
    name, size = plate
    return [
        (
            {name: np.arange(start, min(start + batch_size, size))},
            min(batch_size, size - start) / size,
        )
        for start in range(0, size, batch_size)
    ]


def output_free_parameters(setup, position: np.ndarray, index: np.ndarray, batch_size=None):
    """Observed site -> its parameters other than its outputs (:data:`OUTPUTS`) that change
    with the coordinates ``index`` at ``position`` (a jvp along a random direction over them, on
    the first chunk of the data): a noise scale that the network outputs (a heteroscedastic
    head), which the GGN keeps at its exact curvature and KFAC's factors leave out."""
    backend = setup.backend
    tangent = np.zeros(setup.layout.dim)
    tangent[index] = np.random.default_rng(0).standard_normal(len(index))
    batch = data_chunks(setup, batch_size)[0][0]
    with backend.scope(), backend.activate():
        if batch is not None:
            batch = {k: backend.asarray(v, "int") for k, v in batch.items()}
        pots = Potentials(setup)

        def others(flat):
            return {
                name: {
                    k: backend.asarray(v)
                    for k, v in spec.params.items()
                    if k not in OUTPUTS.get(spec.name, ())
                    and not isinstance(v, bool | str | type(None))
                }
                for name, spec in pots.likelihood(flat, batch).items()
            }

        point = backend.asarray(position)
        if not any(others(point).values()):  # outputs only (a Categorical's logits)
            return {}
        _, moved = backend.jvp(others, (point,), (backend.asarray(tangent),))
        found = {
            name: sorted(k for k, v in params.items() if np.any(backend.to_numpy(v) != 0))
            for name, params in moved.items()
        }
    return {name: keys for name, keys in found.items() if keys}
