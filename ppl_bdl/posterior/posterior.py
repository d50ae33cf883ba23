"""The result of every inference method: draws, diagnostics, ArviZ export, prediction, saving."""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ppl_bdl.errors import ConfigError
from ppl_bdl.posterior import netcdf_file as posterior_file
from ppl_bdl.posterior.arviz_export import from_arviz, quiet_arviz, to_arviz
from ppl_bdl.posterior.diagnostics import Diagnostics, Finding
from ppl_bdl.posterior.held_out import evaluate
from ppl_bdl.posterior.predictive import posterior_predictive
from ppl_bdl.posterior.summary_frame import summary_frame

#: ``arviz.summary``'s columns about a chain's mixing (none apply to one draw per chain).
_MIXING_COLUMNS = ("mcse_mean", "mcse_sd", "ess_bulk", "ess_tail", "r_hat")


@dataclass(repr=False)
class Posterior:
    """Posterior draws of a model, the same object whatever the method and backend.

    Attributes
    ----------
    samples : dict
        Site name -> array shaped ``(chain, draw, *site_shape)``, latent and deterministic sites.
    sample_stats : dict
        Per-draw statistics (divergences, tree depth, step size, ...) shaped (chain, draw).
    log_likelihood : dict
        Observed site -> pointwise log-likelihood shaped ``(chain, draw, *points)``.
    observed_data : dict
        Observed site -> the data it was conditioned on.
    dims : dict
        Site name -> names of its dims after (chain, draw): a plate's dim is named after the plate
        (``"data"``), the others ``{site}_dim_{i}``.
    params : dict
        The model's ``bdl.param`` sites: fitted point estimates after VI, their initial values
        otherwise. :meth:`predict` uses them.
    settings : dict
        The fit's settings (method, backend, precision, device and the method's options), as
        JSON-compatible values; they are saved with the posterior.
    guide, losses
        For VI: the fitted guide and the loss (negative objective) per step; for several fits
        (``num_chains``), the list of fitted guides and the losses shaped (fit, step); for an
        ensemble, the loss per member and step (member, step).
    diagnostics : Diagnostics
        What the checks after the fit found (:mod:`ppl_bdl.posterior.diagnostics`): R-hat, ESS,
        divergences, tree depth, acceptance; VI's loss curve and Pareto k̂. Empty when clean.

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
    settings: dict[str, Any] = field(default_factory=dict)
    diagnostics: Diagnostics = field(default_factory=Diagnostics)

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

    # -- ArviZ --------------------------------------------------------------------------------
    def to_arviz(self, posterior_predictive: bool = False, seed: int = 0):
        """An ``arviz.InferenceData`` (ArviZ 0.x) or ``xarray.DataTree`` (ArviZ 1.x).

        With ``posterior_predictive=True`` the model is replayed at every draw to fill the
        posterior_predictive group.
        """
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
        """``arviz.summary`` of the posterior (mean, sd, HDI, MCSE, ESS, R-hat), as a DataFrame.

        R-hat compares chains, so it is shown only where there are two or more (with one chain,
        VI's draws included, ArviZ would warn and fill the column with NaN); with one draw per
        chain (an ensemble) R-hat, ESS and MCSE are left out. The frame's ``attrs["note"]``
        says so. ``attrs["diagnostics"]`` holds the fit's diagnostics report
        (``self.diagnostics.report()``). The frame (a
        :class:`~ppl_bdl.posterior.summary_frame.SummaryFrame`, a DataFrame) shows the note and the
        report under the table when displayed. Keyword arguments go to ``arviz.summary``.
        """
        import arviz as az  # heavy: imported when first used

        with warnings.catch_warnings(), quiet_arviz():
            warnings.filterwarnings("ignore", category=RuntimeWarning)  # constant sites' MCSE
            frame = az.summary(self.to_arviz(), **kwargs)
        if self.num_draws < 2:  # an ensemble's members: their spread, nothing about mixing
            frame = frame.drop(columns=[c for c in _MIXING_COLUMNS if c in frame.columns])
            frame.attrs["note"] = (
                "one draw per chain (an ensemble's members): mean, sd and HDI are over the "
                "members; R-hat, ESS and MCSE do not apply."
            )
        elif self.num_chains < 2 and "r_hat" in frame.columns:
            frame = frame.drop(columns="r_hat")
            frame.attrs["note"] = "R-hat needs 2 or more chains; this posterior has 1."
        frame.attrs["diagnostics"] = self.diagnostics.report()
        return summary_frame(frame)

    def __repr__(self) -> str:
        """A line: method, backend, chains x draws, the sites with their shapes, diagnostics."""
        if not self.samples:
            return f"<Posterior {self.method or '?'} on {self.backend or '?'}: no draws>"
        shown = [f"{name} {tuple(np.shape(v)[2:])}" for name, v in list(self.samples.items())[:8]]
        more = len(self.samples) - len(shown)
        sites = ", ".join(shown) + (f" and {more} more" if more > 0 else "")
        problems = len(self.diagnostics)
        checks = f"{problems} problem{'s' if problems != 1 else ''}" if problems else "clean"
        return (
            f"<Posterior {self.method} on {self.backend}: {self.num_chains} "
            f"chain{'s' if self.num_chains != 1 else ''} x "
            f"{self.num_draws} draws; sites {sites}; diagnostics: {checks}>"
        )

    # -- prediction ---------------------------------------------------------------------------
    def predict(
        self,
        bound,
        num_samples: int | None = None,
        seed: int = 0,
        site: str | None = None,
        device: str | None = None,
        pred_type: str = "nn",
    ):
        """Posterior predictive at new inputs: ``post.predict(model(X_new))``.

        Returns a :class:`~ppl_bdl.posterior.predictive.PredictiveResult` with the draws of each predicted
        site and, per point, the mean and the split of the predictive uncertainty into aleatoric
        and epistemic parts, ``sd`` and central intervals (``pred.interval(0.9)``). The model is
        compiled once per shape of its inputs and run in
        chunks of draws and of points; ``device`` is where it runs (default: the backend's).
        ``pred_type``: "nn" (the model run at each draw) or, for a Laplace fit, "glm" (the
        model linearised at the MAP; Immer et al. 2021).
        """
        return posterior_predictive(
            self,
            bound,
            num_samples=num_samples,
            seed=seed,
            site=site,
            device=device,
            pred_type=pred_type,
        )

    def evaluate(
        self,
        bound,
        num_samples: int | None = None,
        seed: int = 0,
        site: str | None = None,
        num_bins: int = 15,
        binning: str = "equal_width",
        pred_type: str = "nn",
    ) -> dict[str, float]:
        """Scores of the predictions on held-out data: ``post.evaluate(model(X_test, y_test))``.

        A dict of floats: accuracy, nll, brier, ece, predictive_entropy, expected_entropy and
        mutual_information for a classifier; rmse, nll and the variances for regression. See
        :func:`ppl_bdl.posterior.held_out.evaluate` and :mod:`ppl_bdl.posterior.metrics`.
        ``pred_type``: as in :meth:`predict` ("glm": a Laplace fit's linearised predictive).
        """
        return evaluate(
            self,
            bound,
            num_samples=num_samples,
            seed=seed,
            site=site,
            num_bins=num_bins,
            binning=binning,
            pred_type=pred_type,
        )

    # -- amortized guides ---------------------------------------------------------------------
    def encode(self, X, num_samples: int | None = None, seed: int = 0) -> dict[str, Any]:
        """q(z | x) of new points from a fit with an amortized guide (``guides.Amortized``):
        ``{site: (loc, scale)}`` of q_0, NumPy arrays shaped ``(n, *site shape of one point)``,
        in the site's unconstrained space. With ``num_samples=K``: ``{site: draws}``, K draws
        per point shaped ``(K, n, *site shape)`` in the site's own space, from q_T when the
        guide refines its draws (``refine_steps=T``: T MCMC steps targeting p(z | x) at the
        fitted model), else from q_0.

        Example
        -------
        >>> import numpy as np, ppl_bdl as bdl
        >>> from ppl_bdl import dist, guides, nn
        >>> @bdl.model
        ... def m(X):
        ...     with bdl.plate("data", X.shape[0]) as idx:
        ...         z = bdl.sample("z", dist.Normal(0.0, 1.0), shape=(1,))
        ...         bdl.sample("x", dist.Normal(z, 0.5), obs=X[idx], shape=(1,))
        >>> X = np.random.default_rng(0).normal(size=(100, 1))
        >>> post = bdl.fit(m(X), backend="numpyro", method="vi", num_steps=1000, lr=0.05,
        ...                schedule="cosine", num_samples=5, progress=False,
        ...                guide=guides.Amortized(nn.Dense("enc", 1, 2)))
        >>> loc, scale = post.encode(np.array([[2.0]]))["z"]   # exact: N(0.8 x, 0.2)
        >>> bool(abs(loc[0, 0] - 1.6) < 0.2), bool(abs(scale[0, 0] ** 2 - 0.2) < 0.05)
        (True, True)
        """
        guide = self._amortized("encode")
        if num_samples is None:
            return guide.encode(X)
        return guide.encode(X, num_samples=num_samples, seed=seed, params=self.params)

    def log_marginal(self, data, num_particles: int = 1000, seed: int = 0):
        """log p(x) of new points by importance sampling with the encoder of an amortized guide
        as the proposal (the IWAE estimate with K = ``num_particles``; Burda et al. 2015).

        ``data``: new inputs for the encoder's argument (the model's other arguments as at fit
        time), or a bound model ``model(X_new, ...)``. Returns a
        :class:`~ppl_bdl.inference.vi.guides.amortized_fitted.LogMarginal`: ``per_point`` (n,), ``total``,
        ``mc_se`` and ``ess`` per point. With global latents (a Bayesian decoder), the estimate
        is of log E_q(θ)[p(x | θ)], θ drawn from its guide per particle.

        Example
        -------
        >>> import numpy as np, ppl_bdl as bdl
        >>> from ppl_bdl import dist, guides, nn
        >>> @bdl.model
        ... def m(X):
        ...     with bdl.plate("data", X.shape[0]) as idx:
        ...         z = bdl.sample("z", dist.Normal(0.0, 1.0), shape=(1,))
        ...         bdl.sample("x", dist.Normal(z, 0.5), obs=X[idx], shape=(1,))
        >>> X = np.random.default_rng(0).normal(size=(100, 1))
        >>> post = bdl.fit(m(X), backend="numpyro", method="vi", num_steps=200, num_samples=5,
        ...                guide=guides.Amortized(nn.Dense("enc", 1, 2)), progress=False)
        >>> est = post.log_marginal(np.array([[0.0], [2.0]]), num_particles=1000)
        >>> exact = -0.5 * np.log(2 * np.pi * 1.25) - np.array([0.0, 2.0]) ** 2 / 2.5  # N(0, 1.25)
        >>> bool(np.all(np.abs(est.per_point - exact) < 5 * est.mc_se + 1e-3))
        True
        """
        guide = self._amortized("log_marginal")
        return guide.log_marginal(self.model, data, self.params, num_particles, seed)

    def _amortized(self, what: str):
        if self.guide is None:
            raise ConfigError(
                f"post.{what} needs a VI fit with an amortized guide (guide=guides.Amortized(...)); "
                f"this posterior (method {self.method or '?'!r}) has no fitted guide"
                + (
                    " (a posterior loaded from a file keeps no encoder: refit it)."
                    if self.model is None
                    else "."
                )
            )
        return self.guide

    # -- saving -------------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write the posterior to NetCDF through ArviZ (:mod:`ppl_bdl.posterior.netcdf_file`); read it
        back with :func:`ppl_bdl.load` (:mod:`ppl_bdl.run.persistence`)."""
        return posterior_file.save(self, path)


def from_arviz_data(data) -> Posterior:
    """A :class:`Posterior` (without its model) from an InferenceData, a DataTree or a mapping
    ``{group: xarray.Dataset}``."""
    groups = from_arviz(data)
    attrs = groups["attrs"]
    try:
        settings = json.loads(str(attrs.get("ppl_bdl_settings", "{}")))
    except ValueError:
        settings = {}
    try:
        findings = json.loads(str(attrs.get("ppl_bdl_diagnostics", "[]")))
        diagnostics = Diagnostics(Finding(**dict(f, sites=tuple(f["sites"]))) for f in findings)
    except (ValueError, TypeError, KeyError):
        diagnostics = Diagnostics()
    return Posterior(
        samples=groups.get("posterior", {}),
        sample_stats=groups.get("sample_stats", {}),
        log_likelihood=groups.get("log_likelihood", {}),
        observed_data=groups.get("observed_data", {}),
        dims=groups["dims"],
        method=str(attrs.get("ppl_bdl_method", "")),
        backend=str(attrs.get("ppl_bdl_backend", "")),
        precision=str(attrs.get("ppl_bdl_precision", "float32")),
        model_name=str(attrs.get("ppl_bdl_model", "")),
        latent_names=[n for n in str(attrs.get("ppl_bdl_latent", "")).split(",") if n],
        settings=settings if isinstance(settings, dict) else {},
        diagnostics=diagnostics,
    )
