"""Backend-neutral math for models, guides and kernels.

Each function runs on the backend of the model run or inference loop in progress (chosen at fit
time), so the same model code runs on torch and on jax. Operators (``@``, ``+``, ``*``, indexing)
work on backend arrays directly; use these for everything else.

Example
-------
>>> import ppl_bdl as bdl
>>> from ppl_bdl import dist, math as bm
>>> @bdl.model
... def logistic(X, y):
...     w = bdl.sample("w", dist.Normal(0.0, 1.0), shape=(X.shape[1],))
...     with bdl.plate("data", X.shape[0]) as idx:
...         bdl.sample("y", dist.Bernoulli(probs=bm.sigmoid(X[idx] @ w)), obs=y[idx])
"""

from __future__ import annotations

import math as _math
from typing import Any

from ppl_bdl.dsl.effects import current_backend

Array = Any

#: The functions every backend's ``math`` namespace provides.
NAMES = (
    "abs",
    "exp",
    "log",
    "log1p",
    "expm1",
    "sqrt",
    "square",
    "tanh",
    "sigmoid",
    "softplus",
    "relu",
    "gelu",
    "elu",
    "silu",
    "softmax",
    "log_softmax",
    "logsumexp",
    "sum",
    "mean",
    "var",
    "std",
    "max",
    "min",
    "prod",
    "cumsum",
    "matmul",
    "dot",
    "outer",
    "transpose",
    "reshape",
    "concatenate",
    "stack",
    "where",
    "clip",
    "zeros",
    "ones",
    "zeros_like",
    "ones_like",
    "full",
    "arange",
    "eye",
    "diag",
    "tril",
    "cholesky",
    "eigh",
    "triangular_solve",
    "erf",
    "lgamma",
    "digamma",
    "isfinite",
    "sin",
    "cos",
    "pi",
    "maximum",
    "minimum",
    "sign",
    "floor",
    "asarray",
    "expand_dims",
    "squeeze",
    "einsum",
    "norm",
    "logaddexp",
    "conv2d",
    "max_pool2d",
    "avg_pool2d",
    "split",
    "stop_gradient",
)


def _dispatch(name: str, doc: str | None = None):
    def fn(*args, **kwargs):
        return getattr(current_backend().math, name)(*args, **kwargs)

    fn.__name__ = name
    fn.__qualname__ = name
    fn.__doc__ = doc or f"``{name}`` on the active backend (numpy-like signature)."
    return fn


#: The constant π (no backend needed).
pi = _math.pi


abs = _dispatch("abs")  # noqa: A001
exp = _dispatch("exp")
log = _dispatch("log")
log1p = _dispatch("log1p")
expm1 = _dispatch("expm1")
sqrt = _dispatch("sqrt")
square = _dispatch("square")
tanh = _dispatch("tanh")
sigmoid = _dispatch("sigmoid")
softplus = _dispatch("softplus")
relu = _dispatch("relu")
gelu = _dispatch("gelu")
elu = _dispatch("elu")
silu = _dispatch("silu")
softmax = _dispatch("softmax")
log_softmax = _dispatch("log_softmax")
logsumexp = _dispatch("logsumexp")
logaddexp = _dispatch("logaddexp")
sum = _dispatch("sum")  # noqa: A001
mean = _dispatch("mean")
var = _dispatch("var")
std = _dispatch("std")
max = _dispatch("max")  # noqa: A001
min = _dispatch("min")  # noqa: A001
maximum = _dispatch("maximum")
minimum = _dispatch("minimum")
prod = _dispatch("prod")
cumsum = _dispatch("cumsum")
matmul = _dispatch("matmul")
dot = _dispatch("dot")
outer = _dispatch("outer")
einsum = _dispatch("einsum")
transpose = _dispatch("transpose")
reshape = _dispatch("reshape")
expand_dims = _dispatch("expand_dims")
squeeze = _dispatch("squeeze")
concatenate = _dispatch("concatenate")
split = _dispatch(
    "split",
    "``split(x, sizes, axis=-1)``: the consecutive pieces of ``x`` of the given ``sizes`` along "
    "``axis``, as a list (one op: its gradient is one concatenation, not a sum over pieces).",
)
stack = _dispatch("stack")
where = _dispatch("where")
clip = _dispatch("clip")
zeros = _dispatch("zeros")
ones = _dispatch("ones")
zeros_like = _dispatch("zeros_like")
ones_like = _dispatch("ones_like")
full = _dispatch("full")
arange = _dispatch("arange")
eye = _dispatch("eye")
diag = _dispatch("diag")
tril = _dispatch("tril")
cholesky = _dispatch("cholesky")
eigh = _dispatch("eigh", "The eigenvalues (ascending) and eigenvectors of a symmetric matrix.")
triangular_solve = _dispatch("triangular_solve")
norm = _dispatch("norm")
erf = _dispatch("erf")
lgamma = _dispatch("lgamma")
digamma = _dispatch("digamma")
isfinite = _dispatch("isfinite")
sin = _dispatch("sin")
cos = _dispatch("cos")
sign = _dispatch("sign")
floor = _dispatch("floor")
asarray = _dispatch("asarray")
stop_gradient = _dispatch(
    "stop_gradient",
    "``stop_gradient(x)``: ``x`` as a constant to differentiation (its value unchanged; "
    "``jax.lax.stop_gradient``, torch's ``detach``): a gradient flows through what is computed "
    "from ``x`` but not into ``x``.",
)

# -- convolution and pooling (NCHW inputs, like torch) -------------------------------------------
conv2d = _dispatch(
    "conv2d",
    """``conv2d(x, w, stride=1, padding=0, groups=1, dilation=1)``: the 2-D cross-correlation of
    ``x`` shaped (N, C, H, W) with ``w`` shaped (O, C // groups, kH, kW), as
    ``torch.nn.functional.conv2d`` without bias. ``padding`` (zeros) is an int, a pair (pH, pW) or
    a pair of pairs ((top, bottom), (left, right)); ``stride`` and ``dilation`` an int or a pair.""",
)
max_pool2d = _dispatch(
    "max_pool2d",
    """``max_pool2d(x, kernel_size, stride=None, padding=0)``: the maximum over windows of the last
    two axes of an NCHW array (padding counts as -inf); ``stride`` defaults to ``kernel_size``.""",
)
avg_pool2d = _dispatch(
    "avg_pool2d",
    """``avg_pool2d(x, kernel_size, stride=None, padding=0)``: the mean over windows of the last two
    axes of an NCHW array; padded zeros count in the mean (torch's ``count_include_pad=True``).""",
)

#: The public names: every dispatched function, ``pi`` and ``Array``.
__all__ = [
    "Array",
    "pi",
    *(
        n
        for n, v in list(globals().items())
        if callable(v) and v.__module__ == __name__ and n[0] != "_"
    ),
]
