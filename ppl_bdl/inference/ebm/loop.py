"""The one place the EBM code runs the project's loop (:func:`ppl_bdl.inference.loop.driver.run_chains`).

Training (Algorithm 3's outer loop) and sampling (a chain on a trained energy) are both
:class:`~ppl_bdl.inference.loop.driver.Transition` s of one chain, run here: one jitted loop per chunk
of steps on JAX, a plain loop on torch, minibatch indices from
:class:`~ppl_bdl.inference.loop.minibatch.EpochBatches`, stopping at the first step whose info holds a
non-finite number (or at Ctrl-C) with the state from before it.

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl.inference.loop.driver import Transition
>>> from ppl_bdl.inference.ebm.loop import run_transition
>>> count = Transition(lambda key, position, data: position,
...                    lambda key, state, batch, rate: (state + 1.0, {"value": state}),
...                    lambda state: state)
>>> run = run_transition(bdl.backends.get("numpyro"), count, np.zeros(1), num_steps=5,
...                      seed=0, data=None, keep_last=True)
>>> run.draws.tolist()
[[[5.0]]]
"""

from __future__ import annotations

import numpy as np

from ppl_bdl.inference.loop.driver import Rates, RunResult, Transition, plan_run, run_chains
from ppl_bdl.inference.loop.minibatch import EpochBatches


def run_transition(
    backend,
    transition: Transition,
    position: np.ndarray,
    *,
    num_steps: int,
    seed: int,
    data,
    batches: EpochBatches | None = None,
    name: str = "ebm",
    progress: bool = False,
    chunk_size: int | None = None,
    keep_last: bool = False,
    rates: Rates | None = None,
    first_step: int = 0,
) -> RunResult:
    """Run ``transition`` for ``num_steps`` steps from ``position`` (one chain, flat), with
    ``rates`` (the optimizer's learning rates: :class:`~ppl_bdl.inference.loop.driver.Rates`) from
    step ``first_step`` of the schedule.

    ``keep_last``: keep ``emit(state)`` after the last step (``draws``, sampling); otherwise
    keep nothing but every step's info (``step_infos``) and the final state (``final_state``,
    the state before a failed step after a failure: training)."""
    keep = np.zeros(num_steps, bool)
    keep[-1] = keep_last
    row_floats = int(np.size(position)) if keep_last else 0
    plan = plan_run(keep, 1, row_floats, chunk_size, progress)
    return run_chains(
        backend,
        transition,
        np.asarray(position)[None],
        seed,
        plan,
        data,
        lambda chain: batches,
        name,
        rates,
        progress=progress,
        trace=not keep_last,
        first_step=first_step,
    )
