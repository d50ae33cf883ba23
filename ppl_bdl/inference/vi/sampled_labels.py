"""The labels of a sampled-label Fisher (``optimizer="vogn", curvature="fisher"``,
:mod:`ppl_bdl.inference.vi.natural`): each point's gradient taken at observed values drawn from
the model at θ instead of its data (Martens 2014; Kunstner et al. 2019).

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import dist
>>> from ppl_bdl.inference.common import prepare
>>> from ppl_bdl.inference.vi.sampled_labels import SampledLabels
>>> from ppl_bdl.trace.layout import ModelDensity
>>> @bdl.model
... def pairs(y):
...     mu = bdl.sample("mu", dist.Normal(0.0, 1.0))
...     with bdl.plate("data", y.shape[0]):
...         bdl.sample("y", dist.Normal(mu, 1.0), obs=y, shape=(2,))
>>> setup = prepare(pairs(np.zeros((5, 2))), "numpyro", "float32", 0)
>>> backend = setup.backend
>>> labels = SampledLabels.of(ModelDensity(setup.bound, backend, setup.layout), setup.trace, "data")
>>> labels.axes  # y's values are (points, 2): the plate indexes axis -2
{'y': -2}
>>> with backend.activate():
...     drawn = labels.density.simulate(backend.asarray([0.0]), backend.random.key(0))
...     tuple(drawn["y"].shape), tuple(labels.point(drawn, backend.asarray(3), backend.math)["y"].shape)
((5, 2), (1, 2))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SampledLabels:
    """Curvature "fisher": the model's density (a :class:`~ppl_bdl.trace.layout.ModelDensity`: its
    ``simulate`` draws the observed sites at θ on a batch, its ``potential`` reads them in place
    of the data), and for each observed site the axis of its value that the data plate indexes
    (None: the site is outside the plate)."""

    density: Any
    axes: dict

    @classmethod
    def of(cls, density, trace, plate: str) -> SampledLabels:
        axes = {}
        for name, site in trace.of_kind("observed").items():
            frame = next((f for f in site.plates if f.name == plate), None)
            axes[name] = None if frame is None else frame.dim - site.shape.event_ndims
        return cls(density, axes)

    def point(self, labels: dict, position, m) -> dict:
        """The labels of the batch's point at ``position`` (a plate of size 1 kept)."""
        out = {}
        for name, value in labels.items():
            axis = self.axes.get(name)
            if axis is None:
                out[name] = value
            else:
                at = (Ellipsis, m.reshape(position, (1,))) + (slice(None),) * (-axis - 1)
                out[name] = value[at]
        return out
