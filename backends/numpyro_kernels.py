"""Our SG-MCMC kernels as ``numpyro.infer.mcmc.MCMCKernel``: ``numpyro.infer.MCMC`` drives them.

The kernel holds the model's data fixed and draws its own minibatch in :meth:`sample`: the
indices of one shuffle per epoch, sliced (reshuffled when the epoch runs out), scaled by N / B.
Build one with :func:`ppl_bdl.kernels.native_kernel`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from numpyro.infer.mcmc import MCMCKernel

from ..runtime import use_backend


class SGMCMCState(NamedTuple):
    """The state NumPyro's MCMC carries: the flat position (the sample field), our kernel's
    state, the step counter, the epoch permutation and where the next minibatch starts."""

    position: Any
    kernel_state: dict
    step: Any
    perm: Any
    cursor: Any
    info: dict
    rng_key: Any


class NumPyroSGMCMC(MCMCKernel):
    """A registered SG-MCMC kernel of ppl_bdl as a NumPyro MCMC kernel.

    Example
    -------
    >>> import numpy as np, jax, ppl_bdl as bdl
    >>> from numpyro.infer import MCMC
    >>> from ppl_bdl import dist
    >>> @bdl.model
    ... def mean_model(y):
    ...     mu = bdl.sample("mu", dist.Normal(0.0, 10.0))
    ...     with bdl.plate("data", y.shape[0]) as idx:
    ...         bdl.sample("y", dist.Normal(mu, 1.0), obs=y[idx])
    >>> kernel = bdl.kernels.native_kernel(mean_model(np.zeros(50)), "numpyro", "sghmc",
    ...                                    step_size=1e-3, batch_size=10)
    >>> mcmc = MCMC(kernel, num_warmup=50, num_samples=50, progress_bar=False)
    >>> mcmc.run(jax.random.PRNGKey(0))
    >>> sorted(mcmc.get_extra_fields())
    []
    """

    sample_field = "position"

    def __init__(self, spec):
        self.spec = spec
        self.backend = spec.setup.backend

    @property
    def default_fields(self):
        return ("position",)

    def init(self, rng_key, num_warmup, init_params, model_args, model_kwargs):
        spec, be = self.spec, self.backend
        key_init, key_perm, rng_key = jax.random.split(rng_key, 3)
        dim = spec.setup.layout.dim
        with be.scope(), use_backend(be):
            if init_params is None:  # uniform on [-2, 2] in the unconstrained space
                position = jax.random.uniform(key_init, (dim,), be.float_dtype, -2.0, 2.0)
            else:
                position = jnp.asarray(init_params, dtype=be.float_dtype)
            kernel_state = spec.kernel.init(position)
            perm = (
                jax.random.permutation(key_perm, spec.plate[1])
                if spec.plate
                else jnp.zeros(0, jnp.int32)
            )
            state = SGMCMCState(
                position, kernel_state, jnp.asarray(0), perm, jnp.asarray(0), {}, rng_key
            )
            # one step to learn the structure of ``info``; then reset it
            _, info = self._transition(state)
        zero_info = jax.tree_util.tree_map(jnp.zeros_like, info)
        return state._replace(info=zero_info)

    def _transition(self, state: SGMCMCState):
        spec, be = self.spec, self.backend
        key_step, key_perm, rng_key = jax.random.split(state.rng_key, 3)
        perm, cursor = state.perm, state.cursor
        batch = None
        if spec.plate is not None:
            name, size = spec.plate
            per_epoch = size // spec.batch_size
            perm, cursor = lax.cond(
                cursor >= per_epoch,
                lambda: (jax.random.permutation(key_perm, size).astype(perm.dtype), jnp.asarray(0)),
                lambda: (perm, cursor),
            )
            idx = lax.dynamic_slice(perm, (cursor * spec.batch_size,), (spec.batch_size,))
            batch = {name: idx}
            cursor = cursor + 1

        def potential(flat):
            return spec.potential(flat, batch)

        with use_backend(be):
            step_size = spec.schedule(state.step)
            kernel_state, info = spec.kernel.step(
                key_step, state.kernel_state, jax.grad(potential), step_size
            )
        new = SGMCMCState(
            kernel_state["position"], kernel_state, state.step + 1, perm, cursor, info, rng_key
        )
        return new, info

    def sample(self, state, model_args, model_kwargs):
        with self.backend.scope():
            new, info = self._transition(state)
        return new

    def postprocess_fn(self, model_args, model_kwargs):
        spec = self.spec

        def constrain(flat):
            with use_backend(spec.setup.backend):
                return spec.constrain(flat)

        return constrain
