"""One part of a run (the chains that run together) chunk by chunk through a compiled runner
(the inside of :func:`~ppl_bdl.inference.loop.driver.run_chains`): the chains' starts and keys,
each chunk's minibatch indices, the kept draws and infos read back, and where a run stopped.

Example
-------
>>> from ppl_bdl.inference.loop.chunked_run import chain_seed
>>> chain_seed(0, 3), chain_seed(1, 0)
(3, 1000003)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ppl_bdl.backend_protocol import Transition


@dataclass
class Failure:
    """Where a run stopped early: the step, the chains affected, and why ("nonfinite" or
    "interrupted")."""

    step: int
    chains: list[int]
    reason: str


def chain_seed(seed: int, chain: int) -> int:
    """The integer seed of chain ``chain`` (its random key and its minibatch order)."""
    return int(seed) * 1_000_003 + int(chain)


@dataclass
class RunPart:
    """One part's result: per chain of the part, its kept draws, their infos and every
    step's infos."""

    draws: list
    infos: list
    step_infos: list
    final_state: Any
    failure: Failure | None


@dataclass(frozen=True)
class ChunkedRun:
    """What every part of a run shares: the backend, the transition and its compiled runner,
    the seed, the plan, the data, how the chains run (side by side or not; ``pad`` copies of a
    part's last chain make it a multiple of the devices its chains are split over, their
    results dropped), whether every step's infos come back, the step counter's start, and the
    progress bar. Called with one part's chains, it runs their chunks."""

    backend: Any
    transition: Transition
    runner: Callable
    seed: int
    plan: Any
    data: Any
    vectorised: bool
    trace: bool
    first_step: int
    pad: int
    bar: Any

    def __call__(self, chains: list[int], positions, batches: list, scale, state=None) -> RunPart:
        """The chunks of the part of ``chains`` from ``positions`` (or, given, from ``state``),
        with its chains' minibatches and rate scale."""
        state, inputs = self._start(chains, positions, scale, state)
        return self._chunks(chains, batches, state, inputs)

    def _start(self, chains, positions, scale, state):
        """The part's state (its chains' ``init`` stacked, or ``state``) and what every step
        reads unchanged (the data, the rates' scale, the chains' keys), placed."""
        backend, transition, pad, vectorised = (
            self.backend,
            self.transition,
            self.pad,
            self.vectorised,
        )
        with backend.scope(), backend.activate():
            keys = [
                backend.random.split(backend.random.key(chain_seed(self.seed, c))) for c in chains
            ]
            keys += keys[-1:] * pad
            if state is None:
                starts = list(positions) + [positions[-1]] * pad
                states = [
                    transition.init(k[0], backend.asarray(p), self.data)
                    for k, p in zip(keys, starts, strict=True)
                ]
                state = states[0]
                if vectorised:
                    state = backend.tree_map(lambda *a: backend.math.stack(list(a)), *states)
            state = backend.place(state, chain_axis=0 if vectorised else None)
            chain_keys = [k[1] for k in keys]
            # The data (init ran on the first device; the loop reads it everywhere), the rates'
            # scale, the chains' keys.
            scale = backend.place(backend.asarray(scale), chain_axis=0 if np.ndim(scale) else None)
            chain_keys = backend.math.stack(chain_keys) if vectorised else chain_keys[0]
            inputs = (
                backend.place(self.data),
                scale,
                backend.place(chain_keys, chain_axis=0 if vectorised else None),
            )
        return state, inputs

    def _chunks(self, group, batches, state, inputs) -> RunPart:
        """The group's chunks, one compiled call each, until the plan ends, a step fails or
        Ctrl-C (wherever it lands: the chunks read back before it are kept)."""
        plan, done, failure = self.plan, [], None
        for start in range(0, plan.num_steps, plan.chunk):
            steps = min(plan.chunk, plan.num_steps - start)
            try:
                result = self._run_chunk(state, inputs, batches, start, steps)
                done.append(self._read(result, group, start, steps))  # whole, or not at all
                state, failure = done[-1].state, done[-1].failure
                if failure is not None:
                    break
                if self.bar is not None:
                    self.bar.update(steps * len(group), result.infos)
            except KeyboardInterrupt:
                ran = sum(chunk.ran for chunk in done)
                state = done[-1].state if done else state
                failure = Failure(ran, group[:1], "interrupted")
                break
        if failure is not None and failure.reason == "nonfinite":
            step = failure.step
            if step >= 1 and plan.keep[step - 1]:  # its position is where U is not finite
                _drop_last_row(done)
        kept = [chunk for chunk in done if chunk.rows is not None]
        rows, kept_infos = [c.rows for c in kept], [c.kept_infos for c in kept]
        step_infos = [c.step_infos for c in done if c.ran] if self.trace else []
        per_chain = _per_chain(rows, kept_infos, step_infos, len(group), self.vectorised)
        return RunPart(*per_chain, state, failure)

    def _run_chunk(self, state, inputs, batches, start: int, steps: int):
        """One compiled call: ``steps`` steps from step ``start``."""
        backend, plan = self.backend, self.plan
        with backend.scope(), backend.activate():
            xs = chunk_inputs(backend, plan.chunk, steps, batches, self.vectorised, self.pad)
            padded = np.zeros(plan.chunk, bool)
            padded[:steps] = plan.keep[start : start + steps]
            return self.runner(
                state, xs, inputs, padded, steps, self.first_step + start, plan.rows, self.trace
            )

    def _read(self, result, group: list[int], start: int, steps: int) -> ChunkRead:
        """What a chunk's result adds to the run, and where it stopped (a non-finite step, or
        Ctrl-C in a runner that steps in Python)."""
        ran = steps if result.failed_at < 0 else result.failed_at
        keep = self.plan.keep[start : start + steps]
        kept_infos = result.infos
        if self.trace and result.rows is not None:
            kept_infos = {k: v[keep[:ran]] for k, v in result.infos.items()}
        failure = None
        if result.interrupted:
            failure = Failure(start + ran, group[:1], "interrupted")
        elif result.failed_at >= 0:
            bad = _failed_chains(result.failed_info, self.vectorised)
            named = sorted({group[min(i, len(group) - 1)] for i in bad}, key=group.index)
            failure = Failure(start + ran, named or group[:1], "nonfinite")
        step_infos = result.infos if self.trace else {}
        return ChunkRead(result.state, result.rows, kept_infos, step_infos, ran, failure)


@dataclass
class ChunkRead:
    """One chunk as read back: the state after it, its kept rows (None: none) and their infos,
    every step's infos (traced runs), the steps it ran and where it stopped early, if it did."""

    state: Any
    rows: Any
    kept_infos: dict
    step_infos: dict
    ran: int
    failure: Failure | None


def _drop_last_row(done: list[ChunkRead]) -> None:
    """Drop the last kept row (and its infos) of the chunks ``done``."""
    for chunk in reversed(done):
        if chunk.rows is not None and len(chunk.rows):
            chunk.rows = chunk.rows[:-1]
            chunk.kept_infos = {k: v[:-1] for k, v in chunk.kept_infos.items()}
            return


def _per_chain(rows, kept_infos, step_infos, chains: int, vectorised: bool):
    """Each chain's draws, kept infos and step infos, joined over the chunks."""

    def join(parts, i):
        if not parts or not parts[0]:
            return {}
        return {
            k: np.concatenate([p[k][:, i] if vectorised else p[k] for p in parts]) for k in parts[0]
        }

    draws = [
        np.concatenate([r[:, i] if vectorised else r for r in rows]) if rows else np.zeros((0,))
        for i in range(chains)
    ]
    return (
        draws,
        [join(kept_infos, i) for i in range(chains)],
        [join(step_infos, i) for i in range(chains)],
    )


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


def chunk_inputs(backend, length: int, steps: int, batches, vectorised: bool, pad: int = 0) -> dict:
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
        idx = backend.asarray(idx if vectorised else idx[:, 0], dtype="int")
        xs["idx"] = backend.place(
            idx, chain_axis=1 if vectorised else None, batch_axis=2 if vectorised else 1
        )
    return xs
