"""The generalised Gauss-Newton of ``nn.Dense`` and ``nn.Conv2d`` layers, read layer by layer
from one compiled pass per chunk of the data: the Kronecker factors of ``hessian="kron"``
(:mod:`~ppl_bdl.inference.laplace.kron`) and the exact diagonal of ``hessian="diag"``
(:mod:`~ppl_bdl.inference.laplace.curvature`).

For a layer s = a W̃ (Dense: a = [x, 1], W̃ = [W; b]) the GGN over W̃ is Σ_n J_nᵀ Λ_n J_n with
J_n = ∂f_n/∂W̃ = a_n ⊗ M_n, M_n = ∂f_n/∂s_n (R outputs by the layer's width), Λ_n the
likelihood's Hessian in its outputs f_n (Martens & Grosse 2015; Immer, Korzepa & Bauer 2021,
Eq. 4). One pass over a chunk computes

- Λ_n for every point: one Hessian-vector product of the likelihood per output dimension
  (the points are independent, so one product serves them all), vmapped over the R of them;
- the R rows m_r of every M_n: the gradients of ⟨f, e_r⟩ with respect to a shift of each
  layer's pre-activation (:class:`~ppl_bdl.dsl.nn.probe.LayerProbe`), vmapped; and
  h_r = Σ_s Λ_rs m_s;
- per layer, KFAC's factors A = Σ_n a_n a_nᵀ and G = Σ_n M_nᵀ Λ_n M_n = Σ_r m_rᵀ h_r; or,
  for the diagonal, Σ_n (a_n ⊙ a_n) (Σ_r m_r ⊙ h_r)_nᵀ: the exact diagonal of the layer's block
  where each data point passes through the layer once, as one row (a Dense layer called once on
  an (N, in) input), since J_n's entry at (i, j) is a_ni (M_n)_·j.

With ``samples=S`` the R rows give way to S Monte Carlo rows per point: m̃_k = M_nᵀ L_n ε_k with
L_n L_nᵀ = Λ_n and ε_k ~ N(0, I_R), so that E[m̃ m̃ᵀ] = M_nᵀ Λ_n M_n and G ≈ (1/S) Σ_k m̃_kᵀ m̃_k:
one backward pass per draw instead of one per output dimension (K-FAC's sampled Fisher, Martens
& Grosse 2015; laplace-torch's ``AsdlGGN(stochastic=True)``). It costs less wherever R > S.

As KFAC does, it takes a layer's weights to reach the likelihood only through its output.
The pass is compiled (``backend.jit``; on torch, whose ``jit`` is the identity, traced with
``backend.trace``) once per chunk size and kept in the model's program cache; the data and the
model's params are its arguments, so a second fit compiles nothing.

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import dist, nn
>>> from ppl_bdl.inference.setup import prepare
>>> from ppl_bdl.inference.laplace.layer_ggn import layer_pieces
>>> @bdl.model
... def m(X, y):
...     f = nn.Dense("fc", 2, 1).sample()
...     with bdl.plate("data", X.shape[0]) as idx:
...         bdl.sample("y", dist.Normal(f(X[idx])[..., 0], 0.5), obs=y[idx])
>>> setup = prepare(m(np.ones((4, 2)), np.zeros(4)), "numpyro", "float32", seed=0)
>>> found = layer_pieces(setup, np.zeros(3), {"fc.weight", "fc.bias"}, None, "kron")
>>> found.rows, found.pieces["fc"]["G"].tolist()      # Σ_n 1 / 0.5²
(4, [[16.0]])
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ppl_bdl.dsl.nn.layers import Dense
from ppl_bdl.dsl.nn.probe import LayerProbe
from ppl_bdl.errors import ConfigError
from ppl_bdl.inference.laplace.kron_layers import check_layer, coordinates, input_factor
from ppl_bdl.inference.laplace.potentials import Potentials, data_chunks


@dataclass
class LayerPieces:
    """What :func:`layer_pieces` found: the layers (path -> layer, in the order they ran), each
    one's pieces summed over the data (path -> {"A", "G"} or {"D"}: NumPy float64), the data
    points N (``rows``), and the layers whose diagonal is exact (``diagonal``)."""

    layers: dict = field(default_factory=dict)
    pieces: dict = field(default_factory=dict)
    rows: int = 0
    diagonal: set = field(default_factory=set)


def layer_pieces(
    setup, mode, sites: set, batch_size, structure: str, samples: int | None = None, seed: int = 0
) -> LayerPieces:
    """The pieces of each layer whose weight is among the Gaussian ``sites`` at ``mode`` (flat,
    NumPy), summed over the data in chunks of ``batch_size``: A, G for ``structure="kron"`` (an
    unsupported layer is refused), D for ``"diag"`` (only the Dense layers whose diagonal it
    gives exactly; an empty result where the outputs are not one row per data point). G and D
    carry the chunk's weight B_k / N; A is a plain sum. The sums stay on the backend's device
    until the last chunk (Conv2d's A is summed on the host, from its inputs' patches).
    ``samples`` (None: exact) estimates G and D from that many draws per point, from ``seed``."""
    backend = setup.backend
    sums: dict = {}
    host: dict = {}
    rows = 0.0
    with backend.scope(), backend.activate():
        run, info = _compiled_pass(setup, sites, structure, samples)
        data, _ = setup.bound.data_arrays(backend)
        params = {k: backend.asarray(v) for k, v in setup.params.items()}
        anchor = backend.asarray(mode)
        key = None if samples is None else backend.random.key(seed)
        for i, (batch, weight) in enumerate(data_chunks(setup, batch_size)):
            if batch is not None:
                batch = {k: backend.asarray(v, "int") for k, v in batch.items()}
            noise_key = None if key is None else backend.random.fold_in(key, i)
            pieces, count = run(anchor, batch, data, params, noise_key)
            if info.get("skipped"):
                if structure == "kron":
                    raise info["skipped"]
                return LayerPieces()
            rows = rows + count
            for path, calls in pieces.items():
                context = (backend, info["layers"][path], f"{path}.bias" in sites)
                for piece in calls:
                    _add(
                        sums.setdefault(path, {}), host.setdefault(path, {}), piece, weight, context
                    )
        found = LayerPieces(info["layers"], {}, int(backend.to_numpy(rows)))
        found.diagonal = set(info.get("diagonal", ()))
        for path, on_device in sums.items():  # Dense's A on the device, Conv2d's on the host
            found.pieces[path] = {
                k: np.asarray(backend.to_numpy(v), float) for k, v in on_device.items()
            }
            found.pieces[path].update(host[path])
    return found


def _add(sums: dict, host: dict, piece: dict, weight: float, context) -> None:
    """Add one call's pieces to a layer's sums: on the device (G and D weighted by B_k / N),
    or for Conv2d's ``x`` its patches' input factor on the host."""
    backend, layer, with_bias = context
    for key, value in piece.items():
        if key == "x":
            x = np.asarray(backend.to_numpy(value), float)
            host["A"] = host.get("A", 0.0) + input_factor(layer, x, with_bias)
            continue
        value = value if key == "A" else value * weight
        sums[key] = sums[key] + value if key in sums else value


def _compiled_pass(setup, sites: set, structure: str, samples: int | None):
    """The compiled pass ``run(anchor, batch, data, params, key) -> (pieces, rows)`` and the
    dict its tracing fills in (the layers, the exact-diagonal ones), from the model's cache.

    The pass is ``backend.jit`` of the chunk's computation, whose parts go through
    ``backend.trace`` once per shape of their arguments (the last chunk is smaller): the
    identity under JAX's ``jit``, which compiles the whole; on torch, whose ``jit`` is the
    identity, a traced graph per shape instead of a Python walk of the model per chunk. With
    ``samples`` the draws ε are made between two traced halves, from the chunk's key (a trace
    would freeze them): Λ first, then the pieces from Λ and ε."""
    backend, bound = setup.backend, setup.bound
    _, template = bound.data_arrays(backend)
    key = ("laplace-layers", backend.name, backend.precision, str(backend.device))
    slots = tuple((slot.name, tuple(slot.shape)) for slot in setup.layout.slots)
    key += (repr(template), slots, tuple(sorted(sites)), structure, samples)
    key += (tuple(sorted(setup.params)),)
    cache = bound.model.compiled
    if key not in cache:
        info: dict = {}
        whole = traced_by_shape(
            backend, lambda *args: _one_chunk(setup, sites, (structure, None, None), info, args)
        )
        hessians = traced_by_shape(backend, lambda *args: _chunk_hessians(setup, info, args))

        def pieces(*args):
            chunk, (lam, eps) = args[:4], args[4:]
            return _one_chunk(setup, sites, (structure, samples, (lam, eps)), info, chunk)

        sampled = traced_by_shape(backend, pieces)

        def run(anchor, batch, data, params, noise_key):
            args = (anchor, batch, data, params)
            if samples is None:
                return whole(*args)
            lam = hessians(*args)
            if info.get("skipped"):  # no table of outputs: the pass finds nothing
                return {}, lam
            eps = backend.random.normal(noise_key, (samples, lam.shape[1], lam.shape[0]))
            return sampled(*args, lam, eps)

        cache[key] = (backend.jit(run), info)
    return cache[key]


def traced_by_shape(backend, fn):
    """``fn`` through ``backend.trace`` once per shape and dtype of its array arguments (and
    the structure of the others), traced at the first call with them; ``fn`` itself where the
    backend does not trace (JAX: inside ``jit``, which traces by shape itself)."""
    graphs: dict = {}

    def signature(value):
        if backend.is_array(value):
            return (tuple(value.shape), str(value.dtype))
        return repr(value)

    def call(*args):
        sig = repr(backend.tree_map(signature, args))
        if sig not in graphs:
            graphs[sig] = backend.trace(fn, args)
        return graphs[sig](*args)

    return call


def _chunk_hessians(setup, info, args):
    """Λ of the chunk's points, (R, N, R) (:func:`output_hessians`); where the outputs are not
    one row per point, 0 and the refusal in ``info["skipped"]`` (as :func:`_one_chunk`)."""
    anchor, batch, data, params = args
    pots = Potentials(setup, data, params)
    outputs = pots.outputs(anchor, batch)
    try:
        table = OutputTable(setup.backend, outputs)
    except ConfigError as err:
        info["skipped"] = err
        return setup.backend.asarray(0.0)
    return output_hessians(pots, anchor, batch, table)


def _one_chunk(setup, sites, how, info, args):
    """One chunk's pieces (path -> one dict per call of the layer; see :func:`layer_pieces`),
    traced once per chunk size; ``how`` is (structure, samples, (Λ, ε)): with ``samples``, the
    chunk's Λ (:func:`_chunk_hessians`) and the draws ε ~ N(0, I), (samples, N, R)."""
    backend = setup.backend
    structure, samples, drawn = how
    anchor, batch, data, params = args
    pots = Potentials(setup, data, params)
    with LayerProbe() as probe:
        outputs = pots.outputs(anchor, batch)
    calls = probe.calls
    chosen = _chosen_calls(calls, sites, structure)
    info["layers"] = {calls[i].path: calls[i].layer for i in chosen}
    try:
        table = OutputTable(backend, outputs)
    except ConfigError as err:  # raised for "kron" by layer_pieces, outside a trace
        info["skipped"] = err  # the diagonal falls back to Hessian-vector products
        return {}, backend.asarray(0.0)
    if samples is None:
        lam = output_hessians(pots, anchor, batch, table)
        directions = table.units()
    else:
        lam, eps = drawn
        directions = backend.math.einsum("nrs,kns->knr", output_roots(backend, lam), eps)
    jacobians = output_jacobians(pots, anchor, batch, table, calls, chosen, directions)
    paths = [calls[i].path for i in chosen]
    pieces, exact = {}, []
    for i, jac in zip(chosen, jacobians, strict=True):
        call = calls[i]
        if samples is None:
            h = weighted(backend, lam, jac.reshape(table.width, table.rows, -1))
        else:  # the draws' mean: G ≈ Σ_k m̃_kᵀ m̃_k / S
            h = jac * (1.0 / samples)
        with_bias = f"{call.path}.bias" in sites
        piece = _layer_piece(backend, call, jac, h.reshape(jac.shape), with_bias, structure)
        once = paths.count(call.path) == 1 and "D" in piece
        if structure == "diag" and not once:
            continue
        exact += [call.path] if once else []
        pieces.setdefault(call.path, []).append(piece)
    info["diagonal"] = exact
    return pieces, backend.asarray(float(table.rows))


def weighted(backend, lam, jac):
    """h_r = Σ_s Λ_rs m_s at every point: ``lam`` (R, N, R), ``jac`` (R, N, k) -> (R, N, k),
    as a matrix product batched over the leading axis of the points (XLA runs it several
    times faster than an einsum over the middle axis, or a broadcast product)."""
    m = backend.math
    order = (1, 0, 2)
    return m.transpose(m.matmul(m.transpose(lam, order), m.transpose(jac, order)), order)


def output_roots(backend, lam):
    """L_n with L_n L_nᵀ = Λ_n at every point, (N, R, R), from ``lam`` (R, N, R): Λ_n's
    eigenvectors scaled by the roots of its eigenvalues (a softmax's Λ_n is singular, which a
    Cholesky factor would not take; round-off's negative eigenvalues count as 0)."""
    m = backend.math
    values, vectors = m.eigh(m.transpose(lam, (1, 0, 2)))
    return vectors * m.sqrt(m.maximum(values, 0.0))[:, None, :]


def _chosen_calls(calls, sites: set, structure: str) -> list[int]:
    """The layer calls whose weight is Gaussian: each checked for ``"kron"``, the Dense ones
    for ``"diag"``."""
    chosen = []
    for i, call in enumerate(calls):
        if f"{call.path}.weight" not in sites:
            continue
        if structure == "kron":
            check_layer(call)
        elif not isinstance(call.layer, Dense):
            continue
        chosen.append(i)
    return chosen


def _layer_piece(backend, call, jac, h, with_bias: bool, structure: str) -> dict:
    """One call's pieces from its output Jacobian rows ``jac`` and ``h`` = Λ ``jac``, both
    (R, *out_shape)."""
    m = backend.math
    layer, width = call.layer, jac.shape[0]
    if not isinstance(layer, Dense):  # Conv2d: channels are G's rows; the patches on the host
        return {"G": m.einsum("rnchw,rndhw->cd", jac, h), "x": call.x}
    rows = call.x.reshape(-1, layer.in_features)
    if with_bias:
        rows = m.concatenate([rows, m.ones_like(rows[:, :1])], axis=1)
    jac, h = jac.reshape(width, -1, layer.out_features), h.reshape(width, -1, layer.out_features)
    if structure == "kron":  # G = Σ_r m_rᵀ h_r: one matrix product over every (r, point)
        flat = layer.out_features
        return {
            "A": m.matmul(rows.T, rows),
            "G": m.matmul(jac.reshape(-1, flat).T, h.reshape(-1, flat)),
        }
    if rows.shape[0] != jac.shape[1] or len(call.x.shape) != 2:
        return {}  # several rows per data point: the diagonal does not separate
    # Σ_r m_r ⊙ h_r as a product with ones: XLA's sum over a leading axis is far slower
    ones = m.ones_like(jac[:, :1, 0].T)  # (1, R)
    diag = m.matmul(ones, (jac * h).reshape(width, -1)).reshape(jac.shape[1:])
    return {"D": m.matmul((rows * rows).T, diag)}


def layer_coordinates(setup, path: str, layer, sites: set) -> np.ndarray:
    """The flat coordinates of layer ``path``'s W̃ (:mod:`~ppl_bdl.inference.laplace.kron_layers`;
    without the bias when it is not among the Gaussian ``sites``)."""
    slots = {s.name: s for s in setup.layout.slots}

    def run(name):
        return np.arange(slots[name].offset, slots[name].offset + slots[name].size)

    bias = run(f"{path}.bias") if f"{path}.bias" in sites else None
    return coordinates(layer, run(f"{path}.weight"), bias)


class OutputTable:
    """The likelihood's outputs f as one (N, R) table: a row per data point (the outputs'
    first axis), R output dimensions per point, and back."""

    def __init__(self, backend, outputs: dict):
        self.backend = backend
        self.entries, widths, rows = [], [], set()
        for site, params in outputs.items():
            for key, value in params.items():
                shape = tuple(value.shape)
                rows.add(shape[0] if shape else None)
                self.entries.append((site, key, shape))
                widths.append(int(np.prod(shape[1:])) if shape else 1)
        if len(rows) != 1 or None in rows:
            raise ConfigError(
                "hessian='kron' treats the first axis of the likelihood's outputs as the data "
                f"points; the outputs have shapes {[e[2] for e in self.entries]}. Use "
                "hessian='diag' for a model whose outputs are not laid out one row per point."
            )
        self.rows, self.width = rows.pop(), int(sum(widths))
        self.stops = np.cumsum(widths)
        self.value = self.flatten(outputs)

    def flatten(self, outputs: dict):
        m = self.backend.math
        parts = [outputs[s][k].reshape(self.rows, -1) for s, k, _ in self.entries]
        return m.concatenate(parts, axis=1) if len(parts) > 1 else parts[0]

    def unflatten(self, table) -> dict:
        out: dict = {}
        for (site, key, shape), stop in zip(self.entries, self.stops, strict=True):
            width = int(np.prod(shape[1:])) if len(shape) > 1 else 1
            out.setdefault(site, {})[key] = table[:, stop - width : stop].reshape(shape)
        return out

    def units(self):
        """The R unit directions, one per output dimension at every point: (R, N, R)."""
        basis = np.zeros((self.width, self.rows, self.width))
        basis[np.arange(self.width), :, np.arange(self.width)] = 1.0
        return self.backend.asarray(basis)


def output_hessians(pots, anchor, batch, table: OutputTable):
    """Λ_n = ∇²_f −log p(y_n | f_n) of every point as (R, N, R) (Λ_n[r, s] at [r, n, s]):
    a Hessian-vector product per output dimension, vmapped."""
    backend, m = pots.backend, pots.backend.math

    def loss(value):
        return m.sum(pots.potential(anchor, batch, table.unflatten(value), True))

    grad = backend.grad(loss)

    def product(direction):
        return backend.grad(lambda t: m.sum(grad(t) * direction))(table.value)

    return backend.vmap(product)(table.units())


def output_jacobians(pots, anchor, batch, table: OutputTable, calls, chosen, directions) -> list:
    """For each chosen layer call, ``directions`` (K, N, R) pulled back to its pre-activation s:
    (K, *s.shape), the gradient of ⟨f, v_k⟩ with respect to a shift of s, vmapped over k (the
    rows of ∂f/∂s for the unit directions)."""
    backend, m = pots.backend, pots.backend.math
    sizes = [int(np.prod(calls[i].out_shape)) for i in chosen]
    starts = dict(zip(chosen, np.cumsum([0, *sizes[:-1]]).tolist(), strict=True))

    def paired(shifts, direction):
        def shift(i, shape):
            if i not in starts:
                return 0.0
            return shifts[starts[i] : starts[i] + int(np.prod(shape))].reshape(shape)

        with LayerProbe(shift=shift):
            outputs = pots.outputs(anchor, batch)
        return m.sum(table.flatten(outputs) * direction)

    zero = backend.asarray(np.zeros(int(sum(sizes))))
    grads = backend.vmap(lambda v: backend.grad(lambda s: paired(s, v))(zero))(directions)
    return [
        grads[:, starts[i] : starts[i] + size].reshape(-1, *calls[i].out_shape)
        for i, size in zip(chosen, sizes, strict=True)
    ]
