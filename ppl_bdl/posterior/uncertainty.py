"""Predictive uncertainty and its split into aleatoric and epistemic parts.

Regression (law of total variance): Var[y] = E_θ[Var(y|θ)] + Var_θ[E(y|θ)]; the first term is
aleatoric (noise the data carry), the second epistemic (what more data would remove).
Classification: the entropy of the predictive H[p(y|x,D)] = E_θ[H[p(y|x,θ)]] + I[y; θ | x, D]; the
expected entropy is aleatoric and the mutual information epistemic (Houlsby et al. 2011).

Example
-------
>>> import numpy as np
>>> from ppl_bdl.posterior.uncertainty import variance_decomposition
>>> means = np.array([[0.0], [2.0]]); variances = np.array([[1.0], [1.0]])
>>> total, aleatoric, epistemic = variance_decomposition(means, variances)
>>> float(total[0]), float(aleatoric[0]), float(epistemic[0])
(2.0, 1.0, 1.0)
"""

from __future__ import annotations

import numpy as np


def variance_decomposition(means: np.ndarray, variances: np.ndarray):
    """(total, aleatoric, epistemic) per point from per-draw means and variances (draw axis 0)."""
    aleatoric = variances.mean(axis=0)
    epistemic = means.var(axis=0)
    return aleatoric + epistemic, aleatoric, epistemic


def entropy(probs: np.ndarray, axis: int = -1) -> np.ndarray:
    """Shannon entropy (nats) along ``axis``, with 0 log 0 = 0."""
    p = np.clip(probs, 0.0, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * np.log(p), 0.0)
    return -terms.sum(axis=axis)


def predictive_entropy(probs: np.ndarray) -> np.ndarray:
    """H[p(y|x,D)] of the posterior-mean class probabilities (draw axis 0, classes last)."""
    return entropy(probs.mean(axis=0))


def expected_entropy(probs: np.ndarray) -> np.ndarray:
    """E_θ[H[p(y|x,θ)]]: the aleatoric part."""
    return entropy(probs).mean(axis=0)


def mutual_information(probs: np.ndarray) -> np.ndarray:
    """I[y; θ | x, D] = H[p(y|x,D)] − E_θ[H[p(y|x,θ)]]: the epistemic part (>= 0)."""
    return np.maximum(predictive_entropy(probs) - expected_entropy(probs), 0.0)
