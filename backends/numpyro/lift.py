"""Lifting an ``equinox.Module`` for :func:`ppl_bdl.dsl.nn.lift` on the NumPyro backend.

The module's floating-point arrays (``eqx.partition(module, eqx.is_inexact_array)``) become arrays
by path (``layers.0.weight``); the forward pass rebuilds the module with the arrays given
(``eqx.combine``) and maps it over the leading axis of the input, as ``jax.vmap(module)(x)``:
equinox modules take one example.
"""

from __future__ import annotations

import jax

from ppl_bdl.dsl.nn.lift import ModuleParts
from ppl_bdl.dsl.nn.priors import fans_out_in


def _dotted(path) -> str:
    parts = []
    for key in path:
        for attr in ("name", "key", "idx"):  # GetAttrKey, DictKey, SequenceKey
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
        else:
            parts.append(str(key))
    return ".".join(parts)


def lift_module(module) -> ModuleParts | None:
    """The parts of an equinox module, or None when ``module`` is not one (or equinox is absent)."""
    try:
        import equinox as eqx
    except ImportError:
        return None
    if not isinstance(module, eqx.Module):
        return None
    arrays, static = eqx.partition(module, eqx.is_inexact_array)
    leaves, treedef = jax.tree_util.tree_flatten_with_path(arrays)
    paths = [_dotted(path) for path, _ in leaves]
    params = dict(zip(paths, (leaf for _, leaf in leaves), strict=True))

    def apply(values, x):
        tree = jax.tree_util.tree_unflatten(treedef, [values[p] for p in paths])
        return jax.vmap(eqx.combine(tree, static))(x)

    return ModuleParts(
        kind=f"equinox.Module ({type(module).__name__})",
        params=params,
        apply=apply,
        fans={name: fans_out_in(p.shape) for name, p in params.items()},
    )
