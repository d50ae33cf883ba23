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

import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ppl_bdl.dsl.bound_data import foreign_library
from ppl_bdl.dsl.control_flow import StackedNative, index_tree, no_nesting, python_loop
from ppl_bdl.dsl.effects import Message, PlateFrame, Runtime
from ppl_bdl.dsl.sites import SiteShape, site_shape
from ppl_bdl.errors import DataError, DistributionError, LongLoop, ModelError
from ppl_bdl.trace.compiled_scan import check_stacked_observations, run_compiled


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
    local : set of str
        Latent sites in the minibatched plate whose values are given for the minibatch's points
        only (an amortized guide's, :mod:`ppl_bdl.inference.vi.guides.amortized`); others there are refused.
    observed : dict, optional
        Observed site name -> a value of the site's shape that replaces its data (the draws of
        a sampled-label Fisher, :mod:`ppl_bdl.inference.vi.natural`).
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
        local: frozenset[str] = frozenset(),
        observed: dict | None = None,
    ):
        super().__init__(backend)
        self.exclude, self.local = exclude, local
        self.observed = observed or {}
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
        self._names: set = set()
        #: (scan name, step) while a step of ``bdl.scan`` runs (step None in a compiled loop);
        #: its sites are recorded per step and stacked when the loop ends.
        self._step: tuple[str, int | None] | None = None
        self._step_records: dict[str, Any] = {}
        #: In a compiled loop's step: the value tables' entries at this step, by table.
        self._step_slices: dict | None = None

    # -- primitives -------------------------------------------------------------------------
    def run(self, msg: Message) -> None:
        key = msg.name if self._step is None else (msg.name, self._step[1])
        if key in self._names:
            raise ModelError(
                f"site name {msg.name!r} is used twice in model; every sample/param/deterministic/"
                "factor site needs its own name (inside a loop, add the index: f'w_{i}'; inside "
                "bdl.scan, one name per site is stacked over the steps)."
            )
        self._names.add(key)
        if self._step is not None and msg.type == "param":
            raise ModelError(
                f"param({msg.name!r}) inside bdl.scan: declare parameters before the loop."
            )
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
        backend = self.backend
        spec = msg.fn
        if self.validate:
            self._check_params(msg)
        if (
            msg.name in self.exclude
            and msg.name in self.unconstrained
            and not self.record
            and spec.support.name == "real"
        ):
            # Excluded real-valued latent in a hot loop: its value is u and nothing else is
            # needed, so skip building the native distribution (a closed-form KL handles it).
            self._refuse_subsampled_latent(msg)
            msg.value = backend.model_value(
                self._given("unconstrained", msg.name), self.strict_values
            )
            return
        native = backend.distribution(spec)
        observed = msg.obs is not None and not self.predictive
        shape = site_shape(msg, native) if (self.record or self.validate) else None
        if observed:
            value = self._given("observed", msg.name) if msg.name in self.observed else msg.obs
            if self.validate:
                value = self._check_obs(msg, value, shape)
            elif not backend.is_array(value):  # a Python number or NumPy constant in the model
                value = backend.asarray(value)
            value = backend.observed_value(spec, value)
        elif msg.name in self.unconstrained:
            self._refuse_subsampled_latent(msg)
            u = self._given("unconstrained", msg.name)
            transform = backend.biject_to(native.support)
            if transform is None:
                value = u
            else:
                value = transform(u)
                self._add_log_density(msg, transform.log_abs_det_jacobian(u, value))
        elif msg.name in self.values:
            self._refuse_subsampled_latent(msg)
            value = self._given("values", msg.name)
        else:
            value = self._draw(
                msg, native, shape or site_shape(msg, native), observed_site=msg.obs is not None
            )
        msg.value = backend.model_value(value, self.strict_values)
        if msg.name in self.exclude and not self.record:
            return
        log_prob = native.log_prob(value)
        if msg.name not in self.exclude:
            self._add_log_density(msg, log_prob)
        if self.record:
            self._record(
                SiteRecord(
                    name=msg.name,
                    kind="observed" if msg.obs is not None else "latent",
                    value=value,
                    spec=spec,
                    native=native,
                    shape=shape,
                    plates=tuple(msg.plates),
                    log_prob=log_prob,
                )
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
            self._record(SiteRecord(msg.name, "deterministic", msg.value, plates=tuple(msg.plates)))

    def _factor(self, msg: Message) -> None:
        if self.validate and self._foreign(msg.value):
            raise DataError(self._foreign_message(msg.name, "log_weight", msg.value))
        self._add_log_density(msg, msg.value)
        if self.record:
            self._record(SiteRecord(msg.name, "factor", msg.value, plates=tuple(msg.plates)))

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

    # -- loops ------------------------------------------------------------------------------
    #: The sums a step adds to: kept per step by a compiled loop, added up after it.
    accumulators: tuple[str, ...] = ("log_joint",)
    #: Whether ``bdl.scan`` runs as one compiled loop where its step allows (False: always the
    #: Python loop, the reference the compiled loop is tested against).
    compile_scan: bool = True

    def scan(self, f, init, xs, length: int, name: str):
        """``bdl.scan`` as one compiled loop (:mod:`ppl_bdl.trace.compiled_scan`), else (the
        step cannot be compiled) as a Python loop; each site is stacked over the steps.

        A validating run checks the first step in Python with every check on, then runs the
        loop compiled and checks every step's observed values at once."""
        with no_nesting(self._step is not None):
            pass
        if not self.compile_scan:
            return self._python_scan(f, init, xs, length, name)
        saved = self._state()
        if self.validate:  # the first step, with every check on
            self._python_scan(f, init, index_tree(xs, slice(0, 1)), 1, name)
            self._set_state(saved)
        try:
            if not self.validate:
                return run_compiled(self, f, init, xs, length, name)
            self.validate, self.strict_values = False, False
            try:
                out = run_compiled(self, f, init, xs, length, name)
            finally:
                self.validate, self.strict_values = True, saved["strict_values"]
            check_stacked_observations(self)
            return out
        except LongLoop:  # a trace around the loop gives up (the backend's trace catches it)
            raise
        except Exception as err:  # noqa: BLE001 - any step the loop cannot run: the Python loop
            self._set_state(saved)
            out = self._python_scan(f, init, xs, length, name)
            _warn_python_loop(name, err)
            return out

    def _state(self) -> dict:
        """What a step changes, to start over from it when the compiled loop fails."""
        state = {a: getattr(self, a) for a in self.accumulators}
        state.update(
            key=self.key,
            strict_values=self.strict_values,
            names=set(self._names),
            sites=dict(self.sites),
            plates_seen=dict(self.plates_seen),
        )
        return state

    def _set_state(self, state: dict) -> None:
        for a in self.accumulators:
            setattr(self, a, state[a])
        self.key, self.strict_values = state["key"], state["strict_values"]
        self._names, self.sites = set(state["names"]), dict(state["sites"])
        self.plates_seen = dict(state["plates_seen"])
        self._step, self._step_slices, self._step_records = None, None, {}

    def _python_scan(self, f, init, xs, length: int, name: str):
        """``bdl.scan`` as a Python loop; each site is recorded per step, then stacked."""
        self._step_records = {}

        @contextmanager
        def step(t: int):
            self._step = (name, t)
            try:
                yield
            finally:
                self._step = None

        carry, ys = python_loop(self.backend, f, init, xs, length, step)
        self._close_step_names(name, length)
        for site, records in self._step_records.items():
            self.sites[site] = _stacked(self.backend, records, name)
        self._step_records = {}
        return carry, ys

    def _close_step_names(self, name: str, length: int) -> None:
        """The names of a loop's sites, per step, as one name each (checked: every step)."""
        counts: dict[str, int] = {}
        for key in [k for k in self._names if isinstance(k, tuple)]:
            self._names.discard(key)
            counts[key[0]] = counts.get(key[0], 0) + 1
        for site, count in counts.items():
            if site in self._names:
                raise ModelError(
                    f"site name {site!r} is used inside bdl.scan and outside it (or in another "
                    "scan); give each its own name."
                )
            if count != length:
                raise ModelError(
                    f"site {site!r} is sampled at {count} of the {length} steps of bdl.scan "
                    f"{name!r}: a site in a scan must be sampled at every step (one stacked site)."
                )
            self._names.add(site)

    def _given(self, table: str, name: str):
        """The value of site ``name`` in ``table`` ("unconstrained", "values" or "observed"), at
        the current step of a scan (values stacked over time)."""
        if self._step_slices is not None:
            return self._step_slices[table][name]
        value = getattr(self, table)[name]
        return value if self._step is None else value[self._step[1]]

    def _record(self, record: SiteRecord) -> None:
        if self._step is None:
            self.sites[record.name] = record
        else:
            self._step_records.setdefault(record.name, []).append(record)

    # -- helpers ----------------------------------------------------------------------------
    def _draw(self, msg: Message, native, shape: SiteShape, observed_site: bool):
        backend = self.backend
        if self.key is None or (self.missing == "error" and not observed_site):
            raise ModelError(
                f"latent site {msg.name!r} has no value. Pass values for every latent site "
                f"(known: {sorted(self.values) or sorted(self.unconstrained)})."
            )
        self.key, sub = backend.random.split(self.key)
        full = backend.expand(native, shape.batch + shape.extra, 0)
        if self.missing == "uniform" and not observed_site and not msg.fn.is_discrete:
            transform = backend.biject_to(native.support)
            u_shape = (
                shape.value if transform is None else tuple(transform.inverse_shape(shape.value))
            )
            u = backend.random.uniform(sub, u_shape, -2.0, 2.0)
            return u if transform is None else transform(u)
        if msg.fn.family == "ImproperUniform":
            raise ModelError(
                f"site {msg.name!r} has an ImproperUniform (flat) prior, which has no draws. Give it a "
                "proper prior for prior predictive checks, or pass a value for it."
            )
        return backend.random.draw(sub, full)

    def _add_log_density(self, msg: Message, log_prob) -> None:
        """Add a site's log density (or log-Jacobian) to ``log_joint``, scaled for minibatches
        (:class:`~ppl_bdl.trace.pointwise.PointwiseEvaluator` keeps one plate's per point instead)."""
        total, scale = self.backend.math.sum(log_prob), msg.scale
        self.log_joint = self.log_joint + (total if scale == 1.0 else total * scale)

    def _refuse_subsampled_latent(self, msg: Message) -> None:
        sub = [f.name for f in msg.plates if f.scale != 1.0]
        if sub and msg.name not in self.local:
            raise ModelError(
                f"latent site {msg.name!r} sits in the minibatched plate {sub[0]!r}. Minibatching "
                "needs every latent inside that plate to be global; fit without batch_size, or move "
                "the site out of the plate."
            )

    def _check_params(self, msg: Message) -> None:
        backend = self.backend
        for key, value in msg.fn.params.items():
            if self._foreign(value):
                raise DataError(self._foreign_message(msg.name, key, value))
        error = msg.fn.check_concrete(backend.to_numpy)
        if error:
            raise DistributionError(f"site {msg.name!r}: {msg.fn.name}: {error}")

    def _check_obs(self, msg: Message, value: Any, shape: SiteShape):
        backend = self.backend
        if self._foreign(value):
            raise DataError(self._foreign_message(msg.name, "obs", value))
        if not backend.is_array(value):
            value = backend.asarray(np.asarray(value))
        seen = tuple(value.shape)
        if seen != shape.value:
            raise ModelError(
                f"observed site {msg.name!r}: obs has shape {seen} but the distribution "
                f"{msg.fn!r} in its plates gives values of shape {shape.value}. Index the data "
                "with the plate's indices, or reshape it."
            )
        array = backend.to_numpy(value)
        finite = np.isfinite(array)
        if not finite.all():
            first = tuple(int(i) for i in np.argwhere(~finite)[0])
            raise DataError(
                f"observed site {msg.name!r}: obs holds {array[first]} at index {first}. Remove or "
                "impute missing values before fitting."
            )
        error = msg.fn.support_violation(array, backend.to_numpy)
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
            f"{self.backend.name!r} backend. Use ppl_bdl.dsl.math and bound data instead of "
            "torch/jax functions inside the model."
        )


def _stacked(backend, records: list[SiteRecord], scan_name: str) -> SiteRecord:
    """One site from its records at every step of a scan: values with a leading time axis."""
    first = records[0]

    def stack(attribute: str):
        parts = [getattr(r, attribute) for r in records]
        return None if parts[0] is None else backend.math.stack(parts)

    shape = first.shape
    if shape is not None:
        shape = SiteShape((len(records),) + shape.batch, shape.extra, shape.event)
    native = None if first.native is None else StackedNative(backend, [r.native for r in records])
    return SiteRecord(
        name=first.name,
        kind=first.kind,
        value=stack("value"),
        spec=first.spec,
        native=native,
        shape=shape,
        plates=first.plates,
        log_prob=stack("log_prob"),
        constraint=first.constraint,
        extra={"scan": scan_name, "steps": len(records), "step_shape": first.shape},
    )


def _warn_python_loop(name: str, err: BaseException) -> None:
    reason = (str(err).strip().splitlines() or [""])[0][:200]
    warnings.warn(
        f"bdl.scan {name!r}: its step could not run as one compiled loop "
        f"({type(err).__name__}: {reason}), so it runs as a Python loop, which a compiled log "
        "density unrolls (slow to compile for long series). A step compiles when every step "
        "samples the same sites and its Python code does not branch on values or on the step "
        "index (use bdl.math.where), and the carry keeps its shape and dtype.",
        stacklevel=2,
    )
