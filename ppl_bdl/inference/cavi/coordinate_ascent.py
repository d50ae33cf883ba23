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

from ppl_bdl.errors import ConfigError, InferenceError
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


def check_cavi_call(num_chains=None, num_warmup=None, thinning=None, init=None) -> None:
    """``fit``'s options that do not apply to CAVI, refused before anything runs."""
    if num_chains not in (None, 1):
        raise ConfigError(
            f"num_chains={num_chains!r} does not apply to method='cavi': CAVI fits one q. "
            "Leave num_chains out, or run several fits with different seeds (each seed starts "
            "from other random responsibilities)."
        )
    given = sorted(
        k
        for k, v in dict(num_warmup=num_warmup, thinning=thinning, init=init).items()
        if v is not None
    )
    if given:
        raise ConfigError(
            f"option(s) {', '.join(given)}: does not apply to method='cavi': CAVI runs sweeps of "
            "closed-form updates (no warmup, no chain to thin) from every factor's prior and "
            "random responsibilities drawn from seed. Leave them out (change seed to start "
            "elsewhere)."
        )


def run_cavi(
    setup: Setup,
    num_samples: int,
    seed: int,
    progress: bool = False,
    log_likelihood: bool = True,
    **options,
):
    """Fit ``setup``'s model by CAVI; a :class:`~ppl_bdl.posterior.posterior.Posterior` (see the module).

    Options: ``num_steps`` (the most sweeps, default :data:`DEFAULT_NUM_STEPS`), ``tol`` (stop
    when ``(ELBO_t − ELBO_{t−1}) / |ELBO_t| < tol``; default :func:`default_tol`), ``restarts``
    (default 1: runs from that many starts, seeds ``seed``, ``seed + 1``, ..., and keeps the
    one with the highest final ELBO; CAVI, like EM, reaches a local optimum, and the starts of
    a mixture differ in where its component means begin).
    """
    unknown = sorted(set(options) - {"num_steps", "tol", "restarts"})
    if unknown:
        raise ConfigError(
            f"unknown option(s) {unknown} for method='cavi'; expected some of ['num_steps', "
            "'restarts', 'tol'] (its updates are closed-form: no optimizer, learning rate or "
            "batch size)."
        )
    restarts = options.get("restarts", 1)
    if isinstance(restarts, bool) or not isinstance(restarts, int) or restarts < 1:
        raise ConfigError(f"restarts must be an int >= 1 (starts of CAVI), got {restarts!r}.")
    num_steps = options.get("num_steps", DEFAULT_NUM_STEPS)
    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
        raise ConfigError(f"num_steps must be an int >= 1 (sweeps of CAVI), got {num_steps!r}.")
    be = setup.backend
    tol = options.get("tol", default_tol(be.precision))
    if isinstance(tol, bool) or not isinstance(tol, int | float) or not tol > 0:
        raise ConfigError(f"tol must be a number > 0 (a relative change of the ELBO), got {tol!r}.")
    program = CAVIProgram(recognise(setup, seed), be)
    runs = []
    for start in range(restarts):
        runs.append(_iterate(program, be, num_steps, float(tol), seed + start, progress))
        if runs[-1][2] is not None:  # a failure: stop there, and say so
            break
    finals = [run[0][-1] if run[0] else -np.inf for run in runs]
    pick = len(runs) - 1 if runs[-1][2] is not None else int(np.argmax(finals))
    elbos, state, failure = runs[pick]
    factors = CAVIFactors(program.latents, _host(be, state), setup.layout, be)
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
    if failure is not None:
        raise InferenceError(failure, partial=post)
    return post


def _iterate(program: CAVIProgram, be, num_steps: int, tol: float, seed: int, progress: bool):
    """Sweeps until the relative change of the ELBO is below ``tol``; (ELBOs, last state, None
    or the message of a failure: a non-finite ELBO, or one that fell)."""
    elbos: list[float] = []
    bar = progress_bar(num_steps, "cavi") if progress else None
    failure = None
    try:
        with be.scope(), be.activate():
            consts = program.constants()
            state = program.initial_state(np.random.default_rng(seed))
            sweep = be.jit(program.sweep)
            for step in range(num_steps):
                new_state, value = sweep(state, consts)
                value = float(be.to_numpy(value))
                if not np.isfinite(value):
                    failure = (
                        f"CAVI stopped at sweep {step}: the ELBO is {value}. The factors "
                        "from before it are kept in error.partial. Try precision="
                        "'float64', or check the priors (a prior scale of 0?)."
                    )
                    break
                slack = ROUNDING_EPS * _EPS[be.precision] * max(1.0, abs(value))
                if elbos and value < elbos[-1] - slack:
                    failure = (
                        f"CAVI's ELBO fell at sweep {step}, from {elbos[-1]:.10g} to "
                        f"{value:.10g}: a coordinate-ascent sweep cannot lower it, so "
                        "this is rounding (try precision='float64') or a bug (please "
                        "report it). The factors from before it are in error.partial."
                    )
                    break
                state = new_state
                elbos.append(value)
                if bar is not None:
                    bar.update(1)
                if len(elbos) >= 2 and abs(value - elbos[-2]) <= tol * abs(value):
                    break
    finally:
        if bar is not None:
            bar.close()
    return elbos, state, failure


def _host(be, state: dict) -> dict:
    return {n: {k: be.to_numpy(v) for k, v in s.items()} for n, s in state.items()}
