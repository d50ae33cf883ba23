"""The UCI harness (ppl_bdl.models.uci): loading and standardising a split, scoring in the
target's original units, and (slow, shared data) the published deep-ensemble numbers."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

import ppl_bdl as bdl
from ppl_bdl.errors import DataError
from ppl_bdl.models import uci, uci_baselines, uci_vi


def _fake_set(root, rows: int = 60, seed: int = 0):
    """A set in the shared folder's format, named like yacht: 3 inputs, target in column 3."""
    rng = np.random.default_rng(seed)
    folder = root / uci.FOLDERS["yacht"]
    folder.mkdir(parents=True)
    X = rng.normal(5.0, 2.0, size=(rows, 3))
    y = 100.0 + 10.0 * np.sin(X[:, 0]) + rng.normal(0.0, 1.0, rows)
    np.savetxt(folder / "data.txt", np.column_stack([X, y]))
    np.savetxt(folder / "index_features.txt", [0, 1, 2], fmt="%d")
    np.savetxt(folder / "index_target.txt", [3], fmt="%d")
    for k in range(2):
        perm = np.random.default_rng(k).permutation(rows)
        np.savetxt(folder / f"index_train_{k}.txt", perm[:45], fmt="%d")
        np.savetxt(folder / f"index_test_{k}.txt", perm[45:], fmt="%d")
    for name, value in (("n_splits", 2), ("n_hidden", 8), ("n_epochs", 5)):
        np.savetxt(folder / f"{name}.txt", [value], fmt="%d")
    return X, y


def test_a_split_is_standardised_with_the_training_split(tmp_path):
    X, y = _fake_set(tmp_path)
    split = uci.load_split("yacht", 1, root=tmp_path)
    np.testing.assert_allclose(split.X_train.mean(0), 0.0, atol=1e-12)
    np.testing.assert_allclose(split.X_train.std(0), 1.0)
    train = np.random.default_rng(1).permutation(60)[:45]
    assert split.y_mean == pytest.approx(y[train].mean()) and split.y_sd == pytest.approx(
        y[train].std()
    )
    test = np.random.default_rng(1).permutation(60)[45:]
    np.testing.assert_allclose(split.y_test * split.y_sd + split.y_mean, y[test])
    assert uci.protocol("yacht", tmp_path) == uci.Protocol("yacht", 2, 8, 5)


def test_scores_are_the_mixture_in_original_units(tmp_path):
    _fake_set(tmp_path)
    options = uci.deep_ensemble_options(num_members=3, batch_size=15, epochs=20)
    result = uci.run_uci("yacht", options, splits=[0], backend="numpyro", root=tmp_path)
    (score,) = result.scores
    assert options(uci.load_split("yacht", 0, tmp_path), uci.protocol("yacht", tmp_path)) == dict(
        method="ensemble", num_members=3, batch_size=15, lr=0.01, num_steps=60
    )
    # refit (same seed: same members) and score by hand in original units
    data = uci.load_split("yacht", 0, tmp_path)
    model = uci.uci_model(8)
    post = bdl.fit(
        model(data.X_train, data.y_train),
        backend="numpyro",
        seed=0,
        progress=False,
        **options(data, uci.protocol("yacht", tmp_path)),
    )
    pred = post.predict(model(data.X_test))
    means = pred.per_draw["mean"] * data.y_sd + data.y_mean
    sds = np.sqrt(pred.per_draw["variance"]) * data.y_sd
    y = data.y_test * data.y_sd + data.y_mean
    density = np.mean(stats.norm.pdf(y, means, sds), axis=0)
    assert score.log_likelihood == pytest.approx(np.mean(np.log(density)), rel=1e-5)
    assert score.rmse == pytest.approx(np.sqrt(np.mean((means.mean(0) - y) ** 2)), rel=1e-5)
    assert "yacht" in str(result) and result.rmse[0] == pytest.approx(score.rmse)
    assert np.isfinite(score.final_loss)  # the members' last tenth of losses


def test_paired_difference_pairs_the_splits_both_scored():
    def result(label, lls):
        return uci.UCIResult("yacht", label, [uci.SplitScore(k, 1.0, ll, 0.0) for k, ll in lls])

    a = result("a", [(0, -1.0), (1, -2.0), (2, -3.0)])
    b = result("b", [(2, -3.7), (0, -1.5)])  # split 1 unscored: left out
    mean, se = uci.paired_difference(a, b)
    assert mean == pytest.approx(0.6) and se == pytest.approx(0.1)  # diffs 0.5, 0.7
    with pytest.raises(DataError, match="share no split"):
        uci.paired_difference(a, result("c", [(5, 0.0)]))


def test_missing_or_unknown_data_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match="unknown UCI set 'bostn'"):
        uci.load_split("bostn", 0)
    with pytest.raises(DataError, match="is not here .*PPL_BDL_DATA"):
        uci.load_split("concrete", 0, root=tmp_path)
    _fake_set(tmp_path)
    with pytest.raises(DataError, match=r"splits 0\.\.1; got split=2"):
        uci.load_split("yacht", 2, root=tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["boston", "concrete", "yacht"])
def test_deep_ensembles_reproduce_the_published_log_likelihood(shared_data, backend, name):
    """The deep-ensemble protocol (5 members, 40 epochs, a learned noise scale) on the first 5 of
    the 20 splits: the mean test log-likelihood is within the published ± of the deep-ensemble
    number (Lakshminarayanan et al. 2017, Table 1). benchmarks/uci_ensembles.py runs all 20.

    The noise scale learned here is the network's scale output (``uci_model``'s default,
    noise="heteroscedastic": an input-dependent scale, as the published networks have). The
    issue's reading, one learned noise scale for all inputs (``noise="halfnormal"``), matches
    on boston and concrete but misses yacht, whose residuals are far from homoscedastic: −1.58
    ± 0.03 over 20 splits against the published −1.18 ± 0.21 (docs/benchmarks.md, UCI
    regression), so it is not what this test checks."""
    result = uci.run_uci(
        name,
        uci.deep_ensemble_options(),
        splits=range(5),
        backend=backend,
        root=shared_data / "uci",
    )
    value, pm = uci.PUBLISHED_DEEP_ENSEMBLES[name]["log_likelihood"]
    assert abs(result.log_likelihood[0] - value) <= pm, str(result)
    assert result.matches_published("rmse"), str(result)


#: Yacht, both backends: the bar is not met on average. Over 15 groups of seeds (split k at
#: seed 1000 j + k: benchmarks/uci_vogn.py --seed-groups 15) the groups' mean difference vogn −
#: adam is −0.017 ± 0.005 on Pyro and −0.025 ± 0.010 on NumPyro (pooled −0.021 ± 0.005); the
#: bar is met by 10 of 15 groups on Pyro and 8 of 15 on NumPyro. This test's seeds (0-4) give
#: −0.035 ± 0.014 on Pyro (a miss) and +0.005 ± 0.015 on NumPyro (a pass by the draw of the
#: seeds: an XPASS here says nothing more). The backends are not the cause: from the same
#: start, weight noise and minibatches whole 3,440-step yacht runs agree across them (test LL
#: to 1e-9 in float64, 8e-4 in float32). On yacht vogn's better ELBO keeps fewer hidden units
#: in use and predicts slightly worse (docs/benchmarks.md).
YACHT_GAP = pytest.mark.xfail(
    reason="yacht: over 15 seed groups vogn - adam = -0.017 +- 0.005 (Pyro), -0.025 +- 0.010 "
    "(NumPyro); seeds 0-4 give -0.035 +- 0.014 on Pyro, +0.005 +- 0.015 on NumPyro; run to "
    "4,000 epochs Adam reaches test LL -2.43, vogn's fixed point -2.57 (docs/benchmarks.md)",
    strict=False,
)


#: concrete, curvature "ggn": split k at seed k meets the bar, 3 of 4 seed groups do not.
CONCRETE_GAP = pytest.mark.xfail(
    reason="concrete: over 4 seed groups vogn - adam = -0.062 +- 0.017 (3 of 4 groups miss the "
    "bar; seeds 0-4 give -0.016 +- 0.023)",
    strict=False,
)
#: curvature="fisher" on boston and concrete: over 4 seed groups vogn − adam is −0.064 ± 0.012
#: and −0.076 ± 0.010 (docs/benchmarks.md); split k at seed k happens to meet the bar.
FISHER_GAP = pytest.mark.xfail(
    reason="fisher: over 4 seed groups vogn - adam = -0.064 +- 0.012 (boston), -0.076 +- 0.010 "
    "(concrete), against +0.101 +- 0.013 on yacht",
    strict=False,
)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("backend_name", "name", "curvature"),
    [
        ("numpyro", "yacht", "hessian"),
        ("numpyro", "boston", "hessian"),
        ("numpyro", "concrete", "hessian"),
        ("pyro", "yacht", "hessian"),
        pytest.param("numpyro", "yacht", "ggn", marks=YACHT_GAP),
        ("numpyro", "boston", "ggn"),
        pytest.param("numpyro", "concrete", "ggn", marks=CONCRETE_GAP),
        pytest.param("pyro", "yacht", "ggn", marks=YACHT_GAP),
        ("numpyro", "yacht", "fisher"),
        ("pyro", "yacht", "fisher"),
        pytest.param("numpyro", "boston", "fisher", marks=FISHER_GAP),
        pytest.param("numpyro", "concrete", "fisher", marks=FISHER_GAP),
    ],
)
def test_vogn_test_log_likelihood_is_no_worse_than_adams(
    shared_data, backend_name, name, curvature
):
    """Natural-gradient mean-field VI (vogn) against Adam's mean-field VI through the
    harness, 400 epochs of B = 32 each on splits 0-4 (models/uci_vi.py; Pyro on yacht only,
    its ten fits about a minute). The paired per-split difference of the test
    log-likelihood, vogn − adam, is above −2 of its standard errors.

    With curvature="hessian" (the Price-theorem Hessian under the positivity-preserving
    average, β₂ = 0.999) the bar is met on every set and seed group measured; NumPyro, seeds
    0-4: yacht +0.131 ± 0.012, boston +0.032 ± 0.009, concrete +0.083 ± 0.016; over 4 seed
    groups +0.122 ± 0.014, +0.036 ± 0.003, +0.040 ± 0.015 (docs/benchmarks.md).
    The squared-gradient curvatures do not meet it everywhere. "ggn" (the paper's), NumPyro:
    yacht +0.005 ± 0.015, boston −0.037 ± 0.036, concrete −0.016 ± 0.023; Pyro, yacht: −0.035
    ± 0.014; on yacht the bar is not met on average on either backend (YACHT_GAP), on concrete
    not over 4 seed groups (CONCRETE_GAP). "fisher" (labels drawn from the model): yacht
    +0.099 ± 0.014 (NumPyro), boston −0.049 ± 0.031, concrete −0.050 ± 0.035; over 4 seed
    groups yacht is met by far, boston and concrete are not (FISHER_GAP)."""
    if backend_name not in bdl.backends.available():
        pytest.skip(f"backend {backend_name!r} is not installed")
    results = uci_vi.vogn_against_adam(
        name, backend_name, splits=range(5), root=shared_data / "uci", curvature=curvature
    )
    diff, se = uci.paired_difference(results["vogn"], results["adam"])
    assert diff > -2.0 * se, (diff, se, str(results["vogn"]), str(results["adam"]))


def test_every_baseline_runs_through_the_harness(tmp_path):
    """Each post-hoc baseline fits and scores a split (the Laplace fits by the linearised
    predictive, MC dropout with its Dropout layers, SWAG's rank cut to the epochs it collects)."""
    _fake_set(tmp_path)
    proto = uci.protocol("yacht", tmp_path)
    data = uci.load_split("yacht", 0, tmp_path)
    for method in uci_baselines.BASELINES:
        options = uci_baselines.baseline_options(method, epochs=4, num_samples=20)
        result = uci.run_uci(
            "yacht",
            options,
            splits=[0],
            backend="numpyro",
            root=tmp_path,
            model=options.model(proto),
        )
        (score,) = result.scores
        assert np.isfinite(score.rmse) and np.isfinite(score.log_likelihood), method
    assert uci_baselines.baseline_options("swag", epochs=4)(data, proto)["rank"] == 4
    assert uci_baselines.baseline_options("laplace_ll").pred_type == "glm"
    with pytest.raises(bdl.errors.ConfigError, match="unknown baseline"):
        uci_baselines.baseline_options("laplace")
