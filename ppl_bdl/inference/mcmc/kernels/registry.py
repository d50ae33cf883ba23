"""The kernel registry: NUTS and HMC (native: the sampler runs the model's full density) and the SG-MCMC kernels, by name.

A registered SG-MCMC kernel is a factory (as in BlackJAX): called with the minibatch
``value_and_grad(position, minibatch) -> (Ũ, ∇Ũ)`` (supplied by the driver) and its settings, it
returns a :class:`~ppl_bdl.inference.mcmc.kernels.base.Kernel`, a pair of pure functions ``init(position) ->
state`` and ``step(rng_key, state, minibatch, step_size) -> (state, info)`` written with
:mod:`ppl_bdl.dsl.math` and :mod:`ppl_bdl.dsl.random`, so it runs on every backend.

Example
-------
>>> import ppl_bdl as bdl
>>> "nuts" in bdl.kernels.available()
True
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ppl_bdl.errors import ConfigError, one_of


@dataclass(frozen=True)
class KernelEntry:
    """A registry entry. ``kind`` is "native" (NUTS or HMC, on the full density) or "sgmcmc";
    ``cyclical``: an SG-MCMC kernel that runs on the cyclical schedule with an exploration stage
    (its factory takes ``exploration``, β; the driver keeps draws in sampling stages only);
    ``blocks``: ``fit``'s loop gives the kernel its position as a tuple of per-site blocks
    (written with :mod:`ppl_bdl.inference.mcmc.blocks`), else as one flat vector;
    ``pilot_margin``: ``step_size="auto"`` takes the largest step its pilot found stable times
    this (:mod:`~ppl_bdl.inference.mcmc.step_size`)."""

    name: str
    kind: str
    factory: Callable[..., Any] | None = None
    doc: str = ""
    cyclical: bool = False
    blocks: bool = False
    pilot_margin: float = 0.1


_REGISTRY: dict[str, KernelEntry] = {}


def register(
    name: str,
    *,
    kind: str = "sgmcmc",
    cyclical: bool = False,
    blocks: bool = False,
    pilot_margin: float = 0.1,
    overwrite: bool = False,
):
    """Decorator: register an SG-MCMC kernel factory under ``name`` so ``fit(method=name)`` runs it.

    ``cyclical=True``: the kernel runs on the cyclical step-size schedule with an exploration
    stage (cSGLD, cSGHMC); its factory must take ``exploration``. ``blocks=True``: the kernel
    is written with :mod:`ppl_bdl.inference.mcmc.blocks` (which treats a tuple of arrays and one array alike),
    and ``fit``'s loop gives it its position as a tuple of per-site blocks, each in its site's
    unconstrained shape, on a backend that fuses elementwise work (``fuses_elementwise``: JAX): the model reads the sites and returns their gradients without a copy
    between a flat vector and the sites each step. Without it (the default) the position is
    one flat vector. ``pilot_margin``: ``step_size="auto"`` uses the largest step size its
    pilot found stable times this (0.1; smaller for a kernel whose adaptive preconditioner keeps
    a too-large step from blowing up, so that the pilot cannot see it).

    Example
    -------
    >>> import ppl_bdl as bdl
    >>> from ppl_bdl import math as bm, random as br
    >>> from ppl_bdl.inference.mcmc.kernels import Kernel
    >>> @bdl.kernels.register("my_sgld", overwrite=True)
    ... def my_sgld(value_and_grad, temperature=1.0):
    ...     def init(position):
    ...         return {"position": position}
    ...     def step(key, state, minibatch, step_size):
    ...         u, g = value_and_grad(state["position"], minibatch)
    ...         noise = br.normal(key, state["position"].shape)
    ...         pos = state["position"] - step_size * g + bm.sqrt(2 * step_size * temperature) * noise
    ...         return {"position": pos}, {"step_size": step_size, "potential": u}
    ...     return Kernel(init, step)
    >>> "my_sgld" in bdl.kernels.available()
    True
    """
    if not isinstance(name, str) or not name:
        raise ConfigError(f"kernel name must be a non-empty string, got {name!r}.")
    if kind not in ("native", "sgmcmc"):
        raise ConfigError(f"kernel kind must be 'native' or 'sgmcmc', got {kind!r}.")
    if not isinstance(blocks, bool):
        raise ConfigError(f"blocks must be True or False, got {blocks!r}.")
    number = isinstance(pilot_margin, int | float) and not isinstance(pilot_margin, bool)
    if not (number and 0 < pilot_margin <= 1):
        raise ConfigError(f"pilot_margin must be a number in (0, 1], got {pilot_margin!r}.")

    def decorator(factory):
        if cyclical and "exploration" not in inspect.signature(factory).parameters:
            raise ConfigError(
                f"kernel {name!r} is registered as cyclical but its factory takes no "
                "'exploration' setting (β, the fraction of each cycle that explores)."
            )
        if name in _REGISTRY and not overwrite:
            raise ConfigError(
                f"a kernel named {name!r} is already registered; pick another name or pass "
                "overwrite=True."
            )
        doc = (factory.__doc__ or "").strip()
        _REGISTRY[name] = KernelEntry(
            name, kind, factory, doc, cyclical, blocks, float(pilot_margin)
        )
        return factory

    return decorator


def available() -> list[str]:
    """The names ``fit(method=...)`` accepts for sampling (``"vi"`` is separate)."""
    return sorted(_REGISTRY)


def get(name: str) -> KernelEntry:
    """The kernel registered as ``name``; a ``ConfigError`` lists the methods otherwise."""
    if name not in _REGISTRY:
        raise one_of("method", name, [*_REGISTRY, "vi", "cavi", "ensemble"])
    return _REGISTRY[name]


def _native(name: str, doc: str):
    def factory(**settings):
        return settings

    factory.__doc__ = doc
    register(name, kind="native")(factory)


_native("nuts", "The No-U-Turn Sampler of the backend (NumPyro's NUTS or Pyro's NUTS).")
_native("hmc", "Hamiltonian Monte Carlo of the backend, with a fixed number of leapfrog steps.")
