"""Coordinate-ascent variational inference (CAVI) for conditionally conjugate models.

``fit(bound, method="cavi")`` recognises the model's conjugate structure by probing it
(:mod:`.conjugacy`: Normal-Normal with an affine mean, Normal-Gamma, InverseGamma variances,
Dirichlet-Categorical, and Gaussian mixtures with Categorical assignments as in Section 4.4 of
"Advancements in Variational Inference"), then maximises the ELBO over the mean-field family (Eq. 38-39 of "Advancements in Variational Inference") one
factor at a time, each in closed form (Eq. 47-49; the updates in :mod:`.cavi_updates`), until
the ELBO's relative change is below ``tol`` or ``num_steps`` sweeps have run. Another model is
refused with a ConfigError naming the latent site whose complete conditional is not conjugate.

Each sweep is one compiled call on the fit's backend and device (``backend.jit``), with the
data passed in; the ELBO comes back to the host after each sweep for the stopping rule and the
check that it never falls (CAVI is coordinate ascent: a fall beyond float rounding is a bug and
raises :class:`~ppl_bdl.errors.InferenceError`).

The result is a :class:`~ppl_bdl.posterior.posterior.Posterior` as VI's: ``num_samples`` draws from the
fitted q (the assignments drawn from their q too), ``post.guide`` the fitted factors
(:class:`~.cavi_factors.CAVIFactors`: ``params[site]``), ``post.losses`` the negative ELBO
after each sweep, ``post.settings["steps_run"]``, ``["converged"]`` and ``["elbo"]`` (with
``restarts``: ``["start_elbos"]`` and ``["best_start"]``).

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import dist
>>> @bdl.model
... def normal_gamma(y):
...     prec = bdl.sample("prec", dist.Gamma(2.0, 2.0))
...     mu = bdl.sample("mu", dist.Normal(0.0, 10.0))
...     with bdl.plate("data", y.shape[0]) as idx:
...         bdl.sample("y", dist.Normal(mu, 1.0 / bdl.math.sqrt(prec)), obs=y[idx])
>>> y = np.random.default_rng(0).normal(3.0, 0.5, size=100)
>>> post = bdl.fit(normal_gamma(y), backend="numpyro", method="cavi", num_samples=200,
...                progress=False, precision="float64")
>>> bool(np.all(np.diff(-post.losses) >= 0)), post.settings["converged"]
(True, True)
>>> round(float(post.guide.params["mu"]["loc"]), 2), post.samples["prec"].shape
(3.04, (1, 200))
"""

from __future__ import annotations

import numpy as np

from ppl_bdl.errors import InferenceError, RunInterrupted
from ppl_bdl.inference.cavi.conjugacy import recognise
from ppl_bdl.inference.cavi.factors import CAVIFactors
from ppl_bdl.inference.cavi.updates import CAVIProgram
from ppl_bdl.inference.common import Setup, build_posterior
from ppl_bdl.inference.loop.driver import progress_bar

#: Sweeps at most (``num_steps``).
DEFAULT_NUM_STEPS = 1000
#: The ELBO may fall by this many machine epsilons of its size before a sweep counts as a fall
#: (rounding: the ELBO is a sum over every element of the data).
ROUNDING_EPS = 1000.0
_EPS = {"float32": float(np.finfo(np.float32).eps), "float64": float(np.finfo(np.float64).eps)}


def default_tol(precision: str) -> float:
    """The default ``tol``: 1e-8 relative change of the ELBO, or 100 machine epsilons where that
    is larger (float32: 1.2e-5), below which the change is rounding."""
    return max(1e-8, 100.0 * _EPS[precision])


def run_cavi(
    setup: Setup,
    num_samples: int,
    seed: int,
    progress: bool = False,
    log_likelihood: bool = True,
    *,
    num_steps: int = DEFAULT_NUM_STEPS,
    tol: float,
    restarts: int = 1,
):
    """Fit ``setup``'s model by CAVI; a :class:`~ppl_bdl.posterior.posterior.Posterior` (see
    the module). The settings are checked by :class:`~ppl_bdl.inference.cavi.method.CAVI`:
    ``num_steps`` (the most sweeps), ``tol`` (stop when ``(ELBO_t − ELBO_{t−1}) / |ELBO_t| <
    tol``), ``restarts`` (runs from that many starts, seeds ``seed``, ``seed + 1``, ..., and
    keeps the one with the highest final ELBO; CAVI, like EM, reaches a local optimum, and the
    starts of a mixture differ in where its component means begin).
    """
    backend = setup.backend
    program = CAVIProgram(recognise(setup, seed), backend)
    runs = []
    for start in range(restarts):
        runs.append(_iterate(program, backend, num_steps, float(tol), seed + start, progress))
        if runs[-1][2] is not None:  # a failure or Ctrl-C: stop there, and say so
            break
    failure = runs[-1][2]
    interrupted = failure is not None and failure[0] == "interrupted"
    runs = [run for run in runs if run[1] is not None]  # Ctrl-C may stop one before its start
    if not runs:
        raise RunInterrupted(f"{failure[1]} No sweep had run: error.partial is None.")
    finals = [run[0][-1] if run[0] else -np.inf for run in runs]
    failed = failure is not None and not interrupted
    pick = len(runs) - 1 if failed else int(np.argmax(finals))
    elbos, state = runs[pick][:2]
    factors = CAVIFactors(program.latents, _host(backend, state), setup.layout, backend)
    losses = -np.asarray(elbos, dtype=float)
    converged = len(elbos) >= 2 and abs(elbos[-1] - elbos[-2]) <= tol * abs(elbos[-1])
    setup.settings.update(
        num_steps=num_steps,
        tol=float(tol),
        steps_run=len(elbos),
        converged=bool(converged),
        elbo=float(elbos[-1]) if elbos else None,
        restarts=restarts,
        best_start=pick,
        start_elbos=[float(f) for f in finals],
    )
    draws = factors.sample(num_samples, seed=seed + 1)
    discrete = {n: draws[n][None] for n in setup.layout.discrete}
    post = build_posterior(
        setup,
        factors.unconstrain(draws)[None],
        {},
        method="cavi",
        guide=factors,
        losses=losses,
        log_likelihood=log_likelihood,
        discrete=discrete,
    )
    if interrupted:
        raise RunInterrupted(
            f"{failure[1]} The factors of the start with the highest ELBO so far (start {pick}, "
            f"{len(elbos)} sweeps) are in error.partial.",
            partial=post,
        )
    if failure is not None:
        raise InferenceError(failure[1], partial=post)
    return post


def _iterate(program: CAVIProgram, backend, num_steps: int, tol: float, seed: int, progress: bool):
    """Sweeps until the relative change of the ELBO is below ``tol``; (ELBOs, last state (None:
    Ctrl-C before the first), None or ``(reason, message)`` of a failure: "failed" (a
    non-finite ELBO, or one that fell) or "interrupted" (Ctrl-C))."""
    elbos: list[float] = []
    bar = progress_bar(num_steps, "cavi") if progress else None
    failure, state = None, None
    try:
        with backend.scope(), backend.activate():
            consts = program.constants()
            state = program.initial_state(np.random.default_rng(seed))
            sweep = backend.jit(program.sweep)
            for step in range(num_steps):
                new_state, value = sweep(state, consts)
                value = float(backend.to_numpy(value))
                if not np.isfinite(value):
                    failure = (
                        "failed",
                        (
                            f"CAVI stopped at sweep {step}: the ELBO is {value}. The factors "
                            "from before it are kept in error.partial. Try precision="
                            "'float64', or check the priors (a prior scale of 0?)."
                        ),
                    )
                    break
                slack = ROUNDING_EPS * _EPS[backend.precision] * max(1.0, abs(value))
                if elbos and value < elbos[-1] - slack:
                    failure = (
                        "failed",
                        (
                            f"CAVI's ELBO fell at sweep {step}, from {elbos[-1]:.10g} to "
                            f"{value:.10g}: a coordinate-ascent sweep cannot lower it, so "
                            "this is rounding (try precision='float64') or a bug (please "
                            "report it). The factors from before it are in error.partial."
                        ),
                    )
                    break
                state = new_state
                elbos.append(value)
                if bar is not None:
                    bar.update(1)
                if len(elbos) >= 2 and abs(value - elbos[-2]) <= tol * abs(value):
                    break
    except KeyboardInterrupt:
        failure = "interrupted", f"CAVI was interrupted at sweep {len(elbos)}."
    finally:
        if bar is not None:
            bar.close()
    return elbos, state, failure


def _host(backend, state: dict) -> dict:
    return {n: {k: backend.to_numpy(v) for k, v in s.items()} for n, s in state.items()}
