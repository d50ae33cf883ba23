"""nn.lift: a torch module on Pyro, an equinox module on NumPyro, each on its own backend."""

from __future__ import annotations

import math

import equinox as eqx
import jax
import numpy as np
import pytest
import torch

import ppl_bdl as bdl
from ppl_bdl import dist, nn
from ppl_bdl.errors import ModelError
from ppl_bdl.models.bnn import make_blobs

PYRO, NUMPYRO = bdl.backends.get("pyro"), bdl.backends.get("numpyro")


def torch_net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


def eqx_net() -> eqx.Module:
    return eqx.nn.MLP(
        2, 3, width_size=16, depth=1, activation=jax.nn.relu, key=jax.random.PRNGKey(0)
    )


def classifier(lifted: nn.Module) -> bdl.Model:
    @bdl.model
    def model(X, y=None):
        f = lifted.sample()
        with bdl.plate("data", X.shape[0]) as idx:
            bdl.sample("y", dist.Categorical(logits=f(X[idx])), obs=None if y is None else y[idx])

    return model


def apply_on(backend, lifted: nn.Module, values: dict, x: np.ndarray) -> np.ndarray:
    with backend.activate():
        out = lifted.apply({k: backend.asarray(v) for k, v in values.items()}, backend.asarray(x))
        return np.asarray(backend.to_numpy(out))


# -- torch on Pyro -------------------------------------------------------------------------------
def test_torch_parameters_become_sites_named_by_path_with_fan_priors():
    lifted = nn.lift(torch_net(), prior=nn.he_normal(), priors={"*.bias": 0.1}, name="net")
    assert lifted.sites(PYRO) == {
        "net.0.weight": (16, 2),
        "net.0.bias": (16,),
        "net.2.weight": (3, 16),
        "net.2.bias": (3,),
    }
    priors = lifted.priors(PYRO)
    assert priors["net.0.weight"].params["scale"] == pytest.approx(math.sqrt(2 / 2))
    assert priors["net.2.weight"].params["scale"] == pytest.approx(math.sqrt(2 / 16))
    assert priors["net.2.bias"].params["scale"] == 0.1
    plain = nn.lift(torch_net(), prior=nn.he_normal())  # no name: the parameter paths alone
    assert plain.priors(PYRO)["2.bias"].params["scale"] == pytest.approx(math.sqrt(2 / 16))


def test_torch_forward_is_the_modules_own():
    module = torch_net()
    lifted = nn.lift(module, name="net")
    values = {f"net.{k}": p.detach().numpy() for k, p in module.named_parameters()}
    x = np.random.default_rng(0).normal(size=(5, 2)).astype(np.float32)
    expected = module(torch.as_tensor(x)).detach().numpy()
    np.testing.assert_allclose(apply_on(PYRO, lifted, values, x), expected, rtol=1e-6)


def test_only_the_selected_parameters_are_bayesian():
    module = torch_net()
    lifted = nn.lift(module, bayesian="2.*")
    assert lifted.sites(PYRO) == {"2.weight": (3, 16), "2.bias": (3,)}
    rng = np.random.default_rng(1)
    w, b = rng.normal(size=(3, 16)), rng.normal(size=3)
    x = rng.normal(size=(4, 2))
    hidden = np.maximum(
        x @ module[0].weight.detach().numpy().T + module[0].bias.detach().numpy(), 0
    )
    got = apply_on(PYRO, lifted, {"2.weight": w, "2.bias": b}, x)
    np.testing.assert_allclose(got, hidden @ w.T + b, rtol=1e-5, atol=1e-5)
    # a predicate and a list of patterns select the same way
    assert nn.lift(module, bayesian=lambda p: p.startswith("2.")).sites(PYRO) == lifted.sites(PYRO)
    assert list(nn.lift(module, bayesian=["0.bias", "2.*"]).sites(PYRO)) == [
        "0.bias",
        "2.weight",
        "2.bias",
    ]


def test_a_lifted_last_layer_posterior_predicts():
    X, y = make_blobs(n=150, num_classes=3, seed=0)
    X_test, y_test = make_blobs(n=90, num_classes=3, seed=1)
    model = classifier(nn.lift(torch_net(), prior=1.0, bayesian="2.*", name="net"))
    post = bdl.fit(
        model(X, y),
        backend="pyro",
        method="vi",
        num_steps=400,
        num_samples=50,
        lr=0.05,
        progress=False,
    )
    assert sorted(post.samples) == ["net.2.bias", "net.2.weight"]
    pred = post.predict(model(X_test))
    assert pred.probs.shape == (90, 3)
    # the blobs overlap a little: a linear read-out of 16 random ReLU features separates ~90%
    assert np.mean(pred.probs.argmax(-1) == y_test) > 0.8


def test_a_torch_module_on_numpyro_is_a_clear_error():
    X, y = make_blobs(n=10, num_classes=3, seed=0)
    model = classifier(nn.lift(torch_net()))
    with pytest.raises(ModelError) as info:
        bdl.fit(model(X, y), backend="numpyro", method="vi", num_steps=2, progress=False)
    msg = str(info.value)
    assert "torch.nn.Module (Sequential)" in msg and "'pyro' backend" in msg
    assert "runs on the 'numpyro' backend" in msg and "ppl_bdl.dsl.nn" in msg


def test_a_lifted_module_composes_with_ppl_bdl_layers():
    features = torch_net()[:2]
    net = nn.Sequential(
        "net", [nn.lift(features, prior=0.5, name="features"), nn.Dense("head", 16, 3)]
    )
    with PYRO.activate():
        sites = net.sites()
    assert list(sites) == [
        "net.features.0.weight",
        "net.features.0.bias",
        "net.head.weight",
        "net.head.bias",
    ]
    assert sites["net.features.0.weight"] == (16, 2)
    with pytest.raises(ModelError, match="has weights but no name"):
        nn.Sequential("net", [nn.lift(features), nn.Dense("head", 16, 3)])


def test_a_wrong_input_names_the_lifted_module_and_the_shape():
    lifted = nn.lift(torch_net(), name="net")
    values = {f"net.{k}": p.detach().numpy() for k, p in torch_net().named_parameters()}
    with pytest.raises(ModelError, match=r"lifted Sequential 'net' .* input of shape \(5, 4\)"):
        apply_on(PYRO, lifted, values, np.zeros((5, 4), dtype=np.float32))


def test_bad_selections_and_overrides():
    with pytest.raises(ModelError, match=r"'fc\.\*' in bayesian= matches none .*'0.weight'"):
        nn.lift(torch_net(), bayesian="fc.*").sites(PYRO)
    with pytest.raises(ModelError, match="selects none of the module's parameters"):
        nn.lift(torch_net(), bayesian=lambda p: False).sites(PYRO)
    with pytest.raises(ModelError, match=r"'0\.\*' in priors= matches none of the Bayesian"):
        nn.lift(torch_net(), bayesian="2.*", priors={"0.*": 0.1}).sites(PYRO)
    with pytest.raises(ModelError, match="priors\\['\\*'\\]: a prior scale must be a positive"):
        nn.lift(torch_net(), priors={"*": -1.0})
    with pytest.raises(ModelError, match="a ppl_bdl.dsl.nn layer is Bayesian already"):
        nn.lift(nn.Dense("fc", 2, 2))
    with pytest.raises(ModelError, match="no installed backend .* can lift a builtins.object"):
        nn.lift(object()).sites(PYRO)


# -- equinox on NumPyro --------------------------------------------------------------------------
def test_equinox_parameters_become_sites_and_the_forward_is_the_modules():
    module = eqx_net()
    lifted = nn.lift(module, prior=nn.he_normal(), name="net")
    assert lifted.sites(NUMPYRO) == {
        "net.layers.0.weight": (16, 2),
        "net.layers.0.bias": (16,),
        "net.layers.1.weight": (3, 16),
        "net.layers.1.bias": (3,),
    }
    assert lifted.priors(NUMPYRO)["net.layers.1.bias"].params["scale"] == pytest.approx(
        math.sqrt(2 / 16)
    )
    values = {
        "net.layers.0.weight": module.layers[0].weight,
        "net.layers.0.bias": module.layers[0].bias,
        "net.layers.1.weight": module.layers[1].weight,
        "net.layers.1.bias": module.layers[1].bias,
    }
    x = np.random.default_rng(0).normal(size=(5, 2)).astype(np.float32)
    expected = np.asarray(jax.vmap(module)(x))
    np.testing.assert_allclose(apply_on(NUMPYRO, lifted, values, x), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # (the torch module's posterior predicts by default)
def test_an_equinox_last_layer_posterior_predicts():
    X, y = make_blobs(n=150, num_classes=3, seed=0)
    X_test, y_test = make_blobs(n=90, num_classes=3, seed=1)
    model = classifier(nn.lift(eqx_net(), prior=1.0, bayesian="layers.1.*"))
    post = bdl.fit(
        model(X, y),
        backend="numpyro",
        method="vi",
        num_steps=400,
        num_samples=50,
        lr=0.05,
        progress=False,
    )
    assert sorted(post.samples) == ["layers.1.bias", "layers.1.weight"]
    pred = post.predict(model(X_test))
    assert np.mean(pred.probs.argmax(-1) == y_test) > 0.8


def test_an_equinox_module_on_pyro_is_a_clear_error():
    X, y = make_blobs(n=10, num_classes=3, seed=0)
    model = classifier(nn.lift(eqx_net()))
    with pytest.raises(ModelError) as info:
        bdl.fit(model(X, y), backend="pyro", method="vi", num_steps=2, progress=False)
    msg = str(info.value)
    assert "equinox.Module (MLP)" in msg and "'numpyro' backend" in msg
    assert "runs on the 'pyro' backend" in msg and "ppl_bdl.dsl.nn" in msg
