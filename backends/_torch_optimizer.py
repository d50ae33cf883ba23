"""The Pyro backend's optimizers: ``torch.optim`` (fused where torch has it) behind the gated
``(init, update)``. The parameters are updated in place; an update whose gate is False is
skipped (the loop stops at that step).

Example
-------
>>> import torch
>>> from ppl_bdl.optim import OptimizerConfig
>>> from ppl_bdl.backends._torch_optimizer import build_optimizer
>>> opt = build_optimizer(OptimizerConfig.build(optimizer="sgd", lr=0.5))
>>> params = {"x": torch.tensor(1.0)}
>>> state = opt.init(params)
>>> new, state = opt.update({"x": torch.tensor(1.0)}, state, params, torch.tensor(True))
>>> float(new["x"])
0.5
"""

from __future__ import annotations

from functools import cache

import torch

from ..backend_protocol import Optimizer
from ..optim import OptimizerConfig, learning_rate


class _State:
    def __init__(self, optimizer, scheduler):
        self.optimizer, self.scheduler = optimizer, scheduler


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
        sched = None
        if config.schedule != "constant":
            sched = torch.optim.lr_scheduler.LambdaLR(
                opt, lambda step: learning_rate(config, step) / config.lr
            )
        return _State(opt, sched)

    def update(grads: dict, state: _State, params: dict, apply):
        if not bool(apply):
            return params, state
        if config.clip_norm is not None:
            norm = torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(g) for g in grads.values()])
            )
            factor = torch.clamp(config.clip_norm / (norm + 1e-12), max=1.0)
            grads = {k: g * factor for k, g in grads.items()}
        for name, tensor in params.items():
            tensor.grad = grads[name]
        state.optimizer.step()
        if state.scheduler is not None:
            state.scheduler.step()
        return params, state

    return Optimizer(init, update)
