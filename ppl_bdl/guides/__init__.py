"""Variational guides by name (see :mod:`ppl_bdl.guides.registry`)."""

from . import delta, flow, fullrank, lowrank, meanfield  # noqa: F401 - register the built-ins
from .amortized import Amortized
from .custom import guide
from .registry import available, get, register

__all__ = ["Amortized", "available", "get", "guide", "register"]
