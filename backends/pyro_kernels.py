"""Torch-side helpers for our SG-MCMC kernels: a traced minibatch gradient and Pyro's MCMCKernel.

:func:`trace_minibatch_grad` removes the per-step walk through the model: the gradient of the
potential for one minibatch shape is traced once to an aten graph (``make_fx`` of
``torch.func.grad``) and run by TorchScript, so a step costs about as much as a hand-written
torch gradient. It is checked against the eager gradient before use and falls back to it when
tracing fails or disagrees. Like ``jax.jit`` on NumPyro, the trace assumes that the model's Python
control flow depends on shapes only, not on parameter values.

:class:`PyroSGMCMC` wraps a registered SG-MCMC kernel as a ``pyro.infer.mcmc.MCMCKernel``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch

from ..runtime import use_backend
from ._torch_trace import script_trace


def trace_minibatch_grad(
    backend, potential: Callable, plate: str | None, example_flat, example_idx
):
    """``grad(flat, idx)`` of ``potential(flat, {plate: idx})`` (``idx`` ignored without a plate),
    traced once; the eager gradient when tracing is not possible."""

    def eager_batch(flat, idx):
        with use_backend(backend), torch.enable_grad():
            return torch.func.grad(lambda f: potential(f, {plate: idx}))(flat)

    def eager_full(flat):
        with use_backend(backend), torch.enable_grad():
            return torch.func.grad(potential)(flat)

    eager = eager_full if plate is None else eager_batch
    args = (example_flat,) if plate is None else (example_flat, example_idx)
    try:
        traced = script_trace(eager, args)
    except Exception as err:  # noqa: BLE001 - any failure means: use the eager gradient
        warnings.warn(
            f"could not trace the model's gradient ({type(err).__name__}: {err}); SG-MCMC on Pyro "
            "falls back to the eager gradient (correct, slower).",
            stacklevel=2,
        )
        return eager_batch if plate is not None else (lambda flat, idx=None: eager_full(flat))
    if plate is None:
        return lambda flat, idx=None: traced(flat)
    return traced


def _make_pyro_kernel_class():
    from pyro.infer.mcmc.mcmc_kernel import MCMCKernel

    class PyroSGMCMC(MCMCKernel):
        """A registered SG-MCMC kernel of ppl_bdl as a Pyro MCMC kernel.

        Parameters are the model's latent sites in the unconstrained space; ``transforms`` maps
        them back, so ``pyro.infer.MCMC(...).get_samples()`` returns constrained values.

        Example
        -------
        >>> import numpy as np, ppl_bdl as bdl
        >>> from pyro.infer import MCMC
        >>> from ppl_bdl import dist
        >>> @bdl.model
        ... def mean_model(y):
        ...     mu = bdl.sample("mu", dist.Normal(0.0, 10.0))
        ...     with bdl.plate("data", y.shape[0]) as idx:
        ...         bdl.sample("y", dist.Normal(mu, 1.0), obs=y[idx])
        >>> kernel = bdl.kernels.native_kernel(mean_model(np.zeros(50)), "pyro", "sgld",
        ...                                    step_size=1e-3, batch_size=10)
        >>> mcmc = MCMC(kernel, num_samples=20, warmup_steps=20, disable_progbar=True)
        >>> mcmc.run()
        >>> mcmc.get_samples()["mu"].shape
        torch.Size([20])
        """

        def __init__(self, spec):
            self.spec = spec
            self.backend = spec.setup.backend
            self._initial_params = None
            self.transforms = None
            self._info: dict = {}

        # -- the Pyro MCMCKernel interface ----------------------------------------------------------
        def setup(self, warmup_steps, *args, **kwargs):
            from ..inference.common import initial_positions
            from ..inference.minibatch import EpochBatches

            spec, be = self.spec, self.backend
            layout = spec.setup.layout
            self._key = be.random.key(spec.seed)
            self._batches = (
                EpochBatches(spec.plate[1], spec.batch_size, spec.seed) if spec.plate else None
            )
            self._step = 0
            self.transforms = {}
            for name in layout.names:
                transform = be.biject_to(layout.sites[name].native.support)
                if transform is not None:
                    self.transforms[name] = transform.inv
            if self._initial_params is None:
                flat = initial_positions(spec.setup, "uniform", 1, spec.seed)[0]
                with be.scope():
                    self._initial_params = self._unflatten(be.asarray(flat))
            with be.scope(), use_backend(be):
                self._state = spec.kernel.init(self._flatten(self._initial_params))
            if self._batches is not None:
                plate = spec.plate[0]
                example = be.asarray(self._batches.next_block(1)[0])
                self._batches = EpochBatches(spec.plate[1], spec.batch_size, spec.seed)
            else:
                plate, example = None, None
            with be.scope():
                self._grad = trace_minibatch_grad(
                    be, spec.potential, plate, self._flatten(self._initial_params), example
                )

        @property
        def initial_params(self):
            return self._initial_params

        @initial_params.setter
        def initial_params(self, params):
            self._initial_params = params

        def sample(self, params):
            spec, be = self.spec, self.backend
            with be.scope(), use_backend(be), torch.no_grad():
                state = dict(self._state)
                state["position"] = self._flatten(params)
                idx = be.asarray(self._batches.next_block(1)[0]) if self._batches else None
                step_size = spec.schedule(self._step)
                self._key, sub = be.random.split(self._key)
                grad = self._grad
                state, self._info = spec.kernel.step(sub, state, lambda x: grad(x, idx), step_size)
            if not bool(torch.isfinite(state["position"]).all()):
                from ..errors import InferenceError

                raise InferenceError(
                    f"SG-MCMC kernel {spec.method!r} reached NaN or inf at step {self._step} "
                    f"(step size {float(step_size):.3g}); try a smaller step_size."
                )
            self._state = state
            self._step += 1
            return self._unflatten(state["position"])

        def logging(self):
            return {k: f"{float(v):.3g}" for k, v in self._info.items()}

        def diagnostics(self):
            return {}

        # -- helpers --------------------------------------------------------------------------------
        def _flatten(self, params):
            layout = self.spec.setup.layout
            return torch.cat([params[name].reshape(-1) for name in layout.names])

        def _unflatten(self, flat):
            return self.spec.setup.layout.unflatten(flat)

    return PyroSGMCMC


PyroSGMCMC = _make_pyro_kernel_class()
