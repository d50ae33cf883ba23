"""Layer normalisation with Bayesian or fixed affine parameters: :class:`LayerNorm`.

Layer norm (Ba, Kiros & Hinton, *Layer Normalization*, 2016, Eqs. 3-4) normalises each example
over its trailing axes, ``(x - mean) / sqrt(var + eps)``, then scales and shifts it. It holds no
state, so it has a clean Bayesian reading, unlike batch norm whose running statistics depend on the
other examples of the batch.

Example
-------
>>> from ppl_bdl import nn
>>> nn.LayerNorm("ln", 16).sites()
{'ln.weight': (16,), 'ln.bias': (16,)}
"""

from __future__ import annotations

import math
import numbers

from ppl_bdl.dsl import math as bm
from ppl_bdl.dsl.dist import Distribution, Normal
from ppl_bdl.dsl.nn.module import Module, Site, check_layer_prior, check_name, shape_of
from ppl_bdl.dsl.nn.priors import Prior, resolve_prior
from ppl_bdl.errors import ModelError

AFFINE = ("bayesian", "fixed")


class LayerNorm(Module):
    """Normalise over the trailing axes ``normalized_shape`` (as ``torch.nn.LayerNorm``).

    ``affine="bayesian"`` (default): sites ``{path}.weight`` (the gain) and ``{path}.bias`` (the
    shift), both shaped ``normalized_shape``. ``prior`` is the gain's prior: a scale ``s`` means
    N(1, s²) (centred on the identity); a distribution or a fan function is used as given.
    ``bias_prior`` is the shift's (default: N(0, s²) with the same ``s``, else N(0, 1)). The
    container's prior is not inherited: a zero-mean prior on a gain would switch the layer off.
    ``affine="fixed"``: no sites, gain 1 and shift 0.

    Example
    -------
    >>> from ppl_bdl import nn
    >>> nn.LayerNorm("ln", (8, 4, 4), affine="fixed").sites()
    {}
    >>> nn.LayerNorm("ln", 8, prior=0.1).priors()["ln.weight"]
    Normal(loc=1, scale=0.1)
    """

    def __init__(
        self,
        name: str,
        normalized_shape: int | tuple[int, ...],
        eps: float = 1e-5,
        affine: str = "bayesian",
        prior: Prior | None = 1.0,
        bias_prior: Prior | None = None,
    ):
        where = f"LayerNorm({name!r})"
        self.name = check_name(name, "LayerNorm")
        shape = (
            (normalized_shape,)
            if isinstance(normalized_shape, numbers.Integral)
            else normalized_shape
        )
        if (
            not isinstance(shape, tuple | list)
            or not shape
            or any(
                isinstance(s, bool) or not isinstance(s, numbers.Integral) or s < 1 for s in shape
            )
        ):
            raise ModelError(
                f"{where}: normalized_shape must be a positive int or a tuple of them, got "
                f"{normalized_shape!r}."
            )
        self.normalized_shape = tuple(int(s) for s in shape)
        if isinstance(eps, bool) or not isinstance(eps, int | float) or not eps > 0:
            raise ModelError(f"{where}: eps must be a positive number, got {eps!r}.")
        self.eps = float(eps)
        if affine not in AFFINE:
            raise ModelError(f"{where}: affine must be one of {AFFINE}, got {affine!r}.")
        self.affine = affine
        self.has_params = affine == "bayesian"
        self.prior = check_layer_prior(prior, where)
        self.bias_prior = check_layer_prior(bias_prior, where)

    def _priors(self, where: str) -> tuple[Distribution, Distribution]:
        n = math.prod(self.normalized_shape)
        prior = 1.0 if self.prior is None else self.prior
        if isinstance(prior, int | float) and not isinstance(prior, bool):
            gain = Normal(1.0, float(prior))
            default_bias: Prior = float(prior)
        else:
            gain = resolve_prior(prior, n, n, where)
            default_bias = 1.0
        bias_prior = self.bias_prior if self.bias_prior is not None else default_bias
        return gain, resolve_prior(bias_prior, n, n, where)

    def _sites(self, path, prior):
        if self.affine != "bayesian":
            return []
        gain, shift = self._priors(self.describe(path))
        return [
            Site(f"{path}.weight", self.normalized_shape, gain),
            Site(f"{path}.bias", self.normalized_shape, shift),
        ]

    def _forward(self, values, x, path):
        seen = shape_of(x)
        k = len(self.normalized_shape)
        if tuple(seen[len(seen) - k :]) != self.normalized_shape or len(seen) < k:
            raise ModelError(
                f"{self.describe(path)} normalises the trailing axes {self.normalized_shape}, got "
                f"an input of shape {seen}."
            )
        axes = tuple(range(len(seen) - k, len(seen)))
        mean = bm.mean(x, axis=axes, keepdims=True)
        centred = x - mean
        var = bm.mean(centred * centred, axis=axes, keepdims=True)
        out = centred / bm.sqrt(var + self.eps)
        if self.affine == "bayesian":
            out = out * self._take(values, f"{path}.weight", self.normalized_shape, path)
            out = out + self._take(values, f"{path}.bias", self.normalized_shape, path)
        return out

    def __repr__(self) -> str:
        return f"LayerNorm({self.name!r}, {self.normalized_shape}, affine={self.affine!r})"
