"""The data a model is bound to: normalised on the host at bind time, converted once per backend,
and split into its arrays and a template so compiled functions take the arrays as arguments.

Example
-------
>>> import numpy as np
>>> from ppl_bdl.dsl.bound_data import fill_data, split_arrays
>>> arrays = []
>>> template = split_arrays(((np.zeros(2),), {"k": 3}), lambda v: isinstance(v, np.ndarray), arrays)
>>> fill_data(template, arrays)
((array([0., 0.]),), {'k': 3})
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ppl_bdl.errors import DataError


def foreign_library(value: Any) -> str | None:
    """The library of an array that is not a NumPy array (e.g. 'torch', 'jax'), else None.

    Read off the value's type, without importing anything: used to keep arrays of an array
    library as they are at bind time and to name the library in errors."""
    if isinstance(value, np.ndarray | np.generic):
        return None
    if not (hasattr(value, "shape") and hasattr(value, "dtype")):
        return None
    # The most basic class that is not ``object`` names the library (jax's ArrayImpl lives in
    # jaxlib but derives from jax.Array).
    bases = [c for c in type(value).__mro__ if c is not object]
    root = bases[-1].__module__.split(".", 1)[0]
    return None if root in ("numpy", "builtins") else root


def fill_data(template: Any, arrays: list) -> tuple[tuple, dict]:
    """``(args, kwargs)`` from a template of :func:`split_arrays` (:meth:`ppl_bdl.dsl.model.BoundModel.data_arrays`) and its arrays."""
    return _fill(template, iter(arrays))


class _Slot:
    """Where an array was taken out of the data (see :meth:`ppl_bdl.dsl.model.BoundModel.data_arrays`)."""


def split_arrays(value: Any, is_array, arrays: list) -> Any:
    if is_array(value):
        arrays.append(value)
        return _Slot
    if isinstance(value, tuple | list):
        return type(value)(split_arrays(v, is_array, arrays) for v in value)
    if isinstance(value, dict):
        return {k: split_arrays(v, is_array, arrays) for k, v in value.items()}
    return value


def map_arrays(value: Any, is_array, fn) -> Any:
    """``value`` (args and kwargs of a model) with ``fn`` applied to each array in it."""
    if is_array(value):
        return fn(value)
    if isinstance(value, tuple | list):
        return type(value)(map_arrays(v, is_array, fn) for v in value)
    if isinstance(value, dict):
        return {k: map_arrays(v, is_array, fn) for k, v in value.items()}
    return value


def _fill(template: Any, arrays) -> Any:
    if template is _Slot:
        return next(arrays)
    if isinstance(template, tuple | list):
        return type(template)(_fill(v, arrays) for v in template)
    if isinstance(template, dict):
        return {k: _fill(v, arrays) for k, v in template.items()}
    return template


def to_host(value: Any, where: str) -> Any:
    """Normalise user data at bind time: pandas and lists become NumPy; backend arrays are kept."""
    if value is None or isinstance(value, str | bool | int | float | np.ndarray | np.generic):
        return value
    if hasattr(value, "to_numpy") and callable(value.to_numpy):  # pandas Series / DataFrame
        return np.asarray(value.to_numpy())
    if foreign_library(value) is not None:  # an array library's array: kept as it is
        return value
    if isinstance(value, list | tuple):
        try:
            return np.asarray(value)
        except ValueError as e:
            raise DataError(f"{where}: a ragged list cannot become an array ({e}).") from None
    if isinstance(value, dict):
        return {k: to_host(v, f"{where}[{k!r}]") for k, v in value.items()}
    return value


def to_backend(value: Any, backend, where: str) -> Any:
    if isinstance(value, dict):
        return {k: to_backend(v, backend, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, np.ndarray) or backend.is_array(value):
        return backend.asarray(value)
    library = foreign_library(value)
    if library is not None:
        raise DataError(
            f"{where} is a {library} array but the model runs on the {backend.name!r} backend. "
            "Bind NumPy arrays (they are converted once to the backend chosen at fit time), or "
            "convert it with np.asarray(...)."
        )
    return value
