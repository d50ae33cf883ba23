"""Bayesian neural networks built from :class:`ppl_bdl.nn.MLP`.

A BNN ``f_θ(x) = W_L g(... g(W_1 x + b_1)) + b_L`` with Gaussian priors on every weight and bias
(prior scale s; weight decay λ = 1/s² in the MAP view), and a Gaussian likelihood for regression or
a categorical-softmax likelihood for classification (Neal, *Bayesian Learning for Neural
Networks*, 1996; MacKay, 1992).

The architecture is fixed when the model is made (:func:`make_bnn_regression`,
:func:`make_bnn_classification`); the data is bound when it is called.

Example
-------
>>> import ppl_bdl as bdl
>>> from ppl_bdl.models import bnn, regression
>>> X, y = regression.sine_data()
>>> model = bnn.make_bnn_regression(hidden=(10,))
>>> post = bdl.fit(model(X, y), backend="numpyro", num_warmup=100, num_samples=100,
...                num_chains=1, progress=False)
>>> post.samples["net.0.weight"].shape
(1, 100, 1, 10)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

import ppl_bdl as bdl
from ppl_bdl import dist, nn
from ppl_bdl.errors import ModelError


def _sizes(hidden: Sequence[int], where: str) -> list[int]:
    sizes = [int(h) for h in hidden]
    if any(h < 1 for h in sizes):
        raise ModelError(f"{where}: hidden widths must be positive ints, got {list(hidden)}.")
    return sizes


def make_bnn_regression(
    hidden: Sequence[int] = (20,),
    activation: str | Callable = "tanh",
    prior_scale: float = 1.0,
    noise_scale: float = 1.0,
) -> bdl.Model:
    """A BNN regression model ``y ~ Normal(f_θ(x), sigma)``, ``sigma ~ HalfNormal(noise_scale)``.

    The network ``net`` is ``nn.MLP("net", [d, *hidden, 1])``; its sites are ``net.0.weight``,
    ``net.0.bias``, ... Bind it as ``model(X, y)`` with ``X`` shaped (n, d).
    """
    sizes = _sizes(hidden, "make_bnn_regression")

    def bnn_regression(X, y=None):
        net = nn.MLP("net", [X.shape[1], *sizes, 1], activation=activation, prior_scale=prior_scale)
        f = net.sample()  # the weights are global: sampled outside the plate
        sigma = bdl.sample("sigma", dist.HalfNormal(noise_scale))
        with bdl.plate("data", X.shape[0]) as idx:
            mean = f(X[idx])[..., 0]  # only the (mini)batch goes through the network
            bdl.sample("y", dist.Normal(mean, sigma), obs=None if y is None else y[idx])

    return bdl.model(bnn_regression)


def make_bnn_classification(
    hidden: Sequence[int] = (20,),
    activation: str | Callable = "tanh",
    prior_scale: float = 1.0,
) -> bdl.Model:
    """A BNN classifier ``y ~ Categorical(logits = f_θ(x))``. Bind it as
    ``model(X, y, num_classes=k)`` with integer labels ``y`` in 0..k-1."""
    sizes = _sizes(hidden, "make_bnn_classification")

    def bnn_classification(X, y=None, num_classes: int = 2):
        net = nn.MLP(
            "net",
            [X.shape[1], *sizes, int(num_classes)],
            activation=activation,
            prior_scale=prior_scale,
        )
        f = net.sample()
        with bdl.plate("data", X.shape[0]) as idx:
            logits = f(X[idx])
            bdl.sample("y", dist.Categorical(logits=logits), obs=None if y is None else y[idx])

    return bdl.model(bnn_classification)


#: Default architectures: one hidden layer of 20 tanh units.
bnn_regression = make_bnn_regression()
bnn_classification = make_bnn_classification()


def make_blobs(n: int = 60, num_classes: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian blobs in 2-D around the vertices of a polygon; integer labels 0..num_classes-1."""
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % num_classes
    angles = 2 * np.pi * labels / num_classes
    centres = 2.0 * np.column_stack([np.cos(angles), np.sin(angles)])
    return centres + 0.7 * rng.normal(size=(n, 2)), labels.astype(np.int64)


def examples() -> dict:
    """Small bound models for the conformance suite."""
    from .regression import make_sine_data

    X, y = make_sine_data(n=30, seed=1)
    Xc, yc = make_blobs(n=30, num_classes=3, seed=1)
    return {
        "bnn_regression": make_bnn_regression(hidden=(5,))(X, y),
        "bnn_classification": make_bnn_classification(hidden=(5,))(Xc, yc, num_classes=3),
    }
