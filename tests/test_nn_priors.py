"""Priors of ppl_bdl.dsl.nn layers: a scale, a fan function (He, Glorot), any distribution; inherited
from containers; and the draws of a model's weight sites follow them."""

from __future__ import annotations

import math

import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import dist, nn
from ppl_bdl.errors import ModelError


def normal(d) -> tuple[float, float]:
    assert isinstance(d, dist.Normal), d
    return float(d.params["loc"]), float(d.params["scale"])


def prior_draws(net: nn.Module, backend: str, num_samples: int = 1) -> dict[str, np.ndarray]:
    @bdl.model
    def weights_only():
        net.sample()

    return bdl.prior_predictive(weights_only(), backend=backend, num_samples=num_samples).draws


def test_a_scale_means_a_centred_normal_and_the_default_is_standard():
    assert normal(nn.Dense("fc", 3, 2, prior=0.5).priors()["fc.weight"]) == (0.0, 0.5)
    assert normal(nn.Dense("fc", 3, 2).priors()["fc.bias"]) == (0.0, 1.0)
    assert normal(nn.Conv2d("c", 3, 2, 3).priors()["c.weight"]) == (0.0, 1.0)


def test_he_and_glorot_scale_with_the_fans_and_biases_take_the_weights_scale():
    dense = nn.Dense("fc", 50, 10, prior=nn.he_normal()).priors()
    assert normal(dense["fc.weight"]) == pytest.approx((0.0, math.sqrt(2 / 50)))
    assert normal(dense["fc.bias"]) == pytest.approx((0.0, math.sqrt(2 / 50)))
    conv = nn.Conv2d("c", 8, 6, kernel_size=(3, 5), groups=2, prior=nn.glorot_normal(2.0))
    fan_in, fan_out = 4 * 3 * 5, 6 * 3 * 5  # torch's fans of a (6, 4, 3, 5) kernel
    expected = 2.0 * math.sqrt(2 / (fan_in + fan_out))
    assert normal(conv.priors()["c.weight"])[1] == pytest.approx(expected)
    lecun = nn.Conv2d("c", 3, 4, 3, prior=nn.he_normal(gain=1.0)).priors()["c.weight"]
    assert normal(lecun)[1] == pytest.approx(1 / math.sqrt(27))


def test_any_distribution_and_any_fan_function_are_accepted():
    laplace = dist.Laplace(0.0, 0.1)
    layer = nn.Dense("fc", 4, 3, prior=laplace, bias_prior=dist.Normal(0.0, 5.0))
    assert layer.priors()["fc.weight"] is laplace
    assert normal(layer.priors()["fc.bias"]) == (0.0, 5.0)
    seen = []

    def student(fan_in, fan_out):
        seen.append((fan_in, fan_out))
        return dist.StudentT(3.0, 0.0, 1.0 / fan_in)

    prior = nn.Conv2d("c", 2, 5, 3, prior=student).priors()["c.weight"]
    assert isinstance(prior, dist.StudentT) and prior.params["scale"] == pytest.approx(1 / 18)
    assert seen[0] == (18, 45)


def test_containers_pass_their_prior_to_layers_without_one():
    net = nn.Sequential(
        "net",
        [
            nn.Dense("a", 4, 4),
            nn.Dense("b", 4, 4, prior=0.1),
            nn.Residual("r", [nn.Dense("c", 4, 4)]),
            nn.Sequential("inner", [nn.Dense("d", 4, 4)], prior=2.0),
            nn.LayerNorm("ln", 4),
        ],
        prior=0.3,
    )
    scales = {k: normal(v) for k, v in net.priors().items()}
    assert scales["net.a.weight"] == (0.0, 0.3)
    assert scales["net.b.weight"] == (0.0, 0.1)
    assert scales["net.r.c.weight"] == (0.0, 0.3)
    assert scales["net.inner.d.bias"] == (0.0, 2.0)
    # a layer norm's gain is centred on 1 and does not take the container's zero-mean prior
    assert scales["net.ln.weight"] == (1.0, 1.0)
    assert scales["net.ln.bias"] == (0.0, 1.0)


def test_layer_norm_priors():
    ln = nn.LayerNorm("ln", 8, prior=0.1).priors()
    assert normal(ln["ln.weight"]) == (1.0, 0.1) and normal(ln["ln.bias"]) == (0.0, 0.1)
    custom = nn.LayerNorm("ln", 8, prior=dist.LogNormal(0.0, 0.1), bias_prior=0.5).priors()
    assert isinstance(custom["ln.weight"], dist.LogNormal)
    assert normal(custom["ln.bias"]) == (0.0, 0.5)


def test_drawn_weights_follow_the_he_prior(backend):
    # 64·64·9 = 36864 draws of N(0, 2/576): the sample sd is within 2% (5 standard errors, the
    # standard error of a sample sd being sd / sqrt(2n) = 0.37%)
    net = nn.Conv2d("c", 64, 64, 3, prior=nn.he_normal(), bias_prior=dist.Laplace(0.0, 0.1))
    draws = prior_draws(net, backend)
    w = draws["c.weight"]
    assert w.shape == (1, 64, 64, 3, 3)
    assert np.std(w) == pytest.approx(math.sqrt(2 / 576), rel=0.02)
    assert abs(np.mean(w)) < 5 * math.sqrt(2 / 576) / math.sqrt(w.size)


def test_drawn_weights_follow_a_laplace_prior(backend):
    # E|w| = b for Laplace(0, b); sd of |w| is b, so 5 standard errors over 36864 draws is 2.6%
    net = nn.Dense("fc", 192, 192, prior=dist.Laplace(0.0, 0.1), bias=False)
    w = prior_draws(net, backend)["fc.weight"]
    assert np.mean(np.abs(w)) == pytest.approx(0.1, rel=0.026)


@pytest.mark.parametrize(
    "prior, fragment",
    [
        (-1.0, "positive finite"),
        (0, "positive finite"),
        (float("nan"), "positive finite"),
        ("wide", "prior must be"),
        (True, "prior must be"),
        (dist.Normal, "prior must be"),
    ],
)
def test_bad_priors_are_refused_naming_the_layer(prior, fragment):
    with pytest.raises(ModelError, match=fragment) as info:
        nn.Conv2d("conv1", 1, 2, 3, prior=prior)
    assert "Conv2d('conv1')" in str(info.value)


def test_a_fan_function_must_return_a_distribution():
    layer = nn.Dense("fc", 2, 2, prior=lambda fan_in, fan_out: 0.1)
    with pytest.raises(ModelError, match="must return a ppl_bdl.dsl.dist distribution"):
        layer.priors()


def test_prior_and_prior_scale_together_and_bad_gains():
    with pytest.raises(ModelError, match="not both"):
        nn.Dense("fc", 2, 2, prior=1.0, prior_scale=1.0)
    with pytest.raises(ModelError, match="not both"):
        nn.MLP("net", [2, 2], prior=1.0, prior_scale=1.0)
    with pytest.raises(ModelError, match="gain must be a positive number"):
        nn.he_normal(gain=0.0)
