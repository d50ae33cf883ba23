"""The posteriordb reference models, written once in the DSL with Stan's names.

Each model keeps the names of its Stan program, so a fitted posterior lines up with the reference
means and sds that ship with posteriordb (``theta[1]`` in Stan is ``theta[0]`` here: Stan counts
from 1, arrays from 0). :func:`load` returns the bound model and its reference::

    bound, reference = load("kidiq-kidscore_momiq")

The data is read from ``../shared/data/posteriordb`` next to the repository (override the folder
that holds ``posteriordb/`` with the environment variable ``PPL_BDL_DATA``). The small posteriors
(eight schools, kidiq, arK: :data:`SHIPPED`) also ship with the package, data and reference, so
the demo and the default test suite run without the shared data; diamonds needs it.

Sources: posteriordb (Magnusson et al., 2024, https://github.com/stan-dev/posteriordb); eight
schools from Rubin (1981) and Gelman et al., *Bayesian Data Analysis*, 3rd ed., §5.5.

Example
-------
>>> import ppl_bdl as bdl
>>> from ppl_bdl.models import posteriordb as pdb
>>> bound = pdb.eight_schools_noncentered(**pdb.eight_schools_data())
>>> post = bdl.fit(bound, backend="numpyro", num_warmup=200, num_samples=200, num_chains=1,
...                progress=False)
>>> post.samples["theta"].shape
(1, 200, 8)
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import ppl_bdl as bdl
from ppl_bdl import dist
from ppl_bdl import math as bm
from ppl_bdl.errors import DataError

#: Environment variable naming the folder that holds ``posteriordb/`` (default ../shared/data).
DATA_ENV = "PPL_BDL_DATA"
_PACKAGE_DATA = Path(__file__).resolve().parent / "data"
#: The copy of the small posteriors that ships with the package (see data/README.md).
PACKAGE_DIR = _PACKAGE_DATA / "posteriordb"
#: The posteriors whose data and reference ship with the package.
SHIPPED = (
    "eight_schools-eight_schools_centered",
    "eight_schools-eight_schools_noncentered",
    "kidiq-kidscore_momiq",
    "arK-arK",
)


# -- models ---------------------------------------------------------------------------------------
@bdl.model
def eight_schools_centered(J: int, sigma, y=None):
    """Eight schools, centred: ``theta[j] ~ Normal(mu, tau)`` (a funnel; NUTS may diverge)."""
    mu = bdl.sample("mu", dist.Normal(0.0, 5.0))
    tau = bdl.sample("tau", dist.HalfCauchy(5.0))
    with bdl.plate("school", J) as idx:
        theta = bdl.sample("theta", dist.Normal(mu, tau))
        bdl.sample("y", dist.Normal(theta, sigma[idx]), obs=None if y is None else y[idx])


@bdl.model
def eight_schools_noncentered(J: int, sigma, y=None):
    """Eight schools, non-centred: ``theta = mu + tau * theta_trans``, ``theta_trans ~ N(0, 1)``."""
    mu = bdl.sample("mu", dist.Normal(0.0, 5.0))
    tau = bdl.sample("tau", dist.HalfCauchy(5.0))
    with bdl.plate("school", J) as idx:
        theta_trans = bdl.sample("theta_trans", dist.Normal(0.0, 1.0))
        theta = bdl.deterministic("theta", mu + tau * theta_trans)
        bdl.sample("y", dist.Normal(theta, sigma[idx]), obs=None if y is None else y[idx])


@bdl.model
def kidiq(mom_iq, kid_score=None):
    """kidscore_momiq: ``kid_score ~ Normal(beta[0] + beta[1] * mom_iq, sigma)``, flat ``beta``."""
    beta = bdl.sample("beta", dist.ImproperUniform(), shape=(2,))
    sigma = bdl.sample("sigma", dist.HalfCauchy(2.5))
    with bdl.plate("data", mom_iq.shape[0]) as idx:
        mean = beta[0] + beta[1] * mom_iq[idx]
        bdl.sample(
            "kid_score", dist.Normal(mean, sigma), obs=None if kid_score is None else kid_score[idx]
        )


@bdl.model
def arK(y, K: int):  # noqa: N802 - Stan's name
    """AR(K): ``y[t] ~ Normal(alpha + sum_k beta[k] * y[t-k-1], sigma)`` for t >= K (0-based)."""
    T = y.shape[0]
    alpha = bdl.sample("alpha", dist.Normal(0.0, 10.0))
    beta = bdl.sample("beta", dist.Normal(0.0, 10.0), shape=(K,))
    sigma = bdl.sample("sigma", dist.HalfCauchy(2.5))
    # lags[t - K, k] = y[t - k - 1]
    lags = bm.stack([y[K - k - 1 : T - k - 1] for k in range(K)], axis=-1)
    with bdl.plate("time", T - K) as idx:
        mean = alpha + lags[idx] @ beta
        bdl.sample("y", dist.Normal(mean, sigma), obs=y[K:][idx])


@bdl.model
def diamonds(X, Y=None):
    """diamonds: ``Y ~ Normal(Intercept + Xc @ b, sigma)``, ``Xc`` = X without its intercept
    column, centred; ``b ~ N(0, 1)``, ``Intercept ~ StudentT(3, 8, 10)``,
    ``sigma ~ HalfStudentT(3, 10)``."""
    Xc = X[:, 1:] - bm.mean(X[:, 1:], axis=0)
    b = bdl.sample("b", dist.Normal(0.0, 1.0), shape=(Xc.shape[1],))
    intercept = bdl.sample("Intercept", dist.StudentT(3.0, 8.0, 10.0))
    sigma = bdl.sample("sigma", dist.HalfStudentT(3.0, 10.0))
    with bdl.plate("data", Xc.shape[0]) as idx:
        bdl.sample(
            "Y", dist.Normal(intercept + Xc[idx] @ b, sigma), obs=None if Y is None else Y[idx]
        )


# -- data -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PosteriorEntry:
    """One posteriordb posterior: the DSL model and how its data.json maps to the model's inputs."""

    name: str
    model: Any
    inputs: Callable[[dict], dict]


def _eight_schools_inputs(d: dict) -> dict:
    return {
        "J": int(d["J"]),
        "sigma": np.asarray(d["sigma"], dtype=float),
        "y": np.asarray(d["y"], dtype=float),
    }


POSTERIORS: dict[str, PosteriorEntry] = {
    e.name: e
    for e in (
        PosteriorEntry(
            "eight_schools-eight_schools_centered", eight_schools_centered, _eight_schools_inputs
        ),
        PosteriorEntry(
            "eight_schools-eight_schools_noncentered",
            eight_schools_noncentered,
            _eight_schools_inputs,
        ),
        PosteriorEntry(
            "kidiq-kidscore_momiq",
            kidiq,
            lambda d: {
                "mom_iq": np.asarray(d["mom_iq"], dtype=float),
                "kid_score": np.asarray(d["kid_score"], dtype=float),
            },
        ),
        PosteriorEntry(
            "arK-arK", arK, lambda d: {"y": np.asarray(d["y"], dtype=float), "K": int(d["K"])}
        ),
        PosteriorEntry(
            "diamonds-diamonds",
            diamonds,
            lambda d: {"X": np.asarray(d["X"], dtype=float), "Y": np.asarray(d["Y"], dtype=float)},
        ),
    )
}


def shared_dir() -> Path | None:
    """The shared posteriordb folder: ``$PPL_BDL_DATA/posteriordb`` (or ``$PPL_BDL_DATA`` itself),
    else ``../shared/data/posteriordb`` next to the repository; None when there is none.

    Raises :class:`~ppl_bdl.errors.DataError` when ``PPL_BDL_DATA`` is set but holds no
    posteriordb folder (a setting that points nowhere is a mistake, not a fallback).
    """
    override = os.environ.get(DATA_ENV)
    if override:
        root = Path(override).expanduser()
        candidates = [root / "posteriordb", root]
    else:
        candidates = [
            Path(__file__).resolve().parents[1].parent / "shared" / "data" / "posteriordb"
        ]
    for path in candidates:
        if (path / "kidiq-kidscore_momiq").is_dir() or (path / "README.md").is_file():
            return path
    if override:
        raise DataError(
            f"{DATA_ENV}={override!r} holds no posteriordb folder (looked at "
            f"{' and '.join(str(p) for p in candidates)}). Set it to the folder that holds "
            "posteriordb/, or unset it to use ../shared/data and the posteriors shipped with "
            "the package."
        )
    return None


def data_dir(name: str | None = None) -> Path:
    """The posteriordb folder that holds posterior ``name``: the shared one (see
    :func:`shared_dir`) when it has it, else the copy shipped with the package (:data:`SHIPPED`).
    Without ``name``, the shared folder. Raises :class:`~ppl_bdl.errors.DataError` when neither
    has it, saying where it looked.

    Example
    -------
    >>> from ppl_bdl.models import posteriordb as pdb
    >>> (pdb.data_dir("arK-arK") / "arK-arK" / "data.json").is_file()
    True
    """
    shared = shared_dir()
    if shared is not None and (name is None or (shared / name).is_dir()):
        return shared
    if name is not None and (PACKAGE_DIR / name).is_dir():
        return PACKAGE_DIR
    default = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "posteriordb"
    where = str(shared or default)
    what = f"posterior {name!r}" if name else "the posteriordb reference data"
    shipped = f" (the package ships only {', '.join(SHIPPED)})" if name else ""
    raise DataError(
        f"{what} was not found at {where}{shipped}. Put the shared data folder (holding "
        f"posteriordb/) next to the repository as ../shared/data, or set {DATA_ENV} to the "
        "folder that holds posteriordb/."
    )


def _check_name(name: str) -> PosteriorEntry:
    if name not in POSTERIORS:
        raise DataError(f"unknown posterior {name!r}; known: {sorted(POSTERIORS)}.")
    return POSTERIORS[name]


def load_data(name: str) -> dict:
    """The model inputs of posterior ``name`` (NumPy arrays and ints, keyed by argument name)."""
    entry = _check_name(name)
    with open(data_dir(name) / name / "data.json") as f:
        return entry.inputs(json.load(f))


def load_reference(name: str) -> dict[str, dict[str, float]]:
    """The reference draws' summary: Stan parameter name -> {"mean", "sd"}, plus the run size
    under the key ``"_run"`` ({"n_chains", "n_draws_per_chain"})."""
    _check_name(name)
    with open(data_dir(name) / name / "reference.json") as f:
        raw = json.load(f)
    out = {k: {"mean": float(v["mean"]), "sd": float(v["sd"])} for k, v in raw["params"].items()}
    out["_run"] = {"n_chains": raw["n_chains"], "n_draws_per_chain": raw["n_draws_per_chain"]}
    return out


def load(name: str) -> tuple[Any, dict[str, dict[str, float]]]:
    """The bound model of posteriordb posterior ``name`` and its reference (see
    :func:`load_reference`).

    Example
    -------
    >>> from ppl_bdl.models import posteriordb as pdb
    >>> bound, ref = pdb.load("kidiq-kidscore_momiq")
    >>> round(ref["beta[2]"]["mean"], 2)
    0.61
    """
    entry = _check_name(name)
    return entry.model(**load_data(name)), load_reference(name)


def eight_schools_data() -> dict:
    """Eight schools (J, sigma, y), shipped with the package: no shared data needed."""
    with open(PACKAGE_DIR / "eight_schools-eight_schools_noncentered" / "data.json") as f:
        return _eight_schools_inputs(json.load(f))


_STAN_NAME = re.compile(r"^(?P<site>[A-Za-z_][A-Za-z0-9_.]*)(\[(?P<index>[0-9, ]+)\])?$")


def stan_index(stan_name: str) -> tuple[str, tuple[int, ...]]:
    """Split a Stan name into our site and 0-based index: ``"theta[1]"`` -> ``("theta", (0,))``.

    Example
    -------
    >>> stan_index("beta[2]")
    ('beta', (1,))
    >>> stan_index("sigma")
    ('sigma', ())
    """
    m = _STAN_NAME.match(stan_name)
    if m is None:
        raise DataError(f"cannot parse the Stan parameter name {stan_name!r}.")
    index = m.group("index")
    idx = tuple(int(i) - 1 for i in index.split(",")) if index else ()
    return m.group("site"), idx


def draws_of(samples: dict[str, np.ndarray], stan_name: str) -> np.ndarray:
    """The (chain, draw) draws of Stan parameter ``stan_name`` from ``Posterior.samples``."""
    site, idx = stan_index(stan_name)
    if site not in samples:
        raise DataError(
            f"{stan_name!r}: no site {site!r} in the posterior (sites: {sorted(samples)})."
        )
    return samples[site][(slice(None), slice(None)) + idx]


def examples() -> dict[str, Any]:
    """Small bound models for the conformance suite (eight schools from the package data; the
    others from a small slice of synthetic data of the right form, so no shared data is needed)."""
    es = eight_schools_data()
    rng = np.random.default_rng(0)
    mom_iq = rng.normal(100.0, 15.0, size=30)
    kid = 26.0 + 0.6 * mom_iq + rng.normal(0.0, 18.0, size=30)
    y = np.zeros(40)
    for t in range(2, 40):
        y[t] = 0.5 * y[t - 1] - 0.2 * y[t - 2] + 0.1 * rng.normal()
    X = np.column_stack([np.ones(30), rng.normal(size=(30, 3))])
    Y = 8.0 + X[:, 1:] @ np.array([0.5, -0.2, 0.1]) + 0.1 * rng.normal(size=30)
    return {
        "eight_schools_centered": eight_schools_centered(**es),
        "eight_schools_noncentered": eight_schools_noncentered(**es),
        "kidiq": kidiq((mom_iq - 100.0) / 15.0, kid),
        "arK": arK(y, 2),
        "diamonds": diamonds(X, Y),
    }
