"""VI errors: unknown names list the valid ones, bad ranks and alphas, and a NaN loss that stops
the run with the step number, the last finite loss and the parameters from before it."""

from __future__ import annotations

import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import dist
from ppl_bdl import math as bm


@bdl.model
def small():
    bdl.sample("z", dist.Normal(0.0, 1.0), shape=(3,))


def _fit(backend="numpyro", **kw):
    opts = dict(method="vi", num_steps=20, num_samples=5, progress=False)
    opts.update(kw)
    return bdl.fit(small(), backend=backend, **opts)


def test_unknown_guide_lists_valid_ones():
    with pytest.raises(
        bdl.ConfigError, match="guide='nope'.*no guide of that name.*'flow'.*'lowrank'.*'meanfield'"
    ):
        _fit(guide="nope")


def test_unknown_objective_lists_valid_ones():
    with pytest.raises(bdl.ConfigError, match="objective='kl'.*'elbo'.*'renyi'.*'iwae'"):
        _fit(objective="kl")


@pytest.mark.parametrize("rank", [0, -1, 4])
def test_rank_out_of_range(rank):
    with pytest.raises(bdl.ConfigError, match="rank"):
        _fit(guide="lowrank", rank=rank)


@pytest.mark.parametrize("alpha", [-0.5, float("nan"), float("inf")])
def test_alpha_out_of_range(alpha):
    with pytest.raises(bdl.ConfigError, match="alpha must be a finite number >= 0"):
        _fit(objective="renyi", alpha=alpha)


def test_other_bad_settings():
    with pytest.raises(bdl.ConfigError, match="objective='renyi' needs alpha"):
        _fit(objective="renyi")
    with pytest.raises(bdl.ConfigError, match="alpha=0.5 only applies"):
        _fit(alpha=0.5)
    with pytest.raises(
        bdl.ConfigError, match="guide='meanfield', rank=.*not a setting of the meanfield guide"
    ):
        _fit(guide="meanfield", rank=2)
    with pytest.raises(bdl.ConfigError, match="optimizer='rmsprop'.*must be one of"):
        _fit(optimizer="rmsprop")
    with pytest.raises(bdl.ConfigError, match="unknown schedule 'linear'"):
        _fit(schedule="linear")
    with pytest.raises(bdl.ConfigError, match="num_particles"):
        _fit(num_particles=0)
    with pytest.raises(bdl.ConfigError, match="kl='analytic' needs a Gaussian mean-field"):
        _fit(guide="flow", kl="analytic")
    with pytest.raises(bdl.ConfigError, match="unknown blocks"):
        _fit(guide="lowrank", blocks="layer")


def test_fullrank_refuses_large_models_and_points_to_lowrank():
    with pytest.raises(bdl.ConfigError, match="lowrank"):
        _fit(guide="fullrank", max_dim=2)


@bdl.model
def blows_up():
    # The target pulls x towards 10, but its log density is NaN beyond 3: the run must stop
    # when the guide's draws cross it.
    x = bdl.sample("x", dist.Normal(0.0, 100.0))
    bdl.factor("pull", bm.where(x < 3.0, -0.5 * (x - 10.0) ** 2, np.nan))


def test_nan_loss_stops_with_step_and_keeps_parameters(backend):
    with pytest.raises(bdl.InferenceError) as info:
        bdl.fit(
            blows_up(),
            backend=backend,
            method="vi",
            guide="meanfield",
            num_steps=3000,
            lr=0.05,
            init_loc={"x": 0.0},
            init_scale=1e-3,
            num_samples=10,
            progress=False,
        )
    err = info.value
    message = str(err)
    step = int(message.split("stopped at step ")[1].split(":")[0])
    assert 0 < step < 3000
    assert "Last finite loss:" in message
    post = err.partial
    assert isinstance(post, bdl.Posterior)
    assert post.losses.shape == (step,) and np.all(np.isfinite(post.losses))
    assert f"{post.losses[-1]:.6g}" in message
    loc = post.guide.describe()["loc"]
    assert np.all(np.isfinite(loc)) and loc[0] < 3.0  # the parameters from before the NaN


def test_nan_on_first_step():
    @bdl.model
    def always_nan():
        x = bdl.sample("x", dist.Normal(0.0, 1.0))
        bdl.factor("bad", x * np.nan)

    with pytest.raises(bdl.InferenceError, match="step 0.*none"):
        bdl.fit(
            always_nan(),
            backend="numpyro",
            method="vi",
            num_steps=10,
            num_samples=5,
            progress=False,
        )
