"""Bayesian layers: weights are sample sites with a Gaussian prior.

A network ``f_θ(x) = W_L g(... g(W_1 x + b_1)) + b_L`` whose weights and biases have the prior
``N(0, s²)``; in the MAP view that is weight decay with λ = 1 / s².

Calling a layer samples its weights and applies them: ``net(X)``. To run the network on a
minibatch only, sample the weights first, outside the plate, and apply them inside it: the weights
stay global and a step costs O(batch), not O(N).

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import dist, nn
>>> @bdl.model
... def bnn(X, y=None):
...     net = nn.MLP("net", [X.shape[1], 50, 1], activation="tanh", prior=dist.Normal(0.0, 1.0))
...     f = net.sample()                      # weight sites, outside the plate
...     sigma = bdl.sample("sigma", dist.HalfNormal(1.0))
...     with bdl.plate("data", X.shape[0]) as idx:
...         mean = f(X[idx])[..., 0]          # only the batch goes through the network
...         bdl.sample("y", dist.Normal(mean, sigma), obs=None if y is None else y[idx])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from . import math as bm
from .dist import Distribution, Normal
from .errors import ModelError
from .primitives import sample

ACTIVATIONS: dict[str, Callable] = {
    "relu": bm.relu,
    "tanh": bm.tanh,
    "gelu": bm.gelu,
    "sigmoid": bm.sigmoid,
    "softplus": bm.softplus,
    "elu": bm.elu,
    "silu": bm.silu,
    "identity": lambda x: x,
}


def _prior(prior: Distribution | None, prior_scale: float | None, where: str) -> Distribution:
    if prior is not None and prior_scale is not None:
        raise ModelError(f"{where}: give prior or prior_scale, not both.")
    if prior is None:
        return Normal(0.0, 1.0 if prior_scale is None else prior_scale)
    if not isinstance(prior, Distribution):
        raise ModelError(
            f"{where}: prior must be a ppl_bdl.dist distribution, got {type(prior).__name__}."
        )
    return prior


def _activation(activation: str | Callable, where: str) -> Callable:
    if callable(activation):
        return activation
    if activation not in ACTIVATIONS:
        raise ModelError(
            f"{where}: unknown activation {activation!r}; expected one of {sorted(ACTIVATIONS)} or a "
            "function from ppl_bdl.math."
        )
    return ACTIVATIONS[activation]


class Dense:
    """A fully connected layer ``x @ W + b`` with sample sites ``{name}.weight`` (in, out) and
    ``{name}.bias`` (out,), both with the prior ``prior`` (default N(0, 1)).

    Example
    -------
    >>> from ppl_bdl import nn, dist
    >>> layer = nn.Dense("fc", 8, 50, prior=dist.Normal(0.0, 0.5))
    """

    def __init__(
        self,
        name: str,
        in_features: int,
        out_features: int,
        prior: Distribution | None = None,
        prior_scale: float | None = None,
        bias: bool = True,
    ):
        for label, n in (("in_features", in_features), ("out_features", out_features)):
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ModelError(f"Dense({name!r}): {label} must be a positive int, got {n!r}.")
        self.name = name
        self.in_features = in_features
        self.out_features = out_features
        self.prior = _prior(prior, prior_scale, f"Dense({name!r})")
        self.bias = bias

    def sample(self) -> SampledNetwork:
        """Sample the weight sites; return the layer with those weights, as a function of x."""
        w = sample(f"{self.name}.weight", self.prior, shape=(self.in_features, self.out_features))
        b = (
            sample(f"{self.name}.bias", self.prior, shape=(self.out_features,))
            if self.bias
            else None
        )
        return SampledNetwork([self], [(w, b)], activation=None)

    def __call__(self, x: Any) -> Any:
        return self.sample()(x)

    def check_input(self, x: Any) -> None:
        if x.shape[-1] != self.in_features:
            raise ModelError(
                f"Dense({self.name!r}) expects inputs with {self.in_features} features on the last "
                f"axis, got shape {tuple(x.shape)}."
            )


class MLP:
    """A multilayer perceptron of :class:`Dense` layers named ``{name}.{i}``.

    ``sizes`` lists the widths, inputs first: ``MLP("net", [8, 50, 1])`` maps (batch, 8) to
    (batch, 1) with weight sites ``net.0.weight``, ``net.0.bias``, ``net.1.weight``, ...
    ``activation`` is a name ("relu", "tanh", "gelu", ...) or a ``ppl_bdl.math`` function; the last
    layer is linear.

    Example
    -------
    >>> from ppl_bdl import nn, dist
    >>> net = nn.MLP("net", [8, 50, 1], activation="tanh", prior=dist.Normal(0.0, 1.0))
    """

    def __init__(
        self,
        name: str,
        sizes: Sequence[int],
        activation: str | Callable = "relu",
        prior: Distribution | None = None,
        prior_scale: float | None = None,
    ):
        if len(sizes) < 2:
            raise ModelError(f"MLP({name!r}): sizes needs at least [in, out], got {list(sizes)}.")
        self.name = name
        self.activation = _activation(activation, f"MLP({name!r})")
        prior = _prior(prior, prior_scale, f"MLP({name!r})")
        self.layers = [
            Dense(f"{name}.{i}", sizes[i], sizes[i + 1], prior=prior) for i in range(len(sizes) - 1)
        ]

    def sample(self) -> SampledNetwork:
        """Sample every layer's weight sites; return the network with those weights, as a
        function of x (call it inside a plate on the batch's inputs)."""
        weights = [layer.sample().weights[0] for layer in self.layers]
        return SampledNetwork(self.layers, weights, activation=self.activation)

    def __call__(self, x: Any) -> Any:
        return self.sample()(x)


class SampledNetwork:
    """A network with sampled weights: ``f(x)`` applies it (no new sites are sampled)."""

    def __init__(self, layers: list[Dense], weights: list[tuple[Any, Any]], activation):
        self.layers = layers
        self.weights = weights
        self.activation = activation

    def __call__(self, x: Any) -> Any:
        last = len(self.layers) - 1
        for i, (layer, (w, b)) in enumerate(zip(self.layers, self.weights, strict=True)):
            layer.check_input(x)
            x = x @ w
            if b is not None:
                x = x + b
            if i < last:
                x = self.activation(x)
        return x
