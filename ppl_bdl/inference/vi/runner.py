"""Variational inference: ``fit(bound, backend, method="vi", guide=..., objective=...)``.

VI is a transition of the one driver (:mod:`ppl_bdl.inference.loop.driver`): its state is the guide's
parameters (and the model's own ``param`` sites, fitted as point estimates) with the optimizer's
state, and its step is the backend's optimizer (optax / ``torch.optim``, :meth:`Backend.optimizer`)
composed with the objective's ``value_and_grad`` (:mod:`ppl_bdl.inference.vi.objectives`), at the guide's
standard-normal noise drawn from the step's key. A step whose loss or gradient is not finite is
not applied; the run stops there, keeps the parameters before it and raises
:class:`~ppl_bdl.errors.InferenceError` with the partial result attached.

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import dist
>>> @bdl.model
... def mean_model(y):
...     mu = bdl.sample("mu", dist.Normal(0.0, 10.0))
...     with bdl.plate("data", y.shape[0]) as idx:
...         bdl.sample("y", dist.Normal(mu, 1.0), obs=y[idx])
>>> y = np.random.default_rng(0).normal(1.0, 1.0, size=200)
>>> post = bdl.fit(mean_model(y), backend="numpyro", method="vi", guide="meanfield",
...                num_steps=1000, lr=0.05, batch_size=50, num_samples=500, progress=False)
>>> post.losses.shape
(1000,)
"""

from __future__ import annotations

import dataclasses
from typing import Any, NoReturn

import numpy as np

from ppl_bdl.backend_protocol import Batch, Transition
from ppl_bdl.errors import ConfigError, InferenceError, RunInterrupted
from ppl_bdl.inference.common import Setup, build_posterior
from ppl_bdl.inference.loop.driver import Rates, RunPlan, plan_run, progress_bar, run_chains
from ppl_bdl.inference.loop.minibatch import EpochBatches
from ppl_bdl.inference.setup import minibatch_plate
from ppl_bdl.inference.vi.chains import check_fits, fit_seed
from ppl_bdl.inference.vi.chains import each as _each
from ppl_bdl.inference.vi.guide_setup import (
    DEFAULT_LR,
    DEFAULT_MAX_STEPS,
    DEFAULT_PARTICLES,
    build_guide,
    guide_init,
)
from ppl_bdl.inference.vi.guides.amortized import Amortized
from ppl_bdl.inference.vi.guides.amortized_fitted import FittedAmortized
from ppl_bdl.inference.vi.guides.base import FittedGuide, ParamLayout
from ppl_bdl.inference.vi.monitor import (
    AUTO_MAX_STEPS,
    AUTO_MIN_STEPS,
    LossMonitor,
    Plateau,
    segment_length,
)
from ppl_bdl.inference.vi.natural import NATURAL_LR, build_natural, natural_options
from ppl_bdl.inference.vi.objectives import (
    ModelParams,
    ObjectiveConfig,
    analytic_kl_sites,
    make_loss,
)
from ppl_bdl.inference.vi.objectives_amortized import make_amortized_loss
from ppl_bdl.inference.vi.objectives_refined import make_refined_loss
from ppl_bdl.inference.vi.program_key import vi_transition_key
from ppl_bdl.optim import OptimizerConfig, unit_schedule
from ppl_bdl.trace.layout import ModelDensity
from ppl_bdl.trace.programs import cached_transition

RUN_OPTIONS = {
    "guide",
    "objective",
    "alpha",
    "kl",
    "num_particles",
    "num_steps",
    "batch_size",
    "optimizer",
    "lr",
    "momentum",
    "schedule",
    "decay",
    "clip_norm",
    "init_loc",
    "chunk_size",
    "plateau_factor",
    "plateau_patience",
    "plateau_cuts",
    "gradient",
    "beta1",
    "beta2",
    "curvature",
}
#: The reduce-on-plateau rule's options (``schedule="plateau"`` only) and their Plateau fields.
PLATEAU_OPTIONS = {
    "plateau_factor": "factor",
    "plateau_patience": "patience",
    "plateau_cuts": "max_cuts",
}


def run_vi(
    setup: Setup,
    num_samples: int,
    seed: int,
    progress: bool,
    log_likelihood: bool = True,
    num_chains: int = 1,
    **options: Any,
):
    """Fit a guide to ``setup``'s model and return a :class:`~ppl_bdl.posterior.posterior.Posterior` with
    ``num_samples`` draws from the fitted guide, ``post.guide`` and ``post.losses``.

    ``num_chains`` > 1: that many independent fits, run side by side as chains (each its own
    start, noise and minibatch order; spread over devices like MCMC chains): the posterior has
    one chain per fit, ``post.guide`` is the list of fitted guides, ``post.losses`` is shaped
    (fit, step), and ``best_step``, ``stopped_at`` and ``stop_reason`` are lists over the fits.

    The run is watched (:mod:`~ppl_bdl.inference.vi.monitor`): the guide returned is the one at
    the best smoothed loss (``post.settings["best_step"]``), and a loss that diverges while
    staying finite stops the run (``settings["stopped_at"]``, ``stop_reason="diverging"``),
    which the fit's diagnostics report. ``settings["converged"]``: whether the loss passed the
    monitor's convergence test by the end (a run to convergence that reached its cap without
    passing it is reported too: ``vi_not_converged``).

    Options: ``guide`` ("meanfield", "lowrank", "fullrank", "flow", "delta", a registered name or a
    ``@bdl.guide`` function), ``objective`` ("elbo", "renyi", "iwae"), ``alpha``, ``kl`` ("auto",
    "analytic", "mc"), ``gradient`` ("total", the default; "path": the path derivative, sticking
    the landing, :mod:`ppl_bdl.inference.vi.objectives`), ``num_particles`` (1; 8 for the flow guide), ``num_steps`` (None: until
    the loss has converged, at least 2,000 and at most 100,000 steps (20,000 for the flow guide); see
    :mod:`~ppl_bdl.inference.vi.monitor`), ``batch_size``, ``optimizer`` ("adam", "sgd"), ``lr``
    (0.01; 0.003 for fullrank, 0.001 for flow), ``momentum``, ``schedule`` ("plateau", the
    default with ``num_steps=None``: the lr cut by ``plateau_factor`` (0.5) where the loss is flat
    over two windows of ``plateau_patience`` (3) segments, at most ``plateau_cuts`` (3) times, at
    ``settings["lr_cuts"]``; "constant", the default with ``num_steps``; "exponential",
    "cosine"), ``decay``, ``clip_norm``, ``init_loc`` ("median", the default: the
    coordinate-wise median of 20 prior draws, robust and not exactly symmetric, so BNN units
    start apart; "prior": one prior draw; a dict of site values; a flat array),
    ``chunk_size`` (steps per compiled call), and the guide's own settings (``rank``, ``blocks``,
    ``num_layers``, ``hidden``, ``layer``, ``init_scale``, ``max_dim``).
    """
    run = VIRun(setup, seed, num_chains=num_chains, **options)
    losses, failure, monitors = run.fit(progress=progress)
    one = run.num_chains == 1  # one fit: scalars and one guide, as before num_chains
    _record_settings(setup.settings, run, losses, monitors)
    post = None
    try:
        last = failure is not None and failure[1] == "nonfinite"  # then the last parameters
        best = [None if last else m.best_params for m in monitors]
        post = _draw_posterior(run, setup, best, num_samples, seed, losses, log_likelihood)
    except Exception:  # noqa: BLE001 - a failed run still returns what it has
        if failure is None:
            raise
    if failure is None:
        return post
    partial = (
        post
        if post is not None
        else _each([run.fitted_guide(chain=c) for c in range(run.num_chains)], one)
    )
    _raise_failure(failure, losses if one else losses[0], partial)  # the first fit's losses


def _record_settings(settings: dict, run: VIRun, losses: np.ndarray, monitors: list) -> None:
    """What the run did, in the posterior's settings: one value per fit (a scalar for one)."""
    one = run.num_chains == 1
    settings.update(
        num_steps=None if run.auto else run.num_steps,
        steps_run=losses.shape[-1],
        best_step=_each([m.best_step for m in monitors], one),
        schedule=run.schedule,
        lr_cuts=_each([list(m.cuts) for m in monitors], one) if run.plateau else None,
        stopped_at=_each(run.stopped, one),
        stop_reason=_each(["diverging" if s else None for s in run.stopped], one),
        converged=_each([m.converged() for m in monitors], one),
    )


def _draw_posterior(
    run: VIRun, setup: Setup, best: list, num_samples, seed, losses, log_likelihood
):
    """The Posterior of ``num_samples`` draws from each fit's guide at its ``best`` parameters
    (None: its current ones)."""
    one = run.num_chains == 1
    fitted = [run.fitted_guide(b, chain=c) for c, b in enumerate(best)]
    fitted_setup = dataclasses.replace(setup, params=run.fitted_model_params(best[0]))
    flat = np.stack(
        [
            g.sample_unconstrained(num_samples, seed=fit_seed(seed, c) + 1)
            for c, g in enumerate(fitted)
        ]
    )
    return build_posterior(
        fitted_setup,
        flat,
        {},
        method="vi",
        guide=_each(fitted, one),
        losses=losses,
        log_likelihood=log_likelihood,
    )


def _raise_failure(failure: tuple, losses: np.ndarray, partial: Any) -> NoReturn:
    """The InferenceError of a run stopped at ``failure`` ``(step, reason)``, with what it
    reached attached."""
    step, reason = failure
    if reason == "interrupted":
        raise RunInterrupted(
            f"VI was interrupted at step {step}; the guide at its best smoothed loss so far (else "
            "where it was) is in error.partial (a Posterior, or the guide if drawing failed).",
            partial=partial,
        )
    last = f"{losses[-1]:.6g}" if losses.size else "none (the first step failed)"
    raise InferenceError(
        f"VI stopped at step {step}: the loss or its gradient is not finite. Last finite loss: "
        f"{last}. The parameters from before that step are kept in error.partial (a Posterior, "
        "or the fitted guide if drawing from it failed). Try a smaller lr, clip_norm=..., a "
        "smaller init_scale, or check the model's priors.",
        partial=partial,
    )


def _step_budget(num_steps: Any, cap: int | None = None) -> tuple[bool, int]:
    """Whether the run goes until converged (``num_steps=None``, capped at ``cap``, the guide's
    own cap, else ``AUTO_MAX_STEPS``), and its number of steps; a bad ``num_steps`` refused."""
    auto = num_steps is None
    if auto:
        num_steps = AUTO_MAX_STEPS if cap is None else cap
    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
        raise ConfigError(
            f"num_steps must be an int >= 1 (or None: until converged), got {num_steps!r}."
        )
    return auto, num_steps


class VIRun:
    """A VI problem set up once: guide, objective, optimizer and transition.

    :meth:`steps` runs (more) optimizer steps from the current state; :func:`run_vi` uses it for
    one fit, and the benchmarks time it without the set-up. ``num_chains`` independent fits run
    side by side as the driver's chains (vectorised, or split over devices): fit c starts from
    its own initial point, noise and minibatch order (:func:`fit_seed`), and is watched by its
    own monitor.
    """

    def __init__(self, setup: Setup, seed: int, num_chains: int = 1, **options: Any):
        run_opts = {k: v for k, v in options.items() if k in RUN_OPTIONS}
        guide_opts = {k: v for k, v in options.items() if k not in RUN_OPTIONS}
        spec = run_opts.get("guide", "meanfield")
        cap = DEFAULT_MAX_STEPS.get(spec, AUTO_MAX_STEPS) if isinstance(spec, str) else None
        self.auto, self.num_steps = _step_budget(run_opts.get("num_steps"), cap)
        self.seed = seed
        amortized = isinstance(spec, Amortized)
        name = spec if isinstance(spec, str) else ("amortized" if amortized else "custom")
        self.objective = ObjectiveConfig.build(
            run_opts.get("objective", "elbo"),
            run_opts.get("alpha"),
            run_opts.get("num_particles", DEFAULT_PARTICLES.get(name, 1)),
            run_opts.get("kl", "auto"),
            run_opts.get("gradient", "total"),
        )
        optimizer = run_opts.get("optimizer", "adam")
        natural = natural_options(optimizer, run_opts)  # vogn, vadam: natural.py
        opt_config = self._set_up_learning_rate(run_opts, optimizer, natural, name)
        self.chunk_size = run_opts.get("chunk_size")
        self.batch_size = run_opts.get("batch_size")
        local = frozenset(spec.sites) if amortized else frozenset()
        self.minibatch = minibatch_plate(setup, self.batch_size, local)
        self.setup, backend = setup, setup.backend
        with backend.scope(), backend.activate():
            self._set_up_guide(spec, run_opts.get("init_loc", "median"), guide_opts)
            self.program_key = vi_transition_key(
                setup, guide_opts, run_opts, opt_config, natural, seed
            )
            self.transition = cached_transition(
                backend,
                self.program_key,
                lambda: (
                    build_natural(self, optimizer, spec, run_opts)
                    if natural
                    else self._transition(backend.optimizer(opt_config))
                ),
            )
        self._set_up_fits(num_chains, options, opt_config)

    def _set_up_learning_rate(
        self, run_opts: dict, optimizer: str, natural: bool, guide_name: str
    ) -> OptimizerConfig:
        """The optimizer's settings, the lr's schedule (``self.schedule``) and, with
        ``schedule="plateau"``, the reduce-on-plateau rule (``self.plateau``)."""
        # Until converged, the lr is cut where the loss flattens (Adam's constant-lr noise floor
        # is then left behind); a run of num_steps keeps a constant lr unless asked.
        schedule = run_opts.get("schedule", "plateau" if self.auto else "constant")
        default_lr = NATURAL_LR.get(optimizer, DEFAULT_LR.get(guide_name, 1e-2))
        opt_config = OptimizerConfig.build(
            optimizer="adam" if natural else optimizer,
            lr=run_opts.get("lr", default_lr),
            momentum=run_opts.get("momentum", 0.0),
            schedule=schedule,
            decay=run_opts.get("decay", 0.1),
            clip_norm=run_opts.get("clip_norm"),
            num_steps=self.num_steps,
        )
        plateau = {v: run_opts[k] for k, v in PLATEAU_OPTIONS.items() if k in run_opts}
        if plateau and schedule != "plateau":
            given = ", ".join(k for k in PLATEAU_OPTIONS if k in run_opts)
            raise ConfigError(
                f"option(s) {given}: apply to schedule='plateau' only, got schedule={schedule!r}. "
                "Pass schedule='plateau' (the default with num_steps=None), or leave them out."
            )
        #: The reduce-on-plateau rule (None for another schedule), and the lr's cuts so far.
        self.plateau = Plateau.build(**plateau) if schedule == "plateau" else None
        self.schedule, self.lr_cuts = schedule, []
        return opt_config

    def _set_up_guide(self, spec: Any, init_loc: Any, guide_opts: dict) -> None:
        """The guide, the model's ``param`` sites, the loss and the model's density, and the
        layout of the parameters they fit (``self.param_layout``) with their start at this
        run's seed (``self._initial``)."""
        setup, backend, seed = self.setup, self.setup.backend, self.seed
        amortized = isinstance(spec, Amortized)
        self.guide = build_guide(
            setup,
            spec,
            lambda: guide_init(setup, init_loc, seed),
            seed,
            guide_opts,
            RUN_OPTIONS,
            self.batch_size,
        )
        self.guide_settings = dict(guide_opts)
        model_sites = {n: r for n, r in setup.sites.items() if r.kind == "param"}
        self.model_params = ModelParams(model_sites, backend) if model_sites else None
        self.kl = None if amortized else analytic_kl_sites(setup, self.guide, self.objective)
        if amortized:  # per-point bounds (ppl_bdl.inference.vi.objectives_amortized)
            make = make_refined_loss if self.guide.refinement.steps else make_amortized_loss
            self.loss, self.density = make(self.guide, self.objective, self.model_params)
        else:
            exclude = frozenset(self.kl.sites) if self.kl is not None else frozenset()
            self.density = ModelDensity(setup.bound, backend, setup.layout, setup.params, exclude)
            plate = self.minibatch[0] if self.minibatch else None
            #: The loss (negative objective) ``loss(params, noise, batch)``.
            self.loss = make_loss(
                self.guide,
                self._potential,
                self.objective,
                backend,
                plate,
                self.kl,
                self.model_params,
            )
        shapes = dict(self.guide.param_layout.shapes)
        initial = self.guide.initial_params()
        if self.model_params is not None:
            shapes.update(self.model_params.shapes)
            initial.update(self.model_params.initial())
        self.param_layout = ParamLayout(shapes)
        self._initial = initial

    def _set_up_fits(self, num_chains: int, options: dict, opt_config: OptimizerConfig) -> None:
        """Each fit's start, minibatch order and lr scale, and the run's progress so far."""
        seed, setup = self.seed, self.setup
        self.num_chains = check_fits(num_chains, self.model_params)
        # Fit c > 0 is set up at its own seed; only its start is kept (the step is shared).
        starts = [self._initial] + [
            VIRun(setup, fit_seed(seed, c), **options)._initial for c in range(1, num_chains)
        ]
        #: Each fit's start, packed (the driver's positions: the transition's init unpacks it).
        self.starts = np.stack([self.param_layout.pack(p) for p in starts])
        self.states, self._calls, self.stopped = None, 0, [None] * num_chains
        self._batches = [
            EpochBatches(self.minibatch[1], self.batch_size, fit_seed(seed, c))
            if self.minibatch
            else None
            for c in range(num_chains)
        ]
        #: The steps' learning rates: lr x each fit's plateau factor (``set_lr_scale``) x the
        #: schedule's shape at the run's step counter, evaluated in the compiled step.
        self.lr, self._unit = opt_config.lr, unit_schedule(opt_config)
        self.lr_scale, self.steps_done = [1.0] * num_chains, 0

    def _potential(self, theta, data, indices, params):
        return self.density.potential(theta, data, indices, params)

    def _transition(self, optimizer) -> Transition:
        """The VI step: noise from the key, the objective's value_and_grad, the gated update."""
        backend, guide, particles = self.setup.backend, self.guide, self.objective.num_particles
        noise_shape = guide.noise_shape(particles)
        m = backend.math

        def noise(key):
            return key if noise_shape is None else backend.random.normal(key, noise_shape)

        example_idx = backend.asarray(np.zeros(self.batch_size), "int") if self.minibatch else None
        with backend.scope(), backend.activate():
            params0 = {k: backend.asarray(v) for k, v in self._initial.items()}
            example = (params0, noise(backend.random.key(0)), Batch(self.density.data, example_idx))
            value_and_grad = backend.value_and_grad(self.loss)
            if noise_shape is not None:  # a guide that draws with the key itself is not traced
                value_and_grad = backend.trace(value_and_grad, example)

        def init(key, position, data):
            values = self.param_layout.unpack(backend.to_numpy(position))
            params = {k: backend.asarray(values[k]) for k in self._initial}
            return {"params": params, "optimizer": optimizer.init(params)}

        def step(key, state, batch, lr):
            loss, grads = value_and_grad(state["params"], noise(key), batch)
            grad_norm = m.sqrt(sum(m.sum(g * g) for g in grads.values()))
            ok = m.isfinite(loss) & m.isfinite(grad_norm)
            params, opt_state = optimizer.update(grads, state["optimizer"], state["params"], ok, lr)
            return {"params": params, "optimizer": opt_state}, {
                "loss": loss,
                "grad_norm": grad_norm,
            }

        return Transition(init, step, lambda state: {})

    def fit(self, progress: bool = False):
        """Run ``num_steps`` steps in segments, each fit watched by its own
        :class:`~ppl_bdl.inference.vi.monitor.LossMonitor`: a fit whose loss diverges stops
        being watched (``self.stopped[c]``; the run stops when every fit has, at
        ``self.stopped_at``), each keeps its parameters at its best smoothed loss, and with
        ``schedule="plateau"`` each fit's lr is cut where its loss flattens (the monitor's
        ``cuts``: the steps; until converged, the run ends once every fit is flat after its
        last cut).

        Returns the losses of every step run ((fit, step) for several fits), None or
        ``(step, reason)`` as :meth:`steps` does, and the monitors (``best_step``,
        ``best_params``), one per fit."""
        segment = segment_length(self.num_steps, self.chunk_size)
        monitors = [LossMonitor(self.plateau, self.num_steps) for _ in range(self.num_chains)]
        parts, failure, done = [], None, 0
        self.stopped_at, self.lr_cuts = None, monitors[0].cuts
        bar = progress_bar(self.num_steps, "vi") if progress else None
        try:
            while done < self.num_steps and failure is None:
                losses, failure = self.steps(min(segment, self.num_steps - done), chunk=segment)
                if failure is not None:  # its step counts from this segment's start
                    failure = (done + failure[0], failure[1])
                losses = losses.reshape(self.num_chains, -1)
                parts.append(losses)
                done += losses.shape[1]
                if bar is not None:
                    bar.update(losses.shape[1], {"loss": losses})
                watched = [c for c in range(self.num_chains) if self.stopped[c] is None]
                for c in watched if failure is None else []:
                    verdict = monitors[c].update(done, losses[c], lambda c=c: self._current(c))
                    if verdict == "diverging":
                        self.stopped[c] = done
                    elif verdict == "lr_cut":
                        self.set_lr_scale(monitors[c].lr_scale, fit=c)
                if all(s is not None for s in self.stopped):
                    self.stopped_at = done
                    break
                live = [monitors[c] for c in watched if self.stopped[c] is None]
                if self.auto and done >= AUTO_MIN_STEPS and all(m.converged() for m in live):
                    break
        except KeyboardInterrupt:  # between two segments (one stopped inside says so itself)
            failure = (sum(p.shape[1] for p in parts), "interrupted")
        finally:
            if bar is not None:
                bar.close()
        losses = np.concatenate(parts, axis=1) if parts else np.zeros((self.num_chains, 0))
        return (losses[0] if self.num_chains == 1 else losses), failure, monitors

    def steps(self, num_steps: int, progress: bool = False, chunk: int | None = None):
        """Run ``num_steps`` steps from the current state; stop at the first non-finite loss.

        Returns the losses (NumPy, one per step run; (fit, step) for several fits) and None or
        ``(step, reason)`` with reason "nonfinite" or "interrupted" (Ctrl-C); the state from
        before the failed step, or at the end of the last finished chunk, is kept. ``chunk``:
        the compiled chunk's length (a shorter run then reuses the program of a longer one).
        """
        backend = self.setup.backend
        if chunk is not None and chunk >= num_steps:
            plan = RunPlan(np.zeros(num_steps, bool), chunk, 0)
        else:
            plan = plan_run(np.zeros(num_steps, bool), 1, 0, self.chunk_size, progress)
        scale = self.lr * np.asarray(self.lr_scale)  # one per fit
        unit_key = None if self.program_key is None else ("vi lr", self.program_key)
        rates = Rates(scale if self.num_chains > 1 else float(scale[0]), self._unit, unit_key)
        run = run_chains(
            backend,
            self.transition,
            self.starts,
            self.seed + self._calls,
            plan,
            self.density.data,
            self._batches.__getitem__,
            "vi",
            rates,
            progress=progress,
            trace=True,
            first_step=self.steps_done,
            resume=self.states,
        )
        self._calls += 1
        self.states, self._run = run.states, run
        losses = run.step_infos.get("loss", np.zeros((self.num_chains, 0))).astype(float)
        self.steps_done += losses.shape[-1]
        losses = losses[0] if self.num_chains == 1 else losses
        if run.failure is None:
            return losses, None
        return losses, (run.failure.step, run.failure.reason)

    def set_lr_scale(self, scale: float, fit: int = 0) -> None:
        """Multiply fit ``fit``'s learning rate by ``scale`` (relative to the schedule's) from
        the next step on: the scale of the run's :class:`~ppl_bdl.inference.loop.driver.Rates`, an
        input of the compiled loop, so nothing compiles again."""
        self.lr_scale[fit] = float(scale)

    def _current(self, chain: int = 0) -> dict:
        """A host copy of fit ``chain``'s parameters now (a copy: torch's optimizer updates
        its tensors in place, and a NumPy view of them would follow)."""
        backend = self.setup.backend
        with backend.scope(), backend.activate():
            state = None if self.states is None else self._run.chain_state(backend, chain)
            if state is None:  # not run yet (or, on a failure, never reached)
                return self.param_layout.unpack(self.starts[chain])
            return {k: np.array(backend.to_numpy(v)) for k, v in state["params"].items()}

    def fitted_guide(self, params: dict | None = None, chain: int = 0) -> FittedGuide:
        """The guide at ``params`` (host arrays, e.g. the best ones), else fit ``chain``'s
        current ones."""
        params = self._current(chain) if params is None else params
        flat = self.guide.param_layout.pack({k: params[k] for k in self.guide.param_layout.shapes})
        fitted = self.guide.fitted(flat, settings=self.guide_settings)
        if isinstance(fitted, FittedAmortized):  # a refinement's chains target the fitted model
            backend = self.setup.backend
            fitted.model_params = {
                k: np.asarray(backend.to_numpy(v))
                for k, v in self.fitted_model_params(params).items()
            }
        return fitted

    def fitted_model_params(self, params: dict | None = None) -> dict:
        """The model's ``param`` sites at ``params`` (else the current), constrained (backend
        arrays)."""
        if self.model_params is None:
            return dict(self.setup.params)
        backend = self.setup.backend
        current = self._current() if params is None else params
        params = {k: backend.asarray(v) for k, v in current.items()}
        with backend.scope(), backend.activate():
            return self.model_params.constrained(params, backend.math)
