"""The Laplace approximation (``method="laplace"``): :class:`Laplace`."""

from ppl_bdl.inference.laplace.method import Laplace

__all__ = ["Laplace"]
