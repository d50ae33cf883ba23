"""Site shapes: how ``plate`` and ``shape=`` decide a site's batch and event dimensions.

The rule, shared by the lowering and the core's own evaluator:

- the plates a site sits in make its leading batch shape, the outermost plate rightmost (Pyro's
  convention: the first plate owns dim -1);
- ``shape=`` (or, outside any plate, the distribution's own batch shape) becomes event dimensions,
  so ``sample("w", Normal(0, 1), shape=(3,))`` is one 3-vector event, never three batch draws;
- the distribution's parameters must broadcast to ``plate shape + shape``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ppl_bdl.dsl.effects import Message
from ppl_bdl.errors import ModelError


@dataclass(frozen=True)
class SiteShape:
    """``batch`` are plate dims; ``extra`` are the dims made events by ``shape=``; ``event`` is the
    distribution's own event shape. A value of the site has shape ``batch + extra + event``."""

    batch: tuple[int, ...]
    extra: tuple[int, ...]
    event: tuple[int, ...]

    @property
    def value(self) -> tuple[int, ...]:
        return self.batch + self.extra + self.event

    @property
    def event_ndims(self) -> int:
        return len(self.extra) + len(self.event)


def plate_batch_shape(msg: Message) -> tuple[int, ...]:
    if not msg.plates:
        return ()
    ndim = max(-f.dim for f in msg.plates)
    shape = [1] * ndim
    for frame in msg.plates:
        shape[ndim + frame.dim] = frame.batch_size or frame.size
    return tuple(shape)


def site_shape(msg: Message, native) -> SiteShape:
    """Work out the shape of ``msg``'s site given its native distribution."""
    dist_batch = tuple(native.batch_shape)
    event = tuple(native.event_shape)
    batch = plate_batch_shape(msg)
    if msg.shape is not None:
        extra = tuple(msg.shape)
    elif batch:
        extra = ()
    else:
        extra = dist_batch
    target = batch + extra
    try:
        ok = np.broadcast_shapes(dist_batch, target) == target
    except ValueError:
        ok = False
    if not ok:
        plates = ", ".join(f"{f.name}({f.batch_size or f.size})" for f in msg.plates) or "none"
        raise ModelError(
            f"site {msg.name!r}: the distribution's batch shape {dist_batch} does not fit the site "
            f"shape {target} (plates: {plates}; shape={msg.shape}). Inside a plate, parameters should "
            "have the plate's size on the right (index data with the plate's indices); pass shape= for "
            "extra dimensions."
        )
    return SiteShape(batch=batch, extra=extra, event=event)
