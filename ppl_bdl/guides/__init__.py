"""Variational guides by name (see :mod:`ppl_bdl.guides.registry`)."""

from .registry import available, get, register

__all__ = ["available", "get", "register"]
