"""Fully connected and reshaping layers: :class:`Dense`, :class:`Flatten`.

Example
-------
>>> from ppl_bdl import nn
>>> nn.Dense("fc", 96, 3).sites()
{'fc.weight': (96, 3), 'fc.bias': (3,)}
"""

from __future__ import annotations

import math

from ppl_bdl.dsl import math as bm
from ppl_bdl.dsl.nn import probe
from ppl_bdl.dsl.nn.module import (
    Module,
    Site,
    check_layer_prior,
    check_name,
    check_positive_int,
    shape_of,
)
from ppl_bdl.dsl.nn.priors import Prior, resolve_prior, scale_and_prior
from ppl_bdl.errors import ModelError


class Dense(Module):
    """A fully connected layer ``x @ W + b`` on the last axis of ``x``.

    Sites ``{path}.weight`` shaped (in_features, out_features) and ``{path}.bias`` shaped
    (out_features,). ``prior`` is the weights' prior (a scale, a distribution or a fan function
    such as :func:`~ppl_bdl.dsl.nn.he_normal`; default: the container's, else N(0, 1));
    ``bias_prior`` the biases' (default: ``prior``). ``prior_scale=s`` is short for ``prior=s``.

    Example
    -------
    >>> from ppl_bdl import nn, dist
    >>> layer = nn.Dense("fc", 8, 50, prior=dist.Normal(0.0, 0.5))
    >>> layer.sites()
    {'fc.weight': (8, 50), 'fc.bias': (50,)}
    """

    has_params = True

    def __init__(
        self,
        name: str,
        in_features: int,
        out_features: int,
        prior: Prior | None = None,
        prior_scale: float | None = None,
        bias: bool = True,
        bias_prior: Prior | None = None,
    ):
        where = f"Dense({name!r})"
        self.name = check_name(name, "Dense")
        self.in_features = check_positive_int(in_features, "in_features", where)
        self.out_features = check_positive_int(out_features, "out_features", where)
        self.prior = scale_and_prior(prior, prior_scale, where)
        self.bias_prior = check_layer_prior(bias_prior, where)
        self.bias = bool(bias)

    def _sites(self, path, prior):
        prior = self._own_prior(prior)
        bias_prior = self.bias_prior if self.bias_prior is not None else prior
        fans = (self.in_features, self.out_features)
        where = self.describe(path)
        sites = [
            Site(f"{path}.weight", fans, resolve_prior(prior, *fans, where)),
        ]
        if self.bias:
            sites.append(
                Site(f"{path}.bias", (self.out_features,), resolve_prior(bias_prior, *fans, where))
            )
        return sites

    def _forward(self, values, x, path):
        seen = shape_of(x)
        if not seen or seen[-1] != self.in_features:
            raise ModelError(
                f"{self.describe(path)} expects inputs with {self.in_features} features on the last "
                f"axis, got shape {seen}. Set in_features={seen[-1] if seen else '?'} or fix the "
                "layer before it."
            )
        w = self._take(values, f"{path}.weight", (self.in_features, self.out_features), path)
        out = x @ w
        if self.bias:
            out = out + self._take(values, f"{path}.bias", (self.out_features,), path)
        return probe.visit(self, path, x, out)  # recorded by hessian="kron" (nn/probe.py)

    def __repr__(self) -> str:
        return f"Dense({self.name!r}, {self.in_features}, {self.out_features})"


class Flatten(Module):
    """Flatten every axis from ``start_dim`` on into one: (N, C, H, W) -> (N, C·H·W) by default,
    in C order, as ``torch.nn.Flatten``. No parameters.

    Example
    -------
    >>> from ppl_bdl import nn
    >>> nn.Flatten().sites()
    {}
    """

    def __init__(self, start_dim: int = 1):
        if isinstance(start_dim, bool) or not isinstance(start_dim, int):
            raise ModelError(f"Flatten: start_dim must be an int, got {start_dim!r}.")
        self.start_dim = start_dim

    def _forward(self, values, x, path):
        seen = shape_of(x)
        start = self.start_dim if self.start_dim >= 0 else len(seen) + self.start_dim
        if not 0 <= start < len(seen):
            raise ModelError(
                f"{self.describe(path)}: start_dim={self.start_dim} is out of range for an input "
                f"of shape {seen}."
            )
        return bm.reshape(x, seen[:start] + (math.prod(seen[start:]),))

    def __repr__(self) -> str:
        return f"Flatten(start_dim={self.start_dim})"
