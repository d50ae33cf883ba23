"""MCMC-refined amortized posteriors: q_T(z | x), T steps of a Markov kernel that leaves the
exact conditional p(z_i | x_i, θ) invariant, started at the encoder's draw z_0 ~ q_0(z | x)
(Section 3.3.2 of "Bayesian Computation in Deep Learning"; Hoffman 2017; Li, Turner & Liu 2017).

``guides.Amortized(encoder, sites=[...], refine_steps=T, refine_kernel="hmc")``: each point's
chain is Metropolis-adjusted HMC (``"hmc"``, ``refine_leapfrog`` leapfrog steps) or MALA
(``"langevin"``: one leapfrog step, Metropolis-adjusted), on log p(x_i, z_i | θ) at the model's
current parameters and a draw of its global latents, in the coordinates u = (z − μ_φ(x)) / σ_φ(x)
the encoder standardises (:mod:`ppl_bdl.inference.mcmc.batched_hmc`). The step size
``refine_step_size`` is in those coordinates; with ``refine_target_accept`` it is adapted during
training toward that mean acceptance probability: its log is a parameter whose gradient is
−(mean acceptance − target) (the acceptance held constant), so the optimizer's steps raise it
while the chains accept more often than the target and lower it otherwise, a Robbins-Monro
rule at the optimizer's rate.

Training (Hoffman 2017): the encoder is fitted by its own bound on z_0 (the ELBO, or the
objective asked for) with the model's parameters and global latents held constant there, and
the model (its ``bdl.param`` sites and the global latents' guide) by log p(x_i, z_T | θ) at the
refined draws, z_T held constant (no gradient through the chain). The loss a fit reports is the
negative bound of q_0, as without refinement.

Example
-------
>>> from ppl_bdl.inference.vi.guides.amortized_refine import Refinement
>>> Refinement.build(5, "langevin", 0.2, 3, None)
Refinement(steps=5, kernel='langevin', step_size=0.2, leapfrog=1, target_accept=None)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ppl_bdl.errors import ConfigError, one_of
from ppl_bdl.inference.mcmc.batched_hmc import EXTRA_NORMALS

#: The Markov kernels a refinement runs.
REFINE_KERNELS = ("hmc", "langevin")
#: The options of :class:`~ppl_bdl.inference.vi.guides.Amortized` that configure a refinement.
REFINE_OPTIONS = (
    "refine_steps",
    "refine_kernel",
    "refine_step_size",
    "refine_leapfrog",
    "refine_target_accept",
)
#: The guide parameter holding the log step size when it is adapted.
LOG_STEP_SIZE = "refine:log_step_size"


@dataclass(frozen=True)
class Refinement:
    """A refinement's settings, checked (:meth:`build`); ``steps == 0``: none."""

    steps: int
    kernel: str
    step_size: float
    leapfrog: int
    target_accept: float | None

    @staticmethod
    def build(
        steps: Any, kernel: Any, step_size: Any, leapfrog: Any, target_accept: Any
    ) -> Refinement:
        """The settings of ``guides.Amortized(refine_...=...)``, each checked."""
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise ConfigError(
                f"Amortized(refine_steps={steps!r}): refine_steps must be an int >= 0, the MCMC "
                "steps that refine each draw of the encoder (0: no refinement)."
            )
        if kernel not in REFINE_KERNELS:
            raise one_of(
                "Amortized refine_kernel",
                kernel,
                REFINE_KERNELS,
                "'hmc': Metropolis-adjusted HMC; 'langevin': MALA (Metropolis-adjusted Langevin).",
            )
        if isinstance(step_size, bool) or not isinstance(step_size, int | float) or step_size <= 0:
            raise ConfigError(
                f"Amortized(refine_step_size={step_size!r}): a number > 0, the step size in the "
                "coordinates the encoder standardises, (z - mu) / sigma (0.1 to 1 typically)."
            )
        if isinstance(leapfrog, bool) or not isinstance(leapfrog, int) or leapfrog < 1:
            raise ConfigError(
                f"Amortized(refine_leapfrog={leapfrog!r}): an int >= 1, the leapfrog steps of "
                "one HMC step."
            )
        if target_accept is not None and (
            isinstance(target_accept, bool)
            or not isinstance(target_accept, int | float)
            or not 0 < target_accept < 1
        ):
            raise ConfigError(
                f"Amortized(refine_target_accept={target_accept!r}): None (a fixed step size) or "
                "a number in (0, 1), the mean acceptance probability the step size is adapted to "
                "during training (0.8 is common for HMC, 0.6 for MALA)."
            )
        return Refinement(
            steps,
            kernel,
            float(step_size),
            1 if kernel == "langevin" else leapfrog,
            None if target_accept is None else float(target_accept),
        )

    @property
    def adapts(self) -> bool:
        """Whether the step size is adapted during training (a guide parameter)."""
        return self.steps > 0 and self.target_accept is not None

    def noise_size(self, rows: int, dim: int) -> int:
        """Standard normals of the chains of ``rows`` draws of ``dim`` coordinates."""
        return self.steps * rows * (dim + EXTRA_NORMALS)


def refinement_misplaced(names: list[str], where: str) -> ConfigError:
    """The error for refine options given where no amortized guide takes them."""
    return ConfigError(
        f"option(s) {sorted(names)} given to {where}: they configure the MCMC refinement of an "
        "amortized guide's draws. Pass them to the guide: guide=guides.Amortized(encoder, "
        f"sites=[...], {names[0]}=...)."
    )


__all__ = [
    "LOG_STEP_SIZE",
    "REFINE_KERNELS",
    "REFINE_OPTIONS",
    "Refinement",
    "refinement_misplaced",
]
