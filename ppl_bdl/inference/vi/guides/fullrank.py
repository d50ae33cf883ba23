"""Full-rank Gaussian guide: q(θ) = N(μ, L Lᵀ) with L lower-triangular, diag(L) = softplus(·) > 0.

For small models only: memory is O(d²) and log-density O(d²) per draw. Above ``max_dim`` it
refuses and points to the low-rank guide.

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import dist
>>> @bdl.model
... def m():
...     bdl.sample("z", dist.Normal(0.0, 1.0), shape=(2,))
>>> post = bdl.fit(m(), backend="numpyro", method="vi", guide="fullrank", num_steps=200, lr=0.05,
...                num_samples=20, progress=False)
>>> post.guide.describe()["covariance"].shape
(2, 2)
"""

from __future__ import annotations

import numpy as np

from ppl_bdl.errors import ConfigError
from ppl_bdl.inference.vi.guides.base import (
    LOG_2PI,
    Guide,
    GuideInit,
    ParamLayout,
    check_init_scale,
    inverse_softplus,
)
from ppl_bdl.inference.vi.guides.registry import register

MAX_DIM = 1000


class FullRankGuide(Guide):
    """Dense Gaussian over the flat unconstrained vector (Cholesky parameterisation)."""

    name = "fullrank"

    def __init__(
        self,
        layout,
        backend,
        init: GuideInit,
        seed: int = 0,
        init_scale: float = 0.01,
        max_dim: int = MAX_DIM,
    ):
        super().__init__(layout, backend, init, seed)
        if self.dim > max_dim:
            raise ConfigError(
                f"guide='fullrank' needs a {self.dim}x{self.dim} covariance, above its limit of "
                f"max_dim={max_dim} latent dimensions. Use guide='lowrank' (rank=10, "
                "blocks='site') for large models, or raise max_dim if you have the memory."
            )
        self.init_scale = check_init_scale(init_scale)
        self.param_layout = ParamLayout({"loc": (self.dim,), "tril": (self.dim, self.dim)})
        eye = np.eye(self.dim)
        self._eye = backend.asarray(eye)
        self._strict = backend.asarray(np.tril(np.ones((self.dim, self.dim)), -1))

    def initial_params(self) -> dict[str, np.ndarray]:
        raw = np.diag(inverse_softplus(self.init_scale * self.init.prior_scale))
        return {"loc": self.init.loc, "tril": raw}

    def scale_tril(self, params):
        raw = params["tril"]
        return raw * self._strict + self._eye * self.m.softplus(raw)

    def transform(self, params, eps, mask=None):
        m = self.m
        tril = self.scale_tril(params)
        theta = params["loc"] + m.matmul(eps, m.transpose(tril))
        log_det = m.sum(m.log(m.diag(tril)))
        return theta, self._standard_normal_log_prob(eps) - log_det

    def log_prob(self, params, theta):
        m = self.m
        tril = self.scale_tril(params)
        z = m.triangular_solve(tril, m.transpose(theta - params["loc"]), lower=True)
        log_det = m.sum(m.log(m.diag(tril)))
        return -0.5 * m.sum(z * z, axis=0) - log_det - 0.5 * self.dim * LOG_2PI

    def describe(self, params):
        raw = np.asarray(params["tril"], dtype=float)
        tril = np.tril(raw, -1) + np.diag(np.logaddexp(0.0, np.diag(raw)))
        return {"loc": np.asarray(params["loc"]), "scale_tril": tril, "covariance": tril @ tril.T}


@register("fullrank")
def fullrank(
    layout,
    backend,
    init: GuideInit,
    seed: int = 0,
    init_scale: float = 0.01,
    max_dim: int = MAX_DIM,
):
    """Factory of :class:`FullRankGuide` (``fit(..., guide="fullrank")``)."""
    return FullRankGuide(layout, backend, init, seed, init_scale=init_scale, max_dim=max_dim)
