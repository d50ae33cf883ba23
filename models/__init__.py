"""Models written in the DSL: the posteriordb reference posteriors, regression, and BNNs.

Installed as ``ppl_bdl.models``. :func:`examples` gives every model bound to small data, which is
what the conformance suite runs on every backend.

Example
-------
>>> from ppl_bdl import models
>>> sorted(models.examples())[:3]
['arK', 'bnn_classification', 'bnn_regression']
"""

from __future__ import annotations

from typing import Any

from . import bnn, posteriordb, regression

__all__ = ["bnn", "examples", "posteriordb", "regression"]


def examples() -> dict[str, Any]:
    """Every model in this package bound to small data: name -> bound model."""
    out: dict[str, Any] = {}
    for module in (posteriordb, regression, bnn):
        out.update(module.examples())
    return out
