"""A model's log density split at one plate: one number for the sites outside it, one per point
for the sites inside it (the per-point bounds of an amortized guide need them apart).

For a plate of points i = 1..B (a minibatch of the data plate),
log p(θ, z, x) = log p(θ) + Σ_i log p(x_i, z_i | θ): :class:`PointDensity` returns the first
term (everything outside the plate, log-Jacobians included) and the vector of the B terms of the
second, unscaled: whoever uses them scales them (N/B for a minibatch) and combines them per point
(the IWAE bound takes a log-mean-exp over particles per point, Burda et al. 2015; Eq. 3.18 of
"Bayesian Computation in Deep Learning").

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import dist
>>> from ppl_bdl.trace.pointwise import PointDensity
>>> @bdl.model
... def m(y):
...     mu = bdl.sample("mu", dist.Normal(0.0, 1.0))
...     with bdl.plate("data", y.shape[0]) as idx:
...         bdl.sample("y", dist.Normal(mu, 1.0), obs=y[idx])
>>> backend = bdl.backends.get("numpyro")
>>> density = PointDensity(m(np.array([0.0, 1.0, 2.0])), backend, "data")
>>> with backend.activate():
...     outside, points = density({"mu": backend.asarray(0.0)}, density.data, backend.asarray([0, 2]))
>>> round(float(outside), 4), [round(float(p), 4) for p in points]
(-0.9189, [-0.9189, -2.9189])
"""

from __future__ import annotations

from typing import Any

from ppl_bdl.dsl.bound_data import fill_data
from ppl_bdl.dsl.effects import Message, PlateFrame
from ppl_bdl.errors import ModelError
from ppl_bdl.trace.interpreter import Evaluator


class PointwiseEvaluator(Evaluator):
    """An :class:`~ppl_bdl.trace.interpreter.Evaluator` that keeps the log density of the sites in
    ``plate`` per point of it (``log_point``, shape (B,), unscaled) and adds the others to
    ``log_joint`` as usual."""

    accumulators = ("log_joint", "log_point")

    def __init__(self, backend, plate: str, **kwargs: Any):
        super().__init__(backend, **kwargs)
        self.point_plate = plate
        #: Σ over the plate's sites of their log density at each point, shape (B,), unscaled.
        self.log_point: Any = 0.0

    def _add_log_density(self, msg: Message, log_prob) -> None:
        frame = next((f for f in msg.plates if f.name == self.point_plate), None)
        if frame is None:
            super()._add_log_density(msg, log_prob)
            return
        self.log_point = self.log_point + per_point(self.backend, msg, frame, log_prob)


def per_point(backend, msg: Message, frame: PlateFrame, log_prob) -> Any:
    """``log_prob`` of a site in ``frame``'s plate summed over every axis but the plate's: (B,).

    A site's log density has the shape of its batch dims and ``shape=`` dims (plates leftmost,
    the first plate rightmost of them, :mod:`ppl_bdl.dsl.sites`), so the plate's axis is known."""
    lp = log_prob if backend.is_array(log_prob) else backend.asarray(log_prob)
    axis = max(-f.dim for f in msg.plates) + frame.dim
    shape = tuple(lp.shape)
    if len(shape) <= axis or shape[axis] != frame.batch_size:
        raise ModelError(
            f"site {msg.name!r} sits in the plate {frame.name!r} of {frame.batch_size} points, but "
            f"its log density has shape {shape}, without one value per point on axis {axis}. "
            "Inside the data plate, give every sample site and bdl.factor one value per point "
            "(a factor's log_weight shaped (B, ...), the plate's points first)."
        )
    others = tuple(i for i in range(len(shape)) if i != axis)
    return backend.math.sum(lp, axis=others) if others else lp


class PointDensity:
    """log p of a bound model split at ``plate``: ``density(sites, data, indices, params)``
    returns (the log density of the sites outside the plate, a number; that of the sites in it
    at each of ``indices``, shape (B,)).

    ``sites`` holds unconstrained values of every continuous latent site (each through its
    support's bijection, the log-Jacobian included), the ``local`` ones given for the points of
    ``indices`` only (the plate then yields ``indices``, which may repeat a point: K particles
    of B points are K·B indices). ``exclude`` leaves sites' own log density out (a closed-form
    KL adds it). ``data`` is the list of the data's arrays (``self.data`` by default).
    """

    def __init__(
        self,
        bound,
        backend,
        plate: str,
        local: frozenset = frozenset(),
        params: dict | None = None,
        exclude: frozenset = frozenset(),
    ):
        self.bound, self.backend, self.plate = bound, backend, plate
        self.local, self.params, self.exclude = frozenset(local), params, frozenset(exclude)
        self.data, self._template = bound.data_arrays(backend)

    def __call__(self, sites: dict, data=None, indices=None, params=None) -> tuple[Any, Any]:
        backend = self.backend
        ev = PointwiseEvaluator(
            backend,
            self.plate,
            unconstrained=sites,
            batch={self.plate: indices},
            params=self.params if params is None else params,
            exclude=self.exclude,
            local=self.local,
        )
        self.bound.run_with(ev, fill_data(self._template, self.data if data is None else data))
        points = ev.log_point
        if not backend.is_array(points):  # no site in the plate: zero per point
            points = backend.math.zeros((int(indices.shape[0]),)) + points
        return ev.log_joint, points
