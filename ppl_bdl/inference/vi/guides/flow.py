"""Normalizing-flow guide: q = (F_φ)# N(0, I) over the flat unconstrained vector.

F_φ is a stack of ``num_layers`` affine layers followed by an elementwise affine map
θ = μ + softplus(ρ) ⊙ z. Each layer is either

- ``layer="coupling"`` (Dinh et al. 2017, RealNVP): coordinates outside a binary mask are shifted
  and scaled by an MLP of the coordinates inside it; masks alternate between layers; or
- ``layer="iaf"`` (Kingma et al. 2016): an inverse autoregressive layer whose shift and scale come
  from a MADE network (Germain et al. 2015), so coordinate i depends on coordinates before it in
  the layer's ordering; orderings alternate between layers.

Both have triangular Jacobians, so log q is the change-of-variables density of Section 2.2.2 of
"Bayesian Computation in Deep Learning", q(θ) = q₀(F⁻¹(θ)) |det ∂F⁻¹/∂θ| (Rezende & Mohamed 2015; Papamakarios et al. 2021).
Log-scales are softly clamped to ±``max_log_scale`` for stable training. The layers are neutral
code (``self.m`` is the backend's math), identical on every backend.

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import dist
>>> @bdl.model
... def m():
...     bdl.sample("z", dist.Normal(0.0, 1.0), shape=(2,))
>>> post = bdl.fit(m(), backend="numpyro", method="vi", guide="flow", num_layers=2, hidden=8,
...                num_steps=100, lr=0.01, num_samples=20, progress=False)
>>> post.samples["z"].shape
(1, 20, 2)
"""

from __future__ import annotations

import numpy as np

from ppl_bdl.errors import one_of
from ppl_bdl.inference.vi.guides.base import (
    Guide,
    GuideInit,
    ParamLayout,
    check_init_scale,
    check_positive_int,
    inverse_softplus,
)
from ppl_bdl.inference.vi.guides.registry import register

LAYERS = ("coupling", "iaf")


class FlowGuide(Guide):
    """A stack of affine coupling or IAF layers with an MLP (one tanh hidden layer) per layer."""

    name = "flow"

    def __init__(
        self,
        layout,
        backend,
        init: GuideInit,
        seed: int = 0,
        num_layers: int = 4,
        hidden: int = 64,
        layer: str = "coupling",
        init_scale: float = 0.1,
        max_log_scale: float = 3.0,
    ):
        super().__init__(layout, backend, init, seed)
        self.num_layers = check_positive_int("num_layers", num_layers)
        self.hidden = check_positive_int("hidden", hidden)
        if layer not in LAYERS:
            raise one_of("flow layer", layer, LAYERS)
        self.layer = layer
        self.init_scale = check_init_scale(init_scale)
        self.max_log_scale = float(max_log_scale)
        d, h = self.dim, self.hidden
        shapes = {"loc": (d,), "rho": (d,)}
        for i in range(self.num_layers):
            shapes.update(
                {f"w1_{i}": (d, h), f"b1_{i}": (h,), f"w2_{i}": (h, 2 * d), f"b2_{i}": (2 * d,)}
            )
        self.param_layout = ParamLayout(shapes)
        self._masks = [self._layer_masks(i) for i in range(self.num_layers)]
        self._const = [
            tuple(None if a is None else backend.asarray(a) for a in masks) for masks in self._masks
        ]

    # -- structure -----------------------------------------------------------------------------
    def _layer_masks(self, i: int):
        """(input mask or None, W1 mask, W2 mask, kept-coordinates mask) as NumPy."""
        d, h = self.dim, self.hidden
        if self.layer == "coupling":
            keep = (
                ((np.arange(d) + i) % 2 == 0).astype(float) if d > 1 else np.full(d, float(i % 2))
            )
            return keep, None, None, keep
        order = np.arange(1, d + 1) if i % 2 == 0 else np.arange(d, 0, -1)
        rng = np.random.default_rng(self.seed + 101 * i)
        deg_hidden = rng.integers(1, max(d, 2), size=h) if d > 1 else np.ones(h, int)
        mask1 = (deg_hidden[None, :] >= order[:, None]).astype(float)  # (d, h)
        mask2 = (order[None, :] > deg_hidden[:, None]).astype(float)  # (h, d)
        return None, mask1, np.concatenate([mask2, mask2], axis=1), np.zeros(d)

    def initial_params(self) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(self.seed + 11)
        d, h = self.dim, self.hidden
        scale = self.init_scale * self.init.prior_scale
        params = {"loc": self.init.loc, "rho": inverse_softplus(scale)}
        for i in range(self.num_layers):
            params[f"w1_{i}"] = rng.normal(size=(d, h)) / np.sqrt(max(d, 1))
            params[f"b1_{i}"] = np.zeros(h)
            # Zero output weights: every layer starts as the identity.
            params[f"w2_{i}"] = np.zeros((h, 2 * d))
            params[f"b2_{i}"] = np.zeros(2 * d)
        return params

    def _shift_log_scale(self, params, i: int, z):
        m = self.m
        in_mask, mask1, mask2, _ = self._const[i]
        w1, w2 = params[f"w1_{i}"], params[f"w2_{i}"]
        if mask1 is not None:
            w1, w2 = w1 * mask1, w2 * mask2
        inp = z if in_mask is None else z * in_mask
        hid = m.tanh(m.matmul(inp, w1) + params[f"b1_{i}"])
        out = m.matmul(hid, w2) + params[f"b2_{i}"]
        shift, raw = out[:, : self.dim], out[:, self.dim :]
        c = self.max_log_scale
        return shift, c * m.tanh(raw / c)

    def _forward_layer(self, params, i: int, z):
        shift, log_scale = self._shift_log_scale(params, i, z)
        keep = self._const[i][3]
        if self.layer == "coupling":
            move = 1.0 - keep
            z_new = keep * z + move * (z * self.m.exp(log_scale) + shift)
            return z_new, self.m.sum(move * log_scale, axis=-1)
        return z * self.m.exp(log_scale) + shift, self.m.sum(log_scale, axis=-1)

    def _inverse_layer(self, params, i: int, y):
        m = self.m
        if self.layer == "coupling":
            keep = self._const[i][3]
            shift, log_scale = self._shift_log_scale(params, i, y)  # depends on kept coords only
            move = 1.0 - keep
            z = keep * y + move * (y - shift) * m.exp(-log_scale)
            return z, m.sum(move * log_scale, axis=-1)
        # Autoregressive: d fixed-point passes recover z exactly, one coordinate per pass.
        z = y * 0.0
        for _ in range(self.dim):
            shift, log_scale = self._shift_log_scale(params, i, z)
            z = (y - shift) * m.exp(-log_scale)
        return z, m.sum(log_scale, axis=-1)

    # -- the guide interface -------------------------------------------------------------------
    def transform(self, params, eps, mask=None):
        m = self.m
        log_q = self._standard_normal_log_prob(eps)
        z = eps
        for i in range(self.num_layers):
            z, log_det = self._forward_layer(params, i, z)
            log_q = log_q - log_det
        scale = m.softplus(params["rho"])
        return params["loc"] + scale * z, log_q - m.sum(m.log(scale))

    def log_prob(self, params, theta):
        z, log_det = self.inverse(params, theta)
        return self._standard_normal_log_prob(z) - log_det

    def inverse(self, params, theta):
        """The base points z = F⁻¹(θ) of θ (n, d), and log|det ∂F/∂z| there (n,)."""
        m = self.m
        scale = m.softplus(params["rho"])
        z = (theta - params["loc"]) / scale
        log_det_total = m.sum(m.log(scale))
        for i in reversed(range(self.num_layers)):
            z, log_det = self._inverse_layer(params, i, z)
            log_det_total = log_det_total + log_det
        return z, log_det_total


@register("flow")
def flow(
    layout,
    backend,
    init: GuideInit,
    seed: int = 0,
    num_layers: int = 4,
    hidden: int = 64,
    layer: str = "coupling",
    init_scale: float = 0.1,
):
    """Factory of :class:`FlowGuide` (``fit(..., guide="flow", num_layers=4, hidden=64)``)."""
    return FlowGuide(
        layout,
        backend,
        init,
        seed,
        num_layers=num_layers,
        hidden=hidden,
        layer=layer,
        init_scale=init_scale,
    )
