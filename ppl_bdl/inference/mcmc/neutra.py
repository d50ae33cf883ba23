"""NeuTra: NUTS/HMC in the base space of a fitted normalizing flow (Hoffman et al. 2019).

A flow guide fitted by VI is a bijection θ = F(z) from a standard normal z to the model's flat
unconstrained latents, with q(θ) ≈ p(θ | x). Pulled back through F, the posterior is
``p(F(z) | x) |det ∂F/∂z|``: close to N(0, I) where the flow fits, so a funnel or a curved ridge
becomes nearly isotropic and the sampler's fixed step size suits it everywhere (Hoffman et al.
2019, Eq. 4). The sampler runs on the potential

    U_z(z) = U(F(z)) - log|det ∂F/∂z|

and each draw z is pushed forward to θ = F(z), then the model's sites, as any NUTS draw. The
draws stay exact MCMC draws of the posterior whatever the flow's fit; the flow only sets the
geometry the sampler sees. ``bdl.NUTS(neutra=post)`` (or ``bdl.HMC``) turns it on, where ``post``
is a ``method="vi", guide="flow"`` fit of the same model (any backend).

Example
-------
>>> import ppl_bdl as bdl
>>> from ppl_bdl import dist
>>> @bdl.model
... def m():
...     bdl.sample("x", dist.Normal(0.0, 1.0), shape=(2,))
>>> flow = bdl.fit(m(), backend="numpyro", method="vi", guide="flow", num_layers=2, hidden=4,
...                num_steps=50, num_samples=10, progress=False)
>>> post = bdl.fit(m(), backend="numpyro", method=bdl.NUTS(neutra=flow, num_warmup=20,
...                num_samples=20, num_chains=1), progress=False)
>>> post.samples["x"].shape
(1, 20, 2)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ppl_bdl.errors import ConfigError
from ppl_bdl.inference.vi.guides.base import FittedGuide
from ppl_bdl.inference.vi.guides.flow import FlowGuide

#: Draws pushed through the flow per call (bounds the memory of the flow's hidden layers).
PUSH_CHUNK = 4096


def check_neutra(post: Any, method: str) -> None:
    """Refuse anything but a posterior of a single flow guide, saying what to pass."""
    fitted = getattr(post, "guide", None)
    if not isinstance(fitted, FittedGuide) or not isinstance(fitted.guide, FlowGuide):
        seen = type(post).__name__ if fitted is None else f"a posterior with guide {fitted!r}"
        if isinstance(fitted, list):
            seen = f"a posterior of {len(fitted)} VI fits (num_chains > 1)"
        raise ConfigError(
            f"{method}(neutra=...): expected the Posterior of one VI fit with a flow guide, "
            f"bdl.fit(model, method='vi', guide='flow'), got {seen}. Fit the flow first (one "
            "chain), then pass its posterior."
        )


class NeuTraMap:
    """The fitted flow F of ``post``, rebuilt on ``setup``'s backend and layout."""

    def __init__(self, post: Any, setup: Any):
        fitted = post.guide
        flow: FlowGuide = fitted.guide
        _check_same_latents(flow.layout, setup.layout)
        backend = setup.backend
        self.backend = backend
        self.flow = FlowGuide(
            setup.layout,
            backend,
            flow.init,
            flow.seed,
            num_layers=flow.num_layers,
            hidden=flow.hidden,
            layer=flow.layer,
            init_scale=flow.init_scale,
            max_log_scale=flow.max_log_scale,
        )
        with backend.scope():  # the fit's precision (float64 needs JAX's x64 switched on)
            self.params = self.flow.unpack(backend.asarray(np.asarray(fitted.phi)))

    def potential(self, potential):
        """U_z(z) = U(F(z)) - log|det ∂F/∂z| for one base point z (d,)."""
        flow, params, m = self.flow, self.params, self.backend.math

        def pulled_back(z, data, batch=None):
            theta, log_q = flow.transform(params, z[None, :])
            # log q(θ) = log N(z) - log|det ∂F/∂z|; N's constant drops out of a potential.
            log_det = -0.5 * m.sum(z * z) - log_q[0]
            return potential(theta[0], data, batch) - log_det

        return pulled_back

    def push_forward(self, z: np.ndarray) -> np.ndarray:
        """θ = F(z) for base draws shaped (..., d), as NumPy."""
        backend, rows = self.backend, z.reshape(-1, z.shape[-1])
        with backend.scope():
            parts = [
                backend.to_numpy(self.flow.transform(self.params, backend.asarray(chunk))[0])
                for chunk in np.array_split(rows, max(1, -(-len(rows) // PUSH_CHUNK)))
            ]
        return np.concatenate(parts).reshape(z.shape)

    def pull_back(self, theta: np.ndarray) -> np.ndarray:
        """z = F⁻¹(θ) for positions shaped (n, d), as NumPy (the chains' starts)."""
        backend = self.backend
        with backend.scope():
            z, _ = self.flow.inverse(self.params, backend.asarray(theta))
            return backend.to_numpy(z)


def _check_same_latents(fitted_layout, layout) -> None:
    fitted = [(s.name, s.shape) for s in fitted_layout.slots]
    now = [(s.name, s.shape) for s in layout.slots]
    if fitted != now:
        raise ConfigError(
            f"neutra=...: the flow was fitted to latent sites {fitted}, but this model has "
            f"{now}. Fit the flow (method='vi', guide='flow') to the same model and data."
        )
