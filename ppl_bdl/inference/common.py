"""What every inference method shares, in one import: the setup of a bound model
(:mod:`.setup`), where its chains start (:mod:`.starts`), and turning flat unconstrained draws
into a :class:`~ppl_bdl.posterior.posterior.Posterior` (:mod:`.posterior_from_draws`).

A fit runs its model once with every check on (:func:`ppl_bdl.trace.model_trace.record_model`); the
:class:`Setup` holds that record, and the checks, the layout, the starting points and the guides
read it.
"""

from __future__ import annotations

from ppl_bdl.inference.posterior_from_draws import (
    REPLAY_POINTS,
    LazyLogLikelihood,
    build_posterior,
    pad_rows,
    replay_chunk_size,
    site_dims,
)
from ppl_bdl.inference.setup import Setup, prepare
from ppl_bdl.inference.starts import (
    MEDIAN_DRAWS,
    MEDIAN_JITTER,
    PRIOR_DRAWS,
    initial_positions,
    prior_draws,
)

__all__ = [
    "MEDIAN_DRAWS",
    "MEDIAN_JITTER",
    "PRIOR_DRAWS",
    "REPLAY_POINTS",
    "LazyLogLikelihood",
    "Setup",
    "build_posterior",
    "initial_positions",
    "pad_rows",
    "prepare",
    "prior_draws",
    "replay_chunk_size",
    "site_dims",
]
