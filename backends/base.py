"""What the built-in backends share: the name, precision and device they were made with, and
making themselves the backend of :mod:`ppl_bdl.math` in a block.

The interface itself is the typed protocol :class:`ppl_bdl.backend_protocol.Backend` (in the core);
this base class only implements the members that need no array library.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import ClassVar

from ..backend_protocol import LoopResult, NativeSettings, Optimizer
from ..errors import BackendError
from ..runtime import use_backend
from . import get

__all__ = ["BackendBase", "LoopResult", "NativeSettings", "Optimizer", "parse_device"]


class BackendBase:
    """Base class of the built-in backends. See :mod:`ppl_bdl.backends.numpyro` for a full one."""

    name: ClassVar[str]
    #: The pip extra that installs this backend.
    extra: ClassVar[str]
    vectorized_chains: ClassVar[bool] = False

    def __init__(self, precision: str = "float32", device: str | None = None):
        self.precision = precision
        self.device = device or "default"

    def activate(self) -> AbstractContextManager:
        """Make this backend the target of :mod:`ppl_bdl.math` in a ``with`` block."""
        return use_backend(self)

    def on(self, device: str | None):
        """This backend (same precision) with its arrays on ``device``."""
        return get(self.name, precision=self.precision, device=device)

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
