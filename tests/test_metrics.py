"""Classification and regression metrics (ppl_bdl.posterior.metrics) and Posterior.evaluate."""

from __future__ import annotations

import re

import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import dist
from ppl_bdl.errors import ConfigError, DataError, ModelError
from ppl_bdl.models import bnn
from ppl_bdl.posterior import metrics as M

# -- closed forms on small cases ----------------------------------------------------------------


def test_accuracy_nll_brier_closed_forms():
    q = np.array([0.9, 0.6, 0.3])
    probs = np.column_stack([q, 1 - q])
    y = np.array([0, 0, 1])
    # argmax: 0, 0, 1 -> all right
    assert M.accuracy(probs, y) == 1.0
    assert M.accuracy(probs, 1 - y) == 0.0
    # label 0: -log q, label 1: -log(1 - q)
    expected_nll = -np.mean(np.log([0.9, 0.6, 0.7]))
    assert M.negative_log_likelihood(probs, y) == pytest.approx(expected_nll, rel=1e-12)
    # two classes: Σ_k (p_k - 1[y=k])^2 = 2 (1 - p_y)^2
    expected_brier = np.mean(2 * np.array([0.1, 0.4, 0.3]) ** 2)
    assert M.brier_score(probs, y) == pytest.approx(expected_brier, rel=1e-12)
    # a certain right answer scores 0, a certain wrong one 2 (Brier) and the clip (NLL)
    sure = np.array([[1.0, 0.0]])
    assert M.brier_score(sure, [0]) == 0.0 and M.brier_score(sure, [1]) == 2.0
    assert M.negative_log_likelihood(sure, [1]) == pytest.approx(-np.log(M.NLL_CLIP))


def test_metrics_accept_batched_points_and_float_labels():
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(4), size=(3, 5))
    y = rng.integers(0, 4, size=(3, 5))
    flat = M.brier_score(probs.reshape(15, 4), y.reshape(15))
    assert M.brier_score(probs, y) == pytest.approx(flat)
    assert M.accuracy(probs, y.astype(np.float32)) == M.accuracy(probs, y)


def test_ece_hand_computed_equal_width():
    # confidences 0.9 (right), 0.9 (wrong), 0.55 (right), 0.7 (right); 5 bins of width 0.2
    probs = np.array([[0.9, 0.05, 0.05], [0.05, 0.9, 0.05], [0.55, 0.45, 0.0], [0.1, 0.2, 0.7]])
    y = np.array([0, 0, 0, 2])
    bins = M.calibration_bins(probs, y, num_bins=5)
    assert bins.counts.tolist() == [0, 0, 1, 1, 2]
    np.testing.assert_allclose(bins.accuracy[2:], [1.0, 1.0, 0.5])
    np.testing.assert_allclose(bins.confidence[2:], [0.55, 0.7, 0.9])
    ece = 2 / 4 * 0.4 + 1 / 4 * 0.45 + 1 / 4 * 0.3
    assert M.expected_calibration_error(probs, y, num_bins=5) == pytest.approx(ece, rel=1e-12)


def test_ece_bins_are_right_closed():
    # 4 bins, edges 0.25, 0.5, 0.75 exact in binary: 0.5 belongs to (0.25, 0.5], 0.75 to
    # (0.5, 0.75], 1.0 to the last bin
    conf = np.array([0.5, 0.75, 1.0])
    probs = np.column_stack([conf, 1 - conf])
    bins = M.calibration_bins(probs, np.zeros(3, int), num_bins=4)
    assert bins.counts.tolist() == [0, 1, 1, 1]


def test_ece_equal_mass_hand_computed():
    conf = np.array([0.95, 0.55, 0.8, 0.6, 0.7, 0.9])
    probs = np.column_stack([conf, 1 - conf])
    y = np.array([0, 1, 0, 0, 1, 0])  # right: 0.95, 0.8, 0.6, 0.9; wrong: 0.55, 0.7
    bins = M.calibration_bins(probs, y, num_bins=3, binning="equal_mass")
    # sorted: (0.55, 0.6) (0.7, 0.8) (0.9, 0.95)
    assert bins.counts.tolist() == [2, 2, 2]
    np.testing.assert_allclose(bins.edges, [0.0, 0.65, 0.85, 1.0])
    np.testing.assert_allclose(bins.accuracy, [0.5, 0.5, 1.0])
    ece = (abs(0.5 - 0.575) + abs(0.5 - 0.75) + abs(1.0 - 0.925)) / 3
    got = M.expected_calibration_error(probs, y, num_bins=3, binning="equal_mass")
    assert got == pytest.approx(ece, rel=1e-12)
    # more bins than points: one bin per point
    assert (
        M.calibration_bins(probs, y, num_bins=50, binning="equal_mass").counts.tolist() == [1] * 6
    )


def _calibrated(n, rng, distortion=1.0):
    """Binary predictions whose label is drawn from p**distortion-normalised probabilities: with
    distortion 1 the predictions are calibrated; with > 1 they are less confident than the truth."""
    p = rng.uniform(size=n)
    true = p**distortion / (p**distortion + (1 - p) ** distortion)
    y = (rng.uniform(size=n) < true).astype(np.int64)
    return np.column_stack([1 - p, p]), y


@pytest.mark.parametrize("binning", ["equal_width", "equal_mass"])
def test_ece_of_calibrated_predictions_is_binomial_noise(binning):
    rng = np.random.default_rng(0)
    probs, y = _calibrated(20_000, rng)
    bins = M.calibration_bins(probs, y, num_bins=15, binning=binning)
    full = bins.counts > 0
    # per bin |acc - conf| is binomial noise with sd sqrt(c(1-c)/n_b); allow 3 sd in every bin
    sd = np.sqrt(bins.confidence[full] * (1 - bins.confidence[full]) / bins.counts[full])
    tolerance = 3 * np.sum(bins.counts[full] / len(y) * sd)
    ece = M.expected_calibration_error(probs, y, num_bins=15, binning=binning)
    assert ece < tolerance
    # the check has power: slightly underconfident predictions fail it
    probs_u, y_u = _calibrated(20_000, rng, distortion=1.5)
    assert M.expected_calibration_error(probs_u, y_u, num_bins=15, binning=binning) > tolerance


def test_ece_of_overconfident_predictions():
    # always 90% sure of class 0, right 60% of the time: ECE = 0.3 up to binomial noise
    rng = np.random.default_rng(1)
    n = 10_000
    probs = np.tile([0.9, 0.1], (n, 1))
    y = (rng.uniform(size=n) > 0.6).astype(np.int64)
    ece = M.expected_calibration_error(probs, y)
    assert ece == pytest.approx(abs(np.mean(y == 0) - 0.9), abs=1e-12)
    assert abs(ece - 0.3) < 4 * np.sqrt(0.6 * 0.4 / n)


# -- uncertainty and OOD --------------------------------------------------------------------------


def test_mutual_information_nonnegative_and_zero_when_draws_agree():
    rng = np.random.default_rng(2)
    per_draw = rng.dirichlet(np.ones(3) * 0.5, size=(30, 8))  # (draws, points, classes)
    m = M.classification_metrics(per_draw, rng.integers(0, 3, size=8))
    assert m["mutual_information"] >= 0
    assert np.all(M.ood_score(per_draw, kind="mutual_information") >= 0)
    assert m["predictive_entropy"] == pytest.approx(
        m["expected_entropy"] + m["mutual_information"], rel=1e-12
    )
    agree = np.broadcast_to(per_draw[:1], per_draw.shape)
    np.testing.assert_allclose(M.ood_score(agree, kind="mutual_information"), 0.0, atol=1e-12)


def test_ood_score_ranks_disagreeing_draws_first():
    rng = np.random.default_rng(3)
    draws = 40
    # 5 points where every draw says 50/50 (aleatoric), 5 where draws are sure but disagree
    unsure = np.full((draws, 5, 2), 0.5)
    sure_class = rng.integers(0, 2, size=(draws, 5))
    sure_class[0], sure_class[1] = 0, 1  # every point sees both classes
    disagree = np.eye(2)[sure_class] * 0.98 + 0.01
    per_draw = np.concatenate([unsure, disagree], axis=1)
    mi = M.ood_score(per_draw, kind="mutual_information")
    assert set(np.argsort(-mi)[:5].tolist()) == set(range(5, 10))
    assert M.ood_auroc(mi[:5], mi[5:]) == 1.0
    # entropy sees no difference: all points sit near log 2
    ent = M.ood_score(per_draw, kind="entropy")
    np.testing.assert_allclose(ent[:5], np.log(2), rtol=1e-12)
    assert M.ood_auroc(ent[:5], ent[5:]) <= 0.5


def test_ood_auroc_is_the_pairwise_probability():
    rng = np.random.default_rng(4)
    a = rng.integers(0, 5, size=40).astype(float)  # ties on purpose
    b = rng.integers(1, 7, size=30).astype(float)
    pairs = (b[None, :] > a[:, None]) + 0.5 * (b[None, :] == a[:, None])
    assert M.ood_auroc(a, b) == pytest.approx(pairs.mean(), rel=1e-12)


# -- reliability diagram --------------------------------------------------------------------------


@pytest.mark.parametrize("binning", ["equal_width", "equal_mass"])
def test_reliability_diagram_bars_are_bin_accuracies(binning):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rng = np.random.default_rng(5)
    probs, y = _calibrated(300, rng)
    bins = M.calibration_bins(probs, y, num_bins=10, binning=binning)
    fig, ax = plt.subplots()
    try:
        out = M.reliability_diagram(probs, y, num_bins=10, ax=ax, binning=binning)
        assert out is ax
        bars = ax.containers[0]
        full = bins.counts > 0
        np.testing.assert_allclose([b.get_height() for b in bars], bins.accuracy[full])
        np.testing.assert_allclose([b.get_x() for b in bars], bins.edges[:-1][full])
        counts = [int(t.get_text()) for t in ax.texts]
        assert counts == bins.counts[full].tolist() and sum(counts) == 300
        assert "ECE" in ax.get_title()
    finally:
        plt.close(fig)


# -- regression -----------------------------------------------------------------------------------


def test_regression_metrics_gaussian_mixture_density():
    means = np.array([[0.0, 1.0], [2.0, 1.0]])  # 2 draws, 2 points
    variances = np.array([[1.0, 4.0], [0.25, 4.0]])
    y = np.array([1.0, 3.0])

    def normal_pdf(x, m, v):
        return np.exp(-0.5 * (x - m) ** 2 / v) / np.sqrt(2 * np.pi * v)

    lpd = np.log(
        0.5 * (normal_pdf(y, means[0], variances[0]) + normal_pdf(y, means[1], variances[1]))
    )
    m = M.regression_metrics(means, variances, y)
    assert m["nll"] == pytest.approx(-lpd.mean(), rel=1e-12)
    assert m["rmse"] == pytest.approx(np.sqrt(np.mean((means.mean(0) - y) ** 2)), rel=1e-12)
    assert m["aleatoric_variance"] == pytest.approx(np.mean(variances.mean(0)))
    assert m["epistemic_variance"] == pytest.approx(np.mean(means.var(0)))
    assert m["total_variance"] == pytest.approx(m["aleatoric_variance"] + m["epistemic_variance"])


# -- input errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "probs, y, error, message",
    [
        (np.full((4, 3), 1 / 3), np.zeros(5, int), DataError, r"shape \(5,\).*shape \(4, 3\)"),
        (np.full((4, 3), 1 / 3), np.array([0, 1, 3, 0]), DataError, r"0\.\.2"),
        (np.full((4, 3), 1 / 3), np.array([0, 1, -1, 0]), DataError, r"0\.\.2"),
        (np.full((4, 3), 1 / 3), np.array([0, 0.5, 1, 0]), DataError, "integer"),
        (np.full((4, 3), 0.5), np.zeros(4, int), DataError, "sum to 1"),
        (np.array([[2.0, -1.0]]), np.zeros(1, int), DataError, "logits"),
        (np.array([[np.nan, 1.0]]), np.zeros(1, int), DataError, "NaN"),
        (np.zeros((0, 2)), np.zeros(0, int), DataError, "empty"),
    ],
)
def test_bad_inputs(probs, y, error, message):
    for fn in (M.accuracy, M.negative_log_likelihood, M.brier_score, M.expected_calibration_error):
        with pytest.raises(error, match=message):
            fn(probs, y)


def test_bad_settings():
    probs, y = np.full((4, 2), 0.5), np.zeros(4, int)
    with pytest.raises(ConfigError, match="equal_mass"):
        M.expected_calibration_error(probs, y, binning="quantile")
    with pytest.raises(ConfigError, match="num_bins"):
        M.expected_calibration_error(probs, y, num_bins=0)
    with pytest.raises(ConfigError, match="mutual_information"):
        M.ood_score(probs[None], kind="variance")
    with pytest.raises(DataError, match="classes last"):
        M.ood_score(np.full(3, 1 / 3))
    with pytest.raises(DataError, match=re.escape("(2, 3)")):
        M.regression_metrics(np.zeros((2, 3)), np.ones((2, 3)), np.zeros(4))
    with pytest.raises(DataError, match="both sides"):
        M.ood_auroc([], [1.0])


# -- Posterior.evaluate ---------------------------------------------------------------------------


@bdl.model
def mean_model(y=None, n=3):
    mu = bdl.sample("mu", dist.Normal(0.0, 1.0))
    sigma = bdl.sample("sigma", dist.HalfNormal(1.0))
    with bdl.plate("data", n) as idx:
        bdl.sample("y", dist.Normal(mu, sigma), obs=None if y is None else y[idx])


@bdl.model
def logistic1(x, y=None):
    w = bdl.sample("w", dist.Normal(0.0, 1.0))
    with bdl.plate("data", x.shape[0]) as idx:
        bdl.sample("y", dist.Bernoulli(logits=w * x[idx]), obs=None if y is None else y[idx])


def _posterior(samples, backend):
    return bdl.Posterior(
        samples={k: np.asarray(v, dtype=np.float32)[None] for k, v in samples.items()},
        backend=backend,
        precision="float32",
    )


def test_evaluate_regression_with_known_draws(backend):
    mu, sigma = np.array([0.0, 1.0, -0.5]), np.array([1.0, 0.5, 2.0])
    post = _posterior({"mu": mu, "sigma": sigma}, backend)
    y = np.array([0.2, 1.5, -1.0], dtype=np.float32)
    got = post.evaluate(mean_model(y, n=3))
    want = M.regression_metrics(
        np.repeat(mu[:, None], 3, 1), np.repeat(sigma[:, None] ** 2, 3, 1), y
    )
    assert got.keys() == want.keys()
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-5), k


def test_evaluate_bernoulli_with_known_draws(backend):
    w = np.array([-1.0, 0.5, 2.0])
    post = _posterior({"w": w}, backend)
    x = np.array([-2.0, 0.0, 1.0, 3.0], dtype=np.float32)
    y = np.array([0.0, 1.0, 1.0, 0.0], dtype=np.float32)  # Bernoulli data stored as floats
    got = post.evaluate(logistic1(x, y), num_bins=4)
    p1 = 1 / (1 + np.exp(-w[:, None] * x[None, :]))
    want = M.classification_metrics(np.stack([1 - p1, p1], axis=-1), y, num_bins=4)
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-5, abs=1e-6), k
    with pytest.raises(DataError, match=r"no observed values.*logistic1\(X_test, y_test\)"):
        post.evaluate(logistic1(x))
    with pytest.raises(ModelError, match="bind its data"):
        post.evaluate(logistic1)


@pytest.mark.parametrize("backend", ["pyro", pytest.param("numpyro", marks=pytest.mark.slow)])
def test_evaluate_bnn_classifier_end_to_end(backend):
    X, y = bnn.make_blobs(n=40, num_classes=3, seed=0)
    X_test, y_test = bnn.make_blobs(n=30, num_classes=3, seed=1)
    model = bnn.make_bnn_classification(hidden=(5,))
    post = bdl.fit(
        model(X, y, num_classes=3),
        backend=backend,
        method="vi",
        num_steps=200,
        num_samples=20,
        seed=0,
        progress=False,
    )
    scores = post.evaluate(model(X_test, y_test, num_classes=3), seed=1)
    assert set(scores) == {
        "accuracy",
        "nll",
        "brier",
        "ece",
        "predictive_entropy",
        "expected_entropy",
        "mutual_information",
    }
    assert all(isinstance(v, float) for v in scores.values())
    pred = post.predict(model(X_test, y_test, num_classes=3), seed=1)
    assert scores["accuracy"] == np.mean(pred.probs.argmax(-1) == y_test)
    assert scores["nll"] == pytest.approx(-pred.log_likelihood(y_test), rel=1e-6)
    assert scores["accuracy"] > 0.8  # the blobs are well separated


@pytest.mark.slow
def test_docs_example_runs(tmp_path, monkeypatch):
    """The example of docs/results.md runs as written and its stated numbers hold."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "results.md").read_text()
    section = text.split("## Evaluating predictions")[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code, "docs/results.md", "exec"), namespace)
    scores, auroc = namespace["scores"], namespace["auroc"]
    assert scores["accuracy"] == pytest.approx(0.993, abs=0.01)
    assert scores["ece"] < 0.05
    assert auroc["mutual_information"] > auroc["entropy"] > 0.5
    assert (tmp_path / "reliability.png").exists()
