"""Linear and logistic regression in the DSL, plus small synthetic data sets.

:func:`linear_regression_known_noise` is conjugate: its posterior is Gaussian in closed form
(:func:`conjugate_posterior`), which the test suite uses as an exact check of the samplers.

Example
-------
>>> import ppl_bdl as bdl
>>> from ppl_bdl.models import regression
>>> X, y = regression.make_regression_data(n=50, d=3, seed=0)
>>> post = bdl.fit(regression.linear_regression(X, y), backend="numpyro", num_warmup=200,
...                num_samples=200, num_chains=1, progress=False)
>>> post.samples["w"].shape
(1, 200, 3)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

import ppl_bdl as bdl
from ppl_bdl import dist
from ppl_bdl.errors import ConfigError

_PACKAGE_DATA = Path(__file__).resolve().parent / "data"
SINE_CSV = _PACKAGE_DATA / "sine_regression.csv"
DIABETES = _PACKAGE_DATA / "diabetes"
DIABETES_SCALINGS = ("standard", "sklearn", None)


# -- models ---------------------------------------------------------------------------------------
@bdl.model
def linear_regression(X, y=None, prior_scale: float = 1.0):
    """``y ~ Normal(b + X @ w, sigma)`` with ``w ~ N(0, prior_scale²)``, ``b ~ N(0, 10²)``,
    ``sigma ~ HalfNormal(1)``."""
    w = bdl.sample("w", dist.Normal(0.0, prior_scale), shape=(X.shape[1],))
    b = bdl.sample("b", dist.Normal(0.0, 10.0))
    sigma = bdl.sample("sigma", dist.HalfNormal(1.0))
    with bdl.plate("data", X.shape[0]) as idx:
        bdl.sample("y", dist.Normal(b + X[idx] @ w, sigma), obs=None if y is None else y[idx])


@bdl.model
def linear_regression_known_noise(X, y=None, noise: float = 1.0, prior_scale: float = 1.0):
    """``y ~ Normal(X @ w, noise)`` with ``w ~ N(0, prior_scale² I)`` and the noise known: the
    posterior of ``w`` is Gaussian, see :func:`conjugate_posterior`."""
    w = bdl.sample("w", dist.Normal(0.0, prior_scale), shape=(X.shape[1],))
    with bdl.plate("data", X.shape[0]) as idx:
        bdl.sample("y", dist.Normal(X[idx] @ w, noise), obs=None if y is None else y[idx])


@bdl.model
def logistic_regression(X, y=None, prior_scale: float = 1.0):
    """``y ~ Bernoulli(logits = b + X @ w)`` with ``w ~ N(0, prior_scale²)``, ``b ~ N(0, 5²)``."""
    w = bdl.sample("w", dist.Normal(0.0, prior_scale), shape=(X.shape[1],))
    b = bdl.sample("b", dist.Normal(0.0, 5.0))
    with bdl.plate("data", X.shape[0]) as idx:
        bdl.sample("y", dist.Bernoulli(logits=b + X[idx] @ w), obs=None if y is None else y[idx])


def conjugate_posterior(
    X: np.ndarray, y: np.ndarray, noise: float, prior_scale: float
) -> tuple[np.ndarray, np.ndarray]:
    """Exact posterior mean and covariance of ``w`` in :func:`linear_regression_known_noise`.

    With prior ``w ~ N(0, s² I)`` and likelihood ``y ~ N(X w, σ² I)``:
    ``Σ = (XᵀX / σ² + I / s²)⁻¹`` and ``μ = Σ Xᵀ y / σ²`` (Bishop, *Pattern Recognition and
    Machine Learning*, 2006, Eqs. 3.53-3.54 with m₀ = 0, S₀ = s² I, β = 1/σ²).

    Example
    -------
    >>> X = np.eye(2); y = np.array([1.0, 2.0])
    >>> mean, cov = conjugate_posterior(X, y, noise=1.0, prior_scale=1.0)
    >>> mean.tolist(), np.diag(cov).tolist()
    ([0.5, 1.0], [0.5, 0.5])
    """
    X = np.asarray(X, dtype=float)
    y = np.asarray(y, dtype=float)
    precision = X.T @ X / noise**2 + np.eye(X.shape[1]) / prior_scale**2
    cov = np.linalg.inv(precision)
    return cov @ X.T @ y / noise**2, cov


# -- data -----------------------------------------------------------------------------------------
def make_regression_data(
    n: int = 100, d: int = 3, noise: float = 0.3, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian inputs and ``y = X @ w_true + 0.5 + noise * ε`` with ``w_true = linspace(1, -1, d)``."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    w = np.linspace(1.0, -1.0, d)
    return X, X @ w + 0.5 + noise * rng.normal(size=n)


def make_classification_data(
    n: int = 100, d: int = 2, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian inputs and labels ``y ~ Bernoulli(sigmoid(X @ w_true))`` (0/1 floats)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    logits = X @ np.linspace(2.0, -1.0, d)
    return X, (rng.uniform(size=n) < 1.0 / (1.0 + np.exp(-logits))).astype(float)


def make_sine_data(
    n: int = 80, noise: float = 0.15, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """A 1-D regression set with a gap: ``x`` in [-3, -0.8] ∪ [0.8, 3], ``y = sin(1.5 x) + noise ε``.
    Returns ``X`` shaped (n, 1) and ``y`` shaped (n,)."""
    rng = np.random.default_rng(seed)
    half = n // 2
    x = np.concatenate([rng.uniform(-3.0, -0.8, half), rng.uniform(0.8, 3.0, n - half)])
    return x[:, None], np.sin(1.5 * x) + noise * rng.normal(size=n)


def write_sine_csv(path: str | Path = SINE_CSV, seed: int = 0) -> Path:
    """Write :func:`make_sine_data` to a CSV with columns x, y (the file shipped in models/data)."""
    X, y = make_sine_data(seed=seed)
    path = Path(path)
    np.savetxt(
        path, np.column_stack([X[:, 0], y]), delimiter=",", header="x,y", comments="", fmt="%.8f"
    )
    return path


def sine_data() -> tuple[np.ndarray, np.ndarray]:
    """The shipped sine regression set: ``X`` (80, 1), ``y`` (80,)."""
    table = np.loadtxt(SINE_CSV, delimiter=",", skiprows=1)
    return table[:, :1], table[:, 1]


def examples() -> dict:
    """Small bound models for the conformance suite."""
    X, y = make_regression_data(n=40, d=2, seed=1)
    Xc, yc = make_classification_data(n=40, d=2, seed=1)
    return {
        "linear_regression": linear_regression(X, y),
        "linear_regression_known_noise": linear_regression_known_noise(X, y, noise=0.3),
        "logistic_regression": logistic_regression(Xc, yc),
    }


def load_diabetes(scaled: str | None = "standard") -> tuple[np.ndarray, np.ndarray]:
    """The diabetes regression (Efron, Hastie, Johnstone and Tibshirani 2004, "Least Angle
    Regression"): ``X`` (442, 10: age, sex, bmi, bp, s1-s6) and ``y`` (442,), disease
    progression a year after baseline; shipped in ``models/data/diabetes`` (copied from
    scikit-learn, BSD 3-Clause; see the README there).

    ``scaled``: "standard" (the default): every column of X and y centred and divided by its sd
    (population sd, ddof 0); "sklearn": X as ``sklearn.datasets.load_diabetes()`` gives it
    (centred, divided by sd·√n: each column's sum of squares is 1), y raw; None: the raw values.

    Example
    -------
    >>> from ppl_bdl.models.regression import load_diabetes
    >>> X, y = load_diabetes()
    >>> X.shape, y.shape, round(float(X[:, 2].std()), 6), abs(round(float(y.mean()), 6))
    ((442, 10), (442,), 1.0, 0.0)
    >>> round(float(load_diabetes(scaled=None)[1][0]), 1)   # the first patient's target
    151.0
    """
    if scaled not in DIABETES_SCALINGS:
        raise ConfigError(
            f"load_diabetes: scaled must be one of {DIABETES_SCALINGS}, got {scaled!r}."
        )
    X = np.loadtxt(DIABETES / "diabetes_data_raw.csv.gz")
    y = np.loadtxt(DIABETES / "diabetes_target.csv.gz")
    if scaled is None:
        return X, y
    X = (X - X.mean(0)) / X.std(0)
    if scaled == "sklearn":
        return X / np.sqrt(X.shape[0]), y
    return X, (y - y.mean()) / y.std()
