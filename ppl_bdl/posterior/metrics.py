"""Scores of predictive distributions: accuracy, NLL, Brier, calibration, uncertainty, OOD ranking.

Classification functions take class probabilities shaped ``(*points, classes)`` (the posterior-mean
probabilities p̄(y|x) = E_θ[p(y|x,θ)]) or, where the draws matter (``ood_score``,
``classification_metrics``), per-draw probabilities shaped ``(draws, *points, classes)``, and
integer labels shaped ``(*points)`` in 0..classes-1. A :class:`~ppl_bdl.posterior.predictive.PredictiveResult`
may be passed wherever per-draw probabilities are expected. NumPy only; every backend's result is
scored by the same code.

Example
-------
>>> import numpy as np
>>> from ppl_bdl.posterior.metrics import classification_metrics
>>> probs = np.array([[[0.9, 0.1], [0.2, 0.8]], [[0.7, 0.3], [0.4, 0.6]]])  # 2 draws, 2 points
>>> m = classification_metrics(probs, np.array([0, 1]), num_bins=5)
>>> round(m["accuracy"], 3), round(m["brier"], 3)
(1.0, 0.13)
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ppl_bdl.errors import DataError, one_of
from ppl_bdl.posterior import uncertainty as U
from ppl_bdl.posterior.metric_inputs import (
    check_bins,
    check_labels,
    check_per_draw_probs,
    check_probs,
)

#: Probabilities are clipped to at least this before the log in the NLL, so a confidently wrong
#: prediction costs at most -log(1e-12) ≈ 27.6 nats instead of inf.
NLL_CLIP = 1e-12


# -- point scores ------------------------------------------------------------------------------
def accuracy(probs: Any, y: Any) -> float:
    """Fraction of points whose most probable class (first one on ties) is the label.

    Example
    -------
    >>> import numpy as np
    >>> accuracy(np.array([[0.8, 0.2], [0.6, 0.4]]), np.array([0, 1]))
    0.5
    """
    p = check_probs(probs)
    labels = check_labels(y, p)
    return float(np.mean(p.argmax(axis=-1) == labels))


def negative_log_likelihood(probs: Any, y: Any) -> float:
    """Mean over points of −log p̄(y|x), in nats.

    ``probs`` are the posterior-mean probabilities p̄ (average the draws' probabilities, not their
    logs: this is the log posterior predictive density). They are clipped below at
    ``NLL_CLIP = 1e-12``, so one confidently wrong point adds at most 27.6 nats / n.

    Example
    -------
    >>> import numpy as np
    >>> round(negative_log_likelihood(np.array([[0.5, 0.5], [0.25, 0.75]]), np.array([0, 1])), 4)
    0.4904
    """
    p = check_probs(probs)
    labels = check_labels(y, p)
    picked = np.take_along_axis(p, labels[..., None], axis=-1)[..., 0]
    return float(-np.mean(np.log(np.clip(picked, NLL_CLIP, 1.0))))


def brier_score(probs: Any, y: Any) -> float:
    """Mean over points of Σ_k (p̄_k − 1[y = k])² (Brier 1950, the multi-class score).

    Normalisation: summed over the classes, averaged over the points, so it lies in [0, 2]; for two
    classes this is twice the binary score (p − y)² that some libraries report.

    Example
    -------
    >>> import numpy as np
    >>> brier_score(np.array([[1.0, 0.0], [0.5, 0.5]]), np.array([0, 0]))
    0.25
    """
    p = check_probs(probs)
    labels = check_labels(y, p)
    onehot = np.eye(p.shape[-1])[labels]
    return float(np.mean(np.sum((p - onehot) ** 2, axis=-1)))


# -- calibration -------------------------------------------------------------------------------
class CalibrationBins(NamedTuple):
    """Per-bin calibration statistics of top-label confidence (max class probability).

    ``edges`` (num_bins + 1,) bound the bins (right-closed: (edges[b], edges[b+1]]); ``counts``,
    ``accuracy`` and ``confidence`` are per bin, NaN for an empty bin's accuracy and confidence.
    """

    edges: np.ndarray
    counts: np.ndarray
    accuracy: np.ndarray
    confidence: np.ndarray


def calibration_bins(
    probs: Any, y: Any, num_bins: int = 15, binning: str = "equal_width"
) -> CalibrationBins:
    """Bin points by confidence = max_k p̄_k; per bin, the accuracy and the mean confidence.

    ``binning="equal_width"``: bins ((b−1)/M, b/M], b = 1..M (Guo et al. 2017, Sec. 2).
    ``binning="equal_mass"``: the points sorted by confidence split into M groups of sizes
    differing by at most one (Nixon et al. 2019, "Measuring calibration in deep learning",
    adaptive binning); M is lowered to the number
    of points if there are fewer; the edges between groups are midpoints of the neighbouring
    confidences, the outer edges 0 and 1.

    Example
    -------
    >>> import numpy as np
    >>> b = calibration_bins(np.array([[0.9, 0.1], [0.3, 0.7]]), np.array([0, 0]), num_bins=2)
    >>> b.counts.tolist(), b.accuracy.tolist()
    ([0, 2], [nan, 0.5])
    """
    check_bins(num_bins, binning)
    p = check_probs(probs)
    labels = check_labels(y, p)
    conf = p.max(axis=-1).reshape(-1)
    hit = (p.argmax(axis=-1) == labels).reshape(-1).astype(np.float64)
    if binning == "equal_width":
        edges = np.linspace(0.0, 1.0, num_bins + 1)
        # side="left" counts the inner edges strictly below conf: the bins are right-closed.
        index = np.searchsorted(edges[1:-1], conf, side="left")
    else:
        num_bins = max(1, min(num_bins, conf.size))
        order = np.argsort(conf, kind="stable")
        groups = np.array_split(order, num_bins)
        index = np.empty(conf.size, dtype=np.int64)
        for b, members in enumerate(groups):
            index[members] = b
        # Group b ends at sorted position ends[b] - 1; an edge sits between it and the next one.
        ends = np.cumsum([len(g) for g in groups])[:-1]
        sorted_conf = conf[order]
        inner = 0.5 * (sorted_conf[ends - 1] + sorted_conf[ends])
        edges = np.concatenate([[0.0], inner, [1.0]])
    counts = np.bincount(index, minlength=num_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        acc = np.bincount(index, weights=hit, minlength=num_bins) / counts
        mean_conf = np.bincount(index, weights=conf, minlength=num_bins) / counts
    return CalibrationBins(edges, counts, acc, mean_conf)


def expected_calibration_error(
    probs: Any, y: Any, num_bins: int = 15, binning: str = "equal_width"
) -> float:
    """``ECE = Σ_b |B_b|/n · |acc(B_b) − conf(B_b)|`` over bins of top-label confidence.

    Naeini, Cooper & Hauskrecht (2015), "Obtaining well calibrated probabilities using Bayesian
    binning", Sec. 4; Guo et al. (2017), "On calibration of modern neural networks", Eq. 3.
    Default binning: ``num_bins=15`` equal-width bins ((b−1)/15, b/15] of the confidence
    max_k p̄_k, as in Guo et al.; ``binning="equal_mass"`` uses bins holding equally many points
    (see :func:`calibration_bins`). Empty bins contribute nothing. The estimate is biased upwards
    for few points per bin: a perfectly calibrated model still scores about
    sqrt(2/π) · sqrt(c(1−c)/n_b) in a bin of n_b points at confidence c (binomial noise).

    Example
    -------
    >>> import numpy as np
    >>> p = np.array([[0.75, 0.25]] * 4)
    >>> expected_calibration_error(p, np.array([0, 0, 0, 1]), num_bins=10)
    0.0
    """
    bins = calibration_bins(probs, y, num_bins=num_bins, binning=binning)
    full = bins.counts > 0
    n = bins.counts.sum()
    gap = np.abs(bins.accuracy[full] - bins.confidence[full])
    return float(np.sum(bins.counts[full] / n * gap))


def reliability_diagram(
    probs: Any, y: Any, num_bins: int = 15, ax: Any = None, binning: str = "equal_width"
):
    """Plot per-bin accuracy against confidence, with the diagonal of perfect calibration.

    One bar per non-empty bin (height = the bin's accuracy, spanning the bin), a marker at the
    bin's mean confidence, the bin's count written at the foot of its bar and the ECE in the title
    (DeGroot & Fienberg 1983; Guo et al. 2017, Fig. 1). Needs matplotlib, imported only here.

    Returns
    -------
    matplotlib.axes.Axes
        ``ax`` (or a new figure's axes); the bars are ``ax.containers[0]``.

    Example
    -------
    >>> import numpy as np
    >>> import matplotlib
    >>> matplotlib.use("Agg")
    >>> p = np.array([[0.9, 0.1], [0.6, 0.4], [0.2, 0.8]])
    >>> ax = reliability_diagram(p, np.array([0, 1, 1]), num_bins=5)
    >>> [float(bar.get_height()) for bar in ax.containers[0]]
    [0.0, 1.0, 1.0]
    """
    import matplotlib.pyplot as plt

    bins = calibration_bins(probs, y, num_bins=num_bins, binning=binning)
    ece = expected_calibration_error(probs, y, num_bins=num_bins, binning=binning)
    if ax is None:
        _, ax = plt.subplots(figsize=(4, 4))
    full = bins.counts > 0
    left, width = bins.edges[:-1][full], np.diff(bins.edges)[full]
    bars = ax.bar(
        left, bins.accuracy[full], width=width, align="edge", edgecolor="black", label="accuracy"
    )
    ax.plot([0, 1], [0, 1], linestyle="--", color="gray", label="perfect calibration")
    ax.plot(bins.confidence[full], bins.accuracy[full], "o", color="C1", label="mean confidence")
    for bar, count in zip(bars, bins.counts[full], strict=True):
        ax.annotate(
            str(int(count)),
            (bar.get_x() + bar.get_width() / 2, 0.01),  # at the foot: clear of the markers
            ha="center",
            va="bottom",
            fontsize=7,
        )
    ax.set(xlim=(0, 1), ylim=(0, 1.05), xlabel="confidence (max probability)", ylabel="accuracy")
    ax.set_title(f"reliability ({binning}, {num_bins} bins), ECE = {ece:.3f}")
    ax.legend(loc="upper left", fontsize=7)
    return ax


# -- uncertainty and out-of-distribution scores -----------------------------------------------
OOD_KINDS = ("entropy", "mutual_information")


def ood_score(probs_per_draw: Any, kind: str = "entropy") -> np.ndarray:
    """Per-point out-of-distribution score: higher means less like the training data.

    ``kind="entropy"``: the predictive entropy H[p̄(y|x)] (total uncertainty; high also for
    in-distribution points near a class boundary). ``kind="mutual_information"``: I[y; θ | x, D],
    the epistemic part, high where the posterior draws disagree (Houlsby et al. 2011, Eq. 3;
    Smith & Gal 2018). ``probs_per_draw`` is shaped ``(draws, *points, classes)`` or a classification
    PredictiveResult; the scores are shaped ``(*points)``, in nats.

    Example
    -------
    >>> import numpy as np
    >>> agree = [[0.5, 0.5], [0.5, 0.5]]      # two draws, both unsure: aleatoric
    >>> disagree = [[1.0, 0.0], [0.0, 1.0]]   # two draws, each sure of a different class
    >>> p = np.array([agree, disagree]).transpose(1, 0, 2)  # (draws, points, classes)
    >>> ood_score(p, kind="mutual_information").round(3).tolist()
    [0.0, 0.693]
    """
    p = check_per_draw_probs(probs_per_draw)
    if kind == "entropy":
        return U.predictive_entropy(p)
    if kind == "mutual_information":
        return U.mutual_information(p)
    raise one_of("ood_score kind", kind, OOD_KINDS)


def ood_auroc(scores_in: Any, scores_out: Any) -> float:
    """Area under the ROC curve of telling out-of-distribution points (positives) from
    in-distribution ones by their OOD score: P(score_out > score_in) + ½ P(tie).

    Computed exactly as the Mann-Whitney U statistic divided by n_in · n_out (Hanley & McNeil
    1982, Eq. 1); 0.5 is chance, 1.0 a perfect ranking.

    Example
    -------
    >>> import numpy as np
    >>> ood_auroc([0.1, 0.2, 0.3], [0.25, 0.9])
    0.8333333333333334
    """
    a = np.asarray(scores_in, dtype=np.float64).reshape(-1)
    b = np.asarray(scores_out, dtype=np.float64).reshape(-1)
    if a.size == 0 or b.size == 0:
        raise DataError(
            f"ood_auroc needs scores on both sides, got {a.size} in-distribution and {b.size} "
            "out-of-distribution scores."
        )
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        raise DataError("ood_auroc scores have NaN or inf entries.")
    # Midranks of the pooled scores; U_out = rank sum of the outs minus its minimum.
    pooled = np.concatenate([a, b])
    order = np.argsort(pooled, kind="stable")
    ranks = np.empty(pooled.size)
    ranks[order] = np.arange(1, pooled.size + 1)
    _, inverse, counts = np.unique(pooled, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    ranks = (sums / counts)[inverse]
    u_out = ranks[a.size :].sum() - b.size * (b.size + 1) / 2
    return float(u_out / (a.size * b.size))


# -- all at once -------------------------------------------------------------------------------
def classification_metrics(
    probs_per_draw: Any, y: Any, num_bins: int = 15, binning: str = "equal_width"
) -> dict[str, float]:
    """Every classification score of a posterior predictive, as a plain dict of floats.

    Keys: ``accuracy``, ``nll`` (mean −log p̄(y|x), nats), ``brier`` (Σ over classes, mean over
    points), ``ece`` (``num_bins`` bins, ``binning``), and the means over points of
    ``predictive_entropy`` (total), ``expected_entropy`` (aleatoric) and ``mutual_information``
    (epistemic), in nats; predictive_entropy = expected_entropy + mutual_information. The point
    scores use the posterior-mean probabilities p̄ = mean over the draw axis 0.

    Example
    -------
    >>> import numpy as np
    >>> probs = np.array([[[0.9, 0.1]], [[0.5, 0.5]]])  # 2 draws, 1 point
    >>> m = classification_metrics(probs, np.array([0]))
    >>> round(m["nll"], 4), round(m["brier"], 4)
    (0.3567, 0.18)
    """
    check_bins(num_bins, binning)
    per_draw = check_per_draw_probs(probs_per_draw)
    mean = per_draw.mean(axis=0)
    labels = check_labels(y, mean)
    return {
        "accuracy": accuracy(mean, labels),
        "nll": negative_log_likelihood(mean, labels),
        "brier": brier_score(mean, labels),
        "ece": expected_calibration_error(mean, labels, num_bins=num_bins, binning=binning),
        "predictive_entropy": float(np.mean(U.predictive_entropy(per_draw))),
        "expected_entropy": float(np.mean(U.expected_entropy(per_draw))),
        "mutual_information": float(np.mean(U.mutual_information(per_draw))),
    }


def regression_metrics(means: Any, variances: Any, y: Any) -> dict[str, float]:
    """Scores of a regression posterior predictive from per-draw means and variances
    shaped ``(draws, *points)`` (``PredictiveResult.per_draw["mean"]`` and ``["variance"]``).

    Keys: ``rmse`` of the predictive mean; ``nll``, the mean over points of
    −log (1/S) Σ_s N(y | μ_s, σ²_s), the Gaussian-mixture log predictive density (exact for a
    Normal likelihood, a moment match otherwise); the means over points of ``total_variance``,
    ``aleatoric_variance`` (E_θ[Var(y|θ)]) and ``epistemic_variance`` (Var_θ[E(y|θ)]).

    Example
    -------
    >>> import numpy as np
    >>> m = regression_metrics(np.zeros((2, 1)), np.ones((2, 1)), np.array([0.0]))
    >>> round(m["nll"], 4), m["rmse"]
    (0.9189, 0.0)
    """
    mu = np.asarray(means, dtype=np.float64)
    var = np.asarray(variances, dtype=np.float64)
    target = np.asarray(y, dtype=np.float64)
    if mu.ndim < 1 or mu.shape != var.shape or mu.shape[1:] != target.shape or not mu.size:
        raise DataError(
            f"regression_metrics: means {mu.shape} and variances {var.shape} must be shaped "
            f"(draws, *points) with points matching the targets y {target.shape}, and not empty."
        )
    if not (np.all(np.isfinite(mu)) and np.all(np.isfinite(target))) or np.any(~(var > 0)):
        raise DataError("regression_metrics: NaN/inf means or targets, or variances not > 0.")
    logp = -0.5 * (np.log(2 * np.pi * var) + (target - mu) ** 2 / var)
    top = logp.max(axis=0)
    lpd = top + np.log(np.mean(np.exp(logp - top), axis=0))
    total, aleatoric, epistemic = U.variance_decomposition(mu, var)
    return {
        "rmse": float(np.sqrt(np.mean((mu.mean(axis=0) - target) ** 2))),
        "nll": float(-np.mean(lpd)),
        "total_variance": float(np.mean(total)),
        "aleatoric_variance": float(np.mean(aleatoric)),
        "epistemic_variance": float(np.mean(epistemic)),
    }
