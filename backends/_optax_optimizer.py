"""The NumPyro backend's optimizers: optax transformations behind ``(init, update)``.

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
"""

from __future__ import annotations

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

    def update(grads, state, params, apply):
        # ``apply`` is not needed: the loop drops a failed step's new arrays. A select on it here
        # (with the loop's own) cost a quarter of a toy mean-field VI step on XLA's CPU backend,
        # which fused the step's noise into it (docs/benchmarks.md).
        del apply
        updates, new_state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), new_state

    return Optimizer(tx.init, update)
