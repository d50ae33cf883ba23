"""NumPyro's NUTS, and our SG-MCMC kernels as NumPyro MCMC kernels.

:func:`native_transition` wraps NumPyro's own NUTS (the functional ``numpyro.infer.hmc.hmc``
API: the same sampler ``numpyro.infer.NUTS`` runs, with its warmup adaptation) as a transition of
the core's driver, so NUTS runs in the same compiled chunks as every other method (progress, a
clean stop on Ctrl-C, draws leaving the device only at kept steps). The data reaches the potential
as an argument of each step (``model_args``), never as a constant of the compiled program.

:class:`NumPyroSGMCMC` is the other direction: a registered SG-MCMC transition of the core as a
``numpyro.infer.mcmc.MCMCKernel``, so ``numpyro.infer.MCMC`` drives it. It draws its own
minibatch on the device (one permutation per epoch, sliced) and holds the data fixed.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from numpyro.infer.hmc import hmc
from numpyro.infer.mcmc import MCMCKernel

from ppl_bdl.backend_protocol import NativeSettings, Transition
from ppl_bdl.dsl.effects import use_backend


def native_transition(backend, potential, settings: NativeSettings) -> Transition:
    """NumPyro's NUTS on ``potential(flat, data)`` as ``(init, step, emit)``."""

    def potential_fn_gen(data):
        def potential_fn(z):
            with use_backend(backend):
                return potential(z, data)

        return potential_fn

    init_kernel, sample_kernel = hmc(potential_fn_gen=potential_fn_gen, algo="NUTS")
    options = dict(
        num_warmup=settings.num_warmup,
        adapt_step_size=settings.num_warmup > 0,
        adapt_mass_matrix=settings.num_warmup > 0,
        dense_mass=settings.dense_mass,
        target_accept_prob=settings.target_accept,
        max_tree_depth=settings.max_tree_depth,
    )
    if settings.step_size is not None:
        options["step_size"] = settings.step_size

    @jax.jit
    def init(key, position, data):
        # One compiled program: run eagerly, NumPyro's init (its step-size search included)
        # compiled each of its ~70 operations on its own (2.1 s against 0.8 s on a small BNN).
        return init_kernel(position, rng_key=key, model_args=(data,), **options)

    def step(key, state, batch, rate):
        new = sample_kernel(state, model_args=(batch.data,))
        info = {
            "diverging": new.diverging,
            "n_steps": new.num_steps,
            "acceptance_rate": new.accept_prob,
            "step_size": new.adapt_state.step_size,
            "energy": new.energy,
            "lp": -new.potential_energy,
        }
        return new, info

    return Transition(init, step, lambda state: state.z)


class SGMCMCState(NamedTuple):
    """The state NumPyro's MCMC carries: the flat position (the sample field), the core's
    transition state, the epoch permutation, where the next minibatch starts and the step count
    (the step size's schedule reads it)."""

    position: Any
    inner: Any
    perm: Any
    cursor: Any
    rng_key: Any
    count: Any


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
    >>> kernel = bdl.native_kernel(mean_model(np.zeros(50)), "numpyro", "sghmc",
    ...                                    step_size=1e-3, batch_size=10)
    >>> mcmc = MCMC(kernel, num_warmup=50, num_samples=50, progress_bar=False)
    >>> mcmc.run(jax.random.PRNGKey(0))
    >>> mcmc.get_samples()["mu"].shape
    (50,)
    """

    sample_field = "position"

    def __init__(self, spec):
        self.spec = spec
        self.backend = spec.setup.backend

    @property
    def default_fields(self):
        return ("position",)

    def init(self, rng_key, num_warmup, init_params, model_args, model_kwargs):
        spec, backend = self.spec, self.backend
        key_init, key_perm, rng_key = jax.random.split(rng_key, 3)
        with backend.scope(), use_backend(backend):
            if init_params is None:
                position = backend.asarray(spec.initial_position())
            else:
                position = jnp.asarray(init_params, dtype=backend.float_dtype)
            inner = spec.transition.init(key_init, position, spec.data)
            size = spec.plate[1] if spec.plate else 1
            perm = jax.random.permutation(key_perm, size).astype(jnp.int32)
            return SGMCMCState(position, inner, perm, jnp.asarray(0), rng_key, jnp.asarray(0))

    def sample(self, state, model_args, model_kwargs):
        spec, backend = self.spec, self.backend
        key_step, key_perm, rng_key = jax.random.split(state.rng_key, 3)
        perm, cursor, idx = state.perm, state.cursor, None
        if spec.plate is not None:
            size, b = spec.plate[1], spec.batch_size
            perm, cursor = lax.cond(
                cursor >= size // b,
                lambda: (jax.random.permutation(key_perm, size).astype(perm.dtype), jnp.asarray(0)),
                lambda: (perm, cursor),
            )
            idx = lax.dynamic_slice(perm, (cursor * b,), (b,))
            cursor = cursor + 1
        with backend.scope(), use_backend(backend):
            rate = spec.rate(state.count)
            inner, _ = spec.transition.step(key_step, state.inner, spec.batch(idx), rate)
            position = spec.transition.emit(inner)
        return SGMCMCState(position, inner, perm, cursor, rng_key, state.count + 1)

    def postprocess_fn(self, model_args, model_kwargs):
        spec = self.spec

        def constrain(flat):
            with use_backend(spec.setup.backend):
                return spec.constrain(flat)

        return constrain
