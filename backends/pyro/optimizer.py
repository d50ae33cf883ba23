"""The Pyro backend's optimizers: ``torch.optim`` (fused where torch has it) behind the gated
``(init, update)``. The parameters are updated in place; an update whose gate is False is
skipped (the loop stops at that step, and its state is the one before it). Each step's lr (the
driver's :class:`~ppl_bdl.inference.loop.driver.Rates`) is set on the optimizer's param group,
read from its tensor only when the tensor changes (a constant rate is one tensor for a whole
run: no host read per step).

Example
-------
>>> import torch
>>> from ppl_bdl.optim import OptimizerConfig
>>> from ppl_bdl.backends.pyro.optimizer import build_optimizer
>>> opt = build_optimizer(OptimizerConfig.build(optimizer="sgd", lr=0.5))
>>> params = {"x": torch.tensor(1.0)}
>>> state = opt.init(params)
>>> new, state = opt.update({"x": torch.tensor(1.0)}, state, params, torch.tensor(True), 0.5)
>>> float(new["x"])
0.5
"""

from __future__ import annotations

from functools import cache

import torch

from ppl_bdl.backend_protocol import Optimizer
from ppl_bdl.optim import OptimizerConfig


class _State:
    def __init__(self, optimizer):
        self.optimizer = optimizer
        self.lr_source = None  # the last lr given (its value is on the param groups)


@cache
def _fused_adam_ok(device_type: str) -> bool:
    try:
        torch.optim.Adam([torch.zeros(1, device=device_type, requires_grad=True)], fused=True)
        return True
    except (RuntimeError, TypeError, ValueError):
        return False


def build_optimizer(config: OptimizerConfig) -> Optimizer:
    def init(params: dict) -> _State:
        tensors = list(params.values())
        if config.optimizer == "adam":
            fused = bool(tensors) and _fused_adam_ok(tensors[0].device.type)
            opt = torch.optim.Adam(tensors, lr=config.lr, fused=fused or None)
        else:
            opt = torch.optim.SGD(tensors, lr=config.lr, momentum=config.momentum)
        return _State(opt)

    def update(grads: dict, state: _State, params: dict, apply, lr):
        if not bool(apply):
            return params, state
        if lr is not state.lr_source:
            state.lr_source = lr
            for group in state.optimizer.param_groups:
                group["lr"] = float(lr)
        if config.clip_norm is not None:
            norm = torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(g) for g in grads.values()])
            )
            factor = torch.clamp(config.clip_norm / (norm + 1e-12), max=1.0)
            grads = {k: g * factor for k, g in grads.items()}
        for name, tensor in params.items():
            tensor.grad = grads[name]
        state.optimizer.step()
        return params, state

    return Optimizer(init, update)
