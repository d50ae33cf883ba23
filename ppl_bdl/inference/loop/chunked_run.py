"""One group of chains run chunk by chunk through a compiled runner (the inside of
:func:`~ppl_bdl.inference.loop.driver.run_chains`): the chains' starts and keys, each chunk's
minibatch indices, the kept draws and infos read back, and where a run stopped.

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
class GroupPart:
    """One group's result: per chain of the group, its kept draws, their infos and every
    step's infos."""

    draws: list
    infos: list
    step_infos: list
    final_state: Any
    failure: Failure | None


@dataclass(frozen=True)
class GroupRun:
    """What every group of a run shares: the backend, the transition and its compiled runner,
    the seed, the plan, the data, how the chains run (side by side or not; ``pad`` copies of a
    group's last chain make it a multiple of the devices its chains are split over, their
    results dropped), whether every step's infos come back, the step counter's start, and the
    progress bar. Called with one group, it runs that group's chunks."""

    be: Any
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

    def __call__(self, group: list[int], positions, batches: list, scale, state=None) -> GroupPart:
        """Group ``group``'s chunks from ``positions`` (or, given, from ``state``), with its
        chains' minibatches and rate scale."""
        state, inputs = self._start(group, positions, scale, state)
        return self._chunks(group, batches, state, inputs)

    def _start(self, group, positions, scale, state):
        """The group's state (its chains' ``init`` stacked, or ``state``) and what every step
        reads unchanged (the data, the rates' scale, the chains' keys), placed."""
        be, transition, pad, vectorised = self.be, self.transition, self.pad, self.vectorised
        with be.scope(), be.activate():
            keys = [be.random.split(be.random.key(chain_seed(self.seed, c))) for c in group]
            keys += keys[-1:] * pad
            if state is None:
                starts = list(positions) + [positions[-1]] * pad
                states = [
                    transition.init(k[0], be.asarray(p), self.data)
                    for k, p in zip(keys, starts, strict=True)
                ]
                state = states[0]
                if vectorised:
                    state = be.tree_map(lambda *a: be.math.stack(list(a)), *states)
            state = be.place(state, chain_axis=0 if vectorised else None)
            chain_keys = [k[1] for k in keys]
            # The data (init ran on the first device; the loop reads it everywhere), the rates'
            # scale, the chains' keys.
            scale = be.place(be.asarray(scale), chain_axis=0 if np.ndim(scale) else None)
            chain_keys = be.math.stack(chain_keys) if vectorised else chain_keys[0]
            inputs = (
                be.place(self.data),
                scale,
                be.place(chain_keys, chain_axis=0 if vectorised else None),
            )
        return state, inputs

    def _chunks(self, group, batches, state, inputs) -> GroupPart:
        """The group's chunks, one compiled call each, until the plan ends, a step fails or
        Ctrl-C."""
        be, plan, trace, vectorised = self.be, self.plan, self.trace, self.vectorised
        rows, kept_infos, step_infos = [], [], []
        failure = None
        for start in range(0, plan.num_steps, plan.chunk):
            steps = min(plan.chunk, plan.num_steps - start)
            keep = plan.keep[start : start + steps]
            try:
                with be.scope(), be.activate():
                    xs = chunk_inputs(be, plan.chunk, steps, batches, vectorised, self.pad)
                    padded = np.zeros(plan.chunk, bool)
                    padded[:steps] = keep
                    result = self.runner(
                        state, xs, inputs, padded, steps, self.first_step + start, plan.rows, trace
                    )
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
            if self.bar is not None:
                self.bar.update(steps * len(group), result.infos)
        per_chain = _per_chain(rows, kept_infos, step_infos, len(group), vectorised)
        return GroupPart(*per_chain, state, failure)


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


def chunk_inputs(be, length: int, steps: int, batches, vectorised: bool, pad: int = 0) -> dict:
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
        xs["idx"] = be.place(
            idx, chain_axis=1 if vectorised else None, batch_axis=2 if vectorised else 1
        )
    return xs
