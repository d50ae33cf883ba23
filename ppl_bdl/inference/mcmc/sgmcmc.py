"""SG-MCMC: a registered kernel, its step-size schedule and minibatches, run by the one driver.

:class:`SGMCMCConfig` checks a fit's SG-MCMC settings once, before anything runs.
:func:`sgmcmc_transition` builds the per-chain transition every runner shares (``fit``'s driver,
and the native adapters that let ``numpyro.infer.MCMC`` / ``pyro.infer.MCMC`` drive our
kernels): the kernel gets the minibatch potential Ũ(θ) of Eq. 2.8 of "Bayesian Computation in Deep Learning" and its gradient,
and each step's size α_0 × the schedule's shape at the step counter (:func:`unit_schedule`,
evaluated in the compiled step; α_0 a loop input).
:func:`run_sgmcmc` plans the run (warmup, thinning, the sampling stages of cyclical kernels) and
hands it to :func:`ppl_bdl.inference.loop.driver.run_chains`.

A kernel factory may declare the keyword settings ``num_steps`` (T, the steps of the whole run)
and ``num_cycles`` (M); the driver supplies them. A kernel registered as cyclical (cSGLD,
cSGHMC: ``register(..., cyclical=True)``) runs on the cyclical schedule with an exploration
stage (its ``exploration``, β): draws are kept only in sampling stages, and the run lengthens so
that ``num_samples`` draws are kept after ``num_warmup`` steps.
"""

from __future__ import annotations

import inspect
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ppl_bdl.backend_protocol import Batch, Transition
from ppl_bdl.errors import ConfigError, one_of
from ppl_bdl.inference.loop.driver import Rates, RunResult, plan_run, run_chains
from ppl_bdl.inference.loop.failures import raise_failure
from ppl_bdl.inference.loop.minibatch import EpochBatches
from ppl_bdl.inference.mcmc.control_variates import (
    anchor_period,
    check_control_variate,
    svrg_gradient,
    svrg_transition,
)
from ppl_bdl.inference.mcmc.kernels import registry
from ppl_bdl.inference.mcmc.kernels.registry import KernelEntry
from ppl_bdl.inference.mcmc.schedules import (
    SCHEDULES,
    check_exploration,
    make_schedule,
    sampling_stage_mask,
)
from ppl_bdl.inference.mcmc.step_size import PILOT_STEPS, check_step_size, choose_step_size
from ppl_bdl.inference.posterior_from_draws import build_posterior
from ppl_bdl.inference.setup import Setup, minibatch_plate
from ppl_bdl.inference.starts import initial_positions
from ppl_bdl.trace.layout import ModelDensity
from ppl_bdl.trace.programs import keyed, programs, same, structure_key

#: Keyword settings a kernel factory may declare; the driver fills them in.
DRIVER_SUPPLIED = ("value_and_grad", "num_steps", "num_cycles")
#: The settings of the SG-MCMC driver (the rest are the kernel's own).
DRIVER_OPTIONS = (
    "anchor_period",
    "batch_size",
    "chunk_size",
    "control_variate",
    "decay_offset",
    "decay_power",
    "num_cycles",
    "schedule",
    "step_size",
)


@dataclass(frozen=True)
class SGMCMCConfig:
    """A fit's SG-MCMC settings, checked once (:meth:`build`).

    ``step_size`` is α_0 (None: chosen by a pilot, ``step_size="auto"``); ``schedule`` is
    "constant", "polynomial" or "cyclical" (cyclical kernels: always "cyclical");
    ``exploration`` is β for a cyclical kernel (else None); ``kernel_options`` are the
    kernel's own settings, checked against its factory. ``control_variate``: None (the plain
    minibatch gradient) or "svrg" (:mod:`~ppl_bdl.inference.mcmc.control_variates`), with a full-data
    gradient every ``anchor_period`` steps (None: one epoch).

    Example
    -------
    >>> from ppl_bdl.inference.mcmc.sgmcmc import SGMCMCConfig
    >>> config = SGMCMCConfig.build("csgld", step_size=1e-3, exploration=0.5)
    >>> config.schedule, config.exploration
    ('cyclical', 0.5)
    """

    entry: KernelEntry
    step_size: float | None = None
    batch_size: int | None = None
    schedule: str = "constant"
    num_cycles: int = 4
    decay_offset: float = 1.0
    decay_power: float = 0.55
    chunk_size: int | None = None
    exploration: float | None = None
    kernel_options: dict = field(default_factory=dict)
    control_variate: str | None = None
    anchor_period: int | None = None

    @classmethod
    def build(
        cls,
        method: str,
        *,
        step_size: float | str | None = "auto",
        batch_size: int | None = None,
        schedule: str | None = None,
        num_cycles: int = 4,
        decay_offset: float = 1.0,
        decay_power: float = 0.55,
        chunk_size: int | None = None,
        control_variate: str | None = None,
        anchor_period: int | None = None,
        **kernel_options: Any,
    ) -> SGMCMCConfig:
        entry = registry.get(method)
        if entry.kind != "sgmcmc":
            raise ConfigError(f"method {method!r} is not an SG-MCMC kernel.")
        check_control_variate(control_variate, anchor_period)
        _check_kernel_options(entry, kernel_options)
        auto = step_size is None or (isinstance(step_size, str) and step_size == "auto")
        if batch_size is not None and (
            isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1
        ):
            raise ConfigError(f"batch_size must be a positive int, got {batch_size!r}.")
        if isinstance(num_cycles, bool) or not isinstance(num_cycles, int) or num_cycles < 1:
            raise ConfigError(f"num_cycles must be a positive int, got {num_cycles!r}.")
        if chunk_size is not None and (
            isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1
        ):
            raise ConfigError(f"chunk_size must be an int >= 1, got {chunk_size!r}.")
        exploration = None
        if entry.cyclical:
            if schedule not in (None, "cyclical"):
                raise ConfigError(
                    f"method {method!r} runs on the cyclical schedule with exploration stages; "
                    f"got schedule={schedule!r}. Leave schedule out, or use 'sgld'/'sghmc' with "
                    f"schedule={schedule!r}."
                )
            schedule = "cyclical"
            default = inspect.signature(entry.factory).parameters["exploration"].default
            exploration = check_exploration(kernel_options.get("exploration", default))
        schedule = "constant" if schedule is None else schedule
        if schedule not in SCHEDULES:
            raise one_of("schedule", schedule, list(SCHEDULES))
        # the schedule's own checks (decay_power, decay_offset), on a one-step horizon
        make_schedule(
            schedule,
            1.0,
            num_steps=num_cycles,
            num_cycles=num_cycles,
            decay_offset=decay_offset,
            decay_power=decay_power,
        )
        return cls(
            entry,
            None if auto else check_step_size(step_size),
            batch_size,
            schedule,
            num_cycles,
            float(decay_offset),
            float(decay_power),
            chunk_size,
            exploration,
            dict(kernel_options),
            control_variate,
            anchor_period,
        )

    def keep(self, num_warmup: int, num_samples: int, thinning: int) -> np.ndarray:
        """Which steps keep a draw: after warmup (in sampling stages for cyclical kernels),
        every ``thinning``-th eligible step, ``num_samples`` of them."""
        if self.exploration is not None:
            num_steps, keep = _cyclical_plan(
                num_warmup, num_samples * thinning, self.num_cycles, self.exploration
            )
        else:
            num_steps = num_warmup + num_samples * thinning
            keep = np.zeros(num_steps, bool)
            keep[num_warmup:] = True
        eligible = np.flatnonzero(keep)[: num_samples * thinning]
        keep = np.zeros(num_steps, bool)
        keep[eligible[thinning - 1 :: thinning]] = True
        return keep


def _check_kernel_options(entry: KernelEntry, options: dict) -> None:
    params = inspect.signature(entry.factory).parameters
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    unknown = [k for k in options if (k not in params and not var_kw) or k in DRIVER_SUPPLIED]
    if unknown:
        settable = [
            n
            for n, p in params.items()
            if p.kind is not inspect.Parameter.VAR_KEYWORD and n not in DRIVER_SUPPLIED
        ]
        raise ConfigError(
            f"unknown option(s) {sorted(unknown)} for method {entry.name!r}. Its kernel settings: "
            f"{settable}; driver settings: {sorted(DRIVER_OPTIONS)}."
        )


def run_sgmcmc(
    setup: Setup,
    config: SGMCMCConfig,
    *,
    num_warmup: int,
    num_samples: int,
    num_chains: int,
    thinning: int,
    seed: int,
    init: Any,
    progress: bool = False,
    log_likelihood: bool = True,
    chain_ids: list[int] | None = None,
):
    """Run the SG-MCMC kernel of ``config`` on a prepared model; return a Posterior (of the
    chains ``chain_ids`` of ``num_chains``, all by default).

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
    name = config.entry.name
    plate = minibatch_plate(setup, config.batch_size)
    keep = config.keep(num_warmup, num_samples, thinning)
    transition, data = sgmcmc_transition(setup, config, plate, len(keep))
    run, step_size = run_sg_chains(
        setup,
        config,
        transition,
        data,
        plate,
        keep,
        name,
        seed,
        init,
        num_chains,
        chain_ids,
        progress,
    )
    kind = f"SG-MCMC kernel {name!r}"
    return sg_posterior(
        setup, config, run, step_size, len(keep), name, kind, num_samples, log_likelihood
    )


def run_sg_chains(
    setup: Setup,
    config: SGMCMCConfig,
    transition: Transition,
    data,
    plate: tuple[str, int] | None,
    keep: np.ndarray,
    name: str,
    seed: int,
    init: Any,
    num_chains: int,
    chain_ids: list[int] | None,
    progress: bool,
) -> tuple[RunResult, float]:
    """Run an SG-MCMC ``transition``'s chains ``chain_ids`` (all ``num_chains`` by default)
    from their starts, each on its own minibatch epochs, keeping the steps ``keep`` says, at
    the config's step size or, where it has none, the one the pilots choose
    (``setup.settings["step_size"]``); the run and the step size.

    With ``step_size="auto"`` a pilot picks α_0 from every chain's start, the chains run the
    first half of the warmup at it, and a second pilot picks again from where they are then
    (:func:`~ppl_bdl.inference.mcmc.step_size.choose_step_size`); the rest of the run takes the
    smaller of the two. The start rarely has the posterior's curvature: where a noise scale σ
    shrinks from its prior value to the posterior's, the likelihood's curvature grows as
    1 / σ², and a step size chosen at the start would hold σ where the chain is at its edge of
    stability (far above the posterior's σ)."""
    backend, num_steps = setup.backend, len(keep)
    positions = initial_positions(setup, init, num_chains, seed)
    unit = unit_schedule(config, num_steps)
    unit_key = None if unit is None else schedule_key(config, num_steps)
    streams: dict[int, EpochBatches] = {}

    def batches(chain: int):
        return EpochBatches(plate[1], config.batch_size, [seed, chain, 7]) if plate else None

    def stream(chain: int):  # a chain's minibatches, continued from one part of the run to the next
        if chain not in streams:
            streams[chain] = batches(chain)
        return streams[chain]

    chains = list(range(num_chains)) if chain_ids is None else chain_ids

    def run_part(part_keep, step_size, first_step=0, resume=None, progress=False):
        plan = plan_run(part_keep, len(chains), setup.layout.dim, config.chunk_size, progress)
        rates = Rates(step_size, unit, unit_key)
        return run_chains(
            backend,
            transition,
            positions[chains],
            seed,
            plan,
            data,
            stream,
            name,
            rates,
            progress,
            chain_ids=chains,
            first_step=first_step,
            resume=resume,
        )

    step_size, pilot, first, resume = config.step_size, Rates(1.0, unit, unit_key), 0, None
    if step_size is None:  # from every chain's start, whichever chains this run has
        margin = config.entry.pilot_margin
        step_size = choose_step_size(
            backend, transition, positions, data, batches, pilot, seed, name, margin
        )
        if keep.any() and int(np.argmax(keep)) // 2 >= PILOT_STEPS:  # the second pilot
            first = int(np.argmax(keep)) // 2
            warm = run_part(np.zeros(first, bool), step_size)
            if warm.failure is not None:
                setup.settings["step_size"] = step_size
                return warm, step_size
            resume, where = warm.states, warmed_positions(backend, transition, warm, len(chains))
            again = choose_step_size(
                backend, transition, where, data, batches, pilot, seed + 1, name, margin
            )
            step_size = min(step_size, again)
    setup.settings["step_size"] = step_size
    return run_part(keep[first:], step_size, first, resume, progress), step_size


def warmed_positions(backend, transition: Transition, run: RunResult, count: int) -> np.ndarray:
    """The positions (chain, d) where a run's ``count`` chains ended (NumPy)."""
    with backend.scope(), backend.activate():
        rows = [transition.emit(run.chain_state(backend, i)) for i in range(count)]
        return np.stack([np.asarray(backend.to_numpy(row)) for row in rows])


def sg_posterior(
    setup: Setup,
    config: SGMCMCConfig,
    run: RunResult,
    step_size: float,
    num_steps: int,
    name: str,
    kind: str,
    num_samples: int,
    log_likelihood: bool,
):
    """The Posterior of an SG-MCMC run of ``num_steps`` steps; where it failed, the error (``kind`` names the
    sampler), with the step size of the failed step and the draws so far."""
    if run.failure is not None:
        failed = run.failure.reason == "nonfinite"  # (Ctrl-C may land after the last step)
        sizes = step_sizes(setup.backend, config, step_size, num_steps) if failed else None
        raise_failure(
            setup,
            run,
            kind=kind,
            requested=num_samples,
            method=name,
            step_size=None if sizes is None else float(sizes[run.failure.step]),
            log_likelihood=log_likelihood,
        )
    return build_posterior(setup, run.draws, run.infos, name, log_likelihood=log_likelihood)


def unit_schedule(config: SGMCMCConfig, num_steps: int):
    """The schedule's shape at α_0 = 1, a function of the step counter evaluated in the
    compiled step (:class:`~ppl_bdl.inference.loop.driver.Rates`); None for the constant one."""
    if config.schedule == "constant":
        return None
    return make_schedule(
        config.schedule,
        1.0,
        num_steps=num_steps,
        num_cycles=config.num_cycles,
        decay_offset=config.decay_offset,
        decay_power=config.decay_power,
    )


def schedule_key(config: SGMCMCConfig, num_steps: int) -> tuple:
    """What :func:`unit_schedule` computes: its schedule and settings (a program key)."""
    return (
        config.schedule,
        num_steps,
        config.num_cycles,
        repr(config.decay_offset),
        repr(config.decay_power),
    )


def step_sizes(backend, config: SGMCMCConfig, step_size: float, num_steps: int) -> np.ndarray:
    """α_t for t = 0 .. ``num_steps`` − 1 (NumPy, the fit's precision: what the steps get)."""
    unit = unit_schedule(config, num_steps)
    if unit is None:
        return np.full(num_steps, step_size)
    with backend.scope(), backend.activate():
        steps = backend.asarray(np.arange(num_steps), dtype="int")
        return step_size * np.asarray(backend.to_numpy(unit(steps)), dtype=float)


def sgmcmc_transition(
    setup: Setup, config: SGMCMCConfig, plate: tuple[str, int] | None, num_steps: int
) -> tuple[Transition, list]:
    """The per-chain transition of ``config``'s kernel and the data's arrays its steps read:
    ``init(key, position, data)``, ``step(key, state, batch, step_size)`` (the kernel's own
    step), ``emit(state)``, the position.

    Positions come in and go out flat. Inside, on a backend that fuses elementwise work
    (``fuses_elementwise``: JAX), the position of a kernel registered with ``blocks=True``
    (and its velocity or preconditioner) is a tuple of per-site blocks
    (:meth:`~ppl_bdl.trace.layout.LatentLayout.blocks`): the model reads each site's block and its
    gradient comes back per site, so a step copies nothing between a flat vector and the sites;
    ``emit`` joins the blocks into the flat row, once per kept step. Other kernels, and every
    kernel on eager torch (where per-block ops cost a dispatch each: 1.48x the hand-written
    SGHMC step at 8-50-1 against 1.03x flat), step the flat vector."""
    backend = setup.backend
    period = None
    if config.control_variate is not None:  # checked before the model is traced
        period = anchor_period(config.anchor_period, plate, config.batch_size)
        setup.settings["anchor_period"] = period
    data, _ = setup.bound.data_arrays(backend)
    key = transition_key(setup, config, plate, num_steps, period)
    if key is None:
        return _build_transition(setup, config, plate, num_steps, period), data
    transition = programs(backend).get(
        key, lambda: _build_transition(setup, config, plate, num_steps, period, key)
    )
    return transition, data


def transition_key(
    setup: Setup,
    config: SGMCMCConfig,
    plate: tuple[str, int] | None,
    num_steps: int,
    period: int | None,
) -> Hashable | None:
    """What the transition's compiled step depends on: the model (:meth:`Setup.program_key`),
    the kernel and its settings, the settings the driver supplies that the kernel declares
    (``num_steps``, ``num_cycles``), the minibatch and the control variate. Not the step size
    (a loop input) nor the seed. None: the transition is not cached."""
    model = setup.program_key()
    if model is None:
        return None
    declared = inspect.signature(config.entry.factory).parameters
    supplied = {"num_steps": num_steps, "num_cycles": config.num_cycles}
    return keyed(
        lambda: (
            "sgmcmc",
            model,
            same(config.entry.factory),
            structure_key(config.kernel_options),
            tuple((k, v) for k, v in supplied.items() if k in declared),
            plate,
            config.batch_size,
            period,
        )
    )


def _build_transition(
    setup: Setup,
    config: SGMCMCConfig,
    plate: tuple[str, int] | None,
    num_steps: int,
    period: int | None,
    key: Hashable | None = None,
) -> Transition:
    """The transition of :func:`sgmcmc_transition`, built (its model traced on torch)."""
    backend = setup.backend
    layout = setup.layout
    blocks = config.entry.blocks and backend.fuses_elementwise
    density = ModelDensity(setup.bound, backend, layout, setup.params)
    plate_name = plate[0] if plate else None

    def value_and_grad(position, batch: Batch):
        indices = None if batch.indices is None else {plate_name: batch.indices}
        return density.value_and_grad(position, batch.data, indices)

    with backend.scope(), backend.activate():
        example_idx = backend.asarray(np.zeros(config.batch_size), dtype="int") if plate else None
        start = backend.asarray(np.zeros(layout.dim))
        start = layout.blocks(start, backend) if blocks else start
        example = (start, Batch(density.data, example_idx))
        traced = backend.trace(value_and_grad, example)
        if period is not None:  # the full data's gradient at the anchor, traced once more
            full = backend.trace(value_and_grad, (start, Batch(density.data, None)))
            traced = svrg_gradient(traced)
        kernel = build_kernel(
            config.entry,
            config.kernel_options,
            value_and_grad=traced,
            num_steps=num_steps,
            num_cycles=config.num_cycles,
        )
    if period is not None:
        inner = svrg_transition(backend, kernel, full, period)
    else:
        inner = Transition(
            lambda key, position, data: kernel.init(position),
            kernel.step,
            lambda state: state["position"],
        )

    if not blocks:
        return inner._replace(key=key)

    def init(rng_key, position, data):
        return inner.init(rng_key, layout.blocks(position, backend), data)

    def emit(state):
        return layout.join(inner.emit(state), backend)

    return Transition(init, inner.step, emit, key)


def build_kernel(entry: KernelEntry, options: dict, **supplied):
    """``entry``'s kernel with its ``options`` (checked: :class:`SGMCMCConfig`) and the driver's
    ``supplied`` settings it declares."""
    _check_kernel_options(entry, options)
    params = inspect.signature(entry.factory).parameters
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    given = {k: v for k, v in supplied.items() if k in params or var_kw}
    return entry.factory(**options, **given)


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
