"""Regression tests of the "trust" issue's exact inputs: data read past its end, a minibatched
site not indexed by its plate, an option a method does not use, a NUTS step size that must be
used as given, and a likelihood that turns NaN midway."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import dist
from ppl_bdl import math as bm


@bdl.model
def plate_of(y, n):
    mu = bdl.sample("mu", dist.Normal(0.0, 1.0))
    with bdl.plate("data", n) as idx:
        bdl.sample("y", dist.Normal(mu, 1.0), obs=y[idx])


def test_data_shorter_than_its_plate_is_an_error(backend):
    """JAX clamps out-of-range gathers: 8 values in a plate of 11 were read as [0..7, 7, 7, 7]."""
    with pytest.raises(bdl.DataError, match=r"(?s)past its end.*'data' \(size 11\)"):
        bdl.fit(
            plate_of(np.arange(8.0), 11),
            backend=backend,
            num_warmup=5,
            num_samples=5,
            num_chains=1,
            progress=False,
        )


@bdl.model
def unindexed(y):
    mu = bdl.sample("mu", dist.Normal(0.0, 1.0))
    with bdl.plate("data", len(y)):
        bdl.sample("y", dist.Normal(mu, 1.0), obs=y)


@pytest.mark.parametrize("method", ["vi", "sgld"])
def test_a_minibatched_site_must_be_indexed_by_its_plate(backend, method):
    options = dict(num_steps=5) if method == "vi" else dict(step_size=1e-3, num_warmup=5)
    with pytest.raises(bdl.ConfigError, match=r"batch_size=4.*obs=y\[idx\]"):
        bdl.fit(
            unindexed(np.arange(8.0)),
            backend=backend,
            method=method,
            batch_size=4,
            num_samples=5,
            progress=False,
            **options,
        )


def test_num_chains_for_vi_runs_independent_fits(backend):
    """Once an error, num_chains for VI now runs that many independent fits, the
    first the one fit of the same seed (tests/test_scale.py checks them in depth)."""
    kw = dict(backend=backend, method="vi", num_steps=50, num_samples=3, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", bdl.ConvergenceWarning)  # 50 steps: not converged
        both = bdl.fit(plate_of(np.zeros(5), 5), num_chains=2, **kw)
        one = bdl.fit(plate_of(np.zeros(5), 5), **kw)
    assert both.samples["mu"].shape == (2, 3)
    np.testing.assert_allclose(both.losses[0], one.losses, rtol=1e-5)


def test_nuts_without_warmup_uses_the_step_size_given(backend):
    post = bdl.fit(
        plate_of(np.zeros(5), 5),
        backend=backend,
        method="nuts",
        step_size=3.0,
        num_warmup=0,
        num_samples=5,
        num_chains=1,
        progress=False,
    )
    np.testing.assert_allclose(post.sample_stats["step_size"], 3.0)


@bdl.model
def turns_nan(y):
    """A likelihood that turns NaN once mu passes 2 (the chain drifts there from 0)."""
    mu = bdl.sample("mu", dist.Normal(0.0, 10.0))
    with bdl.plate("data", y.shape[0]) as idx:
        scale = bm.where(mu < 2.0, 1.0, np.nan)
        bdl.sample("y", dist.Normal(mu, scale), obs=y[idx])


def test_a_likelihood_turning_nan_midway_stops_sgld(backend):
    y = np.full(20, 4.0)
    with pytest.raises(bdl.InferenceError, match="non-finite") as info:
        bdl.fit(
            turns_nan(y),
            backend=backend,
            method="sgld",
            step_size=1e-3,
            num_warmup=0,
            num_samples=2000,
            num_chains=1,
            init={"mu": 0.0},
            progress=False,
        )
    partial = info.value.partial
    assert partial is not None and np.all(partial.samples["mu"] < 2.0)


@pytest.mark.parametrize("option", [dict(num_warmup=100), dict(thinning=2), dict(init="prior")])
def test_options_vi_does_not_use_are_errors(option):
    with pytest.raises(bdl.ConfigError, match="does not apply to method='vi'"):
        bdl.fit(
            plate_of(np.zeros(5), 5),
            backend="numpyro",
            method="vi",
            num_steps=5,
            progress=False,
            **option,
        )
