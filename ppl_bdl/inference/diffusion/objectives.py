"""The score-matching objectives, written once with :mod:`ppl_bdl.dsl.math` and the Backend's
autodiff.

- Denoising score matching (Vincent 2011; "Bayesian Computation in Deep Learning", Eq. 3.11),
  weighted over time as Song et al. (2021, Eq. 7) do with λ(t) = σ(t)²: for x_0 from the data,
  t ~ U(t_min, 1) and z ~ N(0, I), x_t = a(t) x_0 + σ(t) z, whose kernel's score is −z/σ(t), and

      L(θ) = ½ E[ λ(t) ‖s_θ(x_t, t) + z/σ(t)‖² ] = ½ E[ ‖σ(t) s_θ(x_t, t) + z‖² ].

- Exact score matching (Hyvärinen 2005; Eq. 3.10): L(θ) = E[ tr(∇_x s_θ(x)) + ½ ‖s_θ(x)‖² ],
  the trace of the Jacobian summed from D forward-mode products (``backend.jvp`` with the unit
  vectors): exact, and affordable for small D only.

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl.inference.diffusion.objectives import exact_loss
>>> backend = bdl.backends.get("numpyro")
>>> score = lambda params, x, t=None: -x          # the score of N(0, I)
>>> with backend.activate():
...     x = backend.asarray(np.array([[1.0, 2.0], [0.0, 0.0]]))
...     value = exact_loss(backend, score, {}, x)   # mean of −2 + ½|x|²
>>> float(value)
-0.75
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ppl_bdl.dsl import math as bm

Array = Any


def perturbed(sde, x0: Array, t: Array, z: Array) -> Array:
    """x_t = a(t) x_0 + σ(t) z (``t`` one time per row)."""
    column = bm.reshape(t, (-1, 1))
    return sde.mean_coef(column, bm) * x0 + sde.std(column, bm) * z


def dsm_terms(score, sde, params: dict, x0: Array, t: Array, z: Array) -> Array:
    """½ ‖σ(t) s_θ(x_t, t) + z‖² per row (B,): each row's term of the weighted objective."""
    sigma = bm.reshape(sde.std(t, bm), (-1, 1))
    residual = sigma * score(params, perturbed(sde, x0, t, z), t) + z
    return 0.5 * bm.sum(residual * residual, axis=-1)


def dsm_loss(score, sde, params: dict, x0: Array, t: Array, z: Array) -> Array:
    """The weighted denoising score-matching loss, a minibatch mean (see the module)."""
    return bm.mean(dsm_terms(score, sde, params, x0, t, z))


def exact_loss(backend, score, params: dict, x: Array) -> Array:
    """Hyvärinen's objective: mean over the rows of tr(∇_x s_θ(x)) + ½ ‖s_θ(x)‖² (Eq. 3.10)."""
    return bm.mean(exact_terms(backend, score, params, x))


def exact_terms(backend, score, params: dict, x: Array) -> Array:
    """tr(∇_x s_θ(x)) + ½ ‖s_θ(x)‖² per row (B,)."""
    dim = int(x.shape[-1])
    dtype = np.float32 if "32" in str(x.dtype) else np.float64
    values, trace = None, 0.0
    for d in range(dim):
        unit = np.zeros((1, dim), dtype=dtype)
        unit[0, d] = 1.0
        tangent = bm.zeros_like(x) + backend.asarray(unit)
        values, column = backend.jvp(lambda y: score(params, y), (x,), (tangent,))
        trace = trace + column[:, d]  # (J e_d)_d, row by row: the rows are independent
    return trace + 0.5 * bm.sum(values * values, axis=-1)
