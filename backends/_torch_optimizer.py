"""The Pyro backend's optimizers: ``torch.optim`` (fused where torch has it) behind the gated
``(init, update)``. The parameters are updated in place; an update whose gate is False is
skipped (the loop stops at that step). The lr of each step is set on the optimizer's param
group: the schedule's lr (:func:`ppl_bdl.optim.learning_rate`) times ``update``'s ``lr_scale``
(a scalar tensor the run carries in its state, read only when the run puts a new one there).

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
>>> new, state = opt.update({"x": torch.tensor(1.0)}, state, new, torch.tensor(True), torch.tensor(0.1))
>>> round(float(new["x"]), 4)  # 0.5 - 0.1 * 0.5 * 1.0
0.45
"""

from __future__ import annotations

from functools import cache

import torch

from ..backend_protocol import Optimizer
from ..optim import OptimizerConfig, learning_rate


class _State:
    def __init__(self, optimizer):
        self.optimizer, self.count = optimizer, 0
        # The last lr_scale seen and its value: the run keeps one tensor in its state between
        # its cuts, so the host reads it (a device sync on a GPU) once per cut, not per step.
        self.scale_source, self.scale = None, 1.0


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

    def update(grads: dict, state: _State, params: dict, apply, lr_scale=None):
        if not bool(apply):
            return params, state
        if lr_scale is not None and lr_scale is not state.scale_source:
            state.scale_source, state.scale = lr_scale, float(lr_scale)
        lr = learning_rate(config, state.count) * state.scale
        for group in state.optimizer.param_groups:
            group["lr"] = lr
        state.count += 1
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
