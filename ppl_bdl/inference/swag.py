"""SWA-Gaussian: ``fit(bound, method="swag")``, a Gaussian fitted to the iterates of SGD.

SWAG (Maddox, Izmailov, Garipov, Vetrov & Wilson, *A Simple Baseline for Bayesian Uncertainty
in Deep Learning*, NeurIPS 2019, Sec. 4 and Algorithm 1) runs SGD on the model's potential
U(θ) = −log p(θ, D) − log|J| in the unconstrained space (momentum SGD by default; the
likelihood minibatched and scaled by N/B, as an ensemble's members are:
:mod:`ppl_bdl.inference.ensemble`), and after a burn-in of ``swa_start`` steps collects every
``collect_every`` steps the new iterate θ_i into

- the running first moment θ̄ = (1/n) Σ θ_i (the SWA solution of Izmailov et al. 2018),
- the running second moment θ̄² = (1/n) Σ θ_i² (elementwise; Sec. 4.1, SWAG-Diagonal),
- the last ``rank`` = K deviations D_i = θ_i − θ̄_i, θ̄_i the running mean after θ_i (Sec. 4.2;
  a ring buffer: the oldest column is replaced).

The approximate posterior is N(θ̄, ½(Σ_diag + D Dᵀ/(K − 1))), Σ_diag = max(θ̄² − θ̄², 0)
(Sec. 4.2, "SWAG: Low Rank plus Diagonal Covariance Structure"), and a draw is

    θ = θ̄ + (1/√2) Σ_diag^½ z₁ + (1/√(2(K − 1))) D z₂,   z₁ ~ N(0, I_d), z₂ ~ N(0, I_K),

mapped to the constrained sites as every method's draws are. The collection runs inside the
compiled step (masked arithmetic on the step counter: no host round trip per step); the run is
a :class:`~ppl_bdl.backend_protocol.Transition` of the one driver
(:func:`~ppl_bdl.inference.loop.driver.run_chains`) whose state is the position, the
optimizer's state and the moments.

``schedule="cyclical"`` is SWA's cyclical rate (Izmailov, Podoprikhin, Garipov, Vetrov &
Wilson 2018, Sec. 3): after ``swa_start`` each cycle of ``collect_every`` steps falls linearly
from ``lr`` to ``decay × lr``, α(i) = (1 − t(i)) α₁ + t(i) α₂ with t(i) = (mod(i − 1, c) + 1)/c,
and the iterate is collected at the cycle's end, where the rate is lowest; the burn-in runs at
``lr``. ``schedule="constant"`` keeps ``lr`` throughout.

``num_chains`` independent SWAG runs (each from its own start and minibatch order) are
MultiSWAG (Wilson & Izmailov 2020): the posterior is the equal mixture of the runs'
Gaussians, ``num_samples`` draws from each run, one chain per run. The runs run side by side
in one process (where the backend vectorises chains); an executor does not split them.

``post.guide`` is the fitted :class:`SWAGApproximation`: the moments of every run
(``post.guide.params``) and the SWA solution θ̄ as a Posterior with one draw per run
(``post.guide.swa``: its constrained sites, ``predict`` with it).

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl.models import bnn, regression
>>> X, y = regression.sine_data()
>>> model = bnn.make_bnn_regression(hidden=(10,))
>>> post = bdl.fit(model(X, y), backend="numpyro", method="swag", num_steps=400, swa_start=200,
...                collect_every=5, rank=10, lr=1e-4, num_samples=50, progress=False)
>>> post.samples["net.0.weight"].shape          # one SWAG run: one chain of draws
(1, 50, 1, 10)
>>> post.guide.params["deviations"].shape       # (run, rank, unconstrained dimension)
(1, 10, 32)
>>> post.guide.swa.samples["net.0.weight"].shape  # the SWA solution, one draw per run
(1, 1, 1, 10)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ppl_bdl.backend_protocol import Transition
from ppl_bdl.dsl import math as bm
from ppl_bdl.errors import ConfigError, InferenceError, RunInterrupted
from ppl_bdl.inference.ensemble import EnsembleConfig, MAPTraining, traced_potential
from ppl_bdl.inference.loop.driver import Rates, RunResult, plan_run, run_chains
from ppl_bdl.inference.loop.minibatch import EpochBatches
from ppl_bdl.inference.method import (
    check_int,
    check_number,
    check_params,
    option,
)
from ppl_bdl.inference.posterior_from_draws import build_posterior
from ppl_bdl.inference.setup import Setup, minibatch_plate
from ppl_bdl.inference.starts import initial_positions
from ppl_bdl.optim import OptimizerConfig

SCHEDULES = ("constant", "cyclical")


# -- the moments, in the compiled step ----------------------------------------------------------
def init_moments(m: Any, position: Any, rank: int) -> dict:
    """Empty moments shaped like ``position`` (d,): ``count`` 0, ``mean`` and ``sq_mean`` (d,),
    ``deviations`` (rank, d), all zero, in ``position``'s dtype (``m``: a backend's math)."""
    zero = position * 0.0
    return {
        "count": m.sum(zero),
        "mean": zero,
        "sq_mean": zero,
        "deviations": m.stack([zero] * rank),
    }


def collect_moments(m: Any, moments: dict, theta: Any, collect: Any) -> dict:
    """The moments after iterate ``theta`` (d,) where ``collect`` is 1.0, unchanged where it is
    0.0 (Maddox et al. 2019, Algorithm 1): n ← n + 1, θ̄ ← θ̄ + (θ − θ̄)/n, θ̄² ← θ̄² + (θ² −
    θ̄²)/n, and θ − θ̄ (the updated θ̄) written to column n mod K of the deviations, the
    oldest. Masked arithmetic, no branch: it runs inside a compiled step.

    Example
    -------
    >>> import numpy as np, ppl_bdl as bdl
    >>> backend = bdl.backends.get("numpyro")
    >>> with backend.activate():
    ...     m = backend.math
    ...     moments = init_moments(m, m.zeros(2), rank=2)
    ...     for value, collect in [(1.0, 1.0), (5.0, 0.0), (3.0, 1.0), (8.0, 1.0)]:
    ...         moments = collect_moments(m, moments, m.full((2,), value), collect)
    ...     float(moments["count"]), np.asarray(moments["mean"]).tolist()
    (3.0, [4.0, 4.0])
    """
    count, mean, sq_mean, deviations = (
        moments[k] for k in ("count", "mean", "sq_mean", "deviations")
    )
    new_count = count + collect
    weight = collect / m.maximum(new_count, 1.0)
    mean = mean + weight * (theta - mean)
    sq_mean = sq_mean + weight * (theta * theta - sq_mean)
    rank = deviations.shape[-2]
    slot = _mod(m, count, rank)
    hit = collect * m.where(m.arange(rank) * 1.0 == slot, 1.0, 0.0)
    deviations = deviations + m.expand_dims(hit, -1) * (m.expand_dims(theta - mean, 0) - deviations)
    return {"count": new_count, "mean": mean, "sq_mean": sq_mean, "deviations": deviations}


def _mod(m: Any, value: Any, divisor: int) -> Any:
    """mod(value, divisor) of a whole number held as a float; (value + ½)/divisor is never within
    rounding of an integer (a compiler may divide by multiplying with 1/divisor)."""
    return value - m.floor((value + 0.5) / divisor) * divisor


def collection_mask(m: Any, step: Any, swa_start: int, collect_every: int) -> Any:
    """1.0 at the steps whose new iterate is collected: step t (0-based) with t ≥ ``swa_start``
    and (t − ``swa_start`` + 1) a multiple of ``collect_every``; else 0.0.

    Example
    -------
    >>> import ppl_bdl as bdl
    >>> backend = bdl.backends.get("numpyro")
    >>> with backend.activate():
    ...     [int(collection_mask(backend.math, t, 2, 3)) for t in range(9)]
    [0, 0, 0, 0, 1, 0, 0, 1, 0]
    """
    since = m.asarray(step) * 1.0 - (swa_start - 1)
    due = (since >= 1.0) & (_mod(m, since, collect_every) == 0.0)
    return m.where(due, 1.0, 0.0)


def cyclical_unit(swa_start: int, cycle: int, decay: float):
    """SWA's cyclical rate as a fraction of ``lr`` at a (traced) step t, written with
    :mod:`ppl_bdl.dsl.math`: 1 before ``swa_start``, then in each cycle of ``cycle`` steps
    (1 − s) + s·``decay``, s = (mod(t − swa_start, c) + 1)/c (Izmailov et al. 2018, Sec. 3),
    ``decay`` at a cycle's last step, the collected one.

    Example
    -------
    >>> import ppl_bdl as bdl
    >>> unit = cyclical_unit(swa_start=2, cycle=2, decay=0.5)
    >>> with bdl.backends.get("numpyro").activate():
    ...     [float(unit(t)) for t in range(6)]
    [1.0, 1.0, 0.75, 0.5, 0.75, 0.5]
    """

    def unit(t):
        since = bm.asarray(t) * 1.0 - swa_start
        share = (_mod(bm, since, cycle) + 1.0) / cycle
        return bm.where(since >= 0.0, 1.0 - share * (1.0 - decay), 1.0)

    return unit


# -- the moments on the host --------------------------------------------------------------------
@dataclass(frozen=True)
class SWAGMoments:
    """Every run's moments as NumPy: ``count`` (run,) iterates collected, ``mean`` θ̄ and
    ``sq_mean`` θ̄² (run, d), ``deviations`` D (run, K, d): column i mod K holds the i-th
    collected iterate's deviation (the last K of them once n ≥ K)."""

    count: np.ndarray
    mean: np.ndarray
    sq_mean: np.ndarray
    deviations: np.ndarray

    @classmethod
    def from_rows(cls, rows: np.ndarray, dim: int, rank: int) -> SWAGMoments:
        """From the transition's emitted rows (run, 1 + (3 + K)·d): count, θ, θ̄, θ̄², D."""
        rows = np.asarray(rows, dtype=float)
        return cls(
            rows[:, 0],
            rows[:, 1 + dim : 1 + 2 * dim],
            rows[:, 1 + 2 * dim : 1 + 3 * dim],
            rows[:, 1 + 3 * dim :].reshape(len(rows), rank, dim),
        )

    def runs(self, which: np.ndarray) -> SWAGMoments:
        """The moments of the runs ``which`` (indices)."""
        return SWAGMoments(
            self.count[which], self.mean[which], self.sq_mean[which], self.deviations[which]
        )

    @property
    def diag(self) -> np.ndarray:
        """Σ_diag = max(θ̄² − θ̄², 0) (run, d), clipped at 0 against rounding."""
        return np.maximum(self.sq_mean - self.mean**2, 0.0)

    def filled(self, run: int) -> np.ndarray:
        """Run ``run``'s filled deviation columns (min(n, K), d)."""
        return self.deviations[run, : int(min(self.count[run], self.deviations.shape[1]))]

    def covariance(self, run: int = 0) -> np.ndarray:
        """The dense covariance ½(Σ_diag + D Dᵀ/(K − 1)) of run ``run`` (d, d): small models."""
        columns = self.filled(run)
        low_rank = columns.T @ columns / max(len(columns) - 1, 1)
        return 0.5 * (np.diag(self.diag[run]) + low_rank)

    def sample(self, num_samples: int, seed: int) -> np.ndarray:
        """Draws θ = θ̄ + Σ_diag^½ z₁/√2 + D z₂/√(2(K − 1)) of every run, (run, draw, d)."""
        out = np.empty((len(self.count), num_samples, self.mean.shape[1]))
        for run in range(len(self.count)):
            rng = np.random.default_rng([seed, run, 11])
            columns = self.filled(run)
            z1 = rng.standard_normal((num_samples, self.mean.shape[1]))
            z2 = rng.standard_normal((num_samples, len(columns)))
            spread = np.sqrt(0.5 * self.diag[run]) * z1
            spread += z2 @ columns / np.sqrt(2.0 * max(len(columns) - 1, 1))
            out[run] = self.mean[run] + spread
        return out


class SWAGApproximation:
    """The Gaussians a SWAG fit found (``post.guide`` of ``method="swag"``), one per run.

    ``params``: ``mean`` θ̄ (the SWA solution, flat and unconstrained), ``diag`` Σ_diag,
    ``deviations`` D (run, K, d) and ``count`` (iterates collected), NumPy with a leading run
    axis; ``moments`` the same as a :class:`SWAGMoments` (``moments.covariance(run)``);
    ``swa`` the SWA solution θ̄ of every run as a Posterior of one draw per run (its
    constrained sites and deterministic values; ``post.guide.swa.predict(model(X_new))``
    predicts with it); ``sample_unconstrained(n)`` fresh flat draws (run, n, d). ``phi`` packs
    every run's θ̄, θ̄² and D in one row (what a saved posterior keeps).
    """

    name = "swag"

    def __init__(self, moments: SWAGMoments, swa, settings: dict):
        self.moments, self.swa, self.settings = moments, swa, dict(settings)

    @property
    def params(self) -> dict[str, np.ndarray]:
        mo = self.moments
        return {"mean": mo.mean, "diag": mo.diag, "deviations": mo.deviations, "count": mo.count}

    @property
    def phi(self) -> np.ndarray:
        mo = self.moments
        return np.concatenate(
            [mo.mean, mo.sq_mean, mo.deviations.reshape(len(mo.count), -1)], axis=1
        )

    def sample_unconstrained(self, n: int, seed: int = 0) -> np.ndarray:
        return self.moments.sample(n, seed)

    def __repr__(self) -> str:
        runs, rank, dim = self.moments.deviations.shape
        return f"<SWAGApproximation: {runs} run(s), rank {rank}, {dim} dimensions>"


# -- the transition ------------------------------------------------------------------------------
def swag_transition(
    setup: Setup, method: SWAG, plate: tuple[str, int] | None
) -> tuple[Transition, Any]:
    """One SWAG run's transition and the data's arrays its steps read.

    ``init``: the optimizer's state at the position and empty moments; ``step``: the
    potential's value and gradient on the minibatch, the optimizer's update at the step's
    rate, and the new iterate collected where :func:`collection_mask` says; info ``loss`` and
    ``grad_norm``; ``emit``: one flat row (count, θ, θ̄, θ̄², D), chain axes kept in front."""
    backend, dim, rank = setup.backend, setup.layout.dim, method.rank
    density, potential_and_grad = traced_potential(setup, plate, method.batch_size)
    optimizer = backend.optimizer(method.optimizer_config())
    m = backend.math

    def init(key, position, data):
        params = {"theta": position}
        return {
            "params": params,
            "optimizer": optimizer.init(params),
            "moments": init_moments(m, position, rank),
        }

    def step(key, state, batch, rate):
        loss, grad = potential_and_grad(state["params"]["theta"], batch)
        grad_norm = m.sqrt(m.sum(grad * grad))
        ok = m.isfinite(loss) & m.isfinite(grad_norm)
        params, opt_state = optimizer.update(
            {"theta": grad}, state["optimizer"], state["params"], ok, rate
        )
        collect = collection_mask(m, batch.step, method.swa_start, method.collect_every)
        moments = collect_moments(m, state["moments"], params["theta"], collect)
        new = {"params": params, "optimizer": opt_state, "moments": moments}
        return new, {"loss": loss, "grad_norm": grad_norm}

    def emit(state):
        mo, theta = state["moments"], state["params"]["theta"]
        lead = tuple(theta.shape[:-1])  # the chains' axis, where the state holds several
        flat_d = m.reshape(mo["deviations"], lead + (rank * dim,))
        count = m.expand_dims(mo["count"], -1)
        return m.concatenate([count, theta, mo["mean"], mo["sq_mean"], flat_d], axis=-1)

    return Transition(init, step, emit), density.data


# -- the run -------------------------------------------------------------------------------------
def run_swag(
    setup: Setup, method: SWAG, *, seed: int, progress: bool = False, log_likelihood: bool = True
):
    """Run ``method``'s ``num_chains`` SWAG runs on ``setup``; a
    :class:`~ppl_bdl.posterior.posterior.Posterior` of ``num_samples`` draws per run (a chain
    each), ``post.guide`` the :class:`SWAGApproximation`, ``post.losses`` (run, step)."""
    backend, dim, runs = setup.backend, setup.layout.dim, method.num_chains
    plate = minibatch_plate(setup, method.batch_size)
    transition, data = swag_transition(setup, method, plate)
    positions = initial_positions(setup, method.init, runs, seed)
    keep = np.zeros(method.num_steps, bool)
    keep[-1] = True
    row = 1 + (3 + method.rank) * dim
    plan = plan_run(keep, runs, row, method.chunk_size, progress)

    def batches(run: int):
        return EpochBatches(plate[1], method.batch_size, [seed, run, 7]) if plate else None

    run = run_chains(
        backend,
        transition,
        positions,
        seed,
        plan,
        data,
        batches,
        "swag",
        method.rates(),
        progress=progress,
        trace=True,
    )
    losses = run.step_infos["loss"].astype(float) if run.step_infos else None
    if run.failure is not None:
        _raise_failure(setup, method, run, transition, seed, log_likelihood, losses)
    moments = SWAGMoments.from_rows(run.draws[:, -1], dim, method.rank)
    return swag_posterior(setup, method, moments, seed, log_likelihood, losses)


def swag_posterior(
    setup: Setup,
    method: SWAG,
    moments: SWAGMoments,
    seed: int,
    log_likelihood: bool,
    losses: np.ndarray | None,
):
    """The Posterior of ``moments``: ``num_samples`` draws per run, the approximation as
    ``post.guide`` (with the SWA solution ``guide.swa``)."""
    setup.settings["collected"] = [int(c) for c in moments.count]
    draws = moments.sample(method.num_samples, seed)
    swa = build_posterior(setup, moments.mean[:, None], {}, "swag", log_likelihood=False)
    guide = SWAGApproximation(moments, swa, {"rank": method.rank})
    return build_posterior(
        setup, draws, {}, "swag", log_likelihood=log_likelihood, losses=losses, guide=guide
    )


def _raise_failure(
    setup: Setup, method: SWAG, run: RunResult, transition, seed, log_likelihood, losses
) -> None:
    """A RunInterrupted (Ctrl-C) or an InferenceError (a non-finite loss), with the SWAG
    posterior of the runs that had collected two iterates or more by then (their moments
    before the failed step) as ``partial``."""
    backend, failure, dim = setup.backend, run.failure, setup.layout.dim
    rows = [] if run.draws is None else [run.draws[:, -1]]
    if run.final_state is not None:
        with backend.scope(), backend.activate():
            last = backend.to_numpy(transition.emit(run.final_state))
        rows.append(np.asarray(last, float).reshape(-1, 1 + (3 + method.rank) * dim))
    partial, held = None, ""
    if rows:
        moments = SWAGMoments.from_rows(np.concatenate(rows), dim, method.rank)
        usable = np.flatnonzero(moments.count >= 2)
        if len(usable):
            kept = moments.runs(usable)
            partial = swag_posterior(setup, method, kept, seed, log_likelihood, None)
            held = (
                f" error.partial holds the SWAG posterior of run(s) {usable.tolist()} from the "
                f"{kept.count.astype(int).tolist()} iterate(s) they had collected."
            )
    if not held:
        held = " No run had collected two iterates by then, so nothing is kept."
    if failure.reason == "interrupted":
        raise RunInterrupted(f"swag was interrupted at step {failure.step}.{held}", partial=partial)
    raise InferenceError(
        f"swag run {failure.chains[0]}: the loss or its gradient is not finite (NaN or inf) at "
        f"step {failure.step}.{held} Try a smaller lr, clip_norm=..., or check the model's "
        "priors and data.",
        partial=partial,
    )


# -- the method ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class SWAG(MAPTraining):
    """SWA-Gaussian (Maddox et al. 2019): a Gaussian N(θ̄, ½(Σ_diag + DDᵀ/(K−1))) fitted to
    the SGD iterates collected after ``swa_start``; ``num_chains`` > 1 is MultiSWAG.

    Example
    -------
    >>> import ppl_bdl as bdl
    >>> bdl.SWAG(rank=10, swa_start=500).collections
    150
    >>> bdl.SWAG(num_steps=100, swa_start=90, collect_every=5)
    Traceback (most recent call last):
    ...
    ppl_bdl.errors.ConfigError: SWAG(num_steps=100, swa_start=90, collect_every=5) collects 2 iterates ...
    """

    num_samples: int = option(1000, "draws from each run's Gaussian")
    num_chains: int = option(1, "independent SWAG runs (MultiSWAG), one chain of draws each")
    swa_start: int = option(500, "steps before the first iterate is collected (the burn-in)")
    collect_every: int = option(10, "steps between collected iterates (cyclical: the cycle)")
    rank: int = option(20, "K, the deviations kept (the covariance's low rank)")
    num_steps: int = option(2000, "optimizer steps per run, the burn-in included")
    optimizer: str = option("sgd", "'sgd' or 'adam'")
    lr: float = option(1e-4, "the learning rate (U sums over the data: scale it as 1/N)")
    momentum: float = option(0.9, "sgd's momentum")
    schedule: str = option("constant", "after swa_start: 'constant' or SWA's 'cyclical'")
    decay: float = option(0.1, "cyclical: the rate at a cycle's end, as a fraction of lr")
    init: Any = option(None, "where runs start: 'median', 'uniform', 'prior' or a dict")

    schedules: ClassVar[tuple[str, ...]] = SCHEDULES
    method_name: ClassVar[str] = "swag"
    hints: ClassVar[dict[str, str]] = {
        "num_members": "SWAG's independent runs (MultiSWAG) are num_chains",
        "num_warmup": "SWAG's burn-in is swa_start (optimizer steps before collecting)",
        "thinning": "collect_every sets the steps between collected iterates",
        "step_size": "SWAG's learning rate is lr",
    }

    def __post_init__(self) -> None:
        for name in ("num_samples", "num_chains", "collect_every"):
            check_int(self, name)
        check_int(self, "rank", 2)
        check_int(self, "swa_start", 0)
        check_number(self, "decay", 0.0, 1.0, open_high=False)
        super().__post_init__()
        self._check_collections()

    def training_config(self, num_members: int = 1, **overrides: Any) -> EnsembleConfig:
        """The optimizer's settings (its checks: lr, momentum, clip_norm); SWA's cyclical
        schedule is SWAG's own (:meth:`rates`), so the driver's schedule is constant."""
        return super().training_config(num_members, **{"schedule": "constant", **overrides})

    def _check_collections(self) -> None:
        given = (
            f"SWAG(num_steps={self.num_steps}, swa_start={self.swa_start}, "
            f"collect_every={self.collect_every})"
        )
        if self.swa_start >= self.num_steps:
            raise ConfigError(
                f"{given}: swa_start must be below num_steps (the burn-in leaves no steps to "
                "collect). Lower swa_start or raise num_steps."
            )
        if self.collections < self.rank:
            least = self.swa_start + self.rank * self.collect_every
            raise ConfigError(
                f"{given} collects {self.collections} iterates after swa_start, fewer than "
                f"rank={self.rank} (the deviations D need rank of them). Raise num_steps to "
                f"{least} or more, or lower swa_start, collect_every or rank."
            )

    @property
    def collections(self) -> int:
        """Iterates each run collects: (num_steps − swa_start) // collect_every."""
        return (self.num_steps - self.swa_start) // self.collect_every

    def optimizer_config(self) -> OptimizerConfig:
        """The optimizer's settings (its checks: lr, momentum, clip_norm)."""
        return self.training_config().optimizer

    def rates(self) -> Rates:
        """The steps' learning rates: ``lr``, times SWA's cycles after swa_start (cyclical)."""
        if self.schedule == "constant":
            return Rates(self.lr)
        unit = cyclical_unit(self.swa_start, self.collect_every, self.decay)
        return Rates(
            self.lr, unit, ("swag-cyclical", self.swa_start, self.collect_every, self.decay)
        )

    def settings(self) -> dict:
        return {**self.given(), "num_samples": self.num_samples, "rank": self.rank}

    def run(self, setup, *, seed: int, progress: bool, log_likelihood: bool, chain_ids):
        check_params(setup, self.name, self.hold_params)
        return run_swag(setup, self, seed=seed, progress=progress, log_likelihood=log_likelihood)
