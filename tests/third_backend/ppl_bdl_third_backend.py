"""A third backend for the tests: one module and one entry point (this folder's dist-info).

It is assembled from the JAX pieces the NumPyro backend uses (math namespace, distributions,
compiled loop, optax optimizers, NUTS) under another name, without touching the core: the
conformance suite runs every shipped model and method on it, which is what "adding a backend is
one module and one entry point" has to mean.
"""

from __future__ import annotations

import contextlib

import jax
import numpy as np

from ppl_bdl.backends.base import BackendBase
from ppl_bdl.backends.numpyro import backend as reference
from ppl_bdl.backends.numpyro import dists
from ppl_bdl.backends.numpyro.loop import compile_loop
from ppl_bdl.backends.numpyro.math import make_math
from ppl_bdl.backends.numpyro.optimizer import build_optimizer


class DelegateBackend(BackendBase):
    name = "jaxdelegate"
    extra = "numpyro"
    vectorized_chains = True
    fuses_elementwise = True

    def __init__(self, precision: str = "float32", device: str | None = None):
        self._ref = reference.NumPyroBackend(precision, device)  # its arrays and devices
        super().__init__(precision, self._ref.device)
        self.math = make_math()
        self.random = reference._Random(self)
        self.native = reference._Native()

    # arrays (the reference's conversions, this backend's scope)
    float_dtype = property(lambda self: self._ref.float_dtype)

    @contextlib.contextmanager
    def scope(self):
        with self._ref.scope():
            yield

    def asarray(self, value, dtype=None):
        return self._ref.asarray(value, dtype)

    def to_numpy(self, value):
        return np.asarray(jax.device_get(value))

    def is_array(self, value) -> bool:
        return isinstance(value, jax.Array)

    def arange(self, n: int):
        return jax.numpy.arange(n)

    def tree_map(self, fn, *trees):
        return jax.tree_util.tree_map(fn, *trees)

    checks_index_bounds = False

    def bounds_checked(self, fn):
        return self._ref.bounds_checked(fn)

    # distributions
    def distribution(self, spec):
        return dists.native_distribution(spec)

    def expand(self, native, batch_shape, event_ndims: int):
        return dists.expand(native, batch_shape, event_ndims)

    def biject_to(self, support):
        return dists.biject_to(support)

    def transform(self, spec):
        return dists.native_transform(spec)

    def model_value(self, value, strict: bool):
        return value

    def observed_value(self, spec, value):
        return dists.observed_value(spec, value, self._ref.int_dtype)

    # autodiff and loops
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
        return fn

    def compile_loop(self, step, emit):
        return compile_loop(step, emit)

    def optimizer(self, config):
        return build_optimizer(config)

    # native samplers
    def native_transition(self, potential, settings):
        from ppl_bdl.backends.numpyro.mcmc import native_transition

        return native_transition(self, potential, settings)

    def native_sgmcmc_kernel(self, spec):
        from ppl_bdl.backends.numpyro.mcmc import NumPyroSGMCMC

        return NumPyroSGMCMC(spec)

    # enumeration (NumPyro's funsor machinery on the same JAX arrays)
    def enumerated_log_density(self, model, inputs, max_plate_nesting):
        from ppl_bdl.backends.numpyro.enum import enumerated_log_density

        return enumerated_log_density(model, inputs, max_plate_nesting)

    def infer_discrete(self, model, inputs, max_plate_nesting, key):
        from ppl_bdl.backends.numpyro.enum import infer_discrete

        return infer_discrete(model, inputs, max_plate_nesting, key)

    # devices
    def devices(self) -> list[str]:
        return self._ref.devices()

    def set_threads(self, count: int) -> None:
        pass

    # modules
    def lift_module(self, module):
        return None  # no module library of its own
