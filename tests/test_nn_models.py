"""The shipped image models (LeNet-5, ResNet-20, the 784-400-400-10 MLP) fit on small synthetic
images on both backends; the synthetic images have the classes they claim."""

from __future__ import annotations

import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl.errors import DataError
from ppl_bdl.models import images, vision

# NumPyro's first fit of a deep network compiles every op of its eager model runs once per weight
# shape (~200 XLA compiles for ResNet-20): those fits are slow-marked, the rest run by default.
# On NumPyro the layers' forward pass is checked against Pyro's by the nn tests; every model fits on
# both backends with -m slow.
SLOW = {
    ("lenet5", "numpyro", "vi"),
    ("lenet5", "numpyro", "sgld"),
    ("resnet20", "numpyro", "vi"),
    ("resnet20", "numpyro", "sgld"),
    ("mlp", "numpyro", "vi"),
    ("mlp", "numpyro", "sgld"),
}
MODELS = {
    # name: (network, channels, image size, classes)
    "lenet5": (lambda: vision.lenet5(image_size=12, num_classes=3), 1, 12, 3),
    "resnet20": (lambda: vision.resnet20(num_classes=3), 3, 8, 3),
    "mlp": (lambda: vision.mlp(), 1, 28, 10),
}
METHODS = {
    "vi": {"method": "vi", "num_steps": 3, "batch_size": 8, "num_samples": 2},
    "sgld": {
        "method": "sgld",
        "step_size": 1e-6,
        "num_warmup": 2,
        "num_samples": 2,
        "num_chains": 1,
        "batch_size": 8,
        "init": "prior",
    },
}
CASES = [
    pytest.param(m, b, k, marks=[pytest.mark.slow] if (m, b, k) in SLOW else [])
    for m in MODELS
    for b in ("pyro", "numpyro")
    for k in METHODS
]


@pytest.mark.filterwarnings("ignore:could not trace")  # torch's tracer refuses conv backward
@pytest.mark.parametrize("name, backend, method", CASES)
def test_shipped_image_model_fits_a_few_steps(name, backend, method):
    build, channels, size, classes = MODELS[name]
    net = build()
    X, y = images.make_synthetic_images(n=24, num_classes=classes, channels=channels, size=size)
    model = vision.make_classifier(net)
    post = bdl.fit(model(X, y), backend=backend, progress=False, **METHODS[method])
    assert set(post.samples) == set(net.sites())
    for site, shape in net.sites().items():
        draws = np.asarray(post.samples[site])
        assert draws.shape == (1, 2, *shape), site
        assert np.all(np.isfinite(draws)), site
    if method == "vi":  # the posterior predicts: class probabilities per image
        pred = post.predict(model(X[:4]), num_samples=2)
        assert pred.probs.shape == (4, classes)
        np.testing.assert_allclose(pred.probs.sum(-1), 1.0, rtol=1e-5)


@pytest.mark.filterwarnings("ignore:could not trace")
@pytest.mark.parametrize("backend", ["pyro", pytest.param("numpyro", marks=pytest.mark.slow)])
def test_lenet_learns_the_synthetic_classes_with_sgld(backend):
    # 4 classes (chance 25%); a few hundred SGLD steps from a prior draw reach ~96% held out.
    X, y = images.make_synthetic_images(n=300, num_classes=4, size=12, seed=0)
    X_test, y_test = images.make_synthetic_images(n=200, num_classes=4, size=12, seed=1)
    model = vision.make_lenet5_classifier(image_size=12, num_classes=4)
    post = bdl.fit(
        model(X, y),
        backend=backend,
        method="sgld",
        step_size=1e-3,
        num_warmup=300,
        num_samples=20,
        thinning=5,
        num_chains=1,
        batch_size=50,
        init="prior",
        progress=False,
    )
    pred = post.predict(model(X_test))
    assert np.mean(pred.probs.argmax(-1) == y_test) > 0.8


def test_resnet_options():
    assert vision.resnet20(blocks_per_stage=1).num_weights() < vision.resnet20().num_weights()
    with_norm = vision.resnet20(norm="layer", image_size=32).sites()
    assert "resnet20.conv.bias" not in with_norm  # a bias before a normalisation is redundant
    assert "resnet20.stage1.block1.conv1_norm.weight" not in with_norm  # fixed affine: no sites
    with pytest.raises(bdl.ModelError, match="needs image_size"):
        vision.resnet20(norm="layer")
    with pytest.raises(bdl.ModelError, match="norm must be one of"):
        vision.resnet20(norm="batch")
    with pytest.raises(bdl.ModelError, match="image_size must be an int >= 12"):
        vision.lenet5(image_size=8)
    with pytest.raises(bdl.ModelError, match="expects a ppl_bdl.dsl.nn network"):
        vision.make_classifier(lambda x: x)


def test_synthetic_images_have_their_classes():
    X, y = images.make_synthetic_images(n=300, num_classes=4, channels=3, size=12, seed=0)
    X_test, y_test = images.make_synthetic_images(n=200, num_classes=4, channels=3, size=12, seed=1)
    assert X.shape == (300, 3, 12, 12) and X.dtype == np.float32 and y.dtype == np.int64
    assert np.bincount(y).tolist() == [75, 75, 75, 75]
    # the class means tell the classes apart on new images (nearest class mean)
    means = np.stack([X[y == k].mean(0) for k in range(4)])
    nearest = ((X_test[:, None] - means[None]) ** 2).sum((2, 3, 4)).argmin(1)
    assert np.mean(nearest == y_test) > 0.85
    again, _ = images.make_synthetic_images(n=300, num_classes=4, channels=3, size=12, seed=0)
    np.testing.assert_array_equal(X, again)
    with pytest.raises(DataError, match="num_classes must be an int >= 2"):
        images.make_synthetic_images(num_classes=1)
    with pytest.raises(DataError, match="noise must be a number >= 0"):
        images.make_synthetic_images(noise=-1.0)


def test_stroke_images_shapes_balance_label_noise_and_errors():
    X, y = images.make_stroke_images(n=2000, num_classes=10, channels=3, size=16, seed=0)
    assert X.shape == (2000, 3, 16, 16) and X.dtype == np.float32 and y.dtype == np.int64
    assert np.all(np.isfinite(X)) and set(np.unique(y)) == set(range(10))
    # uniform labels: each class's count is Binomial(2000, 0.1), 200 +- 13.4; 4 sd either side
    assert np.all(np.abs(np.bincount(y, minlength=10) - 200) < 54)
    again, y_again = images.make_stroke_images(n=2000, num_classes=10, channels=3, size=16, seed=0)
    np.testing.assert_array_equal(X, again)
    np.testing.assert_array_equal(y, y_again)
    # the same seed without label noise draws the same images and true classes: a fraction
    # label_noise * (K - 1) / K = 0.09 of the labels differ (sd 0.0064 at n = 2000)
    _, clean = images.make_stroke_images(n=2000, channels=3, size=16, label_noise=0.0, seed=0)
    assert abs(np.mean(clean != y) - 0.09) < 0.026
    with pytest.raises(DataError, match="label_noise must be a number in"):
        images.make_stroke_images(label_noise=1.5)
    with pytest.raises(DataError, match="make_stroke_images: size must be an int >= 8"):
        images.make_stroke_images(size=4)
