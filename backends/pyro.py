"""The Pyro (PyTorch) backend.

Hot loops run a lean torch step: the core's evaluator computes the log density straight from
``torch.distributions`` (no Pyro effect handlers per step), gradients come from
``torch.autograd.grad`` and updates are out-of-place tensor ops. NUTS and HMC are Pyro's own,
driven with the core's potential function.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Any

import numpy as np
import pyro
import pyro.distributions as pd
import torch
from torch.distributions import biject_to as _biject_to
from torch.distributions import constraints as tc
from torch.distributions.transforms import identity_transform

from ..errors import DataError
from .base import Backend, LoopResult, NativeSettings

Tensor = torch.Tensor


def _t(x):
    return x if isinstance(x, Tensor) else torch.as_tensor(x, dtype=torch.get_default_dtype())


def _unary(fn):
    return lambda x: fn(_t(x))


def _reduce(fn):
    def reduce(x, axis=None, keepdims=False):
        x = _t(x)
        if axis is None:
            out = fn(x)
            return out.reshape((1,) * x.ndim) if keepdims else out
        return fn(x, dim=axis, keepdim=keepdims)

    return reduce


def _minmax(fn):
    def reduce(x, axis=None, keepdims=False):
        x = _t(x)
        if axis is None:
            return fn(x)
        return fn(x, dim=axis, keepdim=keepdims).values

    return reduce


def _make_math() -> SimpleNamespace:
    m = SimpleNamespace()
    for name in ("abs", "exp", "log", "log1p", "expm1", "sqrt", "square", "tanh", "sigmoid", "relu",
                 "erf", "lgamma", "digamma", "isfinite", "sin", "cos", "sign", "floor"):  # fmt: skip
        setattr(m, name, _unary(getattr(torch, name)))
    m.softplus = _unary(torch.nn.functional.softplus)
    m.gelu = _unary(torch.nn.functional.gelu)
    m.elu = _unary(torch.nn.functional.elu)
    m.silu = _unary(torch.nn.functional.silu)
    m.softmax = lambda x, axis=-1: torch.softmax(_t(x), dim=axis)
    m.log_softmax = lambda x, axis=-1: torch.log_softmax(_t(x), dim=axis)
    m.logsumexp = lambda x, axis=None, keepdims=False: (
        torch.logsumexp(_t(x).reshape(-1), 0)
        if axis is None
        else torch.logsumexp(_t(x), axis, keepdims)
    )
    m.logaddexp = lambda a, b: torch.logaddexp(_t(a), _t(b))
    m.sum = _reduce(torch.sum)
    m.mean = _reduce(torch.mean)
    m.prod = _reduce(torch.prod)
    m.var = lambda x, axis=None, keepdims=False, ddof=0: torch.var(
        _t(x), dim=axis, keepdim=keepdims, correction=ddof
    )
    m.std = lambda x, axis=None, keepdims=False, ddof=0: torch.std(
        _t(x), dim=axis, keepdim=keepdims, correction=ddof
    )
    m.max = _minmax(torch.max)
    m.min = _minmax(torch.min)
    m.maximum = lambda a, b: torch.maximum(_t(a), _t(b))
    m.minimum = lambda a, b: torch.minimum(_t(a), _t(b))
    m.cumsum = lambda x, axis=0: torch.cumsum(_t(x), dim=axis)
    m.matmul = torch.matmul
    m.dot = lambda a, b: torch.matmul(a, b)
    m.outer = torch.outer
    m.einsum = torch.einsum
    m.transpose = lambda x, axes=None: x.T if axes is None else x.permute(*axes)
    m.reshape = lambda x, shape: _t(x).reshape(shape)
    m.expand_dims = lambda x, axis: _t(x).unsqueeze(axis)
    m.squeeze = lambda x, axis=None: _t(x).squeeze() if axis is None else _t(x).squeeze(axis)
    m.concatenate = lambda xs, axis=0: torch.cat([_t(x) for x in xs], dim=axis)
    m.stack = lambda xs, axis=0: torch.stack([_t(x) for x in xs], dim=axis)
    m.where = lambda c, a, b: torch.where(_t(c).bool(), _t(a), _t(b))
    m.clip = lambda x, lo=None, hi=None: torch.clamp(_t(x), lo, hi)
    m.zeros = lambda shape: torch.zeros(shape)
    m.ones = lambda shape: torch.ones(shape)
    m.full = lambda shape, value: torch.full(
        tuple(np.atleast_1d(shape)) if not isinstance(shape, tuple) else shape, value
    )
    m.zeros_like = torch.zeros_like
    m.ones_like = torch.ones_like
    m.arange = torch.arange
    m.eye = torch.eye
    m.diag = lambda x: torch.diag(_t(x))
    m.tril = lambda x, k=0: torch.tril(_t(x), k)
    m.cholesky = torch.linalg.cholesky
    m.norm = lambda x, axis=None: torch.linalg.vector_norm(_t(x), dim=axis)
    m.triangular_solve = lambda a, b, lower=True: torch.linalg.solve_triangular(
        a, b, upper=not lower
    )
    m.asarray = lambda x: _t(x)
    return m


def _folded_student_t(df, scale=1.0):
    return pd.FoldedDistribution(
        pd.StudentT(df, 0.0, scale, validate_args=False), validate_args=False
    )


def _improper(support="real"):
    return pd.ImproperUniform(
        tc.real if support == "real" else tc.positive, torch.Size(), torch.Size()
    )


def _lkj(dimension, concentration=1.0):
    return pd.LKJCholesky(dimension, _t(concentration), validate_args=False)


_FAMILIES = {
    "Normal": pd.Normal,
    "HalfNormal": pd.HalfNormal,
    "Cauchy": pd.Cauchy,
    "HalfCauchy": pd.HalfCauchy,
    "StudentT": pd.StudentT,
    "HalfStudentT": _folded_student_t,
    "Laplace": pd.Laplace,
    "LogNormal": pd.LogNormal,
    "Gamma": pd.Gamma,
    "InverseGamma": pd.InverseGamma,
    "Beta": pd.Beta,
    "Exponential": pd.Exponential,
    "Uniform": pd.Uniform,
    "ImproperUniform": _improper,
    "Bernoulli": pd.Bernoulli,
    "Binomial": pd.Binomial,
    "Categorical": pd.Categorical,
    "Poisson": pd.Poisson,
    "Dirichlet": pd.Dirichlet,
    "MultivariateNormal": pd.MultivariateNormal,
    "LKJCholesky": _lkj,
}
_NO_VALIDATE_ARG = {"HalfStudentT", "ImproperUniform", "LKJCholesky"}
_TENSOR_PARAMS = {"Dirichlet", "MultivariateNormal", "Categorical"}
_IDENTITY_SUPPORTS = (tc.real, tc.real_vector)


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
        self.math = _make_math()
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
        params = spec.params
        if spec.name in _TENSOR_PARAMS or any(
            not isinstance(v, Tensor | float | int | str) for v in params.values()
        ):
            params = {
                k: v
                if isinstance(v, Tensor | str)
                or (isinstance(v, int) and k in ("dimension", "total_count"))
                else self.asarray(v)
                for k, v in params.items()
            }
        if spec.name in _NO_VALIDATE_ARG:
            return _FAMILIES[spec.name](**params)
        return _FAMILIES[spec.name](**params, validate_args=False)

    def expand(self, native, batch_shape, event_ndims: int):
        batch_shape = torch.Size(batch_shape)
        if native.batch_shape != batch_shape:
            native = native.expand(batch_shape)
        return native.to_event(event_ndims) if event_ndims else native

    def biject_to(self, support):
        if support in _IDENTITY_SUPPORTS:
            return None
        transform = _biject_to(support)
        return None if transform is identity_transform else transform

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
