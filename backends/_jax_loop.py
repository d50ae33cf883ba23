"""The NumPyro backend's compiled loop: one ``jax.jit`` of one ``lax.scan`` over a chunk of steps.

The runner compiles once per fit (the chunk's length, the number of kept rows and the shapes of
the inputs are its static arguments; how many of the chunk's steps run is a traced count), so
warmup, sampling and a shorter last chunk share one program. The scanned body is the core's
step; around it the loop only

- stops applying steps after the first one whose ``ok`` is False (``failed_at`` records it), and
  after the chunk's real steps (a shorter last chunk);
- writes ``emit(carry)`` into a preallocated buffer of kept rows at kept steps, so only the kept
  draws ever leave the device.

Example
-------
>>> import jax.numpy as jnp, numpy as np
>>> from ppl_bdl.backends._jax_loop import compile_loop
>>> def step(carry, x, data):
...     new = carry + data * x["inc"]
...     return new, {"value": new}, jnp.isfinite(new)
>>> run = compile_loop(step, emit=lambda c: c)
>>> xs = {"inc": jnp.arange(5.0), "keep": jnp.asarray([0, 1, 0, 1, 1], bool)}
>>> result = run(jnp.asarray(0.0), xs, jnp.asarray(2.0), num_steps=4, num_rows=3)
>>> float(result.carry), int(result.kept), np.asarray(result.rows).tolist()[:2]
(12.0, 2, [2.0, 12.0])
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from ..backend_protocol import LoopResult


def _tree_select(pred, new, old):
    return jax.tree_util.tree_map(lambda a, b: jnp.where(pred, a, b), new, old)


def _store(rows, slot, value, keep, use_cond: bool):
    """Write ``value`` into row ``slot`` of the buffer when ``keep``.

    On CPU a conditional costs nothing, so only kept steps write. On GPUs a conditional may make
    the host wait for the predicate every step, so every step writes its row into the next free
    slot (the buffer has one spare row) and only a kept step advances the slot."""

    def write(buffers):
        return jax.tree_util.tree_map(
            lambda b, v: lax.dynamic_update_index_in_dim(b, v.astype(b.dtype), slot, 0),
            buffers,
            value,
        )

    if use_cond:
        return lax.cond(keep, write, lambda b: b, rows)
    return write(rows)


def compile_loop(step, emit, use_cond: bool | None = None):
    """The runner of ``step`` over chunks (see :meth:`ppl_bdl.backend_protocol.Autodiff.compile_loop`).

    ``use_cond`` picks how kept rows are written (default: conditionally on CPU only).
    """
    if use_cond is None:
        use_cond = jax.default_backend() == "cpu"

    def run(carry, xs, data, num_steps, num_rows):
        example = emit(carry)
        rows = jax.tree_util.tree_map(
            lambda a: jnp.zeros((num_rows + 1,) + jnp.shape(a), jnp.result_type(a)), example
        )

        def body(state, x):
            carry, rows, slot, failed_at, t = state
            new, info, ok = step(carry, x, data)
            live = (failed_at < 0) & (t < num_steps)
            failed_at = jnp.where(live & ~ok, t, failed_at)
            proceed = live & ok
            carry = _tree_select(proceed, new, carry)
            keep = proceed & x["keep"]
            rows = _store(rows, slot, emit(carry), keep, use_cond)
            slot = slot + keep.astype(slot.dtype)
            return (carry, rows, slot, failed_at, t + 1), info

        zero = jnp.asarray(0, jnp.int32)
        init = (carry, rows, zero, jnp.asarray(-1, jnp.int32), zero)
        (carry, rows, kept, failed_at, _), infos = lax.scan(body, init, xs)
        rows = jax.tree_util.tree_map(lambda b: b[:num_rows], rows)
        return LoopResult(carry, infos, rows, failed_at, kept)

    compiled = jax.jit(run, static_argnames=("num_rows",))

    @functools.wraps(run)
    def runner(carry, xs, data, num_steps: int, num_rows: int) -> LoopResult:
        return compiled(carry, xs, data, jnp.asarray(num_steps, jnp.int32), num_rows=num_rows)

    runner.compiled = compiled
    return runner
