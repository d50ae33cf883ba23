"""The Pyro (PyTorch) backend.

Hot loops run a lean torch step: the core's evaluator computes the log density straight from
``torch.distributions`` (no Pyro effect handlers per step), gradients come from
``torch.autograd.grad`` and updates are out-of-place tensor ops. NUTS and HMC are Pyro's own,
driven with the core's potential function.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import pyro
import torch
from torch.distributions import constraints as tc

from ..errors import DataError
from . import _pyro_dists as _dists
from ._torch_math import _t, make_math
from .base import Backend, LoopResult, NativeSettings

Tensor = torch.Tensor


class _Random:
    """JAX-style keys on torch: a key is a seeded ``torch.Generator``; split returns it."""

    def __init__(self, backend: PyroBackend):
        self._be = backend

    def key(self, seed: int):
        return torch.Generator().manual_seed(int(seed))

    def split(self, key, num: int = 2):
        return (key,) * num

    def normal(self, key, shape):
        return torch.randn(tuple(shape), generator=key, dtype=self._be.float_dtype)

    def uniform(self, key, shape, low=0.0, high=1.0):
        u = torch.rand(tuple(shape), generator=key, dtype=self._be.float_dtype)
        return u * (high - low) + low

    def draw(self, key, native):
        # torch.distributions draw from the global RNG: seed it from the key, then restore it.
        seed = int(torch.randint(0, 2**62, (1,), generator=key))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return native.sample()

    def keys(self, key, num: int):
        """A batch of ``num`` keys, indexable along the first axis (for the vmap loop)."""
        return _KeyBatch(key, num)

    def permutation(self, key, n: int):
        return torch.randperm(n, generator=key)


class _Native:
    """The native primitives a lowered model calls."""

    sample = staticmethod(lambda name, fn, obs: pyro.sample(name, fn, obs=obs))
    deterministic = staticmethod(pyro.deterministic)
    factor = staticmethod(pyro.factor)

    @staticmethod
    def param(name, init, constraint):
        return pyro.param(name, init, constraint=getattr(tc, constraint))

    @staticmethod
    @contextlib.contextmanager
    def plate(name, size, dim):
        with pyro.plate(name, size, dim=dim) as idx:
            yield idx


class PyroBackend(Backend):
    """Run models on Pyro / PyTorch.

    Example
    -------
    >>> import ppl_bdl as bdl
    >>> be = bdl.backends.get("pyro")
    >>> be.asarray([1.0, 2.0]).dtype
    torch.float32
    """

    name = "pyro"
    extra = "pyro"
    array_family = "torch"

    def __init__(self, precision: str = "float32"):
        super().__init__(precision)
        self.math = make_math()
        self.random = _Random(self)
        self.native = _Native()

    # -- arrays -------------------------------------------------------------------------------
    @property
    def float_dtype(self):
        return torch.float64 if self.precision == "float64" else torch.float32

    @contextlib.contextmanager
    def precision_scope(self):
        previous = torch.get_default_dtype()
        torch.set_default_dtype(self.float_dtype)
        try:
            yield
        finally:
            torch.set_default_dtype(previous)

    def asarray(self, value: Any, dtype: str | None = None):
        if isinstance(value, Tensor):
            if dtype == "int" or (dtype is None and not value.is_floating_point()):
                return value
            return value.to(self.float_dtype)
        array = np.asarray(value)
        if array.dtype == object:
            raise DataError(
                "cannot convert an object array (strings or mixed types) to a torch tensor; encode "
                "categories as integers first."
            )
        if dtype == "int" or (dtype is None and np.issubdtype(array.dtype, np.integer)):
            return torch.as_tensor(array, dtype=torch.int64)
        if dtype is None and array.dtype == bool:
            return torch.as_tensor(array)
        if not array.flags.writeable:
            array = array.copy()
        return torch.as_tensor(
            np.ascontiguousarray(array).reshape(array.shape), dtype=self.float_dtype
        )

    def to_numpy(self, value):
        if isinstance(value, Tensor):
            return value.detach().cpu().numpy()
        return np.asarray(value)

    def arange(self, n: int):
        return torch.arange(n)

    def is_array(self, value) -> bool:
        return isinstance(value, Tensor)

    # -- distributions -------------------------------------------------------------------------
    def distribution(self, spec):
        return _dists.native_distribution(spec, self.asarray)

    def expand(self, native, batch_shape, event_ndims: int):
        return _dists.expand(native, batch_shape, event_ndims)

    def biject_to(self, support):
        return _dists.biject_to(support)

    def observed_value(self, spec, value):
        """Valid observed values of any numeric dtype, in the dtype ``spec``'s family needs."""
        return _dists.observed_value(spec, value, self.float_dtype)

    # -- autodiff, vectorisation, loops ----------------------------------------------------------
    def value_and_grad(self, fn, has_aux: bool = False):
        def wrapped(x, *args):
            with torch.enable_grad():
                x = x.detach().requires_grad_(True)
                result = fn(x, *args)
                value, aux = result if has_aux else (result, None)
                (grad,) = torch.autograd.grad(value, x)
            value = value.detach()
            return ((value, aux), grad) if has_aux else (value, grad)

        return wrapped

    def grad(self, fn):
        vg = self.value_and_grad(fn)
        return lambda x, *args: vg(x, *args)[1]

    def vmap(self, fn):
        def looped(*args):
            n = _leading_size(args)
            outs = [fn(*(_index_tree(a, i) for a in args)) for i in range(n)]
            return _stack_tree(outs)

        return looped

    def jit(self, fn):
        return fn

    def tree_map(self, fn, *trees):
        return _tree_map(fn, *trees)

    def eval_shape(self, fn, *args):
        """``fn(*args)``, evaluated (torch has no shape-only evaluation; used to record draws)."""
        return fn(*args)

    def compile_loop(
        self, step, check=None, prologue=None, freeze=True, emit_every=1, stage_inputs=False,
        partial=False,
    ):  # fmt: skip
        """A Python loop of ``step(carry, key, x) -> (carry, out)``, stopping at the first failed
        ``check(out)`` with the carry from before that step (``freeze`` changes nothing here:
        the loop stops there). ``prologue(carry, None, xs) -> xs`` runs once per chunk before it
        (torch steps share one generator, so there are no per-step keys). ``emit_every=L``
        keeps the outputs of steps L-1, 2L-1, ... only. ``stage_inputs`` changes nothing here.
        With ``partial``, ``runner(..., active=k)`` runs the first k steps only."""

        def runner(carry, key, xs, num_steps: int, active: int | None = None) -> LoopResult:
            if active is not None and not partial:
                raise ValueError("active= needs a loop compiled with partial=True")
            if prologue is not None:
                xs = prologue(carry, None, xs)
            outs = []
            stopped = None
            with torch.no_grad():
                for i in range(num_steps if active is None else active):
                    x = None if xs is None else _index_tree(xs, i)
                    new, out = step(carry, key, x)
                    if (i + 1) % emit_every == 0:
                        outs.append(out)
                    if check is not None and not bool(check(out)):
                        stopped = i
                        break
                    carry = new
            return LoopResult(carry, _stack_tree(outs) if outs else None, stopped)

        return runner

    # -- native NUTS / HMC ---------------------------------------------------------------------
    def run_native_mcmc(self, potential, init: np.ndarray, settings: NativeSettings, seed: int):
        """Run Pyro's NUTS/HMC on ``potential``, one chain after another (each with its own seed).

        Pyro keeps no per-draw statistics, so they are read off the kernel by a hook: gradient
        evaluations per draw (``n_steps``, ``tree_depth``), divergences, step size, acceptance.
        """
        from pyro.infer.mcmc import HMC, MCMC, NUTS

        chains, stats = [], []
        with self.precision_scope():
            for chain in range(settings.num_chains):
                counter = {"calls": 0}

                def potential_fn(params, counter=counter):
                    counter["calls"] += 1
                    return potential(params["theta"])

                common = dict(
                    potential_fn=potential_fn,
                    target_accept_prob=settings.target_accept,
                    full_mass=settings.dense_mass,
                )
                if settings.step_size is not None:
                    common["step_size"] = settings.step_size
                if settings.method == "nuts":
                    kernel = NUTS(max_tree_depth=settings.max_tree_depth, **common)
                else:
                    kernel = HMC(num_steps=settings.num_steps or 10, **common)
                recorder = _StatsRecorder(counter, settings.num_warmup)
                total = settings.num_samples * settings.thinning
                mcmc = MCMC(
                    kernel,
                    num_samples=total,
                    warmup_steps=settings.num_warmup,
                    initial_params={"theta": torch.as_tensor(init[chain], dtype=self.float_dtype)},
                    disable_progbar=not settings.progress,
                    hook_fn=recorder,
                )
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(seed * 1000 + chain)
                    mcmc.run()
                draws = mcmc.get_samples()["theta"].detach().numpy()[:: settings.thinning]
                chains.append(draws)
                stats.append(recorder.result(kernel, settings.thinning, settings.method))
        positions = np.stack(chains)
        merged = {k: np.stack([s[k] for s in stats]) for k in stats[0]}
        return positions, merged

    def vi_support(self):
        """The optimizer step and reparameterised draws of the core's VI (torch.optim)."""
        from ._vi_pyro import PyroVISupport

        return PyroVISupport(self)


class _StatsRecorder:
    """Pyro MCMC hook: per-draw sample stats, read off the kernel after each iteration."""

    def __init__(self, counter: dict, num_warmup: int):
        self.counter = counter
        self.num_warmup = num_warmup
        self.calls_before = 0
        self.prev_mean_accept = 0.0
        self.rows: list[tuple] = []

    def __call__(self, kernel, samples, stage, i):
        calls = self.counter["calls"] - self.calls_before
        self.calls_before = self.counter["calls"]
        mean_accept = float(kernel._mean_accept_prob)
        if stage == "Sample":
            n = i + 1
            accept = n * mean_accept - (n - 1) * self.prev_mean_accept
            self.prev_mean_accept = mean_accept
            lp = -float(kernel._potential_energy_last)
            self.rows.append((calls, float(kernel.step_size), min(max(accept, 0.0), 1.0), lp))
        else:
            self.prev_mean_accept = 0.0

    def result(self, kernel, thinning: int, method: str) -> dict:
        rows = np.asarray(self.rows, dtype=float)
        n_steps = rows[:, 0].astype(np.int64)
        diverging = np.zeros(len(rows), bool)
        diverging[[d for d in kernel._divergences if d < len(rows)]] = True
        out = {
            "diverging": diverging,
            "n_steps": n_steps,
            "tree_depth": np.floor(np.log2(np.maximum(n_steps, 1))).astype(np.int64) + 1,
            "step_size": rows[:, 1],
            "acceptance_rate": rows[:, 2],
            "lp": rows[:, 3],
        }
        if method == "hmc":
            out.pop("tree_depth")
        return {k: v[::thinning] for k, v in out.items()}


class _KeyBatch:
    """``num`` keys for the vmap loop; on torch every one is the same advancing generator."""

    def __init__(self, key, num: int):
        self.key, self.num = key, num

    def __len__(self) -> int:
        return self.num

    def __getitem__(self, i):
        return self.key


def _leading_size(tree) -> int:
    if isinstance(tree, dict):
        return _leading_size(next(iter(tree.values())))
    if isinstance(tree, tuple | list):
        return _leading_size(tree[0])
    return len(tree)


def _index_tree(tree, i):
    if isinstance(tree, dict):
        return {k: _index_tree(v, i) for k, v in tree.items()}
    if isinstance(tree, tuple | list):
        return type(tree)(_index_tree(v, i) for v in tree)
    return tree[i]


def _stack_tree(items):
    first = items[0]
    if isinstance(first, dict):
        return {k: _stack_tree([it[k] for it in items]) for k in first}
    if isinstance(first, tuple | list):
        return type(first)(_stack_tree([it[j] for it in items]) for j in range(len(first)))
    if first is None:
        return None
    return torch.stack([_t(x) for x in items])


def _tree_map(fn, *trees):
    first = trees[0]
    if isinstance(first, dict):
        return {k: _tree_map(fn, *(t[k] for t in trees)) for k in first}
    if isinstance(first, tuple | list):
        return type(first)(_tree_map(fn, *(t[j] for t in trees)) for j in range(len(first)))
    if first is None:
        return None
    return fn(*trees)
