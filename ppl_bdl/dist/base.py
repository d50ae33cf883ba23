"""The neutral distribution spec every ``ppl_bdl.dist`` family derives from.

A spec holds parameters and knows its family's parameter domains; it never computes a density
itself. Each backend turns a spec into its own native distribution (``backend.distribution``).
Parameters are validated when the spec is built: shapes must broadcast, and concrete values (Python
numbers, lists, NumPy arrays) must lie in their domain. Inside a model run the error is raised at the
``sample`` call, so it can name the site.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np

from ..errors import DistributionError
from ..runtime import current_runtime
from . import constraints as C

#: Fast checks of Python-number parameters, by constraint name (hot loops build many specs).
_SCALAR_CHECKS = {
    "real": lambda v: True,
    "positive": lambda v: v > 0,
    "nonnegative": lambda v: v >= 0,
    "unit_interval": lambda v: 0 <= v <= 1,
    "nonnegative_integer": lambda v: v >= 0 and v == int(v),
}


def _concrete(value: Any) -> np.ndarray | None:
    """NumPy view of a Python number, list or NumPy array; None for backend arrays (checked later)."""
    if isinstance(value, bool | int | float | np.number | list | tuple | np.ndarray):
        return np.asarray(value, dtype=float)
    return None


def _shape(value: Any) -> tuple[int, ...]:
    shape = getattr(value, "shape", None)
    if shape is None:
        return np.shape(value)
    return tuple(shape)


class Distribution:
    """Base of the neutral distribution specs.

    Subclasses declare ``arg_constraints`` (parameter name -> constraint), ``support`` and, for
    parameters with an event dimension (a mean vector, a covariance matrix), ``arg_event_dims``.
    """

    arg_constraints: ClassVar[dict[str, C.Constraint]] = {}
    arg_event_dims: ClassVar[dict[str, int]] = {}
    support: ClassVar[C.Constraint] = C.real
    #: Parameters of which exactly one must be given (e.g. probs / logits).
    exclusive: ClassVar[tuple[str, ...]] = ()

    def __init__(self, **params: Any):
        self.params = {k: v for k, v in params.items() if v is not None}
        runtime = current_runtime()
        if runtime is not None and not runtime.validate:
            # A hot loop (NUTS, VI, SG-MCMC steps, replays): the same model already passed a
            # validating run, so the checks would only cost time on every step.
            self._error = None
            return
        self._error: str | None = self._find_error()
        if self._error is not None and runtime is None:
            raise DistributionError(f"{type(self).__name__}: {self._error}")

    @property
    def name(self) -> str:
        return type(self).__name__

    @property
    def is_discrete(self) -> bool:
        return self.support.discrete

    def _find_error(self) -> str | None:
        if self.exclusive:
            given = [k for k in self.exclusive if k in self.params]
            if len(given) != 1:
                return f"give exactly one of {', '.join(self.exclusive)}; got {given or 'none'}."
        shapes = []
        for key, value in self.params.items():
            constraint = self.arg_constraints.get(key)
            if constraint is None:
                continue
            shape = _shape(value)
            event_dim = self.arg_event_dims.get(key, 0)
            if len(shape) < event_dim:
                return (
                    f"parameter {key!r} needs at least {event_dim} dimension(s), got shape {shape}."
                )
            shapes.append((key, shape[: len(shape) - event_dim]))
            error = self._check_value(key, value, constraint)
            if error:
                return error
        try:
            if sum(1 for _, s in shapes if s) > 1:
                np.broadcast_shapes(*[s for _, s in shapes])
        except ValueError:
            listing = ", ".join(f"{k}{s}" for k, s in shapes)
            return (
                f"parameter batch shapes do not broadcast: {listing}. Reshape them so they broadcast "
                "(NumPy rules), or index with the plate's indices."
            )
        return self._check_relations()

    def _check_relations(self) -> str | None:
        """Checks that involve several parameters (e.g. low < high); None when fine."""
        return None

    def _check_value(self, key: str, value: Any, constraint: C.Constraint) -> str | None:
        if type(value) in (float, int):  # the common case (dist.Normal(0.0, 1.0)): no NumPy
            scalar_ok = _SCALAR_CHECKS.get(constraint.name)
            if scalar_ok is not None and math.isfinite(value) and scalar_ok(value):
                return None
        array = _concrete(value)
        if array is None:
            return None
        return describe_violation(key, array, constraint)

    def check_concrete(self, to_numpy) -> str | None:
        """Check parameters that are backend arrays, converted with ``to_numpy`` (validation runs)."""
        for key, value in self.params.items():
            constraint = self.arg_constraints.get(key)
            if constraint is None or _concrete(value) is not None:
                continue
            try:
                array = np.asarray(to_numpy(value), dtype=float)
            except Exception:  # a traced value: nothing concrete to check
                continue
            error = describe_violation(key, array, constraint)
            if error:
                return error
        return None

    def raise_if_invalid(self, site: str) -> None:
        if self._error is not None:
            raise DistributionError(f"site {site!r}: {self.name}: {self._error}")

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={_brief(v)}" for k, v in self.params.items())
        return f"{self.name}({args})"


def describe_violation(key: str, array: np.ndarray, constraint: C.Constraint) -> str | None:
    """A message for the first point of ``array`` outside ``constraint``, or None."""
    with np.errstate(invalid="ignore"):
        finite = np.isfinite(array)
        if constraint.event_dim:
            finite = np.all(
                finite.reshape(finite.shape[: finite.ndim - constraint.event_dim] + (-1,)), -1
            )
        ok = np.asarray(constraint.check(array)) & finite
    if np.all(ok):
        return None
    if ok.ndim == 0:
        seen, where = array, ""
    else:
        first = tuple(int(i) for i in np.argwhere(~ok)[0])
        seen, where = array[first], f" at index {first}"
    seen = np.asarray(seen)
    shown = f"{float(seen):g}" if seen.ndim == 0 else np.array2string(seen, threshold=8)
    return f"parameter {key!r} must be {constraint.description}, got {shown}{where}."


def _brief(value: Any) -> str:
    shape = _shape(value)
    if shape == ():
        try:
            return f"{float(value):g}"
        except Exception:
            return type(value).__name__
    return f"<{type(value).__name__} {shape}>"
