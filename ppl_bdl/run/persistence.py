"""Saving and loading posteriors: one NetCDF file that keeps everything a fit has.

``post.save(path)`` writes the file (:mod:`ppl_bdl.posterior.netcdf_file`, which says what it holds);
``load(path, model=...)`` reads it back, refuses a model that does not match the saved signature
(its name and its latent sites and params with their shapes), and rebuilds a built-in VI guide
through the guide registry. A file that ppl_bdl did not write is refused with a
:class:`~ppl_bdl.errors.DataError` naming it.

Example
-------
>>> import tempfile, os, numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import dist
>>> @bdl.model
... def m():
...     bdl.sample("mu", dist.Normal(0.0, 1.0))
>>> post = bdl.fit(m(), num_warmup=50, num_samples=50, num_chains=1, progress=False)
>>> path = post.save(os.path.join(tempfile.mkdtemp(), "post.nc"))
>>> np.allclose(bdl.load(path).samples["mu"], post.samples["mu"])
True
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ppl_bdl.backends import available
from ppl_bdl.errors import DataError, ModelError
from ppl_bdl.inference.setup import prepare
from ppl_bdl.inference.vi import guides
from ppl_bdl.inference.vi.guides.base import FittedGuide, GuideInit
from ppl_bdl.posterior.arviz_export import GROUPS
from ppl_bdl.posterior.netcdf_file import (
    EXPECTED,
    FORMAT_VERSION,
    PARAMS_GROUP,
    VI_GROUP,
    save,
    signature,
)
from ppl_bdl.posterior.posterior import Posterior, from_arviz_data

__all__ = ["EXPECTED", "check_model", "load", "model_signature", "save", "signature"]


def load(path: str | Path, model: Any = None) -> Posterior:
    """Read a posterior written by :meth:`Posterior.save`.

    Everything saved comes back: draws, sample stats, log-likelihoods, observed data, dims,
    the model's params, the fit settings and, for VI, the losses. Pass the bound ``model`` it was
    fitted to (``model(X, y)``) to check it against the saved one (name, latent sites and params
    with their shapes: a mismatch raises :class:`~ppl_bdl.errors.ModelError`), to get a built-in
    VI guide back as ``post.guide`` (a custom ``@bdl.guide`` is not rebuilt), and to make
    ``post.to_arviz(posterior_predictive=True)`` work. A file ppl_bdl did not write, or a
    damaged one, raises :class:`~ppl_bdl.errors.DataError`.

    Example
    -------
    >>> import tempfile, os, numpy as np, ppl_bdl as bdl
    >>> from ppl_bdl import dist
    >>> @bdl.model
    ... def m():
    ...     bdl.sample("mu", dist.Normal(0.0, 1.0))
    >>> vi = bdl.fit(m(), method="vi", guide="lowrank", rank=1, num_steps=200, num_samples=20,
    ...              progress=False)
    >>> back = bdl.load(vi.save(os.path.join(tempfile.mkdtemp(), "vi.nc")), model=m())
    >>> back.guide.name, back.losses.shape, np.allclose(back.guide.phi, vi.guide.phi)
    ('lowrank', (200,), True)
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no posterior file at {path}: expected {EXPECTED}.")
    groups = _read_groups(path)
    attrs = _check_ours(path, groups)
    post = from_arviz_data({g: groups[g] for g in GROUPS if g in groups})
    post.dims.update(_json_attr(path, attrs, "ppl_bdl_dims", {}))
    if PARAMS_GROUP in groups:
        ds = groups[PARAMS_GROUP]
        post.params = {name: np.asarray(ds[name].values) for name in ds.data_vars}
    vi = groups.get(VI_GROUP)
    if vi is not None and "losses" in vi:
        post.losses = np.asarray(vi["losses"].values)
    if model is None:
        return post
    setup = _prepare(post, model)
    saved = _json_attr(path, attrs, "ppl_bdl_signature", None) or _old_signature(post)
    check_model(saved, setup, path)
    post.model = model
    if vi is not None and "guide_params" in vi:
        post.guide = _rebuild_guide(setup, vi, path)
    return post


def _read_groups(path: Path) -> dict[str, Any]:
    """Every group of the file, loaded into memory; a DataError for anything unreadable."""
    import h5netcdf
    import xarray as xr

    try:
        with h5netcdf.File(path, "r") as f:
            names = list(f.groups)
        groups = {}
        for name in names:
            with xr.open_dataset(path, group=name, engine="h5netcdf") as ds:
                groups[name] = ds.load()
    except Exception as err:  # noqa: BLE001 - h5py/netCDF raise many types for a bad file
        raise DataError(
            f"{path} could not be read: expected {EXPECTED}, but reading it failed with "
            f"{type(err).__name__}: {err}. The file is damaged (truncated?) or of another format."
        ) from err
    return groups


def _check_ours(path: Path, groups: dict) -> dict:
    posterior = groups.get("posterior")
    writer = None if posterior is None else posterior.attrs.get("inference_library")
    if writer != "ppl_bdl":
        what = f"groups {sorted(groups)}" if groups else "no groups"
        by = f", written by {writer!r}" if writer else ""
        raise DataError(
            f"{path} is not a ppl_bdl posterior: expected {EXPECTED}, found a file with {what}{by}. "
            "Read other ArviZ files with arviz.from_netcdf."
        )
    attrs = dict(posterior.attrs)
    version = int(attrs.get("ppl_bdl_format", 0))
    if version > FORMAT_VERSION:
        raise DataError(
            f"{path} was written in ppl_bdl's file format {version}; this version reads up to "
            f"{FORMAT_VERSION}. Upgrade ppl_bdl to read it."
        )
    return attrs


def _json_attr(path: Path, attrs: dict, key: str, default: Any) -> Any:
    if key not in attrs:
        return default
    try:
        return json.loads(str(attrs[key]))
    except ValueError as err:
        raise DataError(f"{path}: the attribute {key!r} is not valid JSON ({err}).") from err


def _old_signature(post: Posterior) -> dict[str, Any]:
    """Files from before the signature was saved: latent shapes from the draws, params unknown."""
    sig = signature(post)
    del sig["params"]
    return sig


def _prepare(post: Posterior, model: Any):
    backend = post.backend or available()[0]
    return prepare(model, backend, post.precision or "float32", 0)


def model_signature(setup) -> dict[str, Any]:
    """The signature (see :func:`signature`) of a prepared model."""
    return {
        "model": setup.bound.name,
        "latent": {slot.name: list(slot.shape) for slot in setup.layout.slots},
        "params": {n: list(np.shape(setup.backend.to_numpy(v))) for n, v in setup.params.items()},
    }


def check_model(saved: dict[str, Any], setup, path: str | Path = "the file") -> None:
    """Raise a ModelError naming every difference between the saved signature and the model's."""
    found = model_signature(setup)
    problems = []
    if saved.get("model") and saved["model"] != found["model"]:
        problems.append(f"the posterior is of model {saved['model']!r}, not {found['model']!r}")
    for kind, label in (("latent", "latent site"), ("params", "param")):
        if kind not in saved:
            continue
        have, want = found[kind], saved[kind]
        lacks = [n for n in want if n not in have]
        extra = [n for n in have if n not in want]
        if lacks:
            problems.append(f"the model lacks the saved {label}(s) {lacks}")
        if extra:
            problems.append(f"the model has {label}(s) {extra} that the posterior does not")
        for n in want:
            if n in have and list(want[n]) != list(have[n]):
                problems.append(
                    f"{label} {n!r} has shape {tuple(have[n])} in the model but "
                    f"{tuple(want[n])} in the posterior"
                )
    if problems:
        raise ModelError(
            f"{path}: the model passed to load does not match the saved posterior: "
            + "; ".join(problems)
            + ". Pass the model it was fitted to, bound to data of the same shapes."
        )


def _rebuild_guide(setup, vi, path: Path) -> Any:
    """The fitted guide of a saved VI posterior, rebuilt on the (checked) model from its
    parameters; None for a custom ``@bdl.guide`` (its function is not saved). The guide comes
    from the registry, with the settings it was fitted with (checked when it was fitted)."""
    name = str(vi.attrs.get("guide", ""))
    if name not in guides.available():
        return None  # a custom @bdl.guide: its function is not saved
    phi = np.asarray(vi["guide_params"].values)
    dim = setup.layout.dim
    init = GuideInit(loc=np.zeros(dim), prior_scale=np.ones(dim))
    settings = _json_attr(path, dict(vi.attrs), "guide_settings", {})
    guide = guides.get(name)(setup.layout, setup.backend, init, seed=0, **settings)
    if guide.param_layout.size != phi.shape[-1]:
        raise DataError(
            f"{path}: the saved {name!r} guide has {phi.shape[-1]} parameters, but with its "
            f"settings {settings} on this model it has {guide.param_layout.size}: the file is "
            "damaged."
        )
    if phi.ndim == 2:  # several fits (num_chains): one guide each
        return [FittedGuide(guide, row, settings=settings) for row in phi]
    return FittedGuide(guide, phi, settings=settings)
