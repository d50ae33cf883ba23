"""Neutral specs of the common bijections, for :class:`~ppl_bdl.dsl.dist.TransformedDistribution`.

Each is a name, its parameters and how it changes shapes; the backend builds its own transform
of the same name (NumPyro's ``numpyro.distributions.transforms``, torch's and Pyro's
``torch.distributions.transforms``), which computes the values and the log-Jacobians.

Example
-------
>>> from ppl_bdl.dsl.dist import transforms as T
>>> T.StickBreakingTransform().forward_shape((4,))
(5,)
>>> T.AffineTransform(1.0, 2.0)
AffineTransform(loc=1, scale=2)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ppl_bdl.dsl.dist import constraints as C


@dataclass(frozen=True)
class Transform:
    """A bijection: ``name`` (the backends' class), ``params``, the event dims of one input
    (``domain_event_dim``) and the constraint its values satisfy (``codomain``)."""

    name: str
    codomain: C.Constraint
    domain_event_dim: int = 0
    params: dict[str, Any] = field(default_factory=dict)

    def forward_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of the values of an input of ``shape``."""
        return tuple(shape)

    def __repr__(self) -> str:
        args = ", ".join(
            f"{k}={v:g}" if isinstance(v, float | int) else k for k, v in self.params.items()
        )
        return f"{self.name}({args})"


def _last(shape: tuple[int, ...], name: str) -> int:
    if not shape:
        raise ValueError(f"{name} needs a vector input (at least one dimension), got shape ().")
    return shape[-1]


class ExpTransform(Transform):
    """x -> exp(x), onto the positive numbers."""

    def __init__(self):
        super().__init__("ExpTransform", C.positive)


class SigmoidTransform(Transform):
    """x -> 1 / (1 + exp(-x)), onto the unit interval."""

    def __init__(self):
        super().__init__("SigmoidTransform", C.unit_interval)


class AffineTransform(Transform):
    """x -> loc + scale x (``loc`` and ``scale`` numbers or arrays that broadcast with x)."""

    def __init__(self, loc: Any, scale: Any):
        super().__init__("AffineTransform", C.real, params={"loc": loc, "scale": scale})


class OrderedTransform(Transform):
    """(x_1, ..., x_K) -> (x_1, x_1 + exp(x_2), ...): onto strictly increasing vectors."""

    def __init__(self):
        super().__init__("OrderedTransform", C.ordered_vector, 1)


class StickBreakingTransform(Transform):
    """R^(K-1) -> the simplex of K entries, by stick-breaking (NumPyro's and torch's)."""

    def __init__(self):
        super().__init__("StickBreakingTransform", C.simplex, 1)

    def forward_shape(self, shape):
        return tuple(shape[:-1]) + (_last(shape, self.name) + 1,)


def _triangle_side(m: int, diagonal: bool, name: str) -> int:
    """n with m = n(n+1)/2 (``diagonal``) or n(n-1)/2 entries."""
    n = int(round((math.sqrt(8 * m + 1) + (-1 if diagonal else 1)) / 2))
    if (n * (n + 1) if diagonal else n * (n - 1)) // 2 != m:
        raise ValueError(f"{name}: a vector of {m} entries does not fill a triangle.")
    return n


class LowerCholeskyTransform(Transform):
    """R^(n(n+1)/2) -> lower-triangular n × n matrices with a positive diagonal (NumPyro's
    layout: the strict lower triangle row by row, then the log of the diagonal)."""

    def __init__(self):
        super().__init__("LowerCholeskyTransform", C.lower_cholesky, 1)

    def forward_shape(self, shape):
        n = _triangle_side(_last(shape, self.name), True, self.name)
        return tuple(shape[:-1]) + (n, n)


class CorrCholeskyTransform(Transform):
    """R^(d(d-1)/2) -> Cholesky factors of d × d correlation matrices (tanh, then the rows'
    stick-breaking; Lewandowski, Kurowicka and Joe 2009)."""

    def __init__(self):
        super().__init__("CorrCholeskyTransform", C.corr_cholesky, 1)

    def forward_shape(self, shape):
        d = _triangle_side(_last(shape, self.name), False, self.name)
        return tuple(shape[:-1]) + (d, d)


__all__ = [
    "AffineTransform",
    "CorrCholeskyTransform",
    "ExpTransform",
    "LowerCholeskyTransform",
    "OrderedTransform",
    "SigmoidTransform",
    "StickBreakingTransform",
    "Transform",
]
