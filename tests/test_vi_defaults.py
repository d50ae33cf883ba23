"""VI keeps its best state, stops on a diverging loss, and its defaults fit the shipped models.

The issue's runs: the flow guide at ``lr=0.01`` (the old default) on the shipped sine BNN
reached a loss of 185 and ended at 76,000 (sigma 2.9 on NumPyro, 2e6 on Pyro) without a word;
now the run stops where the loss diverges and returns the guide at its best smoothed loss. And
the defaults (the flow's ``lr=0.001``, ``num_steps=None``: until converged) fit it.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl.diagnostics import ConvergenceWarning
from ppl_bdl.inference.common import prepare
from ppl_bdl.inference.psis import importance_log_weights
from ppl_bdl.inference.vi import DEFAULT_LR
from ppl_bdl.inference.vi_monitor import AUTO_MAX_STEPS, AUTO_MIN_STEPS, LossMonitor
from ppl_bdl.models import bnn, posteriordb, regression


def _quiet_fit(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return bdl.fit(*args, progress=False, **kwargs)


def test_monitor_keeps_the_best_and_calls_a_rise_diverging():
    monitor = LossMonitor()
    rng = np.random.default_rng(0)
    verdicts = [
        monitor.update(100 * (i + 1), level + rng.normal(size=100), lambda level=level: level)
        for i, level in enumerate([100.0, 40.0, 30.0, 35.0, 31.0, 90.0, 95.0])
    ]
    assert verdicts[:6] == [None] * 6  # 35 and 31 are noise-level wobbles: not diverging
    assert verdicts[6] == "diverging" and monitor.best_step == 300 and monitor.best_params == 30.0


def test_monitor_convergence_needs_a_flat_best():
    still, flat = LossMonitor(), LossMonitor()
    for i in range(8):
        still.update(100 * (i + 1), np.full(10, 100.0 - 10 * i), lambda: None)
        flat.update(100 * (i + 1), np.full(10, 100.0 - 50 * min(i, 1)), lambda: None)
    assert not still.converged() and flat.converged()


def test_a_diverging_flow_stops_and_returns_its_best_state(backend):
    """The issue's run, at the flow's old default lr=0.01 (1000 steps, segments of 100)."""
    X, y = regression.make_sine_data()
    post = _quiet_fit(bnn.bnn_regression(X, y), backend=backend, method="vi", guide="flow",
                      lr=0.01, num_steps=1000, num_samples=200)  # fmt: skip
    settings = post.settings
    assert settings["stop_reason"] == "diverging"
    assert settings["best_step"] < settings["stopped_at"] == len(post.losses) < 1000
    assert post.diagnostics.kinds()[0] == "vi_diverged"
    segments = post.losses.reshape(-1, 100).mean(axis=1)
    assert settings["best_step"] == 100 * (int(np.argmin(segments)) + 1)
    # The guide returned is the one at the best step: its typical loss (the median of
    # -log p(x, θ) + log q(θ) over 256 of its draws; the mean is ruled by the flow's heavy tail)
    # is near the best segment's mean, far below the last segment's.
    setup = prepare(bnn.bnn_regression(X, y), backend, "float32", 0)
    loss = -np.median(importance_log_weights(setup, post))
    assert loss < segments.min() + 0.5 * (segments[-1] - segments.min()), (loss, segments)


def test_num_steps_none_runs_until_converged(backend):
    X, y = regression.make_regression_data(n=50, d=2, seed=0)
    post = _quiet_fit(regression.linear_regression(X, y), backend=backend, method="vi",
                      num_samples=100)  # fmt: skip
    run = post.settings["steps_run"]
    assert post.settings["num_steps"] is None and AUTO_MIN_STEPS <= run < AUTO_MAX_STEPS
    assert len(post.losses) == run
    w = post.samples["w"].reshape(-1, 2).mean(0)
    np.testing.assert_allclose(w, [1.0, -1.0], atol=0.15)


@pytest.mark.slow  # about a minute per backend: the run goes until converged (up to 50,000)
def test_the_flow_guide_at_its_defaults_fits_the_sine_bnn(backend):
    """Sigma within 30% of the true 0.15, and the predictive band wider in the gap of the
    inputs (|x| < 0.8) than where the data is."""
    X, y = regression.make_sine_data()
    model = bnn.bnn_regression
    post = _quiet_fit(model(X, y), backend=backend, method="vi", guide="flow", num_samples=500)
    sigma = float(post.samples["sigma"].mean())
    assert abs(sigma - 0.15) < 0.3 * 0.15, sigma
    grid = np.linspace(-3, 3, 61)[:, None]
    sd = np.sqrt(post.predict(model(grid)).epistemic)
    gap = np.abs(grid[:, 0]) < 0.6
    data = (np.abs(grid[:, 0]) > 1.0) & (np.abs(grid[:, 0]) < 2.8)
    assert sd[gap].mean() > sd[data].mean(), (sd[gap].mean(), sd[data].mean())


def _shipped() -> dict:
    models = {**regression.examples(), **bnn.examples()}
    models.update(
        {k: v for k, v in posteriordb.examples().items() if k in ("eight_schools_noncentered",)}
    )
    return models


GUIDES = ("meanfield", "lowrank", "fullrank", "flow")


#: Known gaps, measured: a full-rank guide on the BNN regression converges at constant lr to a
#: loss 4 nats above what lr / 3 reaches (40.3 against 36.5): Adam's noise floor; a decaying lr
#: once the loss has flattened is the fix still to build.
KNOWN_GAPS = {("bnn_regression", "fullrank")}


@pytest.mark.slow  # the grid: 6 models x 4 guides, each against a run 2x longer at lr / 3
@pytest.mark.parametrize("guide", GUIDES)
@pytest.mark.parametrize("name", sorted(_shipped()))
def test_every_guide_at_its_defaults_reaches_a_long_small_step_run(name, guide):
    """The default run's best smoothed loss is within a margin of the reference's: 2% of the
    loss's size plus 2 nats (one particle's ELBO noise on these models is ~1-5 nats)."""
    if (name, guide) in KNOWN_GAPS:
        pytest.xfail("constant-lr noise floor of a full-rank guide on a BNN (KNOWN_GAPS)")
    bound = _shipped()[name]
    default = _quiet_fit(bound, backend="numpyro", method="vi", guide=guide, num_samples=50)
    lr = DEFAULT_LR.get(guide, 1e-2) / 3
    steps = 2 * default.settings["steps_run"]
    reference = _quiet_fit(bound, backend="numpyro", method="vi", guide=guide, lr=lr,
                           num_steps=steps, num_samples=50)  # fmt: skip

    def best(losses):
        window = max(10, len(losses) // 20)
        return np.convolve(losses, np.ones(window) / window, mode="valid").min()

    ours, ref = best(default.losses), best(reference.losses)
    assert ours <= ref + 0.02 * abs(ref) + 2.0, (ours, ref)
