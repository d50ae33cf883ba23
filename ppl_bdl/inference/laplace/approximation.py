"""The Gaussian a Laplace fit found: N(θ*, P⁻¹) on the flat unconstrained vector.

:class:`LaplaceApproximation` is ``post.guide`` of ``method="laplace"``: the MAP θ* (every
coordinate), the coordinates that are Gaussian (``index``: all, or the last layer's), their
precision P (a matrix for ``hessian="full"``, its diagonal for ``"diag"``) and its Cholesky
factor. It draws from the Gaussian, gives the covariance and log det P, and runs the
linearised predictive (``post.predict(..., pred_type="glm")``,
:mod:`ppl_bdl.inference.laplace.glm`).

Example
-------
>>> import numpy as np
>>> from ppl_bdl.inference.laplace.approximation import LaplaceApproximation
>>> approx = LaplaceApproximation(np.zeros(2), np.arange(2), np.diag([4.0, 1.0]), "full")
>>> approx.covariance().tolist()
[[0.25, 0.0], [0.0, 1.0]]
>>> approx.sample(20000, seed=0).std(axis=0).round(1).tolist()
[0.5, 1.0]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from ppl_bdl.errors import InferenceError
from ppl_bdl.inference.laplace.glm import glm_predictive


@dataclass
class LaplaceApproximation:
    """N(θ*, P⁻¹) over the coordinates ``index`` of the flat unconstrained vector, every other
    coordinate held at ``mode`` (θ*). ``precision``: (k, k) for ``structure="full"``, (k,) for
    ``"diag"``; positive definite (checked by :func:`checked_precision`). ``sites``: the latent
    sites that are Gaussian; ``settings``: what the fit used (JSON values); ``seed`` and
    ``num_samples``: the fit's draws (:meth:`fit_draws` makes them again)."""

    mode: np.ndarray
    index: np.ndarray
    precision: np.ndarray
    structure: str
    sites: tuple[str, ...] = ()
    settings: dict = field(default_factory=dict)
    seed: int = 0
    num_samples: int = 0
    #: What a saved posterior names the fitted approximation (``post.save``).
    name: ClassVar[str] = "laplace"

    def __post_init__(self) -> None:
        self.mode = np.asarray(self.mode, float)
        self.index = np.asarray(self.index, int)
        self.precision = np.asarray(self.precision, float)
        if self.structure == "full":
            self._factor = np.linalg.cholesky(self.precision)  # P = L Lᵀ

    @property
    def phi(self) -> np.ndarray:
        """θ* and the precision in one vector (what a saved posterior keeps)."""
        return np.concatenate([self.mode, self.precision.ravel()])

    def covariance(self) -> np.ndarray:
        """P⁻¹: (k, k) for a full precision, its diagonal (k,) for a diagonal one."""
        if self.structure == "diag":
            return 1.0 / self.precision
        return np.linalg.inv(self.precision)

    def log_det_precision(self) -> float:
        """log det P."""
        if self.structure == "diag":
            return float(np.sum(np.log(self.precision)))
        return float(2.0 * np.sum(np.log(np.diag(self._factor))))

    def sample(self, num: int, seed: int) -> np.ndarray:
        """``num`` flat draws (num, d): θ* with the Gaussian coordinates θ*_S + L⁻ᵀ z, z ~ N(0, I)
        (a diagonal precision: θ*_S + z / √p)."""
        from scipy.linalg import solve_triangular

        z = np.random.default_rng(seed).standard_normal((num, len(self.index)))
        if self.structure == "diag":
            shift = z / np.sqrt(self.precision)
        else:
            shift = solve_triangular(self._factor.T, z.T, lower=False).T
        draws = np.repeat(self.mode[None], num, axis=0)
        draws[:, self.index] += shift
        return draws

    def fit_draws(self) -> np.ndarray:
        """The draws of the fit's posterior (flat), made again from its seed."""
        return self.sample(self.num_samples, self.seed)

    def glm_predictive(self, bound, backend, sites, num_samples, seed, params) -> tuple:
        """The linearised predictive's draws and moments (see
        :func:`ppl_bdl.inference.laplace.glm.glm_predictive`)."""
        return glm_predictive(self, bound, backend, sites, num_samples, seed, params)


def checked_precision(
    precision: np.ndarray, structure: str, damping: float | None, curvature: str = "hessian"
) -> np.ndarray:
    """``precision`` with ``damping`` added to its diagonal; an InferenceError, saying how many
    eigenvalues are not positive and the smallest, when it is not positive definite, and what
    to change for the ``curvature`` ("hessian" or "ggn") it came from."""
    precision = np.array(precision, float)
    if damping:
        if structure == "diag":
            precision = precision + damping
        else:
            precision = precision + damping * np.eye(len(precision))
    if structure == "full":
        precision = 0.5 * (precision + precision.T)  # round-off of a symmetric Hessian
        values = np.linalg.eigvalsh(precision)
    else:
        values = precision
    bad = values[~(values > 0)]
    if bad.size:
        smallest = float(np.nanmin(values)) if np.isfinite(values).any() else float("nan")
        where = f" after damping={damping:g}" if damping else ""
        if curvature == "ggn":
            why = (
                "The GGN is positive semi-definite in the likelihood's outputs (a Normal's loc); "
                "every other term keeps its exact curvature, which can be indefinite: a noise "
                "scale that the network outputs (a heteroscedastic head), a factor, a "
                "non-Normal prior. Give the noise scale a site of its own (one scale for all "
                "points), or pass "
            )
        else:
            why = (
                "The point found is not a minimum of the potential (run more num_steps, a "
                "smaller lr, or start from a better init), or the Hessian is indefinite there: "
                "use curvature='ggn' (positive semi-definite in the likelihood's outputs), or "
                "pass "
            )
        raise InferenceError(
            f"method='laplace': the precision ({structure}, {len(values)} coordinates) at the "
            f"MAP is not positive definite{where}: {bad.size} eigenvalue(s) <= 0 (or not "
            f"finite), the smallest {smallest:.4g}. {why}"
            f"damping={_suggest(smallest, damping)} to add that to the diagonal."
        )
    return precision


def _suggest(smallest: float, damping: float | None) -> str:
    if not np.isfinite(smallest):
        return "a positive number"
    need = (damping or 0.0) - smallest
    return f"{float(f'{max(need, 1e-12) * 1.1:.2g}'):g}"
