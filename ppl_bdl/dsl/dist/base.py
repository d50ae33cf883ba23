"""The neutral distribution spec every ``ppl_bdl.dsl.dist`` family derives from.

A spec holds parameters and knows its family's parameter domains, shapes and support; the density
itself is the backend's (``backend.distribution(spec)`` builds the native distribution). Parameters
are validated when the spec is built: shapes must broadcast, and concrete values (Python numbers,
lists, NumPy arrays) must lie in their domain. Inside a model run the error is raised at the
``sample`` call, so it can name the site.

``spec.log_prob(value)`` and ``spec.sample(key, shape)`` work inside a model (on the run's backend,
returning backend arrays, differentiable) and outside one (NumPy in, NumPy out); see
:mod:`ppl_bdl.dsl.dist.native`.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np

from ppl_bdl.dsl.dist import constraints as C
from ppl_bdl.dsl.dist import native
from ppl_bdl.dsl.effects import current_runtime
from ppl_bdl.errors import DistributionError

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

    Subclasses declare ``arg_constraints`` (parameter name -> constraint), ``support`` (the kind of
    support; parameter-dependent bounds come from :meth:`support_for`) and, for parameters with an
    event dimension (a mean vector, a covariance matrix), ``arg_event_dims``.

    Shapes are NumPyro's: ``spec.expand(batch_shape)`` broadcasts the batch shape,
    ``spec.to_event(n)`` makes the ``n`` rightmost batch dims event dims and ``spec.mask(m)``
    zeroes the log density where the boolean ``m`` is False (:mod:`ppl_bdl.dsl.dist.shaped`).
    They compose with ``sample``'s ``shape=``: outside plates a site's batch shape becomes its
    event shape, so ``sample("w", d.expand([3]))`` is one 3-vector, as ``shape=(3,)`` makes it;
    inside a plate the batch shape must broadcast to the plates' shape plus ``shape=``.

    Example
    -------
    >>> from ppl_bdl import dist
    >>> d = dist.Normal(0.0, 1.0).expand([4, 3]).to_event(1)
    >>> d.batch_shape, d.event_shape
    ((4,), (3,))
    """

    arg_constraints: ClassVar[dict[str, C.Constraint]] = {}
    arg_event_dims: ClassVar[dict[str, int]] = {}
    support: ClassVar[C.Constraint] = C.real
    #: Parameters of which exactly one must be given (e.g. probs / logits).
    exclusive: ClassVar[tuple[str, ...]] = ()

    def __init__(self, **params: Any):
        # Lists and tuples of numbers become NumPy arrays (a backend takes arrays, not lists).
        self.params = {
            k: np.asarray(v) if isinstance(v, list | tuple) else v
            for k, v in params.items()
            if v is not None
        }
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
    def family(self) -> str:
        """The family's name; a reshaped spec (``expand``, ``to_event``, ``mask``) keeps its base's."""
        return self.name

    @property
    def is_discrete(self) -> bool:
        return self.support.discrete

    # -- reshaping (NumPyro's expand, to_event, mask; see ppl_bdl.dsl.dist.shaped) ----------------
    def expand(self, batch_shape: tuple[int, ...] | int) -> Distribution:
        """This distribution with its batch shape broadcast to ``batch_shape`` (NumPyro's
        ``expand``): its own batch shape must broadcast to it.

        Example
        -------
        >>> from ppl_bdl import dist
        >>> dist.Normal(0.0, 1.0).expand([2, 3]).batch_shape
        (2, 3)
        """
        from ppl_bdl.dsl.dist.shaped import ExpandedDistribution

        return ExpandedDistribution(self, batch_shape)

    def to_event(self, reinterpreted_batch_ndims: int | None = None) -> Distribution:
        """Make the ``reinterpreted_batch_ndims`` rightmost batch dims event dims (all of them when
        None), as NumPyro's ``to_event``: one draw spans them, its log density is their sum.

        Example
        -------
        >>> from ppl_bdl import dist
        >>> d = dist.Normal(0.0, 1.0).expand([2, 3]).to_event(1)
        >>> d.batch_shape, d.event_shape
        ((2,), (3,))
        """
        from ppl_bdl.dsl.dist.shaped import Independent

        n = reinterpreted_batch_ndims
        if n is None:
            n = len(self.batch_shape)
        return self if n == 0 else Independent(self, n)

    def mask(self, mask: Any) -> Distribution:
        """This distribution with its log density zeroed where the boolean ``mask`` is False
        (NumPyro's ``mask``); ``mask`` broadcasts with the batch shape.

        Example
        -------
        >>> import numpy as np
        >>> from ppl_bdl import dist
        >>> dist.Normal([0.0, 1.0], 1.0).mask(np.array([True, False])).log_prob(np.zeros(2)).round(4)
        array([-0.9189,  0.    ])
        """
        from ppl_bdl.dsl.dist.shaped import MaskedDistribution

        return MaskedDistribution(self, mask)

    # -- shapes ---------------------------------------------------------------------------------
    def _param_batch_shapes(self) -> list[tuple[int, ...]]:
        shapes = []
        for key, value in self.params.items():
            if key in self.arg_constraints:
                shape = _shape(value)
                shapes.append(tuple(shape[: len(shape) - self.arg_event_dims.get(key, 0)]))
        return shapes

    @property
    def batch_shape(self) -> tuple[int, ...]:
        """The shape of independent, non-identical draws, from the parameters' shapes."""
        return tuple(np.broadcast_shapes(*self._param_batch_shapes()))

    @property
    def event_shape(self) -> tuple[int, ...]:
        """The shape of one draw (() for a scalar family)."""
        return ()

    # -- validation -----------------------------------------------------------------------------
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
            if isinstance(value, Distribution):
                error = value.check_concrete(to_numpy)
                if error:
                    return f"{key} ({value.name}): {error}"
                continue
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

    def raise_if_invalid(self, site: str | None = None) -> None:
        if self._error is not None:
            where = f"site {site!r}: " if site else ""
            raise DistributionError(f"{where}{self.name}: {self._error}")

    # -- support --------------------------------------------------------------------------------
    def _numpy_params(self, to_numpy, *keys: str) -> list[np.ndarray] | None:
        """Concrete NumPy values of ``keys`` (None when one is traced, i.e. not concrete)."""
        out = []
        for key in keys:
            value = self.params[key]
            array = _concrete(value)
            if array is None:
                try:
                    array = np.asarray((to_numpy or np.asarray)(value), dtype=float)
                except Exception:
                    return None
            out.append(array)
        return out

    def support_for(self, to_numpy=None) -> C.Constraint:
        """The support with its bounds filled in from the concrete parameters.

        ``to_numpy`` converts parameters that are backend arrays. Families whose support depends on
        their parameters (Binomial, Uniform, ...) override this; where the parameters are not
        concrete (a traced run), the kind-level ``support`` is returned.
        """
        return self.support

    def support_violation(self, value: Any, to_numpy=None) -> str | None:
        """Describe the first point of ``value`` outside the support; None when all are inside.

        Example
        -------
        >>> import numpy as np
        >>> from ppl_bdl import dist
        >>> dist.Bernoulli(probs=0.3).support_violation(np.array([0.0, 1.0, 0.46]))
        'holds 0.46 at index (2,), outside the support of Bernoulli: 0 or 1'
        >>> dist.Poisson(2.0).support_violation(np.array([0, 3])) is None
        True
        """
        array = np.asarray(value if to_numpy is None else to_numpy(value))
        if array.dtype == bool:
            array = array.astype(float)
        support = self.support_for(to_numpy)
        bad = _first_outside(array, support)
        if bad is None:
            return None
        index, seen = bad
        where = f" at index {index}" if index else ""
        return (
            f"holds {_show(seen)}{where}, outside the support of {self.name}: "
            f"{support.describe(index)}"
        )

    def support_mask(self, value: np.ndarray, to_numpy=None) -> np.ndarray:
        """Boolean array over the batch of ``value``: True where a point lies in the support."""
        array = np.asarray(value, dtype=float)
        support = self.support_for(to_numpy)
        with np.errstate(invalid="ignore"):
            return np.asarray(support.check(array))

    # -- densities and draws (see ppl_bdl.dsl.dist.native) -----------------------------------------
    def log_prob(self, value: Any) -> Any:
        """Log density (mass) of ``value``.

        Inside a model run (or ``with backend.activate():``) it runs on that backend and returns a
        backend array that gradients flow through, e.g. for ``bdl.factor``. Outside, NumPy in,
        NumPy out (float64, -inf outside the support); backend arrays in, backend arrays out.

        Example
        -------
        >>> import numpy as np
        >>> from ppl_bdl import dist
        >>> dist.Logistic(0.5, 2.0).log_prob(np.array([0.1, 1.0])).round(4)
        array([-2.0894, -2.095 ])
        """
        return native.log_prob(self, value)

    def sample(self, key: Any, sample_shape: tuple[int, ...] | int = ()) -> Any:
        """Draws of shape ``sample_shape + batch_shape + event_shape``.

        ``key`` is an int seed or a backend random key. Inside a model run the draws are backend
        arrays; outside, NumPy arrays (float64).

        Example
        -------
        >>> from ppl_bdl import dist
        >>> dist.Poisson(3.0).sample(0, (1000,)).mean().round(0)
        np.float64(3.0)
        """
        return native.sample(self, key, sample_shape)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={_brief(v)}" for k, v in self.params.items())
        return f"{self.name}({args})"


def _first_outside(array: np.ndarray, support: C.Constraint):
    """(batch index, offending point) of the first point of ``array`` outside ``support``."""
    event_dim = support.event_dim
    with np.errstate(invalid="ignore", divide="ignore"):
        finite = np.isfinite(array)
        if event_dim:
            finite = np.all(finite.reshape(finite.shape[: finite.ndim - event_dim] + (-1,)), -1)
        ok = np.asarray(support.check(array)) & finite
    if np.all(ok):
        return None
    # Bounds that vary across a batch may broadcast the check beyond the value's own shape.
    batch = np.broadcast_shapes(ok.shape, array.shape[: array.ndim - event_dim])
    ok = np.broadcast_to(ok, batch)
    array = np.broadcast_to(array, batch + array.shape[array.ndim - event_dim :])
    if ok.ndim == 0:
        return (), array
    first = tuple(int(i) for i in np.argwhere(~ok)[0])
    return first, array[first]


def _show(seen: Any) -> str:
    seen = np.asarray(seen)
    return f"{float(seen):g}" if seen.ndim == 0 else np.array2string(seen, threshold=8)


def describe_violation(key: str, array: np.ndarray, constraint: C.Constraint) -> str | None:
    """A message for the first point of ``array`` outside ``constraint``, or None."""
    bad = _first_outside(array, constraint)
    if bad is None:
        return None
    index, seen = bad
    where = f" at index {index}" if index else ""
    return f"parameter {key!r} must be {constraint.description}, got {_show(seen)}{where}."


def _brief(value: Any) -> str:
    if isinstance(value, Distribution):
        return repr(value)
    shape = _shape(value)
    if shape == ():
        try:
            return f"{float(value):g}"
        except Exception:
            return type(value).__name__
    return f"<{type(value).__name__} {shape}>"
