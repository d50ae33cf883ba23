"""hessian="kron" (KFAC of nn.Dense layers): exact for one Dense layer with one output, the
factors against A and G computed by hand on an MLP, the draws, the log determinant, the other
sites' block, a larger network without a (d, d) matrix, and the errors."""

from __future__ import annotations

import tracemalloc
import warnings

import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import dist, nn
from ppl_bdl.errors import ConfigError
from ppl_bdl.inference.laplace.curvature import curvature
from ppl_bdl.inference.laplace.layer_ggn import layer_pieces
from ppl_bdl.inference.laplace.marglik import rescale_prior
from ppl_bdl.inference.setup import prepare
from ppl_bdl.posterior.diagnostics import ConvergenceWarning

RNG = np.random.default_rng(1)
X = RNG.normal(size=(30, 2))
LABELS = (X[:, 0] + X[:, 1] > 0).astype(int) + (X[:, 0] > 1).astype(int)
XL = RNG.normal(size=(20, 3))
YL = XL @ np.array([1.0, -2.0, 0.5]) + 0.3 * RNG.normal(size=20)


@bdl.model
def linear(X, y=None):
    f = nn.Dense("fc", 3, 1, prior=2.0).sample()
    with bdl.plate("data", X.shape[0]) as idx:
        bdl.sample("y", dist.Normal(f(X[idx])[..., 0], 0.3), obs=None if y is None else y[idx])


@bdl.model
def noisy(X, y=None):
    f = nn.Dense("fc", 3, 1, prior=2.0).sample()
    noise = bdl.sample("noise", dist.LogNormal(0.0, 1.0))
    with bdl.plate("data", X.shape[0]) as idx:
        bdl.sample("y", dist.Normal(f(X[idx])[..., 0], noise), obs=None if y is None else y[idx])


@bdl.model
def heteroscedastic(X, y=None):
    out = nn.Dense("fc", 3, 2, prior=2.0).sample()  # the mean and the scale
    with bdl.plate("data", X.shape[0]) as idx:
        f = out(X[idx])
        scale = bdl.math.softplus(f[..., 1]) + 0.01
        bdl.sample("y", dist.Normal(f[..., 0], scale), obs=None if y is None else y[idx])


@bdl.model
def classifier(X, y=None):
    logits = nn.MLP("net", [2, 4, 3], activation="tanh", prior=1.5).sample()
    with bdl.plate("data", X.shape[0]) as idx:
        bdl.sample("y", dist.Categorical(logits=logits(X[idx])), obs=None if y is None else y[idx])


def _fit(bound, **options):
    options = {"backend": "numpyro", "precision": "float64", "progress": False, **options}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return bdl.fit(bound, method="laplace", **options)


@pytest.fixture(scope="module")
def mlp_fit():
    return _fit(classifier(X, LABELS), hessian="kron", num_steps=300, lr=0.05, num_samples=10)


@pytest.mark.parametrize("backend", ["numpyro", "pyro"])
def test_one_dense_layer_with_one_output_is_the_exact_ggn(backend):
    start = {"fc.weight": np.ones((3, 1)), "fc.bias": np.zeros(1)}  # the GGN is the same anywhere
    full = _fit(linear(XL, YL), backend=backend, num_steps=0, init=start)
    kron = _fit(linear(XL, YL), backend=backend, num_steps=0, init=start, hessian="kron")
    assert [b.coords.shape for b in kron.guide.blocks] == [(4, 1)]
    np.testing.assert_allclose(kron.guide.precision_matrix(), full.guide.precision, rtol=1e-10)
    assert kron.guide.log_det_precision() == pytest.approx(full.guide.log_det_precision(), 1e-10)


def _by_hand(mode, layout):
    """A/N and G of the MLP's two layers from NumPy: G = Σ_n Jₙᵀ Λₙ Jₙ, Λ = diag(p) − p pᵀ."""
    slots = {s.name: s for s in layout.slots}

    def value(name, shape):
        slot = slots[name]
        return mode[slot.offset : slot.offset + slot.size].reshape(shape)

    w0, b0 = value("net.0.weight", (2, 4)), value("net.0.bias", (4,))
    w1, b1 = value("net.1.weight", (4, 3)), value("net.1.bias", (3,))
    hidden = np.tanh(X @ w0 + b0)
    logits = hidden @ w1 + b1
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    lam = np.einsum("ni,ij->nij", p, np.eye(3)) - np.einsum("ni,nj->nij", p, p)
    back = np.einsum("ij,ni->nij", w1, 1 - hidden**2)  # ∂f_j/∂s₀_i: (n, 4, 3)
    g0 = np.einsum("nik,nkl,njl->ij", back, lam, back)
    ones = np.ones((len(X), 1))
    a0, a1 = np.hstack([X, ones]), np.hstack([hidden, ones])
    n = len(X)
    return [(a0.T @ a0 / n, g0), (a1.T @ a1 / n, lam.sum(0))]


def test_kron_posterior_saves_and_loads(mlp_fit, tmp_path):
    back = bdl.load(mlp_fit.save(tmp_path / "kron.nc"), model=classifier(X, LABELS))
    np.testing.assert_allclose(back.samples["net.0.weight"], mlp_fit.samples["net.0.weight"])
    assert back.method == "laplace"


def test_mlp_blocks_are_a_kron_g_by_hand(mlp_fit):
    approx = mlp_fit.guide
    layout = prepare(classifier(X, LABELS), "numpyro", "float64", 0).layout
    expected = _by_hand(approx.mode, layout)
    assert len(approx.blocks) == 2 and len(approx.rest_index) == 0
    for block, (a, g) in zip(approx.blocks, expected, strict=True):
        got_a, got_g = block.factors()
        np.testing.assert_allclose(got_a, a, rtol=1e-8, atol=1e-12)
        np.testing.assert_allclose(got_g, g, rtol=1e-8, atol=1e-12)
        assert block.delta == pytest.approx(1 / 1.5**2)
        np.testing.assert_allclose(
            block.matrix(),
            np.kron(a, g) + block.delta * np.eye(a.size // len(a) * len(g)),
            atol=1e-10,
        )
    # the weight's rows then the bias, as W̃ = [W; b]
    slot = {s.name: s for s in layout.slots}["net.1.bias"]
    np.testing.assert_array_equal(approx.blocks[1].coords[-1], slot.offset + np.arange(3))


def test_chunks_and_backends_give_the_same_factors():
    rng = np.random.default_rng(5)
    shapes = {
        "net.0.weight": (2, 4),
        "net.0.bias": (4,),
        "net.1.weight": (4, 3),
        "net.1.bias": (3,),
    }
    start = {name: rng.normal(size=shape) for name, shape in shapes.items()}
    whole, chunked = (
        _fit(
            classifier(X, LABELS),
            backend=backend,
            hessian="kron",
            num_steps=0,
            init=start,
            num_samples=4,
            batch_size=size,
        ).guide.precision_matrix()
        for backend, size in (("numpyro", None), ("pyro", 7))
    )
    np.testing.assert_allclose(chunked, whole, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("backend", ["numpyro", "pyro"])
def test_sampled_ggn_is_an_unbiased_estimate_of_the_exact_factors(backend):
    """ggn_samples: G and the diagonal D from draws M_nᵀ L_n ε (L_n L_nᵀ = Λ_n, a softmax's
    singular Λ_n included) average to the exact ones: every entry's mean over 50 seeds within
    5 standard errors, while one seed's estimate differs from the exact value."""
    setup = prepare(classifier(X, LABELS), backend, "float64", 0)
    theta = np.random.default_rng(3).normal(size=setup.layout.dim) * 0.7
    sites = set(setup.layout.names)
    for structure, piece in (("kron", "G"), ("diag", "D")):
        exact = layer_pieces(setup, theta, sites, None, structure).pieces
        draws = [layer_pieces(setup, theta, sites, None, structure, 8, s).pieces for s in range(50)]
        for path, pieces in exact.items():
            values = np.stack([d[path][piece] for d in draws])
            mean, se = values.mean(0), values.std(0, ddof=1) / np.sqrt(len(values))
            assert np.all(np.abs(mean - pieces[piece]) <= 5 * se + 1e-12), (structure, path)
            assert np.max(np.abs(values[0] - pieces[piece])) > 1e-3 * np.max(pieces[piece])
            if structure == "kron":  # A does not depend on the draws
                np.testing.assert_allclose(draws[0][path]["A"], pieces["A"], rtol=1e-12)


def test_pyro_layer_pass_is_traced_per_chunk_shape_and_agrees_with_the_eager_pass(monkeypatch):
    """On Pyro the layer pass runs as traced graphs, one per chunk shape (chunks of 7 of 30
    points: 7 and 2), the draws of ggn_samples made outside them (a trace would freeze them):
    its pieces are the eager pass's, float64, exact and sampled, "kron" and "diag"."""
    backend = prepare(classifier(X, LABELS), "pyro", "float64", 0).backend
    untraced = type(backend).trace
    traced: list[bool] = []

    def counted(self, fn, args):
        out = untraced(self, fn, args)
        traced.append(out is not fn)
        return out

    def pieces(eager: bool) -> dict:
        @bdl.model  # a new model each time: its own cache of compiled passes
        def fresh(X, y=None):
            logits = nn.MLP("net", [2, 4, 3], activation="tanh", prior=1.5).sample()
            with bdl.plate("data", X.shape[0]) as idx:
                bdl.sample("y", dist.Categorical(logits=logits(X[idx])), obs=y[idx])

        monkeypatch.setattr(
            type(backend), "trace", (lambda self, fn, args: fn) if eager else counted
        )
        setup = prepare(fresh(X, LABELS), "pyro", "float64", 0)
        theta = np.random.default_rng(4).normal(size=setup.layout.dim) * 0.7
        sites = set(setup.layout.names)
        out = {}
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no fallback to the eager pass
            for structure in ("kron", "diag"):
                for samples, seed in ((None, 0), (3, 0), (3, 1)):
                    found = layer_pieces(setup, theta, sites, 7, structure, samples, seed)
                    out[structure, samples, seed] = found.pieces
        return out

    graphs, eager = pieces(False), pieces(True)
    assert traced == [True] * 12  # per structure: the exact pass, Λ, the sampled pieces; x2
    for case, found in graphs.items():
        assert found.keys() == eager[case].keys() == {"net.0", "net.1"}
        for path, values in found.items():
            for name, value in values.items():
                np.testing.assert_allclose(value, eager[case][path][name], rtol=1e-12, atol=1e-14)
    for structure, piece in (("kron", "G"), ("diag", "D")):  # fresh draws for each seed
        assert not np.allclose(
            graphs[structure, 3, 0]["net.0"][piece], graphs[structure, 3, 1]["net.0"][piece]
        )


def test_sampled_ggn_fits_and_is_refused_where_it_does_not_apply():
    start = {"net.0.weight": np.ones((2, 4)), "net.0.bias": np.zeros(4)}
    start |= {"net.1.weight": np.ones((4, 3)), "net.1.bias": np.zeros(3)}
    post = _fit(classifier(X, LABELS), hessian="kron", ggn_samples=1, num_steps=0, init=start)
    assert post.guide.blocks and np.isfinite(post.guide.log_det_precision())
    for options in ({"hessian": "full"}, {"hessian": "diag", "curvature": "hessian"}):
        with pytest.raises(ConfigError, match="ggn_samples=2 estimates the nn layers"):
            bdl.Laplace(ggn_samples=2, **options)
    with pytest.raises(ConfigError, match="ggn_samples must be an int >= 1"):
        bdl.Laplace(hessian="kron", ggn_samples=0)


@bdl.model
def sequence(X, y=None):
    f = nn.Dense("fc", 3, 2, prior=2.0).sample()  # applied at 2 positions of each point
    with bdl.plate("data", X.shape[0]) as idx:
        loc = f(X[idx].reshape(-1, 2, 3)).sum(axis=(1, 2))
        bdl.sample("y", dist.Normal(loc, 0.3), obs=None if y is None else y[idx])


@pytest.mark.parametrize("backend", ["numpyro", "pyro"])
def test_layer_diagonal_is_the_full_ggns_diagonal(backend):
    """hessian="diag" reads the Dense layers' diagonal from the layer pass; the other
    coordinates (a noise scale, a layer used at several positions) from Hessian-vector
    products: all equal the full GGN's diagonal, in chunks, with a compiled pass kept."""
    rng = np.random.default_rng(7)
    cases = [
        (classifier(X, LABELS), {"net.0", "net.1"}),
        (noisy(XL, YL), {"fc"}),
        (sequence(rng.normal(size=(9, 6)), rng.normal(size=9)), set()),
    ]
    for bound, exact in cases:
        setup = prepare(bound, backend, "float64", 0)
        theta = rng.normal(size=setup.layout.dim) * 0.7
        full = curvature(setup, theta, "full", "ggn")
        diag = curvature(setup, theta, "diag", "ggn", batch_size=7)
        np.testing.assert_allclose(diag, np.diag(full), rtol=1e-9, atol=1e-12)
        found = layer_pieces(setup, theta, set(setup.layout.names), 7, "diag")
        assert found.diagonal == exact
        cached = len(bound.model.compiled)
        curvature(setup, theta, "diag", "ggn", batch_size=7)
        assert len(bound.model.compiled) == cached  # the second call compiles nothing new
    last = np.arange(setup.layout.dim)[-2:]  # fc.bias of the sequence model alone
    np.testing.assert_allclose(
        curvature(setup, theta, "diag", "ggn", last), np.diag(full)[last], rtol=1e-9
    )


def test_marglik_prior_scale_matches_the_assembled_precision():
    rng = np.random.default_rng(6)
    shapes = {
        "net.0.weight": (2, 4),
        "net.0.bias": (4,),
        "net.1.weight": (4, 3),
        "net.1.bias": (3,),
    }
    start = {name: rng.normal(size=shape) for name, shape in shapes.items()}
    options = {"hessian": "kron", "num_steps": 0, "init": start, "num_samples": 4}
    plain = _fit(classifier(X, LABELS), **options).guide
    tuned = _fit(classifier(X, LABELS), prior_precision="marglik", **options).guide
    setup = prepare(classifier(X, LABELS), "numpyro", "float64", 0)
    matrix, scale = rescale_prior(setup, plain.mode, plain.precision_matrix(), "full", plain.index)
    assert tuned.settings["prior_precision_scale"] == pytest.approx(scale, rel=1e-5)
    np.testing.assert_allclose(tuned.precision_matrix(), matrix, rtol=1e-5)


def test_log_det_and_draws_match_the_assembled_precision(mlp_fit):
    approx = mlp_fit.guide
    precision = approx.precision_matrix()
    assert approx.log_det_precision() == pytest.approx(np.linalg.slogdet(precision)[1], 1e-10)
    cov = np.linalg.inv(precision)
    draws = approx.sample(20000, seed=3) - approx.mode
    n = len(draws)
    se = np.sqrt((np.outer(np.diag(cov), np.diag(cov)) + cov**2) / n)
    assert np.all(np.abs(np.cov(draws.T) - cov) < 5 * se)
    assert np.all(np.abs(draws.mean(0)) < 5 * np.sqrt(np.diag(cov) / n))


def test_other_sites_keep_their_own_block_and_the_glm_predictive_runs():
    kron = _fit(noisy(XL, YL), num_steps=300, lr=0.05, hessian="kron")
    approx = kron.guide
    setup = prepare(noisy(XL, YL), "numpyro", "float64", 0)
    layout = setup.layout
    noise = {s.name: s for s in layout.slots}["noise"].offset
    assert approx.rest_structure == "full" and approx.rest_index.tolist() == [noise]
    # the noise's own curvature equals the full GGN's; its cross terms with the layer are dropped
    full = curvature(setup, approx.mode, "full", "ggn")
    np.testing.assert_allclose(approx.precision, full[[noise]][:, [noise]], rtol=1e-10)
    pred = kron.predict(noisy(XL[:4]), pred_type="glm")
    assert pred.sd.shape == (4,) and np.all(np.isfinite(pred.sd))


@pytest.mark.slow
def test_a_784_100_10_network_without_a_dense_matrix():
    data = np.random.default_rng(0)
    images, labels = data.normal(size=(64, 784)), data.integers(0, 10, 64)

    @bdl.model
    def mnist(X, y=None):
        logits = nn.MLP("net", [784, 100, 10], activation="relu", prior=1.0).sample()
        with bdl.plate("data", X.shape[0]) as idx:
            bdl.sample("y", dist.Categorical(logits=logits(X[idx])), obs=y[idx])

    tracemalloc.start()
    post = _fit(mnist(images, labels), hessian="kron", num_steps=2, num_samples=4, batch_size=32)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    approx = post.guide
    assert sum(b.coords.size for b in approx.blocks) == len(approx.mode) == 79510
    assert np.isfinite(approx.log_det_precision())
    assert peak < 200e6  # the (d, d) matrix alone would be 50 GB


SIGMA = 0.5
IMAGES = np.random.default_rng(2).normal(size=(12, 1, 4, 4))
TARGETS = IMAGES.mean(axis=(1, 2, 3))


@bdl.model
def one_position(X, y=None):
    f = nn.Conv2d("conv", 1, 1, kernel_size=4, prior=1.0).sample()
    with bdl.plate("data", X.shape[0]) as idx:
        loc = f(X[idx])[:, 0, 0, 0]
        bdl.sample("y", dist.Normal(loc, SIGMA), obs=None if y is None else y[idx])


@bdl.model
def convnet(X, y=None):
    layers = [nn.Conv2d("conv", 1, 2, 3, stride=2, padding=1), nn.Flatten(), nn.Dense("fc", 8, 1)]
    f = nn.Sequential("cnn", layers, prior=1.0).sample()
    with bdl.plate("data", X.shape[0]) as idx:
        bdl.sample("y", dist.Normal(f(X[idx])[:, 0], SIGMA), obs=None if y is None else y[idx])


def test_conv_with_one_position_and_one_channel_is_the_exact_ggn():
    start = {"conv.weight": np.zeros((1, 1, 4, 4)), "conv.bias": np.zeros(1)}
    kron = _fit(one_position(IMAGES, TARGETS), hessian="kron", num_steps=0, init=start)
    full = _fit(one_position(IMAGES, TARGETS), num_steps=0, init=start)
    assert [b.coords.shape for b in kron.guide.blocks] == [(1, 17)]
    np.testing.assert_allclose(kron.guide.precision_matrix(), full.guide.precision, rtol=1e-10)


def test_conv_factors_are_kfc_by_hand():
    post = _fit(convnet(IMAGES, TARGETS), hessian="kron", num_steps=20, lr=0.05, num_samples=4)
    layout = prepare(convnet(IMAGES, TARGETS), "numpyro", "float64", 0).layout
    slots = {s.name: s for s in layout.slots}
    conv, fc = post.guide.blocks
    fc_weight = slots["cnn.fc.weight"]
    w = post.guide.mode[fc_weight.offset : fc_weight.offset + 8].reshape(2, 4)  # (channel, t)
    padded = np.pad(IMAGES, ((0, 0), (0, 0), (1, 1), (1, 1)))
    patches = [
        np.append(padded[n, 0, 2 * i : 2 * i + 3, 2 * j : 2 * j + 3].ravel(), 1.0)
        for n in range(len(IMAGES))
        for i in range(2)
        for j in range(2)
    ]
    a = sum(np.outer(p, p) for p in patches) / (4 * len(IMAGES))
    g = len(IMAGES) * w @ w.T / SIGMA**2  # ∂loc/∂s is fc's weight at every position
    got_g, got_a = conv.factors()
    np.testing.assert_allclose(got_a, a, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got_g, g, rtol=1e-9, atol=1e-12)
    weight, bias = slots["cnn.conv.weight"], slots["cnn.conv.bias"]
    np.testing.assert_array_equal(conv.coords[:, :9].ravel(), weight.offset + np.arange(18))
    np.testing.assert_array_equal(conv.coords[:, 9], bias.offset + np.arange(2))
    assert fc.coords.shape == (9, 1)


@pytest.mark.parametrize("backend", ["numpyro", "pyro"])
def test_a_network_that_outputs_its_noise_scale_is_refused(backend):
    """KFAC's factors see the likelihood's curvature in its outputs (the loc) only: a network
    that also outputs the scale would keep its prior's precision on the weights that move it
    (on UCI's boston the predictive then fell 0.6 nats below the MAP's)."""
    with pytest.raises(ConfigError, match=r"\{'y': \['scale'\]\}.*heteroscedastic head"):
        _fit(heteroscedastic(XL, YL), hessian="kron", num_steps=50, lr=0.05, backend=backend)


def test_unsupported_layers_and_curvatures_are_refused():
    @bdl.model
    def grouped(X, y=None):
        f = nn.Sequential("cnn", [nn.Conv2d("conv", 2, 2, 3, groups=2), nn.Flatten()]).sample()
        with bdl.plate("data", X.shape[0]) as idx:
            bdl.sample("y", dist.Categorical(logits=f(X[idx])), obs=y[idx])

    images = np.random.default_rng(0).normal(size=(6, 2, 3, 3))
    with pytest.raises(ConfigError, match="groups=1"):
        _fit(grouped(images, np.arange(6) % 2), hessian="kron", num_steps=1)
    with pytest.raises(ConfigError, match="curvature='ggn'"):
        bdl.Laplace(hessian="kron", curvature="hessian")
