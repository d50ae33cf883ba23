"""Conformance: every registered backend × shipped model × method (NUTS, each SG-MCMC kernel, each
guide, ensembles) gives draws of the model's shapes, finite, and an ArviZ object.

The backends include a third one that lives in ``tests/third_backend`` and registers itself
through the entry-point group ``ppl_bdl.backends`` (a dist-info folder put on ``sys.path`` for
this module only): adding a backend is one module and one entry point. A combination a backend
cannot do is listed in :data:`UNSUPPORTED` and shows as an ``xfail`` with its reason, never as a
silent skip. One small model runs every method by default; every model runs every method under
``-m slow``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import models
from ppl_bdl.trace.layout import trace_model

THIRD = Path(__file__).resolve().parent / "third_backend"
BACKENDS = [
    name
    for name, needs in (("numpyro", "numpyro"), ("pyro", "pyro"), ("jaxdelegate", "numpyro"))
    if importlib.util.find_spec(needs) is not None
]
EXAMPLES = models.examples()
SG_KERNELS = ["sgld", "sghmc", "psgld", "csgld", "csghmc"]
GUIDES = ["meanfield", "lowrank", "fullrank", "flow", "delta"]
METHODS = ["nuts", *SG_KERNELS, *(f"vi-{g}" for g in GUIDES), "ensemble"]
#: (backend, model or None for all, method) -> why the backend cannot run it.
UNSUPPORTED: dict[tuple[str, str | None, str], str] = {}
DEFAULT_MODEL = "linear_regression"


@pytest.fixture(scope="module", autouse=True)
def third_backend():
    """Register the test-only backend through its entry point while this module runs."""
    sys.path.insert(0, str(THIRD))
    bdl.backends.registered.cache_clear()
    assert "jaxdelegate" in bdl.backends.registered()
    yield
    sys.path.remove(str(THIRD))
    bdl.backends.registered.cache_clear()


def _options(method: str, quick: bool) -> dict:
    if method == "nuts":
        return dict(method="nuts", num_warmup=20, num_samples=10, num_chains=2, max_tree_depth=4)
    if method.startswith("vi-"):
        return dict(method="vi", guide=method[3:], num_steps=50, num_samples=10)
    if method == "ensemble":
        return dict(method="ensemble", num_members=2, num_steps=100, lr=0.1, schedule="cosine")
    step = dict(step_size=1e-4) if quick else {}  # the slow grid picks its step sizes itself
    return dict(method=method, num_warmup=20, num_samples=10, num_chains=2, **step)


def _check(backend: str, name: str, method: str, quick: bool) -> None:
    reason = UNSUPPORTED.get((backend, name, method)) or UNSUPPORTED.get((backend, None, method))
    if reason:
        pytest.xfail(reason)
    bound = EXAMPLES[name]
    post = bdl.fit(bound, backend=backend, seed=0, progress=False, **_options(method, quick))
    be = bdl.backends.get(backend)
    sites = trace_model(bound, be)
    chains = 1 if method.startswith("vi-") else 2
    draws = 1 if method == "ensemble" else 10  # one draw per member
    for site, record in sites.items():
        if record.kind != "latent":
            continue
        expected = (chains, draws) + tuple(np.shape(be.to_numpy(record.value)))
        assert post.samples[site].shape == expected, (site, post.samples[site].shape, expected)
        assert np.all(np.isfinite(post.samples[site])), site
    idata = post.to_arviz()
    assert {"posterior", "log_likelihood", "observed_data"} <= set(idata.groups())


#: The third backend delegates to NumPyro's pieces: by default it runs one method of each kind
#: (the native sampler, an SG-MCMC kernel, a guide); every method under -m slow.
THIRD_BY_DEFAULT = {"nuts", "sghmc", "vi-meanfield", "ensemble"}
QUICK_GRID = [
    (b, m)
    if b != "jaxdelegate" or m in THIRD_BY_DEFAULT
    else pytest.param(b, m, marks=pytest.mark.slow)
    for b in BACKENDS
    for m in METHODS
]


@pytest.mark.parametrize(("backend", "method"), QUICK_GRID)
def test_every_method_on_every_backend(backend, method):
    _check(backend, DEFAULT_MODEL, method, quick=True)


@pytest.mark.slow
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", sorted(EXAMPLES))
@pytest.mark.parametrize("backend", BACKENDS)
def test_every_model_method_and_backend(backend, name, method):
    _check(backend, name, method, quick=False)


def test_the_third_backend_is_found_through_its_entry_point():
    assert "jaxdelegate" in bdl.backends.available()
    backend = bdl.backends.get("jaxdelegate")
    assert type(backend).__module__ == "ppl_bdl_third_backend"
