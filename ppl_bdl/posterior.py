"""The result of every inference method: draws, diagnostics, ArviZ export, prediction, saving."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


@dataclass
class Posterior:
    """Posterior draws of a model, the same object whatever the method and backend.

    Attributes
    ----------
    samples : dict
        Site name -> array shaped (chain, draw, *site_shape), latent and deterministic sites.
    sample_stats : dict
        Per-draw statistics (divergences, tree depth, step size, ...) shaped (chain, draw).
    log_likelihood : dict
        Observed site -> pointwise log-likelihood shaped (chain, draw, *points).
    observed_data : dict
        Observed site -> the data it was conditioned on.
    guide, losses
        For VI: the fitted guide and the loss (negative objective) per step.

    Example
    -------
    >>> import numpy as np, ppl_bdl as bdl
    >>> from ppl_bdl import dist
    >>> @bdl.model
    ... def m(y):
    ...     mu = bdl.sample("mu", dist.Normal(0.0, 1.0))
    ...     with bdl.plate("data", y.shape[0]) as idx:
    ...         bdl.sample("y", dist.Normal(mu, 1.0), obs=y[idx])
    >>> post = bdl.fit(m(np.zeros(3)), num_warmup=100, num_samples=100, num_chains=1, progress=False)
    >>> sorted(post.to_arviz().groups())
    ['log_likelihood', 'observed_data', 'posterior', 'sample_stats']
    """

    samples: dict[str, np.ndarray]
    sample_stats: dict[str, np.ndarray] = field(default_factory=dict)
    log_likelihood: dict[str, np.ndarray] = field(default_factory=dict)
    observed_data: dict[str, np.ndarray] = field(default_factory=dict)
    dims: dict[str, list[str]] = field(default_factory=dict)
    method: str = ""
    backend: str = ""
    precision: str = "float32"
    model: Any = None
    params: dict[str, np.ndarray] = field(default_factory=dict)
    latent_names: list[str] = field(default_factory=list)
    guide: Any = None
    losses: np.ndarray | None = None
    model_name: str = ""

    def __post_init__(self):
        if self.model is not None and not self.model_name:
            self.model_name = self.model.name
        if not self.latent_names:
            self.latent_names = list(self.samples)

    @property
    def deterministic_names(self) -> list[str]:
        """Names of the deterministic sites in ``samples``."""
        return [n for n in self.samples if n not in self.latent_names]

    @property
    def num_chains(self) -> int:
        return next(iter(self.samples.values())).shape[0]

    @property
    def num_draws(self) -> int:
        return next(iter(self.samples.values())).shape[1]

    def params_for(self, backend) -> dict:
        return {k: backend.asarray(v) for k, v in self.params.items()}

    # -- ArviZ --------------------------------------------------------------------------------
    def to_arviz(self, posterior_predictive: bool = False, seed: int = 0):
        """An ``arviz.InferenceData`` (ArviZ 0.x) or ``xarray.DataTree`` (ArviZ 1.x).

        With ``posterior_predictive=True`` the model is replayed at every draw to fill the
        posterior_predictive group.
        """
        from .arviz_export import to_arviz

        pp = None
        if posterior_predictive:
            pp = self.posterior_predictive_draws(seed=seed)
        return to_arviz(self, posterior_predictive=pp)

    def posterior_predictive_draws(self, seed: int = 0) -> dict[str, np.ndarray]:
        """Replicated observed sites, one per draw, shaped (chain, draw, ...)."""
        if self.model is None:
            raise ValueError(
                "this posterior was loaded from disk without its model; pass it to predict."
            )
        result = self.predict(self.model, seed=seed)
        shape = (self.num_chains, self.num_draws)
        return {
            k: v.reshape(shape + v.shape[1:])
            for k, v in result.draws.items()
            if k in self.observed_data
        }

    def summary(self, **kwargs):
        """``arviz.summary`` of the posterior (mean, sd, HDI, MCSE, ESS, R-hat)."""
        import arviz as az

        return az.summary(self.to_arviz(), **kwargs)

    # -- prediction ---------------------------------------------------------------------------
    def predict(
        self, bound, num_samples: int | None = None, seed: int = 0, site: str | None = None
    ):
        """Posterior predictive at new inputs: ``post.predict(model(X_new))``.

        Returns a :class:`~ppl_bdl.predictive.PredictiveResult` with the draws of each predicted
        site and, per point, the mean and the split of the predictive uncertainty into aleatoric
        and epistemic parts.
        """
        from .predictive import posterior_predictive

        return posterior_predictive(self, bound, num_samples=num_samples, seed=seed, site=site)

    # -- saving -------------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write the posterior to NetCDF through ArviZ; read it back with :func:`ppl_bdl.load`.

        A VI posterior also keeps its losses and the fitted guide's parameters (group ``vi``);
        ``load(path, model=...)`` rebuilds the guide of a built-in guide from them.
        """
        path = Path(path)
        data = self.to_arviz()
        vi = _vi_dataset(self)
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
    setup = prepare(model, post.backend or "numpyro", post.precision, 0)
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


def from_arviz_data(data) -> Posterior:
    """A :class:`Posterior` (without its model) from an InferenceData or DataTree."""
    from .arviz_export import from_arviz

    groups = from_arviz(data)
    attrs = groups.get("attrs", {})
    dims = groups.get("dims", {})
    return Posterior(
        samples=groups.get("posterior", {}),
        sample_stats=groups.get("sample_stats", {}),
        log_likelihood=groups.get("log_likelihood", {}),
        observed_data=groups.get("observed_data", {}),
        dims=dims,
        method=str(attrs.get("ppl_bdl_method", "")),
        backend=str(attrs.get("ppl_bdl_backend", "")),
        precision=str(attrs.get("ppl_bdl_precision", "float32")),
        model_name=str(attrs.get("ppl_bdl_model", "")),
        latent_names=[n for n in str(attrs.get("ppl_bdl_latent", "")).split(",") if n],
    )
