"""Bayesian neural networks built from :class:`ppl_bdl.dsl.nn.MLP`.

A BNN ``f_θ(x) = W_L g(... g(W_1 x + b_1)) + b_L`` with Gaussian priors on every weight and bias
(prior scale s; weight decay λ = 1/s² in the MAP view), and a Gaussian likelihood for regression or
a categorical-softmax likelihood for classification (Neal, *Bayesian Learning for Neural
Networks*, 1996; MacKay, 1992).

Regression takes its noise model as an argument, as the literature fits them: a HalfNormal prior on
the noise scale (default), a Gamma prior on the noise precision (probabilistic backpropagation),
a fixed scale, or a heteroscedastic head whose network outputs the mean and the scale. The UCI
protocol is one hidden layer of 50 ReLU units (:func:`make_uci_bnn_regression`).

The architecture is fixed when the model is made (:func:`make_bnn_regression`,
:func:`make_bnn_classification`); the data is bound when it is called.

Example
-------
>>> import ppl_bdl as bdl
>>> from ppl_bdl.models import bnn, regression
>>> X, y = regression.sine_data()
>>> model = bnn.make_bnn_regression(hidden=(10,))
>>> post = bdl.fit(model(X, y), backend="numpyro", num_warmup=20, num_samples=20,
...                num_chains=1, max_tree_depth=5, progress=False)
>>> post.samples["net.0.weight"].shape
(1, 20, 1, 10)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import ppl_bdl as bdl
from ppl_bdl import dist, nn
from ppl_bdl import math as bm
from ppl_bdl.errors import ModelError

Array = Any


def _sizes(hidden: Sequence[int], where: str) -> list[int]:
    sizes = [int(h) for h in hidden]
    if any(h < 1 for h in sizes):
        raise ModelError(f"{where}: hidden widths must be positive ints, got {list(hidden)}.")
    return sizes


def _positive(value: object, label: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ModelError(f"{where}: {label} must be a positive number, got {value!r}.")
    return float(value)


# -- noise models ---------------------------------------------------------------------------------
class NoiseModel:
    """How a regression BNN's outputs become ``Normal(mean, scale)``.

    ``outputs`` is the number of network outputs per example; ``sample()`` runs in the model,
    outside the data plate (it draws the global noise sites) and returns ``split(out) -> (mean,
    scale)``, applied to the network's outputs inside the plate.
    """

    outputs = 1

    def sample(self) -> Callable[[Array], tuple[Array, Array]]:  # pragma: no cover - abstract
        raise NotImplementedError


class HalfNormalNoise(NoiseModel):
    """``sigma ~ HalfNormal(scale)``, one noise scale for every example (site ``sigma``).

    Example
    -------
    >>> from ppl_bdl.models import bnn
    >>> model = bnn.make_bnn_regression(noise=bnn.HalfNormalNoise(0.5))
    """

    def __init__(self, scale: float = 1.0):
        self.scale = _positive(scale, "scale", "HalfNormalNoise")

    def sample(self):
        sigma = bdl.sample("sigma", dist.HalfNormal(self.scale))
        return lambda out: (out[..., 0], sigma)


class GammaPrecision(NoiseModel):
    """A Gamma prior on the noise precision, ``precision ~ Gamma(concentration, rate)`` and
    ``sigma = precision^(-1/2)`` (site ``precision``), as probabilistic backpropagation
    (Hernández-Lobato & Adams, *Probabilistic Backpropagation for Scalable Learning of Bayesian
    Neural Networks*, 2015, Sec. 2; Gamma(6, 6) in their experiments).

    Example
    -------
    >>> from ppl_bdl.models import bnn
    >>> model = bnn.make_bnn_regression(noise=bnn.GammaPrecision(6.0, 6.0))
    """

    def __init__(self, concentration: float = 6.0, rate: float = 6.0):
        self.concentration = _positive(concentration, "concentration", "GammaPrecision")
        self.rate = _positive(rate, "rate", "GammaPrecision")

    def sample(self):
        precision = bdl.sample("precision", dist.Gamma(self.concentration, self.rate))
        sigma = 1.0 / bm.sqrt(precision)
        return lambda out: (out[..., 0], sigma)


class FixedNoise(NoiseModel):
    """A known noise scale ``sigma = scale`` (no site).

    Example
    -------
    >>> from ppl_bdl.models import bnn
    >>> model = bnn.make_bnn_regression(noise=bnn.FixedNoise(0.1))
    """

    def __init__(self, scale: float = 1.0):
        self.scale = _positive(scale, "scale", "FixedNoise")

    def sample(self):
        return lambda out: (out[..., 0], self.scale)


class Heteroscedastic(NoiseModel):
    """A heteroscedastic head: the network outputs two values per example, the mean and an
    unconstrained scale ``s``, with ``sigma = softplus(s) + min_scale`` (Nix & Weigend,
    *Estimating the mean and variance of the target probability distribution*, 1994; Kendall & Gal,
    *What Uncertainties Do We Need in Bayesian Deep Learning?*, 2017, Eq. 5). No extra site.

    Example
    -------
    >>> from ppl_bdl.models import bnn
    >>> model = bnn.make_bnn_regression(noise=bnn.Heteroscedastic(min_scale=1e-3))
    """

    outputs = 2

    def __init__(self, min_scale: float = 1e-3):
        self.min_scale = _positive(min_scale, "min_scale", "Heteroscedastic")

    def sample(self):
        return lambda out: (out[..., 0], bm.softplus(out[..., 1]) + self.min_scale)


#: The noise models by name; ``noise_scale`` sets the scale of "halfnormal" and "fixed".
NOISE_MODELS = ("halfnormal", "gamma", "fixed", "heteroscedastic")


def _noise_model(noise: str | NoiseModel, noise_scale: float) -> NoiseModel:
    if isinstance(noise, NoiseModel):
        return noise
    if noise == "halfnormal":
        return HalfNormalNoise(noise_scale)
    if noise == "gamma":
        return GammaPrecision()
    if noise == "fixed":
        return FixedNoise(noise_scale)
    if noise == "heteroscedastic":
        return Heteroscedastic()
    raise ModelError(
        f"make_bnn_regression: unknown noise model {noise!r}; expected one of {NOISE_MODELS} or "
        "a NoiseModel (HalfNormalNoise, GammaPrecision, FixedNoise, Heteroscedastic)."
    )


# -- models ---------------------------------------------------------------------------------------
def make_bnn_regression(
    hidden: Sequence[int] = (20,),
    activation: str | Callable = "tanh",
    prior_scale: float = 1.0,
    noise_scale: float = 1.0,
    noise: str | NoiseModel = "halfnormal",
    prior: nn.Prior | None = None,
    p: float | None = None,
) -> bdl.Model:
    """A BNN regression model ``y ~ Normal(mean, sigma)`` with the noise model ``noise``.

    The network ``net`` is ``nn.MLP("net", [d, *hidden, k])`` with ``k`` the noise model's outputs
    (1; 2 for the heteroscedastic head); its sites are ``net.0.weight``, ``net.0.bias``, ... with
    the prior N(0, prior_scale²), or ``prior`` (a scale, a distribution or a fan function such as
    ``nn.he_normal()``). ``noise`` is "halfnormal" (``sigma ~ HalfNormal(noise_scale)``, the
    default), "gamma" (``precision ~ Gamma(6, 6)``), "fixed" (``sigma = noise_scale``),
    "heteroscedastic", or a :class:`NoiseModel`. ``p`` (None: none) puts an
    :class:`~ppl_bdl.dsl.nn.Dropout` of rate ``p`` before every Dense layer, the inputs' included,
    as Gal & Ghahramani (2016) do for MC dropout (the identity under every other method); the
    weight sites keep their names. Bind it as ``model(X, y)`` with ``X`` shaped (n, d).

    Example
    -------
    >>> from ppl_bdl.models import bnn
    >>> model = bnn.make_bnn_regression(hidden=(50,), activation="relu", noise="gamma")
    """
    sizes = _sizes(hidden, "make_bnn_regression")
    noise_model = _noise_model(noise, noise_scale)
    net_prior = prior_scale if prior is None else prior

    def bnn_regression(X, y=None):
        widths = [X.shape[1], *sizes, noise_model.outputs]
        if p is None:
            net = nn.MLP("net", widths, activation=activation, prior=net_prior)
        else:
            net = _dropout_mlp(widths, activation, net_prior, p)
        f = net.sample()  # the weights are global: sampled outside the plate
        split = noise_model.sample()
        with bdl.plate("data", X.shape[0]) as idx:
            mean, sigma = split(f(X[idx]))  # only the (mini)batch goes through the network
            bdl.sample("y", dist.Normal(mean, sigma), obs=None if y is None else y[idx])

    return bdl.model(bnn_regression)


def _dropout_mlp(widths: Sequence[int], activation, prior, p: float) -> nn.Sequential:
    """``nn.MLP("net", widths, ...)`` with an ``nn.Dropout(p)`` before every Dense layer."""
    layers: list = []
    for i in range(len(widths) - 1):
        if i:
            layers.append(activation)
        layers += [nn.Dropout(p), nn.Dense(str(i), widths[i], widths[i + 1])]
    return nn.Sequential("net", layers, prior=prior)


def make_uci_bnn_regression(
    width: int = 50, noise: str | NoiseModel = "gamma", prior_scale: float = 1.0
) -> bdl.Model:
    """The UCI regression protocol's BNN: one hidden layer of ``width`` ReLU units (50; 100 for
    the larger sets), a Gamma prior on the noise precision (Hernández-Lobato & Adams, 2015,
    Sec. 5).

    Example
    -------
    >>> from ppl_bdl.models import bnn
    >>> model = bnn.make_uci_bnn_regression(width=50)
    """
    return make_bnn_regression(
        hidden=(width,), activation="relu", prior_scale=prior_scale, noise=noise
    )


def make_bnn_classification(
    hidden: Sequence[int] = (20,),
    activation: str | Callable = "tanh",
    prior_scale: float = 1.0,
    prior: nn.Prior | None = None,
) -> bdl.Model:
    """A BNN classifier ``y ~ Categorical(logits = f_θ(x))``. Bind it as
    ``model(X, y, num_classes=k)`` with integer labels ``y`` in 0..k-1. ``prior`` (a scale, a
    distribution or a fan function) replaces N(0, prior_scale²) when given."""
    sizes = _sizes(hidden, "make_bnn_classification")
    net_prior = prior_scale if prior is None else prior

    def bnn_classification(X, y=None, num_classes: int = 2):
        net = nn.MLP(
            "net",
            [X.shape[1], *sizes, int(num_classes)],
            activation=activation,
            prior=net_prior,
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
    from ppl_bdl.models.regression import make_sine_data

    X, y = make_sine_data(n=30, seed=1)
    Xc, yc = make_blobs(n=30, num_classes=3, seed=1)
    return {
        "bnn_regression": make_bnn_regression(hidden=(5,))(X, y),
        "bnn_classification": make_bnn_classification(hidden=(5,))(Xc, yc, num_classes=3),
    }
