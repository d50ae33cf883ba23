"""The forward noising SDEs of score-based diffusion models (Song et al. 2021).

Each SDE dx = f(x, t) dt + g(t) dw on t ∈ [0, 1] ("Bayesian Computation in Deep Learning",
Eq. 3.12) has a Gaussian perturbation kernel x_t | x_0 ~ N(a(t) x_0, σ(t)² I), so training draws
x_t in one step, and a reverse-time SDE (Eq. 3.13) that sampling integrates from t = 1 down to
``t_min``:

- :class:`VESDE` (variance exploding, the continuous limit of Song and Ermon 2019's noise levels):
  f = 0, σ(t) = σ_min (σ_max/σ_min)^t, g(t)² = dσ(t)²/dt = 2 σ(t)² log(σ_max/σ_min), a(t) = 1;
  the prior at t = 1 is N(0, σ_max² I).
- :class:`VPSDE` (variance preserving, the continuous limit of Ho et al. 2020's DDPM):
  β(t) = β_min + t (β_max − β_min), f = −½ β(t) x, g(t)² = β(t),
  a(t) = exp(−¼ t² (β_max − β_min) − ½ t β_min), σ(t)² = 1 − a(t)²; the prior is N(0, I).

The formulas take an array namespace ``xp``: NumPy (the default) for values on the host, or
:mod:`ppl_bdl.dsl.math` inside a backend's loop.

Example
-------
>>> import numpy as np
>>> from ppl_bdl.inference.diffusion import VESDE, VPSDE
>>> VESDE(sigma_min=0.01, sigma_max=10.0).std(np.array([0.0, 0.5, 1.0])).round(4).tolist()
[0.01, 0.3162, 10.0]
>>> vp = VPSDE()
>>> bool(np.allclose(vp.mean_coef(0.3) ** 2 + vp.std(0.3) ** 2, 1.0))
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ppl_bdl.errors import ConfigError

Array = Any

#: The SDEs ``sde=`` names.
SDE_NAMES = ("ve", "vp")


def positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigError(f"{name} must be a number > 0, got {value!r}.")
    return float(value)


def _check_t_min(t_min: Any) -> None:
    if isinstance(t_min, bool) or not isinstance(t_min, int | float) or not 0 < t_min < 1:
        raise ConfigError(
            f"t_min (the earliest time trained and sampled; Song et al. 2021 use 1e-5 to 1e-3) "
            f"must be in (0, 1), got {t_min!r}."
        )


@dataclass(frozen=True)
class VESDE:
    """The variance-exploding SDE (Song et al. 2021, Eq. 30): σ(t) = σ_min (σ_max/σ_min)^t.

    Parameters
    ----------
    sigma_min, sigma_max : float
        The noise scales at t = 0 and t = 1. ``sigma_max=None``: set from the data by
        :func:`~ppl_bdl.inference.diffusion.fit`, to the largest distance between two points
        (Song and Ermon 2020, Technique 1).
    t_min : float
        The earliest time trained on and sampled to.
    """

    sigma_min: float = 0.01
    sigma_max: float | None = None
    t_min: float = 1e-5
    name = "ve"

    def __post_init__(self):
        positive("sigma_min", self.sigma_min)
        if self.sigma_max is not None and positive("sigma_max", self.sigma_max) <= self.sigma_min:
            raise ConfigError(
                f"sigma_max={self.sigma_max} must exceed sigma_min={self.sigma_min}: the noise "
                "grows from sigma_min at t = 0 to sigma_max at t = 1."
            )
        _check_t_min(self.t_min)

    def fitted_to(self, X: np.ndarray) -> VESDE:
        """This SDE with ``sigma_max`` set from the points ``X`` (N, D) if it is None: their
        largest pairwise distance, over at most 1000 of them (Song and Ermon 2020)."""
        if self.sigma_max is not None:
            return self
        rows = X[np.random.default_rng(0).permutation(len(X))[:1000]].astype(float)
        squares = (rows * rows).sum(1)
        dist2 = squares[:, None] + squares[None, :] - 2.0 * rows @ rows.T
        widest = float(np.sqrt(max(dist2.max(), 0.0)))
        return replace(self, sigma_max=max(widest, 2.0 * self.sigma_min))

    @property
    def prior_std(self) -> float:
        return float(self._sigma_max())

    def _sigma_max(self) -> float:
        if self.sigma_max is None:
            raise ConfigError("VESDE(sigma_max=None) is set from the data by fit(); give a number.")
        return self.sigma_max

    def mean_coef(self, t, xp=np):
        """a(t) = 1: the VE kernel only adds noise."""
        return 1.0 + 0.0 * t

    def std(self, t, xp=np):
        """σ(t) = σ_min (σ_max/σ_min)^t."""
        return self.sigma_min * xp.exp(t * math.log(self._sigma_max() / self.sigma_min))

    def drift(self, x, t, xp=np):
        """f(x, t) = 0."""
        return 0.0 * x

    def diffusion2(self, t, xp=np):
        """g(t)² = 2 σ(t)² log(σ_max/σ_min)."""
        sigma = self.std(t, xp)
        return 2.0 * math.log(self._sigma_max() / self.sigma_min) * sigma * sigma

    def corrector_alpha(self, t, dt: float):
        """α_i of the Langevin corrector's step size (Song et al. 2021, Alg. 4): 1."""
        return 1.0 + 0.0 * t


@dataclass(frozen=True)
class VPSDE:
    """The variance-preserving SDE (Song et al. 2021, Eq. 32): β(t) linear from ``beta_min``
    to ``beta_max``.

    Parameters
    ----------
    beta_min, beta_max : float
        β(0) and β(1) (Song et al. 2021 use 0.1 and 20).
    t_min : float
        The earliest time trained on and sampled to.
    """

    beta_min: float = 0.1
    beta_max: float = 20.0
    t_min: float = 1e-3
    name = "vp"

    def __post_init__(self):
        positive("beta_min", self.beta_min)
        if positive("beta_max", self.beta_max) < self.beta_min:
            raise ConfigError(
                f"beta_max={self.beta_max} must be >= beta_min={self.beta_min} (β(t) grows "
                "linearly from beta_min to beta_max)."
            )
        _check_t_min(self.t_min)

    def fitted_to(self, X: np.ndarray) -> VPSDE:
        """The VP SDE has no setting read from the data."""
        return self

    prior_std = 1.0

    def _log_mean_coef(self, t):
        return -0.25 * t * t * (self.beta_max - self.beta_min) - 0.5 * t * self.beta_min

    def mean_coef(self, t, xp=np):
        """a(t) = exp(−¼ t² (β_max − β_min) − ½ t β_min)."""
        return xp.exp(self._log_mean_coef(t))

    def std(self, t, xp=np):
        """σ(t) = √(1 − a(t)²), as −expm1(2 log a(t)) so that it stays exact near t = 0."""
        return xp.sqrt(-xp.expm1(2.0 * self._log_mean_coef(t)))

    def beta(self, t):
        """β(t) = β_min + t (β_max − β_min)."""
        return self.beta_min + t * (self.beta_max - self.beta_min)

    def drift(self, x, t, xp=np):
        """f(x, t) = −½ β(t) x (``t`` broadcast against ``x``'s leading axis)."""
        return -0.5 * self.beta(t) * x

    def diffusion2(self, t, xp=np):
        """g(t)² = β(t)."""
        return self.beta(t)

    def corrector_alpha(self, t, dt: float):
        """α_i = 1 − β(t_i) Δt of the Langevin corrector's step size (Song et al. 2021,
        Alg. 5: one minus the discretised β_i)."""
        return 1.0 - self.beta(t) * dt


SDE = VESDE | VPSDE


def make_sde(sde: Any) -> SDE:
    """``sde`` as an SDE object: a name ("ve", "vp": the defaults) or an object kept as it is."""
    if isinstance(sde, VESDE | VPSDE):
        return sde
    if isinstance(sde, str) and sde.lower() in SDE_NAMES:
        return VESDE() if sde.lower() == "ve" else VPSDE()
    raise ConfigError(
        f"unknown sde {sde!r}; expected one of {list(SDE_NAMES)} (variance exploding, variance "
        "preserving: Song et al. 2021) or an object bdl.diffusion.VESDE(...) / VPSDE(...)."
    )
