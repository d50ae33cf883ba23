"""The Pyro backend's loop: a plain Python loop around the core's step, on the fit's device.

It runs the chunk's steps, keeps each step's info (read to the host: reading it is the
finiteness check, with one flag of the new state), clones ``emit(state)`` at kept steps, and
stops at the first step whose info or new state is not finite, returning the state from
before it. A step's new state is a new object,
or, where a step updates arrays in place (``torch.optim``'s in-place optimizers), an update
whose gradient is not finite changes nothing (see :mod:`._torch_optimizer`): either way the
state the loop held before the failed step is that step's input, unchanged.

Example
-------
>>> import numpy as np, torch
>>> from ppl_bdl.backends.pyro.loop import compile_loop
>>> def step(state, x, data, t):
...     new = state + data * x["inc"]
...     return new, {"value": new}
>>> run = compile_loop(step, emit=lambda s: s)
>>> xs = {"inc": torch.arange(5.0)}
>>> keep = np.array([0, 1, 0, 1, 0], bool)
>>> result = run(torch.tensor(0.0), xs, torch.tensor(2.0), keep, steps=4, first=0, num_rows=3)
>>> float(result.state), result.rows.tolist(), result.infos["value"].tolist()
(12.0, [2.0, 12.0], [0.0, 2.0, 6.0, 12.0])
"""

from __future__ import annotations

import numpy as np
import torch

from ppl_bdl.backend_protocol import LoopResult
from ppl_bdl.backends.pyro.trees import index_tree, tree_map


def compile_loop(step, emit):
    """The runner of ``step`` over chunks (see :meth:`ppl_bdl.backend_protocol.Autodiff.compile_loop`)."""

    def runner(
        state, xs, data, keep, steps: int, first: int, num_rows: int, trace: bool = True
    ) -> LoopResult:
        keep = np.asarray(keep, bool)
        failed_at, failed, interrupted = -1, None, False
        # The steps done, as linked pairs (previous, item): one assignment records a step, so
        # a Ctrl-C leaves the state, the infos and the rows of the same steps.
        done = (state, None, None)
        with torch.no_grad():
            for i in range(steps):
                try:
                    new, info = step(done[0], index_tree(xs, i), data, first + i)
                    values = _host(info)
                    if not (_finite(values) and _state_finite(new)):
                        failed_at, failed = i, values
                        break
                    row = tree_map(lambda a: a.detach().clone(), emit(new)) if keep[i] else None
                    done = _record(done, new, values if trace or keep[i] else None, row)
                except KeyboardInterrupt:  # Ctrl-C: the steps before this one are kept
                    failed_at, interrupted = i, True
                    break
        state, infos, rows = done[0], _items(done[1]), _items(done[2])
        if len(rows) > num_rows:
            raise ValueError(f"{len(rows)} kept steps in a chunk with room for {num_rows} rows")
        result = LoopResult(state, _stack(infos), _stack_rows(rows), failed_at, failed)
        return result._replace(interrupted=interrupted)

    return runner


def _record(done: tuple, state, values: dict | None, row) -> tuple:
    """``done`` (state, infos, rows) after one more step: its new state, its info and its row
    (None: not kept) linked on."""
    infos = done[1] if values is None else (done[1], values)
    rows = done[2] if row is None else (done[2], row)
    return state, infos, rows


def _items(linked) -> list:
    """The items of linked pairs ``(previous, item)``, first to last."""
    items = []
    while linked is not None:
        linked, item = linked
        items.append(item)
    return items[::-1]


def _host(info: dict) -> dict:
    """The info's values on the host, as NumPy (their dtypes kept)."""
    return {
        k: v.cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v)
        for k, v in info.items()
    }


def _finite(values: dict) -> bool:
    return all(np.isfinite(v).all() for v in values.values() if np.issubdtype(v.dtype, np.floating))


def _state_finite(state) -> bool:
    """Whether every float of a step's new state is finite (one reduction per leaf)."""
    flags = []

    def check(leaf):
        if isinstance(leaf, torch.Tensor) and leaf.is_floating_point():
            flags.append(torch.isfinite(leaf.sum()))

    tree_map(check, state)
    return bool(torch.stack(flags).all()) if flags else True


def _stack(infos: list[dict]) -> dict:
    if not infos:
        return {}
    return {k: np.asarray([i[k] for i in infos]) for k in infos[0]}


def _stack_rows(rows: list):
    if not rows:
        return None
    return tree_map(lambda *a: torch.stack(a).cpu().numpy(), *rows)
