"""Deep and anchored ensembles (method="ensemble"): members, mixing, the anchored closed form on
a conjugate linear model, chain_ids, diagnostics, failures and errors."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from scipy import stats

import ppl_bdl as bdl
from ppl_bdl import dist
from ppl_bdl.errors import ConfigError, InferenceError
from ppl_bdl.inference.ensemble import EnsembleConfig, ensemble_transition, resolve_anchors
from ppl_bdl.inference.loop import driver
from ppl_bdl.inference.loop.chunked_run import chunk_inputs
from ppl_bdl.inference.loop.minibatch import EpochBatches
from ppl_bdl.inference.setup import minibatch_plate, prepare
from ppl_bdl.models import bnn, regression
from ppl_bdl.optim import unit_schedule
from ppl_bdl.posterior.diagnostics import ConvergenceWarning


def _fit(bound, backend, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return bdl.fit(bound, backend=backend, method="ensemble", progress=False, **options)


def test_members_differ_and_predictions_mix_them(backend):
    X, y = regression.sine_data()
    model = bnn.make_bnn_regression(hidden=(8,))
    ens = _fit(model(X, y), backend, num_members=3, num_steps=300, lr=0.02, batch_size=20)
    w = ens.samples["net.0.weight"]
    assert w.shape == (3, 1, 1, 8) and ens.losses.shape == (3, 300)
    assert (
        np.all(np.isfinite(ens.losses)) and ens.losses[:, -20:].mean() < ens.losses[:, :20].mean()
    )
    flat = w.reshape(3, -1)
    assert min(np.abs(flat[i] - flat[j]).max() for i, j in ((0, 1), (0, 2), (1, 2))) > 1e-2
    assert set(ens.sample_stats) == {"loss", "grad_norm"}
    # the predictive is the uniform mixture of the members' Normal predictives
    pred = ens.predict(model(X))
    means, variances = pred.per_draw["mean"], pred.per_draw["variance"]
    assert means.shape == (3, len(y))
    density = np.mean(stats.norm.pdf(y, means, np.sqrt(variances)), axis=0)
    scores = ens.evaluate(model(X, y))
    np.testing.assert_allclose(scores["nll"], -np.mean(np.log(density)), rtol=1e-5)
    np.testing.assert_allclose(pred.mean, means.mean(0), rtol=1e-6)
    assert scores["epistemic_variance"] > 0  # the members disagree
    # a subset of the members: the members they are in the whole ensemble
    one = _fit(
        model(X, y), backend, num_members=3, num_steps=300, lr=0.02, batch_size=20, chain_ids=[2]
    )
    np.testing.assert_allclose(one.samples["net.0.weight"][0], w[2], rtol=1e-3, atol=1e-4)
    # nothing about mixing is computed for an ensemble
    assert not {"rhat", "ess_bulk", "ess_tail"} & set(ens.diagnostics.kinds())
    assert "r_hat" not in ens.summary().columns


def _linear_data():
    """A conjugate linear model with three coefficients: two informed by correlated inputs, the
    third by none (its column is zero)."""
    rng = np.random.default_rng(1)
    x0 = rng.normal(0.0, 0.5, size=10)
    X = np.column_stack([x0, x0 + rng.normal(0.0, 0.3, size=10), np.zeros(10)])
    y = X @ np.array([1.0, -0.5, 0.0]) + rng.normal(size=10)
    return X, y


#: Members per backend: vectorised on NumPyro; one after another on Pyro.
MEMBERS = {"numpyro": 400, "pyro": 30}


def test_anchored_members_follow_the_closed_form(backend):
    """An anchored member's MAP is θ_m = A⁻¹(Xᵀy/σ² + S₀⁻¹θ_anc,m) with θ_anc,m from the prior:
    the members are N(μ_post, A⁻¹S₀⁻¹A⁻¹) (Pearce et al. 2020), centred on the exact posterior
    mean, as wide as the posterior where the data says nothing, narrower where it informs."""
    X, y = _linear_data()
    mean, cov = regression.conjugate_posterior(X, y, noise=1.0, prior_scale=1.0)
    closed = cov @ cov  # A⁻¹ S₀⁻¹ A⁻¹ with S₀ = I
    M = MEMBERS[backend]
    ens = _fit(
        regression.linear_regression_known_noise(X, y),
        backend,
        num_members=M,
        num_steps=200,
        lr=0.1,
        schedule="cosine",
        anchored=True,
    )
    w = ens.samples["w"][:, 0]
    assert ens.settings["anchored_sites"] == ["w"]
    # the mean: within 4 Monte Carlo standard errors of the posterior mean
    np.testing.assert_array_less(np.abs(w.mean(0) - mean), 4 * np.sqrt(np.diag(closed) / M))
    # the covariance along fixed directions: (M - 1) s² / v'Cv ~ χ²(M - 1)
    lo, hi = stats.chi2.ppf([1e-4, 1 - 1e-4], M - 1) / (M - 1)
    directions = [*np.eye(3), np.array([1.0, 1.0, 0.0]), np.array([1.0, -1.0, 1.0])]
    for v in directions:
        ratio = np.var(w @ v, ddof=1) / (v @ closed @ v)
        assert lo < ratio < hi, (v, ratio, lo, hi)
    # exact where the data does not inform: the zero column's coefficient has the prior's spread
    assert closed[2, 2] == pytest.approx(cov[2, 2])
    if M >= 400:  # and measurably narrower than the posterior where it does
        v = np.eye(3)[0]
        assert np.var(w @ v, ddof=1) / (v @ cov @ v) < lo


def test_a_plain_ensemble_of_a_convex_model_collapses_onto_the_map(backend):
    X, y = _linear_data()
    mean, _ = regression.conjugate_posterior(X, y, noise=1.0, prior_scale=1.0)
    ens = _fit(
        regression.linear_regression_known_noise(X, y),
        backend,
        num_members=3,
        num_steps=200,
        lr=0.1,
        schedule="cosine",
    )
    np.testing.assert_allclose(ens.samples["w"][:, 0], np.tile(mean, (3, 1)), atol=2e-3)


#: numpyro: three compilations (the whole ensemble, then each group), under -m slow
@pytest.mark.parametrize("backend", ["pyro", pytest.param("numpyro", marks=pytest.mark.slow)])
def test_members_run_as_an_executors_groups_merge_into_the_ensemble(backend):
    """Three members in groups of two and one (InProcessExecutor: the merge every executor's
    groups go through): the members' positions, losses at every step, sample stats, settings
    (their numbers) and findings of the ensemble fitted at once; bit for bit on Pyro (members
    one after another), to float rounding on NumPyro (a vectorised program over 2 members may
    round otherwise than one over 3)."""
    X, y = regression.sine_data()
    model = bnn.make_bnn_regression(hidden=(4,))
    options = dict(num_members=3, num_steps=60, lr=0.02, batch_size=20, anchored=["net.0.weight"])
    whole = _fit(model(X, y), backend, **options)
    grouped = _fit(
        model(X, y), backend, executor=bdl.InProcessExecutor(chains_per_task=2), **options
    )
    same = (
        np.testing.assert_array_equal
        if backend == "pyro"
        else lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    )
    for name in whole.samples:
        same(grouped.samples[name], whole.samples[name])
    for name in whole.sample_stats:
        same(grouped.sample_stats[name], whole.sample_stats[name])
    same(grouped.losses, whole.losses)
    assert grouped.settings == whole.settings and grouped.settings["members"] == [0, 1, 2]
    assert grouped.diagnostics.kinds() == whole.diagnostics.kinds()
    assert grouped.predict(model(X)).mean.shape == (len(y),)


def test_a_short_run_is_reported_not_flat():
    X, y = regression.sine_data()
    model = bnn.make_bnn_regression(hidden=(8,))
    with pytest.warns(ConvergenceWarning, match="member losses still fell"):
        ens = bdl.fit(
            model(X, y),
            backend="numpyro",
            method="ensemble",
            num_members=3,
            num_steps=100,
            lr=1e-3,
            chain_ids=[0, 2],
            progress=False,
        )
    (finding,) = ens.diagnostics  # the members named by their numbers in the whole ensemble
    assert finding.kind == "ensemble_not_flat" and finding.sites == ("member 0", "member 2")


@bdl.model
def _runaway():
    x = bdl.sample("x", dist.Normal(0.0, 1.0))
    bdl.factor("up", bdl.math.exp(x))  # U = x²/2 - exp(x): falls without end, then overflows


def test_a_member_that_turns_non_finite_stops_the_fit(backend):
    with pytest.raises(InferenceError, match="ensemble member 0: .* not finite") as info:
        _fit(_runaway(), backend, num_members=2, num_steps=50, optimizer="sgd", lr=1.0)
    partial = info.value.partial
    assert partial is not None and partial.method == "ensemble"
    assert np.all(np.isfinite(partial.samples["x"]))


def test_ensemble_settings_are_checked():
    X, y = regression.sine_data()
    bound = bnn.make_bnn_regression(hidden=(4,))(X, y)
    for options, match in [
        ({"num_chains": 4}, "num_members"),
        ({"num_samples": 10}, "num_samples=10 does not apply to method='ensemble'"),
        ({"num_warmup": 10}, "num_warmup"),
        ({"num_members": 0}, "num_members must be an int >= 1"),
        ({"anchored": "yes"}, "anchored must be True, False or a non-empty list"),
        ({"step_size": 0.1}, "unknown option 'step_size' for method='ensemble'"),
        ({"lr": -1.0}, "lr must be"),
        ({"schedule": "plateau"}, "schedule='plateau' does not apply"),
        ({"executor": "dask"}, "the one name an executor goes by is 'ray'"),
        ({"chain_ids": [5], "num_members": 3}, r"chain_ids .* \[0, 3\)"),
    ]:
        with pytest.raises(ConfigError, match=match):
            bdl.fit(bound, backend="numpyro", method="ensemble", progress=False, **options)


def test_anchored_refuses_a_prior_without_a_quadratic_form():
    X, y = regression.sine_data()
    bound = bnn.make_bnn_regression(hidden=(4,))(X, y)  # sigma ~ HalfNormal
    with pytest.raises(ConfigError, match=r"'sigma': 'HalfNormal'.*anchored=\['net.0.weight'"):
        bdl.fit(
            bound, backend="numpyro", method="ensemble", anchored=True, num_steps=5, progress=False
        )
    with pytest.raises(ConfigError, match=r"\['nope'\] are not continuous latent sites"):
        bdl.fit(
            bound,
            backend="numpyro",
            method="ensemble",
            anchored=["nope"],
            num_steps=5,
            progress=False,
        )
    # anchoring the network only: sigma keeps its own prior
    ens = _fit(
        bound,
        "numpyro",
        num_members=2,
        num_steps=50,
        anchored=["net.0.weight", "net.0.bias", "net.1.weight", "net.1.bias"],
    )
    assert ens.settings["anchored_sites"] == [
        "net.0.weight",
        "net.0.bias",
        "net.1.weight",
        "net.1.bias",
    ]


def test_an_ensemble_saves_and_loads(tmp_path):
    X, y = regression.sine_data()
    model = bnn.make_bnn_regression(hidden=(4,))
    ens = _fit(model(X, y), "numpyro", num_members=2, num_steps=60)
    back = bdl.load(ens.save(tmp_path / "ens.nc"), model(X, y))
    assert back.method == "ensemble" and back.losses.shape == (2, 60)
    np.testing.assert_allclose(back.samples["sigma"], ens.samples["sigma"])


def test_the_anchored_step_has_no_per_step_gate():
    """The compiled CPU loop of an anchored, minibatched ensemble on NumPyro selects nothing per
    step (tests/test_loop_ops.py's guard for SG-MCMC): a non-finite step is the loop's to drop,
    and the anchored term adds arithmetic only."""
    pytest.importorskip("jax")
    from ppl_bdl.backends.numpyro.loop import chunk_header  # imports jax
    from ppl_bdl.backends.numpyro.loop_ops import float_gates

    X, y = _linear_data()
    setup = prepare(regression.linear_regression_known_noise(X, y), "numpyro", "float32", 0)
    config = EnsembleConfig.build(num_steps=20, batch_size=5, anchored=True, schedule="cosine")
    plate = minibatch_plate(setup, config.batch_size)
    transition, data = ensemble_transition(setup, config, plate, resolve_anchors(setup, True))
    backend, steps = setup.backend, config.num_steps
    unit = unit_schedule(config.optimizer)
    runner = backend.compile_loop(
        driver._loop_step(backend, transition, False, unit), transition.emit
    )
    with backend.scope(), backend.activate():
        state = transition.init(
            backend.random.key(0), backend.asarray(np.zeros(setup.layout.dim)), data
        )
        xs = chunk_inputs(backend, steps, steps, [EpochBatches(10, 5, 0)], False)
        inputs = (data, backend.asarray(0.1), backend.random.key(1))
        header = chunk_header(np.zeros(steps, bool), steps, 0, 1)
        lowered = runner.fast.lower(state, xs, inputs, header, length=steps, num_rows=1, trace=True)
    assert float_gates(lowered.as_text()) == 0
