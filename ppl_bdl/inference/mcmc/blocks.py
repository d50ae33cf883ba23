"""Arithmetic over a kernel's position: one array, or a tuple of per-site blocks.

SG-MCMC kernels keep their position (and velocity, preconditioner) as the driver gives it: the
driver's loop gives a tuple of blocks, one per latent site in its unconstrained shape
(:meth:`~ppl_bdl.trace.layout.LatentLayout.blocks`), so the model reads each site without slicing a
flat vector and its gradient comes back per site without a concatenation; anything else (an EBM
chain, a kernel's docstring example) may pass one plain array, a one-leaf tree. These functions
treat both alike: a tuple or list is a tree of its items, anything else one leaf.

The noise of a step is one flat draw split into the leaves' shapes (:func:`normal_like`), so a
kernel draws the same numbers whichever way its position is laid out (in blocks or flat).

Example
-------
>>> import ppl_bdl as bdl
>>> from ppl_bdl.inference.mcmc import blocks
>>> backend = bdl.backends.get("numpyro")
>>> with backend.activate():
...     tree = (backend.asarray([[1.0, 2.0]]), backend.asarray([2.0]))
...     float(blocks.norm(tree)), blocks.size(tree)
(3.0, 3)
>>> with backend.activate():
...     flat = bdl.random.normal(bdl.random.key(0), (3,))
...     split = blocks.normal_like(bdl.random.key(0), tree)
...     bool((blocks.join(split) == flat).all())
True
"""

from __future__ import annotations

import math
from typing import Any

from ppl_bdl.dsl import math as bm
from ppl_bdl.dsl import random as br


def leaves(tree) -> list:
    """The arrays of ``tree``: its items (a tuple or list), or ``[tree]``."""
    return list(tree) if isinstance(tree, tuple | list) else [tree]


def tree_map(fn, *trees):
    """``fn`` applied leaf by leaf to trees of one structure (a tuple stays a tuple)."""
    first = trees[0]
    if isinstance(first, tuple | list):
        return type(first)(fn(*items) for items in zip(*trees, strict=True))
    return fn(*trees)


def size(tree) -> int:
    """The number of numbers in ``tree``."""
    return sum(math.prod(tuple(leaf.shape)) for leaf in leaves(tree))


def sum_squares(tree):
    """Σ x² over every number of ``tree``."""
    return sum_over(tree, lambda leaf: bm.sum(leaf * leaf))


def sum_over(tree, fn):
    """Σ over the leaves of ``fn(leaf)`` (a scalar each)."""
    parts = [fn(leaf) for leaf in leaves(tree)]
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    return total


def norm(tree):
    """The Euclidean norm of all of ``tree``'s numbers together (``bm.norm`` of one array)."""
    if not isinstance(tree, tuple | list):
        return bm.norm(tree)
    return bm.sqrt(sum_squares(tree))


def mean(tree):
    """The mean of all of ``tree``'s numbers together."""
    if not isinstance(tree, tuple | list):
        return bm.mean(tree)
    return sum_over(tree, bm.sum) / size(tree)


def split_like(flat, tree):
    """The flat vector ``flat`` (as long as ``tree`` has numbers) cut into ``tree``'s leaves'
    shapes, in order; ``flat`` reshaped to ``tree``'s shape where ``tree`` is one array."""
    if not isinstance(tree, tuple | list):
        return bm.reshape(flat, tuple(tree.shape))
    shapes = [tuple(leaf.shape) for leaf in tree]
    pieces = bm.split(flat, [math.prod(s) for s in shapes], axis=-1) if shapes else []
    return type(tree)(bm.reshape(p, s) for p, s in zip(pieces, shapes, strict=True))


def normal_like(key, tree):
    """Standard normal draws shaped like ``tree``: ONE flat draw of all its numbers, split into
    its leaves (so blocks get the numbers a flat position of the same size would)."""
    if not isinstance(tree, tuple | list):
        return br.normal(key, tuple(tree.shape))
    return split_like(br.normal(key, (size(tree),)), tree)


def zeros_like(tree):
    """Zeros shaped like ``tree``."""
    return tree_map(bm.zeros_like, tree)


def scalar_zero(tree) -> Any:
    """A floating 0 of ``tree``'s dtype and device (a counter in a kernel's state)."""
    return bm.sum(leaves(tree)[0] * 0.0)


def join(tree):
    """``tree``'s numbers in one flat vector (its leaves flattened, in order)."""
    if not isinstance(tree, tuple | list):
        return bm.reshape(tree, (-1,))
    return bm.concatenate([bm.reshape(leaf, (-1,)) for leaf in tree])
