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

``hessian="full"`` builds the (d, d) matrix; ``"diag"`` its diagonal only, exactly, never the
(d, d) matrix. For the GGN, the weights of ``nn.Dense`` layers with a Normal prior get theirs
from one compiled pass per chunk of the data (:mod:`~ppl_bdl.inference.laplace.layer_ggn`: a
backward pass per output dimension, as KFAC's factors cost), plus the prior's precision; every
other coordinate (and every one for ``"hessian"``) from Hessian-vector products of U (or G)
with the unit vectors, ``chunk`` of them at once (the gradient of ⟨∇U, v⟩): one product per
coordinate, memory of ``chunk`` gradients. The data is read in chunks of ``batch_size`` points
of the data plate where given: with the potential U_k of chunk k scaled by N / B_k (minibatch
scaling), Σ_k (B_k / N) ∇²U_k = ∇²U exactly, so the result does not depend on the chunks.

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

import numpy as np

from ppl_bdl.inference.laplace.layer_ggn import layer_coordinates, layer_pieces
from ppl_bdl.inference.laplace.marglik import normal_prior
from ppl_bdl.inference.laplace.potentials import Potentials, check_outputs, data_chunks


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


def curvature(
    setup,
    position: np.ndarray,
    structure: str,
    kind: str,
    index: np.ndarray | None = None,
    batch_size: int | None = None,
    chunk: int = 32,
    estimate: tuple[int | None, int] = (None, 0),
) -> np.ndarray:
    """The curvature of U at ``position`` (flat, NumPy) over the coordinates ``index`` (all by
    default): the (k, k) matrix for ``structure="full"``, its diagonal (k,) for ``"diag"``;
    ``kind`` "hessian" or "ggn" (see the module docstring). NumPy float64. ``estimate`` is
    (samples, seed): the diagonal GGN's nn.Dense blocks from that many draws per point (None:
    exact; :mod:`~ppl_bdl.inference.laplace.layer_ggn`)."""
    index = np.arange(setup.layout.dim) if index is None else np.asarray(index, int)
    if kind == "ggn":
        check_outputs(setup)
    if structure == "diag" and kind == "ggn":
        return _layered_diagonal(setup, position, index, batch_size, (chunk, *estimate))
    return _autodiff_curvature(setup, position, structure, kind, index, batch_size, chunk)


def _layered_diagonal(setup, position, index, batch_size, how) -> np.ndarray:
    """The GGN's diagonal over ``index``: the nn.Dense layers' weights from their per-layer
    pieces (:func:`~ppl_bdl.inference.laplace.layer_ggn.layer_pieces`) plus their Normal prior's
    precision; every other coordinate from Hessian-vector products. ``how``: (the products'
    chunk, the pieces' samples, their seed)."""
    chunk, samples, seed = how
    layout = setup.layout
    at = np.full(layout.dim, -1)
    at[index] = np.arange(len(index))
    whole = {s.name for s in layout.slots if np.all(at[s.offset : s.offset + s.size] >= 0)}
    out = np.full(len(index), np.nan)
    if any(name.endswith(".weight") for name in whole):
        found = layer_pieces(setup, position, whole, batch_size, "diag", samples, seed)
        for path in found.diagonal:
            coords = layer_coordinates(setup, path, found.layers[path], whole).ravel()
            prior, _ = normal_prior(setup, coords)
            if np.all(prior > 0):  # a Normal prior: its Hessian is its precision
                out[at[coords]] = found.pieces[path]["D"].ravel() + prior
    rest = np.isnan(out)
    if np.any(rest):
        out[rest] = _autodiff_curvature(
            setup, position, "diag", "ggn", index[rest], batch_size, chunk
        )
    return out


def _autodiff_curvature(setup, position, structure, kind, index, batch_size, chunk):
    """The curvature over ``index`` from the backend's Hessian or Hessian-vector products of U
    (or G) restricted to those coordinates."""
    backend = setup.backend
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
        for batch, weight in data_chunks(setup, batch_size):
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
