"""Split a minibatch step by what depends only on its indices (JAX), to do that part in bulk.

A minibatch gradient ``fn(state, idx)`` gathers the batch's rows (``X[idx]``, ``y[idx]``) and
then computes with them. Inside a compiled loop each step's gathers wait on the memory system
one step at a time; when the data outgrow the caches that wait dominates (the step of a small BNN
at N = 1e6 is 1.3x its cost at N = 1e4). :func:`split_index_work` unzips ``fn`` by data
dependence (JAX's partial evaluation) into

- ``gather(idx)``: everything that depends on the indices and the data alone (the gathered rows,
  anything computed from them), and
- ``rest(state, gathered)``: the remainder, equal to ``fn(state, idx)``,

so a driver can run ``gather`` for a whole chunk of steps at once before its loop (one large gather
keeps many memory requests in flight) and the loop reads each step's rows contiguously. The split
is exact: the same operations on the same values, only scheduled differently.

Example
-------
>>> import jax, jax.numpy as jnp
>>> X = jnp.arange(12.0).reshape(6, 2)
>>> def fn(w, idx):
...     return jax.grad(lambda w: jnp.sum((X[idx] @ w) ** 2))(w)
>>> work = split_index_work(fn, jnp.ones(2), jnp.zeros(3, jnp.int32))
>>> idx = jnp.array([0, 5, 2])
>>> bool(jnp.allclose(work.rest(jnp.ones(2), work.gather(idx)), fn(jnp.ones(2), idx)))
True
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.extend.core import jaxpr_as_fun


class IndexWork(NamedTuple):
    """``fn(state, idx) == rest(state, gather(idx))``; ``gather`` returns a tuple of arrays."""

    gather: Callable[[Any], tuple]
    rest: Callable[[Any, tuple], Any]
    #: Elements ``gather`` returns per index vector (its memory cost per step).
    size: int
    #: Bytes of the arrays the index-only part reads (the data it gathers from).
    data_bytes: int


def split_index_work(fn: Callable, state: Any, idx: Any) -> IndexWork | None:
    """Unzip ``fn(state, idx)`` (example arguments give the shapes) into its index-only part and
    the rest; None when nothing but the indices themselves would be precomputed, or when this
    JAX has no partial evaluator of the expected form (the caller then keeps ``fn`` whole)."""
    try:  # JAX's partial evaluator is internal API: fall back to the whole step without it
        from jax._src.interpreters.partial_eval import partial_eval_jaxpr_nounits
    except ImportError:  # pragma: no cover - depends on the installed JAX
        return None
    state_leaves, _ = jax.tree_util.tree_flatten(state)
    idx_leaves, _ = jax.tree_util.tree_flatten(idx)
    try:
        closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(state, idx)
        unknowns = [True] * len(state_leaves) + [False] * len(idx_leaves)
        known, unknown, _, residual_avals = partial_eval_jaxpr_nounits(
            closed, unknowns, instantiate=True
        )
        # Which residuals vary with the indices; the others are constants of the model.
        _, _, varies, _ = partial_eval_jaxpr_nounits(
            known, [True] * len(idx_leaves), instantiate=False
        )
    except Exception:  # pragma: no cover - an unexpected jaxpr form: keep the step whole
        return None
    if len(known.out_avals) != len(residual_avals):  # pragma: no cover - not the expected form
        return None
    gathered = [i for i, v in enumerate(varies) if v]
    if all(jnp.issubdtype(residual_avals[i].dtype, jnp.integer) for i in gathered):
        return None  # only index arithmetic crosses over (no data is gathered): keep it whole
    out_tree = jax.tree_util.tree_structure(out_shape)
    residuals_of = jaxpr_as_fun(known)
    remainder = jaxpr_as_fun(unknown)
    placeholder = [jnp.zeros_like(x) for x in idx_leaves]

    def gather(index) -> tuple:
        residuals = residuals_of(*jax.tree_util.tree_leaves(index))
        return tuple(residuals[i] for i in gathered)

    def rest(state, rows: tuple):
        # The constant residuals are recomputed here (XLA folds them; the gathers at the
        # placeholder indices are unused and dropped), the index-dependent ones come from rows.
        residuals = list(residuals_of(*placeholder))
        for i, row in zip(gathered, rows, strict=True):
            residuals[i] = row
        out = remainder(*residuals, *jax.tree_util.tree_leaves(state))
        return jax.tree_util.tree_unflatten(out_tree, out)

    size = sum(math.prod(residual_avals[i].shape) for i in gathered)
    data_bytes = sum(int(getattr(c, "nbytes", 0)) for c in known.consts)
    return IndexWork(gather, rest, size, data_bytes)
