"""Variational inference: ``fit(bound, backend, method="vi", guide=..., objective=...)``.

The whole loop is the core's: a guide over the flat unconstrained latent vector
(:mod:`ppl_bdl.guides`), an objective (:mod:`ppl_bdl.objectives`) and an optimizer step over one
flat parameter vector built by the backend from its own optimizers (optax / ``torch.optim``).
The steps run through the backend's ``compile_loop``: on NumPyro one jitted ``lax.scan`` per chunk
of steps, on Pyro a lean torch loop (the model's log density straight from
``torch.distributions``, no Pyro handlers). A non-finite loss stops the run at that step, keeps
the parameters before it and raises :class:`~ppl_bdl.errors.InferenceError` with the partial
result attached.

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
import functools
import inspect
import math as _pymath
import sys
from typing import Any, NamedTuple

import numpy as np

from .. import guides as guide_registry
from .. import prefetch
from ..errors import ConfigError, InferenceError, ModelError
from ..guides.base import FittedGuide, GuideInit, ParamLayout
from ..guides.custom import CustomGuide, bind_guide
from ..layout import make_potential
from ..objectives import ModelParams, ObjectiveConfig, analytic_kl_sites, make_loss
from ..optim import OptimizerConfig
from .chunks import chunks_ahead, run_ahead
from .common import Setup, build_posterior, initial_positions
from .minibatch import EpochBatches, minibatch_plate

#: Steps per compiled chunk at most: a chunk's minibatch indices and pre-drawn normals stay
#: cache-sized, and the host makes the next chunk's indices while one runs (a mean-field step of
#: a small BNN ran 20-30% faster in chunks of 1000 steps than of 5000 on NumPyro).
MAX_CHUNK = 1000
#: Prior draws used to set a guide's initial mean and per-coordinate scale.
INIT_DRAWS = 20

_RUN_OPTIONS = {
    "guide", "objective", "alpha", "kl", "num_particles", "num_steps", "batch_size", "optimizer",
    "lr", "momentum", "schedule", "decay", "clip_norm", "init_loc", "chunk_size",
}  # fmt: skip


def run_vi(setup: Setup, num_samples: int, seed: int, progress: bool, **options: Any):
    """Fit a guide to ``setup``'s model and return a :class:`~ppl_bdl.posterior.Posterior` with
    ``num_samples`` draws from the fitted guide, ``post.guide`` and ``post.losses``.

    Options: ``guide`` ("meanfield", "lowrank", "fullrank", "flow", "delta", a registered name or a
    ``@bdl.guide`` function), ``objective`` ("elbo", "renyi", "iwae"), ``alpha``, ``kl`` ("auto",
    "analytic", "mc"), ``num_particles``, ``num_steps`` (1000), ``batch_size``, ``optimizer``
    ("adam", "sgd"), ``lr`` (0.01), ``momentum``, ``schedule`` ("constant", "exponential",
    "cosine"), ``decay``, ``clip_norm``, ``init_loc`` ("median", the default: the
    coordinate-wise median of 20 prior draws, robust and not exactly symmetric, so BNN units
    start apart; "prior": one prior draw; a dict of site values; a flat array),
    ``chunk_size`` (steps per compiled call), and the guide's own settings (``rank``, ``blocks``,
    ``num_layers``, ``hidden``, ``layer``, ``init_scale``, ``max_dim``).
    """
    run = VIRun(setup, seed, **options)
    be = setup.backend
    with be.precision_scope(), be.activate():
        losses, failure = run.steps(run.num_steps, progress=progress)
        fitted = run.fitted_guide()
        fitted_setup = dataclasses.replace(setup, params=run.fitted_model_params())
        try:
            flat = fitted.sample_unconstrained(num_samples, seed=seed + 1)
            post = build_posterior(
                fitted_setup, flat[None], {}, method="vi", guide=fitted, losses=losses
            )
        except Exception:  # noqa: BLE001 - a failed run still returns what it has
            if failure is None:
                raise
            post = None
    if failure is not None and failure[2] == "interrupted":
        raise InferenceError(
            f"VI was interrupted at step {failure[0]}; the parameters it had reached are kept in "
            "error.partial (a Posterior, or the fitted guide if drawing from it failed).",
            partial=post if post is not None else fitted,
        )
    if failure is not None:
        step, last, _ = failure
        last_text = f"{last:.6g}" if last is not None else "none (the first step failed)"
        raise InferenceError(
            f"VI stopped at step {step}: the loss or its gradient is not finite. Last finite loss: "
            f"{last_text}. The parameters from before that step are kept in error.partial "
            "(a Posterior, or the fitted guide if drawing from it failed). Try a smaller lr, "
            "clip_norm=..., a smaller init_scale, or check the model's priors.",
            partial=post if post is not None else fitted,
        )
    return post


class VIRun:
    """A VI problem set up once: guide, objective, optimizer state and compiled step.

    :meth:`steps` runs (more) optimizer steps from the current state; :func:`run_vi` uses it for
    one fit, and the benchmark times it without the set-up.
    """

    def __init__(self, setup: Setup, seed: int, **options: Any):
        run_opts = {k: v for k, v in options.items() if k in _RUN_OPTIONS}
        guide_opts = {k: v for k, v in options.items() if k not in _RUN_OPTIONS}
        num_steps = run_opts.get("num_steps", 1000)
        if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
            raise ConfigError(f"num_steps must be an int >= 1, got {num_steps!r}.")
        self.num_steps = num_steps
        self.objective = ObjectiveConfig.build(
            run_opts.get("objective", "elbo"), run_opts.get("alpha"),
            run_opts.get("num_particles", 1), run_opts.get("kl", "auto"),
        )  # fmt: skip
        opt_config = OptimizerConfig.build(
            optimizer=run_opts.get("optimizer", "adam"), lr=run_opts.get("lr", 1e-2),
            momentum=run_opts.get("momentum", 0.0), schedule=run_opts.get("schedule", "constant"),
            decay=run_opts.get("decay", 0.1), clip_norm=run_opts.get("clip_norm"),
            num_steps=num_steps,
        )  # fmt: skip
        self.chunk_size = run_opts.get("chunk_size")
        batch_size = run_opts.get("batch_size")
        minibatch = minibatch_plate(setup, batch_size)
        self.setup, be = setup, setup.backend
        with be.precision_scope(), be.activate():
            init = guide_init(setup, run_opts.get("init_loc", "median"), seed)
            self.guide = build_guide(
                setup, run_opts.get("guide", "meanfield"), init, seed, guide_opts
            )
            self.guide_settings = dict(guide_opts)
            self.kl = analytic_kl_sites(setup, self.guide, self.objective)
            model_sites = {n: r for n, r in setup.sites.items() if r.kind == "param"}
            self.model_params = ModelParams(model_sites, be) if model_sites else None
            potential = _potential(
                setup, frozenset(self.kl.sites) if self.kl is not None else frozenset()
            )
            plate = minibatch[0] if minibatch else None
            #: The loss (negative objective) ``loss(params, key, x)``, for inspection and tests.
            self.loss = make_loss(
                self.guide, potential, self.objective, be, plate, self.kl, self.model_params
            )
            shapes = dict(self.guide.param_layout.shapes)
            initial = self.guide.initial_params()
            if self.model_params is not None:
                shapes.update(self.model_params.shapes)
                initial.update(self.model_params.initial())
            self.param_layout = ParamLayout(shapes)
            self._key = be.random.key(seed)
            x0 = None if not minibatch else be.asarray(np.zeros(batch_size), dtype="int")
            normal_shapes = self._recorded_draws(self.param_layout.pack(initial), x0)
            init_fn, step_fn, self._params_of = be.vi_support().optimizer_step(
                self.loss, opt_config, self.param_layout, normal_shapes=normal_shapes
            )
            self.state = init_fn(self.param_layout.pack(initial))
            self._runner = self._compile(step_fn, normal_shapes)
        self._batches = None
        if minibatch:
            self._batches = EpochBatches(minibatch[1], batch_size, seed, num_batches=num_steps)

    def _recorded_draws(self, initial: np.ndarray, x0):
        """The standard-normal draws one loss evaluation makes (:mod:`ppl_bdl.prefetch`): JAX
        draws them for a whole chunk before the loop, torch traces the loss with them as inputs.
        None for a custom guide: it draws through its sample sites, with the key."""
        if isinstance(self.guide, CustomGuide):
            return None
        be = self.setup.backend
        params = self.param_layout.unpack(be.asarray(initial))
        return prefetch.record_normal_shapes(be, self.loss, params, self._key, x0)

    def _compile(self, step_fn, normal_shapes):
        """The compiled chunk runner.

        On JAX (a pure step, compiled loop): the guide's standard normals are drawn for the
        whole chunk before the loop (:mod:`ppl_bdl.prefetch`), and the loop checks only that
        the loss is finite and does not freeze its carry (a select over the whole optimizer
        state every step), and each step's inputs are staged through the loop's carry (see
        ``compile_loop``). A failed chunk is run again from its start by a second, frozen
        runner that checks the gradients too (:meth:`_recover`): the same keys and batches give
        the same steps, so it stops where the run went wrong and keeps the state from before.
        On torch the step itself skips a non-finite update and the loop stops there.
        """
        be = self.setup.backend
        full_check = lambda out: out[1]  # noqa: E731
        self.max_chunk = MAX_CHUNK
        self._recovery = None
        #: JAX compiles one chunk length: a shorter last chunk runs padded (``partial``).
        self._pads_chunks = getattr(be, "array_family", "") == "jax"
        if not self._pads_chunks:
            return be.compile_loop(step_fn, check=full_check)
        prologue, step = None, step_fn
        if be.prefetch_normals and normal_shapes:
            self.max_chunk = min(MAX_CHUNK, prefetch.chunk_limit(normal_shapes))
            prologue, step = prefetch.prefetching_loop(be, step_fn, normal_shapes)

        def loss_only(carry, key, x):
            carry, (loss, _) = step(carry, key, x)
            return carry, (loss,)

        staged = dict(prologue=prologue, stage_inputs=True, partial=True)
        # compiled on the first failure only
        self._recovery = functools.cache(lambda: be.compile_loop(step, check=full_check, **staged))
        finite_loss = lambda out: be.math.isfinite(out[0])  # noqa: E731
        return be.compile_loop(loss_only, check=finite_loss, freeze=False, **staged)

    def _recover(self, chunk: _Chunk):
        """Re-run a failed chunk with the frozen, fully checked runner; return its result."""
        return self._recovery()(chunk.state, chunk.key, chunk.xs, chunk.length, chunk.active)

    def steps(self, num_steps: int, progress: bool = False):
        """Run ``num_steps`` steps in compiled chunks; stop at the first non-finite loss.

        Returns the losses (NumPy, one per step run) and ``None`` or ``(step, last finite loss,
        reason)`` with reason "nonfinite" or "interrupted" (Ctrl-C); the state from before the
        failed step, or at the end of the last finished chunk, is kept.
        """
        be = self.setup.backend
        chunk = _chunk_size(self.chunk_size, num_steps, progress, self.max_chunk)
        losses: list[np.ndarray] = []
        bar = _progress_bar(num_steps) if progress else None
        scope = be.vi_support().run_scope(self.guide.param_layout.size)

        def dispatch(start: int, previous: _Chunk | None) -> _Chunk:
            n = min(chunk, num_steps - start)
            length = chunk if self._pads_chunks else n
            active = n if length > n else None
            xs = None
            if self._batches is not None:
                idx = self._batches.next_block(n)
                if length > n:  # padded steps (they leave the state as it is) reuse the last batch
                    idx = np.concatenate([idx, np.repeat(idx[-1:], length - n, axis=0)])
                xs = be.asarray(idx, dtype="int")
            self._key, key = be.random.split(self._key)
            state = self.state if previous is None else previous.result.carry
            result = self._runner(state, key, xs, length, active=active)
            return _Chunk(n, length, active, state, key, xs, result)

        done = 0
        try:
            with be.precision_scope(), be.activate(), scope:
                # Each chunk is queued before the previous one is read (ppl_bdl.inference.chunks).
                queued = run_ahead(dispatch, range(0, num_steps, chunk), chunks_ahead(be))
                while done < num_steps:
                    try:
                        chunk_run = next(queued)
                        n, result = chunk_run.n, chunk_run.result
                        if _failed_at(result, n) is not None and self._recovery is not None:
                            result = self._recover(chunk_run)
                    except KeyboardInterrupt:  # keep the parameters of the chunks that finished
                        so_far = np.concatenate(losses) if losses else np.zeros(0)
                        return so_far, (done, None, "interrupted")
                    self.state = result.carry
                    values = np.asarray(be.to_numpy(result.outputs[0]), dtype=float).reshape(-1)
                    values = values[:n]
                    failed_at = _failed_at(result, n)
                    if failed_at is not None:
                        losses.append(values[:failed_at])
                        so_far = np.concatenate(losses)
                        last = float(so_far[-1]) if so_far.size else None
                        return so_far, (done + failed_at, last, "nonfinite")
                    losses.append(values)
                    done += n
                    if bar is not None:
                        bar.update(n)
                        bar.set_postfix(loss=f"{values[-1]:.4g}")
        finally:
            if bar is not None:
                bar.close()
        return np.concatenate(losses), None

    def fitted_guide(self) -> FittedGuide:
        """The guide at the current parameters."""
        flat = self._params_of(self.state)
        return FittedGuide(
            self.guide, flat[: self.guide.param_layout.size], settings=self.guide_settings
        )

    def fitted_model_params(self) -> dict:
        """The model's ``param`` sites at their fitted values (backend arrays)."""
        if self.model_params is None:
            return dict(self.setup.params)
        be = self.setup.backend
        params = self.param_layout.unpack(be.asarray(self._params_of(self.state)))
        with be.precision_scope(), be.activate():
            return self.model_params.constrained(params, be.math)


class _Chunk(NamedTuple):
    """A dispatched chunk: its steps (n, of ``length`` compiled ones when padded: ``active``),
    the state and inputs it started from, its result."""

    n: int
    length: int
    active: int | None
    state: Any
    key: Any
    xs: Any
    result: Any


def _failed_at(result, n: int) -> int | None:
    """The chunk's first failed step among its ``n`` real ones (padded steps do not count)."""
    stopped = result.stopped_at
    return stopped if stopped is not None and stopped < n else None


def guide_init(setup: Setup, init_loc: Any, seed: int) -> GuideInit:
    """The guide's initial mean (``init_loc``: "prior", "median" or a dict of site values) and
    per-coordinate prior scale, both from prior draws in the unconstrained space."""
    dim = setup.layout.dim
    if isinstance(init_loc, np.ndarray | list | tuple):
        loc = np.asarray(init_loc, dtype=float).reshape(-1)
        if loc.shape != (dim,):
            raise ConfigError(f"init_loc has {loc.size} values; the model has {dim} latent dims.")
    elif not (isinstance(init_loc, dict) or init_loc in ("prior", "median")):
        raise ConfigError(
            f"init_loc must be 'prior', 'median', a dict of site values or a flat array, got {init_loc!r}."
        )
    try:
        draws = initial_positions(setup, "prior", INIT_DRAWS, seed)
    except ModelError:  # an improper (flat) prior has no draws: fall back to N(0, 1)-ish
        draws = None
    if draws is None or not np.all(np.isfinite(draws)):
        scale = np.ones(dim)
        center = np.zeros(dim)
        first = np.zeros(dim)
    else:
        scale = np.clip(draws.std(axis=0), 1e-3, 1e3)
        center, first = np.median(draws, axis=0), draws[0]
    if isinstance(init_loc, dict):
        loc = initial_positions(setup, init_loc, 1, seed)[0]
    elif isinstance(init_loc, str):
        loc = first if init_loc == "prior" else center
    return GuideInit(loc=np.asarray(loc, dtype=float), prior_scale=np.asarray(scale, dtype=float))


def build_guide(setup: Setup, spec: Any, init: GuideInit, seed: int, settings: dict):
    """A guide from a registered name or a ``@bdl.guide`` function, with its settings checked."""
    bound = bind_guide(spec, setup.bound)
    if bound is not None:
        if settings:
            raise ConfigError(
                f"option(s) {sorted(settings)} do not apply to a custom guide (they configure the "
                "built-in guides). Known VI options: " + ", ".join(sorted(_RUN_OPTIONS)) + "."
            )
        return CustomGuide(setup.layout, setup.backend, init, bound, seed=seed)
    if not isinstance(spec, str):
        raise ConfigError(
            f"guide must be a name ({', '.join(guide_registry.available())}) or a @bdl.guide "
            f"function, got {type(spec).__name__}."
        )
    factory = guide_registry.get(spec)
    accepted = set(inspect.signature(factory).parameters) - {"layout", "backend", "init", "seed"}
    unknown = set(settings) - accepted
    if unknown:
        raise ConfigError(
            f"unknown option(s) {sorted(unknown)} for method='vi' with guide={spec!r}. Guide "
            f"settings: {sorted(accepted) or 'none'}; VI options: {sorted(_RUN_OPTIONS)}."
        )
    return factory(setup.layout, setup.backend, init, seed=seed, **settings)


def _potential(setup: Setup, exclude: frozenset):
    """U(θ, batch, params) with the model's ``param`` sites given per call (VI optimises them)."""
    return make_potential(setup.bound, setup.backend, setup.layout, setup.params, exclude)


def _chunk_size(chunk: Any, num_steps: int, progress: bool, limit: int = MAX_CHUNK) -> int:
    if chunk is not None:
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            raise ConfigError(f"chunk_size must be an int >= 1, got {chunk!r}.")
        return min(chunk, num_steps)
    if progress:
        return max(1, min(limit, _pymath.ceil(num_steps / 20)))
    # Chunks as equal as fit the limit: the fewest padded steps in the last one.
    return _pymath.ceil(num_steps / _pymath.ceil(num_steps / limit))


def _progress_bar(total: int):
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm ships with numpyro and pyro
        return None
    return tqdm(total=total, desc="vi", file=sys.stderr, leave=False)
