"""Containers: :class:`Sequential`, :class:`Residual` and the :class:`MLP` shorthand.

A container names its layers by path (``cnn.conv.weight``) and passes its prior to the layers that
have none of their own.

Example
-------
>>> from ppl_bdl import nn, dist
>>> net = nn.Sequential("cnn", [
...     nn.Conv2d("conv", 1, 6, kernel_size=3, padding=1), "relu", nn.MaxPool2d(2),
...     nn.Flatten(), nn.Dense("fc", 96, 3),
... ], prior=dist.Normal(0.0, 1.0))
>>> net.sites()
{'cnn.conv.weight': (6, 1, 3, 3), 'cnn.conv.bias': (6,), 'cnn.fc.weight': (96, 3), 'cnn.fc.bias': (3,)}
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ppl_bdl.dsl.nn.dropout import Dropout, check_rate
from ppl_bdl.dsl.nn.layers import Dense
from ppl_bdl.dsl.nn.module import (
    Module,
    as_module,
    check_layer_prior,
    check_name,
    resolve_activation,
    shape_of,
)
from ppl_bdl.dsl.nn.priors import Prior, scale_and_prior
from ppl_bdl.errors import ModelError


def _children(items: Sequence, where: str) -> list[Module]:
    if isinstance(items, Module | str) or not isinstance(items, Sequence):
        raise ModelError(f"{where}: layers must be a list of layers, got {type(items).__name__}.")
    children = [as_module(item, where) for item in items]
    seen: set[str] = set()
    for i, child in enumerate(children):
        if child.has_params and child.name is None:
            raise ModelError(
                f"{where}: layer {i} ({child!r}) has weights but no name; give it a name, which "
                "becomes part of its site names."
            )
        if child.name is not None:
            if child.name in seen:
                raise ModelError(
                    f"{where}: two layers are named {child.name!r}; names must be unique in a "
                    "container (they name the sample sites)."
                )
            seen.add(child.name)
    return children


def _child_path(path: str, child: Module, i: int) -> str:
    return f"{path}.{child.name}" if child.name is not None else f"{path}[{i}]"


class Sequential(Module):
    """Layers applied in order. ``layers`` holds layers, activation names (``"relu"``) and
    functions of :mod:`ppl_bdl.dsl.math`; a layer's sites are named ``{name}.{layer name}.{param}``.
    ``prior`` is the default of the layers without a prior of their own.

    Example
    -------
    >>> from ppl_bdl import nn
    >>> net = nn.Sequential("net", [nn.Dense("hidden", 4, 8), "tanh", nn.Dense("out", 8, 1)],
    ...                     prior=nn.he_normal())
    >>> list(net.sites())
    ['net.hidden.weight', 'net.hidden.bias', 'net.out.weight', 'net.out.bias']
    """

    has_params = True

    def __init__(self, name: str, layers: Sequence, prior: Prior | None = None):
        where = f"Sequential({name!r})"
        self.name = check_name(name, "Sequential")
        self.layers = _children(layers, where)
        self.prior = check_layer_prior(prior, where)

    def _sites(self, path, prior):
        prior = self._own_prior(prior)
        sites = []
        for i, child in enumerate(self.layers):
            sites += child._sites(_child_path(path, child, i), prior)
        return sites

    def _forward(self, values, x, path):
        for i, child in enumerate(self.layers):
            x = child._forward(values, x, _child_path(path, child, i))
        return x

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {len(self.layers)} layers)"


class Residual(Module):
    """A block with a skip path: ``activation(body(x) + shortcut(x))``.

    ``body`` is a list of layers (as in :class:`Sequential`, named directly under the block:
    ``block.conv1.weight``); ``shortcut`` is a layer, or None for the identity; ``activation``
    (a name or function, or None) is applied after the sum. The two paths must give the same shape:
    when the body changes it (a stride, more channels), give a shortcut that matches, such as a
    1x1 :class:`~ppl_bdl.dsl.nn.Conv2d` with the same stride (He et al., *Deep Residual Learning for
    Image Recognition*, 2016, Eq. 2).

    Example
    -------
    >>> from ppl_bdl import nn
    >>> block = nn.Residual("block", [
    ...     nn.Conv2d("conv1", 16, 32, 3, stride=2, padding=1), "relu",
    ...     nn.Conv2d("conv2", 32, 32, 3, padding=1),
    ... ], shortcut=nn.Conv2d("shortcut", 16, 32, 1, stride=2), activation="relu")
    >>> list(block.sites())[-2:]
    ['block.shortcut.weight', 'block.shortcut.bias']
    """

    has_params = True

    def __init__(
        self,
        name: str,
        body: Sequence,
        shortcut: Module | None = None,
        activation: str | Callable | None = None,
        prior: Prior | None = None,
    ):
        where = f"Residual({name!r})"
        self.name = check_name(name, "Residual")
        self.body = _children(body, where)
        if shortcut is not None:
            if not isinstance(shortcut, Module):
                raise ModelError(
                    f"{where}: shortcut must be a layer or None, got {type(shortcut).__name__}."
                )
            _children([*self.body, shortcut], where)  # its name must differ from the body's
        self.shortcut = shortcut
        self.activation = None if activation is None else resolve_activation(activation, where)
        self.prior = check_layer_prior(prior, where)

    def _shortcut_path(self, path: str) -> str:
        return _child_path(path, self.shortcut, len(self.body))

    def _sites(self, path, prior):
        prior = self._own_prior(prior)
        sites = []
        for i, child in enumerate(self.body):
            sites += child._sites(_child_path(path, child, i), prior)
        if self.shortcut is not None:
            sites += self.shortcut._sites(self._shortcut_path(path), prior)
        return sites

    def _forward(self, values, x, path):
        h = x
        for i, child in enumerate(self.body):
            h = child._forward(values, h, _child_path(path, child, i))
        skip = x
        if self.shortcut is not None:
            skip = self.shortcut._forward(values, x, self._shortcut_path(path))
        if shape_of(h) != shape_of(skip):
            raise ModelError(
                f"{self.describe(path)}: the body gives shape {shape_of(h)} but the skip path gives "
                f"{shape_of(skip)}. Give a shortcut layer that maps the input {shape_of(x)} to "
                f"{shape_of(h)} (e.g. a 1x1 nn.Conv2d with the body's stride and channels)."
            )
        out = h + skip
        return out if self.activation is None else self.activation(out)

    def __repr__(self) -> str:
        return f"Residual({self.name!r}, {len(self.body)} layers)"


class MLP(Sequential):
    """A multilayer perceptron of :class:`~ppl_bdl.dsl.nn.Dense` layers named ``{name}.{i}``.

    ``sizes`` lists the widths, inputs first: ``MLP("net", [8, 50, 1])`` maps (batch, 8) to
    (batch, 1) with weight sites ``net.0.weight`` (8, 50), ``net.0.bias``, ``net.1.weight``, ...
    ``activation`` is a name ("relu", "tanh", "gelu", ...) or a ``ppl_bdl.dsl.math`` function; the last
    layer is linear. ``prior`` (or ``prior_scale``) applies to every layer.

    ``p`` (None: no dropout) puts a :class:`~ppl_bdl.dsl.nn.Dropout` of rate ``p`` on every
    hidden layer's output, after its activation: before every Dense layer but the first (the
    inputs are not dropped; a ``Sequential`` starting with ``nn.Dropout`` drops them too, as
    Gal & Ghahramani 2016 do before every weight layer). The layers are the identity except
    under ``method="mc_dropout"``; ``p=0`` puts them in all the same (the identity even there),
    so a sweep over p runs one model. The Dropout layers have no weights and no names (paths
    ``net[2]``, ``net[5]``, ...): the weight sites are those of the MLP without them.

    Example
    -------
    >>> from ppl_bdl import nn, dist
    >>> net = nn.MLP("net", [8, 50, 1], activation="tanh", prior=dist.Normal(0.0, 1.0))
    >>> net.sites()
    {'net.0.weight': (8, 50), 'net.0.bias': (50,), 'net.1.weight': (50, 1), 'net.1.bias': (1,)}
    """

    def __init__(
        self,
        name: str,
        sizes: Sequence[int],
        activation: str | Callable = "relu",
        prior: Prior | None = None,
        prior_scale: float | None = None,
        p: float | None = None,
    ):
        where = f"MLP({name!r})"
        rate = None if p is None else check_rate(p, where)
        if isinstance(sizes, str) or not isinstance(sizes, Sequence) or len(sizes) < 2:
            raise ModelError(f"{where}: sizes needs at least [in, out], got {sizes!r}.")
        fn = resolve_activation(activation, where)
        layers: list = []
        for i in range(len(sizes) - 1):
            if i:
                layers.append(fn)
                if rate is not None:
                    layers.append(Dropout(rate))
            layers.append(Dense(str(i), sizes[i], sizes[i + 1]))
        super().__init__(name, layers, prior=scale_and_prior(prior, prior_scale, where))
