"""The math namespace of the Pyro backend: :mod:`ppl_bdl.dsl.math` on torch tensors."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F

from ppl_bdl.backends.pyro.values import ModelTensor
from ppl_bdl.dsl.effects import current_runtime

Tensor = torch.Tensor


def _t(x):
    if isinstance(x, Tensor):
        return x
    if isinstance(x, np.ndarray) and x.dtype.kind in "iub":  # indices and masks stay integers
        return torch.as_tensor(x)
    return torch.as_tensor(x, dtype=torch.get_default_dtype())


def _same_dtype(*xs):
    """Integer data promoted to the float dtype of the other operands (torch's matmul, outer and
    einsum refuse mixed dtypes; NumPy and JAX promote)."""
    xs = [_t(x) for x in xs]
    dtype = xs[0].dtype
    for x in xs[1:]:
        dtype = torch.promote_types(dtype, x.dtype)
    return [x if x.dtype == dtype else x.to(dtype) for x in xs]


def _constant(fn):
    """A constructor (zeros, arange, asarray of a constant): inside a model run its new array is
    a model tensor, so NumPy values mix with it as with the model's other values."""

    def make(*args, **kwargs):
        out = fn(*args, **kwargs)
        if (
            type(out) is Tensor
            and current_runtime() is not None
            and all(out is not a for a in args)
        ):
            out.__class__ = ModelTensor
        return out

    return make


def _unary(fn):
    return lambda x: fn(_t(x))


def _reduce(fn):
    def reduce(x, axis=None, keepdims=False):
        x = _t(x)
        if axis is None:
            out = fn(x)
            return out.reshape((1,) * x.ndim) if keepdims else out
        return fn(x, dim=axis, keepdim=keepdims)

    return reduce


def _minmax(fn):
    def reduce(x, axis=None, keepdims=False):
        x = _t(x)
        if axis is None:
            return fn(x)
        return fn(x, dim=axis, keepdim=keepdims).values

    return reduce


def _pair(v) -> tuple[int, int]:
    return (int(v), int(v)) if isinstance(v, int) else (int(v[0]), int(v[1]))


def _padding(p) -> tuple[tuple[int, int], tuple[int, int]]:
    """((top, bottom), (left, right)) from an int, a pair, or a pair of pairs."""
    if isinstance(p, int):
        return ((p, p), (p, p))
    return tuple((int(q), int(q)) if isinstance(q, int) else (int(q[0]), int(q[1])) for q in p)


def _pad(x, padding, value):
    """``x`` padded explicitly, and the symmetric (pH, pW) left for torch to pad."""
    (pt, pb), (pl, pr) = _padding(padding)
    if pt == pb and pl == pr:
        return x, (pt, pl)
    return F.pad(x, (pl, pr, pt, pb), value=value), (0, 0)


def conv2d(x, w, stride=1, padding=0, groups=1, dilation=1):
    x, w = _same_dtype(x, w)
    x, pads = _pad(x, padding, 0.0)
    return F.conv2d(x, w, None, _pair(stride), pads, _pair(dilation), int(groups))


def max_pool2d(x, kernel_size, stride=None, padding=0):
    x = _t(x)
    (pt, pb), (pl, pr) = _padding(padding)
    if (pt, pl) != (pb, pr) or 2 * max(pt, pl) > min(_pair(kernel_size)):
        # torch pads at most half a window, and only symmetrically: pad with -inf ourselves
        x, pads = F.pad(x, (pl, pr, pt, pb), value=-float("inf")), (0, 0)
    else:
        pads = (pt, pl)
    stride = kernel_size if stride is None else stride
    return F.max_pool2d(x, _pair(kernel_size), _pair(stride), pads)


def avg_pool2d(x, kernel_size, stride=None, padding=0):
    x = _t(x)
    (pt, pb), (pl, pr) = _padding(padding)
    if (pt, pl) != (pb, pr) or 2 * max(pt, pl) > min(_pair(kernel_size)):
        x, pads = F.pad(x, (pl, pr, pt, pb), value=0.0), (0, 0)
    else:
        pads = (pt, pl)
    stride = kernel_size if stride is None else stride
    return F.avg_pool2d(x, _pair(kernel_size), _pair(stride), pads, count_include_pad=True)


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
        "sigmoid",
        "relu",
        "erf",
        "lgamma",
        "digamma",
        "isfinite",
        "sin",
        "cos",
        "sign",
        "floor",
    ):
        setattr(m, name, _unary(getattr(torch, name)))
    m.softplus = _unary(torch.nn.functional.softplus)
    m.gelu = _unary(torch.nn.functional.gelu)
    m.elu = _unary(torch.nn.functional.elu)
    m.silu = _unary(torch.nn.functional.silu)
    m.softmax = lambda x, axis=-1: torch.softmax(_t(x), dim=axis)
    m.log_softmax = lambda x, axis=-1: torch.log_softmax(_t(x), dim=axis)
    m.logsumexp = lambda x, axis=None, keepdims=False: (
        torch.logsumexp(_t(x).reshape(-1), 0)
        if axis is None
        else torch.logsumexp(_t(x), axis, keepdims)
    )
    m.logaddexp = lambda a, b: torch.logaddexp(_t(a), _t(b))
    m.sum = _reduce(torch.sum)
    m.mean = _reduce(torch.mean)
    m.prod = _reduce(torch.prod)
    m.var = lambda x, axis=None, keepdims=False, ddof=0: torch.var(
        _t(x), dim=axis, keepdim=keepdims, correction=ddof
    )
    m.std = lambda x, axis=None, keepdims=False, ddof=0: torch.std(
        _t(x), dim=axis, keepdim=keepdims, correction=ddof
    )
    m.max = _minmax(torch.max)
    m.min = _minmax(torch.min)
    m.maximum = lambda a, b: torch.maximum(_t(a), _t(b))
    m.minimum = lambda a, b: torch.minimum(_t(a), _t(b))
    m.cumsum = lambda x, axis=0: torch.cumsum(_t(x), dim=axis)
    m.matmul = lambda a, b: torch.matmul(*_same_dtype(a, b))
    m.dot = m.matmul
    m.outer = lambda a, b: torch.outer(*_same_dtype(a, b))
    m.einsum = lambda subscripts, *operands: torch.einsum(subscripts, *_same_dtype(*operands))
    m.transpose = lambda x, axes=None: x.T if axes is None else x.permute(*axes)
    m.reshape = lambda x, shape: _t(x).reshape(shape)
    m.expand_dims = lambda x, axis: _t(x).unsqueeze(axis)
    m.squeeze = lambda x, axis=None: _t(x).squeeze() if axis is None else _t(x).squeeze(axis)
    m.concatenate = lambda xs, axis=0: torch.cat([_t(x) for x in xs], dim=axis)
    m.split = lambda x, sizes, axis=-1: list(torch.split(_t(x), list(sizes), dim=axis))
    m.stack = lambda xs, axis=0: torch.stack([_t(x) for x in xs], dim=axis)
    m.where = lambda c, a, b: torch.where(_t(c).bool(), _t(a), _t(b))
    m.clip = lambda x, lo=None, hi=None: torch.clamp(_t(x), lo, hi)
    m.zeros = _constant(lambda shape: torch.zeros(shape))
    m.ones = _constant(lambda shape: torch.ones(shape))
    m.full = _constant(
        lambda shape, value: torch.full(
            tuple(np.atleast_1d(shape)) if not isinstance(shape, tuple) else shape, value
        )
    )
    m.zeros_like = torch.zeros_like
    m.ones_like = torch.ones_like
    m.arange = _constant(torch.arange)
    m.eye = _constant(torch.eye)
    m.diag = lambda x: torch.diag(_t(x))
    m.tril = lambda x, k=0: torch.tril(_t(x), k)
    vars(m).update(  # linear algebra
        cholesky=torch.linalg.cholesky,
        eigh=lambda x: tuple(torch.linalg.eigh(_t(x))),
        norm=lambda x, axis=None: torch.linalg.vector_norm(_t(x), dim=axis),
        triangular_solve=lambda a, b, lower=True: torch.linalg.solve_triangular(
            a, b, upper=not lower
        ),
    )
    m.asarray = _constant(_t)
    m.stop_gradient = lambda x: _t(x).detach()
    m.conv2d = conv2d
    m.max_pool2d = max_pool2d
    m.avg_pool2d = avg_pool2d
    return m
