"""Convolution and pooling on NCHW arrays: :class:`Conv2d`, :class:`MaxPool2d`,
:class:`AvgPool2d`, :class:`GlobalAvgPool2d`.

Images are laid out (batch, channels, height, width), as in torch; a kernel is (out_channels,
in_channels // groups, kernel_height, kernel_width). Convert channels-last data with
``X.transpose(0, 3, 1, 2)`` before binding it.

Example
-------
>>> from ppl_bdl import nn
>>> nn.Conv2d("conv", 1, 6, kernel_size=3, padding=1).sites()
{'conv.weight': (6, 1, 3, 3), 'conv.bias': (6,)}
"""

from __future__ import annotations

import numbers

from ppl_bdl.dsl import math as bm
from ppl_bdl.dsl.nn import probe
from ppl_bdl.dsl.nn.module import (
    Module,
    Site,
    check_layer_prior,
    check_name,
    check_positive_int,
    shape_of,
)
from ppl_bdl.dsl.nn.priors import Prior, resolve_prior
from ppl_bdl.errors import ModelError

Pair = tuple[int, int]


def _pair(value: object, label: str, where: str, minimum: int = 1) -> Pair:
    items = (value, value) if isinstance(value, numbers.Integral) else value
    if (
        not isinstance(items, tuple | list)
        or len(items) != 2
        or any(
            isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < minimum for v in items
        )
    ):
        raise ModelError(
            f"{where}: {label} must be an int >= {minimum} or a pair of them, got {value!r}."
        )
    return int(items[0]), int(items[1])


def _padding(value: object, kernel: Pair, dilation: Pair, stride: Pair, where: str):
    """((top, bottom), (left, right)) from an int, a pair, a pair of pairs, "valid" or "same"."""
    if value == "valid":
        return ((0, 0), (0, 0))
    if value == "same":
        if stride != (1, 1):
            raise ModelError(f"{where}: padding='same' needs stride 1, got stride={stride}.")
        out = []
        for k, d in zip(kernel, dilation, strict=True):
            total = d * (k - 1)  # the extra row/column goes after, as in torch
            out.append((total // 2, total - total // 2))
        return tuple(out)
    if (
        isinstance(value, tuple | list)
        and len(value) == 2
        and all(isinstance(v, tuple | list) for v in value)
    ):
        return tuple(_pair(tuple(v), "padding", where, minimum=0) for v in value)
    ph, pw = _pair(value, "padding", where, minimum=0)
    return ((ph, ph), (pw, pw))


def _check_image(layer: Module, x, path: str, channels: int | None) -> tuple[int, ...]:
    seen = shape_of(x)
    if len(seen) != 4 or (channels is not None and seen[1] != channels):
        wanted = f"{channels} channels" if channels is not None else "channels"
        raise ModelError(
            f"{layer.describe(path)} expects NCHW input (batch, {wanted}, height, width), got shape "
            f"{seen}. Images are channels-first: transpose channels-last data with "
            "X.transpose(0, 3, 1, 2)."
        )
    return seen


def _check_window(layer: Module, seen, padding, span: Pair, path: str) -> None:
    for axis, (size, (lo, hi), k) in enumerate(zip(seen[2:], padding, span, strict=True)):
        if size + lo + hi < k:
            raise ModelError(
                f"{layer.describe(path)}: the input of shape {seen} is too small on axis "
                f"{axis + 2} ({size} + padding {lo + hi} < window {k})."
            )


class Conv2d(Module):
    """A 2-D convolution (cross-correlation, as torch) of NCHW images, plus a bias per channel.

    Sites ``{path}.weight`` shaped (out_channels, in_channels // groups, kH, kW) and
    ``{path}.bias`` shaped (out_channels,). ``padding`` is an int, a pair, a pair of pairs
    ((top, bottom), (left, right)), ``"valid"`` (0) or ``"same"`` (stride 1). ``prior`` and
    ``bias_prior`` as in :class:`~ppl_bdl.dsl.nn.Dense`; fan-in is ``in_channels // groups · kH · kW``.

    Example
    -------
    >>> from ppl_bdl import nn
    >>> conv = nn.Conv2d("conv", 4, 8, kernel_size=3, stride=2, padding=1, groups=2, bias=False)
    >>> conv.sites()
    {'conv.weight': (8, 2, 3, 3)}
    """

    has_params = True

    def __init__(
        self,
        name: str,
        in_channels: int,
        out_channels: int,
        kernel_size: int | Pair,
        stride: int | Pair = 1,
        padding: int | Pair | str | tuple[Pair, Pair] = 0,
        groups: int = 1,
        dilation: int | Pair = 1,
        bias: bool = True,
        prior: Prior | None = None,
        bias_prior: Prior | None = None,
    ):
        where = f"Conv2d({name!r})"
        self.name = check_name(name, "Conv2d")
        self.in_channels = check_positive_int(in_channels, "in_channels", where)
        self.out_channels = check_positive_int(out_channels, "out_channels", where)
        self.groups = check_positive_int(groups, "groups", where)
        if in_channels % groups or out_channels % groups:
            raise ModelError(
                f"{where}: in_channels ({in_channels}) and out_channels ({out_channels}) must both "
                f"be divisible by groups ({groups})."
            )
        self.kernel_size = _pair(kernel_size, "kernel_size", where)
        self.stride = _pair(stride, "stride", where)
        self.dilation = _pair(dilation, "dilation", where)
        self.padding = _padding(padding, self.kernel_size, self.dilation, self.stride, where)
        self.bias = bool(bias)
        self.prior = check_layer_prior(prior, where)
        self.bias_prior = check_layer_prior(bias_prior, where)

    @property
    def weight_shape(self) -> tuple[int, int, int, int]:
        return (self.out_channels, self.in_channels // self.groups, *self.kernel_size)

    def _fans(self) -> tuple[int, int]:
        receptive = self.kernel_size[0] * self.kernel_size[1]
        return (self.in_channels // self.groups) * receptive, self.out_channels * receptive

    def _sites(self, path, prior):
        prior = self._own_prior(prior)
        bias_prior = self.bias_prior if self.bias_prior is not None else prior
        fans, where = self._fans(), self.describe(path)
        sites = [Site(f"{path}.weight", self.weight_shape, resolve_prior(prior, *fans, where))]
        if self.bias:
            sites.append(
                Site(f"{path}.bias", (self.out_channels,), resolve_prior(bias_prior, *fans, where))
            )
        return sites

    def _forward(self, values, x, path):
        seen = _check_image(self, x, path, self.in_channels)
        span = tuple(d * (k - 1) + 1 for k, d in zip(self.kernel_size, self.dilation, strict=True))
        _check_window(self, seen, self.padding, span, path)
        w = self._take(values, f"{path}.weight", self.weight_shape, path)
        out = bm.conv2d(x, w, self.stride, self.padding, self.groups, self.dilation)
        if self.bias:
            b = self._take(values, f"{path}.bias", (self.out_channels,), path)
            out = out + bm.reshape(b, (self.out_channels, 1, 1))
        return probe.visit(self, path, x, out)  # recorded by hessian="kron" (nn/probe.py)

    def __repr__(self) -> str:
        return (
            f"Conv2d({self.name!r}, {self.in_channels}, {self.out_channels}, "
            f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
            f"groups={self.groups})"
        )


class _Pool2d(Module):
    _op = staticmethod(lambda x, k, s, p: x)  # pragma: no cover - set by subclasses

    def __init__(self, kernel_size: int | Pair, stride: int | Pair | None = None, padding=0):
        where = type(self).__name__
        self.kernel_size = _pair(kernel_size, "kernel_size", where)
        self.stride = self.kernel_size if stride is None else _pair(stride, "stride", where)
        self.padding = _padding(padding, self.kernel_size, (1, 1), self.stride, where)

    def _forward(self, values, x, path):
        seen = _check_image(self, x, path, None)
        _check_window(self, seen, self.padding, self.kernel_size, path)
        return type(self)._op(x, self.kernel_size, self.stride, self.padding)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(kernel_size={self.kernel_size}, stride={self.stride})"


class MaxPool2d(_Pool2d):
    """The maximum over ``kernel_size`` windows of NCHW images (stride: the window, by default;
    padding counts as -inf). No parameters.

    Example
    -------
    >>> from ppl_bdl import nn
    >>> nn.MaxPool2d(2)
    MaxPool2d(kernel_size=(2, 2), stride=(2, 2))
    """

    _op = staticmethod(lambda x, k, s, p: bm.max_pool2d(x, k, s, p))


class AvgPool2d(_Pool2d):
    """The mean over ``kernel_size`` windows of NCHW images (padded zeros count in the mean, as
    torch's default). No parameters.

    Example
    -------
    >>> from ppl_bdl import nn
    >>> nn.AvgPool2d(2, stride=1)
    AvgPool2d(kernel_size=(2, 2), stride=(1, 1))
    """

    _op = staticmethod(lambda x, k, s, p: bm.avg_pool2d(x, k, s, p))


class GlobalAvgPool2d(Module):
    """The mean over height and width: (N, C, H, W) -> (N, C). No parameters.

    Example
    -------
    >>> from ppl_bdl import nn
    >>> nn.GlobalAvgPool2d()
    GlobalAvgPool2d()
    """

    def _forward(self, values, x, path):
        _check_image(self, x, path, None)
        return bm.mean(x, axis=(2, 3))

    def __repr__(self) -> str:
        return "GlobalAvgPool2d()"
