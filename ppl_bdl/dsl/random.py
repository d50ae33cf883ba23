"""Backend-neutral random numbers for kernels and guides.

Keys follow JAX's style on every backend: ``split`` a key before each use. On NumPyro a key is a
``jax.random`` key; on Pyro it is a seeded ``torch.Generator`` (splitting returns it, draws advance
it), so a fixed seed gives the same draws on the same backend.

Example
-------
>>> import ppl_bdl as bdl
>>> from ppl_bdl import random as br
>>> backend = bdl.backends.get("numpyro")
>>> with backend.activate():
...     key = br.key(0)
...     key, sub = br.split(key)
...     noise = br.normal(sub, (3,))
"""

from __future__ import annotations

from typing import Any

from ppl_bdl.dsl.effects import current_backend

__all__ = ["key", "normal", "split", "uniform"]


def key(seed: int) -> Any:
    """A new random key from an integer seed."""
    return current_backend().random.key(seed)


def split(key: Any, num: int = 2) -> tuple:
    """Split a key into ``num`` independent keys."""
    return current_backend().random.split(key, num)


def normal(key: Any, shape: tuple[int, ...], backend: Any = None) -> Any:
    """Standard normal draws of ``shape`` (on ``backend``, default the active one)."""
    return (backend or current_backend()).random.normal(key, shape)


def uniform(key: Any, shape: tuple[int, ...], low: float = 0.0, high: float = 1.0) -> Any:
    """Uniform draws on [low, high)."""
    return current_backend().random.uniform(key, shape, low, high)
