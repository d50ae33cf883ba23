"""MC dropout (method="mc_dropout", nn.Dropout, nn.MLP(p=...)): the masks' rate and scaling,
reproducibility, p = 0 as the MAP, the predictive against the MC dropout estimate computed by
hand, the draws in ArviZ, saved and loaded, the identity under other methods, and the errors."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from scipy import stats

import ppl_bdl as bdl
from ppl_bdl import dist, nn
from ppl_bdl.backend_protocol import Batch
from ppl_bdl.dsl.nn.dropout import DROPOUT_SEED, ActiveDropout
from ppl_bdl.errors import ConfigError, ModelError
from ppl_bdl.inference.ensemble import EnsembleConfig
from ppl_bdl.inference.mc_dropout import dropout_masks, mc_dropout_transition
from ppl_bdl.inference.setup import minibatch_plate, prepare
from ppl_bdl.posterior.diagnostics import ConvergenceWarning

P = 0.2
SIGMA = 0.1
X = np.linspace(-2.0, 2.0, 40)[:, None]
Y = np.sin(X[:, 0])
X_NEW = np.linspace(-3.0, 3.0, 7)[:, None]
OPTIONS = dict(num_steps=60, lr=0.02, batch_size=10, progress=False)


def regression(net):
    @bdl.model
    def mlp_regression(X, y=None):
        f = net.sample()
        with bdl.plate("data", X.shape[0]) as idx:
            bdl.sample(
                "y", dist.Normal(f(X[idx])[..., 0], SIGMA), obs=None if y is None else y[idx]
            )

    return mlp_regression


DROPPED = regression(nn.MLP("net", [1, 8, 8, 1], activation="tanh", p=P))
PLAIN = regression(nn.MLP("net", [1, 8, 8, 1], activation="tanh"))


def _fit(bound, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return bdl.fit(bound, **options)


@pytest.fixture(scope="module")
def fits():
    return {}


@pytest.fixture
def fitted(fits, backend):
    """One MC dropout fit per backend, shared by the module's tests."""
    if backend not in fits:
        fits[backend] = _fit(
            DROPPED(X, Y), backend=backend, method="mc_dropout", num_samples=30, seed=1, **OPTIONS
        )
    return fits[backend]


# -- the masks -------------------------------------------------------------------------------
def test_masks_have_the_rate_and_the_scaling(backend):
    """Fraction dropped ≈ p within binomial error; kept units scaled by exactly 1/(1 − p), so
    the mask's mean ≈ 1; a posterior draw's mask is one per unit, shared by the points."""
    be = bdl.backends.get(backend)
    p, shape = 0.3, (400, 250)
    n = np.prod(shape)
    with be.scope(), be.activate():
        active = ActiveDropout(be, key=be.random.key(3), record=True)
        out = be.to_numpy(active.drop(be.asarray(np.ones(shape)), p, "d"))
        shared = ActiveDropout.from_seed(be, 5, record=True)
        shared.drop(be.asarray(np.ones(shape)), p, "d")
    dropped = np.mean(out == 0.0)
    assert abs(dropped - p) < 5 * np.sqrt(p * (1 - p) / n)
    np.testing.assert_allclose(out[out != 0.0], 1.0 / (1.0 - p), rtol=1e-6)
    assert abs(out.mean() - 1.0) < 5 * np.sqrt(p / (1 - p) / n)
    assert active.shapes == [shape] and be.to_numpy(shared.masks["d"]).shape == shape[1:]


def test_each_training_step_draws_fresh_masks_from_its_key():
    setup = prepare(DROPPED(X, Y), "numpyro", "float32", 0)
    config = EnsembleConfig.build(num_members=1, num_steps=5, batch_size=10)
    plate = minibatch_plate(setup, config.batch_size)
    transition, data, sites = mc_dropout_transition(setup, config, plate)
    assert [path for path, _ in sites.calls] == ["net[2]", "net[5]"]
    assert sites.shapes == [(10, 8), (10, 8)]  # one mask per point of the minibatch and unit
    be = setup.backend
    with be.scope(), be.activate():
        start = be.asarray(np.random.default_rng(0).normal(size=setup.layout.dim))
        state = transition.init(be.random.key(0), start, data)
        batch = Batch(data, be.asarray(np.arange(10), "int"))

        def loss(seed):
            return float(transition.step(be.random.key(seed), state, batch, 0.01)[1]["loss"])

        assert loss(1) == loss(1) and loss(1) != loss(2)


# -- the fit ---------------------------------------------------------------------------------
def test_the_same_seed_gives_the_same_fit(fitted, backend):
    again = _fit(
        DROPPED(X, Y), backend=backend, method="mc_dropout", num_samples=30, seed=1, **OPTIONS
    )
    for name, draws in fitted.samples.items():
        np.testing.assert_array_equal(again.samples[name], draws)
    np.testing.assert_array_equal(
        again.sample_stats[DROPOUT_SEED], fitted.sample_stats[DROPOUT_SEED]
    )
    assert fitted.losses.shape == (OPTIONS["num_steps"],)


def test_p_zero_is_exactly_the_map_of_the_model_without_dropout():
    zero = regression(nn.MLP("net", [1, 8, 8, 1], activation="tanh", p=0.0))
    common = dict(backend="numpyro", seed=4, **OPTIONS)
    mcd = _fit(zero(X, Y), method="mc_dropout", num_samples=5, **common)
    ens = _fit(PLAIN(X, Y), method="ensemble", num_members=1, **common)
    for name, draws in ens.samples.items():
        for d in range(5):
            np.testing.assert_array_equal(mcd.samples[name][0, d], draws[0, 0])
    assert mcd.predict(zero(X_NEW)).epistemic.max() == 0.0  # every draw is the one MAP network


# -- prediction ------------------------------------------------------------------------------
def _masks_by_hand(backend: str, seed: int, width: int, layers: int) -> list[np.ndarray]:
    """A draw's masks from its seed with the backend's own random numbers: standard normals z
    of the layer's width from fold_in(key, i) (JAX) or the seeded generator in order (torch),
    m = [z ≥ Φ⁻¹(p)] / (1 − p)."""
    if backend == "numpyro":
        import jax

        key = jax.random.PRNGKey(seed)
        keys = [jax.random.fold_in(key, i) for i in range(layers)]
        zs = [np.asarray(jax.random.normal(k, (width,))) for k in keys]
    else:
        import torch

        generator = torch.Generator().manual_seed(seed)
        zs = [torch.randn((width,), generator=generator).numpy() for _ in range(layers)]
    return [(z >= stats.norm.ppf(P)) / (1.0 - P) for z in zs]


def _network_by_hand(post, draw: int, x: np.ndarray, masks) -> np.ndarray:
    w = {n: v[0, draw].astype(np.float64) for n, v in post.samples.items()}
    h = np.tanh(x @ w["net.0.weight"] + w["net.0.bias"]) * masks[0]
    h = np.tanh(h @ w["net.1.weight"] + w["net.1.bias"]) * masks[1]
    return (h @ w["net.2.weight"] + w["net.2.bias"])[:, 0]


def test_predictions_are_the_mc_dropout_estimate_by_hand(fitted, backend):
    """Each draw is the fitted weights with its own masks, one per unit shared by the points:
    the per-draw means, their average (the MC dropout estimate of the predictive mean) and the
    pointwise log-likelihood agree with a NumPy forward pass at the masks drawn by hand."""
    pred = fitted.predict(DROPPED(X))
    seeds = fitted.sample_stats[DROPOUT_SEED][0]
    by_hand = np.stack(
        [
            _network_by_hand(fitted, d, X, _masks_by_hand(backend, int(s), 8, 2))
            for d, s in enumerate(seeds)
        ]
    )
    np.testing.assert_allclose(pred.per_draw["mean"], by_hand, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(pred.mean, by_hand.mean(axis=0), rtol=1e-4, atol=1e-5)
    assert np.all(by_hand.std(axis=0) > 0)  # the draws differ by their masks
    masks = dropout_masks(fitted, DROPPED(X), draw=7)
    np.testing.assert_array_equal(
        [masks["net[2]"] != 0, masks["net[5]"] != 0],
        [m != 0 for m in _masks_by_hand(backend, int(seeds[7]), 8, 2)],
    )
    loglik = stats.norm.logpdf(Y, by_hand, SIGMA)
    np.testing.assert_allclose(fitted.log_likelihood["y"][0], loglik, rtol=1e-4, atol=1e-3)


def test_the_uncertainty_split_reads_the_masks(fitted):
    pred = fitted.predict(DROPPED(X_NEW))
    means = pred.per_draw["mean"]
    np.testing.assert_allclose(pred.aleatoric, SIGMA**2, rtol=1e-5)
    np.testing.assert_allclose(pred.epistemic, means.var(axis=0), rtol=1e-5)
    np.testing.assert_allclose(pred.total, pred.aleatoric + pred.epistemic, rtol=1e-6)
    assert np.all(pred.epistemic > 0)
    resampled = fitted.predict(DROPPED(X_NEW), num_samples=60, seed=2)
    assert resampled.per_draw["mean"].shape == (60, 7)
    assert set(map(tuple, resampled.per_draw["mean"].round(5))) <= set(map(tuple, means.round(5)))


@pytest.mark.parametrize("backend", ["numpyro"])
def test_arviz_export_and_save_load_keep_the_masks(fitted, backend, tmp_path):
    idata = fitted.to_arviz(posterior_predictive=True)
    assert idata.sample_stats[DROPOUT_SEED].shape == (1, 30)
    assert idata.posterior_predictive["y"].shape == (1, 30, 40)
    assert idata.log_likelihood["y"].shape == (1, 30, 40)
    back = bdl.load(fitted.save(tmp_path / "mcd.nc"), DROPPED(X, Y))
    assert back.method == "mc_dropout" and back.losses.shape == (OPTIONS["num_steps"],)
    np.testing.assert_array_equal(
        back.sample_stats[DROPOUT_SEED], fitted.sample_stats[DROPOUT_SEED]
    )
    np.testing.assert_allclose(
        back.predict(DROPPED(X_NEW)).per_draw["mean"],
        fitted.predict(DROPPED(X_NEW)).per_draw["mean"],
        rtol=1e-6,
    )
    scores = back.evaluate(DROPPED(X, Y))
    assert np.isfinite(scores["nll"]) and scores["rmse"] < 1.0


# -- other methods ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "method, options",
    [
        ("vi", dict(num_steps=50, num_samples=10)),
        pytest.param(
            "nuts", dict(num_warmup=20, num_samples=10, num_chains=1), marks=pytest.mark.slow
        ),
    ],
)
def test_dropout_is_the_identity_under_other_methods(method, options):
    kw = dict(backend="numpyro", method=method, seed=0, progress=False, **options)
    with_dropout, without = _fit(DROPPED(X, Y), **kw), _fit(PLAIN(X, Y), **kw)
    for name, draws in without.samples.items():
        np.testing.assert_array_equal(with_dropout.samples[name], draws)
    np.testing.assert_array_equal(
        with_dropout.predict(DROPPED(X_NEW)).per_draw["mean"],
        without.predict(PLAIN(X_NEW)).per_draw["mean"],
    )


def test_a_lowered_model_runs_dropout_as_the_identity():
    import jax
    from numpyro import handlers

    def trace(model):
        with handlers.seed(rng_seed=0):
            return handlers.trace(model(X).lower("numpyro")).get_trace()

    a, b = trace(DROPPED), trace(PLAIN)
    np.testing.assert_array_equal(np.asarray(a["y"]["value"]), np.asarray(b["y"]["value"]))
    assert isinstance(a["y"]["value"], jax.Array)


# -- errors ----------------------------------------------------------------------------------
@pytest.mark.parametrize("p", [1.0, -0.1, 1.5, "0.5", True])
def test_a_rate_outside_zero_one_is_refused(p):
    with pytest.raises(ModelError, match=r"p is the probability .* \[0, 1\)"):
        nn.Dropout(p)
    with pytest.raises(ModelError, match=r"MLP\('net'\): p is the probability"):
        nn.MLP("net", [1, 4, 1], p=p)


def test_mc_dropout_refuses_a_model_without_dropout():
    with pytest.raises(ConfigError, match=r"no Dropout layer.*p=\.\.\. on nn\.MLP.*nn\.Dropout"):
        bdl.fit(PLAIN(X, Y), backend="numpyro", method="mc_dropout", num_steps=5, progress=False)


def test_method_options_are_checked():
    with pytest.raises(ConfigError, match="num_samples must be an int >= 1"):
        bdl.MCDropout(num_samples=0)
    with pytest.raises(ConfigError, match="the dropout rate is the model's"):
        bdl.MCDropout(p=0.1)
    with pytest.raises(ConfigError, match="schedule='plateau' does not apply to method='mc_d"):
        bdl.MCDropout(schedule="plateau")
    with pytest.raises(ConfigError, match="schedule must be one of 'constant', 'exponential'"):
        bdl.MCDropout(schedule="linear")
    with pytest.raises(ConfigError, match="batch_size"):
        bdl.MCDropout(batch_size=0)
