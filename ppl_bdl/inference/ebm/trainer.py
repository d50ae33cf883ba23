"""Training an energy-based model by Algorithm 3 of "Bayesian Computation in Deep Learning", on the project's one loop.

p_θ(x) = exp(−E_θ(x)) / Z_θ (Eq. 3.1) is fitted by maximum likelihood (Eq. 3.2). The gradient of
log p_θ(x) holds ∇_θ log Z_θ = −E_{x̃ ~ p_θ}[∇_θ E_θ(x̃)] (Eqs. 3.3-3.4), estimated with samples
x̃ of the current model, so each step t of Algorithm 3

1. starts B chains x_0 (line 3): from the replay buffer of persistent chains (Tieleman 2008),
   each restarted with probability ``reinit``; or, with ``persistent=False``, from uniform noise
   in the data's range (Nijkamp et al. 2019) or from the data minibatch (contrastive divergence,
   Hinton 2002);
2. runs K = ``chain_steps`` steps of an SG-MCMC kernel on the inputs (lines 4-6; with ``sgld``
   the Langevin update of Eq. 3.7, x_{k+1} = x_k − α_k ∇_x E_θ(x_k) + √(2 α_k) ε_k, using
   ∇_x log p_θ = −∇_x E_θ, Eq. 3.6), giving the negative samples x⁻ = x_K (line 7);
3. takes a data minibatch x⁺ (line 9) and descends the loss
   L(θ) = mean E_θ(x⁺) − mean E_θ(x⁻) (+ ``energy_l2`` · (mean E_θ(x⁺)² + mean E_θ(x⁻)²), the
   regulariser of Du and Mordatch 2019, off by default), whose gradient is minus the estimate of
   Eq. 3.5 (line 10), with the backend's optimizer (line 11);
4. puts x⁻ back into the buffer.

The outer loop is a :class:`~ppl_bdl.inference.loop.driver.Transition` run by the project's driver
(:mod:`ppl_bdl.inference.ebm.loop`); the K chain steps are unrolled inside one loop step.

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import nn
>>> X = np.random.default_rng(0).normal([1.0, -1.0], 0.5, size=(500, 2))
>>> net = nn.MLP("energy", [2, 32, 1], activation="silu", prior=nn.he_normal())
>>> ebm = bdl.ebm.fit(net, X, backend="numpyro", num_steps=300, batch_size=100,
...                   step_size=0.01, chain_steps=10, lr=3e-3)
>>> ebm.losses.shape
(300,)
>>> x = ebm.sample(500)
>>> bool(np.abs(x.mean(0) - X.mean(0)).max() < 0.2)
True
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ppl_bdl.backends import get as get_backend
from ppl_bdl.dsl import math as bm
from ppl_bdl.errors import ConfigError, InferenceError
from ppl_bdl.inference.ebm.chains import (
    ReplayBuffer,
    box_of,
    flat_size,
    input_value_and_grad,
    run_chain,
    tiled_bounds,
    uniform_box,
)
from ppl_bdl.inference.ebm.energy import Energy, check_data
from ppl_bdl.inference.ebm.loop import ResumableTraining, checked_int
from ppl_bdl.inference.ebm.model import EnergyModel
from ppl_bdl.inference.loop.driver import Rates, Transition
from ppl_bdl.inference.loop.minibatch import EpochBatches
from ppl_bdl.optim import OptimizerConfig, unit_schedule

STARTS = ("noise", "data")


def fit(
    energy,
    X,
    *,
    backend: str | None = None,
    sampler: str = "sgld",
    chain_steps: int = 20,
    step_size: float = 0.01,
    schedule: str = "constant",
    persistent: bool = True,
    buffer_size: int | None = None,
    reinit: float = 0.05,
    start: str = "noise",
    batch_size: int = 100,
    num_steps: int = 1000,
    optimizer: str = "adam",
    lr: float = 1e-3,
    lr_schedule: str = "cosine",
    clip_norm: float | None = None,
    energy_l2: float = 0.0,
    seed: int = 0,
    precision: str = "float32",
    device: str | None = None,
    chunk_size: int | None = None,
    progress: bool = False,
    **chain_options: Any,
) -> EnergyModel:
    """Train the energy network ``energy`` on the points ``X`` by Algorithm 3 of "Bayesian
    Computation in Deep Learning" (the module's steps; docs/ebm.md maps each option to its line
    of the algorithm).

    Parameters
    ----------
    energy : ppl_bdl.dsl.nn.Module
        E_θ(x): a :mod:`ppl_bdl.dsl.nn` network or a lifted torch/equinox module (:func:`nn.lift`)
        mapping ``(B, *event)`` to (B,) or (B, 1), started from one draw of its priors.
    X : array ``(N, *event)``
        The data: N points (rows), e.g. (N, 2), or images (N, C, H, W).
    sampler, chain_steps : str, int
        The SG-MCMC kernel run on the inputs (``bdl.kernels.available()``; "sgld" is Eq. 3.7)
        and K, its steps per update; its own settings (``temperature``, ``clip=True`` to stay
        in the data's range, ...) go in ``**chain_options``.
    step_size, schedule : float, str
        α_k = ``step_size`` × the schedule's shape over the K steps
        (:mod:`ppl_bdl.inference.mcmc.schedules`).
    persistent, buffer_size, reinit, start : bool, int, float, {"noise", "data"}
        Chains go on from a replay buffer (default 10 × ``batch_size`` chains, each restarted
        with probability ``reinit``), or start afresh from uniform noise in the data's range or
        from the data minibatch (contrastive divergence).
    batch_size, num_steps : int
        B, data points and chains per update; T, the updates.
    optimizer, lr, lr_schedule, clip_norm, energy_l2 : str, float, str, float, float
        The optimizer of θ ("adam" or "sgd"), its learning rate and schedule over the T updates
        (:mod:`ppl_bdl.optim`); the energy-magnitude regulariser's weight (0: as
        Algorithm 3 is written).
    backend, seed, precision, device, chunk_size, progress
        As for :func:`ppl_bdl.run.fit` ("numpyro" or "pyro"; same seed, same fit).

    Returns
    -------
    EnergyModel
        The trained network (``.params``, ``.energy(x)``, ``.sample(n)``, ``.losses``).

    Raises
    ------
    InferenceError
        When a step's loss, energies or gradient is not finite (or at Ctrl-C): training stops
        there; ``error.partial`` is the model at the parameters from before that step.
    """
    trainer = EBMTrainer(
        energy,
        X,
        backend=backend,
        sampler=sampler,
        chain_steps=chain_steps,
        step_size=step_size,
        schedule=schedule,
        persistent=persistent,
        buffer_size=buffer_size,
        reinit=reinit,
        start=start,
        batch_size=batch_size,
        num_steps=num_steps,
        optimizer=optimizer,
        lr=lr,
        lr_schedule=lr_schedule,
        clip_norm=clip_norm,
        energy_l2=energy_l2,
        seed=seed,
        precision=precision,
        device=device,
        chunk_size=chunk_size,
        **chain_options,
    )
    trainer.run(num_steps, progress=progress)
    if trainer.failure is not None:
        message = _failure_message(trainer.failure, trainer.model)
        raise InferenceError(message, partial=trainer.model)
    return trainer.model


class EBMTrainer(ResumableTraining):
    """Algorithm 3 set up once (checks, initial parameters, the transition): :meth:`run` runs
    (more) updates from where the last call stopped, and :attr:`model` holds the result.
    :func:`fit` uses it for one run; ``benchmarks/ebm_step.py`` times :meth:`run` after a
    warm-up, with the compiled loop reused. Takes :func:`fit`'s arguments (``num_steps`` is the
    learning-rate schedule's horizon).

    Example
    -------
    >>> import numpy as np
    >>> from ppl_bdl import nn
    >>> from ppl_bdl.inference.ebm.trainer import EBMTrainer
    >>> X = np.random.default_rng(0).normal(size=(300, 2))
    >>> trainer = EBMTrainer(nn.MLP("e", [2, 16, 1], prior=nn.he_normal()), X,
    ...                      backend="numpyro", num_steps=40, chain_steps=5)
    >>> trainer.run(20); trainer.run(20)
    >>> trainer.model.losses.shape
    (40,)
    """

    def __init__(
        self,
        energy,
        X,
        *,
        backend=None,
        sampler="sgld",
        chain_steps=20,
        step_size=0.01,
        schedule="constant",
        persistent=True,
        buffer_size=None,
        reinit=0.05,
        start="noise",
        batch_size=100,
        num_steps=1000,
        optimizer="adam",
        lr=1e-3,
        lr_schedule="cosine",
        clip_norm=None,
        energy_l2=0.0,
        seed=0,
        precision="float32",
        device=None,
        chunk_size=None,
        **chain_options,
    ):
        backend = get_backend(backend, precision, device)
        X = check_data(X, backend.precision)
        n, event = len(X), X.shape[1:]
        batch_size = checked_int("batch_size", batch_size, 1, n, f"at most the {n} points of X")
        num_steps = checked_int("num_steps", num_steps, 1, None, "")
        if not isinstance(persistent, bool):
            raise ConfigError(f"persistent must be True or False, got {persistent!r}.")
        if start not in STARTS:
            raise ConfigError(f"start must be one of {list(STARTS)}, got {start!r}.")
        if isinstance(energy_l2, bool) or not isinstance(energy_l2, int | float) or energy_l2 < 0:
            raise ConfigError(f"energy_l2 must be a number >= 0, got {energy_l2!r}.")
        opt = OptimizerConfig.build(
            optimizer=optimizer,
            lr=lr,
            schedule=lr_schedule,
            clip_norm=clip_norm,
            num_steps=num_steps,
        )
        self.buffer = None
        if persistent:
            size = 10 * batch_size if buffer_size is None else buffer_size
            self.buffer = ReplayBuffer(size, batch_size, reinit)
        model = EnergyModel(
            energy,
            Energy(energy, backend).initial_params(seed),
            event_shape=event,
            box=box_of(X),
            backend=backend,
            sampler=sampler,
            step_size=step_size,
            chain_steps=chain_steps,
            schedule=schedule,
            **chain_options,
        )
        model._energy.check(model.params, X)
        model.settings = dict(
            sampler=sampler,
            chain_steps=chain_steps,
            step_size=step_size,
            schedule=schedule,
            persistent=persistent,
            buffer_size=None if self.buffer is None else self.buffer.size,
            reinit=reinit,
            start=start,
            batch_size=batch_size,
            num_steps=num_steps,
            optimizer=optimizer,
            lr=lr,
            lr_schedule=lr_schedule,
            clip_norm=clip_norm,
            energy_l2=energy_l2,
            seed=seed,
            **chain_options,
        )
        self.model, self.backend, self.seed, self.chunk_size = model, backend, int(seed), chunk_size
        rng = np.random.default_rng([int(seed), 3])
        self._position = np.zeros(1, X.dtype)
        if self.buffer is not None:
            self._position = _initial_buffer(rng, X, model.box, self.buffer.size).reshape(-1)
        self._data = backend.asarray(X)
        self._batches = EpochBatches(n, batch_size, [int(seed), 5])
        self.transition = _training_transition(
            backend, model, opt, self.buffer, start, batch_size, energy_l2
        )
        self._rates = Rates(opt.lr, unit_schedule(opt))
        self._start()

    @property
    def run_name(self) -> str:
        return f"ebm ({self.model.chain.sampler})"

    def _read_back(self) -> None:
        _read_back(self.model, self._state, self.buffer, self._infos)


def _training_transition(backend, model: EnergyModel, opt_config, buffer, start, batch_size, l2):
    """Algorithm 3's step t as a transition (see the module docstring)."""
    energy, chain = model._energy, model.chain
    shape = (batch_size, *model.event_shape)
    rows = (batch_size, flat_size(model.event_shape))
    steps = chain.chain_steps
    optimizer = backend.optimizer(opt_config)

    def loss(params, x_pos, x_neg):
        e_pos, e_neg = energy(params, x_pos), energy(params, x_neg)
        mean_pos, mean_neg = bm.mean(e_pos), bm.mean(e_neg)
        value = mean_pos - mean_neg  # minus Eq. 3.5: descending it ascends the log-likelihood
        if l2:
            value = value + l2 * (bm.mean(e_pos * e_pos) + bm.mean(e_neg * e_neg))
        return value, (mean_pos, mean_neg)

    with backend.scope(), backend.activate():
        params0 = model.device_params()
        x_example = backend.asarray(np.zeros(shape))
        chain_grad = input_value_and_grad(backend, energy, shape)
        chain_grad = backend.trace(
            chain_grad, (backend.asarray(np.zeros(rows[0] * rows[1])), params0)
        )
        kernel = chain.kernel(chain_grad, steps)
        sizes = backend.asarray(chain.step_sizes(backend, steps))
        low, high = (backend.asarray(b) for b in model.box)
        bounds = tiled_bounds(backend, model.box, batch_size, chain.clip)
        theta_grad = backend.value_and_grad(loss, has_aux=True)
        # two distinct example inputs: a tracer may merge one tensor passed twice into one input
        theta_grad = backend.trace(theta_grad, (params0, x_example, x_example + 1.0))

    def init(key, position, data):
        params = model.device_params()  # fresh arrays: torch's optimizer updates them in place
        state = {"params": params, "optimizer": optimizer.init(params)}
        if buffer is not None:
            state["buffer"] = bm.reshape(position, (buffer.size, rows[1]))
        return state

    def step(key, state, batch, lr):
        keys = backend.random.split(key, 3)
        x_pos = batch.data[batch.indices]  # x⁺ ~ D (line 9)
        fresh = (
            bm.reshape(x_pos, rows) if start == "data" else uniform_box(keys[0], rows, low, high)
        )
        x0 = fresh if buffer is None else buffer.take(state["buffer"], keys[1], fresh)  # line 3
        x0 = bm.reshape(x0, (-1,))
        chain_keys = backend.random.keys(keys[2], steps)
        x_neg = run_chain(
            backend, kernel, sizes, chain_keys, x0, state["params"], bounds
        )  # lines 4-6
        x_neg = bm.reshape(x_neg, shape)  # x⁻ = x_K (line 7)
        (value, (e_pos, e_neg)), grads = theta_grad(state["params"], x_pos, x_neg)  # line 10
        m = backend.math
        grad_norm = m.sqrt(sum(m.sum(g * g) for g in grads.values()))
        ok = m.isfinite(value) & m.isfinite(grad_norm)
        params, opt_state = optimizer.update(grads, state["optimizer"], state["params"], ok, lr)
        new = {"params": params, "optimizer": opt_state}  # line 11
        if buffer is not None:
            new["buffer"] = buffer.put(state["buffer"], bm.reshape(x_neg, rows))
        info = {
            "loss": value,
            "energy_data": e_pos,
            "energy_samples": e_neg,
            "grad_norm": grad_norm,
        }
        return new, info

    return Transition(init, step, lambda state: {})


def _initial_buffer(rng, X: np.ndarray, box, size: int) -> np.ndarray:
    """The persistent chains before training: uniform noise in the data's range."""
    low, high = box
    flat = low + (high - low) * rng.uniform(size=(size, low.size))
    return flat.astype(X.dtype)


def _read_back(model: EnergyModel, state, buffer, infos: list) -> None:
    """The trained parameters, buffer and per-step infos into ``model`` (after a failure: the
    state from before the failed step)."""
    backend = model.backend
    if state is not None:
        with backend.scope(), backend.activate():
            model.params = {
                k: np.asarray(backend.to_numpy(v), dtype=float) for k, v in state["params"].items()
            }
            if buffer is not None:
                rows = np.asarray(backend.to_numpy(state["buffer"]))
                model.buffer = rows.reshape((buffer.size, *model.event_shape))
    parts = [i for i in infos if i]
    model.history = (
        {k: np.concatenate([np.asarray(i[k][0], dtype=float) for i in parts]) for k in parts[0]}
        if parts
        else {}
    )
    model.losses = model.history.get("loss", np.zeros(0))


def _failure_message(failure, model: EnergyModel) -> str:
    step = failure.step
    if failure.reason == "interrupted":
        return (
            f"EBM training was interrupted at step {step}; the model at the parameters it had "
            "reached is in error.partial."
        )
    last = f"{model.losses[-1]:.6g}" if model.losses.size else "none (the first step failed)"
    return (
        f"EBM training stopped at step {step}: the loss, an energy or the gradient is not finite "
        f"(last finite loss: {last}). The model at the parameters from before that step is in "
        f"error.partial. Try a smaller step_size (now {model.chain.step_size}: the chains on the "
        f"inputs may have diverged), a smaller lr, clip_norm=..., or energy_l2=0.1."
    )
