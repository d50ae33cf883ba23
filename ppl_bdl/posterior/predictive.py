"""Posterior and prior predictive draws, with uncertainty split into aleatoric and epistemic parts.

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import dist
>>> @bdl.model
... def mean_model(y=None, n=3):
...     mu = bdl.sample("mu", dist.Normal(0.0, 1.0))
...     with bdl.plate("data", n) as idx:
...         bdl.sample("y", dist.Normal(mu, 1.0), obs=None if y is None else y[idx])
>>> prior = bdl.prior_predictive(mean_model(), backend="numpyro", num_samples=100)
>>> prior.draws["y"].shape
(100, 3)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ppl_bdl.backends import get as get_backend
from ppl_bdl.dsl.model import BoundModel, unbound_message
from ppl_bdl.dsl.nn.dropout import DROPOUT_SEED
from ppl_bdl.errors import ConfigError, ModelError
from ppl_bdl.posterior import uncertainty as U
from ppl_bdl.posterior.predictive_runner import CLASSIFIERS, run_predictive
from ppl_bdl.trace.model_trace import trace_model

_CLASSIFIERS = CLASSIFIERS


@dataclass(repr=False)
class PredictiveResult:
    """Predictive draws and per-point summaries of one predicted site.

    :meth:`interval` gives central predictive intervals (regression). A class label has no sd
    or interval: for a classifier they raise a ``ConfigError`` that points to ``probs`` and
    the entropies.

    Attributes
    ----------
    draws : dict
        Site name -> draws shaped ``(num_samples, *site_shape)``, for every predicted site.
    site : str
        The site the summaries describe.
    kind : "regression" | "classification"
    mean : array
        Predictive mean per point (for classification, the most probable class,
        ``probs.argmax(-1)``).
    sd : array
        Regression: the predictive standard deviation per point, ``sqrt(total)``.
    total, aleatoric, epistemic : array
        Regression: variances, total = E_θ[Var(y|θ)] + Var_θ[E(y|θ)]. Classification: predictive
        entropy, expected entropy, mutual information (nats).
    probs : array or None
        Classification: posterior-mean class probabilities per point.

    Example
    -------
    >>> import numpy as np, ppl_bdl as bdl
    >>> from ppl_bdl import dist
    >>> @bdl.model
    ... def m(n=3):
    ...     mu = bdl.sample("mu", dist.Normal(0.0, 1.0))
    ...     with bdl.plate("data", n):
    ...         bdl.sample("y", dist.Normal(mu, 1.0))
    >>> pred = bdl.prior_predictive(m(), backend="numpyro", num_samples=2000)
    >>> [round(float(v), 1) for v in pred.sd]   # sqrt(1 + 1): the prior's and the noise's variance
    [1.4, 1.4, 1.4]
    >>> lo, hi = pred.interval(0.9)
    >>> lo.shape, bool(np.all(lo < pred.mean)), bool(np.all(pred.mean < hi))
    ((3,), True, True)
    """

    draws: dict[str, np.ndarray]
    site: str | None
    kind: str
    mean: np.ndarray | None = None
    total: np.ndarray | None = None
    aleatoric: np.ndarray | None = None
    epistemic: np.ndarray | None = None
    probs: np.ndarray | None = None
    per_draw: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def sd(self) -> np.ndarray:
        """Predictive standard deviation per point: the square root of the total variance
        E_θ[Var(y|θ)] + Var_θ[E(y|θ)] (regression only)."""
        self._need_regression("sd")
        return np.sqrt(self.total)

    def interval(self, level: float = 0.9) -> tuple[np.ndarray, np.ndarray]:
        """Central predictive interval per point: ``lo, hi = pred.interval(0.9)``.

        The (1 - level)/2 and (1 + level)/2 quantiles of the predictive draws of :attr:`site`
        (each draw of y from the likelihood at one posterior draw, so the interval holds both
        the noise and the posterior's uncertainty). Regression only (counts included).

        Parameters
        ----------
        level : float
            The probability the interval holds, in (0, 1).

        Returns
        -------
        (lo, hi) : tuple of arrays shaped like :attr:`mean`.
        """
        self._need_regression("interval")
        if isinstance(level, bool) or not isinstance(level, int | float) or not 0 < level < 1:
            raise ConfigError(
                f"interval(level): level is the probability the interval holds, a number in "
                f"(0, 1) such as 0.9; got {level!r}."
            )
        draws = np.asarray(self.draws[self.site])
        lo, hi = np.quantile(draws, [(1.0 - level) / 2.0, (1.0 + level) / 2.0], axis=0)
        return lo, hi

    def _need_regression(self, what: str) -> None:
        if self.kind == "regression":
            return
        if self.kind == "classification":
            raise ConfigError(
                f"pred.{what} is defined for a regression; site {self.site!r} is a classifier, "
                "whose prediction is a class, with no sd or interval. Use pred.probs (posterior-"
                "mean class probabilities), pred.total / pred.aleatoric / pred.epistemic (entropy "
                "and its split), or, for an interval of each class probability across posterior "
                "draws, np.quantile(pred.per_draw['probs'], [0.05, 0.95], axis=0)."
            )
        raise ConfigError(
            f"pred.{what}: the model has no predicted site with a likelihood (observed or "
            "latent sample site) to summarise; predict a model that samples its targets."
        )

    def __repr__(self) -> str:
        """One line: the site, its kind, how many draws of which shape, what to read."""
        if self.site is None:
            return f"<PredictiveResult: no summarised site; draws of {sorted(self.draws)}>"
        shape = np.shape(self.draws[self.site])
        reads = (
            "mean, sd, interval(level), total/aleatoric/epistemic variances"
            if self.kind == "regression"
            else "probs, mean (class), total/aleatoric/epistemic entropies"
        )
        return (
            f"<PredictiveResult {self.kind} of {self.site!r}: {shape[0]} draws x "
            f"{tuple(shape[1:])}; {reads}>"
        )

    def rmse(self, y_true) -> float:
        """Root mean squared error of the predictive mean against ``y_true``."""
        return float(np.sqrt(np.mean((np.asarray(self.mean) - np.asarray(y_true)) ** 2)))

    def log_likelihood(self, y_true) -> float:
        """Mean log predictive density of ``y_true`` (Gaussian moment match for regression,
        the predictive probabilities for classification)."""
        y_true = np.asarray(y_true)
        if self.kind == "classification":
            p = np.take_along_axis(self.probs, y_true.astype(int)[..., None], axis=-1)[..., 0]
            return float(np.mean(np.log(np.clip(p, 1e-12, 1.0))))
        means, variances = self.per_draw["mean"], self.per_draw["variance"]
        logp = -0.5 * (np.log(2 * np.pi * variances) + (y_true - means) ** 2 / variances)
        m = logp.max(axis=0)
        return float(np.mean(m + np.log(np.mean(np.exp(logp - m), axis=0))))


def _per_draw(array: np.ndarray, shape: tuple, trailing: int = 0) -> np.ndarray:
    """Broadcast per-draw values (draw axis first) to ``(draws, *shape, *trailing dims)``."""
    array = np.asarray(array)
    core = array.shape[1 : array.ndim - trailing]
    tail = array.shape[array.ndim - trailing :]
    padded = array.reshape(array.shape[:1] + (1,) * (len(shape) - len(core)) + core + tail)
    return np.broadcast_to(padded, array.shape[:1] + shape + tail)


def _summaries(values: dict, site: str, spec_name: str, shape: tuple) -> dict:
    if spec_name in _CLASSIFIERS:
        if spec_name == "Bernoulli":
            p = _per_draw(values["probs"], shape)
            probs = np.stack([1.0 - p, p], axis=-1)
        else:
            probs = _per_draw(values["probs"], shape, trailing=1)
        return dict(
            kind="classification",
            probs=probs.mean(axis=0),
            mean=probs.mean(axis=0).argmax(-1),
            total=U.predictive_entropy(probs),
            aleatoric=U.expected_entropy(probs),
            epistemic=U.mutual_information(probs),
            per_draw={"probs": probs},
        )
    means = _per_draw(values["mean"], shape)
    variances = _per_draw(values["variance"], shape)
    total, aleatoric, epistemic = U.variance_decomposition(means, variances)
    return dict(
        kind="regression",
        mean=means.mean(axis=0),
        total=total,
        aleatoric=aleatoric,
        epistemic=epistemic,
        per_draw={"mean": means, "variance": variances},
    )


def _result(sites: dict, draws, moments, site):
    """Summaries for ``site``, by default the last predicted site of the model (the likelihood).
    ``sites`` is a validating trace of the model (only shapes and specs are read)."""
    predicted = [n for n in sites if n in moments]
    if site is None:
        if not predicted:
            return PredictiveResult(draws=draws, site=None, kind="none")
        site = predicted[-1]
    elif site not in moments:
        raise ConfigError(f"site {site!r} is not a predicted site; predicted: {predicted}.")
    record = sites[site]
    shape = tuple(record.shape.batch + record.shape.extra)
    return PredictiveResult(
        draws=draws, site=site, **_summaries(moments[site], site, record.spec.family, shape)
    )


def posterior_predictive(
    posterior,
    bound,
    num_samples: int | None = None,
    seed: int = 0,
    site: str | None = None,
    device: str | None = None,
    pred_type: str = "nn",
):
    """Draws of the sites ``bound`` predicts, one per posterior draw (or ``num_samples`` of them).

    The model's latent sites are taken from the posterior; a global latent site (outside every
    plate) that the posterior lacks is an error. Latent sites inside a plate that the posterior
    lacks (new groups' effects, say) are drawn from their prior given the rest.
    ``pred_type="glm"`` (a Laplace posterior's): the model linearised at the MAP
    (:mod:`ppl_bdl.inference.laplace.glm`)."""
    if not isinstance(bound, BoundModel):
        raise ModelError(unbound_message(bound))
    glm = _glm(posterior, pred_type)
    backend = get_backend(posterior.backend, precision=posterior.precision, device=device)
    # Validate the new inputs once ("uniform" draws also work for flat priors).
    sites = trace_model(bound, backend, seed=seed, missing="uniform")
    missing = [
        n
        for n, s in sites.items()
        if s.kind == "latent" and not s.plates and n not in posterior.latent_names
    ]
    if missing:
        raise ModelError(
            f"model {bound.name!r} has latent site(s) {missing} that the posterior (of "
            f"{posterior.model_name or 'another model'!r}, latent sites {posterior.latent_names}) "
            "does not have: predicting would draw them from their prior. Predict with the model "
            "the posterior was fitted to (same site names), or fit this model."
        )
    if glm is not None:
        draws, moments = glm(bound, backend, sites, num_samples, seed, posterior.params)
        return _result(sites, draws, moments, site)
    latents = {k: v for k, v in posterior.samples.items() if k in posterior.latent_names}
    latents = {k: v for k, v in latents.items() if k in sites and _fits(sites[k], v)}
    flat = {k: v.reshape((-1,) + v.shape[2:]) for k, v in latents.items()}
    seeds = posterior.sample_stats.get(DROPOUT_SEED)  # MC dropout: a draw is weights and masks
    if seeds is not None:
        flat[DROPOUT_SEED] = np.asarray(seeds).reshape(-1)
    total = next(iter(flat.values())).shape[0] if flat else 1
    if num_samples is not None:
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
            raise ConfigError(f"num_samples must be an int >= 1, got {num_samples!r}.")
        rng = np.random.default_rng(seed)
        idx = rng.choice(total, size=num_samples, replace=num_samples > total)
        flat = {k: v[idx] for k, v in flat.items()}
        total = num_samples
    # Sites the new model shares with the posterior are substituted; the others are predicted.
    # Deterministics of the posterior are recomputed at the new inputs, not kept from training.
    seeds = flat.pop(DROPOUT_SEED, None)
    draws, moments = run_predictive(
        bound, backend, flat, total, seed, posterior.params, sites, dropout_seeds=seeds
    )
    return _result(sites, draws, moments, site)


def _glm(posterior, pred_type: str):
    """The linearised predictive of ``posterior`` for ``pred_type="glm"``, None for "nn"."""
    if pred_type not in ("nn", "glm"):
        raise ConfigError(f"pred_type must be 'nn' or 'glm', got {pred_type!r}.")
    glm = getattr(posterior.guide, "glm_predictive", None)
    if pred_type == "glm" and glm is None:
        raise ConfigError(
            "pred_type='glm' linearises the model at a Laplace fit's MAP; this posterior "
            f"(method {posterior.method or '?'!r}) has no Laplace approximation"
            + (" (a loaded file keeps none: refit it)" if posterior.method == "laplace" else "")
            + ". Fit with method='laplace', or predict with pred_type='nn'."
        )
    return glm if pred_type == "glm" else None


def _fits(site, draws: np.ndarray) -> bool:
    """Whether the posterior's draws of a site fit the new model's site. A local site (in a
    plate or a scan: a mixture's assignments, a state path) of another size is drawn anew from
    its prior given the rest, as a new group's effects are."""
    local = bool(site.plates) or "scan" in site.extra
    return not local or tuple(draws.shape[2:]) == tuple(np.shape(site.value))


def prior_predictive(
    bound,
    backend: str | None = None,
    num_samples: int = 500,
    seed: int = 0,
    precision: str = "float32",
    device: str | None = None,
) -> PredictiveResult:
    """Draws of every site from the prior (and the likelihood), ``num_samples`` times.

    Example
    -------
    >>> import numpy as np, ppl_bdl as bdl
    >>> from ppl_bdl import dist
    >>> @bdl.model
    ... def m(n=4):
    ...     s = bdl.sample("s", dist.HalfNormal(1.0))
    ...     with bdl.plate("data", n):
    ...         bdl.sample("y", dist.Normal(0.0, s))
    >>> bdl.prior_predictive(m(), backend="numpyro", num_samples=10).draws["y"].shape
    (10, 4)
    """
    if not isinstance(bound, BoundModel):
        raise ModelError(unbound_message(bound))
    backend = get_backend(backend, precision=precision, device=device)
    sites = trace_model(bound, backend, seed=seed, missing="prior")  # validate once: clear errors
    draws, moments = run_predictive(bound, backend, {}, num_samples, seed, {}, sites)
    return _result(sites, draws, moments, None)
