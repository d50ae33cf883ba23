"""Drawing from a score model: the reverse-time SDE, predictor-corrector, the probability-flow
ODE and annealed Langevin dynamics, each one transition of the project's loop.

Time runs from t_0 = 1 down to t_N = ``t_min`` on N = ``steps`` equal steps of length h, from
x ~ the SDE's prior N(0, σ_prior² I); s = s_θ(x, t) is the score model.

- ``"euler"``: Euler-Maruyama on the reverse-time SDE dx = [f(x, t) − g(t)² s] dt + g(t) dw̄
  ("Bayesian Computation in Deep Learning", Eq. 3.13; Song et al. 2021, Eq. 6):
  x ← x − [f − g² s] h + g √h z; the last step adds no noise (its mean is returned).
- ``"pc"``: predictor-corrector (Song et al. 2021, Alg. 4 for VE, Alg. 5 for VP; the chapter's
  Section 3.2.1): at each t_i, M = ``corrector_steps`` Langevin steps on p_{t_i},
  x ← x + ε s + √(2ε) z with ε = 2 α_i (r ‖z‖ / ‖s‖)² (r = ``snr``; ‖·‖ the mean over the draws
  of each draw's norm, ‖z‖ at its expectation), then the Euler-Maruyama step to t_{i+1} as the
  predictor. The corrector runs before the predictor, as in Song et al.'s reference code, so the
  last predictor's mean is returned.
- ``"ode"``: the probability-flow ODE dx/dt = f − ½ g² s (Song et al. 2021, Eq. 13), deterministic
  given the start: Euler, or Heun's second-order method (``integrator="heun"``, the default).
- ``"langevin"``: annealed Langevin dynamics (Song and Ermon 2019, Alg. 1): at each of N noise
  levels σ_i = σ(t_i), t_i from 1 to t_min, M = ``corrector_steps`` steps of Eq. 3.8,
  x ← x + α_i s(x, t_i) + √(2 α_i) z, with α_i = ``step_size`` · σ_i² (Song and Ermon's
  ε σ_i² / σ_L², here with step_size = ε / (2 σ_L²): their update halves α). Under the VP SDE
  the draws are multiplied by a(t_i)/a(t_{i−1}) on entering level i: x/a(t) has the marginals of
  a VE SDE, whose levels Song and Ermon anneal, and without it the chains, slow at small σ_i,
  would lag behind the growing mean a(t) E[x_0]. A model of x alone
  (exact score matching) runs Eq. 3.8 at the fixed α = ``step_size``, N·M steps.

Every Langevin step (the corrector's and annealed Langevin's) is the project's SGLD update
(:func:`ppl_bdl.inference.mcmc.kernels.sgld.langevin_update`, on the potential whose gradient is
−s), so it draws its own noise.

Example
-------
>>> from ppl_bdl.inference.diffusion.samplers import SamplerSpec
>>> SamplerSpec.build("pc", steps=100).loop_steps
100
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ppl_bdl.dsl import math as bm
from ppl_bdl.dsl import random as br
from ppl_bdl.errors import ConfigError
from ppl_bdl.inference.diffusion.sde import positive
from ppl_bdl.inference.ebm.loop import checked_int
from ppl_bdl.inference.loop.driver import Transition
from ppl_bdl.inference.mcmc.kernels.sgld import langevin_update

#: The samplers ``sample(sampler=...)`` names.
SAMPLERS = ("euler", "pc", "ode", "langevin")
#: The integrators of the probability-flow ODE.
INTEGRATORS = ("euler", "heun")


@dataclass(frozen=True)
class SamplerSpec:
    """A sampler and its settings (see the module); :meth:`build` checks them."""

    sampler: str = "euler"
    steps: int = 500
    corrector_steps: int = 1
    snr: float = 0.16
    step_size: float = 0.1
    integrator: str = "heun"

    @classmethod
    def build(
        cls,
        sampler: str = "euler",
        *,
        steps: int = 500,
        corrector_steps: int = 1,
        snr: float = 0.16,
        step_size: float = 0.1,
        integrator: str = "heun",
    ) -> SamplerSpec:
        if sampler not in SAMPLERS:
            raise ConfigError(
                f"unknown sampler {sampler!r}; expected one of {list(SAMPLERS)} (reverse-SDE "
                "Euler-Maruyama, predictor-corrector, probability-flow ODE, annealed Langevin)."
            )
        if integrator not in INTEGRATORS:
            raise ConfigError(
                f"unknown integrator {integrator!r} of the probability-flow ODE; expected one "
                f"of {list(INTEGRATORS)}."
            )
        return cls(
            sampler,
            checked_int("steps", steps, 1),
            checked_int("corrector_steps", corrector_steps, 1),
            positive("snr", snr),
            positive("step_size", step_size),
            integrator,
        )

    @property
    def loop_steps(self) -> int:
        """Steps of the loop: one per time step, or per Langevin step for ``"langevin"``."""
        return self.steps * (self.corrector_steps if self.sampler == "langevin" else 1)


def expected_noise_norm(dim: int) -> float:
    """E‖z‖ for z ~ N(0, I_D): √2 Γ((D+1)/2) / Γ(D/2)."""
    return math.sqrt(2.0) * math.exp(math.lgamma((dim + 1) / 2) - math.lgamma(dim / 2))


def step_arrays(sde, spec: SamplerSpec) -> dict[str, np.ndarray]:
    """The per-loop-step values, on the host: ``t`` and ``t_next`` (the step's times), ``noise``
    (1, or 0 on the last Euler-Maruyama step; annealed Langevin's rescaling of x), ``alpha``
    (the corrector's α_i, or annealed Langevin's step α_i)."""
    if sde is None:  # Eq. 3.8 on a score of x alone: a fixed step size
        k = spec.loop_steps
        zeros = np.zeros(k)
        return {"t": zeros, "t_next": zeros, "noise": zeros + 1.0, "alpha": zeros + spec.step_size}
    if spec.sampler == "langevin":
        levels = np.linspace(1.0, sde.t_min, spec.steps)
        t = np.repeat(levels, spec.corrector_steps)
        alpha = spec.step_size * np.asarray(sde.std(t)) ** 2
        # x · a(t_i)/a(t_{i−1}) on entering level i (1 elsewhere, and always for VE)
        coef = np.asarray(sde.mean_coef(levels)) + 0.0 * levels
        rescale = np.ones_like(t)
        rescale[:: spec.corrector_steps] = coef / np.concatenate([coef[:1], coef[:-1]])
        return {"t": t, "t_next": t, "noise": rescale, "alpha": alpha}
    grid = np.linspace(1.0, sde.t_min, spec.steps + 1)
    h = (1.0 - sde.t_min) / spec.steps
    noise = np.ones(spec.steps)
    noise[-1] = 0.0
    alpha = np.asarray(sde.corrector_alpha(grid[:-1], h)) + 0.0 * grid[:-1]
    return {"t": grid[:-1], "t_next": grid[1:], "noise": noise, "alpha": alpha}


def sampling_transition(backend, score, sde, spec: SamplerSpec, shape, params) -> Transition:
    """The loop's transition of ``spec`` on n draws of D numbers (``shape`` (n, D)): position
    the n draws laid out flat, state ``{"x", "i"}`` (i: the loop step), θ the loop's data."""
    n, dim = shape
    h = 0.0 if sde is None else (1.0 - sde.t_min) / spec.steps
    noise_norm = expected_noise_norm(dim)
    x_example = backend.asarray(np.zeros(shape))
    evaluate = backend.trace(
        lambda x, t, theta: score(theta, x, t), (x_example, backend.asarray(0.5), params)
    )
    arrays = {k: backend.asarray(v) for k, v in step_arrays(sde, spec).items()}

    def flow(x, t, theta, weight):
        """f(x, t) − weight · g(t)² s_θ(x, t): the reverse drift (weight 1) or the ODE's (½)."""
        return sde.drift(x, t, bm) - weight * sde.diffusion2(t, bm) * evaluate(x, t, theta)

    def langevin(key, x, t, theta, alpha):
        grad = -evaluate(x, t, theta)  # the potential's gradient: minus the score
        if spec.sampler == "pc":  # Song et al.'s step size at signal-to-noise ratio r
            grad_norm = bm.mean(bm.sqrt(bm.sum(grad * grad, axis=-1)))
            alpha = 2.0 * alpha * (spec.snr * noise_norm / grad_norm) ** 2
        return langevin_update(key, x, grad, alpha, 1.0)

    def euler(key, x, t, theta, noise_on):
        mean = x - flow(x, t, theta, 1.0) * h
        return mean + noise_on * bm.sqrt(sde.diffusion2(t, bm) * h) * br.normal(key, shape)

    def ode(x, t, t_next, theta):
        slope = flow(x, t, theta, 0.5)
        if spec.integrator == "euler":
            return x - slope * h
        guess = x - slope * h
        return x - 0.5 * (slope + flow(guess, t_next, theta, 0.5)) * h

    def init(key, position, data):
        return {"x": bm.reshape(position, shape), "i": backend.asarray(0, dtype="int")}

    def step(key, state, batch, rate):
        i, x, theta = state["i"], state["x"], batch.data
        t, t_next = arrays["t"][i], arrays["t_next"][i]
        alpha, noise_on = arrays["alpha"][i], arrays["noise"][i]
        keys = backend.random.split(key, spec.corrector_steps + 1)
        if spec.sampler == "langevin" or sde is None:
            x = langevin(keys[0], noise_on * x, t, theta, alpha)
        elif spec.sampler == "ode":
            x = ode(x, t, t_next, theta)
        else:
            if spec.sampler == "pc":
                for j in range(spec.corrector_steps):
                    x = langevin(keys[j + 1], x, t, theta, alpha)
            x = euler(keys[0], x, t, theta, noise_on)
        return {"x": x, "i": i + 1}, {"t": t}

    return Transition(init, step, lambda state: bm.reshape(state["x"], (-1,)))
