"""Methods as typed objects: options checked once, at construction; the string form builds the
same object and gives the same draws; the CLI's flags and the docs' tables come from the fields."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import dist
from ppl_bdl.cli import main as cli
from ppl_bdl.errors import ConfigError
from ppl_bdl.inference.method import option
from ppl_bdl.inference.methods import METHODS, options_page, resolve_method

DOCS = Path(__file__).resolve().parents[1] / "docs" / "methods.md"


@bdl.model
def mean_model(y):
    mu = bdl.sample("mu", dist.Normal(0.0, 10.0))
    with bdl.plate("data", y.shape[0]) as idx:
        bdl.sample("y", dist.Normal(mu, 1.0), obs=y[idx])


Y = np.random.default_rng(0).normal(1.0, 1.0, size=40)


def test_every_method_has_a_class_and_a_name():
    assert set(METHODS) == {
        "nuts",
        "hmc",
        "sgld",
        "sghmc",
        "psgld",
        "csgld",
        "csghmc",
        "resgld",
        "resghmc",
        "vi",
        "cavi",
        "ensemble",
        "mc_dropout",
        "swag",
        "laplace",
    }
    for name, cls in METHODS.items():
        method = cls()
        assert method.name == name and dataclasses.is_dataclass(method)
        with pytest.raises(dataclasses.FrozenInstanceError):
            method.seed = 1  # frozen
        assert pickle.loads(pickle.dumps(method)) == method  # executors send it to workers


@pytest.mark.parametrize(
    "name, options",
    [
        ("sghmc", dict(step_size=1e-3, friction=0.1, num_warmup=50, num_samples=50)),
        ("vi", dict(num_steps=50, num_samples=20)),
    ],
)
def test_string_form_builds_the_same_object_and_draws(name, options):
    obj = METHODS[name](**options)
    assert resolve_method(name, options) == obj
    kw = dict(backend="numpyro", progress=False, seed=3)
    with pytest.warns(bdl.ConvergenceWarning):
        a = bdl.fit(mean_model(Y), method=name, **options, **kw)
    with pytest.warns(bdl.ConvergenceWarning):
        b = bdl.fit(mean_model(Y), method=obj, **kw)
    np.testing.assert_array_equal(a.samples["mu"], b.samples["mu"])
    assert a.settings == b.settings and a.method == b.method == name


def test_options_given_with_an_object_replace_its_fields():
    method = resolve_method(bdl.NUTS(target_accept=0.9), {"num_chains": 2})
    assert (method.target_accept, method.num_chains) == (0.9, 2)


@pytest.mark.parametrize(
    "build, words",
    [
        (lambda: bdl.SGHMC(stepsize=1e-3), ["stepsize", "step_size"]),
        (lambda: resolve_method("sghmc", {"stepsize": 1e-3}), ["stepsize", "step_size"]),
        (lambda: bdl.NUTS(target_accept=1.5), ["target_accept", "1.5", "(0, 1)"]),
        (lambda: bdl.NUTS(max_tree_depth=0), ["max_tree_depth", "0"]),
        (lambda: bdl.SGHMC(friction=-1.0), ["friction", "-1.0", ">= 0"]),
        (lambda: bdl.SGLD(temperature=-2.0), ["temperature", "-2.0"]),
        (lambda: bdl.CyclicalSGLD(exploration=1.5), ["exploration", "1.5"]),
        (lambda: bdl.VI(objective="kl"), ["objective", "'kl'", "'elbo'"]),
        (lambda: bdl.VI(num_warmup=10), ["num_warmup", "num_steps"]),
        (lambda: bdl.VI(guide="meanfield", rank=2), ["rank", "meanfield"]),
        (lambda: bdl.CAVI(tol=0.0), ["tol", "0.0"]),
        (lambda: bdl.Ensemble(num_chains=3), ["num_chains", "num_members"]),
        (lambda: bdl.Ensemble(lr=-1.0), ["lr", "-1.0"]),
        (lambda: bdl.HMC(max_tree_depth=4), ["max_tree_depth", "num_steps"]),
        (lambda: resolve_method("gibs", {}), ["gibs", "nuts"]),
    ],
)
def test_a_bad_option_is_an_error_at_construction(build, words):
    with pytest.raises(ConfigError) as info:
        build()
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_executor_and_chain_ids_apply_to_chain_methods_only():
    with pytest.raises(ConfigError, match="executor"):
        bdl.fit(mean_model(Y), method="vi", executor=bdl.InProcessExecutor())
    with pytest.raises(ConfigError, match="chain_ids"):
        bdl.fit(mean_model(Y), method="cavi", chain_ids=[0])


def test_a_new_field_is_a_flag_and_a_table_row():
    flags = {
        o
        for a in cli.build_parser()._subparsers._group_actions[0].choices["fit"]._actions
        for o in a.option_strings
    }
    for cls in METHODS.values():
        for o in cls.options():
            assert "--" + o.name.replace("_", "-") in flags, (cls.__name__, o.name)
            assert f"| `{o.name}` (" in options_page()

    @dataclasses.dataclass(frozen=True)
    class Tuned(bdl.NUTS):
        patience: int = option(3, "a new option")

    assert [o.name for o in Tuned.options()][-1] == "patience"
    assert "| `patience` | `int` | `3` | a new option |" in Tuned.option_table()


def test_the_docs_tables_are_current():
    assert DOCS.read_text() == options_page(), "run: ppl-bdl methods > docs/methods.md"
