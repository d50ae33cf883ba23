"""Pyro-side helpers of the core's VI: a lean ``torch.optim`` step over one flat parameter
tensor (no Pyro handlers, no param store) and reparameterised draws. Imported lazily by
:meth:`PyroBackend.vi_support`."""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import torch

from ..optim import OptimizerConfig, learning_rate

#: Parameter count up to which a run uses one intra-op thread (see ``run_scope``).
SMALL_PROBLEM = 1_000_000


class _State:
    """The mutable state of a torch run: the parameter tensor, its optimizer and scheduler."""

    def __init__(self, phi, optimizer, scheduler):
        self.phi, self.optimizer, self.scheduler = phi, optimizer, scheduler


class PyroVISupport:
    """Build the VI step on torch: ``init(phi)`` -> state and ``step(state, key, x)`` ->
    ``(state, (loss, ok))``. The update is skipped when the loss or gradient is not finite, so
    the parameters before a NaN are kept (the backend's loop stops there)."""

    def __init__(self, backend):
        self.backend = backend

    def optimizer_step(self, loss_fn, config: OptimizerConfig, param_layout):
        """``loss_fn(params, key, x) -> scalar`` with ``params`` a dict laid out by
        ``param_layout``; returns ``(init(flat numpy) -> state, step, params_of(state) -> flat
        numpy)``. The parameters live in one flat tensor (views per name), so one fused optimizer
        update covers them all."""

        def init(phi: np.ndarray) -> _State:
            phi = torch.tensor(np.asarray(phi), dtype=self.backend.float_dtype, requires_grad=True)
            if config.optimizer == "adam":
                opt = torch.optim.Adam([phi], lr=config.lr, foreach=False, fused=_fused_ok(phi))
            else:
                opt = torch.optim.SGD([phi], lr=config.lr, momentum=config.momentum, foreach=False)
            sched = None
            if config.schedule != "constant":
                sched = torch.optim.lr_scheduler.LambdaLR(
                    opt, lambda step: learning_rate(config, step) / config.lr
                )
            return _State(phi, opt, sched)

        def step(state: _State, key, x):
            phi = state.phi
            with torch.enable_grad():
                loss = loss_fn(param_layout.unpack(phi), key, x)
                (grad,) = torch.autograd.grad(loss, phi)
            loss = loss.detach()
            ok = bool(torch.isfinite(loss) & torch.isfinite(grad).all())
            if ok:
                if config.clip_norm is not None:
                    norm = torch.linalg.vector_norm(grad)
                    grad = grad * torch.clamp(config.clip_norm / (norm + 1e-12), max=1.0)
                phi.grad = grad
                state.optimizer.step()
                if state.scheduler is not None:
                    state.scheduler.step()
            return state, (loss, ok)

        def params_of(state: _State) -> np.ndarray:
            return state.phi.detach().cpu().numpy().copy()

        return init, step, params_of

    @contextlib.contextmanager
    def run_scope(self, num_params: int):
        """Run small problems on one intra-op thread (restored afterwards).

        Steps of a small model are sequences of tiny kernels; torch's thread pool (OpenMP and
        the BLAS/LAPACK threads) costs more than it gives there, up to 10x on a busy machine.
        """
        previous = torch.get_num_threads()
        if num_params <= SMALL_PROBLEM:
            torch.set_num_threads(1)
        try:
            yield
        finally:
            torch.set_num_threads(previous)

    def rsample(self, key: Any, native):
        """A reparameterised draw seeded from the key (torch draws from the global RNG)."""
        seed = int(torch.randint(0, 2**62, (1,), generator=key))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return native.rsample() if native.has_rsample else native.sample()


def _fused_ok(phi) -> bool:
    # Fused Adam exists on CPU from torch 2.4; fall back quietly where it does not.
    try:
        torch.optim.Adam([torch.zeros(1, requires_grad=True)], fused=True)
        return True
    except (RuntimeError, TypeError, ValueError):
        return False
