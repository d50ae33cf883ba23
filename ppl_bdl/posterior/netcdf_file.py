"""The file a posterior is saved to: one NetCDF file that keeps everything a fit has, and its
writer (:meth:`ppl_bdl.Posterior.save`; :func:`ppl_bdl.load` reads it back).

The file holds the ArviZ groups (posterior, sample_stats, log_likelihood, observed_data), so
``arviz.from_netcdf`` reads it like any InferenceData, and two groups of ppl_bdl's own:
``params`` (the model's ``bdl.param`` values, fitted as point estimates by VI) and ``vi`` (the
losses and the fitted guide's parameters). The posterior group's attributes hold the fit settings,
every site's dims, and the model's signature: its name and its latent sites and params with their
shapes.

Example
-------
>>> import tempfile, os, ppl_bdl as bdl
>>> from ppl_bdl import dist
>>> from ppl_bdl.posterior.netcdf_file import signature
>>> @bdl.model
... def m():
...     bdl.sample("mu", dist.Normal(0.0, 1.0), shape=(2,))
>>> post = bdl.fit(m(), num_warmup=50, num_samples=50, num_chains=1, progress=False)
>>> signature(post)
{'model': 'm', 'latent': {'mu': [2]}, 'params': {}}
>>> path = post.save(os.path.join(tempfile.mkdtemp(), "post.nc"))
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ppl_bdl.posterior.arviz_export import datasets, to_json

#: The version of the file layout below; a newer file is refused with a clear error.
FORMAT_VERSION = 1
#: The group holding the model's ``bdl.param`` values.
PARAMS_GROUP = "params"
#: The group of a saved VI posterior holding its losses and the fitted guide's parameters.
VI_GROUP = "vi"
#: What :func:`load` expects, for its error messages.
EXPECTED = "a NetCDF file written by ppl_bdl's Posterior.save"


def save(post, path: str | Path) -> Path:
    """Write ``post`` (a :class:`~ppl_bdl.posterior.posterior.Posterior`) to one NetCDF file (see the
    module docstring for what it keeps).

    The file is written next to ``path`` and moved over it at the end, so a failed save never
    leaves a truncated file behind.
    """
    path = Path(path)
    groups = datasets(post.to_arviz())
    groups["posterior"].attrs.update(
        {
            "ppl_bdl_format": FORMAT_VERSION,
            "ppl_bdl_dims": to_json(post.dims),
            "ppl_bdl_signature": to_json(signature(post)),
        }
    )
    if post.params:
        groups[PARAMS_GROUP] = _params_dataset(post.params)
    vi = _vi_dataset(post)
    if vi is not None:
        groups[VI_GROUP] = vi
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        for i, (name, ds) in enumerate(groups.items()):
            encoding = {k: {"zlib": True} for k, v in ds.variables.items() if v.dtype.kind in "iuf"}
            ds.to_netcdf(
                tmp, mode="w" if i == 0 else "a", group=name, engine="h5netcdf", encoding=encoding
            )
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def signature(post) -> dict[str, Any]:
    """What a model must have to go with ``post``: its name, and the shapes of its latent sites
    and params (JSON-ready)."""
    return {
        "model": post.model_name,
        "latent": {
            n: list(post.samples[n].shape[2:]) for n in post.latent_names if n in post.samples
        },
        "params": {n: list(np.shape(v)) for n, v in post.params.items()},
    }


def _params_dataset(params: dict):
    import xarray as xr

    return xr.Dataset(
        {
            name: ([f"{name}_dim_{i}" for i in range(np.ndim(v))], np.asarray(v))
            for name, v in params.items()
        }
    )


def _vi_dataset(post):
    if post.losses is None and post.guide is None:
        return None
    import xarray as xr

    data_vars, attrs = {}, {}
    if post.losses is not None:
        losses = np.asarray(
            post.losses, dtype=float
        )  # (fit, step): several VI fits, an ensemble's members
        data_vars["losses"] = (("fit", "step")[2 - losses.ndim :], losses)
    if post.guide is not None:
        fits = post.guide if isinstance(post.guide, list) else None
        first = fits[0] if fits else post.guide
        phi = np.stack([g.phi for g in fits]) if fits else np.asarray(first.phi)
        data_vars["guide_params"] = (("fit", "guide_param")[2 - phi.ndim :], phi.astype(float))
        attrs["guide"] = first.name
        attrs["guide_settings"] = to_json(first.settings)
    return xr.Dataset(data_vars, attrs=attrs)
