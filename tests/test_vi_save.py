"""A saved VI posterior keeps its losses and its fitted guide (rebuilt given the model)."""

from __future__ import annotations

import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import dist


@bdl.model
def regression(X, y=None):
    w = bdl.sample("w", dist.Normal(0.0, 1.0), shape=(2,))
    sigma = bdl.sample("sigma", dist.HalfNormal(1.0))
    with bdl.plate("data", X.shape[0]) as idx:
        bdl.sample("y", dist.Normal(X[idx] @ w, sigma), obs=None if y is None else y[idx])


def _data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(50, 2))
    return X, X @ np.array([1.0, -0.5]) + 0.3 * rng.normal(size=50)


@pytest.mark.parametrize(
    "guide, settings",
    [pytest.param("lowrank", {"rank": 2}, marks=pytest.mark.slow), ("flow", {"num_layers": 2})],
)
def test_vi_round_trip_rebuilds_the_guide(backend, guide, settings, tmp_path):
    X, y = _data()
    post = bdl.fit(
        regression(X, y),
        backend=backend,
        method="vi",
        guide=guide,
        num_steps=100,
        lr=0.02,
        num_samples=50,
        progress=False,
        **settings,
    )
    path = post.save(tmp_path / "vi.nc")

    bare = bdl.load(path)
    np.testing.assert_allclose(bare.losses, post.losses)
    assert bare.guide is None  # no model given: the guide cannot be rebuilt

    back = bdl.load(path, model=regression(X, y))
    assert back.guide.name == guide and back.guide.settings == settings
    np.testing.assert_allclose(back.guide.phi, post.guide.phi)
    values = post.guide.sample(5, seed=1)
    np.testing.assert_allclose(
        back.guide.log_prob(values), post.guide.log_prob(values), rtol=1e-5, atol=1e-5
    )
    assert back.predict(regression(X)).mean.shape == (50,)


def test_loading_on_another_model_is_refused(tmp_path):
    X, y = _data()
    post = bdl.fit(
        regression(X, y),
        method="vi",
        guide="meanfield",
        num_steps=50,
        num_samples=10,
        progress=False,
    )
    path = post.save(tmp_path / "vi.nc")

    @bdl.model
    def bigger(X, y):
        bdl.sample("w", dist.Normal(0.0, 1.0), shape=(5,))

    with pytest.raises(bdl.ModelError, match=r"'w' has shape \(5,\) in the model but \(2,\)"):
        bdl.load(path, model=bigger(X, y))
