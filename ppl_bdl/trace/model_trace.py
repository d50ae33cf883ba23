"""One validating run of a bound model, recorded: what a fit knows about the model.

:func:`record_model` runs a bound model once on a backend with every check on (the values a user
can get wrong, named by site; data read past its end) and keeps the run as a
:class:`ModelTrace`: its sites (values, shapes, native distributions with their supports,
plates), the plates it entered with their sizes, and the plate its data is read through. The
checks of a fit, the flat layout of its latents, its starting points and its guides read this
record instead of running the model again. :func:`trace_model` is the same run for one-off
uses (other values, a minibatch, prior draws), returning the sites only.

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import dist
>>> from ppl_bdl.trace.model_trace import record_model
>>> @bdl.model
... def m(y):
...     mu = bdl.sample("mu", dist.Normal(0.0, 1.0))
...     with bdl.plate("data", y.shape[0]) as idx:
...         bdl.sample("y", dist.Normal(mu, 1.0), obs=y[idx])
>>> record = record_model(m(np.zeros(3)), bdl.backends.get("numpyro"))
>>> list(record.sites), record.plates, record.data_plate
(['mu', 'y'], {'data': 3}, 'data')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ppl_bdl.dsl.bound_data import fill_data
from ppl_bdl.dsl.model import BoundModel, unbound_message
from ppl_bdl.dsl.model_errors import read_past_the_end
from ppl_bdl.errors import DataError, ModelError
from ppl_bdl.trace import programs as cache
from ppl_bdl.trace.interpreter import Evaluator, SiteRecord


@dataclass(frozen=True)
class ModelTrace:
    """A bound model's validating run on one backend (see the module docstring).

    Attributes
    ----------
    bound : BoundModel
    backend : Backend
    sites : dict
        Site name -> :class:`~ppl_bdl.trace.interpreter.SiteRecord`, in the model's order.
    plates : dict
        Every plate the model entered -> its size.
    seed : int
        The seed of the run's draws (latent sites get uniform draws in the unconstrained space).
    """

    bound: BoundModel
    backend: Any
    sites: dict[str, SiteRecord]
    plates: dict[str, int]
    seed: int = 0

    def of_kind(self, kind: str) -> dict[str, SiteRecord]:
        """The sites of one kind ("latent", "observed", "param", "deterministic", "factor")."""
        return {n: s for n, s in self.sites.items() if s.kind == kind}

    @property
    def latent_values(self) -> dict[str, Any]:
        """The latent sites' values in this run (backend arrays)."""
        return {n: s.value for n, s in self.of_kind("latent").items()}

    @property
    def params(self) -> dict[str, Any]:
        """The ``bdl.param`` sites' values (their ``init``)."""
        return {n: s.value for n, s in self.of_kind("param").items()}

    @property
    def observed_plates(self) -> dict[str, int]:
        """The plates around observed sites (the plates the data is read through) -> size."""
        return {f.name: f.size for s in self.of_kind("observed").values() for f in s.plates}

    @property
    def data_plate(self) -> str | None:
        """The one plate around the observed sites, when no latent site sits in it: the model's
        latents are then global, and a run that needs no likelihood (prior draws, replays of
        values) can run on one point of it. None otherwise."""
        latent = {f.name for s in self.of_kind("latent").values() for f in s.plates}
        plates = set(self.observed_plates)
        return next(iter(plates)) if len(plates) == 1 and not plates & latent else None

    def one_point(self) -> dict[str, np.ndarray] | None:
        """``{data plate: [0]}``: a batch that runs the data plate on its first point only."""
        plate = self.data_plate
        return None if plate is None else {plate: np.zeros(1, np.int64)}


def record_model(bound, backend, seed: int = 0) -> ModelTrace:
    """Run ``bound`` once on ``backend`` with validation on; return the run as a
    :class:`ModelTrace` (see the module docstring for an example)."""
    run = _validating_run(bound, backend, seed=seed)
    return ModelTrace(bound, backend, run.sites, dict(run.plates_seen), seed)


def trace_model(
    bound,
    backend,
    seed: int = 0,
    missing: str = "uniform",
    values=None,
    validate=True,
    batch: dict | None = None,
    check_bounds: bool = True,
    local: frozenset = frozenset(),
):
    """Run ``bound`` once on ``backend`` with validation on; return its sites by name.

    ``batch`` (plate name -> indices) runs the plate on a subset, as a minibatch does; the
    ``local`` latent sites' ``values`` are given for the subset's points only.
    ``check_bounds`` reruns it with bounds-checked indexing where the backend clamps gathers.

    Example
    -------
    >>> import ppl_bdl as bdl
    >>> from ppl_bdl import dist
    >>> @bdl.model
    ... def m():
    ...     bdl.sample("s", dist.HalfNormal(1.0), shape=(2,))
    >>> sites = trace_model(m(), bdl.backends.get("numpyro"))
    >>> sites["s"].kind, sites["s"].shape.value
    ('latent', (2,))
    """
    return _validating_run(
        bound, backend, seed, missing, values, validate, batch, check_bounds, local
    ).sites


def _validating_run(
    bound,
    backend,
    seed: int = 0,
    missing: str = "uniform",
    values=None,
    validate=True,
    batch: dict | None = None,
    check_bounds: bool = True,
    local: frozenset = frozenset(),
) -> Evaluator:
    if not isinstance(bound, BoundModel):
        raise ModelError(unbound_message(bound))
    with backend.scope():
        key = backend.random.key(seed)
        ev = Evaluator(
            backend,
            key=key,
            missing=missing,
            values=values,
            validate=validate,
            record=True,
            batch=None
            if batch is None
            else {k: backend.asarray(v, "int") for k, v in batch.items()},
            local=local,
        )
        try:
            bound.run_with(ev)
            if validate and check_bounds and not backend.checks_index_bounds:
                _check_bounds(bound, backend, ev)
        except (ModelError, IndexError) as err:
            if "out of bounds" not in str(err) or not ev.plates_seen:
                raise
            raise _read_past_the_end(bound, ev, err) from err
    if not any(site.kind in ("latent", "observed") for site in ev.sites.values()):
        raise ModelError(
            f"model {bound.name!r} returned before sampling anything: it has no sample sites. Call "
            "bdl.sample(...) before any return statement."
        )
    return ev


def _check_bounds(bound, backend, recorded: Evaluator) -> None:
    """Run the model again with bounds-checked indexing (JAX clamps an out-of-range gather: data
    shorter than its plate would be read past its end without an error). The latents, params
    and data are the check's arguments, so a compiled check does not bake them in, and a second
    fit of the same model with data of the same shapes reuses it (the backend's program cache)."""

    values = {n: s.value for n, s in recorded.sites.items() if s.kind == "latent"}
    params = {n: s.value for n, s in recorded.sites.items() if s.kind == "param"}
    arrays, template = bound.data_arrays(backend)
    batch = recorded.batch

    def run(values, params, arrays):
        ev = Evaluator(backend, values=values, params=params, batch=batch)
        bound.run_with(ev, data=fill_data(template, arrays))
        return ev.log_joint

    def key() -> tuple:
        shapes = {n: tuple(v.shape) for n, v in {**values, **params}.items()}
        indices = {n: cache.array_value_key(backend.to_numpy(v)) for n, v in (batch or {}).items()}
        return (
            "bounds check",
            cache.same(bound.model),
            cache.same(backend),
            cache.structure_key(template),
            cache.shapes_key(arrays),
            cache.structure_key(sorted(shapes.items())),
            cache.structure_key(sorted(indices.items())),
        )

    program_key = cache.keyed(key)
    if program_key is None:
        checked = backend.bounds_checked(run)
    else:
        checked = cache.programs(backend).get(program_key, lambda: backend.bounds_checked(run))
    checked(values, params, arrays)


def _read_past_the_end(bound, ev: Evaluator, err: BaseException) -> DataError:
    # The run that found it: this one (torch raises as the model reads), or, where the
    # backend checks the bounds in a run of its own, none (the site comes from its frames).
    runtime = ev if isinstance(err, ModelError) else None
    return read_past_the_end(bound, runtime, err, dict(ev.plates_seen))
