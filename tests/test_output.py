"""Output a person reads: summaries without spurious warnings or NaN columns,
a short repr, readable guide parameters, predictive sd and intervals, labelled plots, and the
example of docs/results.md that shows them."""

from __future__ import annotations

import logging
import re
import warnings
from pathlib import Path

import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import dist
from ppl_bdl.errors import ConfigError
from ppl_bdl.posterior.diagnostics import ConvergenceWarning, Diagnostics, Finding
from ppl_bdl.posterior.posterior import Posterior

ROOT = Path(__file__).resolve().parents[1]
Y = np.random.default_rng(0).normal(2.0, 1.0, size=20)


@bdl.model
def mean_model(y=None, n=None):
    mu = bdl.sample("mu", dist.Normal(0.0, 10.0))
    sigma = bdl.sample("sigma", dist.HalfNormal(2.0))
    with bdl.plate("data", y.shape[0] if y is not None else n) as idx:
        bdl.sample("y", dist.Normal(mu, sigma), obs=None if y is None else y[idx])


@bdl.model
def classifier(X, y=None):
    w = bdl.sample("w", dist.Normal(0.0, 1.0), shape=(X.shape[1], 3))
    with bdl.plate("data", X.shape[0]) as idx:
        bdl.sample("y", dist.Categorical(logits=X[idx] @ w), obs=None if y is None else y[idx])


def _fit(backend, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # short runs: findings expected
        return bdl.fit(mean_model(Y), backend=backend, seed=0, progress=False, **kw)


@pytest.fixture(scope="module", params=bdl.backends.available())
def fits(request):
    """A one-chain NUTS fit, a two-chain one and a VI fit, small, on each backend."""
    nuts = dict(method="nuts", num_warmup=100, num_samples=100)
    return (
        _fit(request.param, num_chains=1, **nuts),
        _fit(request.param, num_chains=2, **nuts),
        _fit(request.param, method="vi", num_steps=300, lr=0.05, num_samples=100),
    )


@pytest.fixture
def arviz_log():
    """Messages ArviZ logs (its one-chain shape check is logged, not warned, on a logger that
    does not propagate to pytest's caplog)."""
    import arviz as az

    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    keep = Keep()
    loggers = [getattr(az, "_log", None), logging.getLogger("arviz")]
    loggers = [lg for lg in loggers if isinstance(lg, logging.Logger)]
    for lg in loggers:
        lg.addHandler(keep)
    yield seen
    for lg in loggers:
        lg.removeHandler(keep)


def _summary_without_warnings(post, arviz_log):
    """The summary, failing on any warning, and on ArviZ's logged one-chain shape message."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        frame = post.summary()
    assert not [m for m in arviz_log if "Shape validation" in m]
    return frame


def test_one_chain_and_vi_summaries_have_no_warning_and_no_rhat(fits, arviz_log):
    one_chain, _, vi = fits
    for post in (one_chain, vi):
        frame = _summary_without_warnings(post, arviz_log)
        assert "r_hat" not in frame.columns
        assert {"mean", "sd", "ess_bulk", "ess_tail"} <= set(frame.columns)
        assert not frame.isna().any().any()
        assert "2 or more chains" in frame.attrs["note"]
        assert frame.attrs["diagnostics"] == post.diagnostics.report()


def test_a_displayed_summary_shows_its_note_and_the_diagnostics_report(fits):
    """The report is shown by summary(): its repr (REPL, print) and its HTML (Jupyter) end with
    the note and the report; it is a DataFrame otherwise, and frames derived from it are plain."""
    import pandas as pd

    one_chain, two_chains, vi = fits
    # A short one-chain NUTS run has findings (ESS); the report lists them.
    assert one_chain.diagnostics, "the check needs a fit with findings"
    for post in (one_chain, two_chains, vi):
        frame = post.summary()
        report = post.diagnostics.report()
        assert isinstance(frame, pd.DataFrame) and report in frame.attrs["diagnostics"]
        text = repr(frame)
        assert text.startswith(repr(pd.DataFrame(frame))) and text.endswith(report)
        assert str(frame) == text and frame.to_string() == pd.DataFrame(frame).to_string()
        if "note" in frame.attrs:
            assert frame.attrs["note"] + "\n" + report in text
        html = frame._repr_html_()
        first = report.splitlines()[0]
        assert html.startswith("<div") and first in html and "</table>" in html
        assert "problem" not in repr(frame[["mean"]]) and type(frame.round(2)) is pd.DataFrame
    assert "problem" in repr(one_chain.summary()) and "R-hat needs" in repr(vi.summary())


def test_two_chain_summary_keeps_rhat(fits, arviz_log):
    _, two_chains, _ = fits
    frame = _summary_without_warnings(two_chains, arviz_log)
    assert "r_hat" in frame.columns and not frame["r_hat"].isna().any()
    assert "note" not in frame.attrs
    # kind="stats" has no diagnostics columns on any chain count
    assert "r_hat" not in fits[0].summary(kind="stats").columns


def test_repr_is_one_short_line(fits):
    one_chain, two_chains, vi = fits
    text = repr(two_chains)
    assert text.startswith(f"<Posterior nuts on {two_chains.backend}: 2 chains x 100 draws")
    assert "mu ()" in text and "sigma ()" in text and "\n" not in text
    assert repr(vi).startswith(f"<Posterior vi on {vi.backend}: 1 chain x 100 draws")


def test_repr_is_bounded_for_hundreds_of_sites():
    samples = {f"layer{i}.weight": np.zeros((4, 1000, 20, 20)) for i in range(300)}
    findings = Diagnostics([Finding("rhat", ("layer0.weight",), 1.3, 1.01, "run longer")] * 2)
    post = Posterior(samples=samples, method="sgld", backend="numpyro", diagnostics=findings)
    text = repr(post)
    assert len(text) < 400 and "and 292 more" in text and "diagnostics: 2 problems" in text
    assert "4 chains x 1000 draws" in text


def test_guide_params_are_readable_and_raw_params_unconstrained(fits):
    _, _, vi = fits
    params, raw = vi.guide.params, vi.guide.raw_params
    assert sorted(params) == ["loc", "scale"] and sorted(raw) == ["loc", "rho"]
    np.testing.assert_allclose(params["scale"], np.logaddexp(0.0, raw["rho"]))
    np.testing.assert_array_equal(params["loc"], raw["loc"])
    assert np.all(params["scale"] > 0)
    np.testing.assert_array_equal(vi.guide.describe()["scale"], params["scale"])
    # phi is the raw vector, flat
    np.testing.assert_array_equal(vi.guide.phi, np.concatenate([raw["loc"], raw["rho"]]))


def test_guide_params_survive_save_and_load(fits, tmp_path):
    _, _, vi = fits
    back = bdl.load(vi.save(tmp_path / "vi.nc"), model=mean_model(Y))
    for name, value in vi.guide.params.items():
        np.testing.assert_allclose(back.guide.params[name], value)
    np.testing.assert_allclose(back.guide.raw_params["rho"], vi.guide.raw_params["rho"])


def test_predict_sd_and_interval(fits):
    _, two_chains, _ = fits
    pred = two_chains.predict(mean_model(n=4), seed=1)
    np.testing.assert_allclose(pred.sd, np.sqrt(pred.total))
    assert pred.sd.shape == (4,)
    lo, hi = pred.interval(0.9)
    draws = pred.draws["y"]
    np.testing.assert_allclose(lo, np.quantile(draws, 0.05, axis=0))
    np.testing.assert_allclose(hi, np.quantile(draws, 0.95, axis=0))
    inner_lo, inner_hi = pred.interval(0.5)
    assert np.all(lo < inner_lo) and np.all(inner_hi < hi)
    # Nearly Gaussian here: the 90% interval spans about 2 x 1.645 predictive sds.
    np.testing.assert_allclose((hi - lo) / (2 * 1.645 * pred.sd), 1.0, rtol=0.2)
    covered = np.mean((draws > lo) & (draws < hi))
    assert abs(covered - 0.9) < 0.02
    assert "regression of 'y'" in repr(pred) and len(repr(pred)) < 200


@pytest.mark.parametrize("level", [0.0, 1.0, 1.5, -0.1, True, "0.9"])
def test_interval_rejects_bad_levels(fits, level):
    _, two_chains, _ = fits
    pred = two_chains.predict(mean_model(n=2))
    with pytest.raises(ConfigError, match=r"level .*\(0, 1\)"):
        pred.interval(level)


def test_classification_sd_and_interval_say_what_to_use(backend):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(12, 2))
    post = Posterior(samples={"w": rng.normal(size=(1, 5, 2, 3))}, backend=backend, method="nuts")
    pred = post.predict(classifier(X))
    for read in (lambda: pred.sd, lambda: pred.interval(0.9)):
        with pytest.raises(ConfigError, match="classifier.*pred.probs"):
            read()
    assert "classification of 'y'" in repr(pred)


def test_results_page_example_runs(tmp_path, monkeypatch):
    """The example of docs/results.md's "Reading a fit" runs as written; its numbers hold."""
    text = (ROOT / "docs" / "results.md").read_text()
    section = text.split("## Reading a fit")[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        exec(compile(code, "docs/results.md", "exec"), namespace)
    post, pred, lo, hi = (namespace[k] for k in ("post", "pred", "lo", "hi"))
    assert "r_hat" not in namespace["frame"].columns
    assert repr(namespace["frame"]).endswith(
        "R-hat needs 2 or more chains; this posterior has 1.\nDiagnostics: no problems found."
    )
    # The exact posterior (conjugate): N(sum(y) / (n + 1/100), 1 / (n + 1/100)). Adam at a
    # constant lr of 0.05 ends within half a posterior sd of its mean.
    y = namespace["y"]
    mean, sd = y.sum() / (y.size + 0.01), (y.size + 0.01) ** -0.5
    assert post.guide.params["loc"] == pytest.approx(mean, abs=0.5 * sd)
    assert post.guide.params["scale"] == pytest.approx(sd, rel=0.2)
    np.testing.assert_allclose(pred.sd, np.sqrt(1 + sd**2), atol=0.05)
    np.testing.assert_allclose((lo + hi) / 2, mean, atol=0.2)
    np.testing.assert_allclose((hi - lo) / 2, 1.67, atol=0.2)


def test_demo_plots_have_one_title_and_labelled_axes(tmp_path):
    import arviz as az
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ppl_bdl.cli import demo
    from ppl_bdl.posterior.predictive import PredictiveResult

    rng = np.random.default_rng(0)
    idata = az.from_dict(
        posterior={
            "mu": rng.normal(size=(2, 30)),
            "tau": rng.gamma(2.0, size=(2, 30)),
            "theta": rng.normal(size=(2, 30, 8)),
        }
    )
    grid = np.linspace(-1, 1, 5)[:, None]
    pred = PredictiveResult(
        draws={"y": rng.normal(size=(10, 5))},
        site="y",
        kind="regression",
        mean=np.zeros(5),
        total=np.ones(5),
        aleatoric=0.5 * np.ones(5),
        epistemic=0.5 * np.ones(5),
    )
    figures = [
        demo._trace_figure(idata, "numpyro"),
        demo._forest_figure(idata, "numpyro"),
        demo._band_figure(pred, grid, np.zeros(5), grid, np.zeros(5), grid, "numpyro"),
    ]
    for fig in figures:
        axes = [ax for ax in fig.axes if ax.get_visible() and ax.has_data()]
        assert axes
        titles = [ax.get_title() for ax in axes if ax.get_title()]
        suptitle = fig._suptitle.get_text() if fig._suptitle is not None else ""
        # one figure title; any panel headings differ from it and from one another
        assert bool(suptitle) + len(titles) >= 1
        assert len(set(titles)) == len(titles) and suptitle not in titles
        assert sum("numpyro" in t for t in [suptitle, *titles]) == 1
        for ax in axes:
            assert ax.get_xlabel(), fig
        plt.close(fig)
    files = demo._save_plots(
        idata, pred, grid, np.zeros(5), grid, np.zeros(5), grid, tmp_path, "numpyro"
    )
    assert all(f.stat().st_size > 0 for f in files)
