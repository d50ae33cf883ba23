"""The one loop of every iterative method: SG-MCMC kernels, VI, and the backends' NUTS and HMC.

A method is a :class:`Transition`: per chain, ``init(key, position, data) -> state`` and
``step(key, state, batch) -> (state, info)`` (BlackJAX's kernel shape; VI's step is an optimizer
update composed with the objective's ``value_and_grad``), and ``emit(state)``, the array a kept
step keeps (the position; nothing for VI). :func:`run_chains` runs it:

- in chunks of one compiled length (:meth:`Backend.compile_loop`: on JAX one jitted
  ``lax.scan``, on torch a plain loop around the step), one program per fit: a shorter last
  chunk runs the same program with fewer real steps;
- with the chains side by side (``vmap``) on a backend that vectorises them, else one after
  another; chain c has its own key and its own minibatch order, so a chain's draws do not depend
  on how many chains run beside it;
- with the data on the fit's device, passed to every step; only minibatch indices (one shuffle
  per epoch, :class:`~ppl_bdl.inference.minibatch.EpochBatches`) and the keep mask cross from the
  host, and only the kept steps' draws come back;
- each chunk queued before the one before it is read on an asynchronous backend (JAX);
- stopping at the first step whose ``info`` holds a non-finite number (the potential, a
  gradient norm, the loss), with that step and chain, or at Ctrl-C, keeping the draws before
  (and the state before: from a runner that applied the failed step, as JAX's CPU loop does,
  by running the chunk again up to it).
"""

from __future__ import annotations

import math
import sys
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from ..errors import ConfigError
from .chunk_readback import drop_last_draw, failed_chains, read_chunk
from .minibatch import EpochBatches

#: Steps per compiled chunk at most (the host reads results and shows progress per chunk).
MAX_CHUNK = 1000
#: Floats of kept draws one chunk may hold on the device (256 MB in float32).
MAX_ROW_FLOATS = 64_000_000


#: Compiled runners by transition step (then backend and vectorisation): runs that share a step
#: function (a step-size pilot and the run it sets up) share one compiled program.
_RUNNERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class Transition(NamedTuple):
    """A method's per-chain transition (see the module docstring)."""

    init: Callable[[Any, Any, Any], Any]
    step: Callable[[Any, Any, Any], tuple[Any, dict]]
    emit: Callable[[Any], Any]


class Batch(NamedTuple):
    """What a step sees of the data: the data's arrays (on the device) and the minibatch's
    indices into the subsampled plate (None for a full batch)."""

    data: Any
    indices: Any


@dataclass
class RunPlan:
    """Which steps keep a draw, and the chunking: ``chunk`` steps per compiled call, at most
    ``rows`` kept steps in any chunk."""

    keep: np.ndarray
    chunk: int
    rows: int

    @property
    def num_steps(self) -> int:
        return len(self.keep)


@dataclass
class Failure:
    """Where a run stopped early: the step, the chains affected, and why ("nonfinite" or
    "interrupted")."""

    step: int
    chains: list[int]
    reason: str


@dataclass
class RunResult:
    """Kept draws (chain, draw, ...), their infos (chain, draw), the final states of the last
    group of chains (backend arrays), and the failure, if any. After a failure the draws are those
    kept before it: of the chains that kept any, cut to the same length; the final state is
    the one before it if asked for (``run_chains(keep_final_state=True)``), else None."""

    draws: np.ndarray | None
    infos: dict[str, np.ndarray]
    final_state: Any = None
    failure: Failure | None = None
    steps_done: int = 0
    step_infos: dict[str, np.ndarray] = field(default_factory=dict)


def plan_run(
    keep: np.ndarray, chains: int, row_floats: int, chunk_size: int | None = None,
    progress: bool = False,
) -> RunPlan:  # fmt: skip
    """Chunks as equal as fit the limits (so a shorter last chunk wastes nothing)."""
    keep = np.asarray(keep, bool)
    total = len(keep)
    if chunk_size is not None:
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise ConfigError(f"chunk_size must be an int >= 1, got {chunk_size!r}.")
        chunk = min(chunk_size, total)
    else:
        limit = min(MAX_CHUNK, math.ceil(total / 20)) if progress else MAX_CHUNK
        chunk = math.ceil(total / math.ceil(total / max(1, limit)))

    def rows_of(chunk: int) -> int:
        return max(int(keep[s : s + chunk].sum()) for s in range(0, total, chunk))

    rows = rows_of(chunk)
    while chunk > 1 and rows * chains * max(1, row_floats) > MAX_ROW_FLOATS:
        chunk = math.ceil(chunk / 2)
        rows = rows_of(chunk)
    return RunPlan(keep, chunk, rows)


def chain_seed(seed: int, chain: int) -> int:
    """The integer seed of chain ``chain`` (its random key and its minibatch order)."""
    return int(seed) * 1_000_003 + int(chain)


def all_finite(backend, info: dict):
    """A scalar boolean: every floating number in ``info`` is finite."""
    m = backend.math
    ok = None
    for value in info.values():
        if not _is_floating(value):
            continue
        finite = m.isfinite(m.sum(value))
        ok = finite if ok is None else ok & finite
    return m.asarray(True) if ok is None else ok


def _is_floating(value) -> bool:
    kind = getattr(getattr(value, "dtype", None), "is_floating_point", None)
    if kind is not None:  # torch dtypes
        return bool(kind)
    return np.issubdtype(np.dtype(getattr(value, "dtype", np.float64)), np.floating)


class _Chunk(NamedTuple):
    start: int
    steps: int
    carry: Any  # the state the chunk started from
    xs: dict  # its per-step inputs
    result: Any


def run_chains(
    backend, transition: Transition, positions: np.ndarray, seed: int, plan: RunPlan, data: Any,
    batches: Callable[[int], EpochBatches | None], name: str, progress: bool = False,
    chain_ids: list[int] | None = None, trace_infos: bool = False, keep_final_state: bool = False,
) -> RunResult:  # fmt: skip
    """Run ``transition`` from ``positions`` (chain, dim) as the module docstring says.

    ``batches(chain)`` gives a chain's minibatch indices (None: full batch); with
    ``trace_infos`` the infos of every step run (not only the kept ones) come back too
    (``step_infos``, e.g. VI's losses). After a failure, ``final_state`` is the state before
    the failed step with ``keep_final_state`` (VI's parameters; on a runner that applied the
    step this runs the chunk again up to it), else None."""
    chains = list(range(len(positions))) if chain_ids is None else chain_ids
    vectorised = backend.vectorized_chains and len(chains) > 1
    groups = [chains] if vectorised else [[c] for c in chains]
    bar = progress_bar(plan.num_steps * len(chains), name) if progress else None
    draws, infos, traced, failure, final = [], [], [], None, None
    runners = _RUNNERS.setdefault(transition.step, {})
    try:
        for group in groups:
            rows = [positions[chains.index(c)] for c in group]
            out = _run_group(
                backend, transition, runners, np.stack(rows), group, seed, plan, data,
                [batches(c) for c in group], vectorised, bar, trace_infos, keep_final_state,
            )  # fmt: skip
            draws += out.draws
            infos += out.infos
            traced += out.step_infos
            final = out.final_state
            if out.failure is not None:
                failure = out.failure
                break
    finally:
        if bar is not None:
            bar.close()
    result = _collect(draws, infos, final, failure)
    if trace_infos and traced and traced[0]:
        n = min(len(next(iter(t.values()))) for t in traced)
        result.step_infos = {k: np.stack([t[k][:n] for t in traced]) for k in traced[0]}
    return result


def _collect(draws, infos, final, failure) -> RunResult:
    # After a failure, chains that kept nothing (not run yet, or failed first) are left out.
    kept = [i for i, d in enumerate(draws) if len(d)]
    draws, infos = [draws[i] for i in kept], [infos[i] for i in kept]
    if not draws:
        return RunResult(None, {}, final, failure)
    n = min(len(d) for d in draws)
    stats = {k: np.stack([i[k][:n] for i in infos]) for k in infos[0]}
    return RunResult(np.stack([d[:n] for d in draws]), stats, final, failure)


class _GroupResult(NamedTuple):
    draws: list
    infos: list
    step_infos: list
    final_state: Any
    failure: Failure | None


def _run_group(
    backend, transition, runners, positions, group, seed, plan, data, batches, vectorised, bar,
    trace_infos, keep_final_state,
) -> _GroupResult:  # fmt: skip
    be = backend
    with be.scope(), be.activate():
        keys = [be.random.split(be.random.key(chain_seed(seed, c))) for c in group]
        start_state = [
            transition.init(k[0], be.asarray(p), data) for k, p in zip(keys, positions, strict=True)
        ]
        if vectorised:
            carry = {"state": be.tree_map(lambda *a: be.math.stack(list(a)), *start_state)}
        else:
            carry = {"state": start_state[0]}
        chain_keys = [k[1] for k in keys]
        if (be, vectorised) not in runners:
            runners[be, vectorised] = be.compile_loop(
                _loop_step(be, transition, vectorised), _emit(transition)
            )
        runner = runners[be, vectorised]

    def dispatch(start: int, previous: _Chunk | None) -> _Chunk:
        steps = min(plan.chunk, plan.num_steps - start)
        with be.scope(), be.activate():
            xs = _inputs(be, plan, start, steps, batches, vectorised)
            xs["key"] = _step_keys(be, chain_keys, start, plan.chunk, vectorised)
            state = carry if previous is None else previous.result.carry
            return _Chunk(start, steps, state, xs, runner(state, xs, data, steps, plan.rows))

    draws, infos = [[] for _ in group], [[] for _ in group]
    traced = [[] for _ in group] if trace_infos else None
    failure, final = None, carry["state"]
    start = 0
    queued = _queue(dispatch, range(0, plan.num_steps, plan.chunk), be.asynchronous_loop)
    while start < plan.num_steps:
        try:
            chunk = next(queued)
            failed_at, kept = int(chunk.result.failed_at), int(chunk.result.kept)
        except KeyboardInterrupt:
            failure = Failure(start, group[:1], "interrupted")
            break
        final = chunk.result.carry["state"]
        read_chunk(be, chunk, plan, failed_at, kept, vectorised, draws, infos, traced)
        if failed_at >= 0:
            if not keep_final_state:
                final = None
            elif chunk.result.failed_step_applied:
                try:
                    with be.scope(), be.activate():
                        final = _state_before(runner, chunk, failed_at, data, plan.rows)
                except KeyboardInterrupt:  # during the re-run: the state the chunk started from
                    final = chunk.carry["state"]
            step_infos = {k: np.asarray(be.to_numpy(v)) for k, v in chunk.result.infos.items()}
            bad = failed_chains(step_infos, failed_at, vectorised)
            failure = Failure(start + failed_at, [group[i] for i in bad] or group[:1], "nonfinite")
            if start + failed_at >= 1 and plan.keep[start + failed_at - 1]:
                drop_last_draw(draws, infos)  # its position is where the potential is not finite
            break
        start += chunk.steps
        if bar is not None:
            bar.update(chunk.steps * len(group))

    def merge(parts):
        return [{k: np.concatenate([p[k] for p in i]) for k in i[0]} if i else {} for i in parts]

    return _GroupResult(
        [np.concatenate(d) if d else np.zeros((0,)) for d in draws],
        merge(infos),
        merge(traced) if traced is not None else [],
        final,
        failure,
    )


def _loop_step(be, transition: Transition, vectorised: bool):
    def one(state, key, idx, data):
        return transition.step(key, state, Batch(data, idx))

    def step(carry, x, data):
        with be.activate():
            idx = x.get("idx")
            if vectorised:
                axes = (0, 0, None if idx is None else 0, None)
                new, info = be.vmap(one, in_axes=axes)(carry["state"], x["key"], idx, data)
            else:
                new, info = one(carry["state"], x["key"], idx, data)
            return {"state": new}, info, all_finite(be, info)

    return step


def _step_keys(be, chain_keys: list, start: int, steps: int, vectorised: bool):
    """Every step's key of a chunk, made in one call per chain before the chunk runs (a split
    inside the loop body costs more than the step's own work for small models). Step t's key
    depends only on its chain's key and t, not on how the run is chunked."""
    per_chain = [be.random.step_keys(key, start, steps) for key in chain_keys]
    if vectorised:
        return be.math.stack(per_chain, axis=1)
    return per_chain[0]


def _state_before(runner, chunk: _Chunk, failed_at: int, data, rows: int):
    """The state before the chunk's step ``failed_at``, from a runner that applied that step:
    the chunk again from its start, ``failed_at`` steps (the same program on the same inputs; on
    a device whose results vary between runs it may fail sooner, and then stops there)."""
    result = runner(chunk.carry, chunk.xs, data, failed_at, rows)
    while int(result.failed_at) >= 0:
        result = runner(chunk.carry, chunk.xs, data, int(result.failed_at), rows)
    return result.carry["state"]


def _emit(transition: Transition):
    return lambda carry: transition.emit(carry["state"])


def _inputs(be, plan: RunPlan, start: int, steps: int, batches, vectorised: bool) -> dict:
    keep = np.zeros(plan.chunk, bool)
    keep[:steps] = plan.keep[start : start + steps]
    xs = {"keep": be.asarray(keep)}
    if batches[0] is not None:
        blocks = [b.next_block(steps) for b in batches]  # (steps, B) per chain
        idx = np.zeros((plan.chunk, len(blocks), blocks[0].shape[1]), blocks[0].dtype)
        idx[:steps] = np.stack(blocks, axis=1)
        xs["idx"] = be.asarray(idx if vectorised else idx[:, 0], dtype="int")
    return xs


def _queue(dispatch, starts, ahead: bool):
    """Yield ``dispatch(start, previous)`` for each start; ``ahead`` (an asynchronous loop):
    with the next chunk already queued, so the device never waits for the host to read one."""
    if not ahead:  # a chunk that failed must not be run on from (its state may be in place)
        previous = None
        for start in starts:
            previous = dispatch(start, previous)
            yield previous
        return
    previous, pending = None, None
    for start in starts:
        previous = dispatch(start, previous)
        if pending is not None:
            yield pending
        pending = previous
    if pending is not None:
        yield pending


def progress_bar(total: int, name: str):
    """A tqdm bar on stderr for ``total`` steps of ``name`` (None without tqdm)."""
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        return None
    return tqdm(total=total, desc=name, file=sys.stderr, leave=False, unit="step")
