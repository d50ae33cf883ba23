"""Replica exchange SG-MCMC (Deng et al. 2020; "Bayesian Computation in Deep Learning", Sec. 2.1)
as methods: :class:`ReSGLD` and :class:`ReSGHMC`.

Each of ``num_chains`` chains is a ladder of ``len(temperatures)`` replicas
(:mod:`~ppl_bdl.inference.mcmc.kernels.replica_exchange`), run side by side in the one compiled
step of the driver (:func:`~ppl_bdl.inference.loop.driver.run_chains`): the ladder's state holds
its replicas' positions as one (K, d) array, and their potentials and gradients come from one
vectorised evaluation of the model on the step's minibatch (all replicas of a ladder read the
same minibatch, so the noise of their potentials' differences is smaller than with a minibatch
each). The posterior's draws are those of the temperature-1 replica of each ladder.
``post.settings["swap_rates"]`` holds each neighbour pair's acceptance rate (accepted swaps over
proposed ones, over the whole run and every ladder) and ``post.settings["temperatures"]`` the
ladder.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ppl_bdl.backend_protocol import Batch, Transition
from ppl_bdl.errors import ConfigError
from ppl_bdl.inference.mcmc.kernels.replica_exchange import (
    check_temperatures,
    difference_variance,
    replica_exchange,
)
from ppl_bdl.inference.mcmc.kernels.sghmc import sghmc_parameters
from ppl_bdl.inference.mcmc.methods import SGMCMCBase
from ppl_bdl.inference.mcmc.sgmcmc import SGMCMCConfig, run_sg_chains, sg_posterior
from ppl_bdl.inference.method import check_bool, check_int, check_number, check_params, option
from ppl_bdl.inference.setup import Setup, minibatch_plate
from ppl_bdl.trace.layout import ModelDensity
from ppl_bdl.trace.pointwise import PointDensity
from ppl_bdl.trace.programs import keyed, programs, structure_key


@dataclass(frozen=True)
class Ladder:
    """A ladder's settings: the base kernel ("sgld" or "sghmc"), the temperatures, the steps
    between swap turns, whether to correct the swaps for the minibatch noise and the factor F."""

    kind: str
    temperatures: tuple[float, ...]
    swap_every: int
    correction: bool
    correction_factor: float


@dataclass(frozen=True)
class _ReplicaExchange(SGMCMCBase):
    temperatures: tuple = option(
        (1.0, 2.0, 4.0, 8.0), "the ladder τ_0 = 1 < τ_1 < ...: replica k samples exp(−U/τ_k)"
    )
    swap_every: int = option(1, "steps between swap turns (even pairs, then odd pairs)")
    correction: bool = option(
        True, "correct the swap rate for the minibatch noise of the potentials (Deng et al.)"
    )
    correction_factor: float = option(1.0, "F >= 1 divides the correction (1: unbiased)")

    hints: ClassVar[dict[str, str]] = {
        **SGMCMCBase.hints,
        "temperature": "replica k runs at temperature τ_k of temperatures=(1.0, ...)",
    }
    _LADDER: ClassVar[tuple[str, ...]] = (
        "temperatures",
        "swap_every",
        "correction",
        "correction_factor",
    )

    def __post_init__(self) -> None:
        name = type(self).__name__
        check_temperatures(self.temperatures, f"{name}(temperatures={self.temperatures!r})")
        check_int(self, "swap_every")
        check_bool(self, "correction")
        check_number(self, "correction_factor", 1.0, open_low=False)
        if self.control_variate is not None:
            raise ConfigError(
                f"{name}(control_variate={self.control_variate!r}): replica exchange takes no "
                "control variate; leave control_variate out."
            )
        super().__post_init__()

    def kernel_options(self) -> dict[str, Any]:
        ladder = set(self._LADDER)
        return {k: v for k, v in super().kernel_options().items() if k not in ladder}

    def config(self) -> SGMCMCConfig:
        driver = self.options_for(SGMCMCConfig.build, SGMCMCBase)
        return SGMCMCConfig.build(self.base_kernel, **driver, **self.kernel_options())

    def ladder(self) -> Ladder:
        return Ladder(
            self.base_kernel,
            tuple(float(t) for t in self.temperatures),
            self.swap_every,
            self.correction,
            float(self.correction_factor),
        )

    def run(self, setup, *, seed: int, progress: bool, log_likelihood: bool, chain_ids):
        check_params(setup, self.name, self.hold_params)
        lengths = self._lengths(seed, progress, log_likelihood, chain_ids)
        return run_replica_exchange(setup, self.config(), self.ladder(), self.name, **lengths)


@dataclass(frozen=True)
class ReSGLD(_ReplicaExchange):
    """Replica exchange SGLD (Deng et al. 2020): a ladder of SGLD replicas at the temperatures
    ``temperatures`` whose neighbours swap positions, with the swap rate corrected for the
    minibatch noise; the draws are the temperature-1 replica's.

    Example
    -------
    >>> import ppl_bdl as bdl
    >>> bdl.ReSGLD(temperatures=(1.0, 3.0, 9.0), step_size=1e-3).temperatures
    (1.0, 3.0, 9.0)
    """

    method_name: ClassVar[str] = "resgld"
    base_kernel: ClassVar[str] = "sgld"


@dataclass(frozen=True)
class ReSGHMC(_ReplicaExchange):
    """Replica exchange SGHMC (Deng et al. 2020): a ladder of SGHMC replicas at the temperatures
    ``temperatures`` whose neighbours swap positions and velocities; the draws are the
    temperature-1 replica's.

    Example
    -------
    >>> import ppl_bdl as bdl
    >>> bdl.ReSGHMC(momentum_decay=0.1, swap_every=5).swap_every
    5
    """

    friction: float | None = option(
        None, "C of Eq. 2.12 (the momentum decay is then C √(η / M)); or give momentum_decay"
    )
    momentum_decay: float | None = option(None, "α in [0, 1] (None: 0.1 unless friction is set)")
    mass: Any = option(1.0, "the diagonal mass M: a number or one per coordinate")
    noise_estimate: float = option(0.0, "B̂, the gradient noise subtracted from the injected")

    method_name: ClassVar[str] = "resghmc"
    base_kernel: ClassVar[str] = "sghmc"


def run_replica_exchange(
    setup: Setup,
    config: SGMCMCConfig,
    ladder: Ladder,
    name: str,
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
    """Run ``num_chains`` ladders of ``ladder`` on a prepared model; a Posterior of their
    temperature-1 replicas (of the chains ``chain_ids``, all by default), with the swap rates
    in ``post.settings["swap_rates"]``.

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
    >>> post = bdl.fit(mean_model(y), backend="numpyro", method="resgld", step_size=1e-3,
    ...                batch_size=10, num_warmup=100, num_samples=100, num_chains=1, progress=False)
    >>> post.samples["mu"].shape, len(post.settings["swap_rates"])
    ((1, 100), 3)
    """
    backend = setup.backend
    plate = minibatch_plate(setup, config.batch_size)
    keep = config.keep(num_warmup, num_samples, thinning)
    transition = ladder_transition(setup, config, ladder, plate)
    data, _ = setup.bound.data_arrays(backend)
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
    setup.settings["temperatures"] = list(ladder.temperatures)
    runs = num_chains if chain_ids is None else len(chain_ids)
    setup.settings["swap_rates"] = swap_rates(backend, run, runs)
    kind = f"replica exchange {name!r}"
    return sg_posterior(
        setup, config, run, step_size, len(keep), name, kind, num_samples, log_likelihood
    )


def swap_rates(backend, run, num_chains: int) -> list[float | None]:
    """Each neighbour pair's accepted swaps over its proposed ones, summed over the ladders'
    final states (None for a pair never proposed)."""
    proposed, accepted = 0.0, 0.0
    for index in range(num_chains):
        state = run.chain_state(backend, index)
        if state is None:
            continue
        proposed = proposed + np.asarray(backend.to_numpy(state["swaps_proposed"]), float)
        accepted = accepted + np.asarray(backend.to_numpy(state["swaps_accepted"]), float)
    proposed, accepted = np.atleast_1d(proposed), np.atleast_1d(accepted)
    return [float(a / p) if p > 0 else None for a, p in zip(accepted, proposed, strict=True)]


def ladder_transition(
    setup: Setup, config: SGMCMCConfig, ladder: Ladder, plate: tuple[str, int] | None
) -> Transition:
    """The per-chain transition of a ladder: ``init`` stacks the chain's start K times, ``step``
    is the ladder kernel's, ``emit`` the temperature-1 replica's position. Kept in the
    backend's program cache under the model and the settings (another fit reuses it)."""
    model = setup.program_key()
    key = keyed(
        lambda: (
            "replica_exchange",
            model,
            structure_key(config.kernel_options),
            structure_key(ladder.__dict__),
            plate,
            config.batch_size,
        )
    )
    if model is None or key is None:
        return _build_ladder(setup, config, ladder, plate)
    return programs(setup.backend).get(
        key, lambda: _build_ladder(setup, config, ladder, plate)._replace(key=key)
    )


def _build_ladder(
    setup: Setup, config: SGMCMCConfig, ladder: Ladder, plate: tuple[str, int] | None
) -> Transition:
    backend, num = setup.backend, len(ladder.temperatures)
    with backend.scope(), backend.activate():
        energies = ladder_energies(setup, num, plate, config.batch_size, ladder.correction)
        settings = None
        if ladder.kind == "sghmc":
            options = {k: config.kernel_options.get(k) for k in ("friction", "momentum_decay")}
            options["noise_estimate"] = config.kernel_options.get("noise_estimate", 0.0)
            options["mass"] = config.kernel_options.get("mass", 1.0)
            settings = sghmc_parameters(
                options["friction"],
                options["momentum_decay"],
                options["noise_estimate"],
                1.0,
                options["mass"],
            )
        kernel = replica_exchange(
            energies,
            ladder.temperatures,
            ladder.kind,
            ladder.swap_every,
            ladder.correction_factor,
            settings,
        )
    m = backend.math

    def init(rng_key, position, data):
        return kernel.init(m.stack([position] * num))

    def emit(state):  # on the state of one chain, or of all chains stacked (a leading axis)
        return state["position"][..., 0, :]

    return Transition(init, kernel.step, emit)


def ladder_energies(
    setup: Setup, num: int, plate: tuple[str, int] | None, batch_size: int | None, correct: bool
):
    """The ladder's :data:`~ppl_bdl.inference.mcmc.kernels.replica_exchange.Energies`, traced
    once: the K replicas' minibatch potentials (scaled to the data, Eq. 2.8 of "Bayesian
    Computation in Deep Learning") in one vectorised evaluation, their gradients, and, on a
    minibatch with ``correct``, the variances of the neighbours' differences from the
    minibatch's per-point log densities (the kernel module's ``difference_variance``)."""
    backend, layout = setup.backend, setup.layout
    m = backend.math
    plate_name = plate[0] if plate else None
    if plate is None or not correct:
        density = ModelDensity(setup.bound, backend, layout, setup.params)

        def total(positions, batch: Batch):
            indices = None if batch.indices is None else {plate_name: batch.indices}
            potentials = backend.vmap(lambda p: density.potential(p, batch.data, indices))(
                positions
            )
            return m.sum(potentials), (potentials, m.zeros_like(potentials[1:]))

    else:
        points_of = PointDensity(setup.bound, backend, plate_name, params=setup.params)
        size = plate[1]

        def one(position, data, indices):
            outside, points = points_of(layout.unflatten(position, backend), data, indices)
            return -(outside + (size / batch_size) * m.sum(points)), points

        def total(positions, batch: Batch):
            potentials, points = backend.vmap(one, in_axes=(0, None, None))(
                positions, batch.data, batch.indices
            )
            variances = difference_variance(points, size**2 / batch_size, batch_size / size)
            return m.sum(potentials), (potentials, variances)

    idx = backend.asarray(np.zeros(batch_size), dtype="int") if plate else None
    start = backend.asarray(np.zeros((num, layout.dim)))
    example = (start, Batch(setup.bound.data_arrays(backend)[0], idx))
    return backend.trace(backend.value_and_grad(total, has_aux=True), example)
