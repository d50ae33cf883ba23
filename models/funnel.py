"""Neal (2003)'s funnel, the standard hard geometry for HMC: ``v ~ N(0, 3²)``,
``x_i | v ~ N(0, e^v)``, written centred (as above) and non-centred by hand
(``x = e^(v/2) x_raw``, ``x_raw ~ N(0, 1)``). Both have no data.

Example
-------
>>> import ppl_bdl as bdl
>>> from ppl_bdl.models.funnel import funnel_centred
>>> prior = bdl.prior_predictive(funnel_centred(dim=3), num_samples=4, backend="numpyro")
>>> prior.draws["x"].shape
(4, 3)
"""

from __future__ import annotations

import ppl_bdl as bdl
from ppl_bdl import dist


@bdl.model
def funnel_centred(dim: int = 9):
    """Neal (2003)'s funnel: v ~ N(0, 3²), x_i | v ~ N(0, e^v)."""
    v = bdl.sample("v", dist.Normal(0.0, 3.0))
    bdl.sample("x", dist.Normal(0.0, bdl.math.exp(v / 2)), shape=(dim,))


@bdl.model
def funnel_noncentred(dim: int = 9):
    """The funnel written non-centred by hand: x = e^(v/2) x_raw, x_raw ~ N(0, 1)."""
    v = bdl.sample("v", dist.Normal(0.0, 3.0))
    x_raw = bdl.sample("x_raw", dist.Normal(0.0, 1.0), shape=(dim,))
    bdl.deterministic("x", bdl.math.exp(v / 2) * x_raw)
