"""Pyro's enumeration of discrete latent sites (``poutine.enum``, the einsum evaluator of its
HMC, ``infer_discrete``), for models lowered by the core (:mod:`ppl_bdl.trace.enumeration`).

Pyro's log-space einsum uses an ``autograd.Function`` that ``torch.func`` transforms cannot
enter; :class:`_MarginalLogDensity` wraps the whole computation in one that can, its gradient
computed by torch's autograd inside the forward pass (first derivatives only: what NUTS, VI
and SG-MCMC need).
"""

from __future__ import annotations

import pyro
import torch
from pyro import poutine
from pyro.infer.mcmc.util import TraceEinsumEvaluator
from torch.utils import _pytree as pytree


def _log_density(model, max_plate_nesting: int):
    with pyro.validation_enabled(False):
        enumerated = poutine.enum(model, first_available_dim=-1 - max_plate_nesting)
        trace = poutine.trace(enumerated).get_trace()
        return TraceEinsumEvaluator(trace, True, max_plate_nesting).log_prob(trace)


class _MarginalLogDensity(torch.autograd.Function):
    @staticmethod
    def forward(fn, *tensors):
        with torch.enable_grad():
            # clone, not detach: a graph traced through this (make_fx) keeps its inputs linked.
            leaves = [t.clone() if t.requires_grad else t.clone().requires_grad_() for t in tensors]
            value = fn(*leaves)
            grads = torch.autograd.grad(value, leaves, allow_unused=True)
        grads = tuple(
            torch.zeros_like(x) if g is None else g for g, x in zip(grads, leaves, strict=True)
        )
        return value, grads

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*output[1])

    @staticmethod
    def backward(ctx, grad_value, _grad_grads):
        return (None,) + tuple(grad_value * g for g in ctx.saved_tensors)


def enumerated_log_density(model, inputs, max_plate_nesting: int):
    """log p of ``model(inputs)`` with its sites marked for enumeration summed out."""
    leaves, spec = pytree.tree_flatten(inputs)

    def fn(*tensors):
        return _log_density(
            lambda: model(pytree.tree_unflatten(list(tensors), spec)), max_plate_nesting
        )

    return _MarginalLogDensity.apply(fn, *leaves)[0]


def infer_discrete(model, inputs, max_plate_nesting: int, key) -> dict:
    """One draw of the enumerated sites of ``model(inputs)`` from their conditional
    distribution given everything else; torch's generator is seeded from ``key``."""
    seed = int(torch.randint(0, 2**62, (1,), generator=key, device=key.device))
    devices = [key.device.index or 0] if key.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), pyro.validation_enabled(False):
        torch.manual_seed(seed)
        sampler = pyro.infer.infer_discrete(
            lambda: model(inputs), first_available_dim=-1 - max_plate_nesting, temperature=1
        )
        trace = poutine.trace(sampler).get_trace()
    return {
        name: site["value"]
        for name, site in trace.nodes.items()
        if site["type"] == "sample" and site["infer"].get("enumerate") == "parallel"
    }
