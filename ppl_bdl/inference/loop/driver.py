"""The one loop of every iterative method: SG-MCMC kernels, VI, NUTS and HMC.

A method is a :class:`~ppl_bdl.backend_protocol.Transition`: per chain ``init(key, position,
data) -> state``, ``step(key, state, batch, rate) -> (state, info)`` and ``emit(state)``, the
array a kept step keeps. :func:`run_chains` runs it:

- in chunks of one compiled length (:meth:`Backend.compile_loop`: on JAX one jitted loop, on
  torch a plain loop around the step): a shorter last chunk runs the same program with fewer
  steps, and the program is kept in the backend's program cache under the transition's key
  (:mod:`~ppl_bdl.trace.programs`), so another fit of the same model reuses it;
- with the chains split into parts once, here: side by side (``vmap``, one part) where the
  backend vectorises them and the method allows it, else one after another (a part each);
  chain c has its own key and its own minibatch order, so a chain's draws do not depend on how
  many chains run beside it;
- with the data on the fit's device, passed to every step; only minibatch indices (one shuffle
  per epoch, :class:`~ppl_bdl.inference.loop.minibatch.EpochBatches`) cross from the host per chunk,
  and only the kept steps' draws come back;
- with each step's rate (an SG-MCMC step size, a learning rate) from :class:`Rates`: its
  scale a loop input (a step-size pilot and the run it sets up, or a learning rate cut on a
  plateau, share one compiled program) times its schedule evaluated in the step at the step
  counter the loop carries (a per-step rate read from an input array cost XLA's CPU runtime
  more than a toy step's own work: docs/benchmarks.md);
- stopping at the first step whose ``info`` (the potential, a gradient norm, the loss) or new
  state holds a non-finite number, with that step and chain and the state before it (the
  backend's loop finds both; a compiled loop may check only the state between kept steps,
  whose infos nobody reads, and find the step by running the chunk again), or at Ctrl-C,
  keeping the draws and the state of the chunks before (of the steps before, where the
  backend's loop steps in Python: a compiled chunk cannot stop part-way), wherever in the run
  it lands;
- on several devices (``fit(..., device=[...])``), with every array the loop reads handed to
  :meth:`Backend.place` with its chain and batch axes named: chains split over the devices
  (the vectorised part padded to a multiple of the device count with copies of its last
  chain, whose results are dropped), or each step's minibatch (``shard="data"``). A chain's
  draws depend on its seed and number only, never on the devices.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from ppl_bdl.backend_protocol import Batch, Transition
from ppl_bdl.errors import ConfigError
from ppl_bdl.inference.loop.chunked_run import ChunkedRun, Failure, RunPart
from ppl_bdl.inference.loop.spread import chain_padding, check_spread, part_scale
from ppl_bdl.trace.programs import programs, same

__all__ = ["Batch", "Rates", "RunPlan", "RunResult", "Transition", "plan_run", "run_chains"]

#: Steps per compiled chunk at most (the host reads results and shows progress per chunk).
MAX_CHUNK = 1000
#: Floats of kept draws one chunk may hold on the device (256 MB in float32).
MAX_ROW_FLOATS = 64_000_000


class Rates(NamedTuple):
    """Every step's rate: ``scale`` × ``unit(t)`` at step t of the run (``unit`` written with
    :mod:`ppl_bdl.dsl.math`, evaluated in the compiled step; None: the constant 1, no work per
    step). ``scale`` is a loop input: changing it compiles nothing. ``key``: what ``unit``
    computes (its schedule and settings), so runs whose units are equal share a compiled
    program (:mod:`ppl_bdl.trace.programs`); None: ``unit`` is its own.

    Example
    -------
    >>> Rates(1e-3).scale, Rates(1e-3).unit is None
    (0.001, True)
    """

    scale: float
    unit: Callable[[Any], Any] | None = None
    key: Hashable | None = None


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
class RunResult:
    """Kept draws (chain, draw, ...), their infos (chain, draw), every step's infos (chain, step),
    the final state of the last part of the run (backend arrays; after a failure, the state
    before the failed step), and the failure, if any. After a failure the draws are those kept
    before it, cut to the common length that keeps the most draws (chains shorter than it are
    left out: see :func:`most_draws`)."""

    draws: np.ndarray | None
    infos: dict[str, np.ndarray]
    final_state: Any = None
    failure: Failure | None = None
    step_infos: dict[str, np.ndarray] = field(default_factory=dict)
    #: Every part's final state (``run_chains(..., resume=...)`` goes on from them), and
    #: whether the chains ran side by side (one part) or one after another (a part each).
    states: list = field(default_factory=list)
    vectorised: bool = False

    def chain_state(self, backend, index: int):
        """The final state of the run's ``index``-th chain (backend arrays; None for a chain
        that did not run: one after a failure)."""
        if not self.vectorised:
            return self.states[index] if index < len(self.states) else None
        return backend.tree_map(lambda a: a[index], self.states[0])


def plan_run(
    keep: np.ndarray,
    chains: int,
    row_floats: int,
    chunk_size: int | None = None,
    progress: bool = False,
) -> RunPlan:
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


def run_chains(
    backend,
    transition: Transition,
    positions: np.ndarray,
    seed: int,
    plan: RunPlan,
    data: Any,
    batches: Callable[[int], Any],
    name: str,
    rates: Rates | None = None,
    progress: bool = False,
    chain_ids: list[int] | None = None,
    vectorize: bool = True,
    trace: bool = False,
    first_step: int = 0,
    resume: list | None = None,
) -> RunResult:
    """Run ``transition`` from ``positions`` (chain, dim) as the module docstring says.

    ``batches(chain)`` gives a chain's minibatch indices (an
    :class:`~ppl_bdl.inference.loop.minibatch.EpochBatches`, or None for the full batch); ``rates``
    the steps' rates (:class:`Rates`; None: the transition takes none); ``chain_ids`` the chains' numbers (their seeds;
    default 0, 1, ...); ``vectorize=False`` runs them one after another even where the backend
    could vectorise them; ``trace``: every step's infos come back (``step_infos``), not only
    the kept steps' (VI's losses, the step-size pilot's potentials); ``first_step``: the step
    counter's start (the rates' schedule reads it: a run continued in parts); ``resume``:
    the ``states`` of an earlier run of the same chains, to go on from (instead of
    ``init``)."""
    chains = list(range(len(positions))) if chain_ids is None else list(chain_ids)
    vectorised = vectorize and backend.vectorized_chains and len(chains) > 1
    part_chains = [chains] if vectorised else [[c] for c in chains]
    made = {c: batches(c) for c in chains}
    check_spread(backend, vectorised, made[chains[0]], name)
    pad = chain_padding(backend, len(chains)) if vectorised else 0
    bar = progress_bar(plan.num_steps * len(chains), name) if progress else None
    run = ChunkedRun(
        backend,
        transition,
        _runner(backend, transition, vectorised, rates),
        seed,
        plan,
        data,
        vectorised,
        trace,
        first_step,
        pad,
        bar,
    )
    parts, failure, states = [], None, []
    try:
        for g, group in enumerate(part_chains):
            try:
                part = run(
                    group,
                    np.stack([positions[chains.index(c)] for c in group]),
                    [made[c] for c in group],
                    1.0 if rates is None else part_scale(rates.scale, chains, group, pad),
                    None if resume is None else resume[g],
                )
            except KeyboardInterrupt:  # Ctrl-C as the group started: the groups before are kept
                failure = Failure(0, group[:1], "interrupted")
                states.append(None)
                break
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


def _runner(backend, transition: Transition, vectorised: bool, rates: Rates | None):
    """The compiled runner of ``transition``'s steps, from the backend's program cache: keyed by
    the transition's and the rates' keys where they have them (another fit of the same model
    reuses it), else by the step and unit functions themselves (runs that share them, a
    step-size pilot and the run it sets up, share it)."""
    unit = None if rates is None else rates.unit
    if unit is None:
        unit_key = None
    else:
        unit_key = same(unit) if rates.key is None else rates.key
    step_key = same(transition.step) if transition.key is None else transition.key
    return programs(backend).get(
        ("loop", step_key, vectorised, unit_key),
        lambda: backend.compile_loop(
            _loop_step(backend, transition, vectorised, unit), transition.emit
        ),
    )


def _collect(parts: list[RunPart], final, failure) -> RunResult:
    draws = [d for p in parts for d in p.draws]
    infos = [i for p in parts for i in p.infos]
    traced = [t for p in parts for t in p.step_infos]
    result = RunResult(None, {}, final, failure)
    kept, n = most_draws([len(d) for d in draws])
    if kept:
        result.draws = np.stack([draws[i][:n] for i in kept])
        result.infos = {k: np.stack([infos[i][k][:n] for i in kept]) for k in infos[kept[0]]}
    full = next((t for t in traced if t), None)
    if full is not None:  # a chain stopped before its first chunk has none: cut to 0 steps
        n = min(len(next(iter(t.values()))) if t else 0 for t in traced)
        result.step_infos = {
            k: np.stack([t[k][:n] if t else v[:0] for t in traced]) for k, v in full.items()
        }
    return result


def most_draws(lengths: list[int]) -> tuple[list[int], int]:
    """The chains kept after a run stopped early, and their common length: the length that
    keeps the most draws (chains one after another: the chains that finished whole, or all of
    them cut to the stopped chain's draws); chains shorter than it are left out.

    >>> most_draws([100, 100, 30]), most_draws([100, 80, 70]), most_draws([0, 0])
    (([0, 1], 100), ([0, 1, 2], 70), ([], 0))
    """
    best, length = 0, 0
    for n in sorted(set(lengths), reverse=True):
        total = n * sum(1 for m in lengths if m >= n)
        if n > 0 and total > best:
            best, length = total, n
    return [i for i, m in enumerate(lengths) if length and m >= length], length


def _loop_step(backend, transition: Transition, vectorised: bool, unit):
    """The loop's step t: the transition (vmapped over the chains), each chain's key folded
    with t, the rate scale × unit(t)."""

    def one(state, chain_key, idx, rate, data, t):
        key = backend.random.fold_in(chain_key, t)
        return transition.step(key, state, Batch(data, idx, t), rate)

    def step(state, x, inputs, t):
        with backend.activate():
            data, scale, chain_keys = inputs
            rate = scale if unit is None else scale * unit(t)
            idx = x.get("idx")
            if vectorised:
                # A rate per chain (VI's fits, each cut on its own plateau) or one for all.
                per_chain = 0 if len(rate.shape) else None
                axes = (0, 0, None if idx is None else 0, per_chain, None, None)
                return backend.vmap(one, in_axes=axes)(state, chain_keys, idx, rate, data, t)
            return one(state, chain_keys, idx, rate, data, t)

    return step


def progress_bar(total: int, name: str) -> ProgressBar | None:
    """A progress bar on stderr for ``total`` steps of ``name`` (None without tqdm)."""
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        return None
    return ProgressBar(tqdm(total=total, desc=name, file=sys.stderr, leave=False, unit="step"))


class ProgressBar:
    """A tqdm bar that also shows how the run goes, from each chunk's step infos, as NumPyro's
    and PyMC's bars do: the mean loss (VI, ensembles), the mean acceptance rate, the step size
    and the divergences so far (NUTS, HMC), the step size (SG-MCMC).

    Example
    -------
    >>> import io
    >>> from tqdm import tqdm
    >>> bar = ProgressBar(tqdm(total=10, file=io.StringIO()))
    >>> bar.update(5, {"acceptance_rate": np.array([0.7, 0.9]), "step_size": np.array([0.1, 0.1])})
    >>> bar.postfix
    {'accept': '0.80', 'step size': '0.1'}
    """

    def __init__(self, bar):
        self.bar = bar
        self.postfix: dict[str, str] = {}
        self._divergences = 0

    def update(self, steps: int, infos: dict | None = None) -> None:
        """Advance by ``steps``; ``infos``: the steps' infos (arrays of one value per step, and
        per chain where chains run side by side), whose summary the bar shows."""
        shown = self._summary(infos) if infos else {}
        if shown:  # a chunk that kept nothing (warmup) leaves the last summary shown
            self.postfix = shown
            self.bar.set_postfix(shown, refresh=False)
        self.bar.update(steps)

    def _summary(self, infos: dict) -> dict[str, str]:
        values = {k: np.asarray(v, dtype=float) for k, v in infos.items() if np.size(v)}
        shown = {}
        loss = values.get("loss")
        if loss is not None and np.isfinite(loss).any():
            shown["loss"] = f"{loss[np.isfinite(loss)].mean():.4g}"
        if "acceptance_rate" in values:
            shown["accept"] = f"{values['acceptance_rate'].mean():.2f}"
        if "step_size" in values:  # the chunk's last step (its chains' mean)
            shown["step size"] = f"{np.mean(values['step_size'][-1]):.3g}"
        if "diverging" in values:
            self._divergences += int(values["diverging"].sum())
            shown["divergences"] = str(self._divergences)
        return shown

    def close(self) -> None:
        self.bar.close()
