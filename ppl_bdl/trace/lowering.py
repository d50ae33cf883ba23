"""The runtime that lowers a DSL model to native Pyro / NumPyro calls.

Under :class:`Lowering`, ``bdl.sample`` becomes ``pyro.sample`` (or ``numpyro.sample``) with a native
distribution of the right batch and event shape, ``bdl.plate`` a native plate, ``bdl.scan`` the
backend's scan (NumPyro) or a loop under its ``markov`` (Pyro), and so on, so the lowered model is
a plain native model that the backend's own MCMC, SVI and Predictive accept. The model's code gets
the native values as the backend's ``model_value`` (arrays that mix with NumPy values on either
side of an operator).

The same runtime, given a trace of the model and values of its continuous latent sites, lowers
the model for the backend's enumeration machinery (:mod:`ppl_bdl.trace.enumeration`): the continuous
sites are conditioned on their values (mapped from the unconstrained space, the log-Jacobian
added as a native factor), the discrete latent sites are marked for parallel enumeration, and
every site takes the shape the trace recorded, with enumeration's dimensions on the left of its
plates.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import numpy as np

from ppl_bdl.dsl.control_flow import no_nesting, python_loop, tree_to_backend
from ppl_bdl.dsl.effects import Message, PlateFrame, Runtime
from ppl_bdl.dsl.sites import SiteShape, plate_batch_shape, site_shape
from ppl_bdl.errors import ModelError, PPLError
from ppl_bdl.trace.interpreter import Evaluator


class Lowering(Runtime):
    """Run primitives as the backend's native primitives.

    Parameters
    ----------
    backend : Backend
    sites : dict, optional
        A recorded trace of the model (:func:`ppl_bdl.trace.model_trace.trace_model`): each site takes the
        shape recorded there, so values of enumerated sites may carry extra dimensions on the
        left of the plates.
    unconstrained : dict, optional
        Unconstrained values of the continuous latent sites (stacked over time for sites in a
        scan): each site is conditioned on its value mapped onto its support.
    params : dict, optional
        Values of ``param`` sites (instead of native params).
    enumerated : frozenset of str
        Discrete latent sites to mark for parallel enumeration.
    exclude : frozenset of str
        Conditioned sites whose own log density is left out (a closed-form KL adds it).
    jacobian : bool
        Add the log-Jacobian of each conditioned site's bijection as a native factor.
    unroll : bool, optional
        Run ``bdl.scan`` as a loop under the backend's ``markov``, step t naming its sites
        ``{name}_{t}`` (default: only where the backend has no compiled scan).
    """

    def __init__(
        self,
        backend,
        *,
        sites: dict | None = None,
        unconstrained: dict | None = None,
        params: dict | None = None,
        enumerated: frozenset = frozenset(),
        exclude: frozenset = frozenset(),
        jacobian: bool = True,
        unroll: bool | None = None,
    ):
        super().__init__(backend)
        self.sites = sites or {}
        self.unconstrained = unconstrained or {}
        self.params = params
        self.enumerated = enumerated
        self.exclude = exclude
        self.jacobian = jacobian
        self.unroll = (not backend.native.compiled_scan) if unroll is None else unroll
        self._suffix = ""
        self._step_values: dict | None = None
        self._in_scan = False

    def run(self, msg: Message) -> None:
        backend = self.backend
        name = msg.name + self._suffix
        if msg.type == "sample":
            self._sample(msg, name)
        elif msg.type == "param":
            if self.params is not None and msg.name in self.params:
                value = self.params[msg.name]
            else:
                init = backend.asarray(msg.fn)
                value = backend.native.param(name, init, msg.kwargs["constraint"])
            msg.value = backend.model_value(value, False)
        elif msg.type == "deterministic":
            msg.value = backend.native.deterministic(name, msg.value)
        elif msg.type == "factor":
            backend.native.factor(name, msg.value)

    def _sample(self, msg: Message, name: str) -> None:
        backend = self.backend
        native = backend.distribution(msg.fn)
        batch_shape, event_ndims = self._shape(msg, native)
        u = self._given(msg.name)
        if u is None:
            native = backend.expand(native, batch_shape, event_ndims)
            obs = msg.obs
            if obs is not None:
                obs = backend.observed_value(
                    msg.fn, obs if backend.is_array(obs) else backend.asarray(obs)
                )
            enumerate_site = obs is None and msg.name in self.enumerated
            msg.value = backend.model_value(
                backend.native.sample(name, native, obs, enumerate_site), False
            )
            return
        transform = backend.biject_to(native.support)
        value = u if transform is None else transform(u)
        msg.value = backend.model_value(value, False)
        if self.jacobian and transform is not None:
            log_det = transform.log_abs_det_jacobian(u, value)
            # One term per plate element: a factor inside plates must have the plates' shape.
            keep = len(plate_batch_shape(msg))
            if len(log_det.shape) > keep:
                log_det = backend.math.sum(log_det, axis=tuple(range(keep, len(log_det.shape))))
            backend.native.factor(f"{name}_log_jacobian", log_det)
        if msg.name not in self.exclude:
            backend.native.sample(
                name, backend.expand(native, batch_shape, event_ndims), value, False
            )

    def _given(self, name: str):
        if self._step_values is not None:
            return self._step_values.get(name)
        return self.unconstrained.get(name)

    def _step_shape(self, name: str) -> SiteShape | None:
        record = self.sites.get(name)
        if record is None or record.shape is None:
            return None
        return record.extra.get("step_shape", record.shape)

    def _shape(self, msg: Message, native) -> tuple[tuple[int, ...], int]:
        """The native batch shape to expand to and the number of dims made events."""
        recorded = self._step_shape(msg.name)
        if recorded is None:
            shape = site_shape(msg, native)
            return shape.batch + shape.extra, len(shape.extra)
        target = plate_batch_shape(msg) + recorded.extra
        dist_batch = tuple(native.batch_shape)
        try:
            full = tuple(np.broadcast_shapes(dist_batch, target))
        except ValueError:
            full = None
        if full is None or full[len(full) - len(target) :] != target:
            raise ModelError(
                f"site {msg.name!r}: the distribution's batch shape {dist_batch} does not fit the "
                f"site's shape {target} with enumerated discrete sites on its left. A value that "
                "depends on an enumerated site should only index or broadcast against it (e.g. "
                "locs[z]); put discrete latents in plates or a bdl.scan rather than in shape=."
            )
        return full, len(recorded.extra)

    @contextmanager
    def plate(self, frame: PlateFrame):
        with self.backend.native.plate(frame.name, frame.size, frame.dim) as indices:
            yield self.backend.model_value(indices, False)

    def scan(self, f, init, xs, length: int, name: str):
        backend = self.backend
        with no_nesting(self._in_scan):
            pass
        inside = {
            site: value
            for site, value in self.unconstrained.items()
            if site in self.sites and self.sites[site].extra.get("scan") == name
        }
        self._in_scan = True
        try:
            if not self.unroll:

                def body(carry, packed):
                    x, self._step_values = packed
                    return f(carry, x)

                xs = tree_to_backend(xs, backend)
                return backend.native.scan(body, init, (xs, inside), length)
            steps = iter(backend.native.markov(range(length)))

            @contextmanager
            def step(t: int):
                next(steps)  # enters step t's markov context (left when the loop ends)
                self._suffix = f"_{t}"
                self._step_values = {site: value[t] for site, value in inside.items()}
                yield

            try:
                return python_loop(backend, f, init, xs, length, step)
            finally:
                steps.close()  # leaves every step's markov context
        finally:
            self._in_scan, self._suffix, self._step_values = False, "", None


def lower_model(bound, backend) -> Callable[[], Any]:
    """``bound`` as a plain native model of ``backend``: a no-argument callable that Pyro's or
    NumPyro's own ``MCMC``, ``SVI`` and ``Predictive`` accept (see
    :meth:`~ppl_bdl.dsl.model.BoundModel.lower`)."""
    sites, discrete = _discrete_trace(bound, backend)

    def native_model():
        with backend.scope():
            return bound.run_with(Lowering(backend, sites=sites, enumerated=discrete))

    native_model.__name__ = f"{bound.name}_{backend.name}"
    native_model.__doc__ = f"{bound.name} lowered to {backend.name} (data bound; no arguments)."
    return native_model


def _discrete_trace(bound, backend) -> tuple[dict | None, frozenset]:
    """A recorded run of the model and its discrete latent sites when it has any (their values
    carry enumeration's dimensions when lowered); (None, empty) otherwise, or when the model
    fails to run: its error then shows where the lowered model is called."""
    with backend.scope():
        run = Evaluator(
            backend, key=backend.random.key(0), missing="uniform", validate=True, record=True
        )
        try:
            bound.run_with(run)
        except (PPLError, IndexError):  # e.g. data read past its end (torch raises)
            return None, frozenset()
    sites = run.sites
    discrete = frozenset(n for n, s in sites.items() if s.kind == "latent" and s.is_discrete)
    return (sites, discrete) if discrete else (None, frozenset())
