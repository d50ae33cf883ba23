"""The objectives of an amortized guide, per point: the ELBO, IWAE and Rényi bounds of each point's
log p(x_i | θ) with q(z_i | x_i) from the encoder (:mod:`ppl_bdl.inference.vi.guides.amortized`).

With the global latents θ drawn once from their guide, the minibatch's points i = 1..B, and K
particles z_i^(k) ~ q(z_i | x_i) per point, log w_ik = log p(x_i, z_i^(k) | θ) − log q(z_i^(k) |
x_i), and the bound of point i is

- ``elbo``: mean_k log w_ik (Eq. 3.16-3.17 of "Bayesian Computation in Deep Learning"; Algorithm 4). A local site whose
  prior is a Normal with fixed parameters has its KL term in closed form, as Algorithm 4's line 5
  (``kl="auto"``, the default; ``kl="mc"`` keeps it Monte Carlo);
- ``iwae``: log (1/K) Σ_k w_ik (Burda et al. 2015; Eq. 3.18 of "Bayesian Computation in Deep Learning"): a tighter bound,
  non-decreasing in K, tending to log p(x_i | θ);
- ``renyi``: 1/(1−α) log (1/K) Σ_k w_ik^{1−α} (Li & Turner 2016; Eq. 2.21 of "Bayesian Computation in Deep Learning").

Under ``gradient="path"`` (the ELBO only; :mod:`ppl_bdl.inference.vi.objectives`) the gradient is the path
derivative (Roeder, Wu and Duvenaud 2017, Eq. 8): log q(z_i | x_i) is evaluated at the draw
z_i = μ_φ(x_i) + σ_φ(x_i) ε with the encoder's outputs μ, σ held constant (stop-gradient), and
log q(θ) of the global draw with the global guide's parameters held constant, so only the path
through the draws is differentiated and the score term (expectation zero) is dropped. The KL term
is then Monte Carlo (the closed form has no path to keep): where q(z_i | x_i) is the exact
posterior, log p(x_i, z_i | θ) − log q(z_i | x_i) is constant in z_i and the estimate's variance
is zero.

The objective is log p(θ) − log q(θ) + (N/B) Σ_i bound_i (the sites outside the data plate
once, the points scaled up to the data set): a lower bound of log p(D) in expectation, since each
bound_i is one of log p(x_i | θ) given θ (hierarchical: the ELBO over θ, the per-point bound over
z_i). All the model's runs of a step are one: K particles of B points are K·B indices of the data
plate.

Example
-------
>>> from ppl_bdl.inference.vi.objectives_amortized import per_point_bound
>>> from ppl_bdl.inference.vi.objectives import ObjectiveConfig
>>> import numpy as np, ppl_bdl as bdl
>>> backend = bdl.backends.get("numpyro")
>>> lw = backend.asarray(np.log([[1.0, 2.0], [3.0, 2.0]]))   # K = 2 particles of 2 points
>>> with backend.activate():
...     iwae = per_point_bound(lw, ObjectiveConfig.build("iwae", num_particles=2), backend.math)
>>> np.round(np.exp(np.asarray(iwae)), 3).tolist()   # the mean weight per point
[2.0, 2.0]
"""

from __future__ import annotations

import math as _pymath
from typing import Any

import numpy as np

from ppl_bdl.errors import ConfigError
from ppl_bdl.inference.vi.guides.base import LOG_2PI
from ppl_bdl.inference.vi.objectives import MODEL_PREFIX, ObjectiveConfig
from ppl_bdl.trace.pointwise import PointDensity


def per_point_bound(log_w, config: ObjectiveConfig, m) -> Any:
    """The bound of each point from its log weights ``log_w`` (K, B): (B,)."""
    K = int(log_w.shape[0])
    if config.name == "elbo" or (config.name == "renyi" and config.alpha == 1.0):
        return m.mean(log_w, axis=0)
    one_minus = 1.0 if config.name == "iwae" else 1.0 - config.alpha
    return (m.logsumexp(one_minus * log_w, axis=0) - _pymath.log(K)) / one_minus


def point_log_weights(
    guide,
    density,
    params: dict,
    noise_global,
    eps,
    x,
    data,
    indices,
    model_params=None,
    mask=None,
    path=False,
    global_draw=None,
):
    """(log p of the sites outside the plate − log q(θ), log w (K, B), loc (B, d), scale (B, d))
    at one draw of the global sites (from ``noise_global``) and K draws of the local
    coordinates of B points (``eps`` (K, B, d)); ``x`` is the encoder's input array (all
    points), ``data`` the model's arrays, ``indices`` the points (None: all N).
    ``mask`` (NumPy, (d,)): 1 where log q stays Monte Carlo (0: a closed-form KL handles it).
    ``path``: log q with the encoder's outputs and the global guide's parameters held constant
    (the path derivative; see the module docstring). ``global_draw``: (θ_g, log q(θ_g)) drawn
    already (``noise_global`` is then unused)."""
    m = guide.m
    K, B, d = (int(s) for s in eps.shape)
    loc, scale = guide.encode(params, x if indices is None else x[indices])
    z = loc + scale * eps
    if path:  # Roeder et al. 2017, Eq. 8: log N(z; mu, sigma^2) with mu, sigma constant
        fixed_scale = m.stop_gradient(scale)
        u = (z - m.stop_gradient(loc)) / fixed_scale
        per = -m.log(fixed_scale) - 0.5 * u * u
    else:  # (z - loc) / scale = eps
        per = -m.log(scale) - 0.5 * eps * eps
    n_mc = d
    if mask is not None:
        per, n_mc = per * guide.backend.asarray(mask), float(np.sum(mask))
    log_q = m.sum(per, axis=-1) - 0.5 * n_mc * LOG_2PI
    if global_draw is None:
        global_draw = guide.global_draw(params, noise_global, path=path)
    theta_g, log_q_g = global_draw
    sites = guide.global_sites(theta_g)
    sites.update(guide.local_sites(m.reshape(z, (K * B, d))))
    rows = particle_rows(guide, indices, K, B)
    outside, log_p = density(sites, data, rows, model_params)
    return outside - log_q_g, m.reshape(log_p, (K, B)) - log_q, loc, scale


def particle_rows(guide, indices, K: int, B: int):
    """The data plate's indices of K particles of B points, particle-major (None: all N points,
    one particle)."""
    if K == 1:
        return indices
    points = guide.backend.arange(B) if indices is None else indices
    return guide.m.concatenate([points] * K)


def analytic_kl(kl: tuple, loc, scale, backend):
    """KL[N(μ, σ²) || N(m, s²)] per point (B,), summed over the coordinates of the sites whose KL
    term is in closed form (``kl`` from :func:`closed_form_kl`)."""
    m = backend.math
    _, mask, prior_loc, prior_scale = kl
    s = backend.asarray(prior_scale)
    diff, ratio = (loc - backend.asarray(prior_loc)) / s, scale / s
    terms = -m.log(ratio) + 0.5 * (ratio * ratio + diff * diff) - 0.5
    return m.sum(terms * backend.asarray(1.0 - mask), axis=-1)


def closed_form_kl(guide, config: ObjectiveConfig):
    """The local coordinates whose KL term is computed in closed form (sites with a Normal prior
    of fixed parameters, under the ELBO with the total gradient): (sites, mask (d,), prior loc
    (d,), prior scale (d,)), mask 1 where log q stays Monte Carlo; None when there are none
    (under ``gradient="path"`` the KL term is Monte Carlo, as for the other guides)."""
    if config.name != "elbo" or config.kl == "mc" or config.gradient == "path":
        return None
    mask, loc, scale = np.ones(guide.local_dim), np.zeros(guide.local_dim), np.ones(guide.local_dim)
    names, start = [], 0
    for name, shape, size in guide.local:
        site = guide.trace.sites[name]
        params = site.spec.params
        if site.spec.name == "Normal" and all(_static(v) for v in params.values()):
            sl = slice(start, start + size)
            for out, key, default in ((loc, "loc", 0.0), (scale, "scale", 1.0)):
                value = np.asarray(params.get(key, default), float)
                out[sl] = np.broadcast_to(value, shape).reshape(-1)
            mask[sl] = 0.0
            names.append(name)
        start += size
    if not names:
        if config.kl == "analytic":
            raise ConfigError(
                f"kl='analytic': none of the amortized sites {[n for n, _, _ in guide.local]} has "
                "a Normal prior with fixed parameters; use kl='auto' or kl='mc'."
            )
        return None
    return names, mask, loc, scale


def make_amortized_loss(guide, config: ObjectiveConfig, model_params=None):
    """The loss ``loss(params, noise, batch) -> scalar`` (the negative objective; see the module
    docstring) of an amortized guide, and the :class:`~ppl_bdl.trace.pointwise.PointDensity` it
    evaluates (its ``data`` are the arrays a step receives). ``noise`` is flat
    (``guide.noise_shape(K)``); ``model_params`` a :class:`~ppl_bdl.inference.vi.objectives.ModelParams`."""
    backend, m = guide.backend, guide.m
    K, N, size_g = config.num_particles, guide.size, guide.global_noise_size()
    kl = closed_form_kl(guide, config)
    path = config.gradient == "path"
    local = frozenset(n for n, _, _ in guide.local)
    density = PointDensity(
        guide.trace.bound,
        backend,
        guide.plate,
        local,
        guide.params,
        exclude=frozenset(kl[0]) if kl else frozenset(),
    )
    mask = None if kl is None else kl[1]

    def loss(params, noise, batch):
        extra = None
        if model_params is not None:
            extra = model_params.constrained(params, m)
            params = {k: v for k, v in params.items() if not k.startswith(MODEL_PREFIX)}
        B = N if batch.indices is None else int(batch.indices.shape[0])
        eps = m.reshape(noise[size_g:], (K, B, guide.local_dim))
        outside, log_w, loc, scale = point_log_weights(
            guide,
            density,
            params,
            noise[:size_g],
            eps,
            guide.inputs(batch.data),
            batch.data,
            batch.indices,
            extra,
            mask,
            path,
        )
        bound = per_point_bound(log_w, config, m)
        if kl is not None:
            bound = bound - analytic_kl(kl, loc, scale, backend)
        return -(outside + (N / B) * m.sum(bound))

    return loss, density


def _static(value: Any) -> bool:
    return isinstance(value, int | float | np.ndarray | np.number) and not isinstance(value, bool)
