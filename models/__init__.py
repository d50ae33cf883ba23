"""Models written in the DSL: the posteriordb reference posteriors, regression, BNNs, image
classifiers (LeNet-5, ResNet-20, the 784-400-400-10 MLP; :mod:`ppl_bdl.models.vision`), a
Gaussian mixture and an HMM with discrete latents summed out (:mod:`~ppl_bdl.models.mixture`,
:mod:`~ppl_bdl.models.hmm`) and time series written with ``bdl.scan``
(:mod:`~ppl_bdl.models.timeseries`: AR(K), stochastic volatility).

Installed as ``ppl_bdl.models``. :func:`examples` gives every model bound to small data, which is
what the conformance suite runs on every backend (the image classifiers are left out: they are too
large for NUTS; tests/test_nn_models.py fits them).

Example
-------
>>> from ppl_bdl import models
>>> sorted(models.examples())[:3]
['arK', 'ar_k', 'bnn_classification']
"""

from __future__ import annotations

from typing import Any

from ppl_bdl.models import bnn, hmm, images, mixture, posteriordb, regression, timeseries, vision

__all__ = [
    "bnn",
    "examples",
    "hmm",
    "images",
    "mixture",
    "posteriordb",
    "regression",
    "timeseries",
    "vision",
]


def examples() -> dict[str, Any]:
    """Every model in this package bound to small data: name -> bound model."""
    out: dict[str, Any] = {}
    for module in (posteriordb, regression, bnn, mixture, hmm, timeseries):
        out.update(module.examples())
    return out
