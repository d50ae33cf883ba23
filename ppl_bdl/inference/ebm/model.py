"""A trained energy-based model: its energy E_θ(x), and draws from p_θ(x) ∝ exp(−E_θ(x)).

:func:`ppl_bdl.inference.ebm.fit` returns an :class:`EnergyModel`; one can also be built from given
parameters (a fixed energy, e.g. to check a sampler). ``model.sample(n)`` runs the EBM's kernel on
n chains of the inputs (Eq. 3.7 of "Bayesian Computation in Deep Learning" with ``sgld``) through the project's loop.

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import nn
>>> net = nn.Sequential("e", [nn.Dense("w", 2, 2), lambda h: 0.5 * (h * h).sum(-1)])
>>> model = bdl.ebm.EnergyModel(net, {"e.w.weight": np.eye(2), "e.w.bias": np.zeros(2)},
...                             event_shape=(2,), box=(-3.0, 3.0), backend="numpyro",
...                             step_size=0.05)
>>> model.energy(np.array([[1.0, 0.0], [0.0, 2.0]])).round(3).tolist()   # ½|x|²
[0.5, 2.0]
>>> x = model.sample(2000, steps=200, seed=0)   # ≈ N(0, I), up to the step size's bias
>>> x.shape, bool(abs(x.std(0) - 1.0).max() < 0.1)
((2000, 2), True)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ppl_bdl.backends import get as get_backend
from ppl_bdl.errors import ConfigError, InferenceError, ModelError
from ppl_bdl.inference.ebm.chains import (
    ChainSpec,
    clipped,
    flat_size,
    input_value_and_grad,
    tiled_bounds,
)
from ppl_bdl.inference.ebm.energy import Energy
from ppl_bdl.inference.ebm.loop import run_transition
from ppl_bdl.inference.loop.driver import Transition

#: Rows per call when :meth:`EnergyModel.energy` evaluates many points.
ENERGY_CHUNK = 8192


class EnergyModel:
    """An energy network with its parameters, and the sampler of its inputs.

    Parameters
    ----------
    network : ppl_bdl.dsl.nn.Module
        E(x): a :mod:`ppl_bdl.dsl.nn` network or a lifted module, ``(B, *event)`` -> (B,) or (B, 1).
    params : dict
        Site name -> array, one per weight site of ``network`` (``network.sites()``).
    event_shape : tuple of int
        The shape of one point x.
    box : (low, high)
        Where chains started from noise begin: uniform in [low, high) per coordinate (numbers,
        or arrays of one value per coordinate of x, flat); :func:`~ppl_bdl.inference.ebm.fit` uses the
        data's range.
    backend : str or Backend
        "numpyro" or "pyro" (default: the default backend); ``precision`` and ``device`` as
        for :func:`ppl_bdl.run.fit`.
    sampler, step_size, chain_steps, schedule, **chain_options
        The kernel of the inputs and its settings (see :func:`ppl_bdl.inference.ebm.fit`).

    Attributes
    ----------
    params : dict of NumPy arrays
    buffer : NumPy array ``(M, *event)`` or None
        The persistent chains at the end of training.
    losses : NumPy array (T,) or None
        E_θ(x⁺) − E_θ(x⁻), the minibatch mean of each training step.
    history : dict of NumPy arrays
        Every training step's info: ``loss``, ``energy_data``, ``energy_samples``, ``grad_norm``.
    settings : dict
        The settings of the fit.
    """

    def __init__(
        self,
        network,
        params: dict,
        *,
        event_shape,
        box=(-3.0, 3.0),
        backend=None,
        precision: str = "float32",
        device: str | None = None,
        sampler: str = "sgld",
        step_size: float = 0.01,
        chain_steps: int = 20,
        schedule: str = "constant",
        **chain_options: Any,
    ):
        self.backend = get_backend(backend, precision, device)
        self.network = network
        self.chain = ChainSpec.build(
            sampler,
            step_size=step_size,
            chain_steps=chain_steps,
            schedule=schedule,
            **chain_options,
        )
        self._energy = Energy(network, self.backend)
        self.event_shape = _event_shape(event_shape)
        self.params = _check_params(self._energy, params)
        self._energy.check(self.params, np.zeros((2, *self.event_shape)))
        size = flat_size(self.event_shape)
        try:
            low, high = (np.broadcast_to(np.asarray(b, dtype=float), (size,)) for b in box)
        except (TypeError, ValueError):
            raise ConfigError(
                f"box must be (low, high), each a number or {size} numbers (one per coordinate of "
                f"x), got {box!r}."
            ) from None
        if not np.all(high > low):
            raise ConfigError(f"box=(low, high) needs high > low everywhere, got {box!r}.")
        self.box = (low, high)
        self.buffer: np.ndarray | None = None
        self.losses: np.ndarray | None = None
        self.history: dict[str, np.ndarray] = {}
        self.settings: dict[str, Any] = {}
        #: Sampling transitions by (n, steps): θ is the loop's data, so a later call of the same
        #: shape reuses the compiled loop.
        self._samplers: dict[tuple[int, int], Transition] = {}

    def __repr__(self) -> str:
        trained = "" if self.losses is None else f", {len(self.losses)} training steps"
        return (
            f"<EnergyModel {self.network.path!r} on {self.backend.name}: x of shape "
            f"{self.event_shape}, sampler {self.chain.sampler!r}{trained}>"
        )

    def energy(self, x) -> np.ndarray:
        """E_θ(x) for the rows of ``x`` ``(n, *event)``: a NumPy array (n,).

        Example
        -------
        >>> import numpy as np, ppl_bdl as bdl
        >>> from ppl_bdl import nn
        >>> net = nn.Sequential("e", [nn.Dense("w", 1, 1), lambda h: h.sum(-1)])
        >>> model = bdl.ebm.EnergyModel(net, {"e.w.weight": [[2.0]], "e.w.bias": [1.0]},
        ...                             event_shape=(1,), backend="numpyro")
        >>> model.energy([[0.0], [1.0]]).tolist()
        [1.0, 3.0]
        """
        x = self._points(x, "x")
        backend, out = self.backend, []
        with backend.scope(), backend.activate():
            params = self.device_params()
            for start in range(0, len(x), ENERGY_CHUNK):
                rows = backend.asarray(x[start : start + ENERGY_CHUNK])
                out.append(np.asarray(backend.to_numpy(self._energy(params, rows)), dtype=float))
        return np.concatenate(out)

    def sample(
        self,
        n: int,
        steps: int | None = None,
        start: Any = None,
        seed: int = 0,
        progress: bool = False,
        chunk_size: int | None = None,
    ) -> np.ndarray:
        """n draws of x from the EBM: n chains of the sampler, ``steps`` steps each.

        Parameters
        ----------
        n : int
            The number of chains (draws).
        steps : int, optional
            Steps per chain (default: ``chain_steps``, the length of the chains in training).
            The step sizes follow the model's schedule over these steps.
        start : "buffer", "noise" or array, optional
            Where the chains start: rows of the replay buffer (the default after a persistent
            fit: the chains go on from where training left them), uniform noise in ``box``
            (the default otherwise: short-run samples, as in training), or given points
            ``(n, *event)``.
        seed : int
            Same seed, same draws (on the same backend).

        Returns
        -------
        NumPy array ``(n, *event)``
        """
        n = _count("n", n)
        steps = self.chain.chain_steps if steps is None else _count("steps", steps)
        x0 = self._start(n, start, seed)
        backend = self.backend
        with backend.scope(), backend.activate():
            params = self.device_params()
            if (n, steps) not in self._samplers:
                self._samplers[n, steps] = _sampling_transition(self, x0.shape, steps, params)
            transition = self._samplers[n, steps]
        run = run_transition(
            backend,
            transition,
            x0.reshape(-1),
            num_steps=steps,
            seed=seed,
            data=params,
            name=f"ebm sample ({self.chain.sampler})",
            progress=progress,
            chunk_size=chunk_size,
            keep_last=True,
        )
        if run.failure is not None or run.draws is None:
            where = run.failure.step if run.failure is not None else steps
            raise InferenceError(
                f"sampling from the EBM stopped at step {where} of {steps}: a chain's energy or "
                f"its gradient is not finite (sampler {self.chain.sampler!r}, step_size "
                f"{self.chain.step_size}). Try a smaller step_size."
            )
        return np.asarray(run.draws[0, -1]).reshape((n, *self.event_shape))

    def device_params(self) -> dict:
        """The parameters as arrays of the backend (run under ``backend.scope()``)."""
        return {k: self.backend.asarray(v) for k, v in self.params.items()}

    # -- helpers ---------------------------------------------------------------------------------
    def _points(self, x, name: str) -> np.ndarray:
        dtype = np.float32 if self.backend.precision == "float32" else np.float64
        array = np.asarray(x, dtype=dtype)
        if array.shape[1:] != self.event_shape or array.ndim < 1:
            raise ConfigError(
                f"{name} has shape {array.shape}; expected (n, *{self.event_shape}): points of the "
                "shape the model was fitted on."
            )
        return array

    def _start(self, n: int, start, seed: int) -> np.ndarray:
        rng = np.random.default_rng([int(seed), 11])
        if start is None:
            start = "buffer" if self.buffer is not None else "noise"
        if isinstance(start, str) and start == "buffer":
            if self.buffer is None:
                raise ConfigError(
                    "start='buffer' needs the replay buffer of a persistent fit "
                    "(ebm.fit(..., persistent=True)); this model has none. Use start='noise'."
                )
            rows = rng.choice(len(self.buffer), size=n, replace=n > len(self.buffer))
            return np.asarray(self.buffer[rows], dtype=self._points(self.buffer[:1], "b").dtype)
        if isinstance(start, str) and start == "noise":
            low, high = self.box
            x = low + (high - low) * rng.uniform(size=(n, flat_size(self.event_shape)))
            return self._points(x.reshape((n, *self.event_shape)), "x")
        if isinstance(start, str):
            raise ConfigError(f"start must be 'buffer', 'noise' or an array, got {start!r}.")
        x0 = self._points(start, "start")
        if len(x0) != n:
            raise ConfigError(f"start holds {len(x0)} points; expected n={n}.")
        return x0


def _sampling_transition(model: EnergyModel, shape, steps: int, params) -> Transition:
    """One kernel step on the n chains per loop step, θ passed as the loop's data."""
    backend, chain = model.backend, model.chain
    value_and_grad = input_value_and_grad(backend, model._energy, tuple(shape))
    example = backend.asarray(np.zeros(int(np.prod(shape))))
    value_and_grad = backend.trace(value_and_grad, (example, params))
    kernel = chain.kernel(value_and_grad, steps)
    sizes = backend.asarray(chain.step_sizes(backend, steps))
    bounds = tiled_bounds(backend, model.box, shape[0], chain.clip)

    def init(key, position, data):
        return {"kernel": kernel.init(position), "t": backend.asarray(0, dtype="int")}

    def step(key, state, batch, rate):
        new, info = kernel.step(key, state["kernel"], batch.data, sizes[state["t"]])
        return {"kernel": clipped(new, bounds), "t": state["t"] + 1}, info

    return Transition(init, step, lambda state: state["kernel"]["position"])


def _event_shape(shape) -> tuple[int, ...]:
    try:
        out = tuple(int(s) for s in shape)
    except TypeError:
        raise ConfigError(f"event_shape must be a tuple of ints, got {shape!r}.") from None
    if not out or min(out) < 1:
        raise ConfigError(f"event_shape must be a non-empty tuple of ints >= 1, got {shape!r}.")
    return out


def _check_params(energy: Energy, params: dict) -> dict[str, np.ndarray]:
    if not isinstance(params, dict):
        raise ModelError(f"params must be a dict of site name -> array, got {type(params)}.")
    missing = sorted(set(energy.shapes) - set(params))
    extra = sorted(set(params) - set(energy.shapes))
    if missing or extra:
        raise ModelError(
            f"params do not match the energy network's sites {list(energy.shapes)}: missing "
            f"{missing}, unknown {extra}."
        )
    out = {}
    for name, shape in energy.shapes.items():
        value = np.asarray(params[name], dtype=float)
        if value.shape != tuple(shape):
            raise ModelError(
                f"params[{name!r}] has shape {value.shape}; the network's site has {tuple(shape)}."
            )
        out[name] = value
    return out


def _count(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ConfigError(f"{name} must be an int >= 1, got {value!r}.")
    return int(value)
