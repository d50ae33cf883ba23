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

from ppl_bdl.errors import ConfigError
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


class ResumableTraining:
    """A network's training set up once, whose :meth:`run` runs (more) steps of its
    ``transition`` from where the last call stopped, and stops at a non-finite loss or gradient
    (or at Ctrl-C) keeping the state from before it (:attr:`failure` says where). The energy
    trainer (:class:`~ppl_bdl.inference.ebm.trainer.EBMTrainer`) and the score trainer
    (:class:`~ppl_bdl.inference.diffusion.trainer.ScoreTrainer`) are these.

    A subclass sets ``backend``, ``transition``, ``seed``, ``chunk_size``, ``_position`` (the
    chain's flat start), ``_data``, ``_batches`` and ``_rates`` and calls :meth:`_start` in its
    ``__init__``; it names its runs (:attr:`run_name`) and reads a run's state back into its
    result (:meth:`_read_back`, from ``_state`` and ``_infos``, every run's step infos).
    """

    run_name = "training"

    def _start(self) -> None:
        self._state, self._calls, self._infos, self._done = None, 0, [], 0
        self.failure = None

    def _read_back(self) -> None:
        raise NotImplementedError

    def run(self, num_steps: int, progress: bool = False) -> None:
        """``num_steps`` more steps from the state the last call ended in."""
        if self.failure is not None:
            raise ConfigError(f"this run already stopped ({self.failure.reason}); start anew.")
        transition = self.transition
        if self._state is not None:
            state = self._state
            transition = Transition(lambda *args: state, transition.step, transition.emit)
        run = run_transition(
            self.backend,
            transition,
            self._position,
            num_steps=num_steps,
            seed=self.seed + self._calls,
            data=self._data,
            batches=self._batches,
            name=self.run_name,
            progress=progress,
            chunk_size=self.chunk_size,
            rates=self._rates,
            first_step=self._done,
        )
        self._calls += 1
        if run.failure is not None:
            self.failure = run.failure
            self.failure.step += self._done
        self._done += len(run.step_infos.get("loss", np.zeros((1, 0)))[0])
        self._state = run.final_state if run.final_state is not None else self._state
        self._infos.append(run.step_infos)
        self._read_back()


def checked_int(name: str, value, low: int, high: int | None = None, what: str = "") -> int:
    """``value`` as an int in [low, high] (``high`` None: no bound; ``what`` says the bound in
    words), or a ConfigError naming ``name``."""
    ok = not isinstance(value, bool) and isinstance(value, int | np.integer)
    if not ok or value < low or (high is not None and value > high):
        bound = f"an int >= {low}" + (f" and {what}" if what else "")
        raise ConfigError(f"{name} must be {bound}, got {value!r}.")
    return int(value)
