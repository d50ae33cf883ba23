"""``ppl-bdl demo``: a BNN regression and eight schools, each fitted with the method that suits
it, on every installed backend.

The BNN (1-10-1, tanh) is fitted as a deep ensemble (Lakshminarayanan et al. 2017: a few MAP
fits from their own starts, one draw each), whose spread is the epistemic part of its predictive
band; eight schools (non-centred) with NUTS. For each backend the demo prints each fit's time, an
ArviZ summary and its diagnostics report, the BNN's predictive RMSE and mean log predictive
density on held-out points, and eight schools' largest R-hat, divergences and PSIS-LOO; it writes
each posterior to NetCDF and a trace plot, a forest plot and the BNN's predictive band to PNG
files in the output folder. With two or more backends and cores, each backend runs in its own
process (spawned, one thread each), and its report is printed whole when it finishes; ``--sequential``
runs them one after another in this process. ``--full`` adds the BNN fitted by SGHMC and by mean-field VI, with
their own diagnostics (a BNN's weights are not identifiable, so SGHMC's chains disagree in weight
space even where the predictions agree). The data ships with the package (no download).

Example
-------
>>> from ppl_bdl.cli.demo import run_demo
>>> results = run_demo("demo_out", backends=["numpyro"], quick=True)  # doctest: +SKIP
"""

from __future__ import annotations

import multiprocessing
import os
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import ppl_bdl as bdl
from ppl_bdl.models import bnn, posteriordb, regression
from ppl_bdl.posterior.diagnostics import ConvergenceWarning

#: The methods: (BNN, eight schools). ``quick`` is for tests and smoke runs.
SETTINGS = {
    "full": (
        bdl.Ensemble(num_members=4, num_steps=1000, lr=0.01),
        # Long chains: split R-hat's noise at 2 x 750 draws keeps it under 1.01 (0 of 40 seeds
        # over it on NumPyro, against 15 of 40 at 2 x 500 after 500 warmup steps).
        bdl.NUTS(num_warmup=250, num_samples=750, num_chains=2, target_accept=0.9),
    ),
    "quick": (
        bdl.Ensemble(num_members=2, num_steps=200, lr=0.01),
        bdl.NUTS(num_warmup=60, num_samples=60, num_chains=2, max_tree_depth=5),
    ),
}
#: ``--full``: the BNN by the methods that sample or approximate its weights' posterior too.
TOUR = (
    bdl.SGHMC(num_warmup=1000, num_samples=500, num_chains=2, thinning=2),
    bdl.VI(num_steps=3000),
)
BNN_HIDDEN = (10,)


@dataclass
class DemoResult:
    """What the demo measured on one backend (also printed)."""

    backend: str
    bnn_rmse: float
    bnn_log_likelihood: float
    schools_max_rhat: float
    schools_divergences: int
    schools_elpd_loo: float
    seconds: float
    fit_seconds: dict[str, float] = field(default_factory=dict)
    problems: int = 0
    files: list[Path] = field(default_factory=list)


def _split(X: np.ndarray, y: np.ndarray):
    """Every fourth point is held out for the predictive RMSE and log-likelihood."""
    test = np.arange(len(y)) % 4 == 0
    return X[~test], y[~test], X[test], y[test]


def _single_thread_torch(backends: Sequence[str]) -> None:
    # Small models: intra-op threads cost more than they give, and oversubscribe a shared
    # 2-core machine badly. Respect a thread count the user set explicitly.
    if "OMP_NUM_THREADS" not in os.environ:
        for name in backends:
            bdl.backends.get(name).set_threads(1)


def _max_rhat(idata, var_names=None) -> float:
    import arviz as az

    rhat = az.rhat(idata, var_names=var_names)
    return float(max(float(np.nanmax(rhat[v].values)) for v in rhat.data_vars))


#: What eight schools' values are, for the plots' axes (Rubin 1981: coaching effects on SAT scores).
SCHOOLS_UNIT = "effect (SAT points)"


def _trace_figure(idata, backend: str):
    """Eight schools' trace plot: per-chain densities (left) and draws (right) of mu and tau,
    one figure title, a heading per column, every axis labelled."""
    import arviz as az

    names = ["mu", "tau"]
    axes = np.asarray(az.plot_trace(idata, var_names=names, compact=True, legend=True))
    fig = axes.ravel()[0].figure
    # ArviZ titles both panels of a row with the variable's name; the name goes on the value
    # axis instead, and each column says once what it shows.
    for row, name in zip(axes, names, strict=True):
        density, trace = row
        density.set_title("")
        trace.set_title("")
        density.set_xlabel(f"{name}: {SCHOOLS_UNIT}" if name == "mu" else f"{name}: sd of effects")
        density.set_ylabel("density")
        trace.set_xlabel("draw")
        trace.set_ylabel(name)
    axes[0, 0].set_title("posterior density, one line per chain", fontsize=10)
    axes[0, 1].set_title("draws, one line per chain", fontsize=10)
    fig.suptitle(f"eight schools (non-centred), NUTS on {backend}")
    fig.tight_layout()
    return fig


def _forest_figure(idata, backend: str):
    """Eight schools' forest plot: 90% HDI of mu, tau and each school's theta, one title."""
    import arviz as az

    axes = az.plot_forest(idata, var_names=["mu", "tau", "theta"], combined=True, hdi_prob=0.9)
    ax = np.asarray(axes).ravel()[0]
    # ArviZ's own axes title ("90.0% HDI") would repeat the figure's: one title, on the axes.
    ax.set_title(f"eight schools: 90% HDI (thick: 50%), NUTS on {backend}", fontsize=11)
    ax.set_xlabel(f"{SCHOOLS_UNIT}; tau: sd of the schools' effects")
    return ax.figure


def _band_figure(pred, X_train, y_train, X_test, y_test, grid, backend: str):
    """The BNN's predictive mean with ±2 sd bands (total and epistemic) and the data."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    x = grid[:, 0]
    ax.fill_between(
        x, pred.mean - 2 * pred.sd, pred.mean + 2 * pred.sd, alpha=0.3, label="±2 sd (total)"
    )
    epistemic = np.sqrt(pred.epistemic)
    ax.fill_between(
        x,
        pred.mean - 2 * epistemic,
        pred.mean + 2 * epistemic,
        alpha=0.4,
        label="±2 sd (epistemic)",
    )
    ax.plot(x, pred.mean, label="predictive mean")
    ax.scatter(X_train[:, 0], y_train, s=8, c="k", label="train")
    ax.scatter(X_test[:, 0], y_test, s=12, c="tab:red", marker="x", label="held out")
    ax.set_title(f"BNN regression {[1, *BNN_HIDDEN, 1]}, deep ensemble on {backend}")
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    return fig


def _save_plots(idata, bnn_pred, X_train, y_train, X_test, y_test, grid, out: Path, backend: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures = {
        "eight_schools_trace": _trace_figure(idata, backend),
        "eight_schools_forest": _forest_figure(idata, backend),
        "bnn_predictive": _band_figure(bnn_pred, X_train, y_train, X_test, y_test, grid, backend),
    }
    files = []
    for name, fig in figures.items():
        files.append(out / f"{backend}_{name}.png")
        fig.savefig(files[-1], dpi=80, bbox_inches="tight")
        plt.close(fig)
    return files


def _echo_diagnostics(post, echo: Callable) -> None:
    """The fit's diagnostics report (``post.diagnostics``; "no problems found" when clean)."""
    echo(f"diagnostics of the {post.method} fit:\n{post.diagnostics.report()}")


def _fit(bound, backend: str, method, seed: int, echo: Callable, label: str):
    """One fit, timed; its report is printed (not warned) with the summary."""
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        post = bdl.fit(bound, backend=backend, method=method, seed=seed, progress=False)
    seconds = time.perf_counter() - start
    echo(f"{label}: {type(method).__name__} fit in {seconds:.1f} s")
    return post, seconds


def _bnn(backend: str, method, seed: int, echo: Callable, label: str = "BNN"):
    """The BNN fitted by ``method``: the posterior, its held-out scores and the fit's time."""
    X, y = regression.sine_data()
    X_train, y_train, X_test, y_test = _split(X, y)
    model = bnn.make_bnn_regression(hidden=BNN_HIDDEN)
    post, seconds = _fit(model(X_train, y_train), backend, method, seed, echo, label)
    held_out = post.predict(model(X_test), seed=seed)
    rmse, loglik = held_out.rmse(y_test), held_out.log_likelihood(y_test)
    echo(post.summary(var_names=["sigma"]).to_string())
    _echo_diagnostics(post, echo)
    echo(f"held-out RMSE {rmse:.3f}, mean log predictive density {loglik:.3f}")
    return post, (rmse, loglik), seconds


def _schools(backend: str, method, seed: int, echo: Callable):
    """Eight schools fitted by ``method``: the posterior, R-hat, divergences, PSIS-LOO, time."""
    import arviz as az

    schools = posteriordb.eight_schools_noncentered(**posteriordb.eight_schools_data())
    spost, seconds = _fit(schools, backend, method, seed, echo, "eight schools (non-centred)")
    idata = spost.to_arviz()
    echo(spost.summary(var_names=["mu", "tau", "theta"]).to_string())
    _echo_diagnostics(spost, echo)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eight points: Pareto-k warnings are expected
        elpd = float(az.loo(idata).elpd_loo)
    rhat = _max_rhat(idata, ["mu", "tau", "theta_trans"])
    divergences = int(np.sum(spost.sample_stats["diverging"]))
    echo(f"max R-hat {rhat:.3f}, divergences {divergences}, PSIS-LOO elpd {elpd:.2f}")
    return spost, idata, (rhat, divergences, elpd), seconds


def run_backend(
    backend: str,
    out: Path,
    quick: bool = False,
    seed: int = 0,
    echo: Callable = print,
    full: bool = False,
) -> DemoResult:
    """Fit both demo models on ``backend``; write the NetCDF and PNG files into ``out``."""
    bnn_method, schools_method = SETTINGS["quick" if quick else "full"]
    start = time.perf_counter()
    echo(f"\n=== backend: {backend} ===")
    post, (rmse, loglik), bnn_seconds = _bnn(backend, bnn_method, seed, echo)
    times = {"bnn": bnn_seconds}
    problems = len(post.diagnostics)
    files = [post.save(out / f"{backend}_bnn_regression.nc")]
    X, y = regression.sine_data()
    X_train, y_train, X_test, y_test = _split(X, y)
    grid = np.linspace(-4.0, 4.0, 100)[:, None]
    band = post.predict(bnn.make_bnn_regression(hidden=BNN_HIDDEN)(grid), seed=seed)
    echo("")
    spost, idata, (rhat, divergences, elpd), times["eight_schools"] = _schools(
        backend, schools_method, seed, echo
    )
    problems += len(spost.diagnostics)
    files.append(spost.save(out / f"{backend}_eight_schools.nc"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # ArviZ 0.x on new matplotlib
        files += _save_plots(idata, band, X_train, y_train, X_test, y_test, grid, out, backend)
    for method in TOUR if full else ():
        echo("")
        label = f"BNN, {type(method).__name__}"
        times[type(method).__name__] = _bnn(backend, method, seed, echo, label)[2]
    seconds = time.perf_counter() - start
    echo(f"{backend}: {seconds:.1f} s; wrote " + ", ".join(f.name for f in files))
    return DemoResult(
        backend, rmse, loglik, rhat, divergences, elpd, seconds, times, problems, files
    )


def run_demo(
    out: str | Path = "ppl_bdl_demo",
    backends: Sequence[str] | None = None,
    quick: bool = False,
    seed: int = 0,
    echo: Callable = print,
    full: bool = False,
    sequential: bool = False,
) -> list[DemoResult]:
    """Run the demo on ``backends`` (default: every installed backend); return what it measured.
    Each backend runs in a process of its own where there are two or more of both backends and
    cores, unless ``sequential``."""
    installed = bdl.backends.available()
    backends = list(backends) if backends else installed
    for name in backends:
        bdl.backends.get(name)  # unknown / missing backends: a clear error before any work
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    echo(f"ppl_bdl {bdl.__version__} demo: backends {backends}; output folder {out}")
    start = time.perf_counter()
    if sequential or len(backends) < 2 or (os.cpu_count() or 1) < 2:
        _single_thread_torch(backends)
        results = [run_backend(name, out, quick, seed, echo, full) for name in backends]
    else:
        results = _run_in_processes(backends, out, quick, seed, echo, full)
    _echo_summary(results, time.perf_counter() - start, out, echo)
    return results


def _run_in_processes(backends, out: Path, quick: bool, seed: int, echo: Callable, full: bool):
    """Each backend in a spawned process of its own; each one's report echoed whole, in order."""
    echo("each backend runs in a process of its own; their reports follow as they finish")
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(len(backends), mp_context=context) as pool:
        futures = [
            pool.submit(_run_backend_quietly, name, out, quick, seed, full) for name in backends
        ]
        results = []
        for future in futures:
            result, lines = future.result()
            for line in lines:
                echo(line)
            results.append(result)
    return results


def _run_backend_quietly(backend: str, out: Path, quick: bool, seed: int, full: bool):
    """:func:`run_backend` in a worker process: its result and the lines it would have printed."""
    _single_thread_torch([backend])
    lines: list[str] = []
    return run_backend(backend, out, quick, seed, lines.append, full), lines


def _echo_summary(results: list[DemoResult], seconds: float, out: Path, echo: Callable) -> None:
    echo("\n=== summary ===")
    echo(
        f"{'backend':<9} {'BNN RMSE':>9} {'BNN LPD':>8} {'8s R-hat':>8} {'div':>4} {'elpd':>7} "
        f"{'problems':>8} {'time':>6}"
    )
    for r in results:
        echo(
            f"{r.backend:<9} {r.bnn_rmse:9.3f} {r.bnn_log_likelihood:8.3f} "
            f"{r.schools_max_rhat:8.3f} {r.schools_divergences:4d} {r.schools_elpd_loo:7.2f} "
            f"{r.problems:8d} {r.seconds:5.1f}s"
        )
    echo(f"all backends: {seconds:.1f} s; files in {out}")
