"""Variational guides by name (see :mod:`ppl_bdl.inference.vi.guides.registry`)."""

from ppl_bdl.inference.vi.guides import delta, flow, fullrank, lowrank, meanfield  # noqa: F401 - register the built-ins
from ppl_bdl.inference.vi.guides.amortized import Amortized
from ppl_bdl.inference.vi.guides.custom import guide
from ppl_bdl.inference.vi.guides.registry import available, get, register

__all__ = ["Amortized", "available", "get", "guide", "register"]
