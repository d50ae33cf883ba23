"""The Pyro backend's loop: a plain Python loop around the core's step, on the fit's device.

It runs the chunk's real steps only (no padding), stops at the first step whose ``ok`` is False
(that step's update is not kept), and clones ``emit(carry)`` at kept steps. The step itself is
traced where it pays (:meth:`PyroBackend.trace_value_and_grad`); the loop adds no work.

Example
-------
>>> import torch
>>> from ppl_bdl.backends._torch_loop import compile_loop
>>> def step(carry, x, data):
...     new = carry + data * x["inc"]
...     return new, {"value": new}, torch.isfinite(new)
>>> run = compile_loop(step, emit=lambda c: c)
>>> xs = {"inc": torch.arange(5.0), "keep": torch.tensor([0, 1, 0, 1, 1], dtype=torch.bool)}
>>> result = run(torch.tensor(0.0), xs, torch.tensor(2.0), num_steps=4, num_rows=3)
>>> float(result.carry), int(result.kept), result.rows[:2].tolist()
(12.0, 2, [2.0, 12.0])
"""

from __future__ import annotations

import numpy as np
import torch

from ..backend_protocol import LoopResult
from ._torch_trees import index_tree, stack_tree, tree_map


def compile_loop(step, emit):
    """The runner of ``step`` over chunks (see :meth:`ppl_bdl.backend_protocol.Autodiff.compile_loop`)."""

    def runner(carry, xs, data, num_steps: int, num_rows: int) -> LoopResult:
        keep = np.asarray(xs["keep"].cpu() if isinstance(xs["keep"], torch.Tensor) else xs["keep"])
        infos, rows = [], []
        failed_at = -1
        with torch.no_grad():
            for i in range(num_steps):
                new, info, ok = step(carry, index_tree(xs, i), data)
                infos.append(info)
                if not bool(ok):
                    failed_at = i
                    break
                carry = new
                if keep[i] and len(rows) < num_rows:
                    rows.append(tree_map(lambda a: a.detach().clone(), emit(carry)))
        kept = len(rows)
        if rows and kept < num_rows:  # pad to the promised number of rows (never read)
            rows += [rows[-1]] * (num_rows - kept)
        return LoopResult(
            carry,
            stack_tree(infos) if infos else None,
            stack_tree(rows) if rows else None,
            failed_at,
            kept,
        )

    return runner
