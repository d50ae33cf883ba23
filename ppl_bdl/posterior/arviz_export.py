"""Posterior -> ArviZ: InferenceData on ArviZ 0.x, xarray DataTree on ArviZ 1.x."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

#: The ArviZ groups a Posterior reads and writes, in order.
GROUPS = ("posterior", "sample_stats", "log_likelihood", "observed_data", "posterior_predictive")


@contextlib.contextmanager
def quiet_arviz():
    """ArviZ's one-chain shape check, which it logs (not warns) on every call, silenced: R-hat is
    left out where there is one chain, and ESS of one chain is still well defined."""
    import arviz

    # ArviZ 0.x logs through its own Logger instance (``arviz._log``, not the registered one).
    loggers = [getattr(arviz, "_log", None), logging.getLogger("arviz")]
    loggers = [lg for lg in loggers if isinstance(lg, logging.Logger)]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def arviz_major() -> int:
    import arviz

    return int(arviz.__version__.split(".")[0])


def _dims_for(values: dict[str, np.ndarray], dims: dict[str, list[str]]) -> dict[str, list[str]]:
    """Dims for each variable, trimmed to the variable's own rank (log-likelihoods drop events)."""
    out = {}
    for name, array in values.items():
        rank = np.ndim(array) - 2
        names = list(dims.get(name, []))[:rank]
        names += [f"{name}_dim_{i}" for i in range(len(names), rank)]
        out[name] = names
    return out


def _obs_dims(values: dict[str, np.ndarray], dims: dict[str, list[str]]) -> dict[str, list[str]]:
    return {name: list(dims.get(name, []))[: np.ndim(v)] for name, v in values.items()}


def _groups_and_dims(posterior, posterior_predictive):
    groups = {
        "posterior": posterior.samples,
        "sample_stats": posterior.sample_stats,
        "log_likelihood": posterior.log_likelihood,
        "observed_data": posterior.observed_data,
    }
    if posterior_predictive:
        groups["posterior_predictive"] = posterior_predictive
    # dict(): the log-likelihood may be a lazy mapping, computed here (ArviZ wants plain dicts)
    groups = {k: dict(v) for k, v in groups.items() if v}
    dims: dict[str, dict[str, list[str]]] = {}
    for group, values in groups.items():
        if group == "observed_data":
            dims[group] = _obs_dims(values, posterior.dims)
        elif group == "sample_stats":
            dims[group] = {name: [] for name in values}
        else:
            dims[group] = _dims_for(values, posterior.dims)
    return groups, dims


def _attrs(posterior) -> dict[str, str]:
    return {
        "inference_library": "ppl_bdl",
        "ppl_bdl_backend": posterior.backend,
        "ppl_bdl_method": posterior.method,
        "ppl_bdl_precision": posterior.precision,
        "ppl_bdl_model": posterior.model_name,
        "ppl_bdl_latent": ",".join(posterior.latent_names),
        "ppl_bdl_settings": to_json(getattr(posterior, "settings", None) or {}),
        "ppl_bdl_diagnostics": to_json(
            [dataclasses.asdict(f) for f in getattr(posterior, "diagnostics", ())]
        ),
    }


def to_json(value: Any) -> str:
    """JSON text of fit settings: NumPy arrays become lists, NumPy scalars numbers, anything else
    that JSON cannot hold (a guide function, a schedule object) its ``repr``."""

    def fallback(obj: Any) -> Any:
        if isinstance(obj, np.ndarray):
            return obj.tolist()
        if isinstance(obj, np.generic):
            return obj.item()
        if isinstance(obj, set | frozenset):
            return sorted(obj, key=repr)
        return repr(obj)

    return json.dumps(value, default=fallback, sort_keys=True)


def to_datatree(posterior, posterior_predictive: dict[str, np.ndarray] | None = None):
    """The ArviZ 1.x layout: an ``xarray.DataTree`` with one child per group (chain, draw dims)."""
    import xarray as xr

    groups, dims = _groups_and_dims(posterior, posterior_predictive)
    children = {}
    for group, values in groups.items():
        lead = [] if group == "observed_data" else ["chain", "draw"]
        data_vars = {name: (lead + dims[group][name], np.asarray(v)) for name, v in values.items()}
        ds = xr.Dataset(data_vars)
        if lead:
            ds = ds.assign_coords(
                chain=np.arange(ds.sizes["chain"]), draw=np.arange(ds.sizes["draw"])
            )
        children[group] = ds
    children["posterior"].attrs.update(_attrs(posterior))
    return xr.DataTree.from_dict(children)


def to_arviz(posterior, posterior_predictive: dict[str, np.ndarray] | None = None) -> Any:
    """Build the ArviZ object of ``posterior`` (groups posterior, sample_stats, log_likelihood,
    observed_data, and posterior_predictive when given): ``InferenceData`` on ArviZ 0.x, the
    ``DataTree`` of :func:`to_datatree` on ArviZ 1.x."""
    if arviz_major() >= 1:  # pragma: no cover - ArviZ 1.x needs Python >= 3.12
        return to_datatree(posterior, posterior_predictive)
    import arviz as az

    groups, dims = _groups_and_dims(posterior, posterior_predictive)
    flat_dims = {}
    for group_dims in dims.values():
        for name, names in group_dims.items():
            flat_dims.setdefault(name, names)
    with warnings.catch_warnings():  # an ensemble has more chains (members) than draws (one)
        warnings.filterwarnings("ignore", "More chains", UserWarning)
        idata = az.from_dict(**groups, dims=flat_dims)
    idata.posterior.attrs.update(_attrs(posterior))
    return idata


def datasets(data: Any) -> dict[str, Any]:
    """The groups of an ``InferenceData``, a ``DataTree`` or a mapping, as ``{name: Dataset}``."""
    if isinstance(data, Mapping):
        return dict(data)
    if hasattr(data, "children"):  # DataTree (ArviZ 1.x)
        return {name: data[name].to_dataset() for name in data.children}
    return {name: getattr(data, name) for name in data.groups()}


def from_arviz(data: Any) -> dict[str, Any]:
    """Read groups back from an InferenceData / DataTree (or ``{group: Dataset}``) as dicts of
    NumPy arrays; ``dims`` names every variable's dims (chain and draw left out) from every group,
    ``attrs`` holds the posterior group's attributes."""
    groups = datasets(data)
    out: dict[str, Any] = {"dims": {}, "attrs": {}}
    for group in GROUPS:
        if group not in groups:
            continue
        ds = groups[group]
        out[group] = {name: np.asarray(ds[name].values) for name in ds.data_vars}
        if group != "sample_stats":
            for name in ds.data_vars:
                dims = [str(d) for d in ds[name].dims if d not in ("chain", "draw")]
                known = out["dims"].get(name, [])
                # An observed site's log-likelihood drops its event dims; observed_data has them.
                if len(dims) > len(known):
                    out["dims"][name] = dims
        if group == "posterior":
            out["attrs"] = dict(ds.attrs)
    return out
