"""The public ``ppl_bdl.kernels`` namespace; it lives in :mod:`ppl_bdl.inference.mcmc.kernels`."""

from ppl_bdl.inference.mcmc.kernels import *  # noqa: F403
from ppl_bdl.inference.mcmc.kernels import __all__  # noqa: F401
