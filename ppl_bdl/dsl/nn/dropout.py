"""Dropout as a layer, :class:`Dropout`, and the handler that turns it on, :class:`ActiveDropout`.

A :class:`Dropout` layer is the identity unless an :class:`ActiveDropout` handler is on the
effect stack of the run (:mod:`ppl_bdl.dsl.effects`). Only MC dropout
(``fit(..., method="mc_dropout")``, :mod:`ppl_bdl.inference.mc_dropout`) installs one: in each
training step, and in every replay or prediction of one of its draws. Every other method (NUTS,
VI, SG-MCMC, ensembles, ...), a lowered model (a plain Pyro/NumPyro model) and the prediction of
any other posterior run the layer as the identity: a model with Dropout layers fitted by them is
the model without them.

Active, a layer of rate p multiplies its input by a mask m/(1 − p), m ~ Bernoulli(1 − p) per
element ("inverted" dropout: E[mask] = 1, so the network's expected activations do not change
with p). The handler gives the noise the mask is read from, standard normals z with
m = [z ≥ Φ⁻¹(p)], which is Bernoulli(1 − p) exactly (a threshold on normals rather than
uniforms because the backends' normal draws are their fastest: on the CPU NumPyro's is one fused
kernel). The noise is drawn from the handler's key, folded with the layer's call number
(``fold_in``; on torch the key is one generator advancing through the calls in order), or
handed in ready-made (a compiled training step draws it outside its traced gradient and passes
it in, so the traced function stays pure).

Two kinds of masks, after Gal & Ghahramani (2016):

- ``per_point=True`` (training): one mask per element of the input, so each point of the
  minibatch has its own (their MC estimate of the objective draws one network per point);
- ``per_point=False`` (a posterior draw): one mask shared by every point (the input's leading
  axis, the data points, is broadcast): a draw is one network, W·diag(m), as a draw from their
  q(ω) is, so its predictions at several points, in any chunks, belong together.

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import nn
>>> net = nn.MLP("net", [3, 8, 8, 1], p=0.2)
>>> net.layers
[Dense('0', 3, 8), Activation('relu'), Dropout(0.2), Dense('1', 8, 8), Activation('relu'), Dropout(0.2), Dense('2', 8, 1)]
"""

from __future__ import annotations

import numbers
from statistics import NormalDist
from typing import Any

from ppl_bdl.dsl import math as bm
from ppl_bdl.dsl.effects import Handler, innermost_handler
from ppl_bdl.dsl.nn.module import Module, shape_of
from ppl_bdl.errors import ModelError

#: The sample statistic holding each draw's mask seed (a posterior of MC dropout): a draw is
#: its weights and this seed, and every replay of the draw runs with the masks it gives.
DROPOUT_SEED = "dropout_seed"


def check_rate(p: Any, where: str) -> float:
    """``p`` as a dropout rate in [0, 1), or a ModelError naming ``where``."""
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0.0 <= float(p) < 1.0:
        raise ModelError(
            f"{where}: p is the probability that a unit is dropped, a number in [0, 1) "
            f"(0: keep every unit); got {p!r}."
        )
    return float(p)


class Dropout(Module):
    """Inverted dropout with rate ``p``: while MC dropout runs the model (an
    :class:`ActiveDropout` handler on the stack), each unit of the input is zeroed with
    probability p and the kept ones scaled by 1/(1 − p). Everywhere else, training by any other
    method, prediction from any other posterior, a lowered model, ``layer.apply``, it is the
    identity. No parameters.

    Parameters
    ----------
    p : float
        The probability that a unit is dropped, in [0, 1); 0 is the identity even under MC
        dropout.

    Example
    -------
    >>> import numpy as np, ppl_bdl as bdl
    >>> from ppl_bdl import nn
    >>> layer = nn.Dropout(0.5)
    >>> backend = bdl.backends.get("numpyro")
    >>> with backend.activate():   # no MC dropout running: the identity
    ...     layer.apply({}, backend.asarray([[1.0, 2.0]])).tolist()
    [[1.0, 2.0]]
    """

    def __init__(self, p: float = 0.5):
        self.p = check_rate(p, "Dropout")

    def _forward(self, values, x, path):
        active = active_dropout()
        if active is None:
            return x
        return active.drop(x, self.p, path)

    def __repr__(self) -> str:
        return f"Dropout({self.p:g})"


class ActiveDropout(Handler):
    """Dropout on for one run of a model: enter it inside the run's runtime
    (``bound.run_with(runtime, data, handlers=(ActiveDropout(...),))``).

    Parameters
    ----------
    backend : Backend
    key : backend random key, optional
        The noise (standard normals) of Dropout call i (in the model's order) is drawn with
        ``fold_in(key, i)``.
    noise : sequence of arrays, optional
        Or the noise itself, one array per Dropout call with p > 0, of the shapes
        :attr:`shapes` recorded by a run with a key.
    per_point : bool
        One mask per element of the input (training), or one shared by the points of its
        leading axis (a posterior draw).
    record : bool
        Keep each call's mask in :attr:`masks` (path -> mask).

    Attributes
    ----------
    calls : list of (path, p)
        Every Dropout layer the run went through, p = 0 ones included.
    shapes : list of tuple
        The shape of the noise of each call with p > 0.
    """

    def __init__(
        self,
        backend: Any,
        key: Any = None,
        noise: Any = None,
        per_point: bool = True,
        record: bool = False,
    ):
        if (key is None) == (noise is None):
            raise ValueError("ActiveDropout takes a key or the noise, one of the two.")
        self.backend, self.key, self.noise = backend, key, noise
        self.per_point, self.record = per_point, record
        self.calls: list[tuple[str, float]] = []
        self.shapes: list[tuple[int, ...]] = []
        self.masks: dict[str, Any] = {}

    @classmethod
    def from_seed(cls, backend: Any, seed: Any, record: bool = False) -> ActiveDropout:
        """The masks of a posterior draw whose mask seed is ``seed`` (one mask per layer,
        shared by the points)."""
        return cls(backend, key=backend.random.key(seed), per_point=False, record=record)

    def mask_shape(self, x: Any) -> tuple[int, ...]:
        shape = shape_of(x)
        return shape if self.per_point or len(shape) < 2 else shape[1:]

    def drop(self, x: Any, p: float, path: str) -> Any:
        """``x`` with its units dropped at rate ``p`` and the others scaled by 1/(1 − p)."""
        self.calls.append((path, p))
        if p == 0.0:
            return x
        shape, i = self.mask_shape(x), len(self.shapes)
        self.shapes.append(shape)
        z = self._noise(i, shape, path)
        mask = bm.where(z < NormalDist().inv_cdf(p), 0.0, 1.0 / (1.0 - p))
        if self.record:
            self.masks[path] = mask
        return x * mask

    def _noise(self, i: int, shape: tuple[int, ...], path: str) -> Any:
        if self.noise is None:
            return self.backend.random.normal(self.backend.random.fold_in(self.key, i), shape)
        if i >= len(self.noise) or shape_of(self.noise[i]) != shape:
            given = [shape_of(z) for z in self.noise]
            raise ModelError(
                f"Dropout {path!r} (call {i} with p > 0) needs noise of shape {shape}; the "
                f"run was given {given}. Record the shapes with a run that draws from a key "
                "(ActiveDropout(backend, key=...).shapes) at the same input shapes."
            )
        return self.noise[i]


def active_dropout() -> ActiveDropout | None:
    """The :class:`ActiveDropout` handler of the run in progress, or None (dropout off)."""
    return innermost_handler(ActiveDropout)
