"""Deep ensembles and anchored ensembles: ``fit(bound, method="ensemble", num_members=M)``.

A deep ensemble (Lakshminarayanan, Pritzel & Blundell, *Simple and Scalable Predictive
Uncertainty Estimation using Deep Ensembles*, NeurIPS 2017) is M independent MAP fits of the same
model, each from its own start and with its own minibatch order; the predictive distribution is
the uniform mixture of the members' predictive distributions. Here a member minimises the
model's potential U(θ) = −log p(θ, D) − log|J| in the unconstrained space (the prior is the
regulariser, the likelihood minibatched and scaled by N/B as in VI: Eq. 2.19 of "Bayesian Computation in Deep Learning") with
the backend's optimizer (:meth:`Backend.optimizer`, Adam by default, the schedules of
:mod:`ppl_bdl.optim`).

The members are the chains of the one driver (:func:`~ppl_bdl.inference.loop.driver.run_chains`): a
:class:`~ppl_bdl.backend_protocol.Transition` whose state is the member's flat position and its
optimizer's state, whose step is the potential's ``value_and_grad`` on the step's minibatch and
an optimizer update, and which keeps the position after the last step. Members run side by side
(``vmap``) where the backend vectorises chains, one after another elsewhere; member m's start,
anchor and minibatch order depend only on the seed and m, so ``chain_ids`` runs a subset of the
members with exactly the result they have in the whole ensemble.

**Anchored ensembles** (``anchored=True``; Pearce, Leibfried, Brintrup, Zaki & Neely,
*Uncertainty in Neural Networks: Approximately Bayesian Ensembling*, AISTATS 2020, Sec. 4, the
anchored loss of their Algorithm 1, ``Loss_anchor,j = ‖y − ŷ_j‖²/N + ‖Γ^{1/2}(θ_j −
θ_anc,j)‖²/N``): member m is regularised towards its own draw θ_anc,m from the prior instead of
towards the prior's centre μ. For a site with a Gaussian prior N(μ, s²) (fixed μ and s, outside
every plate) its prior term ½ Σ ((θ − μ)/s)² becomes ½ Σ ((θ − θ_anc,m)/s)²; the likelihood and
every other term of U are unchanged (Γ of the paper is σ²_ε/s², the same quadratic form once the
likelihood's noise scale multiplies through). For other priors there is no such quadratic form
to move: ``anchored=True`` refuses a model with a latent site whose prior is not such a Normal,
and ``anchored=[sites]`` anchors only the listed sites (the others keep their own prior, as in a
plain ensemble). With ``init`` left out an anchored member starts at its anchor in the anchored
coordinates (the paper's code initialises each network at its anchor).

For a linear-Gaussian model the anchored MAP is θ_m = A⁻¹(Xᵀy/σ² + S₀⁻¹θ_anc,m), A = XᵀX/σ² +
S₀⁻¹: the members are centred on the exact posterior mean with covariance A⁻¹S₀⁻¹A⁻¹, which is
the posterior's A⁻¹ in directions the data does not inform and smaller in those it does (the
paper's analysis of randomised MAP sampling: "centred correctly but underestimated marginal
variance"); tests/test_ensemble.py checks both.

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl.models import bnn, regression
>>> X, y = regression.sine_data()
>>> model = bnn.make_bnn_regression(hidden=(10,))
>>> ens = bdl.fit(model(X, y), backend="numpyro", method="ensemble", num_members=3,
...               num_steps=300, lr=0.01, batch_size=20, progress=False)
>>> ens.samples["net.0.weight"].shape   # one draw per member
(3, 1, 1, 10)
>>> ens.losses.shape                    # the loss of every step of every member
(3, 300)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ppl_bdl.backend_protocol import Batch, Transition
from ppl_bdl.errors import ConfigError, InferenceError, RunInterrupted
from ppl_bdl.inference.loop.driver import Rates, RunResult, plan_run, run_chains
from ppl_bdl.inference.loop.minibatch import EpochBatches
from ppl_bdl.inference.method import (
    Method,
    check_bool,
    check_choice,
    check_int,
    check_number,
    check_params,
    option,
)
from ppl_bdl.inference.posterior_from_draws import build_posterior
from ppl_bdl.inference.setup import Setup, minibatch_plate
from ppl_bdl.inference.starts import initial_positions
from ppl_bdl.optim import OPTIMIZERS, OptimizerConfig, unit_schedule
from ppl_bdl.trace.layout import ModelDensity

#: The options of ``method="ensemble"``.
OPTIONS = (
    "num_members",
    "num_steps",
    "batch_size",
    "anchored",
    "optimizer",
    "lr",
    "momentum",
    "schedule",
    "decay",
    "clip_norm",
    "chunk_size",
)


def _count(name: str, value: Any, default: int | None = None) -> int | None:
    value = default if value is None else value
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be an int >= 1, got {value!r}.")
    return value


@dataclass(frozen=True)
class EnsembleConfig:
    """A fit's ensemble settings, checked once (:meth:`build`).

    ``num_members`` M (5), ``num_steps`` optimizer steps per member (2000), ``batch_size`` (None:
    full-batch steps), ``anchored`` (False; True: every latent site; or a tuple of site names),
    ``optimizer`` (an :class:`~ppl_bdl.optim.OptimizerConfig`: ``optimizer``, ``lr`` (0.01),
    ``momentum``, ``schedule`` ("constant", "exponential" or "cosine": the steps' rates, a
    :class:`~ppl_bdl.inference.loop.driver.Rates`), ``decay``, ``clip_norm``) and ``chunk_size``.

    Example
    -------
    >>> from ppl_bdl.inference.ensemble import EnsembleConfig
    >>> config = EnsembleConfig.build(num_members=5, num_steps=400, lr=0.1, batch_size=100)
    >>> config.num_members, config.optimizer.lr, config.anchored
    (5, 0.1, False)
    """

    num_members: int = 5
    num_steps: int = 2000
    batch_size: int | None = None
    anchored: bool | tuple[str, ...] = False
    optimizer: OptimizerConfig = OptimizerConfig()
    chunk_size: int | None = None

    @classmethod
    def build(
        cls,
        num_members: int | None = None,
        num_steps: int | None = None,
        batch_size: int | None = None,
        anchored: Any = False,
        optimizer: str = "adam",
        lr: float = 1e-2,
        momentum: float = 0.0,
        schedule: str = "constant",
        decay: float = 0.1,
        clip_norm: float | None = None,
        chunk_size: int | None = None,
        **unknown: Any,
    ) -> EnsembleConfig:
        if unknown:
            raise ConfigError(
                f"unknown option(s) {sorted(unknown)} for method='ensemble'; expected some of "
                f"{sorted(OPTIONS)} (and the fit's own: seed, init, precision, device, ...)."
            )
        if schedule == "plateau":  # VI's monitor cuts the lr; an ensemble runs a fixed length
            raise ConfigError(
                "schedule='plateau' does not apply to method='ensemble': the lr is cut on a "
                "plateau by VI's convergence monitor, and a member runs num_steps steps without "
                "one. Use schedule='constant', 'exponential' or 'cosine'."
            )
        members = _count("num_members", num_members, 5)
        steps = _count("num_steps", num_steps, 2000)
        return cls(
            members,
            steps,
            _count("batch_size", batch_size),
            _check_anchored(anchored),
            OptimizerConfig.build(
                optimizer=optimizer,
                lr=lr,
                momentum=momentum,
                schedule=schedule,
                decay=decay,
                clip_norm=clip_norm,
                num_steps=steps,
            ),
            _count("chunk_size", chunk_size),
        )

    def settings(self) -> dict:
        """The settings saved with the posterior (JSON values)."""
        anchored = self.anchored if isinstance(self.anchored, bool) else list(self.anchored)
        opt = self.optimizer
        return dict(
            num_members=self.num_members,
            num_steps=self.num_steps,
            batch_size=self.batch_size,
            anchored=anchored,
            lr=opt.lr,
            optimizer=opt.optimizer,
            schedule=opt.schedule,
        )


def _check_anchored(anchored: Any) -> bool | tuple[str, ...]:
    if isinstance(anchored, bool):
        return anchored
    if (
        isinstance(anchored, list | tuple)
        and anchored
        and all(isinstance(s, str) for s in anchored)
    ):
        return tuple(anchored)
    raise ConfigError(
        f"anchored must be True, False or a non-empty list of latent site names, got {anchored!r}."
    )


# -- anchors ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Anchors:
    """The anchored coordinates of the flat vector: ``mask`` (1 where anchored), the prior's
    ``loc`` and ``scale`` there (0 and 1 elsewhere), and the ``sites`` anchored."""

    sites: tuple[str, ...]
    mask: np.ndarray
    loc: np.ndarray
    scale: np.ndarray


def _static(value: Any) -> bool:
    return isinstance(value, int | float | np.ndarray | np.number) and not isinstance(value, bool)


def _anchorable(site) -> bool:
    """A Gaussian prior with fixed parameters, outside every plate: a quadratic form to move."""
    params = site.spec.params
    return site.spec.name == "Normal" and not site.plates and all(map(_static, params.values()))


def resolve_anchors(setup: Setup, anchored: bool | tuple[str, ...]) -> Anchors | None:
    """The :class:`Anchors` of ``anchored`` on ``setup``'s model, or None for a plain ensemble;
    a ConfigError for a site that cannot be anchored."""
    if anchored is False:
        return None
    layout = setup.layout
    fit = {s.name for s in layout.slots if _anchorable(layout.sites[s.name])}
    eligible = [n for n in layout.names if n in fit]
    names = tuple(layout.names) if anchored is True else anchored
    unknown = [n for n in names if n not in layout.names]
    if unknown:
        raise ConfigError(
            f"anchored={list(anchored)}: {unknown} are not continuous latent sites of "
            f"{setup.bound.name!r} (its latent sites: {layout.names})."
        )
    refused = [n for n in names if n not in fit]
    if refused:
        kinds = {n: layout.sites[n].spec.name for n in refused}
        hint = f"anchored={eligible}" if eligible else "method='ensemble' without anchored"
        raise ConfigError(
            f"anchored ensembles move the Gaussian prior's quadratic form ½Σ((θ−μ)/s)² to "
            f"½Σ((θ−θ_anc)/s)² (Pearce et al. 2020), which needs a Normal prior with fixed loc "
            f"and scale outside every plate; site(s) {kinds} have none. Use {hint} to anchor "
            "only the sites that qualify (the others keep their own prior, as in a plain "
            "ensemble)."
        )
    mask, loc, scale = np.zeros(layout.dim), np.zeros(layout.dim), np.ones(layout.dim)
    for slot in layout.slots:
        if slot.name in names:
            params, sl = (
                layout.sites[slot.name].spec.params,
                slice(slot.offset, slot.offset + slot.size),
            )
            mask[sl] = 1.0
            loc[sl] = np.broadcast_to(np.asarray(params.get("loc", 0.0), float), slot.shape).ravel()
            scale[sl] = np.broadcast_to(
                np.asarray(params.get("scale", 1.0), float), slot.shape
            ).ravel()
    return Anchors(tuple(n for n in layout.names if n in names), mask, loc, scale)


# -- the transition --------------------------------------------------------------------------
def ensemble_transition(
    setup: Setup,
    config: EnsembleConfig,
    plate: tuple[str, int] | None,
    anchors: Anchors | None = None,
    start_at_anchor: bool = False,
) -> tuple[Transition, list]:
    """One member's transition and the data's arrays its steps read.

    ``init(key, position, data)``: the optimizer's state at ``position`` (and, anchored, the
    member's anchor θ_anc = μ + s·ε, ε ~ N(0, I) from the member's key; with
    ``start_at_anchor`` the position takes the anchor's values in the anchored coordinates);
    ``step``: the (anchored) potential's value and gradient on the minibatch and the optimizer's
    update with the step's learning rate ``rate`` (the run's :class:`Rates`), skipped where they
    are not finite; info ``loss`` and ``grad_norm``; ``emit``: the position."""
    backend, dim = setup.backend, setup.layout.dim
    density, potential_and_grad = traced_potential(setup, plate, config.batch_size)
    optimizer = backend.optimizer(config.optimizer)
    m = backend.math

    with backend.scope(), backend.activate():
        if anchors is not None:
            mask, loc = backend.asarray(anchors.mask), backend.asarray(anchors.loc)
            spread = backend.asarray(anchors.mask * anchors.scale)
            weight = backend.asarray(anchors.mask / anchors.scale**2)

    def init(key, position, data):
        state = {}
        if anchors is not None:
            anchor = loc + spread * backend.random.normal(key, (dim,))
            if start_at_anchor:
                position = position + mask * (anchor - position)
            state["anchor"] = anchor
        params = {"theta": position}
        state.update(params=params, optimizer=optimizer.init(params))
        return state

    def step(key, state, batch, rate):
        theta = state["params"]["theta"]
        loss, grad = potential_and_grad(theta, batch)
        if anchors is not None:  # ½Σ w(θ − θ_anc)² replaces ½Σ w(θ − μ)², w = 1/s² (anchored)
            anchor = state["anchor"]
            loss = loss + 0.5 * m.sum(weight * ((theta - anchor) ** 2 - (theta - loc) ** 2))
            grad = grad + weight * (loc - anchor)
        grad_norm = m.sqrt(m.sum(grad * grad))
        ok = m.isfinite(loss) & m.isfinite(grad_norm)
        params, opt_state = optimizer.update(
            {"theta": grad}, state["optimizer"], state["params"], ok, rate
        )
        return {**state, "params": params, "optimizer": opt_state}, {
            "loss": loss,
            "grad_norm": grad_norm,
        }

    def emit(state):
        return state["params"]["theta"]

    return Transition(init, step, emit), density.data


def traced_potential(setup: Setup, plate, batch_size: int | None, pull_back=None):
    """The model's density and its potential's value and gradient at a flat position on a
    :class:`Batch` (a minibatch of ``plate``'s indices, or the full data without a plate),
    traced once for the backend. ``pull_back`` maps the density's potential to the one sampled
    (NeuTra's, in a flow's base space: :meth:`~ppl_bdl.inference.mcmc.neutra.NeuTraMap.potential`)."""
    backend = setup.backend
    density = ModelDensity(setup.bound, backend, setup.layout, setup.params)
    potential = density.potential if pull_back is None else pull_back(density.potential)
    plate_name = plate[0] if plate else None

    def potential_and_grad(position, batch: Batch):
        indices = None if batch.indices is None else {plate_name: batch.indices}
        return backend.value_and_grad(lambda flat: potential(flat, batch.data, indices))(position)

    with backend.scope(), backend.activate():
        example_idx = backend.asarray(np.zeros(batch_size), dtype="int") if plate else None
        example = (backend.asarray(np.zeros(setup.layout.dim)), Batch(density.data, example_idx))
        return density, backend.trace(potential_and_grad, example)


def run_map_steps(
    setup: Setup,
    transition: Transition,
    data,
    positions: np.ndarray,
    config: EnsembleConfig,
    plate,
    *,
    seed: int,
    kind: str,
    progress: bool,
    chain_ids: list[int],
) -> RunResult:
    """Run ``config.num_steps`` optimizer steps of ``transition`` from ``positions`` (one row
    per chain ``chain_ids``) on the one loop, keeping the last position and every step's info
    (``loss``); each chain reads its own epochs of minibatches."""
    keep = np.zeros(config.num_steps, bool)
    keep[-1] = True
    plan = plan_run(keep, len(chain_ids), setup.layout.dim, config.chunk_size, progress)

    def batches(chain: int):
        return EpochBatches(plate[1], config.batch_size, [seed, chain, 7]) if plate else None

    # The steps' learning rates: lr x the schedule's shape at the step counter (in the step).
    rates = Rates(config.optimizer.lr, unit_schedule(config.optimizer))
    return run_chains(
        setup.backend,
        transition,
        positions,
        seed,
        plan,
        data,
        batches,
        kind,
        rates,
        progress=progress,
        chain_ids=chain_ids,
        trace=True,
    )


def run_ensemble(
    setup: Setup,
    config: EnsembleConfig,
    *,
    seed: int,
    init: Any = None,
    progress: bool = False,
    log_likelihood: bool = True,
    chain_ids: list[int] | None = None,
):
    """Fit the members ``chain_ids`` (all by default) of ``config``'s ensemble; a
    :class:`~ppl_bdl.posterior.posterior.Posterior` with one draw per member (chain), ``post.losses``
    (member, step) and the last step's ``loss`` and ``grad_norm`` as sample stats."""
    plate = minibatch_plate(setup, config.batch_size)
    anchors = resolve_anchors(setup, config.anchored)
    setup.settings["anchored_sites"] = list(anchors.sites) if anchors else []
    transition, data = ensemble_transition(setup, config, plate, anchors, init is None)
    positions = initial_positions(setup, init, config.num_members, seed)
    members = list(range(config.num_members)) if chain_ids is None else list(chain_ids)
    setup.settings["members"] = members  # the chains' member numbers (diagnostics name them)
    run = run_map_steps(
        setup,
        transition,
        data,
        positions[members],
        config,
        plate,
        seed=seed,
        kind="ensemble",
        progress=progress,
        chain_ids=members,
    )
    if run.failure is not None:
        _raise_failure(setup, run, transition, members, log_likelihood)
    return build_posterior(
        setup,
        run.draws,
        run.infos,
        "ensemble",
        log_likelihood=log_likelihood,
        losses=run.step_infos["loss"].astype(float),
    )


def _raise_failure(setup: Setup, run: RunResult, transition, members, log_likelihood) -> None:
    """The member that failed, and a partial ensemble: the members that finished and those
    stopped with it, at their positions from before the failed step."""
    backend, failure = setup.backend, run.failure
    rows = [] if run.draws is None else [run.draws[:, -1]]
    if run.final_state is not None:
        with backend.scope(), backend.activate():
            rows.append(
                np.asarray(backend.to_numpy(transition.emit(run.final_state)), float).reshape(
                    -1, setup.layout.dim
                )
            )
    partial = None
    if rows:
        flat = np.concatenate(rows)[:, None]
        partial = build_posterior(setup, flat, {}, "ensemble", log_likelihood=log_likelihood)
        partial.settings["members"] = members[: len(flat)]
    member = failure.chains[0]
    held = (
        ""
        if partial is None
        else (
            f" error.partial holds members {members[: partial.num_chains]} at their positions "
            "before that step."
        )
    )
    if failure.reason == "interrupted":
        raise RunInterrupted(
            f"the ensemble was interrupted at step {failure.step}.{held}", partial=partial
        )
    raise InferenceError(
        f"ensemble member {member}: the loss or its gradient is not finite (NaN or inf) at "
        f"step {failure.step}.{held} Try a smaller lr, clip_norm=..., or check the model's "
        "priors and data.",
        partial=partial,
    )


# -- the methods that train by MAP optimizer steps -----------------------------------------------
@dataclass(frozen=True)
class MAPTraining(Method):
    """The options of a method that trains by MAP optimizer steps on the ensembles' driver
    (deep ensembles, SWAG, MC dropout, the Laplace approximation's mode), declared and checked
    here once. A method overrides a field to change its default or its documentation.

    Example
    -------
    >>> import ppl_bdl as bdl
    >>> bdl.MCDropout(lr=0.005).config().optimizer.lr
    0.005
    >>> bdl.MCDropout(schedule="linear")
    Traceback (most recent call last):
    ...
    ppl_bdl.errors.ConfigError: MCDropout(schedule='linear'): schedule must be one of ...
    """

    num_steps: int = option(2000, "optimizer steps")
    batch_size: int | None = option(None, "minibatch size (None: the full data)")
    optimizer: str = option("adam", "'adam' or 'sgd'")
    lr: float = option(1e-2, "the learning rate")
    momentum: float = option(0.0, "sgd's momentum")
    schedule: str = option("constant", "'constant', 'exponential' or 'cosine'")
    decay: float = option(0.1, "the exponential and cosine schedules' final factor")
    clip_norm: float | None = option(None, "clip each step's gradient to this norm")
    chunk_size: int | None = option(None, "steps per compiled call (None: chosen by the driver)")
    init: Any = option(None, "where the optimizer starts: 'median', 'uniform', 'prior' or a dict")
    hold_params: bool = option(False, "hold the model's bdl.param sites at their initial values")

    #: The docs and ``--help`` list these options after the method's own.
    options_listed_last: ClassVar[bool] = True
    #: The fewest optimizer steps allowed (the Laplace approximation takes 0: init is the MAP).
    min_steps: ClassVar[int] = 1
    #: The schedules a fixed-length run takes (VI's "plateau" needs its convergence monitor).
    schedules: ClassVar[tuple[str, ...]] = ("constant", "exponential", "cosine")

    def __post_init__(self) -> None:
        check_int(self, "num_steps", self.min_steps)
        check_int(self, "batch_size", optional=True)
        check_int(self, "chunk_size", optional=True)
        check_choice(self, "optimizer", OPTIMIZERS)
        check_number(self, "lr", 0.0)
        check_number(self, "momentum", 0.0, 1.0, open_low=False)
        if self.schedule == "plateau":
            raise ConfigError(
                f"{type(self).__name__}(schedule='plateau'): schedule='plateau' does not apply "
                f"to method={self.method_name!r}: VI's convergence monitor cuts the lr on a "
                "plateau, and this method runs num_steps steps without one. Use schedule="
                + " or ".join(repr(s) for s in self.schedules)
                + "."
            )
        check_choice(self, "schedule", self.schedules)
        check_number(self, "decay", 0.0)
        check_number(self, "clip_norm", 0.0, optional=True)
        check_bool(self, "hold_params")
        self.training_config(num_steps=max(1, self.num_steps))  # the optimizer's checks

    def training_config(self, num_members: int = 1, **overrides: Any) -> EnsembleConfig:
        """The optimizer run's settings, as one ensemble member (or ``num_members``) runs them."""
        options = {**self.options_for(EnsembleConfig.build, MAPTraining), **overrides}
        return EnsembleConfig.build(num_members=num_members, **options)


@dataclass(frozen=True)
class Ensemble(MAPTraining):
    """Deep ensembles (Lakshminarayanan et al. 2017) and anchored ensembles (Pearce et al.
    2020): ``num_members`` MAP fits from their own starts, one draw per member.

    Example
    -------
    >>> import ppl_bdl as bdl
    >>> bdl.Ensemble(num_members=8, lr=0.05).config().optimizer.lr
    0.05
    """

    num_members: int = option(5, "members, each one MAP fit (a chain of one draw)")
    num_steps: int = option(2000, "optimizer steps per member")
    anchored: Any = option(
        False, "True: anchor every latent site; or a tuple of site names; False: a plain ensemble"
    )
    init: Any = option(None, "where members start: 'median', 'uniform', 'prior' or a dict")

    method_name: ClassVar[str] = "ensemble"
    runs_chains: ClassVar[bool] = True
    hints: ClassVar[dict[str, str]] = {
        "num_chains": "an ensemble's members are its chains: set num_members",
        "num_samples": "each member keeps one draw, its last position",
        "num_warmup": "each member runs num_steps optimizer steps (no warmup)",
        "thinning": "each member keeps one draw (no chain to thin)",
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        self.config()  # num_members and anchored

    @property
    def num_chains_to_run(self) -> int:
        return self.num_members

    def config(self) -> EnsembleConfig:
        return self.training_config(self.num_members, anchored=self.anchored)

    def settings(self) -> dict:
        return {**self.given(), **self.config().settings()}

    def run(self, setup, *, seed: int, progress: bool, log_likelihood: bool, chain_ids):
        check_params(setup, self.name, self.hold_params)
        return run_ensemble(
            setup,
            self.config(),
            seed=seed,
            init=self.init,
            progress=progress,
            log_likelihood=log_likelihood,
            chain_ids=chain_ids,
        )
