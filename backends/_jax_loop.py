"""The NumPyro backend's compiled loop over a chunk of steps: one ``jax.jit`` per fit.

The body is the core's step; around it the loop does only what a hand-written ``lax.scan``
does (a counter, each step's info stored) plus an ``&`` of each step's "info is finite" into a
flag per chain (per leading entry of each info; read on the host at the chunk's end), and
``emit(state)`` written at kept steps. The program compiles once per fit (the chunk's
length, the number of kept rows and the shapes are static; how many steps run is a traced
count), so warmup, sampling and a shorter last chunk share it. Its shape depends on the device:

- **CPU**: the steps run ungated, and nothing in a step branches on its result (XLA's CPU
  runtime moved a loop body whose kernels wait on a per-step scalar onto its thread pool, which
  cost up to half a toy step: docs/benchmarks.md). Kept rows cost nothing per step: the loop is
  a loop over segments, each "run the steps up to the next kept one (an inner loop), then write
  ``emit(state)`` into the next row". When a chunk comes back with its flag down, the runner
  runs that chunk again from its start with the gated loop below, which stops at the failed
  step with the state before it (the chunk's arrays are never changed in place).
- **GPU**: the gated loop: a ``lax.scan`` of known length (a loop whose trip count is data
  makes the host wait for the device every step), each update kept only while no step has
  failed (a select, which fuses into the update's own kernel).
- **Chains over several devices** (``mesh``, a state whose chain axis is split over it): the
  program above runs under ``shard_map``, each device its own block of chains and nothing shared
  between devices in a step (a NUTS tree on one device does not wait for the deepest tree on
  another). The "every step finite" flag is kept per chain (each info's leading axis) and read
  at the chunk's end, never reduced across devices per step; on GPUs the steps run ungated (a
  scan of known length), the CPU's segments as above. A chunk with a failed step is run again
  with the gated loop over the whole mesh, which stops every chain at the first failed step.

Example
-------
>>> import jax.numpy as jnp, numpy as np
>>> from ppl_bdl.backends._jax_loop import compile_loop
>>> def step(state, x, data):
...     new = state + data * x["inc"]
...     return new, {"value": new}
>>> run = compile_loop(step, emit=lambda s: s)
>>> xs = {"inc": jnp.arange(5.0)}
>>> result = run(jnp.asarray(0.0), xs, jnp.asarray(2.0), np.array([0, 1, 0, 1], bool), 3)
>>> float(result.state), result.rows.tolist(), result.infos["value"].tolist()
(12.0, [2.0, 12.0], [0.0, 2.0, 6.0, 12.0])
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec

from ..backend_protocol import LoopResult
from ._jax_shard import AXIS


class _Chunk(NamedTuple):
    state: object
    ok: object
    rows: object
    infos: object
    kept: object
    failed_at: object


def compile_loop(step, emit, on_cpu: bool | None = None, mesh=None):
    """The runner of ``step`` over chunks (see :meth:`ppl_bdl.backend_protocol.Autodiff.compile_loop`).

    ``on_cpu`` picks the loop's shape (default: whether JAX's default device is a CPU);
    ``mesh``: chains split over its devices run each on its own device (``shard_map``) when
    the state comes split along its leading (chain) axis.
    """
    if on_cpu is None:
        on_cpu = jax.default_backend() == "cpu"
    # One jitted step: tracing it for the shapes of its infos fills jit's cache, so the loop's
    # body reuses that trace.
    step = jax.jit(step)
    fast = jax.jit(_segment_run(step, emit), static_argnames=("num_rows", "trace"))
    gated = jax.jit(_gated_run(step, emit), static_argnames=("num_rows",))
    split = {}
    if mesh is not None:
        shape = _segment_run(step, emit) if on_cpu else _scan_run(step, emit)
        split = {
            trace: jax.jit(_per_device(shape, mesh, trace), static_argnames=("num_rows", "specs"))
            for trace in (False, True)
        }

    def runner(state, xs, data, keep, num_rows: int, trace: bool = True) -> LoopResult:
        keep = np.asarray(keep, bool)
        steps, kept = len(keep), int(keep.sum())
        if kept > num_rows:
            raise ValueError(f"{kept} kept steps in a chunk with room for {num_rows} rows")
        count = jnp.asarray(steps, jnp.int32)
        length = jax.tree_util.tree_leaves(xs)[0].shape[0]
        mask = np.pad(keep, (0, length - steps))
        per_device = bool(split) and _split_chains(state)
        if on_cpu or per_device:
            if on_cpu:
                ends = np.full(num_rows + 1, steps, np.int32)
                ends[:kept] = np.flatnonzero(keep) + 1
                ends = jnp.asarray(ends)
            if per_device:
                last = ends if on_cpu else jnp.asarray(mask)
                specs = _specs(xs)
                out = split[trace](state, xs, data, count, last, num_rows=num_rows, specs=specs)
            else:
                out = fast(state, xs, data, count, ends, num_rows=num_rows, trace=trace)
            if _all(out.ok):
                out = out._replace(kept=kept, failed_at=-1)
                if on_cpu:
                    return _read(out, steps, None if trace else kept)
                return _only_kept(_read(out, steps), mask, trace)
        out = gated(state, xs, data, count, jnp.asarray(mask), num_rows=num_rows)
        return _only_kept(_read(out, steps), mask, trace)

    runner.fast, runner.gated, runner.split = fast, gated, split
    return runner


def _only_kept(result: LoopResult, mask: np.ndarray, trace: bool) -> LoopResult:
    """Every step's infos (``trace``), else the kept steps' only."""
    if trace:
        return result
    return result._replace(infos={k: v[mask[: len(v)]] for k, v in result.infos.items()})


def _split_chains(state) -> bool:
    """Whether the state comes split over several devices along its leading (chain) axis."""
    leaf = jax.tree_util.tree_leaves(state)[0]
    spec = getattr(leaf.sharding, "spec", None)
    return bool(spec) and spec[0] == AXIS and len(leaf.sharding.device_set) > 1


def _per_device(shape, mesh, trace: bool):
    """``shape``'s chunk program run by each device on its own chains (``shard_map``): the
    state and the outputs split along the chain axis (rows and infos: their second axis, after
    the rows' or steps'), the per-step inputs as placed (keys and indices split along their
    chain axis), the data and the step counts replicated."""
    chains, stacked = PartitionSpec(AXIS), PartitionSpec(None, AXIS)
    out = _Chunk(chains, chains, stacked, stacked, PartitionSpec(), PartitionSpec())

    def run(state, xs, data, num_steps, last, num_rows, specs):
        def body(state, xs, data, num_steps, last):
            return shape(state, xs, data, num_steps, last, num_rows=num_rows, trace=trace)

        treedef, leaves = specs
        ins = (chains, jax.tree_util.tree_unflatten(treedef, leaves), PartitionSpec(),
               PartitionSpec(), PartitionSpec())  # fmt: skip
        return jax.shard_map(body, mesh=mesh, in_specs=ins, out_specs=out, check_vma=False)(
            state, xs, data, num_steps, last
        )

    return run


def _specs(tree) -> tuple:
    """Each array's partition spec as placed (replicated if it has none), hashable (a static
    argument of the compiled program)."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    specs = tuple(getattr(a.sharding, "spec", None) or PartitionSpec() for a in leaves)
    return treedef, specs


def _segment_run(step, emit):
    """The CPU shape: segments of steps, each ending at a kept step (see the module docstring).
    ``ends[r]`` is the step after the r-th kept one; ``ends[kept:]`` is the chunk's end.
    ``trace``: every step's info is stored, else the kept steps' only (written with the rows)."""

    def run(state, xs, data, num_steps, ends, num_rows, trace):
        infos = _info_buffers(step, state, xs, data, None if trace else num_rows + 1)
        last = jax.tree_util.tree_map(lambda a: a[0], infos)

        def one(carry):
            state, ok, t, infos, _ = carry
            new, info = step(state, _at(xs, t), data)
            infos = _write(infos, t, info) if trace else infos
            return new, _and(ok, _flags(info)), t + 1, infos, info

        def segment(carry):
            state, ok, t, r, rows, infos, last = carry
            end = ends[r]
            state, ok, t, infos, last = lax.while_loop(
                lambda c: c[2] < end, one, (state, ok, t, infos, last)
            )
            infos = infos if trace else _write(infos, r, last)
            return state, ok, t, r + 1, _write(rows, r, emit(state)), infos, last

        zero = jnp.asarray(0, jnp.int32)
        rows = _row_buffers(emit(state), num_rows)
        init = (state, _flags(last), zero, zero, rows, infos, last)
        state, ok, _, _, rows, infos, _ = lax.while_loop(lambda c: c[2] < num_steps, segment, init)
        return _Chunk(state, ok, rows, infos, None, None)

    return run


def _scan_run(step, emit):
    """The GPU shape of chains split over devices: a scan of the chunk's compiled length, the
    steps ungated (each chain's finite flag carried, read at the end), the steps past
    ``num_steps`` not applied; a chunk with a failed step is run again gated."""

    def run(state, xs, data, num_steps, keep, num_rows, trace):
        def body(carry, x):
            state, ok, rows, slot, t = carry
            new, info = step(state, x, data)
            live = t < num_steps
            state = jax.tree_util.tree_map(lambda a, b: jnp.where(live, a, b), new, state)
            ok = _and(ok, jax.tree_util.tree_map(lambda f: f | ~live, _flags(info)))
            rows = _write(rows, slot, emit(state))
            slot = slot + (live & x["keep"]).astype(slot.dtype)
            return (state, ok, rows, slot, t + 1), info

        zero = jnp.asarray(0, jnp.int32)
        ok = _flags(jax.tree_util.tree_map(lambda a: a[0], _info_buffers(step, state, xs, data, 1)))
        init = (state, ok, _row_buffers(emit(state), num_rows), zero, zero)
        (state, ok, rows, _, _), infos = lax.scan(body, init, dict(xs, keep=keep))
        return _Chunk(state, ok, rows, infos, None, None)

    return run


def _gated_run(step, emit):
    """The gated shape: a scan of the chunk's compiled length whose updates are kept only while
    no step has failed; stops changing anything at the first failed step."""

    def run(state, xs, data, num_steps, keep, num_rows):
        def body(carry, x):
            state, rows, slot, failed_at, t = carry
            new, info = step(state, x, data)
            live = (failed_at < 0) & (t < num_steps)
            ok = _finite(info)
            failed_at = jnp.where(live & ~ok, t, failed_at)
            proceed = live & ok
            state = jax.tree_util.tree_map(lambda a, b: jnp.where(proceed, a, b), new, state)
            # Every step writes its row into the next free slot (the buffer has one spare row)
            # and only a kept step advances the slot: no conditional for the host to wait on.
            rows = _write(rows, slot, emit(state))
            slot = slot + (proceed & x["keep"]).astype(slot.dtype)
            return (state, rows, slot, failed_at, t + 1), info

        zero = jnp.asarray(0, jnp.int32)
        init = (state, _row_buffers(emit(state), num_rows), zero, zero - 1, zero)
        (state, rows, kept, failed_at, _), infos = lax.scan(body, init, dict(xs, keep=keep))
        return _Chunk(state, failed_at < 0, rows, infos, kept, failed_at)

    return run


def _read(out: _Chunk, steps: int, kept_infos: int | None = None) -> LoopResult:
    """The chunk's results on the host: rows and infos up to the failed step (if any); infos
    stored for the kept steps only (``kept_infos`` of them), not per step."""
    kept, failed_at = int(out.kept), int(out.failed_at)
    end = steps if failed_at < 0 else failed_at
    end = end if kept_infos is None else kept_infos
    infos = jax.tree_util.tree_map(lambda a: np.asarray(a), jax.device_get(out.infos))
    rows = None
    if kept:
        rows = jax.tree_util.tree_map(lambda a: np.asarray(a[:kept]), jax.device_get(out.rows))
    failed = None if failed_at < 0 else {k: v[failed_at] for k, v in infos.items()}
    return LoopResult(out.state, {k: v[:end] for k, v in infos.items()}, rows, failed_at, failed)


def _flags(info: dict):
    """Per leaf of ``info``: whether its floats are finite, over every axis but the leading one
    (the chain axis of a vectorised step: no reduction across the devices chains are split
    over). A leaf that holds no floats is finite."""

    def flag(value):
        value = jnp.asarray(value)
        if not jnp.issubdtype(value.dtype, jnp.floating):
            return jnp.ones(value.shape[:1], bool)
        if value.ndim > 1:
            value = jnp.sum(value, axis=tuple(range(1, value.ndim)))
        return jnp.isfinite(value)

    return jax.tree_util.tree_map(flag, info)


def _and(flags, more):
    return jax.tree_util.tree_map(jnp.logical_and, flags, more)


def _all(flags) -> bool:
    """Whether every flag is up (read on the host, once per chunk)."""
    return all(bool(np.all(f)) for f in jax.tree_util.tree_leaves(jax.device_get(flags)))


def _finite(info: dict):
    """A scalar boolean: every floating number in ``info`` is finite."""
    ok = jnp.asarray(True)
    for value in jax.tree_util.tree_leaves(info):
        if jnp.issubdtype(jnp.result_type(value), jnp.floating):
            ok = ok & jnp.isfinite(jnp.sum(value))
    return ok


def _info_buffers(step, state, xs, data, length: int | None = None):
    """Zeros for ``length`` steps' infos (default: the chunk's compiled length)."""
    length = length or jax.tree_util.tree_leaves(xs)[0].shape[0]
    _, info = jax.eval_shape(step, state, _at(xs, 0), data)
    return jax.tree_util.tree_map(lambda s: jnp.zeros((length,) + s.shape, s.dtype), info)


def _at(xs, t):
    # An unsigned index: JAX wraps a signed one that could be negative with a select per step.
    t = jnp.asarray(t).astype(jnp.uint32)
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
