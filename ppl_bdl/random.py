"""The public ``ppl_bdl.random`` namespace (``from ppl_bdl import random``); it lives in :mod:`ppl_bdl.dsl.random`."""

from ppl_bdl.dsl.random import *  # noqa: F403
from ppl_bdl.dsl.random import __all__  # noqa: F401
