"""The base of every layer: sample sites named by path, a pure forward function, shape checks.

A layer is a description: its name, its hyper-parameters and its prior. It holds no weights.
``layer.sample()`` draws the weight sites (one ``bdl.sample`` per parameter tensor, named by the
layer's path, ``cnn.conv.weight``) and returns the network with those weights as a function of the
input. ``layer.apply(values, x)`` runs it on weights given by site name, with no sampling: the same
code runs on every backend, written with :mod:`ppl_bdl.dsl.math`.

A layer inside a container takes the container's path as a prefix and, when it has no prior of its
own, the container's prior.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ppl_bdl.dsl import math as bm
from ppl_bdl.dsl.dist import Distribution
from ppl_bdl.dsl.nn.priors import Prior, check_prior
from ppl_bdl.dsl.primitives import sample
from ppl_bdl.errors import ModelError

Array = Any

#: The names ``activation=`` accepts, each with its backend-neutral function.
ACTIVATIONS: dict[str, Callable] = {
    "relu": bm.relu,
    "tanh": bm.tanh,
    "gelu": bm.gelu,
    "sigmoid": bm.sigmoid,
    "softplus": bm.softplus,
    "elu": bm.elu,
    "silu": bm.silu,
    "identity": lambda x: x,
}


@dataclass(frozen=True)
class Site:
    """One weight site of a network: its full name, its shape and its prior."""

    name: str
    shape: tuple[int, ...]
    prior: Distribution


class Module:
    """Base of the layers. Subclasses implement ``_sites`` and ``_forward``.

    ``name`` is the layer's own name (None for layers without parameters); ``prior`` its prior, or
    None to take the enclosing container's (N(0, 1) at the top).
    """

    name: str | None = None
    prior: Prior | None = None
    #: Whether the layer has sample sites (a container must then give it a name).
    has_params = False

    # -- to implement ----------------------------------------------------------------------------
    def _sites(self, path: str, prior: Prior | None) -> list[Site]:
        """The layer's sites under ``path``, with ``prior`` inherited from its container."""
        return []

    def _forward(self, values: Mapping[str, Array], x: Array, path: str) -> Array:
        raise NotImplementedError  # pragma: no cover

    # -- public ----------------------------------------------------------------------------------
    @property
    def path(self) -> str:
        """The layer's path when it is the top of a network: its name (or its kind)."""
        return self.name if self.name is not None else type(self).__name__

    def sites(self) -> dict[str, tuple[int, ...]]:
        """Site name -> shape, in sampling order.

        Example
        -------
        >>> from ppl_bdl import nn
        >>> nn.Dense("fc", 3, 2).sites()
        {'fc.weight': (3, 2), 'fc.bias': (2,)}
        """
        return {s.name: s.shape for s in self._sites(self.path, None)}

    def priors(self) -> dict[str, Distribution]:
        """Site name -> prior distribution.

        Example
        -------
        >>> from ppl_bdl import nn
        >>> nn.Dense("fc", 3, 2, prior=0.5).priors()["fc.weight"]
        Normal(loc=0, scale=0.5)
        """
        return {s.name: s.prior for s in self._sites(self.path, None)}

    def num_weights(self) -> int:
        """The number of scalar weights (the sum of the sites' sizes)."""
        return sum(math.prod(shape) for shape in self.sites().values())

    def sample(self) -> SampledNetwork:
        """Sample every weight site; return the network with those weights, as a function of x.

        Call it in a model, outside the data plate (the weights are global), and apply the result
        to the batch inside the plate: ``f = net.sample()`` then ``f(X[idx])``.
        """
        values = {
            s.name: sample(s.name, s.prior, shape=s.shape) for s in self._sites(self.path, None)
        }
        return SampledNetwork(self, values)

    def apply(self, values: Mapping[str, Array], x: Array) -> Array:
        """Run the network on ``x`` with the weights ``values`` (site name -> array); samples
        nothing. Run it where :mod:`ppl_bdl.dsl.math` has a backend (in a model, or under
        ``backend.activate()``).

        Example
        -------
        >>> import numpy as np, ppl_bdl as bdl
        >>> from ppl_bdl import nn
        >>> layer = nn.Dense("fc", 2, 1)
        >>> backend = bdl.backends.get("numpyro")
        >>> with backend.activate():
        ...     y = layer.apply({"fc.weight": np.ones((2, 1)), "fc.bias": np.zeros(1)},
        ...                     backend.asarray([[1.0, 2.0]]))
        >>> y.tolist()
        [[3.0]]
        """
        missing = [s.name for s in self._sites(self.path, None) if s.name not in values]
        if missing:
            raise ModelError(
                f"{self.describe(self.path)}: no value for the site(s) {missing}; give one array "
                f"per site of {list(self.sites())}."
            )
        return self._forward(values, x, self.path)

    def __call__(self, x: Array) -> Array:
        """Sample the weights and apply them to ``x`` (``self.sample()(x)``)."""
        return self.sample()(x)

    # -- helpers for subclasses ------------------------------------------------------------------
    def describe(self, path: str) -> str:
        return f"{type(self).__name__} {path!r}"

    def _own_prior(self, inherited: Prior | None) -> Prior | None:
        return self.prior if self.prior is not None else inherited

    def _take(self, values: Mapping[str, Array], site: str, shape: tuple[int, ...], path: str):
        """The value of ``site``, checked against the shape the layer expects."""
        try:
            value = values[site]
        except KeyError:
            raise ModelError(f"{self.describe(path)}: no value for its site {site!r}.") from None
        seen = tuple(getattr(value, "shape", ()))
        if seen != shape:
            raise ModelError(
                f"{self.describe(path)}: site {site!r} has shape {seen}, the layer expects {shape}."
            )
        return value


class SampledNetwork:
    """A network with its weights drawn: ``f(x)`` applies it (no new sites are sampled).

    ``values`` maps each site name to its array; ``module`` is the network it came from.
    """

    def __init__(self, module: Module, values: dict[str, Array]):
        self.module = module
        self.values = values

    def __call__(self, x: Array) -> Array:
        return self.module._forward(self.values, x, self.module.path)

    def __repr__(self) -> str:
        return f"<SampledNetwork {self.module.path!r}: {len(self.values)} sites>"


class Activation(Module):
    """An elementwise function as a layer: a name (``"relu"``, ``"tanh"``, ``"gelu"``,
    ``"sigmoid"``, ``"softplus"``, ``"elu"``, ``"silu"``, ``"identity"``) or a function of
    :mod:`ppl_bdl.dsl.math`. Containers turn names and functions in their layer list into these.

    Example
    -------
    >>> from ppl_bdl import nn
    >>> nn.Activation("relu")
    Activation('relu')
    """

    def __init__(self, fn: str | Callable):
        self.fn = resolve_activation(fn, "Activation")
        self.label = fn if isinstance(fn, str) else getattr(fn, "__name__", "function")

    def _forward(self, values, x, path):
        return self.fn(x)

    def __repr__(self) -> str:
        return f"Activation({self.label!r})"


def resolve_activation(activation: str | Callable, where: str) -> Callable:
    if isinstance(activation, str):
        if activation not in ACTIVATIONS:
            raise ModelError(
                f"{where}: unknown activation {activation!r}; expected one of "
                f"{sorted(ACTIVATIONS)} or a function from ppl_bdl.dsl.math."
            )
        return ACTIVATIONS[activation]
    if callable(activation):
        return activation
    raise ModelError(
        f"{where}: activation must be a name or a function, got {type(activation).__name__}."
    )


def as_module(item: Module | str | Callable, where: str) -> Module:
    """A container's list entry as a layer: activation names and functions become Activations."""
    if isinstance(item, Module):
        return item
    if isinstance(item, str) or callable(item):
        return Activation(item)
    raise ModelError(
        f"{where}: expected a layer (nn.Dense, nn.Conv2d, ...), an activation name or a function; "
        f"got {type(item).__name__} {item!r}."
    )


def check_name(name: object, where: str) -> str:
    if not isinstance(name, str) or not name:
        raise ModelError(f"{where}: name must be a non-empty string, got {name!r}.")
    return name


def check_positive_int(value: object, label: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ModelError(f"{where}: {label} must be a positive int, got {value!r}.")
    return int(value)


def check_layer_prior(prior: object, where: str) -> Prior | None:
    check_prior(prior, where)
    return prior  # type: ignore[return-value]


def shape_of(x: Array) -> tuple[int, ...]:
    return tuple(int(s) for s in getattr(x, "shape", ()))
