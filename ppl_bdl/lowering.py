"""The runtime that lowers a DSL model to native Pyro / NumPyro calls.

Under :class:`Lowering`, ``bdl.sample`` becomes ``pyro.sample`` (or ``numpyro.sample``) with a native
distribution of the right batch and event shape, ``bdl.plate`` a native plate, and so on, so the
lowered model is a plain native model that the backend's own MCMC, SVI and Predictive accept.
The model's code gets the native values as the backend's ``model_value`` (arrays that mix with
NumPy values on either side of an operator).
"""

from __future__ import annotations

from contextlib import contextmanager

from .runtime import Message, PlateFrame, Runtime
from .sites import site_shape


class Lowering(Runtime):
    """Run primitives as the backend's native primitives."""

    def run(self, msg: Message) -> None:
        be = self.backend
        if msg.type == "sample":
            native = be.distribution(msg.fn)
            shape = site_shape(msg, native)
            native = be.expand(native, shape.batch + shape.extra, len(shape.extra))
            obs = msg.obs
            if obs is not None:
                obs = be.observed_value(msg.fn, obs if be.is_array(obs) else be.asarray(obs))
            msg.value = be.model_value(be.native.sample(msg.name, native, obs), False)
        elif msg.type == "param":
            init = be.asarray(msg.fn)
            value = be.native.param(msg.name, init, msg.kwargs["constraint"])
            msg.value = be.model_value(value, False)
        elif msg.type == "deterministic":
            msg.value = be.native.deterministic(msg.name, msg.value)
        elif msg.type == "factor":
            be.native.factor(msg.name, msg.value)

    @contextmanager
    def plate(self, frame: PlateFrame):
        with self.backend.native.plate(frame.name, frame.size, frame.dim) as indices:
            yield self.backend.model_value(indices, False)
