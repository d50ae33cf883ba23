"""Lifting a ``torch.nn.Module`` for :func:`ppl_bdl.dsl.nn.lift` on the Pyro backend.

The module's parameters become arrays by path (``named_parameters``); the forward pass is the
module's own code with those arrays swapped in, ``torch.func.functional_call``, so the module is
never changed.
"""

from __future__ import annotations

import torch
from torch.func import functional_call

from ppl_bdl.dsl.nn.lift import ModuleParts
from ppl_bdl.dsl.nn.priors import fans_out_in


def lift_module(module) -> ModuleParts | None:
    """The parts of a torch module, or None when ``module`` is not one."""
    if not isinstance(module, torch.nn.Module):
        return None
    params = {name: p.detach() for name, p in module.named_parameters()}

    def apply(values, x):
        return functional_call(module, dict(values), (x,))

    return ModuleParts(
        kind=f"torch.nn.Module ({type(module).__name__})",
        params=params,
        apply=apply,
        fans={name: fans_out_in(p.shape) for name, p in params.items()},
    )
