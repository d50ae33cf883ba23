"""Placing a compiled loop's inputs on several JAX devices: one ``jax.sharding.Mesh`` with one
axis, ``devices``, and a ``NamedSharding`` per array.

- ``shard="chains"``: arrays with a chain axis (the chain-stacked state, each step's keys and
  minibatch indices) are split along it, one block of chains per device; everything else (the
  data, the step sizes) is replicated. The loop then runs each device's chains on that device
  alone (``shard_map``: :func:`._jax_loop.compile_loop`), with no step waiting on another device.
- ``shard="data"``: each step's minibatch indices are split along their batch axis and
  everything else is replicated; the loop is compiled as on one device and XLA's partitioner
  splits the minibatch's work and inserts the reductions (the potential's sum and its gradient).

A replicated array that comes back (the data, passed to every chunk) is placed once: the
placed copy is kept while the array lives.

Example
-------
>>> import jax, numpy as np
>>> from ppl_bdl.backends.numpyro.shard import Placement
>>> placement = Placement(jax.devices()[:1], "chains")
>>> placed = placement.place({"x": np.zeros((4, 3))}, chain_axis=0, batch_axis=None)
>>> tuple(placed["x"].sharding.spec)
('devices', None)
"""

from __future__ import annotations

import weakref

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ppl_bdl.errors import BackendError

#: The mesh's one axis.
AXIS = "devices"


class Placement:
    """Where a loop's inputs go on ``devices`` when ``shard`` ("chains" or "data") is split."""

    def __init__(self, devices: list, shard: str):
        self.mesh = Mesh(np.array(devices), (AXIS,))
        self.shard = shard
        self.count = len(devices)
        self._replicated = NamedSharding(self.mesh, PartitionSpec())
        #: id(array) -> (a weak reference to it, its replicated copy).
        self._copies: dict[int, tuple] = {}

    def place(self, tree, chain_axis: int | None, batch_axis: int | None):
        """``tree``'s arrays split along the axis the fit splits (``chain_axis`` for "chains",
        ``batch_axis`` for "data"; None: replicated)."""
        axis = chain_axis if self.shard == "chains" else batch_axis
        if axis is None:
            return jax.tree_util.tree_map(self._replicate, tree)
        return jax.tree_util.tree_map(lambda a: self._split(a, axis), tree)

    def _split(self, array, axis: int):
        size = np.shape(array)[axis]
        if size % self.count:
            what = "chains" if self.shard == "chains" else "minibatch points"
            raise BackendError(
                f"{size} {what} cannot be split evenly over {self.count} devices; the driver "
                f"pads chains to a multiple, and shard='data' needs a batch_size divisible by "
                f"{self.count}."
            )
        spec = [None] * np.ndim(array)
        spec[axis] = AXIS
        return jax.device_put(array, NamedSharding(self.mesh, PartitionSpec(*spec)))

    def _replicate(self, array):
        if not isinstance(array, jax.Array):
            return jax.device_put(array, self._replicated)
        if array.sharding == self._replicated:
            return array
        entry = self._copies.get(id(array))
        if entry is not None and entry[0]() is array:
            return entry[1]
        copy = jax.device_put(array, self._replicated)
        key = id(array)
        self._copies[key] = (weakref.ref(array, lambda _: self._copies.pop(key, None)), copy)
        return copy
