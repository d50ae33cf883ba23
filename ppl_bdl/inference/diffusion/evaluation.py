"""Held-out evaluation of a score model: how far its draws are from data, and the baseline a
trained model should beat.

- :func:`energy_distance` between two samples (Székely and Rizzo 2013):
  2 E‖X − Y‖ − E‖X − X'‖ − E‖Y − Y'‖, zero exactly when the two laws are equal, estimated
  without bias (the within-sample means leave out each point's distance to itself).
- :func:`fit_gaussian`: the :class:`~ppl_bdl.inference.diffusion.model.ScoreModel` of the
  exact score of N(x̄, Ĉ), the Gaussian fitted to the data, perturbed by the SDE. Its held-out
  loss (``loss_terms``) and its draws are what a score network should improve on: it has the
  data's mean and covariance and nothing else.

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> rng = np.random.default_rng(0)
>>> X = rng.normal(size=(2000, 2)) * [1.0, 0.2]
>>> gauss = bdl.diffusion.fit_gaussian(X, sde="vp", backend="numpyro")
>>> x = gauss.sample(2000, sampler="ode", steps=100, seed=1)
>>> abs(bdl.diffusion.energy_distance(x, rng.normal(size=(2000, 2)) * [1.0, 0.2])) < 0.01
True
>>> bdl.diffusion.energy_distance(X, X + 1.0) > 0.5
True
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ppl_bdl.dsl import math as bm
from ppl_bdl.errors import DataError
from ppl_bdl.inference.diffusion.model import ScoreModel
from ppl_bdl.inference.diffusion.sde import make_sde
from ppl_bdl.inference.ebm.energy import check_data

#: Rows of one block of pairwise distances (a block holds ROWS x n of them).
ROWS = 512


def energy_distance(x, y) -> float:
    """The energy distance between the samples ``x`` (n, ...) and ``y`` (m, ...) (Székely and
    Rizzo 2013): 2 E‖X − Y‖ − E‖X − X'‖ − E‖Y − Y'‖, Euclidean distances between rows (an
    image's pixels are flattened), the within-sample means over the n(n − 1) pairs of distinct
    rows: an unbiased estimate, zero on average when both samples come from one law (it can
    then be slightly negative). Its square root is a metric between laws.

    Parameters
    ----------
    x, y : arrays (n, ...) and (m, ...)
        Two samples of points of the same shape, at least 2 of each; 1-D arrays are samples of
        numbers.

    Returns
    -------
    float

    Example
    -------
    >>> import numpy as np
    >>> from ppl_bdl.inference.diffusion import energy_distance
    >>> energy_distance([0.0, 1.0], [0.0, 1.0])   # 2 · ½ − 1 − 1
    -1.0
    """
    x, y = _sample_rows("x", x), _sample_rows("y", y)
    if x.shape[1] != y.shape[1]:
        raise DataError(
            f"energy_distance: the samples' points differ in size: x has {x.shape[1]} numbers "
            f"per row, y has {y.shape[1]}; both must be draws of points of one shape."
        )
    between = _distance_sum(x, y) / (len(x) * len(y))
    within_x = _distance_sum(x, x) / (len(x) * (len(x) - 1))
    within_y = _distance_sum(y, y) / (len(y) * (len(y) - 1))
    return float(2.0 * between - within_x - within_y)


def _sample_rows(name: str, sample) -> np.ndarray:
    array = np.asarray(sample, dtype=float)
    array = array.reshape(len(array), -1) if array.ndim != 1 else array[:, None]
    if len(array) < 2 or array.shape[1] == 0:
        raise DataError(
            f"energy_distance: {name} has shape {np.shape(sample)}; it needs at least 2 points."
        )
    if not np.isfinite(array).all():
        raise DataError(f"energy_distance: {name} holds non-finite values; drop those rows first.")
    return array


def _distance_sum(a: np.ndarray, b: np.ndarray) -> float:
    """Σ_ij ‖a_i − b_j‖ by blocks of rows, from the norms and inner products (a point's
    distance to itself, when ``a is b``, is zero whatever the rounding)."""
    squares_b = (b * b).sum(1)
    total = 0.0
    for start in range(0, len(a), ROWS):
        block = a[start : start + ROWS]
        d2 = (block * block).sum(1)[:, None] + squares_b[None, :] - 2.0 * block @ b.T
        distances = np.sqrt(np.maximum(d2, 0.0))
        if a is b:
            rows = np.arange(len(block))
            distances[rows, start + rows] = 0.0
        total += float(distances.sum())
    return total


def fit_gaussian(
    X,
    *,
    sde: Any = "vp",
    backend: str | None = None,
    precision: str = "float32",
    device: str | None = None,
) -> ScoreModel:
    """The score model of N(x̄, Ĉ) fitted to ``X`` (N, D): x̄ the mean, Ĉ = U diag(λ) Uᵀ the
    covariance (divided by N). Under the SDE's kernel p_t = N(a(t) x̄, a(t)² Ĉ + σ(t)² I), so

        s(x, t) = −U diag(1 / (a(t)² λ + σ(t)²)) Uᵀ (x − a(t) x̄),

    exactly (no training). A baseline for a trained model's held-out loss
    (:meth:`ScoreModel.loss_terms`, on the same points and seed) and draws.

    Parameters
    ----------
    X : array (N, D)
        The training points.
    sde : "ve", "vp", VESDE or VPSDE
        As for :func:`~ppl_bdl.inference.diffusion.fit` ("ve": σ_max from ``X``).
    backend, precision, device
        As for :func:`ppl_bdl.run.fit`.

    Returns
    -------
    ScoreModel

    Example
    -------
    >>> import numpy as np, ppl_bdl as bdl
    >>> z = np.random.default_rng(0).normal(size=(1000, 1))
    >>> X = 3.0 + 0.5 * (z - z.mean()) / z.std()    # mean 3, sd 0.5 exactly
    >>> gauss = bdl.diffusion.fit_gaussian(X, sde="vp", backend="numpyro")
    >>> round(float(gauss.score([[3.5]], t=0.001)[0, 0]), 2)   # −(x − x̄) / Ĉ at t ≈ 0
    -2.0
    """
    X = check_data(X, precision)
    if X.ndim != 2:
        raise DataError(
            f"X has shape {X.shape}; fit_gaussian takes points of D numbers, (N, D). Flatten "
            "them first: X.reshape(len(X), -1)."
        )
    sde = make_sde(sde).fitted_to(X)
    data = X.astype(float)
    eigenvalues, rotation = np.linalg.eigh(np.cov(data.T, bias=True).reshape(X.shape[1], -1))
    dtype = X.dtype
    mean = data.mean(0).astype(dtype)[None, :]
    variances = np.maximum(eigenvalues, 0.0).astype(dtype)[None, :]
    rotation = rotation.astype(dtype)

    def score(x, t):
        a, s = sde.mean_coef(t, bm), sde.std(t, bm)
        u = bm.asarray(rotation)
        centred = bm.matmul(x - a * bm.asarray(mean), u)
        return -bm.matmul(centred / (a * a * bm.asarray(variances) + s * s), bm.transpose(u))

    return ScoreModel(
        score, dim=X.shape[1], sde=sde, backend=backend, precision=precision, device=device
    )
