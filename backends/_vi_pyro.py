"""Pyro-side helpers of the core's VI: a lean ``torch.optim`` step over one flat parameter
tensor (no Pyro handlers, no param store) and reparameterised draws. Imported lazily by
:meth:`PyroBackend.vi_support`."""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import numpy as np
import torch

from .. import prefetch
from ..optim import OptimizerConfig, learning_rate
from ..runtime import use_backend
from ._torch_trace import script_trace

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

    def optimizer_step(self, loss_fn, config: OptimizerConfig, param_layout, normal_shapes=None):
        """``loss_fn(params, key, x) -> scalar`` with ``params`` a dict laid out by
        ``param_layout``; returns ``(init(flat numpy) -> state, step, params_of(state) -> flat
        numpy)``. The parameters live in one flat tensor (views per name), so one fused optimizer
        update covers them all.

        With ``normal_shapes`` (the standard-normal draws one loss evaluation makes, recorded
        with :mod:`ppl_bdl.prefetch`, and no other use of the key), the loss and its gradient
        are traced once with those draws as inputs (:func:`trace_loss_and_grad`), so a step
        skips the Python walk of the guide and the model.
        """
        value_and_grad = _eager_value_and_grad(self.backend, loss_fn, param_layout)
        if normal_shapes is not None:
            value_and_grad = trace_loss_and_grad(
                self.backend, loss_fn, param_layout, normal_shapes, value_and_grad
            )

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
            loss, grad = value_and_grad(state.phi.detach(), key, x)
            ok = bool(torch.isfinite(loss) & torch.isfinite(grad).all())
            if ok:
                if config.clip_norm is not None:
                    norm = torch.linalg.vector_norm(grad)
                    grad = grad * torch.clamp(config.clip_norm / (norm + 1e-12), max=1.0)
                state.phi.grad = grad
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


def _eager_value_and_grad(backend, loss_fn, param_layout):
    """``(phi, key, x) -> (loss, grad)`` by autograd through one evaluation of the loss."""

    def value_and_grad(phi, key, x):
        phi = phi.detach().requires_grad_(True)
        with use_backend(backend), torch.enable_grad():
            loss = loss_fn(param_layout.unpack(phi), key, x)
            (grad,) = torch.autograd.grad(loss, phi)
        return loss.detach(), grad

    return value_and_grad


def trace_loss_and_grad(backend, loss_fn, param_layout, normal_shapes, eager):
    """The loss and its gradient traced (``make_fx``, then TorchScript) as a function of the
    parameters, the minibatch indices and the step's standard-normal draws; a step draws those
    from its generator and calls the trace.

    The trace is made on the first step (for its kind of ``x``: indices or None) and checked
    there against the eager evaluation with the same draws; when tracing fails or disagrees
    (e.g. Python control flow on values), the steps use ``eager``, with a warning.
    """
    dtype = backend.float_dtype

    def draws(key):
        return [torch.randn(shape, generator=key, dtype=dtype) for shape in normal_shapes]

    def with_normals(phi, x, *normals):
        with use_backend(backend), prefetch.replaying(*normals):
            return torch.func.grad_and_value(lambda p: loss_fn(param_layout.unpack(p), None, x))(
                phi
            )

    traces: dict = {}  # x is None -> the traced function, or None for the eager fallback

    def build(phi, x):
        normals = draws(torch.Generator().manual_seed(0))
        if x is None:
            fn, args = (lambda p, *n: with_normals(p, None, *n)), (phi, *normals)
        else:
            fn, args = with_normals, (phi, x, *normals)
        try:
            return script_trace(fn, args)
        except Exception as err:  # noqa: BLE001 - any failure means: use the eager step
            warnings.warn(
                f"could not trace the VI loss ({type(err).__name__}: {err}); VI on Pyro "
                "evaluates the model every step instead (correct, slower).",
                stacklevel=4,
            )
            return None

    def value_and_grad(phi, key, x):
        kind = x is None
        if kind not in traces:
            traces[kind] = build(phi, x)
        traced = traces[kind]
        if traced is None:
            return eager(phi, key, x)
        normals = draws(key)
        grad, loss = traced(phi, *normals) if kind else traced(phi, x, *normals)
        return loss, grad

    return value_and_grad


def _fused_ok(phi) -> bool:
    # Fused Adam exists on CPU from torch 2.4; fall back quietly where it does not.
    try:
        torch.optim.Adam([torch.zeros(1, requires_grad=True)], fused=True)
        return True
    except (RuntimeError, TypeError, ValueError):
        return False
