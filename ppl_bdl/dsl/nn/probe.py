"""Layer probes: the inputs of ``nn.Dense`` and ``nn.Conv2d`` layers, and a shift of their
pre-activations, for curvature methods that read a network layer by layer.

The Kronecker-factored Laplace approximation (``bdl.Laplace(hessian="kron")``; Martens & Grosse
2015) needs, for each layer, its input activations and the derivative of the likelihood's outputs
with respect to the layer's pre-activation s = x W + b. Inside ``with LayerProbe() as probe``
every Dense and Conv2d layer that runs is recorded (``probe.calls``: its path, the layer, its
input, its output's shape, in the order they ran); with ``shift=fn`` each layer's output is
``s + fn(i, shape)`` for the i-th call, so that differentiating with respect to the shift (at 0)
differentiates with respect to the pre-activation. Outside a probe a layer is unchanged.

Example
-------
>>> import numpy as np
>>> from ppl_bdl import nn
>>> from ppl_bdl.dsl.nn.probe import LayerProbe
>>> layer = nn.Dense("fc", 2, 3)
>>> values = {"fc.weight": np.ones((2, 3)), "fc.bias": np.zeros(3)}
>>> with LayerProbe(shift=lambda i, shape: np.full(shape, 10.0)) as probe:
...     out = layer.apply(values, np.ones((4, 2)))
>>> [(c.path, c.out_shape) for c in probe.calls], out[0].tolist()
([('fc', (4, 3))], [12.0, 12.0, 12.0])
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ppl_bdl.dsl.nn.module import shape_of

#: The probes open now, innermost last.
_ACTIVE: list[LayerProbe] = []


@dataclass
class LayerCall:
    """One run of a layer: its ``path``, the ``layer``, its input ``x`` and its output's
    shape."""

    path: str
    layer: Any
    x: Any
    out_shape: tuple[int, ...]


class LayerProbe:
    """Records the Dense and Conv2d layers that run inside it, and adds ``shift(i, shape)`` to
    the i-th one's output (pre-activation) when ``shift`` is given."""

    def __init__(self, shift: Callable[[int, tuple[int, ...]], Any] | None = None):
        self.shift = shift
        self.calls: list[LayerCall] = []

    def __enter__(self) -> LayerProbe:
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _ACTIVE.remove(self)

    def visit(self, layer, path: str, x, out):
        shape = shape_of(out)
        self.calls.append(LayerCall(path, layer, x, shape))
        if self.shift is None:
            return out
        return out + self.shift(len(self.calls) - 1, shape)


def visit(layer, path: str, x, out):
    """A layer's output ``out`` (its pre-activation) for input ``x``, recorded by (and
    shifted by) the innermost open probe; ``out`` itself outside every probe."""
    return _ACTIVE[-1].visit(layer, path, x, out) if _ACTIVE else out
