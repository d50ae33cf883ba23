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
- each chunk queued before the one before it is read (JAX runs them asynchronously);
- stopping at the first step whose ``info`` holds a non-finite number (the potential, a
  gradient norm, the loss), with that step and chain, or at Ctrl-C, keeping the draws before.
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
    kept before it: of the chains that kept any, cut to the same length."""

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
    result: Any


def run_chains(
    backend, transition: Transition, positions: np.ndarray, seed: int, plan: RunPlan, data: Any,
    batches: Callable[[int], EpochBatches | None], name: str, progress: bool = False,
    chain_ids: list[int] | None = None, trace_infos: bool = False,
) -> RunResult:  # fmt: skip
    """Run ``transition`` from ``positions`` (chain, dim) as the module docstring says.

    ``batches(chain)`` gives a chain's minibatch indices (None: full batch); with
    ``trace_infos`` the infos of every step run (not only the kept ones) come back too
    (``step_infos``, e.g. VI's losses)."""
    chains = list(range(len(positions))) if chain_ids is None else chain_ids
    vectorised = backend.vectorized_chains and len(chains) > 1
    groups = [chains] if vectorised else [[c] for c in chains]
    bar = _progress_bar(plan.num_steps * len(chains), name) if progress else None
    draws, infos, traced, failure, final = [], [], [], None, None
    runners = _RUNNERS.setdefault(transition.step, {})
    try:
        for group in groups:
            rows = [positions[chains.index(c)] for c in group]
            out = _run_group(
                backend, transition, runners, np.stack(rows), group, seed, plan, data,
                [batches(c) for c in group], vectorised, bar, trace_infos,
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
    trace_infos,
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
            return _Chunk(start, steps, runner(state, xs, data, steps, plan.rows))

    draws, infos = [[] for _ in group], [[] for _ in group]
    traced = [[] for _ in group] if trace_infos else None
    failure, final = None, carry
    start = 0
    queued = _run_ahead(dispatch, range(0, plan.num_steps, plan.chunk))
    while start < plan.num_steps:
        try:
            chunk = next(queued)
            failed_at, kept = int(chunk.result.failed_at), int(chunk.result.kept)
        except KeyboardInterrupt:
            failure = Failure(start, group[:1], "interrupted")
            break
        final = chunk.result.carry["state"]
        _read_chunk(be, chunk, plan, failed_at, kept, vectorised, draws, infos, traced)
        if failed_at >= 0:
            step_infos = {k: np.asarray(be.to_numpy(v)) for k, v in chunk.result.infos.items()}
            bad = _failed_chains(step_infos, failed_at, vectorised)
            failure = Failure(start + failed_at, [group[i] for i in bad] or group[:1], "nonfinite")
            if start + failed_at >= 1 and plan.keep[start + failed_at - 1]:
                _drop_last_draw(draws, infos)  # its position is where the potential is not finite
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


def _read_chunk(be, chunk: _Chunk, plan, failed_at, kept, vectorised, draws, infos, traced):
    """Append the chunk's kept draws and their infos (and every step's infos to ``traced``),
    per chain."""
    end = chunk.steps if failed_at < 0 else failed_at
    keep = plan.keep[chunk.start : chunk.start + end]
    if chunk.result.infos is None or (kept == 0 and traced is None):
        return
    step_infos = {k: np.asarray(be.to_numpy(v))[:end] for k, v in chunk.result.infos.items()}

    def per_chain(values: dict, i: int) -> dict:
        return {k: (v[:, i] if vectorised else v) for k, v in values.items()}

    if traced is not None:
        for i in range(len(traced)):
            traced[i].append(per_chain(step_infos, i))
    if kept == 0 or chunk.result.rows is None:
        return
    rows = np.asarray(be.to_numpy(chunk.result.rows))[:kept]
    kept_infos = {k: v[keep] for k, v in step_infos.items()}
    for i in range(len(draws)):
        draws[i].append(rows[:, i] if vectorised else rows)
        infos[i].append(per_chain(kept_infos, i))


def _drop_last_draw(draws: list, infos: list) -> None:
    for chain_draws, chain_infos in zip(draws, infos, strict=True):
        while chain_draws and len(chain_draws[-1]) == 0:
            chain_draws.pop()
            chain_infos.pop()
        if chain_draws:
            chain_draws[-1] = chain_draws[-1][:-1]
            chain_infos[-1] = {k: v[:-1] for k, v in chain_infos[-1].items()}


def _failed_chains(step_infos: dict, failed_at: int, vectorised: bool) -> list[int]:
    """The chains whose info is not finite at the failed step."""
    bad = None
    for value in step_infos.values():
        if not np.issubdtype(value.dtype, np.floating):
            continue
        row = value[failed_at]
        row = row.reshape(row.shape[0], -1) if vectorised else row.reshape(1, -1)
        finite = np.isfinite(row).all(axis=1)
        bad = ~finite if bad is None else bad | ~finite
    return [] if bad is None else [int(i) for i in np.flatnonzero(bad)]


def _run_ahead(dispatch, starts):
    """Yield ``dispatch(start, previous)`` for each start with the next chunk already queued:
    on an asynchronous backend the device never waits for the host to read a chunk."""
    previous, pending = None, None
    for start in starts:
        previous = dispatch(start, previous)
        if pending is not None:
            yield pending
        pending = previous
    if pending is not None:
        yield pending


def _progress_bar(total: int, name: str):
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        return None
    return tqdm(total=total, desc=name, file=sys.stderr, leave=False, unit="step")
