"""The public ``ppl_bdl.nn`` namespace (``import ppl_bdl.nn as nn``); it lives in :mod:`ppl_bdl.dsl.nn`."""

from ppl_bdl.dsl.nn import *  # noqa: F403
from ppl_bdl.dsl.nn import __all__  # noqa: F401
