"""Langevin chains on the inputs of an energy-based model, with the project's SG-MCMC kernels.

Sampling x̃ ~ p_θ(x) needs only ∇_x log p_θ(x) = −∇_x E_θ(x): Z_θ does not depend on x ("Bayesian Computation in Deep Learning",
Eq. 3.6). A registered kernel (``sgld``, ``sghmc``, ``psgld``, ...;
:mod:`ppl_bdl.inference.mcmc.kernels`) runs on the batch of inputs as its position, with the potential
U(x_1..B) = Σ_b E_θ(x_b): the chains are independent (U is a sum), and with ``sgld`` each step is
Eq. 3.7 of "Bayesian Computation in Deep Learning", x_{k+1} = x_k − α_k ∇_x E_θ(x_k) + √(2 α_k) ε_k, ε_k ~ N(0, I) (the noise
as the text gives it: temperature 1). The step sizes α_k follow a schedule of
:mod:`ppl_bdl.inference.mcmc.schedules` over the chain's K steps. The kernel's "minibatch" argument carries θ.

:class:`ReplayBuffer` holds the persistent chains (Tieleman 2008; a replay buffer as in Du and
Mordatch 2019): first in, first out, so it needs no scatter and every shape is static.

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl.inference.ebm.chains import ChainSpec
>>> spec = ChainSpec.build("sgld", step_size=0.1, chain_steps=4)
>>> backend = bdl.backends.get("numpyro")
>>> with backend.activate():
...     sizes = spec.step_sizes(backend, 4)
>>> sizes.tolist()
[0.1, 0.1, 0.1, 0.1]
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ppl_bdl.dsl import math as bm
from ppl_bdl.dsl import random as br
from ppl_bdl.errors import ConfigError
from ppl_bdl.inference.mcmc import kernels
from ppl_bdl.inference.mcmc.schedules import SCHEDULES, make_schedule
from ppl_bdl.inference.mcmc.sgmcmc import DRIVER_SUPPLIED, build_kernel


def _positive_int(name: str, value: Any, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
        raise ConfigError(f"{name} must be an int >= {low}, got {value!r}.")
    return int(value)


@dataclass(frozen=True)
class ChainSpec:
    """The sampler of the inputs: kernel ``sampler`` with its ``options``, K = ``chain_steps``
    steps at α_k = ``step_size`` × the schedule's shape at k (``schedule``: "constant",
    "polynomial" with ``decay_offset`` and ``decay_power``, or "cyclical" with ``num_cycles``).
    ``clip``: put each step's position back into the box the chains start in (projected
    Langevin; Du and Mordatch 2019 clamp images to their pixel range), off by default."""

    sampler: str = "sgld"
    step_size: float = 0.01
    chain_steps: int = 20
    schedule: str = "constant"
    num_cycles: int = 1
    decay_offset: float = 1.0
    decay_power: float = 0.55
    clip: bool = False
    options: dict = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        sampler: str = "sgld",
        *,
        step_size: float = 0.01,
        chain_steps: int = 20,
        schedule: str = "constant",
        num_cycles: int = 1,
        decay_offset: float = 1.0,
        decay_power: float = 0.55,
        clip: bool = False,
        **options: Any,
    ) -> ChainSpec:
        """Validate every setting (a clear error for each), then build the spec."""
        if not isinstance(sampler, str):
            raise ConfigError(f"sampler must be a kernel name, got {sampler!r}.")
        sg = [n for n in kernels.available() if kernels.get(n).kind == "sgmcmc"]
        if sampler not in sg and sampler not in kernels.available():
            raise ConfigError(
                f"unknown sampler {sampler!r}; the chains on an EBM's inputs run one of the "
                f"registered SG-MCMC kernels: {sg}."
            )
        if kernels.get(sampler).kind != "sgmcmc":
            raise ConfigError(
                f"sampler={sampler!r} is the backend's own {sampler.upper()}, which needs a "
                f"density it can evaluate in a model; the chains on an EBM's inputs run one of the "
                f"SG-MCMC kernels: {sg}."
            )
        chain_steps = _positive_int("chain_steps (K, the Langevin steps per update)", chain_steps)
        if schedule not in SCHEDULES:
            raise ConfigError(f"schedule must be one of {list(SCHEDULES)}, got {schedule!r}.")
        num_cycles = _positive_int("num_cycles", num_cycles)
        if not isinstance(clip, bool):
            raise ConfigError(f"clip must be True or False, got {clip!r}.")
        spec = cls(
            sampler,
            step_size,
            chain_steps,
            schedule,
            num_cycles,
            decay_offset,
            decay_power,
            clip,
            dict(options),
        )
        spec.unit_schedule(chain_steps)  # checks step_size and the schedule's own settings
        params = inspect.signature(kernels.get(sampler).factory).parameters
        var_kw = [n for n, p in params.items() if p.kind is inspect.Parameter.VAR_KEYWORD]
        settable = [n for n in params if n not in DRIVER_SUPPLIED and n not in var_kw]
        unknown = sorted(k for k in options if k not in settable)
        if unknown and not var_kw:
            raise ConfigError(
                f"unknown option(s) {unknown}: neither a setting of the EBM's training nor one of "
                f"sampler {sampler!r} (its settings: {settable}). See bdl.ebm.fit's parameters."
            )
        spec.kernel(lambda x, theta: (bm.sum(x * x), x), chain_steps)  # checks their values
        return spec

    @property
    def entry(self):
        return kernels.get(self.sampler)

    def unit_schedule(self, num_steps: int):
        """α_k / α_0: the schedule's shape over ``num_steps`` steps (a function of k)."""
        scaled = make_schedule(
            self.schedule,
            self.step_size,
            num_steps=num_steps,
            num_cycles=self.num_cycles,
            decay_offset=self.decay_offset,
            decay_power=self.decay_power,
        )
        return lambda k: scaled(k) * (1.0 / self.step_size)

    def step_sizes(self, backend, num_steps: int) -> np.ndarray:
        """α_0, ..., α_{num_steps−1} (NumPy; run under ``backend.activate()``)."""
        unit = self.unit_schedule(num_steps)(backend.arange(num_steps))
        return self.step_size * np.asarray(backend.to_numpy(unit), dtype=float)

    def kernel(self, value_and_grad, num_steps: int):
        """The kernel on ``value_and_grad(x, θ) -> (Σ E_θ, ∇_x)``, for chains of ``num_steps``
        steps (a cyclical kernel spans them)."""
        params = inspect.signature(self.entry.factory).parameters
        if "exploration" in params and num_steps < self.num_cycles:
            raise ConfigError(
                f"sampler={self.sampler!r} runs num_cycles={self.num_cycles} cycles over each "
                f"chain's {num_steps} steps; use fewer cycles or more chain_steps."
            )
        return build_kernel(
            self.entry,
            self.options,
            value_and_grad=value_and_grad,
            num_steps=num_steps,
            num_cycles=self.num_cycles,
        )


def input_value_and_grad(backend, energy, batch_shape: tuple[int, ...]):
    """``(x_flat, θ) -> (Σ_b E_θ(x_b), ∇_x)``: the potential of B independent chains, their
    inputs laid out flat (kernels read any shape; a flat one keeps ``norm`` well defined)."""

    def total(position, params):
        return bm.sum(energy(params, bm.reshape(position, batch_shape)))

    return backend.value_and_grad(total)


def run_chain(backend, kernel, sizes, keys, position, params, bounds=None):
    """K = ``len(sizes)`` kernel steps from ``position`` at θ = ``params`` (Algorithm 3, lines
    3-7), one loop in the compiled step (:meth:`Backend.fori_loop`); returns x_K, flat.
    ``sizes``: the K step sizes (an array); ``keys``: K keys (:meth:`RandomKeys.keys`);
    ``bounds``: (low, high) of the flat position, to clip each step's position into."""

    def one(k, state):
        state, _ = kernel.step(keys[k], state, params, sizes[k])
        return clipped(state, bounds)

    return backend.fori_loop(len(sizes), one, kernel.init(position))["position"]


def clipped(state: dict, bounds):
    """The kernel's state with its position clipped into ``bounds`` (None: unchanged)."""
    if bounds is None:
        return state
    return dict(state, position=bm.clip(state["position"], bounds[0], bounds[1]))


def tiled_bounds(backend, box, count: int, clip: bool):
    """The box of ``count`` points laid out flat, as backend arrays (None without ``clip``)."""
    if not clip:
        return None
    return tuple(backend.asarray(np.tile(np.asarray(b, dtype=float), count)) for b in box)


class ReplayBuffer:
    """Persistent chains, first in, first out: ``take`` gives the B oldest (rows 0..B−1; with
    probability ``reinit`` each is replaced by a fresh start, so the buffer keeps exploring,
    Du and Mordatch 2019), ``put`` appends the B advanced chains at the back. With M = ``size``
    rows every chain is advanced once every M/B updates.

    Example
    -------
    >>> import numpy as np, ppl_bdl as bdl
    >>> from ppl_bdl.inference.ebm.chains import ReplayBuffer
    >>> buffer = ReplayBuffer(size=6, batch_size=2, reinit=0.0)
    >>> backend = bdl.backends.get("numpyro")
    >>> with backend.activate():
    ...     rows = backend.asarray(np.arange(12.0).reshape(6, 2))
    ...     oldest = buffer.take(rows, None, None)
    ...     rows = buffer.put(rows, oldest + 100.0)
    >>> np.asarray(rows)[:, 0].tolist()
    [4.0, 6.0, 8.0, 10.0, 100.0, 102.0]
    """

    def __init__(self, size: int, batch_size: int, reinit: float):
        self.size = _positive_int("buffer_size", size)
        if self.size < batch_size:
            raise ConfigError(
                f"buffer_size={size} is smaller than batch_size={batch_size}: each update takes "
                f"batch_size chains from the buffer. Use buffer_size >= {batch_size}."
            )
        if isinstance(reinit, bool) or not isinstance(reinit, int | float) or not 0 <= reinit <= 1:
            raise ConfigError(
                f"reinit (the probability that a persistent chain restarts) must be in [0, 1], "
                f"got {reinit!r}; Du and Mordatch (2019) use 0.05."
            )
        self.batch_size, self.reinit = batch_size, float(reinit)

    def take(self, rows, key, fresh):
        """The B oldest chains (B, D); each replaced by its row of ``fresh`` with probability
        ``reinit`` (``key`` draws which)."""
        oldest = rows[: self.batch_size]
        if self.reinit == 0.0:
            return oldest
        restart = br.uniform(key, (self.batch_size, 1)) < self.reinit
        return bm.where(restart, fresh, oldest)

    def put(self, rows, advanced):
        """The buffer with the B oldest rows dropped and ``advanced`` (B, D) appended."""
        return bm.concatenate([rows[self.batch_size :], advanced], axis=0)


def uniform_box(key, shape: tuple[int, ...], low, high):
    """Uniform starting points in the box [low, high) (per coordinate, broadcast on the last
    axis): the noise a chain restarts from (Nijkamp et al. 2019)."""
    return low + (high - low) * br.uniform(key, shape)


def box_of(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The data's range per coordinate (flat), the box fresh chains start in."""
    flat = X.reshape(len(X), -1)
    low, high = flat.min(axis=0), flat.max(axis=0)
    same = high <= low  # a constant coordinate still gets a box of width 1
    return np.where(same, low - 0.5, low), np.where(same, high + 0.5, high)


def flat_size(shape: tuple[int, ...]) -> int:
    return int(math.prod(shape))
