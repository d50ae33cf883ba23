"""The public ``ppl_bdl.guides`` namespace; it lives in :mod:`ppl_bdl.inference.vi.guides`."""

from ppl_bdl.inference.vi.guides import *  # noqa: F403
from ppl_bdl.inference.vi.guides import __all__  # noqa: F401
