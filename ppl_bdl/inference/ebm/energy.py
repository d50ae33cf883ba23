"""The energy E_θ(x) of an energy-based model, as a pure function of its parameters and inputs.

An energy-based model defines p_θ(x) = exp(−E_θ(x)) / Z_θ ("Bayesian Computation in Deep Learning", Eq. 3.1), with E_θ a
network. Here E_θ is a :mod:`ppl_bdl.dsl.nn` network (or a torch / equinox module lifted with
:func:`ppl_bdl.dsl.nn.lift`) that maps a batch of inputs (B, *event) to one number per input, (B,) or
(B, 1). Its weight sites are the parameters θ; outside a model they are plain arrays given by site
name, and :class:`Energy` runs the network on them (``nn.SampledNetwork``, which samples nothing).

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import nn
>>> from ppl_bdl.inference.ebm.energy import Energy
>>> backend = bdl.backends.get("numpyro")
>>> energy = Energy(nn.MLP("e", [2, 8, 1]), backend)
>>> params = energy.initial_params(seed=0)
>>> with backend.activate():
...     values = energy(params, backend.asarray(np.zeros((3, 2))))
>>> tuple(values.shape)
(3,)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ppl_bdl.dsl import math as bm
from ppl_bdl.dsl.nn import Module, SampledNetwork, initial_values
from ppl_bdl.errors import DataError, ModelError

Array = Any


class Energy:
    """E_θ(x) of a network on one backend: ``energy(params, x) -> (B,)``.

    Parameters
    ----------
    network : ppl_bdl.dsl.nn.Module
        A :mod:`ppl_bdl.dsl.nn` network or a lifted module (:func:`ppl_bdl.dsl.nn.lift`) mapping (B,
        *event) to (B,) or (B, 1).
    backend : Backend
        The backend it runs on (a lifted module only on its own library's backend).
    """

    def __init__(self, network: Module, backend):
        if not isinstance(network, Module):
            raise ModelError(
                f"the energy must be a ppl_bdl.dsl.nn network (nn.MLP, nn.Sequential, ...) or a lifted "
                f"torch/equinox module (nn.lift(module)); got {type(network).__name__}. Build "
                "E(x) as a network with one output, e.g. nn.MLP('energy', [2, 64, 64, 1])."
            )
        self.network = network
        self.backend = backend
        with backend.scope(), backend.activate():
            self.shapes = dict(network.sites())
            self.priors = dict(network.priors())
        if not self.shapes:
            raise ModelError(
                f"the energy network {network.path!r} has no weights to train; give it at least "
                "one layer with weights (nn.Dense, nn.Conv2d, ...)."
            )

    def __call__(self, params: dict, x: Array) -> Array:
        """The energies of the rows of ``x`` (B, *event) at ``params``: shape (B,)."""
        out = SampledNetwork(self.network, params)(x)
        return bm.reshape(out, (x.shape[0],))

    def initial_params(self, seed: int) -> dict[str, np.ndarray]:
        """Where training starts: a lifted module's own values, else one draw of each site's
        prior (:func:`ppl_bdl.dsl.nn.initial_values`)."""
        return initial_values(self.network, self.backend, seed)

    def check(self, params: dict, X: np.ndarray) -> None:
        """Run the network once on two rows of ``X``; a clear error if it fails or does not give
        one energy per row."""
        backend = self.backend
        probe = X[: min(2, len(X))]
        with backend.scope(), backend.activate():
            values = {k: backend.asarray(v) for k, v in params.items()}
            try:
                out = SampledNetwork(self.network, values)(backend.asarray(probe))
            except ModelError as err:
                raise ModelError(
                    f"the energy network {self.network.path!r} failed on a batch of X's rows of "
                    f"shape {probe.shape} (X has shape {X.shape}: N points of shape "
                    f"{X.shape[1:]}): {err}"
                ) from err
        seen = tuple(int(s) for s in out.shape)
        if seen not in ((len(probe),), (len(probe), 1)):
            raise ModelError(
                f"the energy network {self.network.path!r} maps a batch of shape {probe.shape} to "
                f"shape {seen}; an energy is one number per point, so expected {(len(probe),)} "
                f"or {(len(probe), 1)}. End the network with a layer of one output (e.g. "
                "nn.Dense('out', hidden, 1))."
            )


def check_data(X: Any, precision: str) -> np.ndarray:
    """``X`` as a float array (N, *event) of finite values, or a clear error."""
    try:
        array = np.asarray(X, dtype=np.float32 if precision == "float32" else np.float64)
    except (TypeError, ValueError) as err:
        raise DataError(
            f"X must be a numeric array of shape (N, *event) (N points), got "
            f"{type(X).__name__}: {err}"
        ) from None
    if array.ndim < 2:
        raise DataError(
            f"X has shape {array.shape}; expected (N, *event): one row per point, e.g. (N, 2) for "
            "points in the plane or (N, C, H, W) for images. For scalar data use X[:, None]."
        )
    if array.shape[0] < 2 or math.prod(array.shape[1:]) == 0:
        raise DataError(f"X has shape {array.shape}; it needs at least 2 points of size >= 1.")
    bad = ~np.isfinite(array)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise DataError(
            f"X holds {int(bad.sum())} non-finite value(s) (first at index {where}: "
            f"{array[where]}); remove or impute them before fitting."
        )
    return array
