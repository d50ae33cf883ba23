"""The loss of an amortized guide whose draws are refined by MCMC
(:mod:`ppl_bdl.inference.vi.guides.amortized_refine`; Hoffman 2017).

At one draw θ_g of the global latents, K draws z_0 ~ q_0(z | x_i) of each of the B points, and
their refined draws z_T (T Metropolis-adjusted steps targeting p(z | x_i, θ)), one step follows

- the encoder φ: the gradient of its bound on z_0 (the ELBO by default, IWAE or Rényi as
  asked; :mod:`ppl_bdl.inference.vi.objectives_amortized`), at θ_g and the model's parameters
  held constant;
- the model (its ``bdl.param`` sites and the global guide): the gradient of
  log p(θ_g) − log q(θ_g) + (N/B) Σ_i mean_k log p(x_i, z_T,ik | θ_g), z_T held constant:
  Monte Carlo EM's M-step with the chain's draws standing in for the posterior's;
- an adapted step size (``refine_target_accept``): −(mean acceptance − target), acceptance held
  constant (the guide's ``refine:log_step_size``).

The loss's value is the negative bound of q_0 (its terms without gradient are added as
``f − stop_gradient(f)``: zero in value), so a refined fit reports what an unrefined one does.
"""

from __future__ import annotations

from ppl_bdl.inference.mcmc.batched_hmc import EXTRA_NORMALS
from ppl_bdl.inference.vi.objectives import MODEL_PREFIX, ObjectiveConfig
from ppl_bdl.inference.vi.objectives_amortized import (
    analytic_kl,
    closed_form_kl,
    particle_rows,
    per_point_bound,
    point_log_weights,
)
from ppl_bdl.trace.pointwise import PointDensity


def make_refined_loss(guide, config: ObjectiveConfig, model_params=None):
    """``(loss(params, noise, batch) -> scalar, its PointDensity)`` as
    :func:`~ppl_bdl.inference.vi.objectives_amortized.make_amortized_loss` gives, for a guide
    with ``refinement.steps`` > 0 (see the module docstring)."""
    backend, m = guide.backend, guide.m
    K, N, d = config.num_particles, guide.size, guide.local_dim
    size_g, refinement = guide.global_noise_size(), guide.refinement
    kl = closed_form_kl(guide, config)
    path = config.gradient == "path"
    local = frozenset(n for n, _, _ in guide.local)
    bound_model = guide.trace.bound
    full = PointDensity(bound_model, backend, guide.plate, local, guide.params)
    encoder_density = full
    if kl is not None:
        encoder_density = PointDensity(
            bound_model, backend, guide.plate, local, guide.params, exclude=frozenset(kl[0])
        )

    def held(value):
        return m.stop_gradient(value)

    def loss(params, noise, batch):
        extra = None
        if model_params is not None:
            extra = model_params.constrained(params, m)
            params = {k: v for k, v in params.items() if not k.startswith(MODEL_PREFIX)}
        fixed_extra = None if extra is None else {k: held(v) for k, v in extra.items()}
        B = N if batch.indices is None else int(batch.indices.shape[0])
        eps = m.reshape(noise[size_g : size_g + K * B * d], (K, B, d))
        chain_noise = m.reshape(
            noise[size_g + K * B * d :], (refinement.steps, K * B, d + EXTRA_NORMALS)
        )
        theta_g, log_q_g = guide.global_draw(params, noise[:size_g], path=path)
        x, data, indices = guide.inputs(batch.data), batch.data, batch.indices
        _, log_w, loc, scale = point_log_weights(
            guide,
            encoder_density,
            params,
            None,
            eps,
            x,
            data,
            indices,
            fixed_extra,
            None if kl is None else kl[1],
            path,
            global_draw=(held(theta_g), 0.0),
        )
        bound = per_point_bound(log_w, config, m)
        if kl is not None:
            bound = bound - analytic_kl(kl, loc, scale, backend)
        rows = particle_rows(guide, indices, K, B)
        locs, scales = (m.concatenate([a] * K, axis=0) if K > 1 else a for a in (loc, scale))
        z0 = m.reshape(loc + scale * eps, (K * B, d))
        z_t, accept = guide.refine(
            full, params, z0, locs, scales, theta_g, data, rows, fixed_extra, chain_noise
        )
        sites = {**guide.global_sites(theta_g), **guide.local_sites(z_t)}
        outside, log_p = full(sites, data, rows, extra)
        model_fit = outside - log_q_g + (N / B) * m.sum(log_p) / K
        objective = held(outside - log_q_g) + (N / B) * m.sum(bound)
        objective = objective + model_fit - held(model_fit)
        if refinement.adapts:
            log_step = m.reshape(params["refine:log_step_size"], ())
            objective = objective + held(accept - refinement.target_accept) * (
                log_step - held(log_step)
            )
        return -objective

    return loss, full


__all__ = ["make_refined_loss"]
