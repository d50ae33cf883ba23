"""Bayesian layers: every weight is a sample site named by its path, with a prior per layer.

Layers are written once, with :mod:`ppl_bdl.dsl.math`, and run on every backend: :class:`Dense`,
:class:`Conv2d` (NCHW), :class:`MaxPool2d`, :class:`AvgPool2d`, :class:`GlobalAvgPool2d`,
:class:`Flatten`, :class:`LayerNorm`, :class:`Dropout` (the identity except under MC dropout),
activations, and the containers :class:`Sequential`, :class:`Residual` and :class:`MLP`. :func:`lift` makes an existing torch or equinox module
Bayesian on its own backend. Priors: a scale, a distribution, or a function of the fans
(:func:`he_normal`, :func:`glorot_normal`).

Sample the weights once, outside the plate, and apply them to the batch inside it: the weights stay
global and a minibatch step costs O(batch), not O(N). See docs/nn.md.

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import dist, nn
>>> net = nn.Sequential("cnn", [
...     nn.Conv2d("conv", 1, 4, kernel_size=3, padding=1), "relu", nn.MaxPool2d(2),
...     nn.Flatten(), nn.Dense("fc", 4 * 4 * 4, 3),
... ], prior=nn.he_normal())
>>> @bdl.model
... def cnn(X, y=None):
...     f = net.sample()                      # weight sites, outside the plate
...     with bdl.plate("data", X.shape[0]) as idx:
...         bdl.sample("y", dist.Categorical(logits=f(X[idx])), obs=None if y is None else y[idx])
>>> X = np.random.default_rng(0).normal(size=(16, 1, 8, 8)); y = np.arange(16) % 3
>>> post = bdl.fit(cnn(X, y), backend="pyro", method="vi", num_steps=10, num_samples=4,
...                progress=False)
>>> post.samples["cnn.conv.weight"].shape
(1, 4, 4, 1, 3, 3)
"""

from ppl_bdl.dsl.nn.containers import MLP, Residual, Sequential
from ppl_bdl.dsl.nn.conv import AvgPool2d, Conv2d, GlobalAvgPool2d, MaxPool2d
from ppl_bdl.dsl.nn.dropout import Dropout
from ppl_bdl.dsl.nn.init import initial_values
from ppl_bdl.dsl.nn.layers import Dense, Flatten
from ppl_bdl.dsl.nn.lift import Lifted, ModuleParts, lift
from ppl_bdl.dsl.nn.module import ACTIVATIONS, Activation, Module, SampledNetwork, Site
from ppl_bdl.dsl.nn.norm import LayerNorm
from ppl_bdl.dsl.nn.priors import FanScaledNormal, Prior, glorot_normal, he_normal

__all__ = [
    "ACTIVATIONS",
    "MLP",
    "Activation",
    "AvgPool2d",
    "Conv2d",
    "Dense",
    "Dropout",
    "FanScaledNormal",
    "Flatten",
    "GlobalAvgPool2d",
    "LayerNorm",
    "Lifted",
    "MaxPool2d",
    "Module",
    "ModuleParts",
    "Prior",
    "Residual",
    "SampledNetwork",
    "Sequential",
    "Site",
    "glorot_normal",
    "he_normal",
    "initial_values",
    "lift",
]
