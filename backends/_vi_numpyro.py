"""NumPyro-side helpers of the core's VI: an optax optimizer step over a flat parameter vector
and reparameterised draws. Imported lazily by :meth:`NumPyroBackend.vi_support`."""

from __future__ import annotations

import contextlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ..optim import OptimizerConfig, learning_rate


class NumPyroVISupport:
    """Build the VI step on JAX: ``init(phi)`` -> state and ``step(state, key, x)`` ->
    ``(state, (loss, ok))``, pure functions that the backend's ``compile_loop`` scans."""

    def __init__(self, backend):
        self.backend = backend

    def transformation(self, config: OptimizerConfig) -> optax.GradientTransformation:
        """The optax transformation for ``config`` (clipping, then adam/sgd with the schedule)."""

        def schedule(count):
            return learning_rate(config, count, xp=jnp)

        if config.optimizer == "adam":
            opt = optax.adam(schedule)
        else:
            opt = optax.sgd(schedule, momentum=config.momentum or None)
        if config.clip_norm is not None:
            opt = optax.chain(optax.clip_by_global_norm(config.clip_norm), opt)
        return opt

    def optimizer_step(self, loss_fn, config: OptimizerConfig, param_layout, normal_shapes=None):
        """``loss_fn(params, key, x) -> scalar`` with ``params`` a dict laid out by
        ``param_layout``; returns ``(init(flat numpy) -> state, step, params_of(state) -> flat
        numpy)``. ``normal_shapes`` is not used: the step is compiled as a whole (and the
        compiled loop pre-draws its normals, see :mod:`ppl_bdl.prefetch`).

        The state keeps the parameters as a dict (a pytree), not one flat vector: slicing a flat
        vector inside the differentiated function makes XLA rebuild the gradient from many
        padded slices inside every fused optimizer op, which is many times slower.
        """
        tx = self.transformation(config)
        value_and_grad = jax.value_and_grad(loss_fn)

        def init(phi: np.ndarray):
            params = {
                k: jnp.asarray(v, dtype=self.backend.float_dtype)
                for k, v in param_layout.unpack(np.asarray(phi)).items()
            }
            return params, tx.init(params)

        def step(state, key, x):
            params, opt_state = state
            loss, grad = value_and_grad(params, key, x)
            # A barrier so XLA computes the gradient once: otherwise it may fuse (and so
            # recompute, random draws included) the gradient into every optimizer op using it.
            loss, grad = jax.lax.optimization_barrier((loss, grad))
            finite = [jnp.all(jnp.isfinite(g)) for g in jax.tree_util.tree_leaves(grad)]
            ok = jnp.isfinite(loss) & jnp.all(jnp.stack(finite))
            updates, opt_state = tx.update(grad, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), (loss, ok)

        def params_of(state) -> np.ndarray:
            return param_layout.pack({k: np.asarray(v) for k, v in state[0].items()})

        return init, step, params_of

    def run_scope(self, num_params: int):
        """Nothing to set up on JAX (XLA picks its own threading)."""
        return contextlib.nullcontext()

    def rsample(self, key: Any, native):
        """A reparameterised draw (NumPyro's ``sample`` is differentiable where it can be)."""
        return native.sample(key)
