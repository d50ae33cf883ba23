"""What the built-in backends share: the name, precision and device they were made with, and
making themselves the backend of :mod:`ppl_bdl.dsl.math` in a block.

The interface itself is the typed protocol :class:`ppl_bdl.backend_protocol.Backend` (in the core);
this base class only implements the members that need no array library.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import ClassVar

from ppl_bdl.backend_protocol import LoopResult, NativeSettings, Optimizer
from ppl_bdl.backends import get
from ppl_bdl.dsl.effects import use_backend
from ppl_bdl.errors import BackendError

__all__ = [
    "SHARD_MODES",
    "BackendBase",
    "LoopResult",
    "NativeSettings",
    "Optimizer",
    "device_names",
    "parse_device",
]

#: What a fit over several devices splits: the chain axis, or each step's minibatch.
SHARD_MODES = ("chains", "data")


class BackendBase:
    """Base class of the built-in backends. See :mod:`ppl_bdl.backends.numpyro.backend` for a full one."""

    name: ClassVar[str]
    #: The pip extra that installs this backend.
    extra: ClassVar[str]
    vectorized_chains: ClassVar[bool] = False
    #: One device, nothing split: a backend that spreads work over devices overrides these.
    device_count: int = 1
    shard_mode: str = "chains"

    def __init__(self, precision: str = "float32", device: str | None = None):
        self.precision = precision
        self.device = device or "default"

    def place(self, tree, chain_axis: int | None = None, batch_axis: int | None = None):
        """On one device the arrays are where they belong already."""
        return tree

    def process_devices(self, device, shard: str | None = None) -> list[str] | None:
        """This backend spreads work over a device list itself (or refuses one): None."""
        return None

    def traced_vmap(self, fn, example_args: tuple, in_axes=0):
        """``vmap(fn, in_axes)``: compiled with the loop around it where the backend compiles
        (JAX); a backend that traces eagerly (torch) overrides it."""
        return self.vmap(fn, in_axes=in_axes)

    def activate(self) -> AbstractContextManager:
        """Make this backend the target of :mod:`ppl_bdl.dsl.math` in a ``with`` block."""
        return use_backend(self)

    def on(self, device, shard: str | None = None):
        """This backend (same precision) with its arrays on ``device`` (one device, or a list
        of them with ``shard`` saying what is split over them)."""
        return get(self.name, precision=self.precision, device=device, shard=shard)

    def __repr__(self) -> str:
        return f"<ppl_bdl backend {self.name} ({self.precision}, {self.device})>"


def parse_device(device: str, backend: str, available: list[str]) -> tuple[str, int | None]:
    """Split ``"cuda:1"`` into ("cuda", 1); a clear error for anything that is not a device name."""
    if not isinstance(device, str) or not device:
        raise BackendError(
            f"device must be None or a string such as 'cpu', 'cuda' or 'cuda:1', got {device!r}."
        )
    kind, _, index = device.partition(":")
    if index and not index.isdigit():
        raise BackendError(
            f"device {device!r} is not a device name: expected 'kind' or 'kind:index' (e.g. "
            f"'cuda:1'). Devices of the {backend!r} backend here: {available}."
        )
    return kind.lower(), int(index) if index else None


def device_names(device, backend: str) -> list[str]:
    """The device names in a ``device=`` argument: one name (``"cuda:1"``, ``"cuda:*"``), names
    joined by commas (how a backend over several devices names itself), or a list of names."""
    items = device.split(",") if isinstance(device, str) else device
    if (
        not isinstance(items, list | tuple)
        or not items
        or not all(isinstance(d, str) and d.strip() for d in items)
    ):
        raise BackendError(
            f"device must be None, a device name ('cpu', 'cuda:1', 'cuda:*' for every CUDA "
            f"device) or a non-empty list of names (['cuda:0', 'cuda:1']), got {device!r} "
            f"(backend {backend!r})."
        )
    return [d.strip() for d in items]
