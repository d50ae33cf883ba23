"""The NumPyro backend's optimizers: optax transformations behind ``(init, update)``.

``update``'s ``lr_scale`` (a scalar array the run carries in its state) multiplies optax's
updates: for Adam and SGD (with or without momentum) the lr is the last factor of the update,
so this is the lr times the scale, and a run changes it between compiled calls without
recompiling (VI's reduce-on-plateau).

Example
-------
>>> import jax.numpy as jnp
>>> from ppl_bdl.optim import OptimizerConfig
>>> from ppl_bdl.backends._optax_optimizer import build_optimizer
>>> opt = build_optimizer(OptimizerConfig.build(optimizer="sgd", lr=0.5))
>>> params = {"x": jnp.asarray(1.0)}
>>> state = opt.init(params)
>>> new, state = opt.update({"x": jnp.asarray(1.0)}, state, params, jnp.asarray(True))
>>> float(new["x"])
0.5
>>> new, state = opt.update({"x": jnp.asarray(1.0)}, state, new, jnp.asarray(True), jnp.asarray(0.1))
>>> round(float(new["x"]), 4)  # 0.5 - 0.1 * 0.5 * 1.0
0.45
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from ..backend_protocol import Optimizer
from ..optim import OptimizerConfig, learning_rate


def transformation(config: OptimizerConfig) -> optax.GradientTransformation:
    """The optax transformation for ``config``: clipping, then adam/sgd with the schedule."""

    def schedule(count):
        return learning_rate(config, count, xp=jnp)

    if config.optimizer == "adam":
        opt = optax.adam(schedule)
    else:
        opt = optax.sgd(schedule, momentum=config.momentum or None)
    if config.clip_norm is not None:
        opt = optax.chain(optax.clip_by_global_norm(config.clip_norm), opt)
    return opt


def build_optimizer(config: OptimizerConfig) -> Optimizer:
    tx = transformation(config)

    def update(grads, state, params, apply, lr_scale=None):
        # ``apply`` is not needed: the loop drops a failed step's new arrays. A select on it here
        # (with the loop's own) cost a quarter of a toy mean-field VI step on XLA's CPU backend,
        # which fused the step's noise into it (docs/benchmarks.md).
        del apply
        updates, new_state = tx.update(grads, state, params)
        if lr_scale is not None:  # one multiply, which XLA fuses into the update's own kernel
            updates = jax.tree_util.tree_map(
                lambda u: u * jnp.asarray(lr_scale, jnp.result_type(u)), updates
            )
        return optax.apply_updates(params, updates), new_state

    return Optimizer(tx.init, update)
