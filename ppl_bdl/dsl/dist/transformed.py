"""``TransformedDistribution(base, transforms)``: a distribution pushed through bijections.

The transforms are neutral specs of the common bijections (NumPyro's and torch's names); each
backend lowers them to its own (``numpyro.distributions.transforms``,
``torch.distributions.transforms``), and the density is the base's with the log-Jacobian of the
inverse, computed by the backend.

Example
-------
>>> import numpy as np
>>> from ppl_bdl import dist
>>> from ppl_bdl.dsl.dist import transforms as T
>>> d = dist.TransformedDistribution(dist.Normal(0.0, 1.0), T.ExpTransform())
>>> bool(np.isclose(d.log_prob(np.array(2.0)), dist.LogNormal(0.0, 1.0).log_prob(np.array(2.0))))
True
"""

from __future__ import annotations

from ppl_bdl.dsl.dist import constraints as C
from ppl_bdl.dsl.dist.base import Distribution
from ppl_bdl.dsl.dist.transforms import Transform
from ppl_bdl.errors import DistributionError


class TransformedDistribution(Distribution):
    """``base_distribution`` pushed through ``transforms`` (one, or a list applied in order).

    As in NumPyro, base batch dims a transform needs as event dims (a stick-breaking transform
    of a batch of normals) become event dims; the event shape is then changed by each transform
    (``StickBreakingTransform``: K - 1 -> K; ``CorrCholeskyTransform``: d(d-1)/2 -> (d, d)).

    Example
    -------
    >>> from ppl_bdl import dist
    >>> from ppl_bdl.dsl.dist import transforms as T
    >>> d = dist.TransformedDistribution(
    ...     dist.Normal(0.0, 1.0).expand([2]), T.StickBreakingTransform()
    ... )
    >>> d.batch_shape, d.event_shape
    ((), (3,))
    """

    def __init__(self, base_distribution: Distribution, transforms: Transform | list):
        if not isinstance(base_distribution, Distribution):
            raise DistributionError(
                "TransformedDistribution: base_distribution must be a ppl_bdl.dsl.dist "
                f"distribution, got {type(base_distribution).__name__}."
            )
        transforms = list(transforms) if isinstance(transforms, list | tuple) else [transforms]
        for t in transforms:
            if not isinstance(t, Transform):
                raise DistributionError(
                    "TransformedDistribution: transforms must be ppl_bdl.dsl.dist.transforms "
                    f"objects (ExpTransform(), ...), got {type(t).__name__}."
                )
        self._base, self._transforms = base_distribution, tuple(transforms)
        super().__init__(base_distribution=base_distribution)
        self.params["transforms"] = self._transforms

    @property
    def base_dist(self) -> Distribution:
        return self._base

    @property
    def transforms(self) -> tuple[Transform, ...]:
        return self._transforms

    def _shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(batch shape, event shape) after the transforms."""
        shape = self._base.batch_shape + self._base.event_shape
        event_dim = len(self._base.event_shape)
        for t in self._transforms:
            event_dim = max(event_dim, t.domain_event_dim)
            shape = t.forward_shape(shape)
            event_dim += t.codomain.event_dim - t.domain_event_dim
        cut = len(shape) - event_dim
        return shape[:cut], shape[cut:]

    @property
    def batch_shape(self) -> tuple[int, ...]:
        return self._shapes()[0]

    @property
    def event_shape(self) -> tuple[int, ...]:
        return self._shapes()[1]

    @property
    def support(self) -> C.Constraint:
        last = self._transforms[-1].codomain if self._transforms else self._base.support
        extra = len(self.event_shape) - last.event_dim
        return C.independent(last, extra) if extra > 0 else last

    def _check_relations(self) -> str | None:
        if self._base._error:
            return f"its base {self._base.name}: {self._base._error}"
        try:
            self._shapes()
        except ValueError as error:
            return f"the transforms do not fit the base {self._base!r}: {error}"
        return None

    def __repr__(self) -> str:
        names = ", ".join(repr(t) for t in self._transforms)
        return f"TransformedDistribution({self._base!r}, [{names}])"
