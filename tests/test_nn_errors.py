"""Clear errors from ppl_bdl.dsl.nn: a shape mismatch names the layer, the shape seen and the shape
expected; bad settings are refused when the layer is built."""

from __future__ import annotations

import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import dist, nn
from ppl_bdl.errors import ModelError


def apply_on(backend: str, net: nn.Module, x_shape: tuple, values: dict | None = None):
    be = bdl.backends.get(backend)
    if values is None:
        values = {k: np.zeros(s) for k, s in net.sites().items()}
    with be.activate():
        return net.apply(
            {k: be.asarray(v) for k, v in values.items()}, be.asarray(np.zeros(x_shape))
        )


def cnn() -> nn.Sequential:
    return nn.Sequential(
        "cnn",
        [
            nn.Conv2d("conv", 1, 6, kernel_size=3, padding=1),
            "relu",
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Dense("fc", 96, 3),
        ],
    )


def test_wrong_channels_name_the_layer_and_both_shapes(backend):
    with pytest.raises(ModelError) as info:
        apply_on(backend, cnn(), (8, 3, 8, 8))
    msg = str(info.value)
    assert "Conv2d 'cnn.conv'" in msg and "(8, 3, 8, 8)" in msg and "1 channels" in msg


def test_channels_last_images_get_a_hint(backend):
    with pytest.raises(ModelError, match="transpose channels-last data"):
        apply_on(backend, cnn(), (8, 8, 8, 1))
    with pytest.raises(ModelError, match=r"expects NCHW input .* got shape \(8, 64\)"):
        apply_on(backend, cnn(), (8, 64))


def test_a_dense_layer_after_flatten_says_what_it_got(backend):
    with pytest.raises(ModelError) as info:
        apply_on(backend, cnn(), (4, 1, 10, 10))  # 6 * 5 * 5 = 150 features, not 96
    msg = str(info.value)
    assert "Dense 'cnn.fc'" in msg and "96 features" in msg and "(4, 150)" in msg
    assert "in_features=150" in msg


def test_the_error_reaches_the_user_from_fit():
    net = cnn()

    @bdl.model
    def model(X, y=None):
        f = net.sample()
        with bdl.plate("data", X.shape[0]) as idx:
            bdl.sample("y", dist.Categorical(logits=f(X[idx])), obs=None if y is None else y[idx])

    X, y = np.zeros((6, 1, 10, 10)), np.zeros(6, dtype=int)
    with pytest.raises(ModelError, match=r"Dense 'cnn.fc' .* got shape \(6, 150\)"):
        bdl.fit(model(X, y), backend="pyro", method="vi", num_steps=2, progress=False)


def test_weights_of_the_wrong_shape_name_the_site(backend):
    net = cnn()
    values = {k: np.zeros(s) for k, s in net.sites().items()}
    values["cnn.conv.weight"] = np.zeros((6, 1, 5, 5))
    with pytest.raises(ModelError) as info:
        apply_on(backend, net, (2, 1, 8, 8), values)
    msg = str(info.value)
    assert "'cnn.conv.weight' has shape (6, 1, 5, 5)" in msg and "expects (6, 1, 3, 3)" in msg
    del values["cnn.fc.bias"]
    with pytest.raises(ModelError, match=r"no value for the site\(s\) \['cnn.fc.bias'\]"):
        apply_on(backend, net, (2, 1, 8, 8), values)


def test_other_layers_report_shape_mismatches(backend):
    with pytest.raises(ModelError, match=r"MaxPool2d 'net\[0\]'.*too small on axis 2"):
        apply_on(backend, nn.Sequential("net", [nn.MaxPool2d(4)]), (1, 1, 2, 8))
    with pytest.raises(ModelError, match=r"LayerNorm 'ln' normalises the trailing axes \(4,\)"):
        apply_on(backend, nn.LayerNorm("ln", 4), (2, 5))
    with pytest.raises(ModelError, match="start_dim=3 is out of range"):
        apply_on(backend, nn.Flatten(start_dim=3), (2, 5))
    block = nn.Residual("block", [nn.Conv2d("conv", 2, 4, 3, stride=2, padding=1)])
    with pytest.raises(ModelError) as info:
        apply_on(backend, block, (1, 2, 6, 6))
    msg = str(info.value)
    assert "Residual 'block'" in msg and "(1, 4, 3, 3)" in msg and "(1, 2, 6, 6)" in msg
    assert "shortcut" in msg


@pytest.mark.parametrize(
    "build, fragment",
    [
        (lambda: nn.Conv2d("c", 1, 2, kernel_size=0), "kernel_size must be an int >= 1"),
        (lambda: nn.Conv2d("c", 1, 2, kernel_size=(3,)), "kernel_size must be an int >= 1"),
        (lambda: nn.Conv2d("c", 1, 2, 3, stride=-1), "stride must be an int >= 1"),
        (lambda: nn.Conv2d("c", 3, 4, 3, groups=2), "divisible by groups"),
        (
            lambda: nn.Conv2d("c", 1, 2, 3, stride=2, padding="same"),
            "padding='same' needs stride 1",
        ),
        (lambda: nn.Conv2d("c", 1, 2, 3, padding="full"), "padding must be"),
        (lambda: nn.Conv2d("c", 1, 2, 3, padding=-1), "padding must be an int >= 0"),
        (lambda: nn.Conv2d("", 1, 2, 3), "name must be a non-empty string"),
        (lambda: nn.Dense("fc", 0, 2), "in_features must be a positive int"),
        (lambda: nn.Dense("fc", 2, 2.5), "out_features must be a positive int"),
        (lambda: nn.MaxPool2d(2, stride=0), "stride must be an int >= 1"),
        (lambda: nn.Flatten(start_dim="1"), "start_dim must be an int"),
        (lambda: nn.LayerNorm("ln", 4, affine="learned"), "affine must be one of"),
        (lambda: nn.LayerNorm("ln", (4, 0)), "normalized_shape must be"),
        (lambda: nn.LayerNorm("ln", 4, eps=0.0), "eps must be a positive number"),
        (lambda: nn.MLP("net", [3]), "sizes needs at least"),
        (lambda: nn.MLP("net", [3, 2], activation="relux"), "unknown activation 'relux'"),
        (lambda: nn.Sequential("s", ["relux"]), "unknown activation 'relux'"),
        (lambda: nn.Sequential("s", [3]), "expected a layer"),
        (lambda: nn.Sequential("s", nn.Dense("fc", 2, 2)), "must be a list of layers"),
        (
            lambda: nn.Sequential("s", [nn.Dense("fc", 2, 2), nn.Dense("fc", 2, 2)]),
            "two layers are named 'fc'",
        ),
        (
            lambda: nn.Residual("r", [nn.Dense("fc", 2, 2)], shortcut=nn.Dense("fc", 2, 2)),
            "two layers are named 'fc'",
        ),
        (lambda: nn.Residual("r", [], shortcut="relu"), "shortcut must be a layer"),
    ],
)
def test_bad_settings_are_refused_when_the_layer_is_built(build, fragment):
    with pytest.raises(ModelError, match=fragment):
        build()
