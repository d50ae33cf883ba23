"""Reshaped distributions: NumPyro's ``expand``, ``to_event`` and ``mask`` on every DSL family.

``spec.expand(batch_shape)`` broadcasts a distribution's batch shape to ``batch_shape``;
``spec.to_event(n)`` moves its ``n`` rightmost batch dimensions into the event (one draw then
spans them and its log density is their sum); ``spec.mask(m)`` zeroes the log density where the
boolean array ``m`` is False. Each means what it means in NumPyro, and each backend lowers it to
its native ``.expand``, ``.to_event`` and ``.mask``; the site, the layout, the guides and the
pointwise log-likelihood read the shapes from the lowered distribution, as for any family.

Example
-------
>>> import numpy as np
>>> from ppl_bdl import dist
>>> d = dist.Normal(0.0, 1.0).expand([2, 3]).to_event(1)
>>> d.batch_shape, d.event_shape
((2,), (3,))
>>> dist.Normal(0.0, 1.0).mask(np.array([True, False])).log_prob(np.zeros(2)).round(4)
array([-0.9189,  0.    ])
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ppl_bdl.dsl.dist import constraints as C
from ppl_bdl.dsl.dist.base import Distribution, _shape
from ppl_bdl.errors import DistributionError


def _batch_shape_arg(owner: str, batch_shape: Any) -> tuple[int, ...]:
    """``batch_shape`` as a tuple of ints >= 0 (an int is a 1-d shape)."""
    if isinstance(batch_shape, int | np.integer) and not isinstance(batch_shape, bool):
        batch_shape = (batch_shape,)
    try:
        if isinstance(batch_shape, str):
            raise TypeError
        shape = tuple(batch_shape)
        if not all(isinstance(s, int | np.integer) and not isinstance(s, bool) for s in shape):
            raise TypeError
    except TypeError:
        raise DistributionError(
            f"{owner}.expand: batch_shape must be a tuple of ints, got {batch_shape!r}."
        ) from None
    if any(s < 0 for s in shape):
        raise DistributionError(f"{owner}.expand: batch_shape has a negative size: {shape}.")
    return tuple(int(s) for s in shape)


class _Wrapped(Distribution):
    """A spec built from ``base_dist``: the base's support and parameters, reshaped."""

    def __init__(self, base_dist: Distribution, **extra: Any):
        if not isinstance(base_dist, Distribution):
            raise DistributionError(
                f"{type(self).__name__}: base_dist must be a ppl_bdl.dsl.dist distribution, got "
                f"{type(base_dist).__name__}."
            )
        self._base = base_dist
        super().__init__(base_dist=base_dist)
        self.params.update(extra)  # static settings: kept as given, never converted to arrays

    @property
    def base_dist(self) -> Distribution:
        return self._base

    @property
    def family(self) -> str:
        return self._base.family

    @property
    def support(self) -> C.Constraint:
        return self._base.support

    def support_for(self, to_numpy=None) -> C.Constraint:
        return self._base.support_for(to_numpy)

    @property
    def event_shape(self) -> tuple[int, ...]:
        return self._base.event_shape

    def _check_relations(self) -> str | None:
        base_error = self._base._error
        if base_error:
            return f"its base {self._base.name}: {base_error}"
        return self._check_shapes()

    def _check_shapes(self) -> str | None:
        return None


class ExpandedDistribution(_Wrapped):
    """``base_dist`` with its batch shape broadcast to ``batch_shape`` (``spec.expand``).

    The base's batch shape must broadcast to ``batch_shape`` (NumPy rules: right-aligned, sizes
    equal or 1), as in NumPyro's ``ExpandedDistribution``.

    Example
    -------
    >>> from ppl_bdl import dist
    >>> dist.Normal(0.0, 1.0).expand([3]).batch_shape
    (3,)
    """

    def __init__(self, base_dist: Distribution, batch_shape: tuple[int, ...]):
        self._batch = _batch_shape_arg(getattr(base_dist, "name", "distribution"), batch_shape)
        super().__init__(base_dist, batch_shape=self._batch)

    @property
    def batch_shape(self) -> tuple[int, ...]:
        return self._batch

    def _check_shapes(self) -> str | None:
        base = self._base.batch_shape
        try:
            fits = tuple(np.broadcast_shapes(base, self._batch)) == self._batch
        except ValueError:
            fits = False
        if fits:
            return None
        return (
            f"expand({list(self._batch)}): the batch shape {base} of {self._base!r} does not "
            f"broadcast to {self._batch}. Each of its sizes, right-aligned, must equal the new "
            "size or be 1 (NumPy rules); add dimensions on the left only."
        )

    def expand(self, batch_shape) -> Distribution:
        return ExpandedDistribution(self._base, batch_shape)

    def __repr__(self) -> str:
        return f"{self._base!r}.expand({list(self._batch)})"


class Independent(_Wrapped):
    """``base_dist`` with its ``reinterpreted_batch_ndims`` rightmost batch dims made event dims.

    One draw then spans them and its log density is their sum (``spec.to_event(n)``; NumPyro's
    and Pyro's ``Independent``).

    Example
    -------
    >>> from ppl_bdl import dist
    >>> d = dist.Independent(dist.Normal([0.0, 1.0], 1.0), 1)
    >>> d.batch_shape, d.event_shape
    ((), (2,))
    """

    def __init__(self, base_dist: Distribution, reinterpreted_batch_ndims: int):
        n = reinterpreted_batch_ndims
        if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
            raise DistributionError(
                f"{getattr(base_dist, 'name', 'distribution')}.to_event: the number of batch dims "
                f"to make event dims must be an int >= 0, got {n!r}."
            )
        self._n = int(n)
        super().__init__(base_dist, reinterpreted_batch_ndims=self._n)

    @property
    def _split(self) -> int:
        return max(len(self._base.batch_shape) - self._n, 0)

    @property
    def batch_shape(self) -> tuple[int, ...]:
        return self._base.batch_shape[: self._split]

    @property
    def event_shape(self) -> tuple[int, ...]:
        return self._base.batch_shape[self._split :] + self._base.event_shape

    @property
    def support(self) -> C.Constraint:
        return C.independent(self._base.support, self._n)

    def support_for(self, to_numpy=None) -> C.Constraint:
        return C.independent(self._base.support_for(to_numpy), self._n)

    def _check_shapes(self) -> str | None:
        base = self._base.batch_shape
        if self._n <= len(base):
            return None
        return (
            f"to_event({self._n}) needs at least {self._n} batch dimension(s), but {self._base!r} "
            f"has batch shape {base} ({len(base)} dimension(s)). Expand it first "
            f"(.expand([...]).to_event({self._n})), or pass a smaller n."
        )

    def __repr__(self) -> str:
        return f"{self._base!r}.to_event({self._n})"


def _is_boolean(mask: Any) -> bool:
    if isinstance(mask, bool | np.bool_):
        return True
    dtype = getattr(mask, "dtype", None)
    return dtype is not None and str(dtype).rpartition(".")[2] == "bool"


class MaskedDistribution(_Wrapped):
    """``base_dist`` whose log density is 0 where the boolean ``mask`` is False (``spec.mask``).

    ``mask`` (a bool, or a boolean array of the model's backend or NumPy) broadcasts with the
    base's batch shape, which becomes the broadcast shape, as in NumPyro's
    ``MaskedDistribution``; draws are the base's.

    Example
    -------
    >>> import numpy as np
    >>> from ppl_bdl import dist
    >>> dist.Normal([0.0, 0.0], 1.0).mask(np.array([True, False])).batch_shape
    (2,)
    """

    def __init__(self, base_dist: Distribution, mask: Any):
        if isinstance(mask, list | tuple):
            mask = np.asarray(mask)
        self._mask = mask
        super().__init__(base_dist, mask=mask)

    @property
    def batch_shape(self) -> tuple[int, ...]:
        return tuple(np.broadcast_shapes(_shape(self._mask), self._base.batch_shape))

    def _check_shapes(self) -> str | None:
        mask = self._mask
        if not _is_boolean(mask):
            dtype = getattr(mask, "dtype", type(mask).__name__)
            return (
                f"mask must be a bool or a boolean array, got {dtype}. Compare to build one "
                "(e.g. mask=(counts > 0)), or convert it (m.astype(bool))."
            )
        try:
            np.broadcast_shapes(_shape(mask), self._base.batch_shape)
        except ValueError:
            return (
                f"mask of shape {_shape(mask)} does not broadcast with the batch shape "
                f"{self._base.batch_shape} of {self._base!r}. Give a mask of the batch shape "
                "(or one that broadcasts to it, NumPy rules)."
            )
        return None

    def __repr__(self) -> str:
        shape = _shape(self._mask)
        shown = repr(bool(self._mask)) if shape == () else f"<mask {shape}>"
        return f"{self._base!r}.mask({shown})"
