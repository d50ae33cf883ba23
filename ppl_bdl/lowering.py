"""The runtime that lowers a DSL model to native Pyro / NumPyro calls.

Under :class:`Lowering`, ``bdl.sample`` becomes ``pyro.sample`` (or ``numpyro.sample``) with a native
distribution of the right batch and event shape, ``bdl.plate`` a native plate, and so on, so the
lowered model is a plain native model that the backend's own MCMC, SVI and Predictive accept.
"""

from __future__ import annotations

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
            obs = None if msg.obs is None else be.observed_value(msg.fn, msg.obs)
            msg.value = be.native.sample(msg.name, native, obs)
        elif msg.type == "param":
            init = be.asarray(msg.fn)
            msg.value = be.native.param(msg.name, init, msg.kwargs["constraint"])
        elif msg.type == "deterministic":
            msg.value = be.native.deterministic(msg.name, msg.value)
        elif msg.type == "factor":
            be.native.factor(msg.name, msg.value)

    def plate(self, frame: PlateFrame):
        return self.backend.native.plate(frame.name, frame.size, frame.dim)
