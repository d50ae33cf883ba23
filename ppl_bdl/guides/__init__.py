"""Variational guides by name (see :mod:`ppl_bdl.guides.registry`)."""

from . import delta, flow, fullrank, lowrank, meanfield  # noqa: F401 - register the built-ins
from .custom import guide
from .registry import available, get, register

__all__ = ["available", "get", "guide", "register"]
