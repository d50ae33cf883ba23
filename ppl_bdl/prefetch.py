"""Standard-normal draws of a compiled loop, made for a whole chunk of steps at once.

Inside a JAX loop body every ``jax.random.normal`` call pays a fixed cost of several µs on CPU,
which for a small network is as much as its gradient. Drawn for a whole chunk in one vectorised
call before the loop, the same draws cost a fraction of that. Kernels and guides need not know:
they call :func:`ppl_bdl.random.normal` as usual. The loop records which draws one step makes
(their shapes, in order), draws them for every step of the chunk up front, and replays them to
the step in the same order.

Nothing changes statistically: each replayed draw is an independent standard normal from its
own key (the step's key, split once per draw), so a fixed seed still gives fixed draws and a
chain's draws depend only on its own keys.

Example
-------
>>> import ppl_bdl as bdl
>>> from ppl_bdl import prefetch, random as br
>>> be = bdl.backends.get("numpyro")
>>> def step(key):
...     return br.normal(key, (3,)) + br.normal(key, (2, 3))
>>> with be.activate():
...     shapes = prefetch.record_normal_shapes(be, step, br.key(0))
...     draws = prefetch.draw_normals(be, be.random.keys(br.key(1), 5), shapes)
...     with prefetch.replaying(draws[0][0], draws[1][0]):
...         out = step(br.key(2))
>>> shapes, [tuple(d.shape) for d in draws], tuple(out.shape)
([(3,), (2, 3)], [(5, 3), (5, 2, 3)], (2, 3))
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

#: Floats of pre-drawn normals per compiled chunk (64 MB in float32); chunks shrink to fit.
MAX_PREFETCH_FLOATS = 16_000_000

_sources: list = []


def active_source():
    """The innermost recording or replaying source, or None (draw from the key as usual)."""
    return _sources[-1] if _sources else None


@contextlib.contextmanager
def _using(source) -> Iterator[Any]:
    _sources.append(source)
    try:
        yield source
    finally:
        _sources.pop()


class _Recorder:
    """Notes the shape of each standard-normal draw and makes it from the key."""

    def __init__(self):
        self.shapes: list[tuple[int, ...]] = []

    def normal(self, draw: Callable, key, shape):
        self.shapes.append(tuple(int(s) for s in shape))
        return draw(key, shape)


class _Replay:
    """Hands out pre-drawn arrays in the order the step asks for them."""

    def __init__(self, draws: Sequence):
        self.draws, self.used = list(draws), 0

    def normal(self, draw: Callable, key, shape):
        if self.used >= len(self.draws):
            raise RuntimeError(
                f"a loop step drew {self.used + 1} standard normals where its recorded step drew "
                f"{len(self.draws)}: a step must make the same draws every time it is traced."
            )
        value = self.draws[self.used]
        if tuple(value.shape) != tuple(shape):
            raise RuntimeError(
                f"standard-normal draw {self.used} of a loop step has shape {tuple(shape)}; it was "
                f"recorded as {tuple(value.shape)}. A step must make the same draws every time."
            )
        self.used += 1
        return value


def record_normal_shapes(backend, fn: Callable, *args) -> list[tuple[int, ...]]:
    """The shapes of the standard-normal draws one call ``fn(*args)`` makes, in order.

    ``fn`` is evaluated abstractly (shapes only) with :meth:`Backend.eval_shape`.
    """
    recorder = _Recorder()
    with _using(recorder):
        backend.eval_shape(fn, *args)
    return recorder.shapes


def draw_normals(backend, keys, shapes: Sequence[tuple[int, ...]], batch_dims: int = 1) -> list:
    """For every key in ``keys`` (``batch_dims`` leading axes), one standard-normal array of each
    shape in ``shapes``: arrays shaped ``keys' batch axes + shape``."""
    if not shapes:
        return []

    def per_key(key):
        subkeys = backend.random.split(key, len(shapes)) if len(shapes) > 1 else (key,)
        return [backend.random.normal(k, s) for k, s in zip(subkeys, shapes, strict=True)]

    for _ in range(batch_dims):
        per_key = backend.vmap(per_key)
    return list(per_key(keys))


def replaying(*draws) -> contextlib.AbstractContextManager:
    """Within the block, the i-th standard-normal draw returns ``draws[i]``."""
    return _using(_Replay(draws))


def chunk_limit(shapes: Sequence[tuple[int, ...]], copies: int = 1) -> int:
    """The most steps per chunk whose pre-drawn normals (for ``copies`` chains) fit the budget."""
    per_step = sum(math.prod(shape) for shape in shapes) * max(1, copies)
    return max(1, MAX_PREFETCH_FLOATS // max(1, per_step))


def prefetching_loop(backend, step: Callable, shapes: Sequence[tuple[int, ...]]):
    """``(prologue, step)`` for :meth:`Backend.compile_loop` that pre-draw the normals of
    ``step(carry, key, x)`` (recorded as ``shapes``) from the loop's per-step keys."""

    def prologue(carry, keys, xs):
        return {"x": xs, "normals": draw_normals(backend, keys, shapes)}

    def replayed_step(carry, key, x):
        with replaying(*x["normals"]):
            return step(carry, key, x["x"])

    return prologue, replayed_step
