"""Trace a torch function once into TorchScript, for hot loops that should not walk the model in
Python every step (the Pyro SG-MCMC gradient, the Pyro VI loss).

Like ``jax.jit``, a trace assumes the function's Python control flow depends on shapes, not on
values; the trace is checked against the eager function at the example arguments, and callers
fall back to the eager function when tracing fails.

Example
-------
>>> import torch
>>> from ppl_bdl.backends._torch_trace import script_trace
>>> traced = script_trace(lambda x: torch.func.grad(lambda y: (y * y).sum())(x), (torch.ones(3),))
>>> traced(torch.arange(3.0)).tolist()
[0.0, 2.0, 4.0]
"""

from __future__ import annotations

import warnings
from collections.abc import Callable


def script_trace(fn: Callable, args: tuple):
    """``fn`` traced at ``args`` to an aten graph (``make_fx``, so ``torch.func`` transforms are
    traced through), dead code removed, then compiled by TorchScript. Raises ``RuntimeError``
    when the trace's outputs at ``args`` differ from ``fn``'s (a tensor or a tuple of them)."""
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    graph = make_fx(fn)(*args)
    graph.graph.eliminate_dead_code()
    graph.recompile()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(graph, args, check_trace=False)
    outputs, references = traced(*args), fn(*args)
    if isinstance(references, torch.Tensor):
        outputs, references = (outputs,), (references,)
    for out, ref in zip(outputs, references, strict=True):
        atol = 1e-5 * (1.0 + float(ref.abs().max()))
        if not torch.allclose(out, ref, rtol=1e-4, atol=atol):
            raise RuntimeError("the trace disagrees with the eager function")
    return traced
