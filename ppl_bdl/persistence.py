"""Saving and loading posteriors: NetCDF through ArviZ, with a VI posterior's guide and losses.

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

from .posterior import Posterior, from_arviz_data


def save(post: Posterior, path: str | Path) -> Path:
    """Write ``post`` to NetCDF through ArviZ.

    A VI posterior also keeps its losses and the fitted guide's parameters (group ``vi``);
    ``load(path, model=...)`` rebuilds the guide of a built-in guide from them.
    """
    path = Path(path)
    data = post.to_arviz()
    vi = _vi_dataset(post)
    if vi is not None:
        if hasattr(data, "children"):  # pragma: no cover - ArviZ 1.x needs Python >= 3.12
            import xarray as xr

            data[VI_GROUP] = xr.DataTree(vi)
        else:
            data.add_groups({VI_GROUP: vi}, warn_on_custom_groups=False)
    data.to_netcdf(str(path))
    return path


#: The group of a saved VI posterior holding its losses and the fitted guide's parameters.
VI_GROUP = "vi"


def _vi_dataset(post: Posterior):
    if post.losses is None and post.guide is None:
        return None
    import xarray as xr

    data_vars, attrs = {}, {}
    if post.losses is not None:
        data_vars["losses"] = (("step",), np.asarray(post.losses, dtype=float))
    if post.guide is not None:
        data_vars["guide_params"] = (("guide_param",), np.asarray(post.guide.phi, dtype=float))
        attrs["guide"] = post.guide.name
        attrs["guide_settings"] = json.dumps(post.guide.settings, default=str)
    return xr.Dataset(data_vars, attrs=attrs)


def load(path: str | Path, model: Any = None) -> Posterior:
    """Read a posterior written by :meth:`Posterior.save`.

    For a VI posterior the losses come back as ``post.losses``; pass the bound ``model`` it was
    fitted to (``model(X, y)``) to get ``post.guide`` back too (built-in guides; a custom
    ``@bdl.guide`` is not rebuilt). The model also enables ``post.predict``.

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
    >>> vi = bdl.fit(m(), method="vi", guide="lowrank", rank=1, num_steps=200, num_samples=20,
    ...              progress=False)
    >>> back = bdl.load(vi.save(os.path.join(tempfile.mkdtemp(), "vi.nc")), model=m())
    >>> back.guide.name, back.losses.shape, np.allclose(back.guide.phi, vi.guide.phi)
    ('lowrank', (200,), True)
    """
    from .arviz_export import arviz_major

    if arviz_major() >= 1:  # pragma: no cover - ArviZ 1.x needs Python >= 3.12
        import xarray

        data = xarray.open_datatree(str(path))
    else:
        import arviz as az

        data = az.from_netcdf(str(path))
    post = from_arviz_data(data)
    vi = _read_vi_group(data)
    if vi is not None:
        post.losses = np.asarray(vi["losses"].values) if "losses" in vi else None
        if model is not None and "guide_params" in vi:
            post.guide = _rebuild_guide(post, model, vi)
    if model is not None:
        post.model = model
    return post


def _read_vi_group(data):
    if hasattr(data, "children"):  # pragma: no cover - ArviZ 1.x needs Python >= 3.12
        return data[VI_GROUP].to_dataset() if VI_GROUP in data.children else None
    return getattr(data, VI_GROUP, None)


def _rebuild_guide(post: Posterior, model: Any, vi) -> Any:
    """The fitted guide of a saved VI posterior, rebuilt on ``model`` from its parameters."""
    from . import guides as guide_registry
    from .errors import ConfigError
    from .guides.base import FittedGuide, GuideInit
    from .inference.common import prepare
    from .inference.vi import build_guide

    name = str(vi.attrs.get("guide", ""))
    if name not in guide_registry.available():
        return None  # a custom @bdl.guide: its function is not saved
    setup = prepare(model, post.backend or None, post.precision, 0)
    phi = np.asarray(vi["guide_params"].values)
    dim = setup.layout.dim
    init = GuideInit(loc=np.zeros(dim), prior_scale=np.ones(dim))
    settings = json.loads(str(vi.attrs.get("guide_settings", "{}")))
    guide = build_guide(setup, name, init, 0, settings)
    if guide.param_layout.size != phi.size:
        raise ConfigError(
            f"the saved {name!r} guide has {phi.size} parameters; on this model it would have "
            f"{guide.param_layout.size}. Pass the model (and data shapes) it was fitted to."
        )
    return FittedGuide(guide, phi, settings=settings)
