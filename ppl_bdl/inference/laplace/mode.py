"""The MAP a Laplace fit is centred on: one ensemble member's optimizer run, or a given point.

The run is :func:`~ppl_bdl.inference.ensemble.ensemble_transition` for one member: the
backend's optimizer on the potential U(θ) = −log p(θ, D) − log|J| (minibatched and scaled by
N / B where ``batch_size`` is given), driven by the one loop
(:func:`~ppl_bdl.inference.loop.driver.run_chains`), keeping the last position.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ppl_bdl.errors import ConfigError, InferenceError, RunInterrupted
from ppl_bdl.inference.ensemble import EnsembleConfig, ensemble_transition, run_map_steps
from ppl_bdl.inference.setup import Setup, minibatch_plate
from ppl_bdl.inference.starts import initial_positions


def find_mode(
    setup: Setup, config: EnsembleConfig | None, init: Any, seed: int, progress: bool
) -> tuple[np.ndarray, np.ndarray | None]:
    """θ* (flat, NumPy) and the loss of every step (None without steps). ``config`` None:
    ``init`` is θ* as it is (``num_steps=0``)."""
    if config is None:
        if init is None:
            raise ConfigError(
                "method='laplace' with num_steps=0 takes init as the MAP, but no init was "
                "given. Pass init=<a Posterior of this model> or init={site: value, ...}, or "
                "set num_steps >= 1 to find the MAP."
            )
        return initial_positions(setup, init, 1, seed)[0], None
    plate = minibatch_plate(setup, config.batch_size)
    transition, data = ensemble_transition(setup, config, plate)
    positions = initial_positions(setup, init, 1, seed)
    run = run_map_steps(
        setup,
        transition,
        data,
        positions,
        config,
        plate,
        seed=seed,
        kind="laplace",
        progress=progress,
        chain_ids=[0],
    )
    if run.failure is not None:
        if run.failure.reason == "interrupted":
            raise RunInterrupted(f"the MAP search was interrupted at step {run.failure.step}.")
        raise InferenceError(
            f"method='laplace': the loss or its gradient is not finite (NaN or inf) at step "
            f"{run.failure.step} of the MAP search. Try a smaller lr, clip_norm=..., or check "
            "the model's priors and data."
        )
    return np.asarray(run.draws[0, -1], float), run.step_infos["loss"][0].astype(float)
