"""Natural-gradient mean-field VI: ``fit(..., method="vi", guide="meanfield", optimizer="vogn")``
(or ``optimizer="vadam"``), the Adam-like natural-gradient updates of Khan et al. 2018, "Fast and
Scalable Bayesian Deep Learning by Weight-Perturbation in Adam" (ICML), written once here as a
:class:`~ppl_bdl.backend_protocol.Transition` of the one driver.

The guide is q(θ) = N(μ, diag(1/P)), P the precision. In the units of the potential
U(θ) = −log p(D | θ) − log p_rest(θ) (N-scaled on a minibatch; the sites whose prior is a Normal
with fixed mean m₀ and precision λ = 1/s₀² are left out of U and enter in closed form, as in
the ELBO's analytic KL), one step t = 1, 2, ... is (Khan et al. 2018: the variational online
Newton update, VON, and its variants VOGN and Vadam, with Adam's momentum and bias corrections
as in their Vadam, Fig. 1)::

    θ    = μ + σ ⊙ ε,  ε ~ N(0, I),  σ = P^(-1/2)        (K antithetic pairs μ ± σ ⊙ ε_k: hessian)
    g    = mean over the draws of ∇U(θ) + λ (μ − m₀)         (∇_μ of the negative ELBO)
    m    ← β₁ m + (1 − β₁) g,             m̂ = m / (1 − β₁ᵗ)
    s    ← β₂ s + (1 − β₂) h,             ŝ = (s + cₜ s₀) / (1 − β₂ᵗ + cₜ),  cₜ = (1 − β₂) 0.9ᵗ
    ŝ    ← ŝ + ρₜ d + ρₜ² d² / (2 (ŝ + λ)),  d = h − ŝ,  ρₜ = (1 − β₂) / (1 − β₂ᵗ⁺¹)  ("hessian")
    μ    ← μ − α m̂ / (c(ŝ) + λ)
    P    = ŝ + λ                                                 (vogn)
    P    = ŝ / N + λ                                             (vadam)

- ``vogn``: c(ŝ) = ŝ, and h, the curvature of U along each coordinate, by ``curvature``:

  - "ggn" (the paper's VOGN): per-example squared gradients, h = Σ_n (∂u_n)²
    estimated on the batch's M points as (1/N) mean_i (∇U_i − ∇U)², ∇U_i the gradient of U on
    point i alone (scaled N / 1, so ∇U_i − ∇U = N (∇ℓ_i − mean ∇ℓ)): a Gauss-Newton (empirical
    Fisher) approximation of the Hessian, centred (the mean gradient, ~λμ/N at the optimum,
    is left out). Positive, so stable on networks; one draw per step.
  - "fisher": "ggn" above with each point's gradient taken at a label drawn
    from the model at θ (ỹ_i ~ p(y | θ, x_i): the observed sites simulated on the batch)
    instead of its data: the sampled-label Fisher, whose expectation is the Fisher, the
    Gauss-Newton matrix of a Gaussian or canonical-link likelihood (Martens 2014; Kunstner et
    al. 2019). The empirical Fisher of "ggn" weighs each point by its squared residual; this
    one does not, so on a linear-Gaussian model its fixed point is the exact mean-field
    optimum. On the UCI harness's ReLU network it predicts better than "ggn" on yacht and
    worse on boston and concrete (docs/benchmarks.md), so it is not the default. The
    gradient g still reads the data. Per step: one draw of θ, a run of the model to draw the
    labels, the batch's gradient at the data (g) and the per-example ones at the labels (h). A
    model with no observed site in the plate (a likelihood by ``bdl.factor``) gets "ggn".
  - "hessian" (the default): the diagonal of E_q[∇²U] from K antithetic pairs, h = mean_k (∇U(θ_k+) −
    ∇U(θ_k−)) ⊙ ε_k / (2σ), Price's theorem by the reparameterisation trick (Opper &
    Archambeau 2009; Rezende et al. 2014): exact in expectation for any U. At its fixed point
    P = E_q[diag ∇²U] + λ and E_q[∇U] + λ(μ − m₀) = 0, the stationarity conditions of the
    mean-field ELBO, so on a conjugate Gaussian model it lands on the exact mean-field optimum.
    On a non-convex U (a ReLU network) a draw's h can be negative, so ŝ is not the plain
    average: it starts at the initial precision s₀ counted as one draw of weight 1 − β₂ (so
    the draws so far weigh 1 − β₂ᵗ⁺¹, as in the bias-corrected average: ρₜ ≈ 1/(t + 1) early
    and 1 − β₂ late) and moves by the Bayesian learning rule's step on the precision with its
    second-order term (Lin, Schmidt & Khan 2020, "Handling the positive-definite constraint
    in the Bayesian learning rule", ICML; the update of IVON, Shen et al. 2024): ŝ + λ > 0
    after any h, since a(1 + ρx + ρ²x²/2) > 0 for a = ŝ + λ > 0 and x = d / a. Its fixed
    point is the plain average's up to ρ Var(h) / (2 (ŝ + λ)), a term of order 1 − β₂. On the
    UCI networks it predicts better than "ggn" and Adam (docs/benchmarks.md), with two
    gradients of the batch a step (K = 1) and no plate needed. For the first WARMUP_STEPS
    (100) ρₜ is at least 1 − 0.9 (an average of the last ~10 draws), then 1/(t − 90): the
    step's geometric-mean-like move forgets an overconfident s₀ (1/init_scale², often 100x
    the optimum's precision) only as s₀/t at ρₜ ≈ 1/t, which kept the precision 4x too large
    after 100 steps and the mean's steps that much too small.
    It is the default: on a Gaussian U the pair's mean gradient is ∇U(μ) exactly, so the mean
    carries only the minibatch's noise (a conjugate regression on minibatches: within 0.1
    posterior sd of the exact mean in 125 steps and then 0.02-0.05 sd; "ggn", whose one
    unpaired draw a step adds the draw's noise, wanders at 0.2-0.4 sd).
- ``vadam``: the paper's Fig. 1: one draw per step (K = 1, no antithetic pair), h = (g − λ(μ −
  m₀))² the squared minibatch gradient of U, c(ŝ) = √ŝ, and σ from N s_paper = ŝ / N with N
  the data plate's size (1 for a model without one): the empirical Fisher of the minibatch
  mean, an approximation the paper trades for Adam's cost.

For the other curvatures (and vadam), ŝ is Adam's bias-corrected average of h with the initial
precision s₀ = 1/σ₀² − λ counted as one draw whose weight decays by 0.9 a step (our addition:
a lone first h, negative where the off-diagonal curvature dominates far from the optimum, sent a
HalfNormal-scale regression's mean to 10⁶ in three steps). Every ŝ is floored at 0, so P ≥ λ.
μ starts at the guide's ``init_loc`` and σ at its ``init_scale``; the step's α is the run's
rate (``lr``, its schedule and the plateau's cuts). The state's ``params`` are the mean-field
guide's own (``loc``, and ``rho`` with σ = softplus(ρ)), so the fitted guide, its saving and the
VI monitor are those of every VI fit.

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import dist
>>> @bdl.model
... def mean_model(y):
...     mu = bdl.sample("mu", dist.Normal(0.0, 10.0))
...     with bdl.plate("data", y.shape[0]) as idx:
...         bdl.sample("y", dist.Normal(mu, 1.0), obs=y[idx])
>>> y = np.random.default_rng(0).normal(1.0, 1.0, size=200)
>>> post = bdl.fit(mean_model(y), backend="numpyro", method="vi", optimizer="vogn",
...                num_particles=8, num_steps=300, lr=0.1, num_samples=200, progress=False)
>>> round(float(post.guide.params["scale"][0]), 2)  # 1/sqrt(200 + 0.01)
0.07
"""

from __future__ import annotations

import math as _pymath
from dataclasses import dataclass
from typing import Any

import numpy as np

from ppl_bdl.backend_protocol import Batch, Transition
from ppl_bdl.errors import ConfigError, one_of
from ppl_bdl.inference.setup import minibatch_plate
from ppl_bdl.inference.vi.sampled_labels import SampledLabels
from ppl_bdl.optim import OPTIMIZERS

NATURAL_OPTIMIZERS = ("vogn", "vadam")
CURVATURES = ("ggn", "fisher", "hessian")
#: vogn's curvature by default: the one whose fixed point is the ELBO's stationary point, and
#: whose antithetic pair takes the mean's gradient without the draw's noise on a Gaussian model.
DEFAULT_CURVATURE = "hessian"
#: The curvatures made of per-example gradients (one plate's points, one draw of θ a step).
PER_EXAMPLE = ("ggn", "fisher")
#: The natural-gradient optimizers' lr (their step on the natural gradient) by default.
NATURAL_LR = {"vogn": 0.05, "vadam": 0.01}
#: (β₁, β₂) by default: Adam's, as in the paper's Vadam.
DEFAULT_BETAS = (0.9, 0.999)
#: The per-step decay of the initial precision's weight in ŝ (one draw's weight at t = 0).
INIT_DECAY = 0.9
#: "hessian": the steps over which the initial precision (1/init_scale², often 100x the
#: posterior's) is forgotten geometrically, ...
WARMUP_STEPS = 100
#: ... during which ŝ is the average of the last ~WARMUP_DRAWS draws: a rate of 1 − INIT_DECAY.
WARMUP_DRAWS = 1.0 / (1.0 - INIT_DECAY)
#: The plain optimizers' own options, and the value each has when not set (``bdl.VI`` passes
#: gradient="total" to every run): a natural-gradient run refuses any other value.
PLAIN_OPTIONS = {"momentum": None, "clip_norm": None, "gradient": "total"}


@dataclass(frozen=True)
class NaturalConfig:
    """A natural-gradient run's settings: ``optimizer`` ("vogn" | "vadam"), ``beta1`` (the
    gradient's momentum), ``beta2`` (the curvature's running average), ``num_particles`` K
    (vogn: K antithetic pairs; vadam: 1), ``num_data`` N (vadam's σ) and ``curvature``
    (vogn's h: "ggn", "fisher" or "hessian")."""

    optimizer: str
    beta1: float
    beta2: float
    num_particles: int
    num_data: int
    curvature: str = "hessian"

    @classmethod
    def build(
        cls,
        optimizer: str,
        guide: Any,
        objective: Any,
        has_model_params: bool,
        num_data: int,
        beta1: Any = None,
        beta2: Any = None,
        curvature: Any = None,
    ) -> NaturalConfig:
        """Check that the run is one the update applies to and build its settings."""
        if guide != "meanfield":
            shown = guide if isinstance(guide, str) else type(guide).__name__
            raise ConfigError(
                f"optimizer={optimizer!r} is natural-gradient VI for the mean-field Gaussian "
                f"guide only (Khan et al. 2018), got guide={shown!r}. Use guide='meanfield', or "
                "optimizer='adam' for this guide."
            )
        if objective.name != "elbo":
            raise ConfigError(
                f"optimizer={optimizer!r} maximises the ELBO, got objective={objective.name!r}. "
                "Use objective='elbo' (the default), or optimizer='adam' for this objective."
            )
        if has_model_params:
            raise ConfigError(
                f"optimizer={optimizer!r} fits the guide of the latent sites only; the model has "
                "bdl.param sites (point estimates). Give them priors (bdl.sample) or use "
                "optimizer='adam'."
            )
        if curvature is not None and optimizer != "vogn":
            raise ConfigError(
                f"curvature={curvature!r} applies to optimizer='vogn' only (vadam's is the squared "
                "minibatch gradient). Leave it out, or use optimizer='vogn'."
            )
        curvature = DEFAULT_CURVATURE if curvature is None else curvature
        if curvature not in CURVATURES:
            raise one_of("curvature", curvature, CURVATURES)
        if (optimizer == "vadam" or curvature in PER_EXAMPLE) and objective.num_particles != 1:
            which = "optimizer='vadam'" if optimizer == "vadam" else f"curvature={curvature!r}"
            raise ConfigError(
                f"{which} draws one weight sample per step (Khan et al. 2018), got "
                f"num_particles={objective.num_particles}. Leave num_particles out, or use "
                "optimizer='vogn' with curvature='hessian' (K antithetic pairs)."
            )
        betas = []
        for name, value, default in (
            ("beta1", beta1, DEFAULT_BETAS[0]),
            ("beta2", beta2, DEFAULT_BETAS[1]),
        ):
            value = default if value is None else value
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not 0.0 <= value < 1.0
            ):
                raise ConfigError(f"{name} must be a number in [0, 1), got {value!r}.")
            betas.append(float(value))
        return cls(
            optimizer,
            betas[0],
            betas[1],
            objective.num_particles,
            max(int(num_data), 1),
            curvature,
        )


def natural_options(optimizer: Any, run_opts: dict) -> bool:
    """Whether ``optimizer`` is a natural-gradient one; the options it does not take refused."""
    if optimizer not in OPTIMIZERS + NATURAL_OPTIMIZERS:
        raise one_of("optimizer", optimizer, OPTIMIZERS + NATURAL_OPTIMIZERS)
    natural = optimizer in NATURAL_OPTIMIZERS
    plain = [k for k, unset in PLAIN_OPTIONS.items() if run_opts.get(k, unset) != unset]
    given = plain if natural else []
    given += [k for k in ("beta1", "beta2", "curvature") if k in run_opts and not natural]
    if given:
        applies = "optimizer='sgd'/'adam'" if natural else "optimizer='vogn'/'vadam'"
        raise ConfigError(
            f"option(s) {', '.join(given)} do not apply to optimizer={optimizer!r} (they apply to "
            f"{applies}). Leave them out."
        )
    return natural


def build_natural(run, optimizer: str, spec: Any, run_opts: dict) -> Transition:
    """The natural-gradient transition of a VI run (a :class:`~ppl_bdl.inference.vi.runner.VIRun`
    being set up): its settings checked (:class:`NaturalConfig`), and on a full batch with
    curvature "fisher" or "ggn" the plate whose points give the per-example gradients. Each fit starts from
    its own position (the run's packed start, unpacked by ``run.param_layout``)."""
    setup, objective, minibatch = run.setup, run.objective, run.minibatch
    has_model_params, batch_size = run.model_params is not None, run.batch_size
    potential, kl, initial, data = run._potential, run.kl, run._initial, run.density.data
    plates = setup.trace.observed_plates
    config = NaturalConfig.build(
        optimizer,
        spec,
        objective,
        has_model_params,
        next(iter(plates.values())) if len(plates) == 1 else 1,
        run_opts.get("beta1"),
        run_opts.get("beta2"),
        run_opts.get("curvature"),
    )
    backend, plate, all_idx = setup.backend, None, None
    example_idx = backend.asarray(np.zeros(batch_size), "int") if minibatch else None
    if minibatch:
        plate = minibatch[0]
    elif config.optimizer == "vogn" and config.curvature in PER_EXAMPLE:
        if len(plates) != 1:  # per-example gradients need the points of one plate
            raise ConfigError(
                f"optimizer='vogn' with curvature={config.curvature!r} (per-example squared "
                "gradients) needs "
                f"one plate around the observed sites; found {sorted(plates) or 'none'}. Wrap "
                "the likelihood in `with bdl.plate('data', N) as idx:`, or pass "
                "curvature='hessian'."
            )
        plate, size = minibatch_plate(setup, config.num_data)
        all_idx = backend.asarray(np.arange(size), "int")
    labels = None
    if config.optimizer == "vogn" and config.curvature == "fisher":
        labels = SampledLabels.of(run.density, setup.trace, plate)
    return natural_transition(
        config,
        backend,
        potential,
        plate,
        kl,
        initial,
        example_idx,
        data,
        all_idx,
        run.param_layout.unpack,
        labels,
    )


def natural_transition(
    config: NaturalConfig,
    backend,
    potential,
    plate: str | None,
    kl,
    initial: dict,
    example_indices=None,
    data=None,
    all_indices=None,
    unpack=None,
    labels: SampledLabels | None = None,
) -> Transition:
    """The natural-gradient step as a driver :class:`Transition` (equations: the module's).

    ``potential(theta, data, indices, params)`` is U at one flat θ (the sites in ``kl`` left
    out), ``plate`` the minibatched plate (None: full batch), ``kl`` the
    :class:`~ppl_bdl.inference.vi.objectives.AnalyticKL` of the fixed-Normal-prior sites (or None), and
    ``initial`` the guide's initial ``loc`` and ``rho``. Info: ``loss`` (the negative ELBO at
    the step's draws, the entropy in its expectation) and ``grad_norm`` (of g). ``all_indices``
    (per-example curvatures on full batches): every point of ``plate``, a full-batch step's batch.
    ``labels`` (curvature "fisher"): how the step draws its labels and reads U at them.
    """
    m = backend.math
    dim = int(np.asarray(initial["loc"]).shape[0])
    lam_np, m0_np, const = _prior_terms(kl, dim)
    kind = _curvature_kind(config, labels)
    gradients = _GradientSource(backend, potential, plate, data, example_indices, all_indices)
    with backend.scope(), backend.activate():
        estimate = _curvature_estimator(kind, gradients, dim, config, labels)
        lam, m0 = backend.asarray(lam_np), backend.asarray(m0_np)
    average = _curvature_average(kind, config, m, lam)
    vogn, b1, n_data = config.optimizer == "vogn", config.beta1, float(config.num_data)
    init = _initial_state(backend, kind, config, initial, unpack, lam_np)

    def step(key, state, batch, lr):
        if kind in PER_EXAMPLE and batch.indices is None:  # a full batch: each point's gradient
            batch = Batch(batch.data, all_indices)
        loc, rho = state["params"]["loc"], state["params"]["rho"]
        sigma = m.softplus(rho)
        u_mean, grad_u, h = estimate(key, loc, sigma, batch)
        g = grad_u + lam * (loc - m0)
        t = state["t"] + 1.0
        mom = b1 * state["m"] + (1.0 - b1) * g
        m_hat = mom / (1.0 - b1**t)
        s, s_hat = average(state, h, t)
        denom = (s_hat if vogn else m.sqrt(s_hat)) + lam
        new_loc = loc - lr * m_hat / m.maximum(denom, 1e-30)
        precision = (s_hat if vogn else s_hat / n_data) + lam
        new_sigma = 1.0 / m.sqrt(m.maximum(precision, 1e-30))
        new_rho = new_sigma + m.log(-m.expm1(-new_sigma))  # softplus⁻¹, stable for small σ
        loss = _negative_elbo(m, u_mean, loc, sigma, lam, m0, const)
        grad_norm = m.sqrt(m.sum(g * g))
        new = {"params": {"loc": new_loc, "rho": new_rho}, "m": mom, "s": s, "t": t}
        if kind != "hessian":
            new["s0"] = state["s0"]
        return new, {"loss": loss, "grad_norm": grad_norm}

    return Transition(init, step, lambda state: {})


def _prior_terms(kl, dim: int) -> tuple[np.ndarray, np.ndarray, float]:
    """The closed-form part of the negative ELBO: the prior precision λ and mean m₀ of each
    coordinate (0 where the prior is inside U), and the constant of its KL and entropy terms."""
    if kl is not None:
        lam = (1.0 - kl.mask) / kl.prior_scale**2
        m0 = np.where(kl.mask > 0, 0.0, kl.prior_loc)
        log_s0 = float(np.sum(np.log(kl.prior_scale) * (1.0 - kl.mask)))
    else:
        lam, m0, log_s0 = np.zeros(dim), np.zeros(dim), 0.0
    n_mc = float(np.sum(lam == 0.0))  # coordinates whose entropy term is Monte Carlo's
    return lam, m0, -0.5 * n_mc * (1.0 + _pymath.log(2.0 * _pymath.pi)) + log_s0


def _negative_elbo(m, u_mean, loc, sigma, lam, m0, const):
    """The negative ELBO at a step's draws: E_q[U] by the draws, the closed-form KL of the
    fixed-Normal sites and the Gaussian entropy of the others."""
    log_sigma = m.log(sigma)
    kl_terms = -log_sigma + 0.5 * lam * (sigma * sigma + (loc - m0) ** 2) - 0.5
    is_kl = lam > 0.0
    return u_mean + m.sum(m.where(is_kl, kl_terms, -log_sigma)) + const


def _curvature_kind(config: NaturalConfig, labels: SampledLabels | None) -> str:
    """Which h the step estimates: "hessian", "fisher", "ggn" (vogn's curvatures; "fisher" only
    where the model has labels to draw) or "squared_gradient" (vadam)."""
    if config.optimizer != "vogn":
        return "squared_gradient"
    if config.curvature == "hessian":
        return "hessian"
    return "fisher" if labels is not None else "ggn"


def _initial_state(backend, kind: str, config: NaturalConfig, initial, unpack, lam_np):
    """The transition's ``init``: the guide's ``loc`` and ``rho`` at the fit's own start (the
    driver's position: the run's packed parameters), zero moments, and the initial precision
    s₀ (in ŝ's units): ŝ itself for "hessian", else the decaying pseudo-draw ``s0``."""
    m, vogn, n_data = backend.math, config.optimizer == "vogn", float(config.num_data)

    def init(key, position, data):
        values = initial if unpack is None else unpack(np.asarray(backend.to_numpy(position)))
        values = {k: np.asarray(values[k], dtype=float) for k in ("loc", "rho")}
        sigma0 = np.logaddexp(0.0, values["rho"])
        s0 = np.maximum(1.0 / sigma0**2 - lam_np, 0.0)
        params = {k: backend.asarray(v) for k, v in values.items()}
        zeros = m.zeros_like(params["loc"])
        s_init = backend.asarray(s0 if vogn else s0 * n_data)
        if kind == "hessian":  # counted as one draw of weight 1 − β₂
            return {"params": params, "m": zeros, "s": s_init, "t": m.sum(zeros)}
        return {"params": params, "m": zeros, "s": zeros, "t": m.sum(zeros), "s0": s_init}

    return init


def _curvature_average(kind: str, config: NaturalConfig, m, lam):
    """ŝ's update ``(state, h, t) -> (s, ŝ)``: the Bayesian learning rule's step for "hessian",
    else Adam's bias-corrected average with the initial precision as a decaying pseudo-draw."""
    b2 = config.beta2

    def learning_rule(state, h, t):
        # The same weighted average (rate ρ = (1 − β₂) / (1 − β₂ᵗ⁺¹), the weight of the draws
        # so far with s₀'s counted) with the second-order term of the Bayesian learning rule on
        # the precision (Lin, Schmidt & Khan 2020; IVON, Shen et al. 2024): ŝ + λ stays
        # positive whatever the sign of a draw's h, where the plain average followed a negative one.
        # The rate of a weighted average of n draws, n = t + 1 (s₀ counted as one draw). The
        # rule's geometric-mean-like step forgets an overconfident s₀ only as s₀/t at that
        # rate (the precision 4x the optimum's after 100 steps at init_scale=0.01, 1.3x after
        # 1,000: the mean's steps that much too small), so for the first WARMUP_STEPS n stops
        # at WARMUP_DRAWS (s₀ fades as INIT_DECAYᵗ, like the other curvatures' pseudo-draw) and
        # then counts on from there.
        n = m.minimum(t + 1.0, WARMUP_DRAWS + m.maximum(t - WARMUP_STEPS, 0.0))
        rate = (1.0 - b2) / (1.0 - b2**n)
        dev, positive = h - state["s"], m.maximum(state["s"] + lam, 1e-30)
        s = state["s"] + rate * dev + 0.5 * rate**2 * dev**2 / positive
        return s, m.maximum(s, 0.0)

    def adam_average(state, h, t):
        s = b2 * state["s"] + (1.0 - b2) * h
        # The initial precision is one pseudo-draw of h whose weight decays by INIT_DECAY a
        # step: a single early h (far from the optimum, where the off-diagonal curvature
        # dominates) is no longer the whole precision; after ~50 steps it is gone.
        c = (1.0 - b2) * INIT_DECAY**t
        return s, m.maximum((s + c * state["s0"]) / (1.0 - b2**t + c), 0.0)

    return learning_rule if kind == "hessian" else adam_average


@dataclass(frozen=True)
class _GradientSource:
    """What the curvature estimators differentiate: the potential ``potential(theta, data,
    indices, params)`` on the minibatched ``plate``, the run's ``data``, and example index
    arrays to trace with (``example_indices``: a minibatch's; ``all_indices``: every point)."""

    backend: Any
    potential: Any
    plate: str | None
    data: Any
    example_indices: Any
    all_indices: Any

    @property
    def points(self):
        """The indices a per-example estimator is traced with (a minibatch's, else all)."""
        return self.example_indices if self.example_indices is not None else self.all_indices

    def batch_value_and_grad(self, num_thetas: int, dim: int, indices):
        """U summed over ``num_thetas`` draws of θ on a batch, and its gradient per θ, traced."""
        backend, m, potential, plate = self.backend, self.backend.math, self.potential, self.plate

        def total(thetas, batch):
            indices = None if batch.indices is None else {plate: batch.indices}
            if thetas.shape[0] == 1:
                return m.sum(potential(thetas[0], batch.data, indices, None))
            return m.sum(backend.vmap(lambda t: potential(t, batch.data, indices, None))(thetas))

        example = (backend.asarray(np.zeros((num_thetas, dim))), Batch(self.data, indices))
        return backend.trace(backend.value_and_grad(total), example)


def _curvature_estimator(kind: str, source: _GradientSource, dim: int, config, labels):
    """The step's measurement ``(key, loc, σ, batch) -> (U, ∇U, h)`` at draws of θ from q: U
    and ∇U averaged over the draws, h the curvature of ``kind`` (the module's equations)."""
    if kind == "ggn":
        return _ggn_estimator(source, dim, float(config.num_data))
    if kind == "hessian":
        return _hessian_estimator(source, dim, config.num_particles)
    if kind == "fisher":
        return _fisher_estimator(source, dim, float(config.num_data), labels)
    return _squared_gradient_estimator(source, dim)


def _ggn_estimator(source: _GradientSource, dim: int, n_data: float):
    """Curvature "ggn": the centred per-example squared gradients at the data, one draw of θ;
    their mean is the batch's ∇U."""
    backend, m, potential, plate = (
        source.backend,
        source.backend.math,
        source.potential,
        source.plate,
    )

    def one(theta, data, index):  # U at θ on one point (scaled N / 1)
        return potential(theta, data, {plate: m.reshape(index, (1,))}, None)

    # One point's gradient mapped over the batch's points and compiled (on torch one batched
    # graph of torch.func.vmap: 27x faster than a loop over yacht's 32 points).
    zero = backend.asarray(np.zeros(dim))
    per_point = backend.traced_vmap(
        backend.value_and_grad(one), (zero, source.data, source.points), in_axes=(None, None, 0)
    )

    def estimate(key, loc, sigma, batch):
        theta = loc + sigma * backend.random.normal(key, (1, dim))
        # U, ∇U on each point of the batch alone, shaped (M,), (M, d): their means are the
        # minibatch's U and ∇U.
        values, grads = per_point(theta[0], batch.data, batch.indices)
        grad_u = m.mean(grads, axis=0)
        dev = grads - grad_u
        return m.mean(values), grad_u, m.mean(dev * dev, axis=0) / n_data

    return estimate


def _hessian_estimator(source: _GradientSource, dim: int, pairs: int):
    """Curvature "hessian": the batch's gradients at K antithetic pairs μ ± σ ⊙ ε_k, h from
    their differences (Price's theorem)."""
    backend, m = source.backend, source.backend.math
    value_and_grad = source.batch_value_and_grad(2 * pairs, dim, source.example_indices)

    def estimate(key, loc, sigma, batch):
        eps = backend.random.normal(key, (pairs, dim))
        thetas = m.concatenate([loc + sigma * eps, loc - sigma * eps], axis=0)
        u_sum, grads = value_and_grad(thetas, batch)
        diff = grads[:pairs] - grads[pairs:]
        h = m.mean(diff * eps, axis=0) / (2.0 * sigma)
        return u_sum / thetas.shape[0], m.mean(grads, axis=0), h

    return estimate


def _fisher_estimator(source: _GradientSource, dim: int, n_data: float, labels: SampledLabels):
    """Curvature "fisher": the batch's ∇U at the data, and h from each point's gradient at
    labels drawn from the model at the same θ (positions in the batch pick each point's labels
    out of the batch's draw)."""
    backend, m, plate, points = source.backend, source.backend.math, source.plate, source.points
    value_and_grad = source.batch_value_and_grad(1, dim, points)
    zero = backend.asarray(np.zeros(dim))
    positions = backend.asarray(np.arange(int(points.shape[0])), "int")
    drawn = labels.density.simulate(zero, backend.random.key(0), source.data, {plate: points})

    def one_drawn(theta, data, index, position, drawn):
        observed = labels.point(drawn, position, m)
        one_point = {plate: m.reshape(index, (1,))}
        return labels.density.potential(theta, data, one_point, None, observed)

    per_point_drawn = backend.traced_vmap(
        backend.value_and_grad(one_drawn),
        (zero, source.data, points, positions, drawn),
        in_axes=(None, None, 0, 0, None),
    )

    def estimate(key, loc, sigma, batch):
        key, label_key = backend.random.split(key)
        thetas = loc + sigma * backend.random.normal(key, (1, dim))
        u_sum, grads = value_and_grad(thetas, batch)
        drawn = labels.density.simulate(thetas[0], label_key, batch.data, {plate: batch.indices})
        _, drawn_grads = per_point_drawn(thetas[0], batch.data, batch.indices, positions, drawn)
        dev = drawn_grads - m.mean(drawn_grads, axis=0)
        return u_sum / thetas.shape[0], m.mean(grads, axis=0), m.mean(dev * dev, axis=0) / n_data

    return estimate


def _squared_gradient_estimator(source: _GradientSource, dim: int):
    """Vadam's h: the squared minibatch gradient of U at one draw of θ."""
    backend, m = source.backend, source.backend.math
    value_and_grad = source.batch_value_and_grad(1, dim, source.example_indices)

    def estimate(key, loc, sigma, batch):
        thetas = loc + sigma * backend.random.normal(key, (1, dim))
        u_sum, grads = value_and_grad(thetas, batch)
        grad_u = m.mean(grads, axis=0)
        return u_sum / thetas.shape[0], grad_u, grad_u * grad_u

    return estimate
