"""The NumPyro backend's optimizers: optax transformations behind ``(init, update)``.

The transformation is optax's without its learning rate (``scale_by_adam``, or SGD's momentum
``trace``, after the clipping): ``update`` takes each step's lr (a scalar the driver computes
in the compiled step, :class:`~ppl_bdl.inference.loop.driver.Rates`) and applies ``−lr × update``,
so a schedule, or an lr cut on a plateau, changes an input, not the compiled program.

Example
-------
>>> import jax.numpy as jnp
>>> from ppl_bdl.optim import OptimizerConfig
>>> from ppl_bdl.backends.numpyro.optimizer import build_optimizer
>>> opt = build_optimizer(OptimizerConfig.build(optimizer="sgd", lr=0.5))
>>> params = {"x": jnp.asarray(1.0)}
>>> state = opt.init(params)
>>> new, state = opt.update({"x": jnp.asarray(1.0)}, state, params, jnp.asarray(True), 0.5)
>>> float(new["x"])
0.5
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from ppl_bdl.backend_protocol import Optimizer
from ppl_bdl.optim import OptimizerConfig


def transformation(config: OptimizerConfig) -> optax.GradientTransformation:
    """The optax transformation for ``config`` up to its lr: clipping, then adam's scaling or
    SGD's momentum."""
    if config.optimizer == "adam":
        opt = optax.scale_by_adam()
    elif config.momentum:
        opt = optax.trace(decay=config.momentum)
    else:
        opt = optax.identity()
    if config.clip_norm is not None:
        opt = optax.chain(optax.clip_by_global_norm(config.clip_norm), opt)
    return opt


def build_optimizer(config: OptimizerConfig) -> Optimizer:
    tx = transformation(config)

    def update(grads, state, params, apply, lr):
        # ``apply`` is not needed: the loop drops a failed step's new arrays. A select on it here
        # (with the loop's own) cost a quarter of a toy mean-field VI step on XLA's CPU backend,
        # which fused the step's noise into it (docs/benchmarks.md).
        del apply
        updates, new_state = tx.update(grads, state, params)
        new = jax.tree_util.tree_map(
            lambda p, u: p - jnp.asarray(lr, jnp.result_type(u)) * u, params, updates
        )
        return new, new_state

    return Optimizer(tx.init, update)
