"""Variational objectives, written once against the Backend interface.

Each builds a loss ``loss(phi, noise, batch) -> scalar`` (the negative objective) from a
guide over the flat unconstrained latent vector and the model's potential U(θ) = −log p(θ, D) −
log|J| (:class:`~ppl_bdl.trace.layout.ModelDensity`). With log weights log w_k = −U(θ_k) − log q(θ_k),
θ_k ~ q reparameterised:

- ``elbo``: the Monte Carlo ELBO, mean_k log w_k (Eq. 2.15 of "Bayesian Computation in Deep Learning"). Sites whose prior is a
  Normal with fixed parameters, outside plates, under a mean-field guide, have their KL term in
  closed form: KL[N(μ, σ²) ‖ N(m, s²)] = log(s/σ) + (σ² + (μ − m)²)/(2s²) − ½, which for m = 0,
  s² = 1/λ is Σ_i [−log σ_i + ½λσ_i² + ½λμ_i² + ½ log(1/λ) − ½] (the literature's note, 002).
- ``renyi``: the variational Rényi bound 1/(1−α) log (1/K) Σ_k w_k^{1−α} (Li & Turner 2016; Eq. 2.21
  of "Bayesian Computation in Deep Learning"); α → 1 is the ELBO, α = 0 the IWAE bound.
- ``iwae``: log (1/K) Σ_k w_k with K = ``num_particles`` (Burda et al. 2015; Eq. 3.18 of
  "Bayesian Computation in Deep Learning").

``gradient`` picks the ELBO's gradient estimator: "total" (the default), the gradient of the
Monte Carlo ELBO as written; "path", the path derivative ("sticking the landing", Roeder, Wu and
Duvenaud 2017, Eq. 8): log q(θ_k) is evaluated with the guide's parameters held constant
(``stop_gradient``), so the gradient keeps only the path through θ_k = T_φ(ε_k) and drops the
score term ∇_φ log q_φ(θ), whose expectation is zero. The estimate stays unbiased, and where q
equals the posterior, −U(θ) − log q(θ) is constant in θ and its variance is zero. It applies to
the ELBO (``elbo``, ``renyi`` with α = 1) with a Monte Carlo KL, for reparameterised guides.

Example
-------
>>> from ppl_bdl.inference.vi.objectives import ObjectiveConfig
>>> ObjectiveConfig.build("renyi", alpha=0.5, num_particles=10).alpha
0.5
"""

from __future__ import annotations

import math as _pymath
from dataclasses import dataclass
from typing import Any

import numpy as np

from ppl_bdl.dsl.dist.constraints import param_to_constrained, param_to_unconstrained
from ppl_bdl.errors import ConfigError, one_of

OBJECTIVES = ("elbo", "renyi", "iwae")
KL_MODES = ("auto", "analytic", "mc")
GRADIENTS = ("total", "path")


@dataclass(frozen=True)
class ObjectiveConfig:
    """``name`` ("elbo" | "renyi" | "iwae"), ``alpha`` (Rényi), ``num_particles`` K, ``kl``,
    ``gradient`` ("total" | "path")."""

    name: str = "elbo"
    alpha: float = 1.0
    num_particles: int = 1
    kl: str = "auto"
    gradient: str = "total"

    @classmethod
    def build(
        cls,
        name: str = "elbo",
        alpha: Any = None,
        num_particles: int = 1,
        kl: str = "auto",
        gradient: str = "total",
    ):
        if name not in OBJECTIVES:
            raise one_of("objective", name, OBJECTIVES)
        if kl not in KL_MODES:
            raise one_of("kl", kl, KL_MODES)
        if gradient not in GRADIENTS:
            raise one_of("gradient", gradient, GRADIENTS)
        if (
            isinstance(num_particles, bool)
            or not isinstance(num_particles, int)
            or num_particles < 1
        ):
            raise ConfigError(f"num_particles must be an int >= 1, got {num_particles!r}.")
        if alpha is not None and name != "renyi":
            raise ConfigError(
                f"alpha={alpha!r} only applies to objective='renyi' (got objective={name!r})."
            )
        if name == "renyi":
            if alpha is None:
                raise ConfigError(
                    "objective='renyi' needs alpha (e.g. alpha=0.5); alpha=1 is the ELBO."
                )
            if (
                isinstance(alpha, bool)
                or not isinstance(alpha, int | float)
                or not (_pymath.isfinite(alpha) and alpha >= 0.0)
            ):
                raise ConfigError(
                    f"alpha must be a finite number >= 0 for the Renyi bound, got {alpha!r} "
                    "(alpha=1 is the ELBO, alpha=0 the IWAE bound; Li & Turner 2016)."
                )
        if kl == "analytic" and name != "elbo":
            raise ConfigError(f"kl='analytic' applies to objective='elbo' only (got {name!r}).")
        alpha = 1.0 if alpha is None else float(alpha)
        if gradient == "path" and not (name == "elbo" or (name == "renyi" and alpha == 1.0)):
            raise ConfigError(
                f"gradient='path' (sticking the landing) applies to the ELBO; with "
                f"objective={name!r} dropping the score term biases the gradient (an importance-"
                "weighted bound needs the doubly reparameterised estimator, Tucker et al. 2018, "
                "which ppl_bdl does not have). Use objective='elbo', or gradient='total'."
            )
        if gradient == "path" and kl == "analytic":
            raise ConfigError(
                "gradient='path' needs the KL term as a Monte Carlo estimate (its zero variance at "
                "the optimum comes from log q cancelling -U), got kl='analytic'. Use kl='mc' (or "
                "'auto', which is Monte Carlo under gradient='path'), or gradient='total'."
            )
        return cls(name, alpha, num_particles, kl, gradient)


@dataclass
class AnalyticKL:
    """Closed-form KL for some coordinates: ``mask`` is 1 where log q stays Monte Carlo."""

    sites: list[str]
    mask: np.ndarray
    prior_loc: np.ndarray
    prior_scale: np.ndarray


def _static(value: Any) -> bool:
    return isinstance(value, int | float | np.ndarray | np.number) and not isinstance(value, bool)


def analytic_kl_sites(setup, guide, config: ObjectiveConfig) -> AnalyticKL | None:
    """The sites whose KL term is computed in closed form, or None.

    A site qualifies when its prior is ``dist.Normal`` with Python/NumPy parameters (not
    functions of other latents or of data), it sits outside every plate, and the guide is a
    diagonal Gaussian.
    """
    if config.name != "elbo" or config.kl == "mc" or config.gradient == "path":
        return None
    layout = setup.layout
    if not guide.is_diagonal_gaussian:
        if config.kl == "analytic":
            raise ConfigError(
                f"kl='analytic' needs a Gaussian mean-field guide; guide {guide.name!r} has no "
                "closed-form KL. Use kl='auto' or kl='mc'."
            )
        return None
    mask = np.ones(layout.dim)
    loc, scale = np.zeros(layout.dim), np.ones(layout.dim)
    names = []
    for slot in layout.slots:
        site = layout.sites[slot.name]
        params = site.spec.params
        if (
            site.spec.name != "Normal"
            or site.plates
            or not all(_static(v) for v in params.values())
        ):
            continue
        shape = slot.shape
        sl = slice(slot.offset, slot.offset + slot.size)
        loc[sl] = np.broadcast_to(np.asarray(params.get("loc", 0.0), float), shape).reshape(-1)
        scale[sl] = np.broadcast_to(np.asarray(params.get("scale", 1.0), float), shape).reshape(-1)
        mask[sl] = 0.0
        names.append(slot.name)
    if not names:
        if config.kl == "analytic":
            raise ConfigError(
                "kl='analytic' found no site with a Normal prior with fixed parameters outside "
                "plates; use kl='auto' or kl='mc'."
            )
        return None
    return AnalyticKL(names, mask, loc, scale)


def make_loss(
    guide,
    potential,
    config: ObjectiveConfig,
    backend,
    plate: str | None,
    kl=None,
    model_params=None,
):
    """The loss ``loss(params, noise, batch) -> scalar``: the negative objective at the guide
    parameters ``params`` (a dict, see ``guide.param_layout``), for the guide's standard-normal
    ``noise`` (``guide.noise_shape(K)``; a random key for a guide that draws itself) and
    ``batch`` (:class:`~ppl_bdl.inference.loop.driver.Batch`: the data's arrays and the minibatch
    indices of ``plate``, None for a full batch). ``potential(theta, data, indices, params)``.

    With ``model_params`` (a :class:`ModelParams`), ``params`` also holds the model's own
    ``param`` sites (unconstrained, prefixed ``model.``), optimised as point estimates, and
    ``potential`` receives them constrained.
    """
    m = backend.math
    K = config.num_particles
    mask = prior_loc = prior_scale = None
    if kl is not None:
        mask = backend.asarray(kl.mask) if kl.mask.any() else None
        prior_loc, prior_scale = backend.asarray(kl.prior_loc), backend.asarray(kl.prior_scale)
        inverse_mask = backend.asarray(1.0 - kl.mask)
        log_prior_scale = float(np.sum(np.log(kl.prior_scale) * (1.0 - kl.mask)))
        only_analytic = not kl.mask.any()

    path = config.gradient == "path"
    if path and not guide.path_gradient:
        raise ConfigError(
            f"gradient='path' needs a reparameterised guide with a density (meanfield, lowrank, "
            f"fullrank, flow); guide {guide.name!r} is not one. Use gradient='total'."
        )

    def draw(params, noise, num, mask=None):
        if guide.noise_shape(num) is None:  # noise is a key
            return guide.sample(params, noise, num, mask=mask)
        theta, log_q = guide.transform(params, noise, mask=mask)
        if path:  # Roeder et al. 2017, Eq. 8: log q at the draw, φ held constant
            fixed = {k: m.stop_gradient(v) for k, v in params.items()}
            log_q = guide.log_prob(fixed, theta)
        return theta, log_q

    def loss(params, noise, batch):
        data = batch.data
        indices = None if batch.indices is None else {plate: batch.indices}
        extra = None
        if model_params is not None:
            extra = model_params.constrained(params, m)
            params = {k: v for k, v in params.items() if not k.startswith(MODEL_PREFIX)}

        def potentials(theta):
            if K == 1:
                return m.reshape(potential(theta[0], data, indices, extra), (1,))
            return backend.vmap(lambda t: potential(t, data, indices, extra))(theta)

        if kl is not None:
            theta, log_q = draw(params, noise, K, mask=mask)
            u = potentials(theta)
            loc, scale = guide.loc_scale(params)
            diff = (loc - prior_loc) / prior_scale
            ratio = scale / prior_scale
            kl_terms = -m.log(scale) + 0.5 * (ratio * ratio + diff * diff) - 0.5
            kl_total = m.sum(kl_terms * inverse_mask) + log_prior_scale
            if only_analytic:
                return m.mean(u) + kl_total
            return m.mean(u + log_q) + kl_total
        theta, log_q = draw(params, noise, K)
        log_w = -potentials(theta) - log_q
        if config.name == "elbo" or (config.name == "renyi" and config.alpha == 1.0):
            return -m.mean(log_w)
        one_minus = 1.0 if config.name == "iwae" else 1.0 - config.alpha
        bound = (m.logsumexp(one_minus * log_w) - _pymath.log(K)) / one_minus
        return -bound

    return loss


MODEL_PREFIX = "model."


class ModelParams:
    """The model's own ``param`` sites as part of the optimised vector (point estimates).

    Stored unconstrained under ``model.<name>``: "positive" as log, "unit_interval" as logit,
    "simplex" as log-weights (mapped back with softmax).
    """

    def __init__(self, sites: dict, backend):
        self.values = {
            n: np.asarray(backend.to_numpy(s.value), dtype=float) for n, s in sites.items()
        }
        self.constraints = {n: s.constraint or "real" for n, s in sites.items()}

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {MODEL_PREFIX + n: v.shape for n, v in self.values.items()}

    def initial(self) -> dict[str, np.ndarray]:
        return {
            MODEL_PREFIX + name: param_to_unconstrained(self.constraints[name], value)
            for name, value in self.values.items()
        }

    def constrained(self, params: dict, m) -> dict:
        return {
            name: param_to_constrained(self.constraints[name], params[MODEL_PREFIX + name], m)
            for name in self.values
        }
