"""The neutral distribution spec every ``ppl_bdl.dsl.dist`` family derives from.

A spec holds parameters and knows its family's parameter domains, shapes and support; the density
itself is the backend's (``backend.distribution(spec)`` builds the native distribution). Parameters
are validated when the spec is built: shapes must broadcast, and concrete values (Python numbers,
lists, NumPy arrays) must lie in their domain. Inside a model run the error is raised at the
``sample`` call, so it can name the site.

``spec.log_prob(value)`` and ``spec.sample(key, shape)`` work inside a model (on the run's backend,
returning backend arrays, differentiable) and outside one (NumPy in, NumPy out); see
:mod:`ppl_bdl.dsl.dist.native`.

The reshaped views live here too, beside the base they derive from (as NumPyro keeps them in
one module): ``spec.expand(batch_shape)`` broadcasts a distribution's batch shape
(:class:`ExpandedDistribution`); ``spec.to_event(n)`` moves its ``n`` rightmost batch dimensions
into the event, so one draw spans them and its log density is their sum (:class:`Independent`);
``spec.mask(m)`` zeroes the log density where the boolean array ``m`` is False
(:class:`MaskedDistribution`). Each means what it means in NumPyro, and each backend lowers it to
its native ``.expand``, ``.to_event`` and ``.mask``.

Example
-------
>>> import numpy as np
>>> from ppl_bdl import dist
>>> d = dist.Normal(0.0, 1.0).expand([2, 3]).to_event(1)
>>> d.batch_shape, d.event_shape
((2,), (3,))
>>> dist.Normal(0.0, 1.0).mask(np.array([True, False])).log_prob(np.zeros(2)).round(4)
array([-0.9189,  0.    ])
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
    zeroes the log density where the boolean ``m`` is False (the views at the end of this module).
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

    # -- reshaping (NumPyro's expand, to_event, mask; the views at the end) -----------------------
    def expand(self, batch_shape: tuple[int, ...] | int) -> Distribution:
        """This distribution with its batch shape broadcast to ``batch_shape`` (NumPyro's
        ``expand``): its own batch shape must broadcast to it.

        Example
        -------
        >>> from ppl_bdl import dist
        >>> dist.Normal(0.0, 1.0).expand([2, 3]).batch_shape
        (2, 3)
        """
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


def _batch_shape_arg(owner: str, batch_shape: Any) -> tuple[int, ...]:
    """``batch_shape`` as a tuple of ints >= 0 (an int is a 1-d shape)."""
    if isinstance(batch_shape, int | np.integer) and not isinstance(batch_shape, bool):
        batch_shape = (batch_shape,)
    try:
        if isinstance(batch_shape, str):
            raise TypeError
        shape = tuple(batch_shape)
        if not all(isinstance(s, int | np.integer) and not isinstance(s, bool) for s in shape):
            raise TypeError
    except TypeError:
        raise DistributionError(
            f"{owner}.expand: batch_shape must be a tuple of ints, got {batch_shape!r}."
        ) from None
    if any(s < 0 for s in shape):
        raise DistributionError(f"{owner}.expand: batch_shape has a negative size: {shape}.")
    return tuple(int(s) for s in shape)


class _Wrapped(Distribution):
    """A spec built from ``base_dist``: the base's support and parameters, reshaped."""

    def __init__(self, base_dist: Distribution, **extra: Any):
        if not isinstance(base_dist, Distribution):
            raise DistributionError(
                f"{type(self).__name__}: base_dist must be a ppl_bdl.dsl.dist distribution, got "
                f"{type(base_dist).__name__}."
            )
        self._base = base_dist
        super().__init__(base_dist=base_dist)
        self.params.update(extra)  # static settings: kept as given, never converted to arrays

    @property
    def base_dist(self) -> Distribution:
        return self._base

    @property
    def family(self) -> str:
        return self._base.family

    @property
    def support(self) -> C.Constraint:
        return self._base.support

    def support_for(self, to_numpy=None) -> C.Constraint:
        return self._base.support_for(to_numpy)

    @property
    def event_shape(self) -> tuple[int, ...]:
        return self._base.event_shape

    def _check_relations(self) -> str | None:
        base_error = self._base._error
        if base_error:
            return f"its base {self._base.name}: {base_error}"
        return self._check_shapes()

    def _check_shapes(self) -> str | None:
        return None


class ExpandedDistribution(_Wrapped):
    """``base_dist`` with its batch shape broadcast to ``batch_shape`` (``spec.expand``).

    The base's batch shape must broadcast to ``batch_shape`` (NumPy rules: right-aligned, sizes
    equal or 1), as in NumPyro's ``ExpandedDistribution``.

    Example
    -------
    >>> from ppl_bdl import dist
    >>> dist.Normal(0.0, 1.0).expand([3]).batch_shape
    (3,)
    """

    def __init__(self, base_dist: Distribution, batch_shape: tuple[int, ...]):
        self._batch = _batch_shape_arg(getattr(base_dist, "name", "distribution"), batch_shape)
        super().__init__(base_dist, batch_shape=self._batch)

    @property
    def batch_shape(self) -> tuple[int, ...]:
        return self._batch

    def _check_shapes(self) -> str | None:
        base = self._base.batch_shape
        try:
            fits = tuple(np.broadcast_shapes(base, self._batch)) == self._batch
        except ValueError:
            fits = False
        if fits:
            return None
        return (
            f"expand({list(self._batch)}): the batch shape {base} of {self._base!r} does not "
            f"broadcast to {self._batch}. Each of its sizes, right-aligned, must equal the new "
            "size or be 1 (NumPy rules); add dimensions on the left only."
        )

    def expand(self, batch_shape) -> Distribution:
        return ExpandedDistribution(self._base, batch_shape)

    def __repr__(self) -> str:
        return f"{self._base!r}.expand({list(self._batch)})"


class Independent(_Wrapped):
    """``base_dist`` with its ``reinterpreted_batch_ndims`` rightmost batch dims made event dims.

    One draw then spans them and its log density is their sum (``spec.to_event(n)``; NumPyro's
    and Pyro's ``Independent``).

    Example
    -------
    >>> from ppl_bdl import dist
    >>> d = dist.Independent(dist.Normal([0.0, 1.0], 1.0), 1)
    >>> d.batch_shape, d.event_shape
    ((), (2,))
    """

    def __init__(self, base_dist: Distribution, reinterpreted_batch_ndims: int):
        n = reinterpreted_batch_ndims
        if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
            raise DistributionError(
                f"{getattr(base_dist, 'name', 'distribution')}.to_event: the number of batch dims "
                f"to make event dims must be an int >= 0, got {n!r}."
            )
        self._n = int(n)
        super().__init__(base_dist, reinterpreted_batch_ndims=self._n)

    @property
    def _split(self) -> int:
        return max(len(self._base.batch_shape) - self._n, 0)

    @property
    def batch_shape(self) -> tuple[int, ...]:
        return self._base.batch_shape[: self._split]

    @property
    def event_shape(self) -> tuple[int, ...]:
        return self._base.batch_shape[self._split :] + self._base.event_shape

    @property
    def support(self) -> C.Constraint:
        return C.independent(self._base.support, self._n)

    def support_for(self, to_numpy=None) -> C.Constraint:
        return C.independent(self._base.support_for(to_numpy), self._n)

    def _check_shapes(self) -> str | None:
        base = self._base.batch_shape
        if self._n <= len(base):
            return None
        return (
            f"to_event({self._n}) needs at least {self._n} batch dimension(s), but {self._base!r} "
            f"has batch shape {base} ({len(base)} dimension(s)). Expand it first "
            f"(.expand([...]).to_event({self._n})), or pass a smaller n."
        )

    def __repr__(self) -> str:
        return f"{self._base!r}.to_event({self._n})"


def _is_boolean(mask: Any) -> bool:
    if isinstance(mask, bool | np.bool_):
        return True
    dtype = getattr(mask, "dtype", None)
    return dtype is not None and str(dtype).rpartition(".")[2] == "bool"


class MaskedDistribution(_Wrapped):
    """``base_dist`` whose log density is 0 where the boolean ``mask`` is False (``spec.mask``).

    ``mask`` (a bool, or a boolean array of the model's backend or NumPy) broadcasts with the
    base's batch shape, which becomes the broadcast shape, as in NumPyro's
    ``MaskedDistribution``; draws are the base's.

    Example
    -------
    >>> import numpy as np
    >>> from ppl_bdl import dist
    >>> dist.Normal([0.0, 0.0], 1.0).mask(np.array([True, False])).batch_shape
    (2,)
    """

    def __init__(self, base_dist: Distribution, mask: Any):
        if isinstance(mask, list | tuple):
            mask = np.asarray(mask)
        self._mask = mask
        super().__init__(base_dist, mask=mask)

    @property
    def batch_shape(self) -> tuple[int, ...]:
        return tuple(np.broadcast_shapes(_shape(self._mask), self._base.batch_shape))

    def _check_shapes(self) -> str | None:
        mask = self._mask
        if not _is_boolean(mask):
            dtype = getattr(mask, "dtype", type(mask).__name__)
            return (
                f"mask must be a bool or a boolean array, got {dtype}. Compare to build one "
                "(e.g. mask=(counts > 0)), or convert it (m.astype(bool))."
            )
        try:
            np.broadcast_shapes(_shape(mask), self._base.batch_shape)
        except ValueError:
            return (
                f"mask of shape {_shape(mask)} does not broadcast with the batch shape "
                f"{self._base.batch_shape} of {self._base!r}. Give a mask of the batch shape "
                "(or one that broadcasts to it, NumPy rules)."
            )
        return None

    def __repr__(self) -> str:
        shape = _shape(self._mask)
        shown = repr(bool(self._mask)) if shape == () else f"<mask {shape}>"
        return f"{self._base!r}.mask({shown})"
