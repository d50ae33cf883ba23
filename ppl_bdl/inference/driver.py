"""The one loop of every iterative method: SG-MCMC kernels, VI, and the backends' NUTS and HMC.

A method is a :class:`~ppl_bdl.backend_protocol.Transition`: per chain ``init(key, position,
data) -> state``, ``step(key, state, batch, rate) -> (state, info)`` and ``emit(state)``, the
array a kept step keeps. :func:`run_chains` runs it:

- in chunks of one compiled length (:meth:`Backend.compile_loop`: on JAX one jitted loop, on
  torch a plain loop around the step), one program per fit: a shorter last chunk runs the same
  program with fewer steps;
- with the chains grouped once, here: side by side (``vmap``) where the backend vectorises
  them and the method allows it, else one after another; chain c has its own key and its own
  minibatch order, so a chain's draws do not depend on how many chains run beside it;
- with the data on the fit's device, passed to every step; only minibatch indices (one shuffle
  per epoch, :class:`~ppl_bdl.inference.minibatch.EpochBatches`) cross from the host per chunk,
  and only the kept steps' draws come back;
- with each step's rate (an SG-MCMC step size, a learning rate) from :class:`Rates`: its
  scale a runtime input (a step-size pilot and the run it sets up, or a learning rate cut on a
  plateau, share one compiled program) times its schedule evaluated in the step at the step
  counter the loop carries (a per-step rate read from an input array cost XLA's CPU runtime
  more than a toy step's own work: docs/benchmarks.md);
- stopping at the first step whose ``info`` holds a non-finite number (the potential, a
  gradient norm, the loss), with that step and chain and the state before it (the backend's
  loop finds both), or at Ctrl-C, keeping the draws and the state of the chunks before;
- on several devices (``fit(..., device=[...])``), with every array the loop reads handed to
  :meth:`Backend.place` with its chain and batch axes named: chains split over the devices
  (the vectorised group padded to a multiple of the device count with copies of its last
  chain, whose results are dropped), or each step's minibatch (``shard="data"``). A chain's
  draws depend on its seed and number only, never on the devices.
"""

from __future__ import annotations

import math
import sys
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from ..backend_protocol import Batch, Transition
from ..errors import ConfigError
from .spread import chain_padding, check_spread, group_scale

__all__ = ["Batch", "Rates", "RunPlan", "RunResult", "Transition", "plan_run", "run_chains"]

#: Steps per compiled chunk at most (the host reads results and shows progress per chunk).
MAX_CHUNK = 1000
#: Floats of kept draws one chunk may hold on the device (256 MB in float32).
MAX_ROW_FLOATS = 64_000_000

#: Compiled runners by transition step (then backend and vectorisation): runs that share a step
#: function (a step-size pilot and the run it sets up) share one compiled program.
_RUNNERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class Rates(NamedTuple):
    """Every step's rate: ``scale`` × ``unit(t)`` at step t of the run (``unit`` written with
    :mod:`ppl_bdl.math`, evaluated in the compiled step; None: the constant 1, no work per
    step). ``scale`` is a runtime input: changing it compiles nothing.

    Example
    -------
    >>> Rates(1e-3).scale, Rates(1e-3).unit is None
    (0.001, True)
    """

    scale: float
    unit: Callable[[Any], Any] | None = None


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
    """Kept draws (chain, draw, ...), their infos (chain, draw), every step's infos (chain, step),
    the final state of the last group of chains (backend arrays; after a failure, the state
    before the failed step), and the failure, if any. After a failure the draws are those kept
    before it: of the chains that kept any, cut to the same length."""

    draws: np.ndarray | None
    infos: dict[str, np.ndarray]
    final_state: Any = None
    failure: Failure | None = None
    step_infos: dict[str, np.ndarray] = field(default_factory=dict)
    #: Every group's final state (``run_chains(..., resume=...)`` goes on from them), and
    #: whether the chains ran side by side (one group) or one after another.
    states: list = field(default_factory=list)
    vectorised: bool = False

    def chain_state(self, backend, index: int):
        """The final state of the run's ``index``-th chain (backend arrays; None for a chain
        that did not run: one after a failure)."""
        if not self.vectorised:
            return self.states[index] if index < len(self.states) else None
        return backend.tree_map(lambda a: a[index], self.states[0])


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


def run_chains(
    backend, transition: Transition, positions: np.ndarray, seed: int, plan: RunPlan, data: Any,
    batches: Callable[[int], Any], name: str, rates: Rates | None = None,
    progress: bool = False, chain_ids: list[int] | None = None, vectorize: bool = True,
    trace: bool = False, first_step: int = 0, resume: list | None = None,
) -> RunResult:  # fmt: skip
    """Run ``transition`` from ``positions`` (chain, dim) as the module docstring says.

    ``batches(chain)`` gives a chain's minibatch indices (an
    :class:`~ppl_bdl.inference.minibatch.EpochBatches`, or None for the full batch); ``rates``
    the steps' rates (:class:`Rates`; None: the transition takes none); ``chain_ids`` the chains' numbers (their seeds;
    default 0, 1, ...); ``vectorize=False`` runs them one after another even where the backend
    could vectorise them; ``trace``: every step's infos come back (``step_infos``), not only
    the kept steps' (VI's losses, the step-size pilot's potentials); ``first_step``: the step
    counter's start (the rates' schedule reads it: a run continued in parts); ``resume``:
    the ``states`` of an earlier run of the same chains, to go on from (instead of
    ``init``)."""
    chains = list(range(len(positions))) if chain_ids is None else list(chain_ids)
    vectorised = vectorize and backend.vectorized_chains and len(chains) > 1
    groups = [chains] if vectorised else [[c] for c in chains]
    made = {c: batches(c) for c in chains}
    check_spread(backend, vectorised, made[chains[0]], name)
    pad = chain_padding(backend, len(chains)) if vectorised else 0
    bar = progress_bar(plan.num_steps * len(chains), name) if progress else None
    runner = _runner(backend, transition, vectorised, None if rates is None else rates.unit)
    parts, failure, states = [], None, []
    try:
        for g, group in enumerate(groups):
            rows = np.stack([positions[chains.index(c)] for c in group])
            start = None if resume is None else resume[g]
            scale = 1.0 if rates is None else group_scale(rates.scale, chains, group, pad)
            part = _run_group(backend, transition, runner, rows, group, seed, plan, data,
                              [made[c] for c in group], scale, vectorised, bar, trace,
                              first_step, pad, start)  # fmt: skip
            parts.append(part)
            failure = part.failure
            states.append(part.final_state)
            if failure is not None:
                break
    finally:
        if bar is not None:
            bar.close()
    result = _collect(parts, states[-1] if states else None, failure)
    result.states, result.vectorised = states, vectorised
    return result


def _runner(be, transition: Transition, vectorised: bool, unit):
    runners = _RUNNERS.setdefault(transition.step, {})
    if (be, vectorised, unit) not in runners:
        runners[be, vectorised, unit] = be.compile_loop(
            _loop_step(be, transition, vectorised, unit), transition.emit
        )
    return runners[be, vectorised, unit]


@dataclass
class _Part:
    """One group's result: per chain of the group, its kept draws, their infos and every
    step's infos."""

    draws: list
    infos: list
    step_infos: list
    final_state: Any
    failure: Failure | None


def _run_group(be, transition, runner, positions, group, seed, plan, data, batches, scale,
               vectorised, bar, trace, first_step, pad=0, state=None) -> _Part:  # fmt: skip
    """One group's chunks; ``pad`` copies of its last chain make the group a multiple of the
    devices its chains are split over (their results are dropped); ``state``: go on from it."""
    with be.scope(), be.activate():
        keys = [be.random.split(be.random.key(chain_seed(seed, c))) for c in group]
        keys += keys[-1:] * pad
        if state is None:
            starts = list(positions) + [positions[-1]] * pad
            states = [transition.init(k[0], be.asarray(p), data)
                      for k, p in zip(keys, starts, strict=True)]  # fmt: skip
            state = states[0]
            if vectorised:
                state = be.tree_map(lambda *a: be.math.stack(list(a)), *states)
        state = be.place(state, chain_axis=0 if vectorised else None)
        chain_keys = [k[1] for k in keys]
        # What every step reads unchanged: the data (init ran on the first device; the loop
        # reads it everywhere), the rates' scale, the chains' keys.
        scale = be.place(be.asarray(scale), chain_axis=0 if np.ndim(scale) else None)
        chain_keys = be.math.stack(chain_keys) if vectorised else chain_keys[0]
        inputs = (be.place(data), scale,
                  be.place(chain_keys, chain_axis=0 if vectorised else None))  # fmt: skip
    rows, kept_infos, step_infos = [], [], []
    failure = None
    for start in range(0, plan.num_steps, plan.chunk):
        steps = min(plan.chunk, plan.num_steps - start)
        keep = plan.keep[start : start + steps]
        try:
            with be.scope(), be.activate():
                xs = _inputs(be, plan.chunk, steps, batches, vectorised, pad)
                padded = np.zeros(plan.chunk, bool)
                padded[:steps] = keep
                result = runner(state, xs, inputs, padded, steps, first_step + start, plan.rows,
                                trace)  # fmt: skip
        except KeyboardInterrupt:
            failure = Failure(start, group[:1], "interrupted")
            break
        state = result.state
        if result.rows is not None:
            rows.append(result.rows)
            if trace:
                ran = steps if result.failed_at < 0 else result.failed_at
                kept_infos.append({k: v[keep[:ran]] for k, v in result.infos.items()})
            else:
                kept_infos.append(result.infos)
        if trace:
            step_infos.append(result.infos)
        if result.failed_at >= 0:
            step = start + result.failed_at
            bad = _failed_chains(result.failed_info, vectorised)
            named = sorted({group[min(i, len(group) - 1)] for i in bad}, key=group.index)
            failure = Failure(step, named or group[:1], "nonfinite")
            if step >= 1 and plan.keep[step - 1]:  # its position is where U is not finite
                _drop_last_row(rows, kept_infos)
            break
        if bar is not None:
            bar.update(steps * len(group))
    return _Part(*_per_chain(rows, kept_infos, step_infos, len(group), vectorised), state, failure)


def _drop_last_row(rows: list, kept_infos: list) -> None:
    while rows and len(rows[-1]) == 0:
        rows.pop()
        kept_infos.pop()
    if rows:
        rows[-1] = rows[-1][:-1]
        kept_infos[-1] = {k: v[:-1] for k, v in kept_infos[-1].items()}


def _per_chain(rows, kept_infos, step_infos, chains: int, vectorised: bool):
    """Each chain's draws, kept infos and step infos, joined over the chunks."""

    def join(parts, i):
        if not parts or not parts[0]:
            return {}
        return {k: np.concatenate([p[k][:, i] if vectorised else p[k] for p in parts])
                for k in parts[0]}  # fmt: skip

    draws = [
        np.concatenate([r[:, i] if vectorised else r for r in rows]) if rows else np.zeros((0,))
        for i in range(chains)
    ]
    return (draws, [join(kept_infos, i) for i in range(chains)],
            [join(step_infos, i) for i in range(chains)])  # fmt: skip


def _collect(parts: list[_Part], final, failure) -> RunResult:
    draws = [d for p in parts for d in p.draws]
    infos = [i for p in parts for i in p.infos]
    traced = [t for p in parts for t in p.step_infos]
    result = RunResult(None, {}, final, failure)
    # After a failure, chains that kept nothing (not run yet, or failed first) are left out.
    kept = [i for i, d in enumerate(draws) if len(d)]
    if kept:
        n = min(len(draws[i]) for i in kept)
        result.draws = np.stack([draws[i][:n] for i in kept])
        result.infos = {k: np.stack([infos[i][k][:n] for i in kept]) for k in infos[kept[0]]}
    if traced and traced[0]:
        n = min(len(next(iter(t.values()))) for t in traced)
        result.step_infos = {k: np.stack([t[k][:n] for t in traced]) for k in traced[0]}
    return result


def _failed_chains(info: dict | None, vectorised: bool) -> list[int]:
    """The chains whose info is not finite at the failed step."""
    bad = None
    for value in (info or {}).values():
        value = np.asarray(value)
        if not np.issubdtype(value.dtype, np.floating):
            continue
        row = value.reshape(value.shape[0], -1) if vectorised else value.reshape(1, -1)
        finite = np.isfinite(row).all(axis=1)
        bad = ~finite if bad is None else bad | ~finite
    return [] if bad is None else [int(i) for i in np.flatnonzero(bad)]


def _loop_step(be, transition: Transition, vectorised: bool, unit):
    """The loop's step t: the transition (vmapped over the chains), each chain's key folded
    with t, the rate scale × unit(t)."""

    def one(state, chain_key, idx, rate, data, t):
        key = be.random.fold_in(chain_key, t)
        return transition.step(key, state, Batch(data, idx, t), rate)

    def step(state, x, inputs, t):
        with be.activate():
            data, scale, chain_keys = inputs
            rate = scale if unit is None else scale * unit(t)
            idx = x.get("idx")
            if vectorised:
                # A rate per chain (VI's fits, each cut on its own plateau) or one for all.
                per_chain = 0 if len(rate.shape) else None
                axes = (0, 0, None if idx is None else 0, per_chain, None, None)
                return be.vmap(one, in_axes=axes)(state, chain_keys, idx, rate, data, t)
            return one(state, chain_keys, idx, rate, data, t)

    return step


def _inputs(be, length: int, steps: int, batches, vectorised: bool, pad: int = 0) -> dict:
    """A chunk's per-step inputs, padded to the compiled ``length``: the minibatch indices
    (nothing for full-batch steps; a step's key is its chain's key folded with the step's
    number, in the step), placed on the fit's devices (the ``pad`` chains past ``batches``
    read the last chain's indices)."""
    xs = {}
    if batches[0] is not None:
        blocks = [b.next_block(steps) for b in batches]  # (steps, B) per chain
        blocks += blocks[-1:] * pad
        idx = np.zeros((length, len(blocks), blocks[0].shape[1]), blocks[0].dtype)
        idx[:steps] = np.stack(blocks, axis=1)
        idx = be.asarray(idx if vectorised else idx[:, 0], dtype="int")
        xs["idx"] = be.place(idx, chain_axis=1 if vectorised else None,
                             batch_axis=2 if vectorised else 1)  # fmt: skip
    return xs


def progress_bar(total: int, name: str):
    """A tqdm bar on stderr for ``total`` steps of ``name`` (None without tqdm)."""
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        return None
    return tqdm(total=total, desc=name, file=sys.stderr, leave=False, unit="step")
