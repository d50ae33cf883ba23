"""The math namespace of the NumPyro backend: :mod:`ppl_bdl.dsl.math` on JAX arrays."""

from __future__ import annotations

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def _pair(v) -> tuple[int, int]:
    return (int(v), int(v)) if isinstance(v, int) else (int(v[0]), int(v[1]))


def _padding(p) -> tuple[tuple[int, int], tuple[int, int]]:
    """((top, bottom), (left, right)) from an int, a pair, or a pair of pairs."""
    if isinstance(p, int):
        return ((p, p), (p, p))
    return tuple((int(q), int(q)) if isinstance(q, int) else (int(q[0]), int(q[1])) for q in p)


def conv2d(x, w, stride=1, padding=0, groups=1, dilation=1):
    return lax.conv_general_dilated(
        x,
        w,
        window_strides=_pair(stride),
        padding=_padding(padding),
        rhs_dilation=_pair(dilation),
        dimension_numbers=("NCHW", "OIHW", "NCHW"),
        feature_group_count=int(groups),
    )


def _pool(x, init, op, kernel_size, stride, padding):
    kh, kw = _pair(kernel_size)
    sh, sw = _pair(kernel_size if stride is None else stride)
    (pt, pb), (pl, pr) = _padding(padding)
    pads = ((0, 0),) * (x.ndim - 2) + ((pt, pb), (pl, pr))
    window = (1,) * (x.ndim - 2) + (kh, kw)
    strides = (1,) * (x.ndim - 2) + (sh, sw)
    return lax.reduce_window(x, init, op, window, strides, pads)


def max_pool2d(x, kernel_size, stride=None, padding=0):
    return _pool(x, -jnp.inf, lax.max, kernel_size, stride, padding)


def avg_pool2d(x, kernel_size, stride=None, padding=0):
    kh, kw = _pair(kernel_size)
    return _pool(x, 0.0, lax.add, kernel_size, stride, padding) / (kh * kw)


def make_math() -> SimpleNamespace:
    m = SimpleNamespace()
    for name in (
        "abs",
        "exp",
        "log",
        "log1p",
        "expm1",
        "sqrt",
        "square",
        "tanh",
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
        "einsum",
        "transpose",
        "reshape",
        "expand_dims",
        "squeeze",
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
        "isfinite",
        "sin",
        "cos",
        "maximum",
        "minimum",
        "sign",
        "floor",
        "asarray",
        "logaddexp",
    ):
        setattr(m, name, getattr(jnp, name))
    m.split = lambda x, sizes, axis=-1: jnp.split(x, np.cumsum(sizes)[:-1].tolist(), axis=axis)
    m.sigmoid = jax.nn.sigmoid
    m.softplus = jax.nn.softplus
    m.relu = jax.nn.relu
    # the exact GELU, x·Φ(x), as torch's default (jax.nn.gelu defaults to the tanh approximation)
    m.gelu = lambda x: jax.nn.gelu(x, approximate=False)
    m.elu = jax.nn.elu
    m.silu = jax.nn.silu
    m.softmax = jax.nn.softmax
    m.log_softmax = jax.nn.log_softmax
    m.logsumexp = jax.scipy.special.logsumexp
    m.erf = jax.scipy.special.erf
    m.lgamma = jax.scipy.special.gammaln
    m.digamma = jax.scipy.special.digamma
    m.cholesky = jnp.linalg.cholesky
    m.eigh = jnp.linalg.eigh
    m.norm = jnp.linalg.norm
    m.triangular_solve = lambda a, b, lower=True: jax.scipy.linalg.solve_triangular(
        a, b, lower=lower
    )
    m.stop_gradient = jax.lax.stop_gradient
    m.conv2d = conv2d
    m.max_pool2d = max_pool2d
    m.avg_pool2d = avg_pool2d
    return m
