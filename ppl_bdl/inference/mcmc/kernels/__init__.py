"""Samplers by name: NUTS (the backend's own), HMC (the core's) and stochastic-gradient MCMC kernels.

Example
-------
>>> import ppl_bdl as bdl
>>> bdl.kernels.available()[:2]
['csghmc', 'csgld']
"""

from ppl_bdl.inference.mcmc.kernels import cyclical, psgld, sghmc, sgld  # noqa: F401  (registers the SG-MCMC kernels)
from ppl_bdl.inference.mcmc.kernels.base import Kernel
from ppl_bdl.inference.mcmc.kernels.registry import KernelEntry, available, get, register

__all__ = ["Kernel", "KernelEntry", "available", "get", "register"]
