"""``hessian="kron"``: the Kronecker-factored generalised Gauss-Newton (KFAC) of ``nn.Dense``
and ``nn.Conv2d`` layers (Martens & Grosse 2015; Grosse & Martens 2016; Ritter, Botev & Barber
2018; Daxberger et al. 2021).

Each layer gets its own block of the precision, over its weight and bias together as one
matrix W̃ (for a Dense layer s = x W + b, W̃ = [W; b], (in + 1, out), its input a = [x, 1]):

    P_layer ≈ (A / N) ⊗ G + δ I,   A = Σ_n a_n a_nᵀ,   G = Σ_n M_nᵀ Λ_n M_n,

summed over the N data points, where M_n = ∂f_n/∂s_n is the Jacobian of the likelihood's
outputs f_n in the layer's pre-activation and Λ_n the likelihood's Hessian in f_n (the GGN's
Λ, see :mod:`~ppl_bdl.inference.laplace.curvature`): the exact-type KFAC of the GGN, with
laplace-torch's (asdl's) scaling (the input factor divided by N). With one output per data
point and one layer it is the exact GGN. A and G come from one compiled pass per chunk of the
data (:mod:`~ppl_bdl.inference.laplace.layer_ggn`); Λ_n is computed by autodiff, so every
family of :data:`~ppl_bdl.inference.laplace.potentials.OUTPUTS` works. Convolutions use the
KFC expansion (patches as inputs, positions as extra data points;
:mod:`~ppl_bdl.inference.laplace.kron_layers`).
laplace-torch keeps a Dense layer's bias in a block of its own (its weight block G ⊗ A, its
bias block G): the same blocks as ours, less our weight-bias cross terms (Σ_n x_n / N) ⊗ G
(``benchmarks/laplace_torch.py`` compares them).
δ is the layer's Normal prior precision (one value over weight and bias) plus ``damping``.
The layers are found by running the model inside a :class:`~ppl_bdl.dsl.nn.probe.LayerProbe`.

A block is kept as its two factors' eigendecompositions F = Q diag(λ) Qᵀ (Ritter et al. 2018,
Sec. 3): the block's eigenvalues are λ_left λ_rightᵀ + δ, so its log determinant is their logs'
sum and a draw is W̃* + Q_left (Z ⊘ √(λ_left λ_rightᵀ + δ)) Q_rightᵀ with Z standard normal
shaped as W̃: two small matmuls per layer, never a (d, d) matrix. The layers' blocks are
independent of each other and of every other latent site; those keep a full block (up to
:data:`REST_FULL_LIMIT` coordinates) or a diagonal one.

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import dist, nn
>>> @bdl.model
... def m(X, y):
...     f = nn.Dense("fc", 2, 1).sample()
...     with bdl.plate("data", X.shape[0]) as idx:
...         bdl.sample("y", dist.Normal(f(X[idx])[..., 0], 0.5), obs=y[idx])
>>> X = np.random.default_rng(0).normal(size=(8, 2)); y = X[:, 0]
>>> post = bdl.fit(m(X, y), backend="numpyro", method="laplace", hessian="kron",
...                num_steps=200, lr=0.05, progress=False)
>>> [block.coords.shape for block in post.guide.blocks]      # (in + 1, out)
[(3, 1)]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from ppl_bdl.errors import ConfigError, InferenceError
from ppl_bdl.inference.laplace.approximation import LaplaceApproximation, checked_precision
from ppl_bdl.inference.laplace.curvature import curvature
from ppl_bdl.inference.laplace.kron_layers import kronecker_order
from ppl_bdl.inference.laplace.layer_ggn import layer_coordinates, layer_pieces
from ppl_bdl.inference.laplace.marglik import normal_prior
from ppl_bdl.inference.laplace.potentials import check_outputs, output_free_parameters

#: The most coordinates outside the nn layers that keep a full block (beyond: its diagonal).
REST_FULL_LIMIT = 512
#: Draws made at once (bounds the memory of a draw's per-layer temporaries).
DRAWS_PER_CHUNK = 128


@dataclass
class KronBlock:
    """One layer's block (left ⊗ right + δ I) over the flat coordinates ``coords`` ((rows,
    cols): its C-order ravel is the order of the Kronecker product's rows), from the factors'
    eigenvalues and eigenvectors (Dense: left = A / N, right = G; Conv2d: G and A / N)."""

    coords: np.ndarray
    values_left: np.ndarray
    vectors_left: np.ndarray
    values_right: np.ndarray
    vectors_right: np.ndarray
    delta: float

    @classmethod
    def from_factors(cls, coords, left, right, delta: float) -> KronBlock:
        values_left, vectors_left = np.linalg.eigh(0.5 * (left + left.T))
        values_right, vectors_right = np.linalg.eigh(0.5 * (right + right.T))
        # the factors are sums of outer products: PSD up to round-off
        values_left, values_right = (
            np.clip(values_left, 0.0, None),
            np.clip(values_right, 0.0, None),
        )
        return cls(
            np.asarray(coords, int), values_left, vectors_left, values_right, vectors_right, delta
        )

    def eigenvalues(self) -> np.ndarray:
        """The block's eigenvalues λ_left λ_rightᵀ + δ, (rows, cols)."""
        return np.outer(self.values_left, self.values_right) + self.delta

    def factors(self) -> tuple[np.ndarray, np.ndarray]:
        """The left and right factors (the input side already divided by N)."""
        left = (self.vectors_left * self.values_left) @ self.vectors_left.T
        return left, (self.vectors_right * self.values_right) @ self.vectors_right.T

    def matrix(self) -> np.ndarray:
        """left ⊗ right + δ I as a matrix (small layers only: tests, ``precision_matrix``)."""
        a, g = self.factors()
        return np.kron(a, g) + self.delta * np.eye(self.coords.size)

    def log_det(self) -> float:
        return float(np.sum(np.log(self.eigenvalues())))

    def shift(self, z: np.ndarray) -> np.ndarray:
        """(num, rows, cols) standard normals -> draws of N(0, block⁻¹) laid out as ``coords``."""
        scaled = z / np.sqrt(self.eigenvalues())
        return self.vectors_left @ scaled @ self.vectors_right.T


@dataclass
class KronLaplaceApproximation(LaplaceApproximation):
    """N(θ*, P⁻¹) with P block diagonal: one :class:`KronBlock` per layer (``blocks``),
    and a full or diagonal block (``rest_structure``) over the other Gaussian coordinates
    (``rest_index``; ``precision`` is that block)."""

    blocks: list = field(default_factory=list)
    rest_index: np.ndarray = field(default_factory=lambda: np.zeros(0, int))
    rest_structure: str = "diag"
    name: ClassVar[str] = "laplace"

    def __post_init__(self) -> None:
        self.mode = np.asarray(self.mode, float)
        self.index = np.asarray(self.index, int)
        self.rest_index = np.asarray(self.rest_index, int)
        self.rest = LaplaceApproximation(
            self.mode, self.rest_index, self.precision, self.rest_structure
        )

    @property
    def phi(self) -> np.ndarray:
        parts = [self.mode, np.ravel(self.precision)]
        for b in self.blocks:
            parts += [
                b.values_left,
                b.vectors_left.ravel(),
                b.values_right,
                b.vectors_right.ravel(),
            ]
        return np.concatenate(parts)

    def precision_matrix(self) -> np.ndarray:
        """P over ``index`` as a (k, k) matrix (for small models: checks and comparisons)."""
        size = len(self.index)
        if size > 4096:
            raise ConfigError(
                f"precision_matrix() would build a {size} x {size} matrix; the limit is 4096."
            )
        where = {int(c): i for i, c in enumerate(self.index)}
        out = np.zeros((size, size))
        for b in self.blocks:
            at = np.array([where[int(c)] for c in b.coords.ravel()])
            out[np.ix_(at, at)] = b.matrix()
        if len(self.rest_index):
            at = np.array([where[int(c)] for c in self.rest_index])
            rest = self.precision if self.rest_structure == "full" else np.diag(self.precision)
            out[np.ix_(at, at)] = rest
        return out

    def covariance(self) -> np.ndarray:
        return np.linalg.inv(self.precision_matrix())

    def log_det_precision(self) -> float:
        rest = self.rest.log_det_precision() if len(self.rest_index) else 0.0
        return rest + sum(b.log_det() for b in self.blocks)

    def sample(self, num: int, seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        draws = np.repeat(self.mode[None], num, axis=0)
        if len(self.rest_index):
            draws[:, self.rest_index] = self.rest.sample(num, int(rng.integers(2**31)))[
                :, self.rest_index
            ]
        for b in self.blocks:
            flat = b.coords.ravel()
            for start in range(0, num, DRAWS_PER_CHUNK):
                rows = slice(start, min(start + DRAWS_PER_CHUNK, num))
                z = rng.standard_normal((rows.stop - rows.start, *b.coords.shape))
                draws[rows, flat] += b.shift(z).reshape(len(z), -1)
        return draws


def fit_kron(
    setup, mode, index, sites, batch_size, damping, seed, num_samples, settings, ggn_samples=None
):
    """The :class:`KronLaplaceApproximation` at ``mode`` over the coordinates ``index`` (the
    latent ``sites``); ``ggn_samples`` (None: exact) estimates the factors G by that many
    draws per point (:mod:`~ppl_bdl.inference.laplace.layer_ggn`)."""
    check_outputs(setup)
    found = layer_pieces(setup, mode, set(sites), batch_size, "kron", ggn_samples, seed)
    blocks = []
    for path, layer in found.layers.items():
        coords = layer_coordinates(setup, path, layer, set(sites))
        delta = layer_prior_precision(setup, path, coords) + (damping or 0.0)
        pieces = found.pieces[path]
        left, right = kronecker_order(layer, pieces["A"] / found.rows, pieces["G"])
        blocks.append(KronBlock.from_factors(coords, left, right, delta))
        if np.min(blocks[-1].eigenvalues()) <= 0:
            raise InferenceError(
                f"method='laplace' with hessian='kron': layer {path!r}'s block is singular (its "
                "prior precision is 0). Give its weights a Normal prior or pass damping=..."
            )
    covered = np.concatenate([b.coords.ravel() for b in blocks]) if blocks else np.zeros(0, int)
    check_layers_reach_outputs_only(setup, mode, covered, batch_size)
    outside = np.ones(setup.layout.dim, bool)
    outside[covered] = False
    rest_index = index[outside[index]]
    structure = "full" if 0 < len(rest_index) <= REST_FULL_LIMIT else "diag"
    rest = np.zeros(0)
    if len(rest_index):
        matrix = curvature(setup, mode, structure, "ggn", rest_index, batch_size)
        rest = checked_precision(matrix, structure, damping, "ggn")
    return KronLaplaceApproximation(
        mode,
        index,
        rest,
        "kron",
        tuple(sites),
        settings,
        seed,
        num_samples,
        blocks=blocks,
        rest_index=rest_index,
        rest_structure=structure,
    )


def check_layers_reach_outputs_only(setup, mode, covered: np.ndarray, batch_size) -> None:
    """A ConfigError when a likelihood parameter other than its outputs (a Normal's scale)
    depends on the layers' weights ``covered``: KFAC's factors see the likelihood's curvature
    in its outputs only, so those weights would keep their prior's precision in the directions
    that move the parameter (a heteroscedastic head's scale output)."""
    if not len(covered):
        return
    found = output_free_parameters(setup, mode, covered, batch_size)
    if found:
        raise ConfigError(
            f"method='laplace' with hessian='kron': the parameter(s) {found} of the likelihood "
            "depend on the nn layers' weights (a network that outputs its noise scale, a "
            "heteroscedastic head). KFAC builds each layer's factors from the curvature of the "
            "likelihood in its outputs only (a Normal's loc), so the weights that move "
            f"{found} would keep their prior's precision and the predictive would draw them from "
            "the prior. Use hessian='full' or 'diag' (which keep that curvature exactly; add "
            "damping=... if it is indefinite there), or give the noise scale a site of its own "
            "(one scale for all points)."
        )


def layer_prior_precision(setup, path: str, coords: np.ndarray) -> float:
    """δ: the one Normal prior precision of a layer's weight and bias; a ConfigError when they
    differ or are not Normal."""
    lam, _ = normal_prior(setup, coords.ravel())
    if np.all(lam == lam.flat[0]) and lam.flat[0] > 0:
        return float(lam.flat[0])
    raise ConfigError(
        f"hessian='kron' adds one prior precision δ to layer {path!r}'s Kronecker block (its "
        "eigenvalues are λ_A λ_G + δ); its weight and bias priors give precisions "
        f"{sorted(set(np.round(lam, 12).tolist()))} (0: not a Normal with fixed scale). Give the "
        "weight and bias one Normal prior (bias_prior=None), or use hessian='diag'."
    )
