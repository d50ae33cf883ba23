"""Mean-field Gaussian guide: q(θ) = ∏_i N(θ_i; μ_i, σ_i²), σ = softplus(ρ).

Bayes by Backprop (Blundell et al. 2015; Eq. 2.16 of "Bayesian Computation in Deep Learning"), in the unconstrained space of
every latent site. Draws are reparameterised, θ = μ + σ ⊙ ε with ε ~ N(0, I).

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import dist
>>> @bdl.model
... def m():
...     bdl.sample("z", dist.Normal(0.0, 1.0), shape=(2,))
>>> post = bdl.fit(m(), backend="numpyro", method="vi", guide="meanfield", num_steps=300,
...                lr=0.05, num_samples=50, progress=False)
>>> sorted(post.guide.describe())
['loc', 'scale']
"""

from __future__ import annotations

import numpy as np

from ppl_bdl.inference.vi.guides.base import (
    LOG_2PI,
    Guide,
    GuideInit,
    ParamLayout,
    check_init_scale,
    inverse_softplus,
)
from ppl_bdl.inference.vi.guides.registry import register


class MeanFieldGuide(Guide):
    """Factorised Gaussian over the flat unconstrained latent vector.

    ``init_scale`` (default 0.01) multiplies the prior scale of each coordinate to give the
    initial σ; the initial μ is a prior draw or the prior median (``init_loc`` of ``fit``).
    """

    name = "meanfield"
    is_diagonal_gaussian = True

    def __init__(self, layout, backend, init: GuideInit, seed: int = 0, init_scale: float = 0.01):
        super().__init__(layout, backend, init, seed)
        self.init_scale = check_init_scale(init_scale)
        self.param_layout = ParamLayout({"loc": (self.dim,), "rho": (self.dim,)})

    def initial_params(self) -> dict[str, np.ndarray]:
        scale = self.init_scale * self.init.prior_scale
        return {"loc": self.init.loc, "rho": inverse_softplus(scale)}

    def loc_scale(self, params):
        return params["loc"], self.m.softplus(params["rho"])

    def transform(self, params, eps, mask=None):
        """θ = μ + σ ⊙ ε and log q; with ``mask`` (0/1 per coordinate) only masked-in
        coordinates count in log q (the others have their KL computed in closed form)."""
        loc, scale = self.loc_scale(params)
        theta = loc + scale * eps
        per_coord = -self.m.log(scale) - 0.5 * eps * eps - 0.5 * LOG_2PI
        if mask is not None:
            per_coord = per_coord * mask
        return theta, self.m.sum(per_coord, axis=-1)

    def log_prob(self, params, theta):
        loc, scale = self.loc_scale(params)
        z = (theta - loc) / scale
        return self.m.sum(-self.m.log(scale) - 0.5 * z * z, axis=-1) - 0.5 * self.dim * LOG_2PI

    def describe(self, params):
        rho = np.asarray(params["rho"], dtype=float)
        return {"loc": np.asarray(params["loc"]), "scale": np.logaddexp(0.0, rho)}


@register("meanfield")
def meanfield(layout, backend, init: GuideInit, seed: int = 0, init_scale: float = 0.01):
    """Factory of :class:`MeanFieldGuide` (``fit(..., guide="meanfield")``)."""
    return MeanFieldGuide(layout, backend, init, seed, init_scale=init_scale)
