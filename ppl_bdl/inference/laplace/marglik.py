"""``prior_precision="marglik"``: the Normal priors' precision rescaled to maximise the Laplace
evidence, with the MAP held fixed (MacKay 1992; Immer et al. 2021; laplace-torch's
``optimize_prior_precision``).

The Gaussian coordinates whose site has a Normal prior with fixed ``loc`` μ and ``scale`` s
(outside every plate) have prior precision λ₀ = 1/s². Their precision is scaled by c > 0 and
the Laplace approximation of the evidence (Daxberger et al. 2021, Eq. 4),

    log p(D | c) ≈ log p(D, θ* | c) + (k/2) log 2π − ½ log det P(c),
    P(c) = H_rest + c Λ₀,

is maximised over log c (a bounded scalar search), θ* held where the fit found it. H_rest is
the fitted precision less the prior's Λ₀ (the likelihood's curvature and every other prior's).
The terms that depend on c are −½ c Σ λ₀ (θ* − μ)² + ½ n₀ log c − ½ log det P(c), with n₀ the
number of such coordinates. At the optimum MacKay's fixed point holds:
c = γ / Σ λ₀ (θ* − μ)², γ = n₀ − c tr(P(c)⁻¹ Λ₀) (the effective number of parameters).
"""

from __future__ import annotations

import numpy as np

from ppl_bdl.errors import ConfigError

#: The search interval of log c.
LOG_SCALE_BOUNDS = (-12.0, 12.0)


def normal_prior(setup, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """λ₀ = 1/s² and μ over the coordinates ``index`` (0 and 0 where the site's prior is not
    a Normal with fixed parameters outside every plate)."""
    layout = setup.layout
    precision, loc = np.zeros(layout.dim), np.zeros(layout.dim)
    for slot in layout.slots:
        site = layout.sites[slot.name]
        params = site.spec.params
        fixed = all(
            isinstance(v, int | float | np.ndarray | np.number) and not isinstance(v, bool)
            for v in params.values()
        )
        if site.spec.name != "Normal" or site.plates or not fixed:
            continue
        where = slice(slot.offset, slot.offset + slot.size)
        scale = np.broadcast_to(np.asarray(params.get("scale", 1.0), float), slot.shape)
        precision[where] = 1.0 / scale.ravel() ** 2
        loc[where] = np.broadcast_to(np.asarray(params.get("loc", 0.0), float), slot.shape).ravel()
    return precision[index], loc[index]


def rescale_prior(
    setup, mode: np.ndarray, matrix: np.ndarray, structure: str, index: np.ndarray
) -> tuple[np.ndarray, float]:
    """The precision with the Normal priors' precision scaled by the c that maximises the
    Laplace evidence, and c."""
    from scipy.optimize import minimize_scalar

    lam, loc = normal_prior(setup, index)
    count = int(np.sum(lam > 0))
    if count == 0:
        raise ConfigError(
            "prior_precision='marglik' rescales the precision of Normal priors (fixed loc and "
            "scale, outside every plate); none of the Gaussian sites has one. Leave "
            "prior_precision=None."
        )
    rest = matrix - (np.diag(lam) if structure == "full" else lam)
    spread = float(np.sum(lam * (mode[index] - loc) ** 2))

    def negative_evidence(log_c: float) -> float:
        c = float(np.exp(log_c))
        logdet = _log_det(rest, c * lam, structure)
        return 0.5 * c * spread - 0.5 * count * log_c + 0.5 * logdet

    best = minimize_scalar(
        negative_evidence, bounds=LOG_SCALE_BOUNDS, method="bounded", options={"xatol": 1e-8}
    )
    c = float(np.exp(best.x))
    return rest + (np.diag(c * lam) if structure == "full" else c * lam), c


def _log_det(rest: np.ndarray, prior: np.ndarray, structure: str) -> float:
    """log det(H_rest + diag(prior)); +inf where it is not positive definite."""
    if structure == "diag":
        values = rest + prior
        return float(np.sum(np.log(values))) if np.all(values > 0) else np.inf
    try:
        factor = np.linalg.cholesky(rest + np.diag(prior))
    except np.linalg.LinAlgError:
        return np.inf
    return float(2.0 * np.sum(np.log(np.diag(factor))))


def rescale_kron_prior(setup, approx, damping: float | None) -> float:
    """``prior_precision="marglik"`` for ``hessian="kron"``: the same evidence, its log
    determinant Σ log(λ_left λ_rightᵀ + c δ₀ + damping) per layer block (their eigenvalues) plus
    the other coordinates' block; ``approx`` is updated in place, and c returned."""
    from scipy.optimize import minimize_scalar

    blocks = approx.blocks
    priors = [normal_prior(setup, b.coords.ravel()) for b in blocks]
    rest_lam, rest_loc = normal_prior(setup, approx.rest_index)
    structure = approx.rest_structure
    rest = approx.precision - (np.diag(rest_lam) if structure == "full" else rest_lam)
    lam = np.concatenate([p[0] for p in priors] + [rest_lam])
    loc = np.concatenate([p[1] for p in priors] + [rest_loc])
    coords = np.concatenate([b.coords.ravel() for b in blocks] + [approx.rest_index])
    count = int(np.sum(lam > 0))
    spread = float(np.sum(lam * (approx.mode[coords] - loc) ** 2))
    extra = damping or 0.0

    def negative_evidence(log_c: float) -> float:
        c = float(np.exp(log_c))
        logdet = _log_det(rest, c * rest_lam, structure) if len(rest_lam) else 0.0
        for b, (block_lam, _) in zip(blocks, priors, strict=True):
            values = np.outer(b.values_left, b.values_right) + c * block_lam[0] + extra
            logdet += float(np.sum(np.log(values))) if np.all(values > 0) else np.inf
        return 0.5 * c * spread - 0.5 * count * log_c + 0.5 * logdet

    best = minimize_scalar(
        negative_evidence, bounds=LOG_SCALE_BOUNDS, method="bounded", options={"xatol": 1e-8}
    )
    c = float(np.exp(best.x))
    for b, (block_lam, _) in zip(blocks, priors, strict=True):
        b.delta = c * float(block_lam[0]) + extra
    if len(rest_lam):
        approx.precision = rest + (np.diag(c * rest_lam) if structure == "full" else c * rest_lam)
    approx.__post_init__()  # the other coordinates' factor, again
    return c
