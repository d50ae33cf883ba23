"""The docs' inference examples run as written on the shipped models (their settings work)."""

from __future__ import annotations

import doctest
import re
import warnings
from pathlib import Path

import numpy as np
import pytest

from ppl_bdl.posterior.diagnostics import ConvergenceWarning

ROOT = Path(__file__).resolve().parents[1]


def _run_first_block(page: str, namespace: dict) -> list:
    """Run the page's first example as written; return the fits' diagnostics warnings."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        exec(compile(_first_block(page), f"docs/{page}", "exec"), namespace)
    return [w for w in caught if issubclass(w.category, ConvergenceWarning)]


def _assert_good_fit(post, allowed: set[str]) -> None:
    """A good fit: no finding but the ``allowed`` kinds, and none at a site outside the network
    (a BNN's weights sit in symmetric modes, so their R-hat across chains is large however well
    the predictions mix; the noise scale has no such symmetry)."""
    for finding in post.diagnostics:
        assert finding.kind in allowed, finding.message
        assert all(site.startswith("net.") for site in finding.sites), finding.message


def _first_block(page: str) -> str:
    return re.search(r"```python\n(.*?)```", (ROOT / "docs" / page).read_text(), re.S).group(1)


@pytest.mark.slow  # ~15 s; the default suite runs the same settings in test_step_size.py
def test_sgmcmc_page_example_runs_as_written():
    namespace: dict = {}
    _run_first_block("sgmcmc.md", namespace)
    post, model, X, y = (namespace[k] for k in ("post", "model", "X", "y"))
    # Cyclical SGHMC sends each chain to its own mode of the network's posterior, and the noise
    # scale differs between the fits those modes are: R-hat across chains is large there too
    # (docs/sgmcmc.md says so); the fit is judged by its predictions, below.
    for finding in post.diagnostics:
        assert finding.kind in {"rhat", "ess_bulk", "ess_tail"}, finding.message
    assert post.samples["net.0.weight"].shape == (4, 500, 1, 20)
    assert post.predict(model(X)).rmse(y) < 0.5 * y.std()


@pytest.mark.slow  # ~30 s: 10,000 steps on Pyro
def test_vi_page_example_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    _run_first_block("vi.md", namespace)
    post, back, model, X, y = (namespace[k] for k in ("post", "back", "model", "X", "y"))
    # Pareto k̂ is large for a Gaussian guide on a network's posterior (Yao et al. 2018)
    _assert_good_fit(post, {"psis_khat"})
    assert post.losses.shape == (10_000,) and back.guide.name == "lowrank"
    assert post.predict(model(X)).rmse(y) < 0.5 * y.std()


def _block_under(page: str, heading: str) -> str:
    """The first example of ``page`` after the line ``heading``."""
    text = (ROOT / "docs" / page).read_text()
    return re.search(r"```python\n(.*?)```", text[text.index(heading) :], re.S).group(1)


def test_ebm_section_example_runs_as_written():
    """docs/inference.md's energy-based model (300 updates: the settings whose moments
    tests/test_ebm.py checks against the data, within 0.15 sd and 0.2)."""
    namespace: dict = {}
    code = _block_under("inference.md", "## Energy-based models")
    exec(compile(code, "docs/inference.md (EBM)", "exec"), namespace)
    x, X, model = namespace["x"], namespace["X"], namespace["model"]
    assert x.shape == (2000, 2) and model.losses.shape == (300,)
    assert np.abs(x.mean(0) - X.mean(0)).max() < 0.15 * X.std(0).min()
    low, high = model.energy(np.array([[1.5, 0.0], [0.0, -1.5]]))
    assert low < high


def test_cavi_section_example_runs_as_written():
    namespace: dict = {}
    code = _block_under("inference.md", "## Coordinate-ascent VI (CAVI)")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        exec(compile(code, "docs/inference.md (CAVI)", "exec"), namespace)
    assert not [w for w in caught if issubclass(w.category, ConvergenceWarning)]
    post, elbo = namespace["post"], namespace["elbo"]
    assert post.settings["converged"] and min(elbo[1:] - elbo[:-1]) >= -1e-4 * abs(elbo[-1])
    assert sorted(post.guide.params["locs"]["loc"]) == pytest.approx([-5.21, 5.04], abs=0.01)
    assert post.samples["z"].shape == (1, 1000, 200)


@pytest.mark.slow  # ~20 s of CPU: 2000 steps, then 1000 particles for each of 500 points
def test_amortized_section_example_runs_as_written():
    namespace: dict = {}
    code = _block_under("inference.md", "## Amortized inference")
    exec(compile(code, "docs/inference.md (amortized)", "exec"), namespace)
    post, est, exact, loc = (namespace[k] for k in ("post", "est", "exact", "loc"))
    assert loc.shape == (3, 2) and post.samples["z"].shape == (1, 100, 500, 2)
    # The importance-sampling estimate of log p(D) against pPCA's closed form at the fitted W,
    # mu, sigma: within 4 of its Monte Carlo standard errors (the points' independent errors
    # added in quadrature; measured 1.6). Its bias, -sum(mc_se^2)/2, is 0.1 nats here.
    assert abs(est.total - exact.sum()) < 4 * np.sqrt(np.sum(est.mc_se**2))
    assert np.abs((est.per_point - exact) / est.mc_se).max() < 5.0


@pytest.mark.slow  # ~20 s; the default suite checks the same bar in test_vi_natural.py
def test_natural_gradient_section_example_runs_as_written():
    namespace: dict = {}
    code = _block_under("inference.md", "## Natural-gradient mean-field VI")
    exec(compile(code, "docs/inference.md (VOGN)", "exec"), namespace)
    post, X, y, precision = (namespace[k] for k in ("post", "X", "y", "precision"))
    var = 1.0 / np.diag(precision)
    mean = np.linalg.solve(precision, X.T @ y / 0.5**2)
    np.testing.assert_allclose(post.guide.params["loc"], mean, atol=0.1 * np.sqrt(var).min())
    np.testing.assert_allclose(post.guide.params["scale"] ** 2, var, rtol=0.1)


@pytest.mark.slow  # ~25 s: two ensembles of 5 members x 3000 steps
def test_ensembles_page_example_runs_as_written():
    namespace: dict = {}
    _run_first_block("ensembles.md", namespace)
    ens, anchored, model, X, y = (namespace[k] for k in ("ens", "anchored", "model", "X", "y"))
    for post in (ens, anchored):
        assert not post.diagnostics, post.diagnostics.report()
        assert post.samples["net.0.weight"].shape == (5, 1, 1, 20)
        assert post.predict(model(X)).rmse(y) < 0.5 * y.std()
    assert anchored.settings["anchored_sites"] == [
        f"net.{i}.{k}" for i in (0, 1) for k in ("weight", "bias")
    ]


@pytest.mark.slow  # ~30 s alone (two fits of 2,000 and 1,500 steps, in a fresh JAX process)
def test_scale_page_example_runs_as_written_on_four_devices():
    """docs/scale.md's example in a process with four virtual CPU devices (JAX fixes the count
    when it starts): both fits spread over the four, no diagnostics findings, and the
    posterior mean of w within 5 posterior sds (0.5 / sqrt(512) each) of the weights that made
    the data."""
    import json
    import os
    import subprocess
    import sys

    code = _first_block("scale.md") + (
        "\nimport json\nprint(json.dumps({'devices': [post.settings['device'], "
        "one.settings['device']], 'shard': one.settings['shard'], 'findings': "
        "[f.message for f in post.diagnostics + one.diagnostics], 'means': "
        "[p.samples['w'].mean(axis=(0, 1)).tolist() for p in (post, one)]}))\n"
    )
    env = dict(
        os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu"
    )
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["devices"] == ["cpu:0,cpu:1,cpu:2,cpu:3"] * 2 and result["shard"] == "data"
    assert result["findings"] == []
    for means in result["means"]:
        assert max(abs(means[0] - 1.0), abs(means[1] + 2.0)) < 5 * 0.5 / 512**0.5, means


def test_path_gradient_section_example_runs_as_written():
    namespace: dict = {}
    code = _block_under("inference.md", "### The path-derivative ELBO gradient")
    exec(compile(code, "docs/inference.md (gradient='path')", "exec"), namespace)
    post, mean, cov = (namespace[k] for k in ("post", "mean", "cov"))
    sd = np.sqrt(np.diag(cov))
    assert np.abs(post.guide.params["loc"] - mean).max() < 0.05 * sd.min()


def test_svrg_section_example_runs_as_written():
    namespace: dict = {}
    code = _block_under("inference.md", "### SVRG control variates for SG-MCMC")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # a short run's ESS
        exec(compile(code, "docs/inference.md (SVRG)", "exec"), namespace)
    post, w, cov = (namespace[k] for k in ("post", "w", "cov"))
    assert post.settings["anchor_period"] == 23
    # The page's 1.1 to 1.25 (plain SGLD: 2.1 to 2.8), with room for the Monte Carlo error of
    # 2 x 2,000 correlated draws.
    assert np.all(w.var(0) / np.diag(cov) < 1.6)


# -- the gallery: docs/examples/*.py, each run as a user runs it ----------------------------------

#: Each gallery script, marked slow where it takes over ~20 s of CPU (compilation included;
#: measured on 2 cores: linear_regression 19 s, eight_schools 15, image_classifier 13, ebm 12,
#: vae 21, bnn_regression 34).
GALLERY = [
    "linear_regression",
    pytest.param("bnn_regression", marks=pytest.mark.slow),  # 4 chains of cyclical SGHMC
    "eight_schools",
    "image_classifier",
    "ebm",
    pytest.param("vae", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("name", GALLERY)
def test_gallery_example_runs_and_saves_its_picture(name, tmp_path):
    """The script runs in a fresh interpreter (as ``python docs/examples/NAME.py --out DIR``),
    exits cleanly and writes a non-empty PNG named after itself into ``DIR``."""
    import os
    import subprocess
    import sys

    script = ROOT / "docs" / "examples" / f"{name}.py"
    env = dict(os.environ, MPLBACKEND="Agg", JAX_PLATFORMS="cpu")
    env.setdefault("OMP_NUM_THREADS", "1")  # torch's second thread only waits on a busy 2-core CI
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, str(script), "--out", str(tmp_path)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    picture = tmp_path / f"{name}.png"
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert picture.stat().st_size > 10_000


def test_gallery_page_shows_every_example_and_its_picture():
    """docs/gallery.md includes each script and its committed picture, and nothing is left out."""
    page = (ROOT / "docs" / "gallery.md").read_text()
    scripts = sorted(p.stem for p in (ROOT / "docs" / "examples").glob("*.py"))
    listed = [p.values[0] if hasattr(p, "values") else p for p in GALLERY]
    assert scripts == sorted(listed)
    for name in scripts:
        assert f"examples/{name}.py" in page and f"examples/images/{name}.png" in page
        assert (ROOT / "docs" / "examples" / "images" / f"{name}.png").is_file()


def test_porting_page_runs_as_a_doctest():
    """docs/porting.md's ``pycon`` blocks run, in order, as one doctest and print what the page
    shows (its NumPyro and Pyro forms are plain ``python`` blocks, not run)."""
    blocks = re.findall(r"```pycon\n(.*?)```", (ROOT / "docs" / "porting.md").read_text(), re.S)
    test = doctest.DocTestParser().get_doctest("\n".join(blocks), {}, "porting.md", None, 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    with warnings.catch_warnings():  # the page's one fit is a few steps long
        warnings.simplefilter("ignore", ConvergenceWarning)
        result = runner.run(test)
    assert len(blocks) >= 8 and result.attempted > 20 and result.failed == 0, result
