"""Pytrees of torch tensors (dicts, tuples, named tuples, lists, None leaves kept): map, index,
stack.

Example
-------
>>> import torch
>>> from ppl_bdl.backends.pyro.trees import stack_tree, index_tree
>>> tree = stack_tree([{"a": torch.tensor(1.0)}, {"a": torch.tensor(2.0)}])
>>> index_tree(tree, 1)["a"].item()
2.0
"""

from __future__ import annotations

import torch


def tree_map(fn, *trees):
    first = trees[0]
    if isinstance(first, dict):
        return {k: tree_map(fn, *(t[k] for t in trees)) for k in first}
    if isinstance(first, tuple | list):
        return _rebuild(first, [tree_map(fn, *(t[j] for t in trees)) for j in range(len(first))])
    if first is None:
        return None
    return fn(*trees)


def _rebuild(like, values: list):
    """``values`` in a container of the type of ``like`` (a named tuple takes them positionally)."""
    if isinstance(like, tuple) and hasattr(like, "_fields"):
        return type(like)(*values)
    return type(like)(values)


def leading_size(*trees) -> int:
    """The length of the first leaf of ``trees`` (empty containers are skipped)."""
    for tree in trees:
        if isinstance(tree, dict):
            tree = list(tree.values())
        if isinstance(tree, tuple | list):
            if tree:
                size = leading_size(*tree)
                if size is not None:
                    return size
            continue
        if tree is not None:
            return len(tree)
    return None


def split_mapped(args, in_axes) -> tuple[tuple, list]:
    """``in_axes`` (one entry, or one per argument: 0 or None) as one entry per argument, and
    the arguments it maps (entry 0)."""
    axes = tuple(in_axes) if isinstance(in_axes, tuple | list) else (in_axes,) * len(args)
    if any(ax not in (0, None) for ax in axes):
        raise ValueError(f"in_axes entries must be 0 or None, got {in_axes!r}")
    return axes, [a for a, ax in zip(args, axes, strict=True) if ax is not None]


def index_tree(tree, i):
    return tree_map(lambda a: a[i], tree)


def stack_tree(items):
    first = items[0]
    if isinstance(first, dict):
        return {k: stack_tree([it[k] for it in items]) for k in first}
    if isinstance(first, tuple | list):
        return _rebuild(first, [stack_tree([it[j] for it in items]) for j in range(len(first))])
    if first is None:
        return None
    return torch.stack([x if isinstance(x, torch.Tensor) else torch.as_tensor(x) for x in items])
