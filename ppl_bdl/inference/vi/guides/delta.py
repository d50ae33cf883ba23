"""Delta (point-mass) guide: q(θ) = δ(θ − μ), i.e. MAP estimation in the unconstrained space.

The objective reduces to the log joint at μ (prior and log-Jacobian included), the MAP baseline a
Bayesian deep-learning user compares against. Its posterior has ``num_samples`` copies of μ.
``post.guide.params`` is the point as the sites' values (each in its own, constrained space: a
positive scale as itself, not its log); ``post.guide.raw_params["loc"]`` is μ, the flat
unconstrained vector the optimizer moved.

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import dist
>>> @bdl.model
... def m():
...     bdl.sample("z", dist.Normal(1.0, 1.0))
>>> post = bdl.fit(m(), backend="numpyro", method="vi", guide="delta", num_steps=300, lr=0.05,
...                num_samples=5, progress=False)
>>> round(float(post.samples["z"].mean()), 2)
1.0
>>> {k: v.shape for k, v in post.guide.params.items()}, sorted(post.guide.raw_params)
({'z': ()}, ['loc'])
"""

from __future__ import annotations

import numpy as np

from ppl_bdl.inference.vi.guides.base import Guide, GuideInit, ParamLayout, constrain
from ppl_bdl.inference.vi.guides.registry import register


class DeltaGuide(Guide):
    """A point mass at ``loc`` (log q is 0 by convention)."""

    name = "delta"
    #: A point mass has no entropy term to take a path derivative of.
    path_gradient = False

    def __init__(self, layout, backend, init: GuideInit, seed: int = 0):
        super().__init__(layout, backend, init, seed)
        self.param_layout = ParamLayout({"loc": (self.dim,)})

    def initial_params(self) -> dict[str, np.ndarray]:
        return {"loc": self.init.loc}

    def noise_shape(self, num: int) -> tuple[int, int]:
        return (num, 0)  # a point mass draws no noise

    def transform(self, params, eps, mask=None):
        num = eps.shape[0]
        loc = params["loc"]
        theta = self.m.reshape(loc, (1, self.dim)) + self.m.zeros((num, self.dim))
        return theta, self.m.zeros((num,))

    def log_prob(self, params, theta):
        return self.m.zeros((theta.shape[0],))

    def describe(self, params):
        """The point mass's location as each latent site's value, in the site's own space."""
        values = constrain(self.layout, self.backend, np.asarray(params["loc"])[None])
        return {name: value[0] for name, value in values.items()}


@register("delta")
def delta(layout, backend, init: GuideInit, seed: int = 0):
    """Factory of :class:`DeltaGuide` (``fit(..., guide="delta")``)."""
    return DeltaGuide(layout, backend, init, seed)
