"""HMC whose step size and diagonal mass are tuned by an ELBO-like objective:
``bdl.HMC(adapt="elbo")``.

"Bayesian Computation in Deep Learning" (Sec. 3.3.2, Eq. 3.19 and Figure 7) reads T steps of an
MCMC kernel started from an initial distribution q_0 as an implicit variational distribution
q_T^(ψ) whose hyperparameters ψ (here the step size ε and the diagonal inverse mass m) are
variational parameters. The ELBO of Eq. 3.19, E_{q_T}[log p(x, z_T)] + H[q_T], needs the
intractable entropy of q_T: Salimans, Kingma & Welling (2015) bound it on the chain's
auxiliary variables; Campbell, Chen, Hernández-Lobato & Zhang (2021), *A Gradient Based Strategy
for Hamiltonian Monte Carlo Hyperparameter Optimization*, ICML, drop it and keep q_T from
collapsing with a mass-covering q_0. We tune ψ on their objective, reported as

    L(ψ) = E_{q_T^(ψ)}[log p(x, z_T)] + H[q_0],

H[q_0] a constant in ψ (the entropy of q_0 standing in for that of q_T). q_0 = N(μ, diag σ²)
itself is fitted alongside by its own ELBO, E_{q_0}[log p(x, z)] + H[q_0] (``tune_init``; else
fixed at the chains' start from ``init`` and ``init_scale``), and the chains of the objective
start from it widened by s = ``init_inflation``, z_0 = μ + s σ ⊙ ξ. Why not tune q_0 by L
too: without q_T's entropy, L rewards chains that gather q_0's mass where p is high; with q_0
tuned by L its scale grows without bound while T moves of a quarter-period trajectory carry
the draws back to the mode (measured: σ reached 1550 on a coordinate of scale 0.1). With q_0 = p
instead, q_T = p for every ψ and L is flat; hence the widening, which Campbell et al. tune by
a Stein discrepancy and we leave as a setting.

The inverse mass is q_0's variance times a tuned factor, m = σ² ⊙ exp(log r − mean log r),
so the kernel starts preconditioned by q_0 and L refines it (a coordinate whose steps start far
too small has a vanishing, noisy gradient: tuning m from 1 alone left a scale-5 coordinate with
the smallest mass of three). The gradient is the reparameterisation gradient through the
unrolled chain: T HMC moves (:func:`~ppl_bdl.inference.mcmc.hmc_kernel.hmc_move`, each
``num_steps`` leapfrog steps) whose momenta and accept uniforms are drawn outside the
differentiated function, ``value_and_grad`` of log p(x, z_T) with respect to (log ε, log r),
z_0 held fixed. The Metropolis accept decision selects the proposal or the current state and is
not differentiated (a stop-gradient mask, as Campbell et al. 2021 do; the score-function term
of the decision is dropped). A particle whose gradient is not finite (a divergent proposal's
0 × inf) is left out of that step's mean. The optimizer is the backend's Adam
(:meth:`Backend.optimizer`), each tuning step one transition of the core's loop.

After tuning, the chains start from draws of the widened q_0 and run the tuned kernel
unchanged (:func:`~ppl_bdl.inference.mcmc.hmc_kernel.hmc_transition`): ``num_warmup`` steps
discarded, then ``num_samples`` kept. ``post.settings`` records ``elbo_step_size`` and
``elbo_inverse_mass`` (geometric mean 1; ε √m as tuned), ``elbo_init_mean``,
``elbo_init_scale`` (q_0's σ) and ``elbo_objective`` (L's estimate at every tuning step).

Example
-------
>>> import ppl_bdl as bdl
>>> tuning = bdl.HMC(adapt="elbo", elbo_steps=600, num_steps=5).elbo_config()
>>> tuning.steps, tuning.num_steps, tuning.particles, tuning.chain_length
(600, 5, 4, 3)

``docs/inference.md`` fits an anisotropic Gaussian this way; its tuned inverse mass follows the
variances.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ppl_bdl.backend_protocol import Batch, Transition
from ppl_bdl.errors import InferenceError, RunInterrupted
from ppl_bdl.inference.ensemble import traced_potential
from ppl_bdl.inference.loop.driver import Rates, plan_run, run_chains
from ppl_bdl.inference.loop.failures import raise_failure
from ppl_bdl.inference.mcmc.hmc_kernel import hmc_move, hmc_transition
from ppl_bdl.inference.mcmc.native import arviz_stats
from ppl_bdl.inference.posterior_from_draws import build_posterior
from ppl_bdl.inference.setup import Setup
from ppl_bdl.inference.starts import initial_positions
from ppl_bdl.optim import OptimizerConfig
from ppl_bdl.trace.layout import ModelDensity

#: The initial step size when none is given: small, so that the first proposals are accepted
#: and the objective's gradient in ε is not zero (Adam's steps are scale-free: it grows fast).
DEFAULT_INITIAL_STEP_SIZE = 0.01
#: The tuning's keys are the seed's plus this, so that its noise is not the sampling chains'.
TUNING_SEED_OFFSET = 7919


@dataclass(frozen=True)
class ElboTuning:
    """The tuning's settings: ``steps`` Adam steps of learning rate ``lr``; each step's objective
    averages ``particles`` chains of ``chain_length`` T HMC moves of ``num_steps`` leapfrog steps
    from q_0 widened by ``init_inflation``; ``tune_init``: q_0's mean and scale are fitted by
    q_0's own ELBO alongside; ``init_scale``: q_0's initial scale; ``step_size``: the initial
    ε."""

    steps: int = 500
    lr: float = 0.03
    chain_length: int = 3
    particles: int = 4
    num_steps: int = 10
    tune_init: bool = True
    init_scale: float = 1.0
    init_inflation: float = 2.0
    step_size: float = DEFAULT_INITIAL_STEP_SIZE


@dataclass(frozen=True)
class TunedKernel:
    """What the tuning found: ε, the inverse mass m (geometric mean 1), q_0's mean and scale, and
    the objective's estimate at every step."""

    step_size: float
    inverse_mass: np.ndarray
    init_mean: np.ndarray
    init_scale: np.ndarray
    objective: np.ndarray

    def record(self, settings: dict) -> None:
        """Save the tuned values in a fit's settings (JSON values)."""
        settings["elbo_step_size"] = self.step_size
        settings["elbo_inverse_mass"] = [float(v) for v in self.inverse_mass]
        settings["elbo_init_mean"] = [float(v) for v in self.init_mean]
        settings["elbo_init_scale"] = [float(v) for v in self.init_scale]
        settings["elbo_objective"] = [float(v) for v in self.objective]


def hyperparameters(backend, params: dict, fixed: dict) -> tuple:
    """(ε, m, μ, log σ) from the tuned ``params`` and the ``fixed`` ones. The inverse mass is
    q_0's variance times a tuned factor, m = σ² ⊙ exp(log r − mean log r) (σ not differentiated
    through m: q_0's scale is fitted by its own ELBO), so the kernel starts preconditioned by
    q_0 and the objective's gradient refines it; ε carries the overall scale."""
    m = backend.math
    both = {**fixed, **params}
    log_factor, log_scale = both["log_mass_factor"], both["init_log_scale"]
    log_mass = 2.0 * m.stop_gradient(log_scale) + log_factor - m.mean(log_factor)
    return m.exp(both["log_step_size"]), m.exp(log_mass), both["init_mean"], log_scale


def elbo_objective(backend, potential_and_grad, config: ElboTuning):
    """One particle's objective as ``objective(params, fixed, xi, momenta, log_uniforms, data)
    -> (surrogate, (objective, acceptance))``, a function of the hyperparameters and the
    particle's noise: ``xi`` (d,), ``momenta`` (T, d) and ``log_uniforms`` (T,) drive the T
    moves. ``potential_and_grad(z, data)`` is (U, ∇U); log p = −U.

    The chain starts at z_0 = μ + s σ ⊙ ξ (q_0 widened by s = ``init_inflation``; μ and σ not
    differentiated here) and ``objective`` = log p(x, z_T) + H[q_0] (up to a constant), whose
    gradient in (log ε, log r) is Campbell et al.'s. ``surrogate`` is what is differentiated:
    log p(x, z_T), plus, with ``tune_init``, q_0's own ELBO log p(x, μ + σ ⊙ ξ) + Σ log σ,
    the gradient of (μ, log σ)."""
    m = backend.math
    spread = float(np.log(config.init_inflation))

    def objective(params, fixed, xi, momenta, log_uniforms, data):
        step_size, inverse_mass, mean, log_scale = hyperparameters(backend, params, fixed)
        start = m.stop_gradient(mean + m.exp(log_scale + spread) * xi)
        state = (start, *potential_and_grad(start, data))

        def move(state, noise):
            new, info = hmc_move(
                backend,
                lambda z: potential_and_grad(z, data),
                state,
                noise[0],
                noise[1],
                step_size,
                inverse_mass,
                config.num_steps,
            )
            return new, info["acceptance_rate"]

        end, rates = backend.scan(move, state, (momenta, log_uniforms), config.chain_length)
        reported = -end[1] + m.sum(m.stop_gradient(log_scale) + spread)
        surrogate = -end[1]
        if config.tune_init:
            surrogate = surrogate - potential_and_grad(mean + m.exp(log_scale) * xi, data)[0]
            surrogate = surrogate + m.sum(log_scale)
        return surrogate, (reported, m.mean(rates))

    return objective


def tuning_transition(setup: Setup, config: ElboTuning, potential_and_grad) -> Transition:
    """The tuning as one chain of the core's loop: ``init(key, position, data)`` sets q_0's mean
    at ``position``; ``step`` draws the particles' noise from its key, averages the particles'
    objective gradients (leaving out non-finite ones) and takes an Adam step; info
    ``objective``, ``acceptance`` (the moves' mean acceptance rate), ``step_size`` and
    ``dropped`` (particles left out); ``emit``: (log ε, log m, μ, log σ) as one flat vector."""
    backend, dim = setup.backend, setup.layout.dim
    m, random = backend.math, backend.random
    optimizer = backend.optimizer(
        OptimizerConfig.build(optimizer="adam", lr=config.lr, num_steps=config.steps)
    )
    per_particle = backend.vmap(
        backend.value_and_grad(elbo_objective(backend, potential_and_grad, config), has_aux=True),
        in_axes=(None, None, 0, 0, 0, None),
    )
    tuned = ("log_step_size", "log_mass_factor")
    if config.tune_init:
        tuned += ("init_mean", "init_log_scale")

    def init(key, position, data):
        del key, data
        values = {
            "log_step_size": m.log(m.zeros_like(position[0]) + config.step_size),
            "log_mass_factor": m.zeros_like(position),
            "init_mean": position,
            "init_log_scale": m.zeros_like(position) + float(np.log(config.init_scale)),
        }
        params = {k: v for k, v in values.items() if k in tuned}
        fixed = {k: v for k, v in values.items() if k not in tuned}
        return {"params": params, "fixed": fixed, "optimizer": optimizer.init(params)}

    def step(key, state, batch: Batch, rate):
        keys = random.split(key, 3)
        shape = (config.particles, config.chain_length)
        xi = random.normal(keys[0], (config.particles, dim))
        momenta = random.normal(keys[1], (*shape, dim))
        log_u = m.log(random.uniform(keys[2], shape, 0.0, 1.0))
        (_, (values, rates)), grads = per_particle(
            state["params"], state["fixed"], xi, momenta, log_u, batch.data
        )
        ok = m.isfinite(values)
        for g in grads.values():
            ok = ok & m.isfinite(m.sum(m.reshape(g, (config.particles, -1)), axis=1))
        flags = m.where(ok, m.ones_like(values), m.zeros_like(values))
        count = m.sum(flags)
        weight = flags / count  # NaN when every particle failed: the loop stops there
        # Ascent on the objective: the optimizer minimises, so it takes the negated gradient.
        mean_grads = {
            k: -m.sum(_column(weight, g) * m.where(_column(ok, g), g, m.zeros_like(g)), axis=0)
            for k, g in grads.items()
        }
        params, opt_state = optimizer.update(
            mean_grads, state["optimizer"], state["params"], count > 0, rate
        )
        info = {
            "objective": m.sum(weight * m.where(ok, values, m.zeros_like(values))),
            "acceptance": m.sum(weight * m.where(ok, rates, m.zeros_like(rates))),
            "step_size": hyperparameters(backend, params, state["fixed"])[0],
            "dropped": config.particles - count,
        }
        return {**state, "params": params, "optimizer": opt_state}, info

    def emit(state):
        both = {**state["fixed"], **state["params"]}
        return m.concatenate(
            [
                m.reshape(both["log_step_size"], (1,)),
                both["log_mass_factor"],
                both["init_mean"],
                both["init_log_scale"],
            ]
        )

    return Transition(init, step, emit)


def _column(values, g):
    """``values`` (particles,) shaped to broadcast against a per-particle ``g`` (particles, ...)."""
    return values.reshape((-1,) + (1,) * (len(g.shape) - 1))


def tune(setup: Setup, config: ElboTuning, start: np.ndarray, seed: int, progress: bool):
    """Run the tuning from q_0's mean ``start``; the :class:`TunedKernel`."""
    backend, dim = setup.backend, setup.layout.dim
    density = ModelDensity(setup.bound, backend, setup.layout, setup.params)
    transition = tuning_transition(setup, config, lambda z, data: density.value_and_grad(z, data))
    keep = np.zeros(config.steps, bool)
    keep[-1] = True
    plan = plan_run(keep, 1, 3 * dim + 1, None, progress)
    run = run_chains(
        backend,
        transition,
        start[None],
        seed,
        plan,
        density.data,
        lambda c: None,
        "hmc (elbo tuning)",
        Rates(config.lr),
        progress=progress,
        chain_ids=[0],
        trace=True,
    )
    if run.failure is not None and run.failure.reason == "interrupted":
        raise RunInterrupted(
            f"HMC's ELBO tuning was interrupted at step {run.failure.step} of {config.steps}, "
            "before any draw."
        )
    if run.failure is not None:
        raise InferenceError(
            f"HMC's ELBO tuning: every particle's objective or gradient was not finite at step "
            f"{run.failure.step} of {config.steps}. Try a smaller initial step_size (it was "
            f"{config.step_size:g}), a smaller elbo_lr ({config.lr:g}), or a smaller "
            f"elbo_init_scale ({config.init_scale:g}) so that q_0 covers less of the tails."
        )
    row = run.draws[0, -1].astype(float)
    factor, log_scale = row[1 : 1 + dim], row[1 + 2 * dim :]
    log_mass = 2.0 * log_scale + factor - factor.mean()
    shift = log_mass.mean()  # reported with geometric mean 1; ε √m unchanged
    return TunedKernel(
        step_size=float(np.exp(row[0] + 0.5 * shift)),
        inverse_mass=np.exp(log_mass - shift),
        init_mean=row[1 + dim : 1 + 2 * dim],
        init_scale=np.exp(log_scale),
        objective=run.step_infos["objective"][0].astype(float),
    )


def run_elbo_hmc(
    setup: Setup,
    config: ElboTuning,
    *,
    num_warmup: int,
    num_samples: int,
    num_chains: int,
    thinning: int,
    seed: int,
    init,
    progress: bool = False,
    log_likelihood: bool = True,
    chain_ids: list[int] | None = None,
    chunk_size: int | None = None,
    vectorize: bool = True,
):
    """Tune HMC (:func:`tune`, from q_0 centred at chain 0's start from ``init``), then run the
    chains ``chain_ids`` (all by default) of the tuned kernel from draws of q_0: ``num_warmup``
    steps discarded, ``num_samples`` kept every ``thinning``-th step. A Posterior with the tuned
    values in ``post.settings``. The tuning depends on the seed only, so every group of chains
    an executor runs tunes the same kernel."""
    backend, dim = setup.backend, setup.layout.dim
    start = initial_positions(setup, init, 1, seed)[0]
    tuned = tune(setup, config, start, seed + TUNING_SEED_OFFSET, progress)
    tuned.record(setup.settings)
    chains = list(range(num_chains)) if chain_ids is None else list(chain_ids)
    positions = np.stack(
        [
            tuned.init_mean
            + config.init_inflation
            * tuned.init_scale
            * np.random.default_rng([seed, c, 3]).normal(size=dim)
            for c in chains
        ]
    )
    density, potential_and_grad = traced_potential(setup, None, None)
    transition = hmc_transition(
        backend, potential_and_grad, tuned.step_size, tuned.inverse_mass, config.num_steps
    )
    keep = np.zeros(num_warmup + num_samples * thinning, bool)
    keep[num_warmup + thinning - 1 :: thinning] = True
    run = run_chains(
        backend,
        transition,
        positions,
        seed,
        plan_run(keep, len(chains), dim, chunk_size, progress),
        density.data,
        lambda c: None,
        "hmc",
        progress=progress,
        chain_ids=chains,
        vectorize=vectorize,
    )
    if run.failure is not None:
        raise_failure(
            setup,
            run,
            kind="HMC",
            requested=num_samples,
            method="hmc",
            log_likelihood=log_likelihood,
        )
    stats = arviz_stats(run.infos, "hmc")
    return build_posterior(setup, run.draws, stats, "hmc", log_likelihood=log_likelihood)
