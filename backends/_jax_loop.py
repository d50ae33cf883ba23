"""The NumPyro backend's compiled loop over a chunk of steps: one ``jax.jit`` per fit.

The runner compiles once per fit (the chunk's length, the number of kept rows and the shapes of
the inputs are its static arguments; how many of the chunk's steps run is a traced count), so
warmup, sampling and a shorter last chunk share one program. The body is the core's step; around
it the loop only counts steps, records the first step whose ``ok`` is False (``failed_at``) and
writes ``emit(carry)`` into a preallocated buffer of kept rows at kept steps, so only the kept
draws ever leave the device. Its shape depends on the device:

- **CPU**: a ``lax.while_loop`` that runs the chunk's real steps and stops right after the first
  failed step, whose update it has applied (``failed_step_applied``: the driver re-runs the
  chunk up to that step for the state before it). No step's update is gated: a select between
  the old and the new state on ``ok`` made XLA's CPU backend fuse the step's noise into every
  consumer and cost a quarter of a mean-field VI step (docs/benchmarks.md).
- **GPU**: a ``lax.scan`` of known length (a loop whose condition depends on the data makes the
  host wait for the device every step), where each update is kept only while no step has failed
  (a select, which fuses into the update's own kernel).

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


def compile_loop(step, emit, on_cpu: bool | None = None):
    """The runner of ``step`` over chunks (see :meth:`ppl_bdl.backend_protocol.Autodiff.compile_loop`).

    ``on_cpu`` picks the loop's shape (default: whether JAX's default device is a CPU).
    """
    if on_cpu is None:
        on_cpu = jax.default_backend() == "cpu"
    # One jitted step: tracing it for the shapes of its infos (the while loop preallocates them)
    # fills jit's cache, so the loop's body reuses that trace.
    step = jax.jit(step)
    run = _while_run(step, emit) if on_cpu else _scan_run(step, emit)
    compiled = jax.jit(run, static_argnames=("num_rows",))

    @functools.wraps(run)
    def runner(carry, xs, data, num_steps: int, num_rows: int) -> LoopResult:
        out = compiled(carry, xs, data, jnp.asarray(num_steps, jnp.int32), num_rows=num_rows)
        return out._replace(failed_step_applied=on_cpu)

    runner.compiled = compiled
    return runner


def _while_run(step, emit):
    def run(carry, xs, data, num_steps, num_rows):
        length = jax.tree_util.tree_leaves(xs)[0].shape[0]
        _, info, _ = jax.eval_shape(step, carry, _at(xs, 0), data)
        infos = jax.tree_util.tree_map(lambda s: jnp.zeros((length,) + s.shape, s.dtype), info)
        zero = jnp.asarray(0, jnp.int32)
        init = (carry, _row_buffers(emit(carry), num_rows), infos, zero, zero, zero - 1)

        def running(state):
            t, failed_at = state[-2:]
            return (t < num_steps) & (failed_at < 0)

        def body(state):
            carry, rows, infos, slot, t, failed_at = state
            x = _at(xs, t)
            new, info, ok = step(carry, x, data)
            infos = _write(infos, t, info)
            keep = ok & x["keep"]
            rows = lax.cond(keep, lambda b: _write(b, slot, emit(new)), lambda b: b, rows)
            failed_at = jnp.where(ok, failed_at, t)
            return new, rows, infos, slot + keep.astype(slot.dtype), t + 1, failed_at

        carry, rows, infos, kept, _, failed_at = lax.while_loop(running, body, init)
        return LoopResult(carry, infos, _first(rows, num_rows), failed_at, kept)

    return run


def _scan_run(step, emit):
    def run(carry, xs, data, num_steps, num_rows):
        def body(state, x):
            carry, rows, slot, failed_at, t = state
            new, info, ok = step(carry, x, data)
            live = (failed_at < 0) & (t < num_steps)
            failed_at = jnp.where(live & ~ok, t, failed_at)
            proceed = live & ok
            carry = jax.tree_util.tree_map(lambda a, b: jnp.where(proceed, a, b), new, carry)
            keep = proceed & x["keep"]
            # Every step writes its row into the next free slot (the buffer has one spare row)
            # and only a kept step advances the slot: no conditional for the host to wait on.
            rows = _write(rows, slot, emit(carry))
            return (carry, rows, slot + keep.astype(slot.dtype), failed_at, t + 1), info

        zero = jnp.asarray(0, jnp.int32)
        init = (carry, _row_buffers(emit(carry), num_rows), zero, zero - 1, zero)
        (carry, rows, kept, failed_at, _), infos = lax.scan(body, init, xs)
        return LoopResult(carry, infos, _first(rows, num_rows), failed_at, kept)

    return run


def _at(xs, t):
    return jax.tree_util.tree_map(lambda a: lax.dynamic_index_in_dim(a, t, keepdims=False), xs)


def _row_buffers(example, num_rows: int):
    """Room for ``num_rows`` kept rows and one spare."""
    return jax.tree_util.tree_map(
        lambda a: jnp.zeros((num_rows + 1,) + jnp.shape(a), jnp.result_type(a)), example
    )


def _write(buffers, index, value):
    """``value`` written into row ``index`` of ``buffers`` (a tree of stacked arrays)."""
    return jax.tree_util.tree_map(
        lambda b, v: lax.dynamic_update_index_in_dim(b, v.astype(b.dtype), index, 0),
        buffers,
        value,
    )


def _first(rows, num_rows: int):
    return jax.tree_util.tree_map(lambda b: b[:num_rows], rows)
