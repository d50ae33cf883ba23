"""The public ``ppl_bdl.dist`` namespace (``import ppl_bdl.dist as dist``); it lives in :mod:`ppl_bdl.dsl.dist`."""

from ppl_bdl.dsl.dist import *  # noqa: F403
from ppl_bdl.dsl.dist import __all__  # noqa: F401
