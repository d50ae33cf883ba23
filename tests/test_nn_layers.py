"""ppl_bdl.dsl.nn layers: the same outputs on both backends, equal to torch's own layers, for the same
weights; site names and shapes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import ppl_bdl as bdl
from ppl_bdl import dist, nn
from ppl_bdl.models import vision

BACKENDS = bdl.backends.available()


def run(net: nn.Module, values: dict, x: np.ndarray, backend: str, precision: str = "float64"):
    """``net.apply(values, x)`` on ``backend``, as NumPy."""
    be = bdl.backends.get(backend, precision)
    with be.activate(), be.scope():
        out = net.apply({k: be.asarray(v) for k, v in values.items()}, be.asarray(x))
        return np.asarray(be.to_numpy(out), dtype=float)


def draw_weights(net: nn.Module, seed: int = 0) -> dict[str, np.ndarray]:
    """Weights drawn from the sites' Normal priors, in NumPy."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in net.sites().items():
        prior = net.priors()[name]
        loc, scale = prior.params.get("loc", 0.0), prior.params.get("scale", 1.0)
        out[name] = loc + scale * rng.normal(size=shape)
    return out


def t(a):
    return torch.as_tensor(np.asarray(a), dtype=torch.float64)


# Each case: a network, an input shape, and torch's own computation of the same thing.
CASES = {
    "dense": (
        lambda: nn.Dense("fc", 5, 3),
        (4, 5),
        lambda v, x: x @ v["fc.weight"] + v["fc.bias"],
    ),
    "conv": (
        lambda: nn.Conv2d("c", 3, 4, kernel_size=3, padding=1),
        (2, 3, 7, 7),
        lambda v, x: F.conv2d(x, v["c.weight"], v["c.bias"], padding=1),
    ),
    "conv_stride_groups_dilation": (
        lambda: nn.Conv2d(
            "c", 4, 6, kernel_size=(3, 2), stride=2, padding=(1, 2), groups=2, dilation=(1, 2)
        ),
        (2, 4, 9, 8),
        lambda v, x: F.conv2d(
            x, v["c.weight"], v["c.bias"], stride=2, padding=(1, 2), groups=2, dilation=(1, 2)
        ),
    ),
    "conv_same_even_kernel": (
        lambda: nn.Conv2d("c", 2, 3, kernel_size=4, padding="same", bias=False),
        (2, 2, 6, 5),
        lambda v, x: F.conv2d(x, v["c.weight"], padding="same"),
    ),
    "conv_asymmetric_padding": (
        lambda: nn.Conv2d("c", 2, 3, kernel_size=3, padding=((0, 1), (2, 0))),
        (1, 2, 5, 5),
        lambda v, x: F.conv2d(F.pad(x, (2, 0, 0, 1)), v["c.weight"], v["c.bias"]),
    ),
    "max_pool": (lambda: nn.MaxPool2d(2), (2, 3, 6, 7), lambda v, x: F.max_pool2d(x, 2)),
    "max_pool_stride_padding": (
        lambda: nn.MaxPool2d(3, stride=2, padding=1),
        (2, 3, 7, 6),
        lambda v, x: F.max_pool2d(x, 3, 2, 1),
    ),
    "avg_pool": (lambda: nn.AvgPool2d(2), (2, 3, 6, 6), lambda v, x: F.avg_pool2d(x, 2)),
    "avg_pool_stride_padding": (
        lambda: nn.AvgPool2d(3, stride=1, padding=1),
        (2, 3, 5, 5),
        lambda v, x: F.avg_pool2d(x, 3, 1, 1),
    ),
    "global_avg_pool": (lambda: nn.GlobalAvgPool2d(), (2, 3, 4, 5), lambda v, x: x.mean((2, 3))),
    "flatten": (lambda: nn.Flatten(), (2, 3, 4, 5), lambda v, x: x.flatten(1)),
    "layer_norm_bayesian": (
        lambda: nn.LayerNorm("ln", (3, 4, 4)),
        (2, 3, 4, 4),
        lambda v, x: F.layer_norm(x, (3, 4, 4), v["ln.weight"], v["ln.bias"], eps=1e-5),
    ),
    "layer_norm_fixed": (
        lambda: nn.LayerNorm("ln", 6, affine="fixed", eps=1e-3),
        (5, 6),
        lambda v, x: F.layer_norm(x, (6,), eps=1e-3),
    ),
    "residual_identity": (
        lambda: nn.Residual("r", [nn.Conv2d("c", 3, 3, 3, padding=1)], activation="relu"),
        (2, 3, 5, 5),
        lambda v, x: F.relu(F.conv2d(x, v["r.c.weight"], v["r.c.bias"], padding=1) + x),
    ),
    "residual_shortcut": (
        lambda: nn.Residual(
            "r",
            [
                nn.Conv2d("c1", 2, 4, 3, stride=2, padding=1),
                "relu",
                nn.Conv2d("c2", 4, 4, 3, padding=1),
            ],
            shortcut=nn.Conv2d("s", 2, 4, 1, stride=2),
        ),
        (2, 2, 6, 6),
        lambda v, x: (
            F.conv2d(
                F.relu(F.conv2d(x, v["r.c1.weight"], v["r.c1.bias"], stride=2, padding=1)),
                v["r.c2.weight"],
                v["r.c2.bias"],
                padding=1,
            )
            + F.conv2d(x, v["r.s.weight"], v["r.s.bias"], stride=2)
        ),
    ),
    "sequential_cnn": (
        lambda: nn.Sequential(
            "cnn",
            [
                nn.Conv2d("conv", 1, 6, kernel_size=3, padding=1),
                "relu",
                nn.MaxPool2d(2),
                nn.Flatten(),
                nn.Dense("fc", 96, 3),
            ],
        ),
        (3, 1, 8, 8),
        lambda v, x: (
            F.max_pool2d(
                F.relu(F.conv2d(x, v["cnn.conv.weight"], v["cnn.conv.bias"], padding=1)), 2
            ).flatten(1)
            @ v["cnn.fc.weight"]
            + v["cnn.fc.bias"]
        ),
    ),
    "mlp": (
        lambda: nn.MLP("net", [4, 6, 2], activation="tanh"),
        (5, 4),
        lambda v, x: (
            torch.tanh(x @ v["net.0.weight"] + v["net.0.bias"]) @ v["net.1.weight"]
            + v["net.1.bias"]
        ),
    ),
}
ACTIVATION_REFERENCE = {
    "relu": F.relu,
    "tanh": torch.tanh,
    "gelu": F.gelu,
    "sigmoid": torch.sigmoid,
    "softplus": F.softplus,
    "elu": F.elu,
    "silu": F.silu,
    "identity": lambda x: x,
}


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")
@pytest.mark.parametrize("case", sorted(CASES))
def test_layer_equals_torch_on_both_backends(case):
    build, shape, reference = CASES[case]
    net = build()
    values = draw_weights(net)
    x = np.random.default_rng(1).normal(size=shape)
    expected = reference({k: t(v) for k, v in values.items()}, t(x)).numpy()
    for backend in BACKENDS:
        got = run(net, values, x, backend)
        assert got.shape == expected.shape, (backend, got.shape, expected.shape)
        np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-10, err_msg=backend)


@pytest.mark.parametrize("name", sorted(nn.ACTIVATIONS))
def test_activation_layers_equal_torch(name):
    net = nn.Sequential("s", [name])
    x = np.linspace(-3.0, 3.0, 13).reshape(1, 13)
    expected = ACTIVATION_REFERENCE[name](t(x)).numpy()
    for backend in BACKENDS:
        np.testing.assert_allclose(run(net, {}, x, backend), expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    "build, shape",
    [
        (lambda: vision.lenet5(image_size=16, num_classes=4), (3, 1, 16, 16)),
        (lambda: vision.resnet20(num_classes=4), (2, 3, 8, 8)),
        (lambda: vision.resnet20(num_classes=4, norm="layer", image_size=8), (2, 3, 8, 8)),
        (lambda: vision.mlp(in_features=36, hidden=(8, 8), num_classes=4), (3, 1, 6, 6)),
    ],
    ids=["lenet5", "resnet20", "resnet20_layernorm", "mlp"],
)
def test_shipped_networks_same_outputs_on_both_backends_float32(build, shape):
    assert BACKENDS == ["numpyro", "pyro"]
    net = build()
    values = draw_weights(net, seed=2)
    x = np.random.default_rng(3).normal(size=shape)
    outs = [run(net, values, x, b, precision="float32") for b in BACKENDS]
    assert outs[0].shape == (shape[0], 4)
    scale = np.abs(outs[1]).max()
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-4, atol=1e-5 * scale)
    assert 0.05 < scale < 1e3  # the He/Fixup priors keep the prior's logits moderate


def test_site_names_and_shapes_of_the_issue_example():
    net = nn.Sequential(
        "cnn",
        [
            nn.Conv2d("conv", 1, 6, kernel_size=3, padding=1),
            "relu",
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Dense("fc", 96, 3),
        ],
        prior=dist.Normal(0.0, 1.0),
    )
    assert net.sites() == {
        "cnn.conv.weight": (6, 1, 3, 3),
        "cnn.conv.bias": (6,),
        "cnn.fc.weight": (96, 3),
        "cnn.fc.bias": (3,),
    }
    assert net.num_weights() == 54 + 6 + 288 + 3


def test_shipped_network_sizes_and_names():
    resnet = vision.resnet20()
    assert 0.26e6 < resnet.num_weights() < 0.28e6
    sites = resnet.sites()
    assert sites["resnet20.conv.weight"] == (16, 3, 3, 3)
    assert sites["resnet20.stage2.block1.conv1.weight"] == (32, 16, 3, 3)
    assert sites["resnet20.stage2.block1.shortcut.weight"] == (32, 16, 1, 1)
    assert "resnet20.stage2.block2.shortcut.weight" not in sites
    assert sites["resnet20.stage3.block3.conv2.weight"] == (64, 64, 3, 3)
    assert sites["resnet20.fc.weight"] == (64, 10)
    assert (
        sum(name.endswith("weight") and len(s) == 4 and s[-1] == 3 for name, s in sites.items())
        == 19
    )
    assert vision.lenet5().num_weights() == 61706
    assert vision.mlp().sites()["mlp.fc1.weight"] == (784, 400)
    assert vision.mlp().num_weights() == 784 * 400 + 400 + 400 * 400 + 400 + 400 * 10 + 10


def test_mlp_and_dense_keep_their_names_shapes_and_arguments():
    net = nn.MLP("net", [8, 50, 1], activation="tanh", prior_scale=0.5)
    assert list(net.sites().items()) == [
        ("net.0.weight", (8, 50)),
        ("net.0.bias", (50,)),
        ("net.1.weight", (50, 1)),
        ("net.1.bias", (1,)),
    ]
    assert net.priors()["net.1.bias"].params == {"loc": 0.0, "scale": 0.5}
    assert nn.Dense("fc", 2, 3, bias=False).sites() == {"fc.weight": (2, 3)}
