"""The core's own runtime: evaluate a model's log density, draw from it, or replay it.

:class:`Evaluator` is what every algorithm in the core runs a model with. Given values for the
latent sites (constrained, or unconstrained to be mapped through each support's bijection), it adds
up the log joint density, scaled for minibatches; without values it draws them (from the prior, or
uniformly in the unconstrained space to initialise a sampler). With ``record=True`` it keeps every
site (value, native distribution, shape, pointwise log-likelihood) for setup, ArviZ and prediction.
With ``validate=True`` it checks everything a user can get wrong, naming the site; the hot loops run
with it off.

The model's code gets every value (latent, observed, param, a plate's indices) as the backend's
``model_value``: an array that NumPy values mix with, which in the validating run also refuses to
become a Python value (``if mu > 0:``). The evaluator itself keeps the backend's plain arrays.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import DataError, ModelError
from .model import foreign_library
from .runtime import Message, PlateFrame, Runtime
from .sites import SiteShape, site_shape


@dataclass
class SiteRecord:
    """One site of a recorded run."""

    name: str
    kind: str  # "latent" | "observed" | "param" | "deterministic" | "factor"
    value: Any
    spec: Any = None
    native: Any = None
    shape: SiteShape | None = None
    plates: tuple[PlateFrame, ...] = ()
    log_prob: Any = None
    constraint: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def is_discrete(self) -> bool:
        return self.spec is not None and self.spec.is_discrete


class Evaluator(Runtime):
    """Evaluate a model on one backend with the given values.

    Parameters
    ----------
    backend : Backend
    values : dict, optional
        Constrained values of latent sites.
    unconstrained : dict, optional
        Unconstrained values of latent sites; each is mapped through the bijection of its site's
        support and the log-Jacobian is added to ``log_joint``.
    params : dict, optional
        Values of ``param`` sites (their ``init`` otherwise).
    key : backend random key, optional
        For drawing latent sites that have no value (``missing="prior"`` or ``"uniform"``) and
        observed sites in predictive mode.
    batch : dict, optional
        Plate name -> index array of the minibatch; the plate's sites are scaled by size / batch.
    missing : {"error", "prior", "uniform"}
        What to do with a latent site that has no value.
    predictive : bool
        Draw observed sites instead of conditioning on them.
    exclude : set of str
        Latent sites whose own log density is left out of ``log_joint`` (an algorithm that
        handles their prior in closed form, e.g. an analytic KL, adds it itself).
    """

    def __init__(
        self,
        backend,
        *,
        values: dict | None = None,
        unconstrained: dict | None = None,
        params: dict | None = None,
        key: Any = None,
        batch: dict | None = None,
        missing: str = "error",
        predictive: bool = False,
        validate: bool = False,
        record: bool = False,
        exclude: frozenset[str] = frozenset(),
    ):
        super().__init__(backend)
        self.exclude = exclude
        self.values = values or {}
        self.unconstrained = unconstrained or {}
        self.params = params or {}
        self.key = key
        self.batch = batch or {}
        self.missing = missing
        self.predictive = predictive
        self.validate = validate
        self.strict_values = validate
        self.record = record
        self.log_joint: Any = 0.0
        self.sites: dict[str, SiteRecord] = {}
        #: Every plate entered, by name: its size.
        self.plates_seen: dict[str, int] = {}
        self._names: set[str] = set()

    # -- primitives -------------------------------------------------------------------------
    def run(self, msg: Message) -> None:
        if msg.name in self._names:
            raise ModelError(
                f"site name {msg.name!r} is used twice in model; every sample/param/deterministic/"
                "factor site needs its own name (inside a loop, add the index: f'w_{i}')."
            )
        self._names.add(msg.name)
        if msg.type == "sample":
            self._sample(msg)
        elif msg.type == "param":
            self._param(msg)
        elif msg.type == "deterministic":
            self._deterministic(msg)
        elif msg.type == "factor":
            self._factor(msg)
        else:  # pragma: no cover - primitives only send the four types above
            raise ModelError(f"unknown primitive type {msg.type!r} at site {msg.name!r}.")

    def _sample(self, msg: Message) -> None:
        be = self.backend
        spec = msg.fn
        if self.validate:
            self._check_params(msg)
        if (
            msg.name in self.exclude and msg.name in self.unconstrained and not self.record
            and spec.support.name == "real"
        ):  # fmt: skip
            # Excluded real-valued latent in a hot loop: its value is u and nothing else is
            # needed, so skip building the native distribution (a closed-form KL handles it).
            self._refuse_subsampled_latent(msg)
            msg.value = be.model_value(self.unconstrained[msg.name], self.strict_values)
            return
        native = be.distribution(spec)
        observed = msg.obs is not None and not self.predictive
        shape = site_shape(msg, native) if (self.record or self.validate) else None
        if observed:
            value = msg.obs
            if self.validate:
                value = self._check_obs(msg, value, shape)
            elif not be.is_array(value):  # a Python number or NumPy constant in the model
                value = be.asarray(value)
            value = be.observed_value(spec, value)
        elif msg.name in self.unconstrained:
            self._refuse_subsampled_latent(msg)
            u = self.unconstrained[msg.name]
            transform = be.biject_to(native.support)
            if transform is None:
                value = u
            else:
                value = transform(u)
                self.log_joint = self.log_joint + be.math.sum(
                    transform.log_abs_det_jacobian(u, value)
                )
        elif msg.name in self.values:
            self._refuse_subsampled_latent(msg)
            value = self.values[msg.name]
        else:
            value = self._draw(
                msg, native, shape or site_shape(msg, native), observed_site=msg.obs is not None
            )
        msg.value = be.model_value(value, self.strict_values)
        if msg.name in self.exclude and not self.record:
            return
        log_prob = native.log_prob(value)
        if msg.name not in self.exclude:
            scale = msg.scale
            total = be.math.sum(log_prob)
            self.log_joint = self.log_joint + (total if scale == 1.0 else total * scale)
        if self.record:
            self.sites[msg.name] = SiteRecord(
                name=msg.name,
                kind="observed" if msg.obs is not None else "latent",
                value=value,
                spec=spec,
                native=native,
                shape=shape,
                plates=tuple(msg.plates),
                log_prob=log_prob,
            )

    def _param(self, msg: Message) -> None:
        value = self.params.get(msg.name)
        if value is None:
            value = self.backend.asarray(msg.fn)
        msg.value = self.backend.model_value(value, self.strict_values)
        if self.record:
            self.sites[msg.name] = SiteRecord(
                msg.name, "param", value, constraint=msg.kwargs["constraint"]
            )

    def _deterministic(self, msg: Message) -> None:
        if self.record:
            self.sites[msg.name] = SiteRecord(
                msg.name, "deterministic", msg.value, plates=tuple(msg.plates)
            )

    def _factor(self, msg: Message) -> None:
        be = self.backend
        if self.validate and self._foreign(msg.value):
            raise DataError(self._foreign_message(msg.name, "log_weight", msg.value))
        total = be.math.sum(msg.value)
        scale = msg.scale
        self.log_joint = self.log_joint + (total if scale == 1.0 else total * scale)
        if self.record:
            self.sites[msg.name] = SiteRecord(
                msg.name, "factor", msg.value, plates=tuple(msg.plates)
            )

    # -- plates -----------------------------------------------------------------------------
    @contextmanager
    def plate(self, frame: PlateFrame):
        self.plates_seen[frame.name] = frame.size
        indices = self.batch.get(frame.name)
        if indices is None:
            indices = self.backend.arange(frame.size)
            frame.batch_size = frame.size
        else:
            frame.batch_size = int(indices.shape[0])
            frame.scale = frame.size / frame.batch_size
        frame.indices = indices
        yield self.backend.model_value(indices, self.strict_values)

    # -- helpers ----------------------------------------------------------------------------
    def _draw(self, msg: Message, native, shape: SiteShape, observed_site: bool):
        be = self.backend
        if self.key is None or (self.missing == "error" and not observed_site):
            raise ModelError(
                f"latent site {msg.name!r} has no value. Pass values for every latent site "
                f"(known: {sorted(self.values) or sorted(self.unconstrained)})."
            )
        self.key, sub = be.random.split(self.key)
        full = be.expand(native, shape.batch + shape.extra, 0)
        if self.missing == "uniform" and not observed_site and not msg.fn.is_discrete:
            transform = be.biject_to(native.support)
            u_shape = (
                shape.value if transform is None else tuple(transform.inverse_shape(shape.value))
            )
            u = be.random.uniform(sub, u_shape, -2.0, 2.0)
            return u if transform is None else transform(u)
        if msg.fn.name == "ImproperUniform":
            raise ModelError(
                f"site {msg.name!r} has an ImproperUniform (flat) prior, which has no draws. Give it a "
                "proper prior for prior predictive checks, or pass a value for it."
            )
        return be.random.draw(sub, full)

    def _refuse_subsampled_latent(self, msg: Message) -> None:
        sub = [f.name for f in msg.plates if f.scale != 1.0]
        if sub:
            raise ModelError(
                f"latent site {msg.name!r} sits in the minibatched plate {sub[0]!r}. Minibatching "
                "needs every latent inside that plate to be global; fit without batch_size, or move "
                "the site out of the plate."
            )

    def _check_params(self, msg: Message) -> None:
        be = self.backend
        for key, value in msg.fn.params.items():
            if self._foreign(value):
                raise DataError(self._foreign_message(msg.name, key, value))
        error = msg.fn.check_concrete(be.to_numpy)
        if error:
            from .errors import DistributionError

            raise DistributionError(f"site {msg.name!r}: {msg.fn.name}: {error}")

    def _check_obs(self, msg: Message, value: Any, shape: SiteShape):
        be = self.backend
        if self._foreign(value):
            raise DataError(self._foreign_message(msg.name, "obs", value))
        if not be.is_array(value):
            value = be.asarray(np.asarray(value))
        seen = tuple(value.shape)
        if seen != shape.value:
            raise ModelError(
                f"observed site {msg.name!r}: obs has shape {seen} but the distribution "
                f"{msg.fn!r} in its plates gives values of shape {shape.value}. Index the data "
                "with the plate's indices, or reshape it."
            )
        array = be.to_numpy(value)
        finite = np.isfinite(array)
        if not finite.all():
            first = tuple(int(i) for i in np.argwhere(~finite)[0])
            raise DataError(
                f"observed site {msg.name!r}: obs holds {array[first]} at index {first}. Remove or "
                "impute missing values before fitting."
            )
        error = msg.fn.support_violation(array, be.to_numpy)
        if error:
            raise DataError(
                f"observed site {msg.name!r}: obs {error}. Fix the data (labels as integer codes "
                "0..K-1, counts as whole numbers >= 0, values inside the range), or choose a "
                "distribution whose support holds these values."
            )
        return value

    def _foreign(self, value: Any) -> bool:
        """Whether ``value`` is an array of another array library than the backend's."""
        return not self.backend.is_array(value) and foreign_library(value) is not None

    def _foreign_message(self, site: str, what: str, value: Any) -> str:
        return (
            f"site {site!r}: {what} is a {foreign_library(value)} array, but the model runs on the "
            f"{self.backend.name!r} backend. Use ppl_bdl.math and bound data instead of "
            "torch/jax functions inside the model."
        )
