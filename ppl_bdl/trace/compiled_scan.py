"""``bdl.scan`` run by the core's evaluator as one compiled loop (the backend's :meth:`scan`).

The step function is traced once (``jax.lax.scan`` on NumPyro) instead of once per step, so a
compiled log density costs the same to build for T = 10,000 as for T = 10. Inside the step each
site the step samples reads its value at step t from the stacked values (shape ``(T, ...)``,
handed to the loop as one of its inputs, sliced by the loop), each draw uses its own random key,
and what a step adds to the log density, and (in a recorded run) each site's value, log density
and moments, leave the loop as stacked outputs: their sum over the steps is added after the loop,
and the stacked site is the one the Python loop records.

:class:`~ppl_bdl.trace.interpreter.Evaluator` falls back to the Python loop where the step
cannot be run this way (see :func:`ppl_bdl.dsl.control_flow.scan`).

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import dist
>>> from ppl_bdl.trace.interpreter import Evaluator
>>> @bdl.model
... def walk(y):
...     sigma = bdl.sample("sigma", dist.HalfNormal(1.0))
...     def step(prev, y_t):
...         bdl.sample("y", dist.Normal(prev, sigma), obs=y_t)
...         return y_t, None
...     bdl.scan(step, 0.0, y)
>>> backend = bdl.backends.get("numpyro")
>>> ev = Evaluator(backend, values={"sigma": backend.asarray(1.0)}, record=True)
>>> _ = walk(np.array([0.0, 1.0])).run_with(ev)
>>> round(float(ev.log_joint), 4), ev.sites["y"].log_prob.shape
(-3.0637, (2,))
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ppl_bdl.dsl.sites import SiteShape
from ppl_bdl.errors import DataError, ModelError

#: The value tables of an evaluator whose entries a step reads at its own step.
TABLES = ("unconstrained", "values", "observed")
#: The moments of a site's distribution that prediction summarises.
MOMENTS = ("mean", "variance", "probs")


def step_tables(evaluator, length: int) -> dict:
    """The entries of the evaluator's value tables with a leading axis of ``length``: the values
    of sites the step may sample, sliced by the loop (a site outside it is read whole)."""
    return {
        table: {
            name: value
            for name, value in getattr(evaluator, table).items()
            if len(getattr(value, "shape", ())) > 0 and int(value.shape[0]) == length
        }
        for table in TABLES
    }


def run_compiled(evaluator, f, init, xs, length: int, name: str):
    """Run ``bdl.scan`` with the backend's loop; the evaluator's accumulators (``log_joint``,
    ...) gain the steps' sum and its ``sites`` the stacked sites. Returns ``(carry, ys)``."""
    ev, backend = evaluator, evaluator.backend
    keys = None
    if ev.key is not None:
        ev.key, sub = backend.random.split(ev.key)
        keys = backend.random.keys(sub, length)
    outer = {a: getattr(ev, a) for a in ev.accumulators}
    templates: dict = {}

    def body(carry, packed):
        x, tables, key = packed
        ev._step_slices, ev._step_records = tables, {}
        # A loop that calls the step once per step (torch) sees its names afresh at each.
        ev._names = {n for n in ev._names if not isinstance(n, tuple)}
        if key is not None:
            ev.key = key
        for a in ev.accumulators:
            setattr(ev, a, 0.0)
        out = f(carry, x)
        if not (isinstance(out, tuple) and len(out) == 2):
            raise ModelError(
                "bdl.scan: the step function must return a pair (carry, y) (y may be None), got "
                f"{type(out).__name__}."
            )
        templates.clear()
        templates.update({n: records[0] for n, records in ev._step_records.items()})
        added = {a: _array(backend, getattr(ev, a)) for a in ev.accumulators}
        sites = {n: _outputs(backend, r) for n, r in templates.items()}
        return out[0], (out[1], added, sites)

    ev._step = (name, None)
    try:
        packed = (xs, step_tables(ev, length), keys)
        carry, (ys, added, sites) = backend.scan(body, init, packed, length)
    finally:
        ev._step, ev._step_slices, ev._step_records = None, None, {}
    for a in ev.accumulators:
        setattr(ev, a, outer[a] + backend.math.sum(added[a], axis=0))
    ev._close_step_names(name, 1)
    for site, record in templates.items():
        ev.sites[site] = _stacked(backend, record, sites[site], name, length)
    return carry, ys


def check_stacked_observations(evaluator) -> None:
    """The checks of a validating run on every step's observed values at once (the first step
    was run with every check on): finite values inside the support."""
    backend = evaluator.backend
    for name, site in evaluator.sites.items():
        if site.kind != "observed" or "scan" not in site.extra:
            continue
        array = backend.to_numpy(site.value)
        finite = np.isfinite(array)
        if not finite.all():
            first = tuple(int(i) for i in np.argwhere(~finite)[0])
            raise DataError(
                f"observed site {name!r} (stacked over bdl.scan {site.extra['scan']!r}): obs holds "
                f"{array[first]} at index {first}. Remove or impute missing values before fitting."
            )
        error = site.spec.support_violation(array)
        if error:
            raise DataError(
                f"observed site {name!r} (stacked over bdl.scan {site.extra['scan']!r}): obs "
                f"{error}. Fix the data, or choose a distribution whose support holds these values."
            )


class StackedMoments:
    """The distribution of a site stacked by a compiled scan, as prediction reads it: the
    support and shapes of one step's, its moments stacked along the time axis."""

    def __init__(self, native, length: int, moments: dict):
        self.support = native.support
        self.event_shape = tuple(native.event_shape)
        self.batch_shape = (length,) + tuple(native.batch_shape)
        self.has_enumerate_support = getattr(native, "has_enumerate_support", False)
        self._moments = moments

    def __getattr__(self, attribute: str):
        if attribute in MOMENTS and attribute in self.__dict__.get("_moments", {}):
            return self._moments[attribute]
        raise AttributeError(f"the stacked distribution has no {attribute!r}")


def _array(backend, value):
    return value if backend.is_array(value) else backend.asarray(value)


def _outputs(backend, record) -> dict:
    """What leaves the loop of one step's record: value, log density, moments (where defined)."""
    out = {"value": _array(backend, record.value)}
    if record.log_prob is not None:
        out["log_prob"] = _array(backend, record.log_prob)
    if record.native is not None:
        moments = {}
        for attribute in MOMENTS:
            try:
                moments[attribute] = _array(backend, getattr(record.native, attribute))
            except Exception:  # noqa: BLE001 - a family without this moment
                continue
        out["moments"] = moments
    return out


def _stacked(backend, record, outputs: dict, scan_name: str, length: int):
    """The stacked site: the step's record with its arrays stacked over the steps."""
    shape = record.shape
    if shape is not None:
        shape = SiteShape((length,) + shape.batch, shape.extra, shape.event)
    native = None
    if record.native is not None:
        native = StackedMoments(record.native, length, outputs["moments"])
    return replace(
        record,
        value=outputs["value"],
        native=native,
        shape=shape,
        log_prob=outputs.get("log_prob"),
        extra={"scan": scan_name, "steps": length, "step_shape": record.shape},
    )
