"""The public ``ppl_bdl.math`` namespace (``from ppl_bdl import math``); it lives in :mod:`ppl_bdl.dsl.math`."""

from ppl_bdl.dsl.math import *  # noqa: F403
from ppl_bdl.dsl.math import __all__  # noqa: F401
