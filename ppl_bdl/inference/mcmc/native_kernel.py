"""Our SG-MCMC kernels as native MCMC kernels of each backend.

:func:`native_kernel` (``bdl.native_kernel``) wraps a registered SG-MCMC kernel, with a bound model and its data, as a
``numpyro.infer.mcmc.MCMCKernel`` (backend "numpyro") or a ``pyro.infer.mcmc.MCMCKernel``
(backend "pyro"), so NumPyro's and Pyro's own ``MCMC`` drivers run it. The native kernel draws
its own minibatch in ``sample`` and holds the data fixed.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import numpy as np

from ppl_bdl.backend_protocol import Batch
from ppl_bdl.errors import ConfigError, InferenceError
from ppl_bdl.inference.loop.minibatch import EpochBatches
from ppl_bdl.inference.mcmc.kernels.registry import get
from ppl_bdl.inference.mcmc.schedules import make_schedule
from ppl_bdl.inference.mcmc.sgmcmc import SGMCMCConfig, sgmcmc_transition
from ppl_bdl.inference.setup import minibatch_plate, prepare
from ppl_bdl.inference.starts import initial_positions


def native_kernel(
    bound,
    backend: str,
    method: str = "sgld",
    *,
    step_size: float,
    batch_size: int | None = None,
    schedule: str = "constant",
    num_steps: int | None = None,
    num_cycles: int = 4,
    decay_offset: float = 1.0,
    decay_power: float = 0.55,
    precision: str = "float32",
    seed: int = 0,
    **settings: Any,
):
    """A native MCMC kernel of ``backend`` running our SG-MCMC kernel ``method`` on ``bound``.

    Parameters
    ----------
    bound : BoundModel
        The model with its data (held fixed; the kernel draws minibatch indices itself).
    backend : {"numpyro", "pyro"}
    method : str
        A registered SG-MCMC kernel ("sgld", "sghmc", "psgld", "csgld", "csghmc", ...).
    step_size, batch_size, schedule, num_cycles, decay_offset, decay_power
        As for ``fit``. ``num_steps`` (the total steps of the run) is needed by the cyclical
        schedule and by csgld / csghmc.
    **settings
        The kernel's own settings (``temperature``, ``friction``, ...).

    Example
    -------
    >>> import numpy as np, jax, ppl_bdl as bdl
    >>> from numpyro.infer import MCMC
    >>> from ppl_bdl import dist
    >>> @bdl.model
    ... def mean_model(y):
    ...     mu = bdl.sample("mu", dist.Normal(0.0, 10.0))
    ...     with bdl.plate("data", y.shape[0]) as idx:
    ...         bdl.sample("y", dist.Normal(mu, 1.0), obs=y[idx])
    >>> y = np.random.default_rng(0).normal(size=100)
    >>> kernel = bdl.native_kernel(mean_model(y), "numpyro", "sgld", step_size=1e-3,
    ...                                    batch_size=10)
    >>> mcmc = MCMC(kernel, num_warmup=100, num_samples=100, progress_bar=False)
    >>> mcmc.run(jax.random.PRNGKey(0))
    >>> mcmc.get_samples()["mu"].shape
    (100,)
    """
    spec = NativeSpec.build(
        bound,
        backend,
        method,
        step_size=step_size,
        batch_size=batch_size,
        schedule=schedule,
        num_steps=num_steps,
        num_cycles=num_cycles,
        decay_offset=decay_offset,
        decay_power=decay_power,
        precision=precision,
        seed=seed,
        settings=settings,
    )
    return spec.setup.backend.native_sgmcmc_kernel(spec)


@dataclass
class NativeSpec:
    """Everything a native adapter needs, built by the core: the prepared model, the transition
    ``fit`` runs (:func:`ppl_bdl.inference.mcmc.sgmcmc.sgmcmc_transition`), the data its steps read,
    the step-size schedule (:meth:`rate`, evaluated in the adapter's graph at its own step
    counter) and the minibatch plate. The adapters add only what their driver needs (where
    minibatch indices come from)."""

    setup: Any
    method: str
    transition: Any
    data: Any
    schedule: Any
    plate: tuple[str, int] | None
    batch_size: int | None
    seed: int

    @classmethod
    def build(
        cls,
        bound,
        backend,
        method,
        *,
        step_size,
        batch_size,
        schedule,
        num_steps,
        num_cycles,
        decay_offset,
        decay_power,
        precision,
        seed,
        settings,
    ) -> NativeSpec:
        if get(method).kind != "sgmcmc":
            raise ConfigError(
                f"native_kernel wraps SG-MCMC kernels; {method!r} is the backend's own sampler "
                "already (use numpyro.infer.NUTS / pyro.infer.NUTS)."
            )
        config = SGMCMCConfig.build(
            method,
            step_size=step_size,
            batch_size=batch_size,
            schedule=None if schedule == "constant" else schedule,
            num_cycles=num_cycles,
            decay_offset=decay_offset,
            decay_power=decay_power,
            **settings,
        )
        if config.step_size is None:
            raise ConfigError(
                "native_kernel needs a step_size (the native drivers run no step-size pilot)."
            )
        needs_steps = config.schedule == "cyclical" or "num_steps" in _factory_settings(method)
        if needs_steps and num_steps is None:
            raise ConfigError(
                f"native_kernel(method={method!r}, schedule={config.schedule!r}) needs num_steps, "
                "the total number of steps the native driver will run (num_warmup + "
                "num_samples)."
            )
        setup = prepare(bound, backend, precision, seed)
        plate = minibatch_plate(setup, batch_size)
        sizes = make_schedule(
            config.schedule,
            config.step_size,
            num_steps=num_steps or 1,
            num_cycles=num_cycles,
            decay_offset=decay_offset,
            decay_power=decay_power,
        )
        transition, data = sgmcmc_transition(setup, config, plate, num_steps or 1)
        return cls(setup, method, transition, data, sizes, plate, batch_size, seed)

    def rate(self, step):
        """The step size at ``step`` (a traced or host step counter)."""
        return self.schedule(step)

    def initial_position(self):
        """Uniform on [-2, 2] in the unconstrained space."""
        return initial_positions(self.setup, "uniform", 1, self.seed)[0]

    def batch(self, indices) -> Batch:
        """What a step sees of the data (see :class:`ppl_bdl.backend_protocol.Batch`)."""
        return Batch(self.data, indices)

    def minibatches(self):
        """Host-side minibatch indices (one shuffle per epoch), or None for full batch."""
        if self.plate is None:
            return None
        return EpochBatches(self.plate[1], self.batch_size, self.seed)

    def check(self, info: dict, step: int) -> None:
        """Raise :class:`~ppl_bdl.errors.InferenceError` if ``info`` holds NaN or inf (the
        driver's check)."""
        for value in info.values():
            value = np.asarray(self.setup.backend.to_numpy(value))
            if np.issubdtype(value.dtype, np.floating) and not np.all(np.isfinite(value)):
                raise InferenceError(
                    f"SG-MCMC kernel {self.method!r} reached a non-finite potential or gradient "
                    f"at step {step}; try a smaller step_size."
                )

    def constrain(self, flat) -> dict:
        """Constrained site values from a flat unconstrained vector."""
        backend, layout = self.setup.backend, self.setup.layout
        out = {}
        for name, u in layout.unflatten(flat).items():
            transform = backend.biject_to(layout.sites[name].native.support)
            out[name] = u if transform is None else transform(u)
        return out


def _factory_settings(method: str) -> set[str]:
    return set(inspect.signature(get(method).factory).parameters)
