"""The Pyro (PyTorch) backend.

Hot loops are a plain Python loop (:mod:`._torch_loop`) around one step whose model gradient is
traced once to a TorchScript graph (:meth:`PyroBackend.trace`): the core's evaluator computes the
log density straight from ``torch.distributions`` (no Pyro effect handlers per step). Chains run
one after another. NUTS is Pyro's own kernel, stepped by the core's driver
(:mod:`._pyro_mcmc`). Arrays live on the fit's device (``device=``): data is moved there once and
:meth:`PyroBackend.scope` makes it torch's default device.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import pyro
import torch
from torch.distributions import constraints as tc
from torch.utils import _pytree as pytree

from ppl_bdl.backends.base import BackendBase, NativeSettings, device_names
from ppl_bdl.backends.pyro import dists as _dists
from ppl_bdl.backends.pyro import values as _values
from ppl_bdl.backends.pyro.data_parallel import DataParallel, data_devices
from ppl_bdl.backends.pyro.devices import (
    available_devices,
    chain_devices,
    cuda_devices,
    device_name,
    one_device,
    resolve,
)
from ppl_bdl.backends.pyro.loop import compile_loop
from ppl_bdl.backends.pyro.math import make_math
from ppl_bdl.backends.pyro.optimizer import build_optimizer
from ppl_bdl.backends.pyro.scan import StepPrograms, traced_scan
from ppl_bdl.backends.pyro.torchscript import trace_or_eager, vmap_or_loop
from ppl_bdl.backends.pyro.trees import index_tree, leading_size, split_mapped, stack_tree, tree_map
from ppl_bdl.errors import BackendError, DataError

Tensor = torch.Tensor


class _Random:
    """JAX-style keys on torch: a key is a seeded ``torch.Generator`` on the fit's device;
    ``split`` returns it, draws advance it."""

    def __init__(self, backend: PyroBackend):
        self._be = backend

    def key(self, seed: int):
        return torch.Generator(device=self._be.torch_device).manual_seed(int(seed))

    def split(self, key, num: int = 2):
        return (key,) * num

    def keys(self, key, num: int):
        """A batch of ``num`` keys, indexable along the first axis (for the vmap loop)."""
        return _KeyBatch(key, num)

    def fold_in(self, key, step):
        """The chain's one generator advances through the steps in order: any chunking gives
        the same draws."""
        return key

    def normal(self, key, shape):
        return torch.randn(
            tuple(shape), generator=key, dtype=self._be.float_dtype, device=key.device
        )

    def uniform(self, key, shape, low=0.0, high=1.0):
        u = torch.rand(tuple(shape), generator=key, dtype=self._be.float_dtype, device=key.device)
        return u * (high - low) + low

    def draw(self, key, native, reparameterized: bool = False):
        # torch.distributions draw from the global RNG: seed it from the key, then restore it.
        seed = int(torch.randint(0, 2**62, (1,), generator=key, device=key.device))
        with torch.random.fork_rng(devices=cuda_devices(key.device)):
            torch.manual_seed(seed)
            if reparameterized and native.has_rsample:
                return native.rsample()
            return native.sample()


class _Native:
    """The native primitives a lowered model calls."""

    #: Pyro has no compiled scan: ``bdl.scan`` lowers to a loop under :meth:`markov`.
    compiled_scan = False
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

    @staticmethod
    def sample(name, fn, obs, enumerate=False):
        infer = {"enumerate": "parallel"} if enumerate else {}
        return pyro.sample(name, fn, obs=obs, infer=infer)

    @staticmethod
    def scan(fn, init, xs, length):
        raise BackendError(
            "Pyro has no compiled scan (compiled_scan is False): bdl.scan lowers to a Python "
            "loop under pyro.markov (Lowering(unroll=True))."
        )

    @staticmethod
    def markov(steps):
        """``pyro.markov`` over ``steps``: each step sees the one before."""
        return pyro.markov(steps)


#: How many fits' scopes are open (nested scopes switch subnormal flushing once).
_FLUSH_DEPTH = [0]


class PyroBackend(BackendBase):
    """Run models on Pyro / PyTorch.

    Example
    -------
    >>> import ppl_bdl as bdl
    >>> backend = bdl.backends.get("pyro")
    >>> backend.asarray([1.0, 2.0]).dtype
    torch.float32
    """

    name = "pyro"
    extra = "pyro"
    vectorized_chains = False
    fuses_elementwise = False

    def __init__(self, precision: str = "float32", device=None, shard: str = "chains"):
        #: This process's part of a data-parallel fit (``shard="data"`` over a device list:
        #: one process per device, :mod:`._torch_dist`), else None.
        self.parallel = None
        #: While a data-parallel trace runs: value_and_grad leaves its outputs to the trace's
        #: caller to all-reduce (once, after the traced graph).
        self._local_gradients = False
        names = [] if device is None else device_names(device, "pyro")
        if shard == "data" and (len(names) > 1 or (names and names[0].endswith(":*"))):
            names = data_devices(names, device)
            self.parallel = DataParallel.join(names, device)
            self.device_count, self.shard_mode = self.parallel.world, "data"
            device = self.parallel.device
        self.torch_device = resolve(one_device(device, self.shard_mode))
        name = device_name(self.torch_device)
        super().__init__(precision, ",".join(names) if self.parallel else name)
        self.math = make_math()
        self.random = _Random(self)
        self.native = _Native()
        #: The traced steps of ``bdl.scan`` loops (:mod:`.scan`), by what each depends on.
        self.step_programs = StepPrograms()

    # -- arrays -------------------------------------------------------------------------------
    @property
    def float_dtype(self):
        return torch.float64 if self.precision == "float64" else torch.float32

    @contextlib.contextmanager
    def scope(self):
        """The fit's dtype and device; on the CPU, subnormal floats flushed to zero, as XLA does
        on the CPU (a step whose gradient holds subnormals, e.g. from a saturated softmax, ran
        2.5x slower at the 784-400-400-10 net). torch's default, off, is restored after."""
        previous = torch.get_default_dtype()
        torch.set_default_dtype(self.float_dtype)
        _FLUSH_DEPTH[0] += 1
        if _FLUSH_DEPTH[0] == 1:
            torch.set_flush_denormal(True)
        # torch's device mode sees every torch call in Python (0.7-0.9 ms per LeNet-5 step):
        # entered only when the fit's device is not torch's default already.
        on_default = torch.get_default_device() == self.torch_device
        try:
            with contextlib.nullcontext() if on_default else self.torch_device:
                yield
        finally:
            _FLUSH_DEPTH[0] -= 1
            if _FLUSH_DEPTH[0] == 0:
                torch.set_flush_denormal(False)
            torch.set_default_dtype(previous)

    def asarray(self, value: Any, dtype: str | None = None):
        if isinstance(value, Tensor):
            if dtype == "int" or (dtype is None and not value.is_floating_point()):
                target = torch.int64 if value.is_floating_point() else value.dtype
                return value.to(device=self.torch_device, dtype=target)
            return value.to(device=self.torch_device, dtype=self.float_dtype)
        array = np.asarray(value)
        if array.dtype == object:
            raise DataError(
                "cannot convert an object array (strings or mixed types) to a torch tensor; encode "
                "categories as integers first."
            )
        if dtype == "int" or (dtype is None and np.issubdtype(array.dtype, np.integer)):
            target = torch.int64
        elif dtype is None and array.dtype == bool:
            target = torch.bool
        else:
            target = self.float_dtype
        if not array.flags.writeable:
            array = array.copy()
        array = np.ascontiguousarray(array).reshape(array.shape)  # (keeps 0-d arrays 0-d)
        return torch.as_tensor(array, dtype=target, device=self.torch_device)

    def to_numpy(self, value):
        if isinstance(value, Tensor):
            return _values.plain(value).detach().cpu().numpy()
        return np.asarray(value)

    def is_array(self, value) -> bool:
        return isinstance(value, Tensor)

    def arange(self, n: int):
        return torch.arange(n, device=self.torch_device)

    def tree_map(self, fn, *trees):
        return tree_map(fn, *trees)

    checks_index_bounds = True

    def bounds_checked(self, fn):
        return fn  # torch's indexing raises IndexError out of bounds

    def model_value(self, value, strict: bool):
        """A :class:`~._torch_values.ModelTensor` alias of a tensor: NumPy values mix with it on
        either side of an operator; ``strict``: a ``StrictTensor``, which refuses to become a
        Python value while the model runs (a traced step would freeze it)."""
        return _values.model_value(value, strict)

    # -- distributions -------------------------------------------------------------------------
    def distribution(self, spec):
        return _dists.native_distribution(spec, self.asarray)

    def expand(self, native, batch_shape, event_ndims: int):
        return _dists.expand(native, batch_shape, event_ndims)

    def biject_to(self, support):
        return _dists.biject_to(support)

    def transform(self, spec):
        return _dists.native_transform(spec, self.asarray)

    def observed_value(self, spec, value):
        """Valid observed values of any numeric dtype, in the dtype ``spec``'s family needs."""
        return _dists.observed_value(spec, _values.plain(value), self.float_dtype)

    # -- autodiff, vectorisation, loops ----------------------------------------------------------
    def value_and_grad(self, fn, has_aux: bool = False):
        """``fn``'s value and gradient; in a data-parallel fit, their mean over the processes
        (each holds its block of the minibatch: :mod:`._torch_dist`)."""

        def wrapped(*args):
            grads, value = torch.func.grad_and_value(fn, has_aux=has_aux)(*args)
            return value, grads

        if self.parallel is None:
            return wrapped

        def reduced(*args):
            out = wrapped(*args)
            return out if self._local_gradients else self.parallel.mean(out)

        return reduced

    def grad(self, fn):
        return torch.func.grad(fn)

    def hessian(self, fn):
        # Reverse over reverse: torch.func.hessian (forward over reverse) fails in matmul's
        # backward under forward-mode AD on a BNN whose noise scale is latent (a float64
        # cotangent meets float32 weights).
        return torch.func.jacrev(torch.func.jacrev(fn))

    def jvp(self, fn, primals, tangents):
        return torch.func.jvp(fn, tuple(primals), tuple(tangents))

    def vmap(self, fn, in_axes=0):
        """``fn`` over the leading axis of the mapped arguments (``in_axes`` 0 or None each): one
        batched call of ``torch.func.vmap(fn)`` where ``fn`` allows it (tensors mapped, no random
        numbers drawn, no Python branch on a value), else a loop over the points. Decided at the
        first call and kept. Batched, a traced step holds ``fn``'s graph once rather than once
        per point: the VI loss over 8 particles of a flow guide on a 1-16-1 BNN ran 2.3x faster
        (benchmarks/flow_step.py)."""
        vectorised: list[bool] = []

        def looped(*args):
            axes, mapped = split_mapped(args, in_axes)
            outs = []
            for i in range(leading_size(*mapped)):
                row = [
                    a if ax is None else index_tree(a, i) for a, ax in zip(args, axes, strict=True)
                ]
                outs.append(fn(*row))
            return stack_tree(outs)

        def mapped(*args):
            axes, leaves = split_mapped(args, in_axes)
            batched = torch.func.vmap(fn, in_dims=axes, randomness="error")
            if not vectorised:
                tensors = all(isinstance(a, torch.Tensor) for a in pytree.tree_leaves(leaves))
                if tensors:
                    try:
                        out = batched(*args)
                    except Exception:  # noqa: BLE001 - fn cannot be batched: loop over the points
                        vectorised.append(False)
                    else:
                        vectorised.append(True)
                        return out
                else:
                    vectorised.append(False)
            return batched(*args) if vectorised[0] else looped(*args)

        return mapped

    def traced_vmap(self, fn, example_args, in_axes=0):  # a traced torch.func.vmap, else a loop
        return vmap_or_loop(self, fn, example_args, in_axes)

    def jit(self, fn):
        return fn

    def fori_loop(self, num, body, init):
        carry = init
        for i in range(num):
            carry = body(i, carry)
        return carry

    def scan(self, fn, init, xs, length):
        """``lax.scan`` on torch: ``fn`` traced once (``make_fx``) and its graph called at each
        step, with the tensors it closes over (the model's latents) as the graph's inputs, so
        their gradients flow; ``fn`` itself once per step where the trace could differ from it
        (Python control flow on values, random draws; :mod:`.scan`)."""
        return traced_scan(self, fn, init, xs, length)

    def cond(self, pred, true_fn, false_fn, operand):
        # The step runs in Python: the branch not taken is never computed.
        return true_fn(operand) if bool(pred) else false_fn(operand)

    def trace(self, fn, example_args):
        """``fn`` traced once at ``example_args`` (``make_fx``, then TorchScript), so a step skips
        the Python walk of the model; checked against ``fn`` there, ``fn`` itself (with a
        warning) where tracing fails or disagrees. (Python control flow on values, which a trace
        would freeze, is refused before, by the validating run's ``StrictTensor`` values.) A
        ``bdl.scan`` in ``fn`` is unrolled into the trace up to
        :data:`~ppl_bdl.backends.pyro.scan.UNROLL_LIMIT` steps; with a longer one ``fn`` itself
        is returned, without a warning (the loop's step is traced on its own). In a
        data-parallel fit the trace is of this process's share (its gradients not all-reduced,
        at the first call's own block of the minibatch: its ``N / |batch|`` scale is the block's)
        and its outputs are all-reduced after it runs: a trace cannot hold the all-reduce."""
        if self.parallel is None:
            return trace_or_eager(self, fn, example_args)
        traced = []

        def run(*args):
            self._local_gradients = True
            try:
                if not traced:
                    traced.append(trace_or_eager(self, fn, args))
                out = traced[0](*args)
            finally:
                self._local_gradients = False
            return self.parallel.mean(out)

        return run

    def compile_loop(self, step, emit):
        return compile_loop(step, emit)

    def optimizer(self, config):
        return build_optimizer(config)

    # -- native samplers -------------------------------------------------------------------------
    def native_transition(self, potential, settings: NativeSettings):
        """Pyro's NUTS on ``potential(flat, data)``, stepped by the core's driver."""
        from ppl_bdl.backends.pyro.mcmc import native_transition

        return native_transition(self, potential, settings)

    def native_sgmcmc_kernel(self, spec):
        from ppl_bdl.backends.pyro.mcmc import PyroSGMCMC

        return PyroSGMCMC(spec)

    # -- enumeration -----------------------------------------------------------------------------
    def enumerated_log_density(self, model, inputs, max_plate_nesting: int):
        """``poutine.enum`` and Pyro HMC's einsum evaluator: the enumerated sites summed out
        (a ``markov`` loop costs the forward algorithm's, not K^T)."""
        from ppl_bdl.backends.pyro.enum import enumerated_log_density

        return enumerated_log_density(model, inputs, max_plate_nesting)

    def infer_discrete(self, model, inputs, max_plate_nesting: int, key):
        """``pyro.infer.infer_discrete``: one draw of the enumerated sites."""
        from ppl_bdl.backends.pyro.enum import infer_discrete

        return infer_discrete(model, inputs, max_plate_nesting, key)

    # -- modules ---------------------------------------------------------------------------------
    def lift_module(self, module):
        """A ``torch.nn.Module``'s :class:`~ppl_bdl.dsl.nn.ModuleParts`, or None (another kind)."""
        from ppl_bdl.backends.pyro.lift import lift_module

        return lift_module(module)

    # -- devices ---------------------------------------------------------------------------------
    def place(self, tree, chain_axis: int | None = None, batch_axis: int | None = None):
        """As they are; in a data-parallel fit, minibatch indices (``batch_axis``) cut."""
        if self.parallel is None or batch_axis is None:
            return tree
        return tree_map(lambda a: self.parallel.slice(a, batch_axis), tree)

    def set_threads(self, count: int) -> None:
        torch.set_num_threads(int(count))

    def devices(self) -> list[str]:
        return available_devices()

    def process_devices(self, device, shard: str | None = None) -> list[str] | None:
        """Chains over several devices: one worker process per device (:mod:`._torch_devices`).
        None for one device, and for ``shard="data"`` (one process per device, the user's)."""
        if device is None or shard == "data":
            return None
        names = device_names(device, "pyro")
        if len(names) == 1 and not names[0].endswith(":*"):
            return None  # one device, checked when the fit makes its backend
        names = chain_devices(device)
        return names if len(names) > 1 else None


class _KeyBatch:
    """``num`` keys for the vmap loop; on torch every one is the same advancing generator."""

    def __init__(self, key, num: int):
        self.key, self.num = key, num

    def __len__(self) -> int:
        return self.num

    def __getitem__(self, i):
        return self.key
