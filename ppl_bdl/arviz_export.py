"""Posterior -> ArviZ: InferenceData on ArviZ 0.x, xarray DataTree on ArviZ 1.x."""

from __future__ import annotations

from typing import Any

import numpy as np


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
    }


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
    idata = az.from_dict(**groups, dims=flat_dims)
    idata.posterior.attrs.update(_attrs(posterior))
    return idata


def from_arviz(data: Any) -> dict[str, Any]:
    """Read groups back from an InferenceData / DataTree as dicts of NumPy arrays."""
    out = {}
    for group in (
        "posterior",
        "sample_stats",
        "log_likelihood",
        "observed_data",
        "posterior_predictive",
    ):
        is_tree = hasattr(data, "children")
        if (group not in data.children) if is_tree else not hasattr(data, group):
            continue
        ds = data[group] if is_tree else getattr(data, group)
        ds = getattr(ds, "dataset", ds)
        out[group] = {name: np.asarray(ds[name].values) for name in ds.data_vars}
        if group == "posterior":
            out["dims"] = {
                name: [d for d in ds[name].dims if d not in ("chain", "draw")]
                for name in ds.data_vars
            }
            out["attrs"] = dict(ds.attrs)
    return out
