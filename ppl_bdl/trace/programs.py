"""Compiled programs kept per backend, keyed by what they depend on, so that a second fit of the
same model reuses them.

A fit's loop program (:meth:`~ppl_bdl.backend_protocol.Autodiff.compile_loop`) depends on the
model's code, the data's shapes and dtypes, the values the model reads that are not arrays of
its data (a ``prior_scale=1.0`` argument, a ``bdl.param``'s value), the method's static settings
and the device; the data's values, the seed and the step size are arguments of the compiled
program. :func:`model_key` and the methods' keys name exactly that, so fits that differ only in
what the program takes as arguments (cross-validation folds, seeds, a sweep of step sizes,
an ensemble's members) share one program, and two models whose arrays have the same shapes but
whose code differs never do. Programs are kept in a :class:`ProgramCache` per backend (a bounded
LRU): a process that fits many models keeps the last few compiled, never all of them (each
compiled program holds memory maps of its own, and a process has at most vm.max_map_count).

A model is named by its identity (its :class:`~ppl_bdl.dsl.model.Model` object), as ``jax.jit``
names a function: what its code reads from outside its arguments (a global) is read when the
program is traced. A value :func:`structure_key` cannot name exactly (an object of a class it
does not know, such as a network module with weights that can change) makes the fit's key None:
that fit compiles its own programs, as if nothing were cached.

Example
-------
>>> cache = ProgramCache(maxsize=2)
>>> cache.get("a", lambda: 1), cache.get("a", lambda: 2), len(cache)
(1, 1, 1)
>>> structure_key({"prior_scale": 1.0}) == structure_key({"prior_scale": 1.0})
True
>>> structure_key({"prior_scale": 1.0}) == structure_key({"prior_scale": 2.0})
False
"""

from __future__ import annotations

import hashlib
import types
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np

#: Programs kept per backend: each key holds one loop's programs (a few compiled chunk shapes).
DEFAULT_MAXSIZE = 16


class NotKeyable(Exception):
    """A value whose effect on a compiled program :func:`structure_key` cannot name exactly."""


class ProgramCache:
    """A least-recently-used map of at most ``maxsize`` compiled programs (or the objects that
    hold them), by structural key.

    Example
    -------
    >>> cache = ProgramCache(maxsize=1)
    >>> cache.get("a", lambda: "first"), cache.get("b", lambda: "second"), "a" in cache
    ('first', 'second', False)
    """

    def __init__(self, maxsize: int = DEFAULT_MAXSIZE):
        self.maxsize = maxsize
        self._entries: OrderedDict = OrderedDict()
        #: Lookups answered from the cache and built anew (for tests and benchmarks).
        self.hits = self.misses = 0

    def get(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """The entry of ``key``, built with ``build()`` (and the oldest entry dropped past
        ``maxsize``) when there is none."""
        if key in self._entries:
            self.hits += 1
            self._entries.move_to_end(key)
            return self._entries[key]
        self.misses += 1
        value = build()
        self._entries[key] = value
        while len(self._entries) > self.maxsize:
            self._entries.popitem(last=False)
        return value

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Drop every program (JAX frees a program once nothing holds its function)."""
        self._entries.clear()


#: One cache per backend instance (the registry makes one per name, precision and device).
_CACHES: dict[int, tuple[Any, ProgramCache]] = {}


def clear_programs() -> None:
    """Drop every backend's compiled programs (what a test that stands in for a backend's
    ``compile_loop`` needs: a cached program would not call it)."""
    for _, cache in _CACHES.values():
        cache.clear()


def programs(backend) -> ProgramCache:
    """The program cache of ``backend``.

    >>> import ppl_bdl as bdl
    >>> programs(bdl.backends.get("numpyro")) is programs(bdl.backends.get("numpyro"))
    True
    """
    held = _CACHES.get(id(backend))
    if held is None or held[0] is not backend:
        held = _CACHES[id(backend)] = (backend, ProgramCache())
    return held[1]


class _Same:
    """A key part equal only to itself (a function, a class, a model): held, so its id is never
    reused while the key lives."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any):
        self.obj = obj

    def __hash__(self) -> int:
        return id(self.obj)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.obj is self.obj

    def __repr__(self) -> str:
        return f"<same {self.obj!r}>"


def same(obj: Any) -> _Same:
    """A key part equal to another only where both name the very same object."""
    return _Same(obj)


_PLAIN = (type(None), bool, int, str, bytes, type(Ellipsis))


def structure_key(value: Any) -> Hashable:
    """A hashable key equal for two values exactly when a traced program would bake the same
    constants from them: plain values by type and value (floats by their exact bits), NumPy
    arrays and scalars by dtype, shape and contents, containers item by item, functions and
    classes by identity.

    Raises :class:`NotKeyable` for any other object.

    >>> structure_key((1, 0.5)) == structure_key((1, 0.5)), structure_key(0.0) == structure_key(-0.0)
    (True, False)
    """
    if isinstance(value, _PLAIN):
        return (type(value), value)
    if isinstance(value, float | complex):
        return (type(value), repr(value))
    if isinstance(value, np.ndarray | np.generic):
        return array_value_key(value)
    if isinstance(value, tuple | list):
        return (type(value), tuple(structure_key(v) for v in value))
    if isinstance(value, dict):
        return (dict, tuple((structure_key(k), structure_key(v)) for k, v in value.items()))
    if isinstance(value, types.FunctionType | types.BuiltinFunctionType | type):
        return same(value)
    raise NotKeyable(f"no exact key for a {type(value).__name__}")


def array_value_key(value: Any) -> tuple:
    """An array by its dtype, shape and contents (a digest of its bytes): for arrays a
    program bakes in as constants."""
    array = np.ascontiguousarray(np.asarray(value))
    digest = hashlib.blake2b(array.tobytes(), digest_size=20).hexdigest()
    return ("array", array.dtype.str, array.shape, digest)


def shapes_key(arrays: list) -> tuple:
    """Arrays a program takes as arguments, by shape and dtype only."""
    return tuple((tuple(a.shape), str(a.dtype)) for a in arrays)


def keyed(build_key: Callable[[], Hashable]) -> Hashable | None:
    """``build_key()``, or None where a part of it has no exact key (nothing is cached)."""
    try:
        return build_key()
    except NotKeyable:
        return None


def cached_transition(backend, key: Hashable | None, build: Callable[[], Any]):
    """The transition of ``key`` from ``backend``'s program cache (``build()`` with its key set,
    the first time); ``build()`` itself where ``key`` is None."""
    if key is None:
        return build()
    return programs(backend).get(key, lambda: build()._replace(key=key))
