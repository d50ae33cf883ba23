"""Trace a torch function once into TorchScript, for hot loops that should not walk the model in
Python every step (the minibatch gradient of SG-MCMC, the VI loss and its gradient, the potential
of NUTS).

Like ``jax.jit``, a trace assumes the function's Python control flow depends on shapes, not on
values; the trace is checked against the eager function at the example arguments, and the eager
function is used (with a warning) when tracing fails or disagrees.

Example
-------
>>> import torch
>>> from ppl_bdl.backends.pyro.torchscript import script_trace
>>> traced = script_trace(lambda x: torch.func.grad(lambda y: (y * y).sum())(x), (torch.ones(3),))
>>> traced(torch.arange(3.0)).tolist()
[0.0, 2.0, 4.0]
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from contextvars import ContextVar

import torch
from torch.utils import _pytree as pytree

from ppl_bdl.backends.pyro import values as _values
from ppl_bdl.backends.pyro.trees import index_tree, leading_size, split_mapped
from ppl_bdl.errors import LongLoop

#: Set while :func:`script_trace` traces a function (a long ``bdl.scan`` then raises LongLoop).
TRACING_POTENTIAL: ContextVar[bool] = ContextVar("ppl_bdl_tracing_potential", default=False)


def script_trace(fn: Callable, args: tuple):
    """``fn`` (of tensors) traced at ``args`` to an aten graph (``make_fx``, so ``torch.func``
    transforms are traced through), dead code removed, then compiled by TorchScript where it
    takes the graph's ops, and frozen (else the graph runs as it is). Raises ``RuntimeError`` when the
    trace's outputs at ``args`` differ from ``fn``'s."""
    from torch.fx.experimental.proxy_tensor import make_fx

    token = TRACING_POTENTIAL.set(True)
    try:
        graph = make_fx(fn)(*args)
    finally:
        TRACING_POTENTIAL.reset(token)
    graph.graph.eliminate_dead_code()
    graph.recompile()
    traced = compile_graph(graph, args)
    if not outputs_agree(traced(*args), fn(*args)):
        raise RuntimeError("the trace disagrees with the eager function")
    return traced


def compile_graph(graph, args: tuple):
    """An aten ``graph`` compiled by TorchScript at ``args`` and frozen: its constants (the data,
    the priors' parameters) inlined and what depends on them alone computed once (eight schools'
    gradient: 0.7-0.8x the time). The graph itself where TorchScript refuses an op
    (convolution_backward): it still runs without walking the model in Python."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchScript's deprecation notices
        try:
            compiled = torch.jit.trace(graph, tuple(args), check_trace=False)
        except RuntimeError:
            return graph
        try:
            return torch.jit.freeze(compiled.eval())
        except RuntimeError:
            return compiled


def outputs_agree(outputs, references) -> bool:
    """Whether a trace's ``outputs`` are the eager function's ``references`` (pytrees of
    tensors): the same structure, shapes and dtypes, and values to float32 round-off."""
    outs, refs = pytree.tree_leaves(outputs), pytree.tree_leaves(references)
    if len(outs) != len(refs):
        return False
    for out, ref in zip(outs, refs, strict=True):
        out, ref = _values.plain(out).detach(), _values.plain(ref).detach()
        if out.shape != ref.shape or out.dtype != ref.dtype:
            return False
        atol = 1e-5 * (1.0 + float(torch.nan_to_num(ref.abs()).max())) if ref.numel() else 0.0
        if not torch.allclose(out, ref, rtol=1e-4, atol=atol, equal_nan=True):
            return False
    return True


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
    except LongLoop:
        return fn  # a long bdl.scan: its step is traced, the function around it runs as it is
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


def vmap_or_loop(backend, fn: Callable, example_args: tuple, in_axes) -> Callable:
    """``fn`` (drawing no random numbers: one point's gradient) mapped over the leading axis of
    the arguments whose ``in_axes`` entry is 0 and traced: one batched graph of
    ``torch.func.vmap(fn)`` (traced at ``example_args``, and again at a call with another
    leading size). Where ``fn`` cannot be vmapped (it draws random numbers, or branches in
    Python on a value, ...) or in a data-parallel fit (whose traces all-reduce their outputs),
    ``backend.vmap`` loops over the points with ``fn`` traced once at one point, with a
    warning saying why in the first case. Either way the values are ``fn``'s, to round-off."""
    axes, mapped = split_mapped(example_args, in_axes)

    def loop():
        one = tuple(
            a if ax is None else index_tree(a, 0) for a, ax in zip(example_args, axes, strict=True)
        )
        return backend.vmap(backend.trace(fn, one), in_axes)

    if backend.parallel is not None:
        return loop()
    vectorised = torch.func.vmap(fn, in_dims=axes)
    try:
        with backend.activate():
            vectorised(*example_args)
    except Exception as err:  # noqa: BLE001 - any failure means: loop over the points
        warnings.warn(
            f"could not vectorise the per-point function with torch.func.vmap "
            f"({type(err).__name__}: {err}); on the Pyro backend it runs as a loop over the "
            "points (correct, slower).",
            stacklevel=3,
        )
        return loop()
    graphs = {leading_size(*mapped): trace_or_eager(backend, vectorised, example_args)}

    def call(*args):
        size = leading_size(*split_mapped(args, axes)[1])
        if size not in graphs:
            graphs[size] = trace_or_eager(backend, vectorised, args)
        return graphs[size](*args)

    return call
