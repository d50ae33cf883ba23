"""Trace a torch function once into TorchScript, for hot loops that should not walk the model in
Python every step (the minibatch gradient of SG-MCMC, the VI loss and its gradient, the potential
of NUTS).

Like ``jax.jit``, a trace assumes the function's Python control flow depends on shapes, not on
values; the trace is checked against the eager function at the example arguments, and the eager
function is used (with a warning) when tracing fails or disagrees.

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

import torch
from torch.utils import _pytree as pytree


def script_trace(fn: Callable, args: tuple):
    """``fn`` (of tensors) traced at ``args`` to an aten graph (``make_fx``, so ``torch.func``
    transforms are traced through), dead code removed, then compiled by TorchScript where it
    takes the graph's ops (else the graph runs as it is). Raises ``RuntimeError`` when the
    trace's outputs at ``args`` differ from ``fn``'s."""
    from torch.fx.experimental.proxy_tensor import make_fx

    graph = make_fx(fn)(*args)
    graph.graph.eliminate_dead_code()
    graph.recompile()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            traced = torch.jit.trace(graph, args, check_trace=False)
    except RuntimeError:
        # TorchScript cannot take some aten ops (convolution_backward): the traced graph itself
        # still runs without walking the model in Python.
        traced = graph
    outputs, references = traced(*args), fn(*args)
    out_leaves, ref_leaves = pytree.tree_leaves(outputs), pytree.tree_leaves(references)
    if len(out_leaves) != len(ref_leaves):
        raise RuntimeError("the trace returns a different structure than the eager function")
    for out, ref in zip(out_leaves, ref_leaves, strict=True):
        atol = 1e-5 * (1.0 + float(torch.nan_to_num(ref.abs()).max())) if ref.numel() else 0.0
        if not torch.allclose(out, ref, rtol=1e-4, atol=atol, equal_nan=True):
            raise RuntimeError("the trace disagrees with the eager function")
    return traced


def trace_or_eager(backend, fn: Callable, example_args: tuple) -> Callable:
    """``fn(*args)`` (args: pytrees of tensors) traced at ``example_args``; ``fn`` itself where
    tracing fails. The traced function takes and returns the same pytrees."""
    leaves, spec = pytree.tree_flatten(example_args)
    # Tensors are the trace's inputs; other leaves (None, numbers) are fixed at their example.
    tensor_at = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    out_spec = []

    def flat_fn(*tensors):
        full = list(leaves)
        for i, tensor in zip(tensor_at, tensors, strict=True):
            full[i] = tensor
        with backend.activate():
            result = fn(*pytree.tree_unflatten(full, spec))
        out_leaves, tree = pytree.tree_flatten(result)
        out_spec[:] = [tree]
        return tuple(out_leaves)

    try:
        traced = script_trace(flat_fn, tuple(leaves[i] for i in tensor_at))
    except Exception as err:  # noqa: BLE001 - any failure means: use the eager function
        warnings.warn(
            f"could not trace the model's step ({type(err).__name__}: {err}); on the Pyro backend "
            "it runs uncompiled (correct, several times slower for small models).",
            stacklevel=3,
        )
        return fn
    tree = out_spec[0]

    def call(*args):
        flat = pytree.tree_leaves(args)
        outs = traced(*(flat[i] for i in tensor_at))
        return pytree.tree_unflatten(list(outs if isinstance(outs, tuple) else (outs,)), tree)

    return call
