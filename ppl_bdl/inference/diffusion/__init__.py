"""Score-based and diffusion models (Sections 3.1.2 and 3.2 of "Bayesian Computation in Deep
Learning").

:func:`fit` trains a noise-conditional score network s_θ(x, t) ≈ ∇_x log p_t(x) by weighted
denoising score matching over the times of a forward SDE (Vincent 2011; Song et al. 2021: the
variance-exploding :class:`VESDE` or variance-preserving :class:`VPSDE`), or a score s_θ(x) by
Hyvärinen's exact score matching. It returns a :class:`ScoreModel` with ``score(x, t)`` and
``sample(n, sampler=...)``: reverse-SDE Euler-Maruyama, predictor-corrector, the probability-flow
ODE, or annealed Langevin dynamics. :func:`energy_distance` compares draws with held-out data, and
:func:`fit_gaussian` is the baseline a trained model should beat. See docs/diffusion.md.

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import nn
>>> X = np.random.default_rng(0).normal(size=(200, 2))
>>> model = bdl.diffusion.fit(nn.MLP("score", [2 + 1, 16, 2]), X, sde="vp",
...                           backend="numpyro", num_steps=20)
>>> model.sample(10, steps=20).shape
(10, 2)
"""

from ppl_bdl.inference.diffusion.evaluation import energy_distance, fit_gaussian
from ppl_bdl.inference.diffusion.model import ScoreModel
from ppl_bdl.inference.diffusion.samplers import INTEGRATORS, SAMPLERS
from ppl_bdl.inference.diffusion.sde import SDE_NAMES, VESDE, VPSDE
from ppl_bdl.inference.diffusion.trainer import OBJECTIVES, ScoreTrainer, fit

__all__ = [
    "INTEGRATORS",
    "OBJECTIVES",
    "SAMPLERS",
    "SDE_NAMES",
    "VESDE",
    "VPSDE",
    "ScoreModel",
    "ScoreTrainer",
    "energy_distance",
    "fit",
    "fit_gaussian",
]
