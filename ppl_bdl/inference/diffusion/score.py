"""The score s_θ(x, t) ≈ ∇_x log p_t(x) as a pure function of parameters, points and times.

A noise-conditional score network (Song and Ermon 2019; Song et al. 2021) is a
:mod:`ppl_bdl.dsl.nn` network (or a lifted module) whose input is the point x (D numbers) with the
time t appended, and K Fourier features of t if ``time_features=K``:

    input = [x, t, sin(π t), cos(π t), ..., sin(K π t), cos(K π t)]   (D + 1 + 2K numbers),

and whose output has the point's D numbers. The output is divided by σ(t), the perturbation
kernel's standard deviation, as Song et al. (2021) do for their VE models: the network then
predicts −z, the noise scaled to unit variance (Ho et al. 2020's noise prediction), which keeps
its outputs of order one at every noise level, and the weighted loss of Eq. 3.11 with
λ(t) = σ(t)² becomes ½‖net + z‖².

For exact score matching (``score_matching="exact"``) the network is s_θ(x) itself: input x,
output D numbers, no time. A Python function ``score(x, t)`` written with :mod:`ppl_bdl.dsl.math`
(a known score, to check a sampler) takes the place of a network in :class:`FunctionScore`.

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import nn
>>> from ppl_bdl.inference.diffusion.score import NetworkScore
>>> from ppl_bdl.inference.diffusion.sde import VPSDE
>>> backend = bdl.backends.get("numpyro")
>>> score = NetworkScore(nn.MLP("s", [2 + 1, 16, 2]), backend, dim=2, sde=VPSDE())
>>> params = score.initial_params(seed=0)
>>> with backend.activate():
...     out = score(params, backend.asarray(np.zeros((3, 2))), backend.asarray(np.full(3, 0.5)))
>>> tuple(out.shape)
(3, 2)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ppl_bdl.dsl import math as bm
from ppl_bdl.dsl.nn import Module, SampledNetwork, initial_values
from ppl_bdl.errors import ModelError

Array = Any


def time_input(t: Array, features: int) -> Array:
    """The time columns of the network's input, (B, 1 + 2K): t, then sin(kπt), cos(kπt) for
    k = 1..K (``features``)."""
    column = bm.reshape(t, (-1, 1))
    if not features:
        return column
    freqs = bm.reshape(bm.arange(1, features + 1) * 1.0, (1, features)) * np.pi
    angles = column * freqs
    return bm.concatenate([column, bm.sin(angles), bm.cos(angles)], axis=-1)


class NetworkScore:
    """s_θ(x, t) = net([x, features(t)]) / σ(t), or s_θ(x) = net(x) without an SDE (exact score
    matching): ``score(params, x, t) -> (B, D)``.

    Parameters
    ----------
    network : ppl_bdl.dsl.nn.Module
        Maps (B, D + 1 + 2K) (or (B, D) without ``sde``) to (B, D).
    backend : Backend
        The backend it runs on.
    dim : int
        D, the size of a point.
    sde : VESDE or VPSDE or None
        The SDE whose σ(t) scales the output; None: a score of x alone.
    time_features : int
        K, the Fourier features of t in the input.
    """

    def __init__(self, network: Module, backend, *, dim: int, sde=None, time_features: int = 0):
        if not isinstance(network, Module):
            raise ModelError(
                f"the score network must be a ppl_bdl.dsl.nn network (nn.MLP, nn.Sequential, ...) "
                f"or a lifted torch/equinox module (nn.lift(module)); got "
                f"{type(network).__name__}. For a score given as a function, use "
                "bdl.diffusion.ScoreModel(score_fn, ...)."
            )
        self.network, self.backend, self.dim = network, backend, int(dim)
        self.sde, self.time_features = sde, int(time_features)
        with backend.scope(), backend.activate():
            self.shapes = dict(network.sites())
        if not self.shapes:
            raise ModelError(
                f"the score network {network.path!r} has no weights to train; give it at least "
                "one layer with weights (nn.Dense, ...)."
            )

    @property
    def input_size(self) -> int:
        """The width of the network's input: D, plus 1 + 2K with time."""
        return self.dim + (0 if self.sde is None else 1 + 2 * self.time_features)

    def __call__(self, params: dict, x: Array, t: Array | None = None) -> Array:
        net = SampledNetwork(self.network, params)
        if self.sde is None:
            return bm.reshape(net(x), (x.shape[0], self.dim))
        t = t + 0.0 * x[:, 0]  # one time per row, also from a scalar
        out = net(bm.concatenate([x, time_input(t, self.time_features)], axis=-1))
        out = bm.reshape(out, (x.shape[0], self.dim))
        return out / bm.reshape(self.sde.std(t, bm), (-1, 1))

    def initial_params(self, seed: int) -> dict[str, np.ndarray]:
        """One draw of each weight site's prior (a lifted module's own values)."""
        return initial_values(self.network, self.backend, seed)

    def check(self, params: dict, X: np.ndarray) -> None:
        """Run the network once on two rows of ``X``: a clear error naming the shapes if its
        input width is wrong or its output is not one score of the point's shape per row."""
        backend, probe = self.backend, X[: min(2, len(X))]
        width = self.input_size
        time = "" if self.sde is None else f" + 1 (t) + {2 * self.time_features} (time features)"
        with backend.scope(), backend.activate():
            values = {k: backend.asarray(v) for k, v in params.items()}
            x = backend.asarray(probe)
            net_input = x
            if self.sde is not None:
                t = backend.asarray(np.full(len(probe), 0.5, probe.dtype))
                net_input = bm.concatenate([x, time_input(t, self.time_features)], axis=-1)
            try:
                out = SampledNetwork(self.network, values)(net_input)
            except Exception as err:  # noqa: BLE001 - a shape error from any layer, named below
                raise ModelError(
                    f"the score network {self.network.path!r} failed on an input of shape "
                    f"{(len(probe), width)} ({self.dim} (x){time}); its first layer must take "
                    f"{width} inputs: {type(err).__name__}: {err}"
                ) from err
        seen = tuple(int(s) for s in out.shape)
        if seen != (len(probe), self.dim):
            raise ModelError(
                f"the score network {self.network.path!r} maps an input of shape "
                f"{(len(probe), width)} to shape {seen}; a score has the data's shape, so "
                f"expected {(len(probe), self.dim)} (X has shape {X.shape}). End the network "
                f"with a layer of {self.dim} outputs (e.g. nn.MLP(..., [{width}, 64, {self.dim}]))."
            )


class FunctionScore:
    """A score given as a function ``fn(x, t) -> (B, D)`` of :mod:`ppl_bdl.dsl.math` (``fn(x)``
    without an SDE), with no parameters: ``score(params, x, t)`` ignores ``params``."""

    def __init__(self, fn: Callable, *, dim: int, sde=None):
        if not callable(fn):
            raise ModelError(
                f"score must be a ppl_bdl.dsl.nn network or a function score(x, t); got "
                f"{type(fn).__name__}."
            )
        self.fn, self.dim, self.sde = fn, int(dim), sde
        self.shapes: dict = {}

    def __call__(self, params: dict, x: Array, t: Array | None = None) -> Array:
        if self.sde is None:
            out = self.fn(x)
        else:  # one time per row, as a column: it broadcasts against x in the user's function
            out = self.fn(x, bm.reshape(t + 0.0 * x[:, 0], (-1, 1)))
        return bm.reshape(out + 0.0 * x, (x.shape[0], self.dim))
