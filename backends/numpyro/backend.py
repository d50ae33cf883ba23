"""The NumPyro (JAX) backend.

Hot loops are one ``jax.jit`` of one ``lax.scan`` per chunk of steps (:mod:`._jax_loop`), chains
vectorised with ``jax.vmap``; NUTS is NumPyro's own, driven with the core's potential
(:mod:`._numpyro_mcmc`). Arrays live on the fit's device: data is put there once
(:meth:`NumPyroBackend.asarray`) and :meth:`NumPyroBackend.scope` makes it JAX's default device.

Over several devices (``device=["cuda:0", "cuda:1"]``, ``"cpu:*"``; a list of one device is
that device) the compiled loop's inputs
are placed on a one-axis ``jax.sharding.Mesh`` (:meth:`NumPyroBackend.place`): the chain axis
split over the devices, or with ``shard="data"`` each step's minibatch indices, everything else
replicated (:mod:`._jax_shard`).

Two speed-ups for the CPU sit behind one setting, ``cpu_tricks`` (on unless turned off; the
environment variable ``PPL_BDL_CPU_TRICKS=0`` turns it off for the backends made after it is
set): the written-out Threefry of :mod:`ppl_bdl.backends.numpyro.random` (a step's key and its
Gaussian draws, bit for bit ``jax.random``'s) and the CPU loop's segments
(:mod:`ppl_bdl.backends.numpyro.loop`). Off, the backend calls ``jax.random.fold_in`` and
``jax.random.normal`` and runs a chunk as a plain ``lax.scan``: the draws are the same, the
cost is what docs/benchmarks.md measures.
"""

from __future__ import annotations

import contextlib
import os
import traceback
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
from numpyro.distributions import constraints as ndc

from ppl_bdl.backends.base import (
    SHARD_MODES,
    BackendBase,
    NativeSettings,
    device_names,
    parse_device,
)
from ppl_bdl.backends.numpyro import dists as _dists
from ppl_bdl.backends.numpyro.loop import compile_loop
from ppl_bdl.backends.numpyro.math import make_math
from ppl_bdl.backends.numpyro.optimizer import build_optimizer
from ppl_bdl.backends.numpyro.random import fold_in, normal
from ppl_bdl.backends.numpyro.shard import Placement
from ppl_bdl.errors import BackendError, DataError

#: The environment variable a backend made without ``cpu_tricks=`` reads (see the module
#: docstring): "0", "false", "off" or "no" turn the CPU tricks off; "1", "true", "on", "yes" or
#: unset leave them on.
CPU_TRICKS_ENV = "PPL_BDL_CPU_TRICKS"
_SWITCH = {"1": True, "true": True, "on": True, "yes": True}
_SWITCH.update({"0": False, "false": False, "off": False, "no": False})

#: Device kinds a user may name, as JAX's platforms.
_PLATFORMS = {"cpu": "cpu", "cuda": "gpu", "gpu": "gpu", "rocm": "gpu", "tpu": "tpu"}


def cpu_tricks_from_env() -> bool:
    """Whether :data:`CPU_TRICKS_ENV` leaves the CPU tricks on (unset or empty: on).

    >>> cpu_tricks_from_env() in (True, False)
    True
    """
    value = os.environ.get(CPU_TRICKS_ENV, "").strip().lower()
    if not value:
        return True
    if value not in _SWITCH:
        raise BackendError(
            f"{CPU_TRICKS_ENV}={os.environ[CPU_TRICKS_ENV]!r} is not a switch; expected 0 or 1 "
            f"(also false/true, off/on, no/yes). Set it to 0 to turn the NumPyro backend's CPU "
            "tricks off, or unset it."
        )
    return _SWITCH[value]


def _jax_normal(key, shape, dtype):
    return jax.random.normal(key, tuple(shape), dtype)


class _Random:
    def __init__(self, backend: NumPyroBackend):
        self._be = backend
        # The written-out Threefry, or JAX's own functions (the same bits either way).
        tricks = getattr(backend, "cpu_tricks", True)  # a backend built on these pieces: on
        self._fold_in = fold_in if tricks else jax.random.fold_in
        self._normal = normal if tricks else _jax_normal

    def key(self, seed: int):
        with self._be.scope():
            return jax.random.PRNGKey(seed)

    def split(self, key, num: int = 2):
        return tuple(jax.random.split(key, num))

    def keys(self, key, num: int):
        """A batch of ``num`` keys, indexable along the first axis (for vmap)."""
        return jax.random.split(key, num)

    def fold_in(self, key, step):
        return self._fold_in(key, step)

    def normal(self, key, shape):
        return self._normal(key, shape, self._be.float_dtype)

    def uniform(self, key, shape, low=0.0, high=1.0):
        return jax.random.uniform(key, tuple(shape), self._be.float_dtype, low, high)

    def draw(self, key, native, reparameterized: bool = False):
        if reparameterized and native.has_rsample:
            return native.rsample(key)
        return native.sample(key)


class _Native:
    """The native primitives a lowered model calls."""

    compiled_scan = True
    deterministic = staticmethod(numpyro.deterministic)
    factor = staticmethod(numpyro.factor)

    @staticmethod
    def param(name, init, constraint):
        return numpyro.param(name, init, constraint=getattr(ndc, constraint))

    @staticmethod
    @contextlib.contextmanager
    def plate(name, size, dim):
        with numpyro.plate(name, size, dim=dim) as idx:
            yield idx

    @staticmethod
    def sample(name, fn, obs, enumerate=False):
        infer = {"enumerate": "parallel"} if enumerate else None
        return numpyro.sample(name, fn, obs=obs, infer=infer)

    @staticmethod
    def scan(fn, init, xs, length):
        from ppl_bdl.backends.numpyro.enum import scan

        return scan(fn, init, xs, length)

    @staticmethod
    def markov(steps):
        from ppl_bdl.backends.numpyro.enum import markov

        return markov(steps)


class NumPyroBackend(BackendBase):
    """Run models on NumPyro / JAX.

    Parameters
    ----------
    cpu_tricks
        The CPU speed-ups on (the written-out Threefry, the CPU loop's segments) or off
        (``jax.random`` and a plain ``lax.scan``; the same draws). None: the environment
        variable ``PPL_BDL_CPU_TRICKS`` decides, read once here (unset: on).

    Example
    -------
    >>> import ppl_bdl as bdl
    >>> backend = bdl.backends.get("numpyro")
    >>> backend.asarray([1.0, 2.0]).dtype
    dtype('float32')
    >>> from ppl_bdl.backends.numpyro.backend import NumPyroBackend
    >>> NumPyroBackend(cpu_tricks=False).cpu_tricks
    False
    """

    name = "numpyro"
    extra = "numpyro"
    vectorized_chains = True
    fuses_elementwise = True

    def __init__(
        self,
        precision: str = "float32",
        device=None,
        shard: str = "chains",
        cpu_tricks: bool | None = None,
    ):
        if shard not in SHARD_MODES:
            raise BackendError(f"shard must be one of {SHARD_MODES}, got {shard!r}.")
        devices, spread = _resolve_all(device)
        self._jax_device = devices[0]
        super().__init__(precision, ",".join(_device_name(d) for d in devices))
        self.device_count, self.shard_mode = len(devices), shard
        #: Where the loop's inputs go over several devices (None: one device, as given).
        self._placement = Placement(devices, shard) if spread else None
        self.cpu_tricks = cpu_tricks_from_env() if cpu_tricks is None else bool(cpu_tricks)
        self.math = make_math()
        self.random = _Random(self)
        self.native = _Native()

    # -- arrays -------------------------------------------------------------------------------
    @property
    def float_dtype(self):
        return jnp.float64 if self.precision == "float64" else jnp.float32

    @property
    def int_dtype(self):
        return jnp.int64 if self.precision == "float64" else jnp.int32

    @contextlib.contextmanager
    def scope(self):
        with contextlib.ExitStack() as stack:
            if self.precision == "float64":
                stack.enter_context(jax.enable_x64(True))
            stack.enter_context(jax.default_device(self._jax_device))
            yield

    def asarray(self, value: Any, dtype: str | None = None):
        if (
            isinstance(value, jax.Array)
            and dtype is None
            and value.dtype
            in (
                self.float_dtype,
                self.int_dtype,
                jnp.bool_,
            )
        ):
            return jax.device_put(value, self._jax_device)
        array = np.asarray(value)
        if array.dtype == object:
            raise DataError(
                "cannot convert an object array (strings or mixed types) to a JAX array; encode "
                "categories as integers first."
            )
        if dtype == "int" or (dtype is None and np.issubdtype(array.dtype, np.integer)):
            target = self.int_dtype
        elif dtype is None and array.dtype == bool:
            target = jnp.bool_
        else:
            target = self.float_dtype
        with self.scope():
            return jax.device_put(np.asarray(array, dtype=target), self._jax_device)

    def to_numpy(self, value):
        return np.asarray(jax.device_get(value))

    def is_array(self, value) -> bool:
        return isinstance(value, jax.Array)

    def arange(self, n: int):
        return jnp.arange(n)

    def tree_map(self, fn, *trees):
        return jax.tree_util.tree_map(fn, *trees)

    checks_index_bounds = False

    def bounds_checked(self, fn):
        """``fn`` under ``checkify``'s index checks (JAX clamps out-of-range gathers), compiled:
        one compile of the whole check costs far less than checking it op by op."""
        from jax.experimental import checkify

        checked = jax.jit(checkify.checkify(fn, errors=checkify.index_checks))

        def run(*args):
            with self.scope():
                error, out = checked(*args)
            found = error.get_exception()
            if found is not None:
                raise _index_error(found)
            return out

        return run

    # -- distributions -------------------------------------------------------------------------
    def distribution(self, spec):
        return _dists.native_distribution(spec)

    def expand(self, native, batch_shape, event_ndims: int):
        return _dists.expand(native, batch_shape, event_ndims)

    def biject_to(self, support):
        return _dists.biject_to(support)

    def transform(self, spec):
        return _dists.native_transform(spec)

    def model_value(self, value, strict: bool):
        """``value`` itself: JAX arrays mix with NumPy values, and ``jax.jit`` refuses to turn
        a traced value into a Python value (the core reports that error by site)."""
        return value

    def observed_value(self, spec, value):
        """Valid observed values of any numeric dtype, in the dtype ``spec``'s family needs."""
        return _dists.observed_value(
            spec, value, jnp.int64 if self.precision == "float64" else jnp.int32
        )

    # -- autodiff, vectorisation, loops ----------------------------------------------------------
    def value_and_grad(self, fn, has_aux: bool = False):
        return jax.value_and_grad(fn, has_aux=has_aux)

    def grad(self, fn):
        return jax.grad(fn)

    def hessian(self, fn):
        return jax.hessian(fn)

    def jvp(self, fn, primals, tangents):
        return jax.jvp(fn, tuple(primals), tuple(tangents))

    def vmap(self, fn, in_axes=0):
        return jax.vmap(fn, in_axes=in_axes)

    def jit(self, fn):
        return jax.jit(fn)

    def fori_loop(self, num, body, init):
        return jax.lax.fori_loop(0, num, body, init)

    def scan(self, fn, init, xs, length):
        return jax.lax.scan(fn, init, xs, length=length)

    def cond(self, pred, true_fn, false_fn, operand):
        return jax.lax.cond(pred, true_fn, false_fn, operand)

    def trace(self, fn, example_args):
        # The loop around it is compiled: nothing to trace here.
        return fn

    def compile_loop(self, step, emit):
        mesh = None
        if self._placement is not None and self.shard_mode == "chains":
            mesh = self._placement.mesh  # each device runs its own chains: shard_map
        on_cpu = self._jax_device.platform == "cpu"
        return compile_loop(step, emit, on_cpu, mesh, cpu_segments=self.cpu_tricks)

    def optimizer(self, config):
        return build_optimizer(config)

    # -- native samplers -------------------------------------------------------------------------
    def native_transition(self, potential, settings: NativeSettings):
        """NumPyro's NUTS on ``potential(flat, data)``, stepped by the core's driver."""
        from ppl_bdl.backends.numpyro.mcmc import native_transition

        return native_transition(self, potential, settings)

    def native_sgmcmc_kernel(self, spec):
        from ppl_bdl.backends.numpyro.mcmc import NumPyroSGMCMC

        return NumPyroSGMCMC(spec)

    # -- enumeration -----------------------------------------------------------------------------
    def enumerated_log_density(self, model, inputs, max_plate_nesting: int):
        """NumPyro's ``enum`` + funsor ``log_density``: the enumerated sites summed out."""
        from ppl_bdl.backends.numpyro.enum import enumerated_log_density

        return enumerated_log_density(model, inputs, max_plate_nesting)

    def infer_discrete(self, model, inputs, max_plate_nesting: int, key):
        """``numpyro.contrib.funsor.infer_discrete``: one draw of the enumerated sites."""
        from ppl_bdl.backends.numpyro.enum import infer_discrete

        return infer_discrete(model, inputs, max_plate_nesting, key)

    # -- modules ---------------------------------------------------------------------------------
    def lift_module(self, module):
        """The parameters and forward pass of an ``equinox.Module`` for :func:`ppl_bdl.dsl.nn.lift`
        (a :class:`~ppl_bdl.dsl.nn.ModuleParts`), or None for a module of another kind."""
        from ppl_bdl.backends.numpyro.lift import lift_module

        return lift_module(module)

    # -- devices ---------------------------------------------------------------------------------
    def set_threads(self, count: int) -> None:
        """XLA sets its CPU threads when it starts: nothing to change at run time."""

    def devices(self) -> list[str]:
        return [_device_name(d) for d in _all_devices()]

    def place(self, tree, chain_axis: int | None = None, batch_axis: int | None = None):
        """``tree``'s arrays on the fit's devices: split along ``chain_axis`` (``shard="chains"``)
        or ``batch_axis`` (``shard="data"``), else replicated; on one device, committed to it
        (a state made by ``jnp.asarray`` is not, and the state a chunk returns is: a loop
        program compiled for one would be compiled again for the other)."""
        if self._placement is None:
            return jax.device_put(tree, self._jax_device)
        return self._placement.place(tree, chain_axis, batch_axis)


def _all_devices():
    found = []
    for platform in ("cpu", "gpu", "tpu"):
        try:
            found += jax.devices(platform)
        except RuntimeError:
            continue
    return found


def _device_name(device) -> str:
    kind = "cuda" if device.platform == "gpu" else device.platform
    return f"{kind}:{device.id}" if kind != "cpu" else f"cpu:{device.id}"


def _resolve_all(device) -> tuple[list, bool]:
    """The JAX devices named by ``device`` and whether the fit spreads over them (a list, a
    star or a comma-joined name of two devices or more). A list of one device (``["cuda:0"]``,
    or ``"cuda:*"`` on a machine with one GPU) is that device, placed as a plain device name
    is: with nothing to split, the sharded program's placement would be host work per chunk
    for nothing (docs/benchmarks.md, the sharding overhead on one device)."""
    if device is None:
        return [jax.devices()[0]], False
    names = device_names(device, "numpyro")
    spread = not isinstance(device, str) or "," in device or device.endswith(":*")
    found = []
    for name in names:
        if name.endswith(":*"):
            found += _resolve_kind(name)
        else:
            found.append(_resolve(name))
    platforms = sorted({d.platform for d in found})
    if len(platforms) > 1:
        raise BackendError(
            f"device={device!r} mixes device kinds ({platforms}); a fit spreads over devices "
            "of one kind (e.g. ['cuda:0', 'cuda:1'] or 'cpu:*')."
        )
    seen = [_device_name(d) for d in found]
    twice = sorted({n for n in seen if seen.count(n) > 1})
    if twice:
        raise BackendError(
            f"device={device!r} names {twice} more than once; JAX places one share of the work "
            f"per device. Name each device once (devices here: "
            f"{[_device_name(d) for d in _all_devices()]}; on the CPU, more virtual devices: "
            "XLA_FLAGS=--xla_force_host_platform_device_count=N before JAX starts)."
        )
    return found, spread and len(found) > 1


def _resolve_kind(name: str) -> list:
    """Every device of the kind in ``name`` ("cuda:*")."""
    kind = name[: -len(":*")].lower()
    first = _resolve(kind)
    return list(jax.devices(first.platform))


def _resolve(device: str | None):
    """The JAX device named ``device`` (None: JAX's default)."""
    if device is None:
        return jax.devices()[0]
    available = [_device_name(d) for d in _all_devices()]
    kind, index = parse_device(device, "numpyro", available)
    platform = _PLATFORMS.get(kind)
    if platform is None:
        raise BackendError(
            f"unknown device kind {kind!r} in device={device!r}; expected 'cpu', 'cuda' or "
            f"'tpu', optionally with an index ('cuda:1'). Devices here: {available}."
        )
    try:
        devices = jax.devices(platform)
    except RuntimeError:
        raise BackendError(
            f"device={device!r}: JAX finds no {kind} device here (devices: {available}). Install "
            "a JAX build for it (e.g. pip install 'jax[cuda12]'), or use device='cpu'."
        ) from None
    if index is not None and index >= len(devices):
        raise BackendError(
            f"device={device!r}: there are {len(devices)} {kind} device(s) here "
            f"({[_device_name(d) for d in devices]})."
        )
    return devices[index or 0]


def _index_error(found: Exception) -> IndexError:
    """checkify's out-of-bounds error as an IndexError, with the frames where the model read
    (``source_frames``, outermost first: the core names the site from them)."""
    err = IndexError(str(found))
    frames = getattr(getattr(found, "traceback_info", None), "frames", [])
    err.source_frames = [
        traceback.FrameSummary(f.file_name, f.line_num, f.function_name) for f in frames[::-1]
    ]
    return err
