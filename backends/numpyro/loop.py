"""The NumPyro backend's compiled loop over a chunk of steps: one ``jax.jit`` per transition
(kept by the core's program cache, so fits of the same model share it).

The body is the core's step; around it the loop does only what a hand-written ``lax.scan``
does (a counter, the kept steps' draws written) plus an ``&`` of each step's "finite" into one
flag. The program compiles once per fit (the chunk's length, the number of kept rows and the
shapes are static; how many steps run is a traced count), so warmup, sampling and a shorter
last chunk share it. Its shape depends on the device:

- **CPU**: the steps run ungated, and nothing in a step branches on its result (XLA's CPU
  runtime moved a loop body whose kernels wait on a per-step scalar onto its thread pool, which
  cost up to half a toy step: docs/benchmarks.md). The loop is a loop over segments, each "run
  the steps up to the next kept one (an inner loop), then the kept step, and write its
  ``emit(state)`` and info into the next row". The steps between kept ones run **lean**: their
  infos are never read (unless the caller asked for every step's, ``trace=True``), so XLA drops
  what only an info needs (a potential computed only to be checked, a gradient's norm), and
  nothing in them is checked; a kept step runs whole, its info and its new state both checked,
  and the chunk's last state is checked. A state that turned non-finite stays so (every
  kernel's next position is computed from it), so a failure between kept steps shows at the
  next check; a per-step flag of the new state cost a toy net's step four kernels (its
  reductions) out of 32. When a chunk comes back with its flag down, the runner runs that chunk
  again from its start with the gated loop below, which checks every step's info and new
  state and stops at the first failed step with the state before it (the chunk's arrays are
  never changed in place).
- **CPU without the segments** (``cpu_segments=False``, the NumPyro backend's
  ``cpu_tricks=False``): the plain shape, the ungated ``lax.scan`` of known length described
  under chains over several devices below (each step whole, every info stored), a failed chunk
  run again gated. The same steps in the same order: the kept draws equal the segments' (see
  ``tests/test_cpu_tricks.py``).
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
>>> from ppl_bdl.backends.numpyro.loop import compile_loop
>>> def step(state, x, data, t):
...     new = state + data * x["inc"]
...     return new, {"value": new, "t": t}
>>> run = compile_loop(step, emit=lambda s: s)
>>> xs = {"inc": jnp.arange(5.0)}
>>> keep = np.array([0, 1, 0, 1, 0], bool)
>>> result = run(jnp.asarray(0.0), xs, jnp.asarray(2.0), keep, steps=4, first=10, num_rows=3)
>>> float(result.state), result.rows.tolist(), result.infos["value"].tolist()
(12.0, [2.0, 12.0], [0.0, 2.0, 6.0, 12.0])
>>> result.infos["t"].tolist()
[10, 11, 12, 13]
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec

from ppl_bdl.backend_protocol import LoopResult
from ppl_bdl.backends.numpyro.shard import AXIS


class _Chunk(NamedTuple):
    state: object
    ok: object
    rows: object
    infos: object
    kept: object
    failed_at: object


def compile_loop(step, emit, on_cpu: bool | None = None, mesh=None, cpu_segments: bool = True):
    """The runner of ``step`` over chunks (see :meth:`ppl_bdl.backend_protocol.Autodiff.compile_loop`).

    ``on_cpu`` picks the loop's shape (default: whether JAX's default device is a CPU);
    ``mesh``: chains split over its devices run each on its own device (``shard_map``) when
    the state comes split along its leading (chain) axis; ``cpu_segments``: on the CPU, the
    segments (True) or the plain ungated scan (False). The runner's ``shape`` says which
    ungated program it tries first ("segments" or "scan"; one GPU runs the gated scan).
    """
    if on_cpu is None:
        on_cpu = jax.default_backend() == "cpu"
    segmented = on_cpu and cpu_segments
    # One jitted step: tracing it for the shapes of its infos fills jit's cache, so the loop's
    # body reuses that trace.
    step = jax.jit(step)
    statics = ("length", "num_rows", "trace")
    fast = jax.jit(_segment_run(step, emit), static_argnames=statics)
    scan = jax.jit(_scan_run(step, emit, _finite), static_argnames=statics)
    gated = jax.jit(_gated_run(step, emit), static_argnames=("num_rows",))
    split = {}
    if mesh is not None:
        shape = _per_chain_segments(step, emit) if segmented else _scan_run(step, emit)
        names = ("length", "num_rows", "specs")
        split = {
            trace: jax.jit(_per_device(shape, mesh, trace), static_argnames=names)
            for trace in (False, True)
        }

    def run_chunk(
        state, xs, data, keep, steps: int, first: int, num_rows: int, trace: bool = True
    ) -> LoopResult:
        keep = np.asarray(keep, bool)
        real = keep[:steps]
        kept = int(real.sum())
        if kept > num_rows:
            raise ValueError(f"{kept} kept steps in a chunk with room for {num_rows} rows")
        mask = keep.copy()
        mask[steps:] = False
        per_device = bool(split) and _split_chains(state)
        if on_cpu or per_device:
            header = chunk_header(mask, steps, first, num_rows, segmented)
            if per_device:
                out = split[trace](
                    state,
                    xs,
                    data,
                    header,
                    mask,
                    length=len(keep),
                    num_rows=num_rows,
                    specs=(_specs(xs), _specs(data)),
                )
            elif segmented:
                out = fast(
                    state, xs, data, header, length=len(keep), num_rows=num_rows, trace=trace
                )
            else:
                sizes = dict(length=len(keep), num_rows=num_rows, trace=trace)
                out = scan(state, xs, data, header, mask, **sizes)
            ok, infos, rows = jax.device_get((out.ok, out.infos, out.rows))  # one read back
            if _all(ok):
                if not segmented and not trace:  # the scan stored every step's infos
                    infos = {k: np.asarray(v)[mask] for k, v in infos.items()}
                return _result(out.state, infos, rows, kept, steps if trace else kept)
        out = gated(state, xs, data, np.asarray([steps, first], np.int32), mask, num_rows=num_rows)
        failed_at, kept = int(out.failed_at), int(out.kept)
        infos, rows = jax.device_get((out.infos, out.rows))
        end = steps if failed_at < 0 else failed_at
        failed = None if failed_at < 0 else {k: np.asarray(v[failed_at]) for k, v in infos.items()}
        if not trace:
            infos = {k: np.asarray(v)[:end][mask[:end]] for k, v in infos.items()}
        result = _result(out.state, infos, rows, kept, end if trace else kept)
        return result._replace(failed_at=failed_at, failed_info=failed)

    def runner(*args, **kwargs) -> LoopResult:
        # A compiled call cannot stop part-way: a Ctrl-C pressed during it is held until it
        # returns, so its steps are kept (a second Ctrl-C raises at once).
        with held_interrupt() as pressed:
            result = run_chunk(*args, **kwargs)
        return result._replace(interrupted=True) if pressed else result

    runner.fast, runner.scan, runner.gated, runner.split = fast, scan, gated, split
    runner.shape = "segments" if segmented else "scan"
    return runner


@contextlib.contextmanager
def held_interrupt():
    """Hold a Ctrl-C (SIGINT) pressed in the block: the block runs on, and the list it yields
    is not empty afterwards. A second Ctrl-C raises ``KeyboardInterrupt`` at once. Outside the
    main thread, or where SIGINT has a handler of its own, nothing is held.

    >>> with held_interrupt() as pressed:
    ...     pass
    >>> pressed
    []
    """
    pressed: list = []
    main = threading.current_thread() is threading.main_thread()
    if not main or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield pressed
        return

    def hold(signum, frame):
        pressed.append(signum)
        signal.signal(signal.SIGINT, signal.default_int_handler)

    signal.signal(signal.SIGINT, hold)
    try:
        yield pressed
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def chunk_header(keep, steps: int, first: int, num_rows: int, on_cpu: bool = True) -> np.ndarray:
    """The one small array of what changes per chunk: the step count and the first step's
    number, then (the CPU's segments) the number of kept steps and the index of each.

    >>> chunk_header(np.array([0, 1, 0, 1], bool), 4, 10, 3).tolist()
    [4, 10, 2, 1, 3, 4, 4]
    """
    keep = np.asarray(keep, bool)[:steps]
    header = np.full(num_rows + 4 if on_cpu else 2, steps, np.int32)
    header[1] = first
    if on_cpu:
        header[2] = keep.sum()
        header[3 : 3 + header[2]] = np.flatnonzero(keep)
    return header


def _split_chains(state) -> bool:
    """Whether the state comes split over several devices along its leading (chain) axis."""
    leaf = jax.tree_util.tree_leaves(state)[0]
    spec = getattr(leaf.sharding, "spec", None)
    return bool(spec) and spec[0] == AXIS and len(leaf.sharding.device_set) > 1


def _per_device(shape, mesh, trace: bool):
    """``shape``'s chunk program run by each device on its own chains (``shard_map``): the
    state, the finite flags and the outputs split along the chain axis (rows and infos: their
    second axis, after the rows' or steps'), the per-step inputs and what every step reads as
    placed (keys, indices and a per-chain rate scale split along their chain axis; the data
    replicated), the header and the kept mask replicated. ``shape(state, xs, data, header,
    keep, length, num_rows, trace)``."""
    chains, stacked, one = PartitionSpec(AXIS), PartitionSpec(None, AXIS), PartitionSpec()
    out = _Chunk(chains, chains, stacked, stacked, one, one)

    def run(state, xs, data, header, keep, length, num_rows, specs):
        def body(state, xs, data, header, keep):
            return shape(state, xs, data, header, keep, length, num_rows, trace)

        (xs_tree, xs_specs), (data_tree, data_specs) = specs
        ins = (
            chains,
            jax.tree_util.tree_unflatten(xs_tree, xs_specs),
            jax.tree_util.tree_unflatten(data_tree, data_specs),
            one,
            one,
        )
        return jax.shard_map(body, mesh=mesh, in_specs=ins, out_specs=out, check_vma=False)(
            state, xs, data, header, keep
        )

    return run


def _specs(tree) -> tuple:
    """Each array's partition spec as placed (replicated if it has none), hashable (a static
    argument of the compiled program)."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    specs = tuple(getattr(a.sharding, "spec", None) or PartitionSpec() for a in leaves)
    return treedef, specs


def _segment_run(step, emit, flag=None):
    """The CPU shape: segments of steps, each ending at a kept step (see the module docstring).
    ``header``: the step count, the first step's number, the number of kept steps, then the
    index of each kept step. ``trace``: every step's info is stored (each step runs whole);
    else only the kept steps' infos are, and the steps between them run lean: their infos are
    never read, so XLA drops what only the info needs (the potential, a gradient's norm), and
    they check nothing (the kept steps and the chunk's last state are checked). ``flag``: the
    finite flag of a tree (default one for the step: :func:`_finite`; per chain:
    :func:`_chain_finite`)."""
    flag = flag or _finite

    def run(state, xs, data, header, length, num_rows, trace):
        num_steps, first, num_kept, kept_at = header[0], header[1], header[2], header[3:]
        zero = jnp.asarray(0, jnp.int32)
        rows = _row_buffers(emit(state), num_rows)
        infos = _info_buffers(step, state, xs, data, length if trace else num_rows + 1)
        ok = flag(state)

        def between(carry):
            """A step between kept ones: whole when every step's info is stored, else lean."""
            state, ok, t, infos = carry
            new, info = step(state, _at(xs, t), data, first + t)
            if trace:
                return new, ok & flag(info), t + 1, _write(infos, t, info)
            return new, ok, t + 1, infos

        def kept_segment(carry):
            state, ok, t, r, rows, infos = carry
            state, ok, t, infos = lax.while_loop(
                lambda c: c[2] < kept_at[r], between, (state, ok, t, infos)
            )
            state, info = step(state, _at(xs, t), data, first + t)
            ok = ok & flag(info) & flag(state)
            infos = _write(infos, t if trace else r, info)
            return state, ok, t + 1, r + 1, _write(rows, r, emit(state)), infos

        state, ok, t, _, rows, infos = lax.while_loop(
            lambda c: c[3] < num_kept, kept_segment, (state, ok, zero, zero, rows, infos)
        )
        state, ok, _, infos = lax.while_loop(
            lambda c: c[2] < num_steps, between, (state, ok, t, infos)
        )
        return _Chunk(state, ok & flag(state), rows, infos, None, None)

    return run


def _per_chain_segments(step, emit):
    """The CPU shape with a finite flag per chain, called as the split program calls a shape."""
    segments = _segment_run(step, emit, _chain_finite)

    def run(state, xs, data, header, keep, length, num_rows, trace):
        return segments(state, xs, data, header, length, num_rows, trace)

    return run


def _scan_run(step, emit, flag=None):
    """The GPU shape of chains split over devices, and the CPU's without segments: a scan of
    the chunk's compiled length, the steps ungated (the finite flag carried, read at the end),
    the steps past the header's count not applied; a chunk with a failed step is run again
    gated. ``flag``: the finite flag of a tree (default per chain: :func:`_chain_finite`; one
    device's: :func:`_finite`)."""
    flag = flag or _chain_finite

    def run(state, xs, data, header, keep, length, num_rows, trace):
        num_steps, first = header[0], header[1]

        def body(carry, x):
            state, ok, rows, slot, t = carry
            x, kept = x
            new, info = step(state, x, data, first + t)
            live = t < num_steps
            state = jax.tree_util.tree_map(lambda a, b: jnp.where(live, a, b), new, state)
            ok = ok & (flag(info) & flag(new) | ~live)
            rows = _write(rows, slot, emit(state))
            slot = slot + (live & kept).astype(slot.dtype)
            return (state, ok, rows, slot, t + 1), info

        zero = jnp.asarray(0, jnp.int32)
        ok = flag(state)
        init = (state, ok, _row_buffers(emit(state), num_rows), zero, zero)
        (state, ok, rows, _, _), infos = lax.scan(body, init, (xs, keep))
        return _Chunk(state, ok, rows, infos, None, None)

    return run


def _gated_run(step, emit):
    """The gated shape: a scan of the chunk's compiled length whose updates are kept only while
    no step has failed; stops changing anything at the first failed step. ``header``: the step
    count and the first step's number."""

    def run(state, xs, data, header, keep, num_rows):
        num_steps, first = header[0], header[1]

        def body(carry, x):
            state, rows, slot, failed_at, t = carry
            x, kept = x
            new, info = step(state, x, data, first + t)
            live = (failed_at < 0) & (t < num_steps)
            ok = _finite(info) & _finite(new)
            failed_at = jnp.where(live & ~ok, t, failed_at)
            proceed = live & ok
            state = jax.tree_util.tree_map(lambda a, b: jnp.where(proceed, a, b), new, state)
            # Every step writes its row into the next free slot (the buffer has one spare row)
            # and only a kept step advances the slot: no conditional for the host to wait on.
            rows = _write(rows, slot, emit(state))
            slot = slot + (proceed & kept).astype(slot.dtype)
            return (state, rows, slot, failed_at, t + 1), info

        zero = jnp.asarray(0, jnp.int32)
        init = (state, _row_buffers(emit(state), num_rows), zero, zero - 1, zero)
        (state, rows, kept, failed_at, _), infos = lax.scan(body, init, (xs, keep))
        return _Chunk(state, failed_at < 0, rows, infos, kept, failed_at)

    return run


def _result(state, infos, rows, kept: int, count: int) -> LoopResult:
    """A chunk's results on the host: the first ``kept`` rows (None if none), the first
    ``count`` infos."""
    infos = {k: np.asarray(v)[:count] for k, v in infos.items()}
    rows = jax.tree_util.tree_map(lambda a: np.asarray(a)[:kept], rows) if kept else None
    return LoopResult(state, infos, rows)


def _chain_finite(tree):
    """Per chain (the leading axis of a vectorised step's every leaf): whether every float in
    ``tree`` is finite, reduced over every axis but the chain axis (no reduction across the
    devices chains are split over). Leaves that hold no floats are finite."""
    ok = None
    for value in jax.tree_util.tree_leaves(tree):
        value = jnp.asarray(value)
        if not jnp.issubdtype(value.dtype, jnp.floating):
            continue
        if value.ndim > 1:
            value = jnp.sum(value, axis=tuple(range(1, value.ndim)))
        finite = jnp.isfinite(value)
        ok = finite if ok is None else ok & finite
    return jnp.asarray(True) if ok is None else ok


def _all(flags) -> bool:
    """Whether every flag is up (read on the host, once per chunk)."""
    return all(bool(np.all(f)) for f in jax.tree_util.tree_leaves(flags))


def _finite(tree):
    """A scalar boolean: every floating number in ``tree`` (an info, a state) is finite."""
    ok = jnp.asarray(True)
    for value in jax.tree_util.tree_leaves(tree):
        if jnp.issubdtype(jnp.result_type(value), jnp.floating):
            ok = ok & jnp.isfinite(jnp.sum(value))
    return ok


def _info_buffers(step, state, xs, data, length: int):
    """Zeros for ``length`` steps' infos."""
    _, info = jax.eval_shape(step, state, _at(xs, 0), data, jnp.asarray(0, jnp.int32))
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
