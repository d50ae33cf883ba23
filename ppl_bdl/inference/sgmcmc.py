"""SG-MCMC: a registered kernel, its step-size schedule and minibatches, run by the one driver.

:func:`sgmcmc_transition` builds the per-chain transition every runner shares (``fit``'s driver,
and the native adapters that let ``numpyro.infer.MCMC`` / ``pyro.infer.MCMC`` drive our kernels):
the kernel gets the minibatch potential Ũ(θ) of the chapter's Eq. 2.8 and its gradient, and the
step size of the schedule at the chain's step counter. :func:`run_sgmcmc` plans the run (warmup,
thinning, the sampling stages of cyclical kernels) and hands it to
:func:`ppl_bdl.inference.driver.run_chains`.

A kernel factory may declare the keyword settings ``num_steps`` (T, the steps of the whole run),
``num_cycles`` (M) and ``exploration`` (β); the driver supplies the first two. A factory that takes
``exploration`` is cyclical with an exploration stage (cSGLD, cSGHMC): its step size follows the
cyclical schedule, draws are kept only in sampling stages, and the run lengthens so that
``num_samples`` draws are kept after ``num_warmup`` steps.
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np

from ..errors import ConfigError, one_of
from ..layout import ModelDensity
from ..schedules import SCHEDULES, check_exploration, make_schedule, sampling_stage_mask
from .common import Setup
from .driver import Batch, Transition, plan_run, run_chains
from .failures import raise_failure
from .minibatch import EpochBatches
from .setup import minibatch_plate
from .step_size import check_step_size, choose_step_size, with_step_size

#: Keyword settings a kernel factory may declare; the driver fills them in.
DRIVER_SUPPLIED = ("value_and_grad", "num_steps", "num_cycles")
DRIVER_OPTIONS = (
    "batch_size", "chunk_size", "decay_offset", "decay_power", "num_cycles", "schedule", "step_size",
)  # fmt: skip


def run_sgmcmc(
    setup: Setup,
    entry,
    *,
    num_warmup: int,
    num_samples: int,
    num_chains: int,
    thinning: int,
    seed: int,
    init: Any,
    progress: bool = False,
    step_size: float | str | None = "auto",
    batch_size: int | None = None,
    schedule: str | None = None,
    num_cycles: int = 4,
    decay_offset: float = 1.0,
    decay_power: float = 0.55,
    chunk_size: int | None = None,
    log_likelihood: bool = True,
    **kernel_options: Any,
):
    """Run the SG-MCMC kernel of registry ``entry`` on a prepared model; return a Posterior.

    Parameters
    ----------
    step_size : float or "auto"
        α_0 (the learning rate η for SGHMC), > 0; "auto" (the default) picks it with a short
        pilot (:func:`ppl_bdl.inference.step_size.choose_step_size`).
    batch_size : int, optional
        Minibatch size B <= N; full batch without it.
    schedule : {"constant", "polynomial", "cyclical"}
        The step-size schedule (default "constant"; cSGLD/cSGHMC always use "cyclical").
    num_cycles : int
        M for the cyclical schedule (4).
    decay_offset, decay_power : float
        b and γ of the polynomial schedule α_0 (1 + t / b)^(−γ).
    chunk_size : int, optional
        Steps per compiled call (default: up to 1000, bounded by memory).
    **kernel_options
        The kernel's own settings (e.g. ``temperature``, ``friction``, ``momentum_decay``,
        ``mass``, ``exploration``).

    Example
    -------
    >>> import numpy as np, ppl_bdl as bdl
    >>> from ppl_bdl import dist
    >>> @bdl.model
    ... def mean_model(y):
    ...     mu = bdl.sample("mu", dist.Normal(0.0, 10.0))
    ...     with bdl.plate("data", y.shape[0]) as idx:
    ...         bdl.sample("y", dist.Normal(mu, 1.0), obs=y[idx])
    >>> y = np.random.default_rng(0).normal(size=100)
    >>> post = bdl.fit(mean_model(y), backend="numpyro", method="sgld", step_size=1e-3,
    ...                batch_size=10, num_warmup=100, num_samples=200, num_chains=2, progress=False)
    >>> post.samples["mu"].shape
    (2, 200)
    """
    from .common import build_posterior, initial_positions

    be, name = setup.backend, entry.name
    plate = minibatch_plate(setup, batch_size)
    params = inspect.signature(entry.factory).parameters
    schedule, exploration = _check_schedule(name, params, schedule, kernel_options)
    if isinstance(num_cycles, bool) or not isinstance(num_cycles, int) or num_cycles < 1:
        raise ConfigError(f"num_cycles must be a positive int, got {num_cycles!r}.")
    keep = plan_keep(num_warmup, num_samples, thinning, num_cycles, exploration)
    num_steps = len(keep)
    # The schedule's shape with α_0 = 1; each chain's state holds α_0 (so a step-size pilot and
    # the run share one compiled program).
    unit = make_schedule(
        schedule, 1.0, num_steps=num_steps, num_cycles=num_cycles, decay_offset=decay_offset,
        decay_power=decay_power,
    )  # fmt: skip
    transition, data = sgmcmc_transition(
        setup, entry, kernel_options, unit, plate, batch_size, num_steps, num_cycles
    )
    positions = initial_positions(setup, init, num_chains, seed)

    def batches(chain: int):
        return EpochBatches(plate[1], batch_size, [seed, chain, 7]) if plate else None

    if step_size is None or (isinstance(step_size, str) and step_size == "auto"):
        step_size = choose_step_size(be, transition, positions[0], data, batches, seed, name)
    else:
        step_size = check_step_size(step_size)
    setup.settings["step_size"] = step_size
    plan = plan_run(keep, num_chains, setup.layout.dim, chunk_size, progress)
    run = run_chains(
        be, with_step_size(transition, step_size), positions, seed, plan, data, batches, name,
        progress,
    )  # fmt: skip
    if run.failure is not None:
        size = step_size * float(be.to_numpy(_unit_at(be, unit, run.failure.step)))
        raise_failure(setup, run, kind=f"SG-MCMC kernel {name!r}", requested=num_samples,
                      method=name, step_size=size, log_likelihood=log_likelihood)  # fmt: skip
    return build_posterior(
        setup,
        run.draws,
        run.infos,
        name,
        log_likelihood=log_likelihood,
    )


def sgmcmc_transition(
    setup: Setup, entry, options: dict, unit_schedule, plate, batch_size, num_steps, num_cycles
) -> tuple[Transition, list]:
    """The per-chain transition of kernel ``entry`` and the data's arrays its steps read:
    ``init(key, position, data, step_size)``, ``step(key, state, batch)`` with the step size
    α_0 × ``unit_schedule(t)`` at the chain's step counter t (α_0 is in the state), and
    ``emit(state)``, the position."""
    be = setup.backend
    density = ModelDensity(setup.bound, be, setup.layout, setup.params)
    plate_name = plate[0] if plate else None

    def value_and_grad(position, batch: Batch):
        indices = None if batch.indices is None else {plate_name: batch.indices}
        return density.value_and_grad(position, batch.data, indices)

    with be.scope(), be.activate():
        example_idx = be.asarray(np.zeros(batch_size), dtype="int") if plate else None
        example = (be.asarray(np.zeros(setup.layout.dim)), Batch(density.data, example_idx))
        value_and_grad = be.trace(value_and_grad, example)
        kernel = build_kernel(entry, options, value_and_grad=value_and_grad,
                              num_steps=num_steps, num_cycles=num_cycles)  # fmt: skip

    def init(key, position, data=None, step_size=1.0):
        return {
            "kernel": kernel.init(position),
            "t": be.asarray(0, dtype="int"),
            "step_size": be.asarray(step_size),
        }

    def step(key, state, batch):
        size = state["step_size"] * unit_schedule(state["t"])
        new, info = kernel.step(key, state["kernel"], batch, size)
        return dict(state, kernel=new, t=state["t"] + 1), info

    def emit(state):
        return state["kernel"]["position"]

    return Transition(init, step, emit), density.data


def plan_keep(num_warmup: int, num_samples: int, thinning: int, num_cycles: int,
              exploration: float | None) -> np.ndarray:  # fmt: skip
    """Which steps keep a draw: after warmup (in sampling stages for cyclical kernels with an
    exploration stage), every ``thinning``-th eligible step, ``num_samples`` of them."""
    if exploration is not None:
        num_steps, keep = _cyclical_plan(
            num_warmup, num_samples * thinning, num_cycles, exploration
        )
    else:
        num_steps = num_warmup + num_samples * thinning
        keep = np.zeros(num_steps, bool)
        keep[num_warmup:] = True
    eligible = np.flatnonzero(keep)[: num_samples * thinning]
    keep = np.zeros(num_steps, bool)
    keep[eligible[thinning - 1 :: thinning]] = True
    return keep


def _check_schedule(name, params, schedule, kernel_options):
    exploration = None
    if "exploration" in params:
        if schedule not in (None, "cyclical"):
            raise ConfigError(
                f"method {name!r} runs on the cyclical schedule with exploration stages; got "
                f"schedule={schedule!r}. Leave schedule out, or use 'sgld'/'sghmc' with "
                f"schedule={schedule!r}."
            )
        schedule = "cyclical"
        exploration = check_exploration(
            kernel_options.get("exploration", params["exploration"].default)
        )
    schedule = "constant" if schedule is None else schedule
    if schedule not in SCHEDULES:
        raise one_of("schedule", schedule, list(SCHEDULES))
    return schedule, exploration


def _cyclical_plan(num_warmup: int, needed: int, num_cycles: int, exploration: float):
    """Smallest T whose sampling-stage steps after warmup number at least ``needed``."""
    total = num_warmup + int(np.ceil(needed / (1.0 - exploration)))
    while True:
        total = max(total, num_cycles)
        keep = sampling_stage_mask(total, num_cycles, exploration)
        keep[:num_warmup] = False
        count = int(keep.sum())
        if count >= needed:
            return total, keep
        total += max(1, int(np.ceil((needed - count) / (1.0 - exploration))))


def build_kernel(entry, options: dict, **supplied):
    """``entry``'s kernel with the user's ``options`` (checked against its factory's settings)
    and the driver's ``supplied`` ones it declares."""
    params = inspect.signature(entry.factory).parameters
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    accepted = [n for n, p in params.items() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    unknown = [k for k in options if (k not in params and not var_kw) or k in DRIVER_SUPPLIED]
    if unknown:
        settable = [n for n in accepted if n not in DRIVER_SUPPLIED]
        raise ConfigError(
            f"unknown option(s) {sorted(unknown)} for method {entry.name!r}. Its kernel settings: "
            f"{settable}; driver settings: {sorted(DRIVER_OPTIONS)}."
        )
    given = {k: v for k, v in supplied.items() if k in params or var_kw}
    return entry.factory(**options, **given)


def _unit_at(be, schedule, step: int):
    with be.scope(), be.activate():
        return schedule(be.asarray(step, dtype="int"))
