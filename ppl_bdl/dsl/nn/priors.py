"""Priors of Bayesian layers: a scale, a function of the layer's fans, or any distribution.

Every layer takes ``prior=`` (its weights) and ``bias_prior=`` (its biases, default: the same as
``prior``). A prior is one of

- a positive number ``s``: each weight is N(0, s²), weight decay λ = 1/s² in the MAP view;
- a ``ppl_bdl.dsl.dist`` distribution, used as given for every element (``dist.Laplace(0.0, 0.1)``);
- a function ``prior(fan_in, fan_out) -> Distribution`` of the layer's fans, e.g.
  :func:`he_normal` or :func:`glorot_normal`, which scale a Gaussian so the pre-activations keep
  their variance from layer to layer.

The fans are those torch's initialisers use: a Dense layer (in, out) has fan-in ``in`` and fan-out
``out``; a Conv2d kernel (O, C/g, kH, kW) has fan-in ``C/g·kH·kW`` and fan-out ``O·kH·kW``. A bias
takes its layer's fans, so ``he_normal()`` gives the bias the weight's scale.

Example
-------
>>> from ppl_bdl import nn
>>> nn.he_normal()(fan_in=50, fan_out=10)
Normal(loc=0, scale=0.2)
>>> nn.glorot_normal()(fan_in=50, fan_out=50)
Normal(loc=0, scale=0.141421)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Union

from ppl_bdl.dsl.dist import Distribution, Normal
from ppl_bdl.errors import ModelError

#: What ``prior=`` accepts: a scale, a distribution, or a function of (fan_in, fan_out).
Prior = Union[float, Distribution, Callable[[int, int], Distribution]]  # noqa: UP007

#: The prior of a layer given none, here or in a container around it: N(0, 1).
DEFAULT_SCALE = 1.0


class FanScaledNormal:
    """The prior ``N(0, gain² / fan)``, with ``fan`` the fan-in (He) or the mean of the fans
    (Glorot). Build it with :func:`he_normal` or :func:`glorot_normal`."""

    def __init__(self, mode: str, gain: float):
        if mode not in ("fan_in", "fan_avg"):
            raise ModelError(f"FanScaledNormal: mode must be 'fan_in' or 'fan_avg', got {mode!r}.")
        if isinstance(gain, bool) or not isinstance(gain, int | float) or not gain > 0:
            raise ModelError(f"FanScaledNormal: gain must be a positive number, got {gain!r}.")
        self.mode = mode
        self.gain = float(gain)

    def scale(self, fan_in: int, fan_out: int) -> float:
        fan = fan_in if self.mode == "fan_in" else (fan_in + fan_out) / 2.0
        return self.gain / math.sqrt(fan)

    def __call__(self, fan_in: int, fan_out: int) -> Distribution:
        return Normal(0.0, self.scale(fan_in, fan_out))

    def __repr__(self) -> str:
        return f"FanScaledNormal(mode={self.mode!r}, gain={self.gain:g})"


def he_normal(gain: float = math.sqrt(2.0)) -> FanScaledNormal:
    """The He (Kaiming) Gaussian prior ``N(0, gain² / fan_in)``.

    With the default gain √2, Var[w] = 2 / fan_in keeps the variance of ReLU pre-activations
    constant through the layers (He et al., *Delving Deep into Rectifiers*, 2015, Eq. 10);
    ``gain=1`` gives LeCun's 1 / fan_in, for tanh or SELU networks.

    Example
    -------
    >>> from ppl_bdl import nn
    >>> conv = nn.Conv2d("conv", 3, 16, kernel_size=3, prior=nn.he_normal())
    >>> conv.priors()["conv.weight"]        # fan-in 3·3·3 = 27
    Normal(loc=0, scale=0.272166)
    """
    return FanScaledNormal("fan_in", gain)


def glorot_normal(gain: float = 1.0) -> FanScaledNormal:
    """The Glorot (Xavier) Gaussian prior ``N(0, gain² · 2 / (fan_in + fan_out))``
    (Glorot & Bengio, *Understanding the difficulty of training deep feedforward neural networks*,
    2010, Eq. 12, the variance of their normalized initialisation).

    Example
    -------
    >>> from ppl_bdl import nn
    >>> nn.Dense("fc", 30, 10, prior=nn.glorot_normal()).priors()["fc.weight"]
    Normal(loc=0, scale=0.223607)
    """
    return FanScaledNormal("fan_avg", gain)


def check_prior(prior: object, where: str, allow_none: bool = True) -> None:
    """Raise a ModelError unless ``prior`` is a positive number, a distribution or a callable."""
    if prior is None and allow_none:
        return
    if isinstance(prior, Distribution) or (callable(prior) and not isinstance(prior, type)):
        return
    if isinstance(prior, int | float) and not isinstance(prior, bool):
        if math.isfinite(prior) and prior > 0:
            return
        raise ModelError(f"{where}: a prior scale must be a positive finite number, got {prior!r}.")
    raise ModelError(
        f"{where}: prior must be a positive scale, a ppl_bdl.dsl.dist distribution, or a function "
        f"(fan_in, fan_out) -> distribution such as nn.he_normal(); got {type(prior).__name__} "
        f"{prior!r}."
    )


def resolve_prior(prior: Prior | None, fan_in: int, fan_out: int, where: str) -> Distribution:
    """The distribution ``prior`` stands for, for a parameter with these fans."""
    if prior is None:
        prior = DEFAULT_SCALE
    if isinstance(prior, Distribution):
        return prior
    if isinstance(prior, int | float) and not isinstance(prior, bool):
        return Normal(0.0, float(prior))
    result = prior(int(fan_in), int(fan_out))
    if not isinstance(result, Distribution):
        raise ModelError(
            f"{where}: the prior function {prior!r} returned {type(result).__name__}; it must "
            "return a ppl_bdl.dsl.dist distribution."
        )
    return result


def fans_out_in(shape: Sequence[int]) -> tuple[int, int]:
    """(fan_in, fan_out) of a weight laid out (out, in, *kernel), torch's and equinox's layout."""
    shape = tuple(int(s) for s in shape)
    if len(shape) < 2:
        n = math.prod(shape) if shape else 1
        return n, n
    receptive = math.prod(shape[2:])
    return shape[1] * receptive, shape[0] * receptive


def scale_and_prior(prior: Prior | None, prior_scale: float | None, where: str) -> Prior | None:
    """Merge the older ``prior_scale=s`` argument of Dense and MLP into ``prior``."""
    if prior is not None and prior_scale is not None:
        raise ModelError(f"{where}: give prior or prior_scale, not both.")
    chosen = prior_scale if prior is None else prior
    check_prior(chosen, where)
    return chosen
