"""Families built from other pieces: a flat prior, a point mass, a random walk, a mixture.

Example
-------
>>> import numpy as np
>>> from ppl_bdl import dist
>>> mix = dist.MixtureSameFamily(
...     dist.Categorical(probs=np.array([0.3, 0.7])),
...     dist.Normal(np.array([-1.0, 1.0]), np.array([0.5, 0.5])),
... )
>>> mix.batch_shape, mix.event_shape
((), ())
>>> dist.GaussianRandomWalk(1.0, num_steps=4).event_shape
(4,)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ppl_bdl.dsl.dist import constraints as C
from ppl_bdl.dsl.dist.base import Distribution, _shape
from ppl_bdl.dsl.dist.discrete import Categorical
from ppl_bdl.errors import DistributionError

Array = Any


#: The supports of an ImproperUniform latent, by name: each backend maps it onto R^k by its bijection
#: (exp, sigmoid, ordered, stick-breaking, the Cholesky ones) for NUTS, the guides and the kernels.
IMPROPER_SUPPORTS: dict[str, C.Constraint] = {
    c.name: c
    for c in (
        C.real,
        C.positive,
        C.unit_interval,
        C.ordered_vector,
        C.positive_ordered_vector,
        C.simplex,
        C.corr_cholesky,
        C.lower_cholesky,
        C.positive_definite,
        C.corr_matrix,
    )
}


def _support_names() -> str:
    return ", ".join(repr(n) for n in IMPROPER_SUPPORTS) + (
        ", or dist.constraints.between(low, high) / at_least(low)"
    )


class ImproperUniform(Distribution):
    """A flat (improper) prior on ``support``, each value of shape ``shape``.

    ``support`` is a name (``"real"``, ``"positive"``, ``"unit_interval"``, ``"ordered_vector"``,
    ``"positive_ordered_vector"``, ``"simplex"``, ``"corr_cholesky"``, ``"lower_cholesky"``,
    ``"positive_definite"``, ``"corr_matrix"``) or a bounded support of
    :mod:`ppl_bdl.dsl.dist.constraints` with scalar bounds (``between(low, high)``,
    ``at_least(low)``). ``shape`` is the shape of one value (its event shape): at least one dim
    for the vector supports (``(K,)``), a square ``(d, d)`` for the matrix ones. A latent site with
    it is moved in the unconstrained space through the backend's bijection onto the support (its
    log-Jacobian included) and keeps its constrained shape in the posterior.

    Its log density is 0: use it for flat priors (a likelihood or a ``factor`` makes the posterior
    proper), and never for prior predictive draws. The scalar supports may also take their shape
    from ``sample``'s ``shape=``.

    Example
    -------
    >>> from ppl_bdl import dist
    >>> cutpoints = dist.ImproperUniform("ordered_vector", shape=(3,))
    >>> cutpoints.batch_shape, cutpoints.event_shape
    ((), (3,))
    """

    def __init__(self, support: str | C.Constraint = "real", shape: tuple[int, ...] | int = ()):
        self._name, self._bounds = _support_name(support)
        self._event = _event_shape_arg(shape)
        super().__init__()
        self.params = {"support": self._name, "shape": self._event}
        if self._bounds:
            self.params.update(zip(("low", "high"), self._bounds, strict=False))

    def _check_relations(self) -> str | None:
        if self._name not in IMPROPER_SUPPORTS and self._name not in ("interval", "greater_than"):
            return (
                f"support {self._name!r} has no bijection onto the unconstrained space here; "
                f"supported: {_support_names()}."
            )
        event_dim, shape = self.support.event_dim, self._event
        if len(shape) < event_dim:
            example = "(K,)" if event_dim == 1 else "(d, d)"
            return (
                f"support {self._name!r} needs shape= with at least {event_dim} dimension(s) (one "
                f"value's shape, e.g. shape={example}), got shape={shape}."
            )
        if event_dim == 2 and shape[-1] != shape[-2]:
            return f"support {self._name!r} holds square matrices, got shape={shape}."
        return None

    @property
    def support(self) -> C.Constraint:
        if self._name == "interval":
            return C.between(*self._bounds)
        if self._name == "greater_than":
            return C.at_least(*self._bounds)
        return IMPROPER_SUPPORTS.get(self._name, C.real)

    @property
    def batch_shape(self) -> tuple[int, ...]:
        return ()

    @property
    def event_shape(self) -> tuple[int, ...]:
        return self._event


def _support_name(support: str | C.Constraint) -> tuple[str, tuple[float, ...]]:
    """(name, scalar bounds) of an ImproperUniform's ``support`` argument."""
    if isinstance(support, str):
        return support, ()
    if isinstance(support, C.Constraint) and support.name in IMPROPER_SUPPORTS:
        return support.name, ()
    if isinstance(support, C.Constraint) and support.name in ("interval", "greater_than"):
        if all(np.ndim(b) == 0 for b in support.args):
            return support.name, tuple(float(b) for b in support.args)
        raise DistributionError(
            f"ImproperUniform: the bounds of {support.description!r} must be scalars; give each "
            "site one support (or use a proper prior, e.g. dist.Uniform(low, high))."
        )
    shown = support.name if isinstance(support, C.Constraint) else type(support).__name__
    raise DistributionError(
        f"ImproperUniform: support must be one of {_support_names()}; got {shown!r}."
    )


def _event_shape_arg(shape: tuple[int, ...] | int) -> tuple[int, ...]:
    if isinstance(shape, int | np.integer) and not isinstance(shape, bool):
        shape = (shape,)
    try:
        out = tuple(int(s) for s in shape)
        if any(s < 1 or s != t for s, t in zip(out, shape, strict=True)):
            raise ValueError
    except (TypeError, ValueError):
        raise DistributionError(
            f"ImproperUniform: shape must be a tuple of ints >= 1 (one value's shape), got {shape!r}."
        ) from None
    return out


class Delta(Distribution):
    """A point mass at ``v`` with log density ``log_density`` there (-inf elsewhere).

    The rightmost ``event_dim`` dimensions of ``v`` make one event. Used for values fixed by
    hand, or to add a log weight at an observed point.
    """

    arg_constraints = {"v": C.real, "log_density": C.real}

    def __init__(self, v: Array = 0.0, log_density: Array = 0.0, event_dim: int = 0):
        if isinstance(event_dim, bool) or not isinstance(event_dim, int) or event_dim < 0:
            raise DistributionError(f"Delta: event_dim must be an int >= 0, got {event_dim!r}.")
        self.arg_event_dims = {"v": event_dim}
        super().__init__(v=v, log_density=log_density)
        self.params["event_dim"] = event_dim

    @property
    def support(self) -> C.Constraint:
        event_dim = self.arg_event_dims["v"]
        return C.Constraint("point", C.point.check, C.point.description, event_dim=event_dim)

    @property
    def event_shape(self) -> tuple[int, ...]:
        event_dim = self.arg_event_dims["v"]
        shape = _shape(self.params["v"])
        return shape[len(shape) - event_dim :]

    def support_for(self, to_numpy=None) -> C.Constraint:
        bounds = self._numpy_params(to_numpy, "v")
        event_dim = self.arg_event_dims["v"]
        return self.support if bounds is None else C.equal_to(bounds[0], event_dim)


class GaussianRandomWalk(Distribution):
    """A random walk of ``num_steps`` steps: x₀ ~ N(0, scale²), xₜ - xₜ₋₁ ~ N(0, scale²)."""

    arg_constraints = {"scale": C.positive}
    support = C.real_vector

    def __init__(self, scale: Array = 1.0, num_steps: int = 1):
        if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
            raise DistributionError(
                f"GaussianRandomWalk: num_steps must be an int >= 1, got {num_steps!r}."
            )
        super().__init__(scale=scale)
        self.params["num_steps"] = num_steps

    @property
    def event_shape(self) -> tuple[int, ...]:
        return (self.params["num_steps"],)


class MixtureSameFamily(Distribution):
    """A finite mixture: weights from a Categorical, components from one family.

    ``component_distribution``'s batch shape ends with the number of components K, which must
    match ``mixing_distribution``'s categories; both are ``ppl_bdl.dsl.dist`` specs.
    """

    def __init__(self, mixing_distribution: Distribution, component_distribution: Distribution):
        for key, value in (
            ("mixing_distribution", mixing_distribution),
            ("component_distribution", component_distribution),
        ):
            if not isinstance(value, Distribution):
                raise DistributionError(
                    f"MixtureSameFamily: {key} must be a ppl_bdl.dsl.dist distribution, got "
                    f"{type(value).__name__}."
                )
        if not isinstance(mixing_distribution, Categorical):
            raise DistributionError(
                "MixtureSameFamily: mixing_distribution must be a dist.Categorical, got "
                f"{mixing_distribution.name}."
            )
        super().__init__(
            mixing_distribution=mixing_distribution,
            component_distribution=component_distribution,
        )

    @property
    def _mixing(self) -> Categorical:
        return self.params["mixing_distribution"]

    @property
    def _component(self) -> Distribution:
        return self.params["component_distribution"]

    def _check_relations(self) -> str | None:
        for key in ("mixing_distribution", "component_distribution"):
            error = self.params[key]._error
            if error:
                return f"{key} ({self.params[key].name}): {error}"
        k = self._mixing.num_categories
        comp = self._component.batch_shape
        if not comp or comp[-1] != k:
            return (
                f"component_distribution's batch shape {comp} must end with the number of "
                f"components {k} (the mixing distribution's categories)."
            )
        return None

    @property
    def support(self) -> C.Constraint:
        return self._component.support

    @property
    def batch_shape(self) -> tuple[int, ...]:
        return tuple(
            np.broadcast_shapes(self._mixing.batch_shape, self._component.batch_shape[:-1])
        )

    @property
    def event_shape(self) -> tuple[int, ...]:
        return self._component.event_shape

    def support_for(self, to_numpy=None) -> C.Constraint:
        component = self._component.support_for(to_numpy)
        if component.at is None:  # the same support for every component
            return component
        event_dim = component.event_dim

        def check(x):  # inside the support of at least one component
            x = np.expand_dims(x, axis=x.ndim - event_dim)
            return np.any(component.check(x), axis=-1)

        return C.Constraint(
            component.name,
            check,
            f"inside one component's support ({component.description})",
            event_dim=event_dim,
            discrete=component.discrete,
        )
