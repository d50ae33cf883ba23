"""Training a score model by score matching, on the project's one loop.

Each step t takes a minibatch x_0 of B data points and descends, with the backend's optimizer,

- ``score_matching="denoising"`` (the default): the weighted denoising objective of
  :mod:`ppl_bdl.inference.diffusion.objectives` (Vincent 2011; "Bayesian Computation in Deep
  Learning", Eq. 3.11; Song et al. 2021, Eq. 7 with λ(t) = σ(t)²), one t ~ U(t_min, 1) and one
  z ~ N(0, I) per point, drawn in the step;
- ``score_matching="exact"``: Hyvärinen's objective (Eq. 3.10) for a score of x alone, the trace
  of its Jacobian by D forward-mode products (small D only).

The steps are a :class:`~ppl_bdl.inference.loop.driver.Transition` run by the project's driver, as
the EBM's training is (:mod:`ppl_bdl.inference.ebm.loop`): one jitted loop per chunk on JAX, a
traced step in a plain loop on torch.

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import nn
>>> X = np.random.default_rng(0).normal(1.0, 0.5, size=(500, 1))
>>> net = nn.MLP("score", [1 + 1, 32, 1], activation="silu", prior=nn.he_normal())
>>> model = bdl.diffusion.fit(net, X, sde="vp", backend="numpyro", num_steps=200, lr=3e-3)
>>> model.losses.shape
(200,)
>>> bool(model.losses[-50:].mean() < model.losses[:50].mean())
True
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ppl_bdl.backends import get as get_backend
from ppl_bdl.dsl import random as br
from ppl_bdl.errors import ConfigError, DataError, InferenceError
from ppl_bdl.inference.diffusion.model import ScoreModel
from ppl_bdl.inference.diffusion.objectives import dsm_loss, exact_loss
from ppl_bdl.inference.diffusion.score import NetworkScore
from ppl_bdl.inference.diffusion.sde import make_sde
from ppl_bdl.inference.ebm.energy import check_data
from ppl_bdl.inference.ebm.loop import ResumableTraining, checked_int
from ppl_bdl.inference.loop.driver import Rates, Transition
from ppl_bdl.inference.loop.minibatch import EpochBatches
from ppl_bdl.optim import OptimizerConfig, unit_schedule

#: The objectives ``score_matching=`` names.
OBJECTIVES = ("denoising", "exact")


def fit(
    net,
    X,
    *,
    sde: Any = "ve",
    backend: str | None = None,
    score_matching: str = "denoising",
    time_features: int = 0,
    batch_size: int | None = None,
    num_steps: int = 2000,
    optimizer: str = "adam",
    lr: float = 1e-3,
    lr_schedule: str = "cosine",
    clip_norm: float | None = None,
    seed: int = 0,
    precision: str = "float32",
    device: str | None = None,
    chunk_size: int | None = None,
    progress: bool = False,
) -> ScoreModel:
    """Train the score network ``net`` on the points ``X`` by score matching (the module's
    steps; docs/diffusion.md).

    Parameters
    ----------
    net : ppl_bdl.dsl.nn.Module
        s_θ: a :mod:`ppl_bdl.dsl.nn` network, started from one draw of its priors. With an SDE
        it maps (B, D + 1 + 2K) — the point, t and K = ``time_features`` Fourier pairs of t — to
        (B, D), its output divided by σ(t) (:mod:`ppl_bdl.inference.diffusion.score`); for
        ``score_matching="exact"`` it maps (B, D) to (B, D).
    X : array (N, D)
        The data: N points of D numbers.
    sde : "ve", "vp", VESDE or VPSDE
        The forward SDE (:mod:`ppl_bdl.inference.diffusion.sde`); "ve" takes σ_max from the
        data. Not used by ``score_matching="exact"``.
    score_matching : {"denoising", "exact"}
        The objective: weighted denoising score matching over t (Eq. 3.11), or Hyvärinen's for
        a score of x alone (Eq. 3.10).
    batch_size, num_steps : int
        B, points per step (default: 128, or N if smaller); T, the steps.
    optimizer, lr, lr_schedule, clip_norm
        The optimizer of θ ("adam" or "sgd"), its learning rate and schedule over the T steps
        (:mod:`ppl_bdl.optim`), and the gradient's norm clip.
    backend, seed, precision, device, chunk_size, progress
        As for :func:`ppl_bdl.run.fit` ("numpyro" or "pyro"; same seed, same fit).

    Returns
    -------
    ScoreModel
        ``.score(x, t)``, ``.sample(n, sampler=...)``, ``.losses``, ``.params``.

    Raises
    ------
    InferenceError
        When a step's loss or gradient is not finite (or at Ctrl-C): training stops there;
        ``error.partial`` is the model at the parameters from before that step.
    """
    trainer = ScoreTrainer(
        net,
        X,
        sde=sde,
        backend=backend,
        score_matching=score_matching,
        time_features=time_features,
        batch_size=batch_size,
        num_steps=num_steps,
        optimizer=optimizer,
        lr=lr,
        lr_schedule=lr_schedule,
        clip_norm=clip_norm,
        seed=seed,
        precision=precision,
        device=device,
        chunk_size=chunk_size,
    )
    trainer.run(num_steps, progress=progress)
    if trainer.failure is not None:
        raise InferenceError(_failure_message(trainer), partial=trainer.model)
    return trainer.model


class ScoreTrainer(ResumableTraining):
    """The training set up once (checks, initial parameters, the transition): :meth:`run` runs
    (more) steps from where the last call stopped, :attr:`model` holds the result. Takes
    :func:`fit`'s arguments (``num_steps`` is the learning-rate schedule's horizon);
    ``benchmarks/diffusion_step.py`` times :meth:`run`.

    Example
    -------
    >>> import numpy as np
    >>> from ppl_bdl import nn
    >>> from ppl_bdl.inference.diffusion.trainer import ScoreTrainer
    >>> X = np.random.default_rng(0).normal(size=(200, 2))
    >>> trainer = ScoreTrainer(nn.MLP("s", [3, 16, 2]), X, backend="numpyro", num_steps=40)
    >>> trainer.run(20); trainer.run(20)
    >>> trainer.model.losses.shape
    (40,)
    """

    def __init__(
        self,
        net,
        X,
        *,
        sde="ve",
        backend=None,
        score_matching="denoising",
        time_features=0,
        batch_size=None,
        num_steps=2000,
        optimizer="adam",
        lr=1e-3,
        lr_schedule="cosine",
        clip_norm=None,
        seed=0,
        precision="float32",
        device=None,
        chunk_size=None,
    ):
        backend = get_backend(backend, precision, device)
        X = check_data(X, backend.precision)
        if X.ndim != 2:
            raise DataError(
                f"X has shape {X.shape}; a score model takes points of D numbers, (N, D). "
                f"Flatten them first: X.reshape(len(X), -1)."
            )
        if score_matching not in OBJECTIVES:
            raise ConfigError(
                f"unknown score_matching {score_matching!r}; expected one of {list(OBJECTIVES)}."
            )
        exact = score_matching == "exact"
        if exact and sde != "ve":
            raise ConfigError(
                f"score_matching='exact' trains a score of x alone, with no SDE; leave sde "
                f"unset (got sde={sde!r})."
            )
        sde = None if exact else make_sde(sde).fitted_to(X)
        n = len(X)
        batch_size = min(128, n) if batch_size is None else batch_size
        batch_size = checked_int("batch_size", batch_size, 1, n, f"at most the {n} points of X")
        num_steps = checked_int("num_steps", num_steps, 1, None, "")
        opt = OptimizerConfig.build(
            optimizer=optimizer,
            lr=lr,
            schedule=lr_schedule,
            clip_norm=clip_norm,
            num_steps=num_steps,
        )
        model = _initial_model(net, X, sde, backend, time_features, seed)
        model.settings = dict(
            sde=sde,
            score_matching=score_matching,
            time_features=time_features,
            batch_size=batch_size,
            num_steps=num_steps,
            optimizer=optimizer,
            lr=lr,
            lr_schedule=lr_schedule,
            clip_norm=clip_norm,
            seed=seed,
        )
        self.model, self.backend, self.seed, self.chunk_size = model, backend, int(seed), chunk_size
        self._position = np.zeros(1, np.float32)
        self._data = backend.asarray(X)
        self._batches = EpochBatches(n, batch_size, [int(seed), 5])
        self.transition = _training_transition(backend, model, opt, batch_size)
        self._rates = Rates(opt.lr, unit_schedule(opt))
        self._start()

    @property
    def run_name(self) -> str:
        return "diffusion"

    def _read_back(self) -> None:
        _read_back(self.model, self._state, self._infos)


def _initial_model(net, X, sde, backend, time_features, seed) -> ScoreModel:
    """The model at one draw of the network's priors, its shapes checked on two rows of X."""
    features = checked_int("time_features", time_features, 0, None, "")
    settings = dict(dim=X.shape[1], sde=sde, time_features=features)
    params = NetworkScore(net, backend, **settings).initial_params(seed)
    model = ScoreModel(net, params, backend=backend, **settings)
    model._score.check(model.params, X)
    if sde is None:  # Langevin on a score of x alone starts from the data's scale
        model.start_loc, model.start_scale = X.mean(0), X.std(0) + 1e-12
    return model


def _training_transition(backend, model: ScoreModel, opt_config, batch_size: int) -> Transition:
    """One step of score matching on a minibatch as a transition (see the module docstring)."""
    score, sde, dim = model._score, model.sde, model.dim
    optimizer = backend.optimizer(opt_config)
    if sde is None:

        def loss(params, x0, t, z):
            return exact_loss(backend, score, params, x0)

    else:

        def loss(params, x0, t, z):
            return dsm_loss(score, sde, params, x0, t, z)

    with backend.scope(), backend.activate():
        params0 = model.device_params()
        rows = backend.asarray(np.zeros((batch_size, dim)))
        times = backend.asarray(np.full(batch_size, 0.5))
        grad = backend.value_and_grad(loss)
        # distinct example inputs: a tracer may merge one tensor passed twice into one input
        grad = backend.trace(grad, (params0, rows, times, rows + 1.0))
    t_min = 0.0 if sde is None else sde.t_min

    def init(key, position, data):
        params = model.device_params()  # fresh arrays: torch's optimizer updates them in place
        return {"params": params, "optimizer": optimizer.init(params)}

    def step(key, state, batch, lr):
        key_t, key_z = backend.random.split(key, 2)
        x0 = batch.data[batch.indices]
        t = br.uniform(key_t, (batch_size,), t_min, 1.0)
        z = br.normal(key_z, (batch_size, dim))
        value, grads = grad(state["params"], x0, t, z)
        m = backend.math
        grad_norm = m.sqrt(sum(m.sum(g * g) for g in grads.values()))
        ok = m.isfinite(value) & m.isfinite(grad_norm)
        params, opt_state = optimizer.update(grads, state["optimizer"], state["params"], ok, lr)
        return {"params": params, "optimizer": opt_state}, {"loss": value, "grad_norm": grad_norm}

    return Transition(init, step, lambda state: {})


def _read_back(model: ScoreModel, state, infos: list) -> None:
    """The trained parameters and per-step infos into ``model`` (after a failure: the state
    from before the failed step)."""
    backend = model.backend
    if state is not None:
        with backend.scope(), backend.activate():
            model.params = {
                k: np.asarray(backend.to_numpy(v), dtype=float) for k, v in state["params"].items()
            }
    parts = [i for i in infos if i]
    model.history = (
        {k: np.concatenate([np.asarray(i[k][0], dtype=float) for i in parts]) for k in parts[0]}
        if parts
        else {}
    )
    model.losses = model.history.get("loss", np.zeros(0))


def _failure_message(trainer: ScoreTrainer) -> str:
    failure, model = trainer.failure, trainer.model
    if failure.reason == "interrupted":
        return (
            f"score-model training was interrupted at step {failure.step}; the model at the "
            "parameters it had reached is in error.partial."
        )
    last = f"{model.losses[-1]:.6g}" if model.losses.size else "none (the first step failed)"
    return (
        f"score-model training stopped at step {failure.step}: the loss or its gradient is not "
        f"finite (last finite loss: {last}). The model at the parameters from before that step "
        "is in error.partial. Try a smaller lr or clip_norm=1.0."
    )
