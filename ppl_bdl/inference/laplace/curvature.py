"""The curvature of the potential at the MAP: its Hessian, or its generalised Gauss-Newton.

The potential is U(θ) = −log p(θ, D) − log|J| on the flat unconstrained vector
(:class:`~ppl_bdl.trace.layout.ModelDensity`). Two curvatures of U at the MAP θ*:

- ``"hessian"``: ∇²U(θ*), by the backend's :meth:`~ppl_bdl.backend_protocol.Autodiff.hessian`.
- ``"ggn"``: the generalised Gauss-Newton matrix (Martens 2014; Immer, Korzepa & Bauer 2021,
  Eq. 4), Jᵀ Λ J + ∇²(prior terms), where f(θ) are the *outputs* of the likelihood (the location-
  type parameter of each observed site: a Normal's ``loc``, a Bernoulli's or Categorical's
  ``logits`` or ``probs``, a Poisson's ``rate``), J = ∂f/∂θ and Λ = −∇²_f log p(y | f), which is
  positive semi-definite for these families. It is computed as the exact Hessian of

      G(θ) = U(θ) with every output f(θ) replaced by its linearisation f(θ*) + J (θ − θ*)

  (a ``jvp``, no Jacobian formed): the linearised output has no second derivative, so
  ∇²G(θ*) = Jᵀ Λ J + the Hessian of every other term of U (the priors, the Jacobians of the
  transforms, ``bdl.factor`` sites, and the likelihood's other parameters, a learnt noise scale:
  those keep their exact curvature).

``hessian="full"`` builds the (d, d) matrix; ``"diag"`` its diagonal only, exactly, from
Hessian-vector products of U (or G) with the unit vectors, ``chunk`` of them at once
(the gradient of ⟨∇U, v⟩): d products, memory of ``chunk`` gradients,
never the (d, d) matrix. The data is read in chunks of ``batch_size`` points of the data plate
where given: with the potential U_k of chunk k scaled by N / B_k (minibatch scaling),
Σ_k (B_k / N) ∇²U_k = ∇²U exactly, so the result does not depend on the chunks.

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import dist
>>> from ppl_bdl.inference.setup import prepare
>>> from ppl_bdl.inference.laplace.curvature import curvature
>>> @bdl.model
... def m(y):
...     mu = bdl.sample("mu", dist.Normal(0.0, 1.0))
...     with bdl.plate("data", y.shape[0]) as idx:
...         bdl.sample("y", dist.Normal(mu, 0.5), obs=y[idx])
>>> setup = prepare(m(np.zeros(3)), "numpyro", "float32", seed=0)
>>> curvature(setup, np.zeros(1), "full", "ggn").tolist()   # 1 + 3 / 0.5²
[[13.0]]
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
    -> {parameter: value}) from the caller rather than from the model's code."""

    def __init__(self, backend, *, outputs: dict | None = None, **kwargs: Any):
        super().__init__(backend, **kwargs)
        self.outputs = outputs or {}

    def _sample(self, msg) -> None:
        new = self.outputs.get(msg.name)
        if new is not None:
            spec = copy.copy(msg.fn)
            spec.params = {**spec.params, **new}
            msg.fn = spec
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


def output_free_parameters(setup, position: np.ndarray, index: np.ndarray, batch_size=None):
    """Observed site -> its parameters other than its outputs (:data:`OUTPUTS`) that change
    with the coordinates ``index`` at ``position`` (a jvp along a random direction over them, on
    the first chunk of the data): a noise scale that the network outputs (a heteroscedastic
    head), which the GGN keeps at its exact curvature and KFAC's factors leave out."""
    backend = setup.backend
    tangent = np.zeros(setup.layout.dim)
    tangent[index] = np.random.default_rng(0).standard_normal(len(index))
    batch = _chunks(setup, batch_size)[0][0]
    with backend.scope(), backend.activate():
        if batch is not None:
            batch = {k: backend.asarray(v, "int") for k, v in batch.items()}
        pots = Potentials(setup)

        def others(flat):
            ev = Evaluator(
                backend,
                unconstrained=pots.layout.unflatten(flat, backend),
                params=setup.params,
                batch=batch,
                record=True,
            )
            sites = pots._run(ev).sites
            return {
                name: {
                    k: backend.asarray(v)
                    for k, v in site.spec.params.items()
                    if k not in OUTPUTS.get(site.spec.name, ())
                    and not isinstance(v, bool | str | type(None))
                }
                for name, site in sites.items()
                if site.kind == "observed" and site.spec is not None
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


class Potentials:
    """U, its GGN surrogate G, and the outputs f, as functions of the flat unconstrained vector
    on one chunk of the data (``batch``: plate name -> indices, or None)."""

    def __init__(self, setup):
        self.setup, self.backend, self.layout = setup, setup.backend, setup.layout
        self.data, self.template = setup.bound.data_arrays(self.backend)

    def _run(self, evaluator):
        self.setup.bound.run_with(evaluator, fill_data(self.template, self.data))
        return evaluator

    def potential(self, flat, batch=None, outputs=None):
        ev = OutputEvaluator(
            self.backend,
            unconstrained=self.layout.unflatten(flat, self.backend),
            params=self.setup.params,
            batch=batch,
            outputs=outputs,
        )
        return -self._run(ev).log_joint

    def outputs(self, flat, batch=None) -> dict:
        """f(θ): each observed site's outputs (:data:`OUTPUTS`) as the model computes them."""
        ev = Evaluator(
            self.backend,
            unconstrained=self.layout.unflatten(flat, self.backend),
            params=self.setup.params,
            batch=batch,
            record=True,
        )
        sites = self._run(ev).sites
        out = {}
        for name, site in sites.items():
            if site.kind == "observed" and site.spec.name in OUTPUTS:
                params = site.spec.params
                out[name] = {
                    k: self.backend.asarray(params[k])
                    for k in OUTPUTS[site.spec.name]
                    if k in params
                }
        return out

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


def _embed(backend, anchor, index: np.ndarray):
    """θ_S -> the flat vector with the coordinates ``index`` (one contiguous run per site)
    set to θ_S and the others held at ``anchor``."""
    m = backend.math
    runs = _runs(index)
    dim = int(anchor.shape[0])

    def embed(part):
        pieces, used, at = [], 0, 0
        for start, stop in runs:
            if start > at:
                pieces.append(anchor[at:start])
            pieces.append(part[used : used + stop - start])
            used, at = used + stop - start, stop
        if at < dim:
            pieces.append(anchor[at:dim])
        return m.concatenate(pieces, axis=0) if len(pieces) > 1 else pieces[0]

    return embed


def _runs(index: np.ndarray) -> list[tuple[int, int]]:
    """Sorted indices as (start, stop) runs of consecutive ones."""
    runs: list[tuple[int, int]] = []
    for i in np.asarray(index, int):
        if runs and runs[-1][1] == i:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((int(i), int(i) + 1))
    return runs


def _chunks(setup, batch_size: int | None):
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


def curvature(
    setup,
    position: np.ndarray,
    structure: str,
    kind: str,
    index: np.ndarray | None = None,
    batch_size: int | None = None,
    chunk: int = 32,
) -> np.ndarray:
    """The curvature of U at ``position`` (flat, NumPy) over the coordinates ``index`` (all by
    default): the (k, k) matrix for ``structure="full"``, its diagonal (k,) for ``"diag"``;
    ``kind`` "hessian" or "ggn" (see the module docstring). NumPy float64."""
    backend = setup.backend
    index = np.arange(setup.layout.dim) if index is None else np.asarray(index, int)
    if kind == "ggn":
        check_outputs(setup)
    total = 0.0
    with backend.scope(), backend.activate():
        pots = Potentials(setup)
        anchor = backend.asarray(position)
        embed = _embed(backend, anchor, index)
        start = backend.asarray(position[index])

        def restricted(part, batch):  # the chunk's indices are an argument: compiled once
            if kind == "ggn":
                return pots.linearised(anchor, batch)(embed(part))
            return backend.math.sum(pots.potential(embed(part), batch))

        compiled = (
            backend.jit(backend.hessian(restricted))
            if structure == "full"
            else _diagonal_products(backend, restricted, start)
        )
        for batch, weight in _chunks(setup, batch_size):
            if batch is not None:
                batch = {k: backend.asarray(v, "int") for k, v in batch.items()}
            part = (
                compiled(start, batch)
                if structure == "full"
                else _diagonal(backend, compiled, start, batch, chunk)
            )
            part = part if isinstance(part, np.ndarray) else backend.to_numpy(part)
            total = total + weight * np.asarray(part, float)
    return total


def _diagonal_products(backend, fn, point):
    """``products(vs, batch)``: the Hessian-vector products of ``fn(·, batch)`` at ``point``
    with the rows of ``vs``, compiled once for every chunk of the data."""
    grad = backend.grad(fn)

    def hvp(v, batch):  # reverse over reverse: ∇_x ⟨∇fn(x), v⟩
        return backend.grad(lambda x: backend.math.sum(grad(x, batch) * v))(point)

    return backend.jit(backend.vmap(hvp, in_axes=(0, None)))


def _diagonal(backend, products, point, batch, chunk: int):
    """diag ∇²fn(point) on the data chunk ``batch``, exactly, from the Hessian-vector products
    with the unit vectors (:func:`_diagonal_products`), ``chunk`` at a time."""
    dim = int(point.shape[0])
    out = np.empty(dim)
    size = max(1, min(chunk, dim))
    for begin in range(0, dim, size):
        rows = np.arange(begin, min(begin + size, dim))
        basis = np.zeros((size, dim))
        basis[np.arange(len(rows)), rows] = 1.0
        hv = np.asarray(backend.to_numpy(products(backend.asarray(basis), batch)), float)
        out[rows] = hv[np.arange(len(rows)), rows]
    return out
