"""Input checks shared by :mod:`ppl_bdl.posterior.metrics`: class probabilities, labels, binning settings.

Each raises a :class:`~ppl_bdl.errors.DataError` (or ConfigError) naming the argument, the shape or
values seen and what was expected.

Example
-------
>>> import numpy as np
>>> from ppl_bdl.posterior.metric_inputs import check_labels, check_probs
>>> check_labels(np.array([1.0, 0.0]), check_probs(np.array([[0.5, 0.5], [1.0, 0.0]]))).tolist()
[1, 0]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ppl_bdl.errors import ConfigError, DataError, one_of

#: How far the class probabilities of a point may sum from 1 (float32 softmax, averaged over draws).
SUM_TOLERANCE = 1e-3
BINNINGS = ("equal_width", "equal_mass")


def check_probs(probs: Any, name: str = "probs", min_ndim: int = 1) -> np.ndarray:
    """Class probabilities as float64, classes last: finite, in [0, 1], rows summing to 1."""
    p = np.asarray(probs, dtype=np.float64)
    if p.ndim < min_ndim or p.shape[-1] < 1:
        raise DataError(
            f"{name} must have at least {min_ndim} dims with the classes last, got shape {p.shape}."
        )
    if not np.all(np.isfinite(p)):
        raise DataError(f"{name} has NaN or inf entries; expected class probabilities.")
    if p.size and (p.min() < -SUM_TOLERANCE or p.max() > 1 + SUM_TOLERANCE):
        raise DataError(
            f"{name} has entries outside [0, 1] (min {p.min():.4g}, max {p.max():.4g}); expected "
            "probabilities, not logits: apply a softmax first."
        )
    sums = p.sum(axis=-1)
    if sums.size and np.max(np.abs(sums - 1.0)) > SUM_TOLERANCE:
        worst = float(sums.flat[np.argmax(np.abs(sums - 1.0))])
        raise DataError(
            f"{name} must sum to 1 over the last axis (classes), but one row sums to {worst:.6g}. "
            f"Is the class axis last? Shape seen: {p.shape}."
        )
    return p


def check_labels(y: Any, probs: np.ndarray, name: str = "y") -> np.ndarray:
    """Integer labels whose shape is ``probs.shape[:-1]``, each in 0..classes-1."""
    labels = np.asarray(y)
    if labels.shape != probs.shape[:-1]:
        raise DataError(
            f"labels {name} have shape {labels.shape} but the probabilities have shape "
            f"{probs.shape}: expected labels shaped {probs.shape[:-1]} (the probabilities' shape "
            "without the trailing class axis)."
        )
    if labels.dtype == bool:
        labels = labels.astype(np.int64)
    if not (np.issubdtype(labels.dtype, np.integer) or np.issubdtype(labels.dtype, np.floating)):
        raise DataError(f"labels {name} must be integers, got dtype {labels.dtype}.")
    # Bernoulli observations are often stored as 0.0/1.0 floats: accept integer-valued floats.
    if not np.all(np.isfinite(labels)) or not np.all(labels == np.round(labels)):
        raise DataError(f"labels {name} must be integer class indices, got non-integer values.")
    if labels.size == 0:
        raise DataError(f"labels {name} are empty: there are no points to score.")
    k = probs.shape[-1]
    if labels.min() < 0 or labels.max() >= k:
        raise DataError(
            f"labels {name} must lie in 0..{k - 1} (the probabilities have {k} classes), got "
            f"values from {labels.min()} to {labels.max()}."
        )
    return labels.astype(np.int64)


def check_per_draw_probs(probs_per_draw: Any) -> np.ndarray:
    """Per-draw class probabilities from an array or a classification PredictiveResult."""
    per_draw = getattr(probs_per_draw, "per_draw", None)
    if per_draw is not None:
        if getattr(probs_per_draw, "kind", None) != "classification":
            raise DataError(
                f"expected a classification result, got kind {probs_per_draw.kind!r}; the "
                "predicted site must be Categorical or Bernoulli (for regression use "
                "regression_metrics)."
            )
        probs_per_draw = per_draw["probs"]
    return check_probs(probs_per_draw, name="probs_per_draw", min_ndim=2)


def check_bins(num_bins: int, binning: str) -> None:
    """``binning`` is one of BINNINGS and ``num_bins`` a positive int."""
    if binning not in BINNINGS:
        raise one_of("binning", binning, BINNINGS)
    if isinstance(num_bins, bool) or not isinstance(num_bins, (int, np.integer)) or num_bins < 1:
        raise ConfigError(f"num_bins must be an int >= 1, got {num_bins!r}.")
