"""NUTS on every backend against posteriordb's reference posteriors.

For every parameter of the reference (Stan names, ``theta[1]`` is our ``theta[0]``):

* the mean is within 4 Monte Carlo standard errors of the reference mean. The difference of the
  two means has variance ``sd² / ESS + sd² / N_ref``: ``sd² / ESS`` for our estimate (``ESS`` the
  effective sample size for the mean of our run, ArviZ ``ess(method="mean")``, Vehtari et al. 2021)
  plus ``sd² / N_ref`` for the reference's own estimate (``N_ref`` = 10 chains × 1000 thinned,
  nearly independent Stan draws). ``sd`` is the reference sd;
* the sd is within 10% of the reference sd (our run's sd has a relative Monte Carlo error of about
  ``sqrt((kurtosis - 1) / (4 ESS))``, 1-3% here, so 10% leaves room for heavy tails such as tau's);
* R-hat < 1.01 and ESS >= 400, so a bad run fails loudly instead of passing by luck.

NumPyro runs by default; Pyro's NUTS (driven through the core's potential in Python) is slower
and runs under ``-m slow``, as does diamonds. The small posteriors' data and references ship with
the package (a fresh clone runs these tests); diamonds needs the shared data folder and skips,
saying so, without it.
"""

from __future__ import annotations

import arviz as az
import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl.models import posteriordb as pdb

# Settings per posterior: kidiq and arK have strongly correlated posteriors (kidiq's intercept and
# slope: corr ~ -0.99 with mom_iq ~ 100), where a dense mass matrix shortens the trees on both
# backends. Eight schools' tau is heavy-tailed, so its sd needs more draws.
SETTINGS = {
    "eight_schools-eight_schools_noncentered": dict(
        num_warmup=1000, num_samples=2500, num_chains=4
    ),
    "kidiq-kidscore_momiq": dict(num_warmup=1000, num_samples=1000, num_chains=4, dense_mass=True),
    "arK-arK": dict(num_warmup=1000, num_samples=1000, num_chains=4, dense_mass=True),
    "diamonds-diamonds": dict(num_warmup=1000, num_samples=1000, num_chains=4, dense_mass=True),
}
PYRO_SETTINGS = {
    "eight_schools-eight_schools_noncentered": dict(num_warmup=500, num_samples=2000, num_chains=4),
    "kidiq-kidscore_momiq": dict(num_warmup=500, num_samples=1000, num_chains=4, dense_mass=True),
    "arK-arK": dict(num_warmup=500, num_samples=1000, num_chains=4, dense_mass=True),
}


def check_against_reference(post: bdl.Posterior, reference: dict) -> list[str]:
    """Every failed check, as a readable line (empty when the posterior matches)."""
    n_ref = reference["_run"]["n_chains"] * reference["_run"]["n_draws_per_chain"]
    failures = []
    for stan_name, ref in reference.items():
        if stan_name.startswith("_"):
            continue
        draws = pdb.draws_of(post.samples, stan_name)
        ess = float(az.ess(draws, method="mean"))
        rhat = float(az.rhat(draws))
        mean, sd = float(draws.mean()), float(draws.std(ddof=1))
        mcse = ref["sd"] * np.sqrt(1.0 / ess + 1.0 / n_ref)
        z = (mean - ref["mean"]) / mcse
        rel_sd = sd / ref["sd"] - 1.0
        line = (
            f"{stan_name}: mean {mean:.4g} vs {ref['mean']:.4g} ({z:+.2f} MCSE), sd {sd:.4g} vs "
            f"{ref['sd']:.4g} ({100 * rel_sd:+.1f}%), ESS {ess:.0f}, R-hat {rhat:.3f}"
        )
        if abs(z) > 4.0 or abs(rel_sd) > 0.10 or rhat > 1.01 or ess < 400:
            failures.append(line)
    return failures


def _fit_and_check(name: str, backend: str, settings: dict) -> None:
    bound, reference = pdb.load(name)
    post = bdl.fit(bound, backend=backend, method="nuts", seed=0, progress=False, **settings)
    failures = check_against_reference(post, reference)
    assert not failures, f"{name} on {backend}:\n" + "\n".join(failures)


@pytest.mark.parametrize(
    "name", ["eight_schools-eight_schools_noncentered", "kidiq-kidscore_momiq", "arK-arK"]
)
def test_numpyro_matches_reference(name):
    if "numpyro" not in bdl.backends.available():
        pytest.xfail("the numpyro backend is not installed (pip install 'ppl_bdl[numpyro]')")
    _fit_and_check(name, "numpyro", SETTINGS[name])


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", ["eight_schools-eight_schools_noncentered", "kidiq-kidscore_momiq", "arK-arK"]
)
def test_pyro_matches_reference(name):
    if "pyro" not in bdl.backends.available():
        pytest.xfail("the pyro backend is not installed (pip install 'ppl_bdl[pyro]')")
    _fit_and_check(name, "pyro", PYRO_SETTINGS[name])


@pytest.mark.slow
@pytest.mark.usefixtures("shared_data")
def test_diamonds_numpyro_matches_reference():
    if "numpyro" not in bdl.backends.available():
        pytest.xfail("the numpyro backend is not installed (pip install 'ppl_bdl[numpyro]')")
    _fit_and_check("diamonds-diamonds", "numpyro", SETTINGS["diamonds-diamonds"])


def _check_names_map_to_sites(name: str) -> None:
    from ppl_bdl.trace.layout import trace_model

    bound, reference = pdb.load(name)
    backend = bdl.backends.get(bdl.backends.available()[0])
    sites = trace_model(bound, backend)
    for stan_name in reference:
        if stan_name.startswith("_"):
            continue
        site, index = pdb.stan_index(stan_name)
        assert site in sites, (name, stan_name)
        shape = np.shape(backend.to_numpy(sites[site].value))
        assert len(index) == len(shape) and all(i < n for i, n in zip(index, shape, strict=True))


@pytest.mark.parametrize("name", pdb.SHIPPED)
def test_reference_names_map_to_our_sites(name):
    _check_names_map_to_sites(name)


@pytest.mark.usefixtures("shared_data")
@pytest.mark.parametrize("name", sorted(set(pdb.POSTERIORS) - set(pdb.SHIPPED)))
def test_shared_reference_names_map_to_our_sites(name):
    _check_names_map_to_sites(name)


def test_shipped_posteriors_load_without_the_shared_folder(monkeypatch):
    monkeypatch.setattr(pdb, "shared_dir", lambda: None)  # a fresh clone: no ../shared
    for name in pdb.SHIPPED:
        bound, reference = pdb.load(name)
        assert pdb.data_dir(name) == pdb.PACKAGE_DIR and reference["_run"]["n_chains"] == 10
    with pytest.raises(
        bdl.DataError, match=r"posterior 'diamonds-diamonds' was not found at .*shared"
    ):
        pdb.load("diamonds-diamonds")
    assert (pdb.PACKAGE_DIR / "LICENSE.md").read_text().startswith("BSD 3-Clause License")


def test_a_data_setting_that_points_nowhere_is_an_error(monkeypatch, tmp_path):
    monkeypatch.setenv(pdb.DATA_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(bdl.DataError, match="PPL_BDL_DATA=.*holds no posteriordb folder"):
        pdb.load("arK-arK")


def test_shipped_copies_equal_the_shared_ones(shared_data):
    for name in pdb.SHIPPED:
        for file in ("data.json", "reference.json"):
            shipped = (pdb.PACKAGE_DIR / name / file).read_bytes()
            assert shipped == (shared_data / "posteriordb" / name / file).read_bytes(), (name, file)


def test_stan_index():
    assert pdb.stan_index("theta[1]") == ("theta", (0,))
    assert pdb.stan_index("Intercept") == ("Intercept", ())
    with pytest.raises(bdl.DataError):
        pdb.stan_index("theta[")
