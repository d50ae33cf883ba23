"""CAVI as a typed method object: ``bdl.CAVI(tol=1e-8)``.

Example
-------
>>> import ppl_bdl as bdl
>>> bdl.CAVI(restarts=3).restarts
3
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ppl_bdl.errors import ConfigError
from ppl_bdl.inference.cavi.coordinate_ascent import DEFAULT_NUM_STEPS, default_tol, run_cavi
from ppl_bdl.inference.method import Method, check_int, check_number, option
from ppl_bdl.inference.vi.psis import importance_log_weights


@dataclass(frozen=True)
class CAVI(Method):
    """Coordinate-ascent variational inference for conditionally conjugate models: each
    mean-field factor updated in closed form in turn ("Advancements in Variational Inference",
    Eq. 47-49), until the ELBO's relative change is below ``tol``.

    Example
    -------
    >>> import ppl_bdl as bdl
    >>> bdl.CAVI().num_steps
    1000
    """

    num_samples: int = option(1000, "draws from the fitted factors")
    num_steps: int = option(DEFAULT_NUM_STEPS, "the most sweeps over the factors")
    tol: float | None = option(
        None,
        "stop when the ELBO's relative change is below tol (None: 1e-8, or 100 machine "
        "epsilons where larger)",
    )
    restarts: int = option(1, "starts (seeds seed, seed + 1, ...); the best final ELBO is kept")

    method_name: ClassVar[str] = "cavi"
    hints: ClassVar[dict[str, str]] = {
        "lr": "CAVI's updates are closed-form (no optimizer, learning rate or batch size)",
        "batch_size": "CAVI's updates are closed-form (no optimizer, learning rate or batch size)",
        "num_chains": "CAVI fits one set of factors (use restarts for several starts)",
        "num_warmup": "CAVI runs num_steps sweeps (no warmup)",
        "init": "CAVI starts from its own initial factors (use restarts for several starts)",
        "thinning": "CAVI keeps num_samples draws from the fitted factors",
    }

    def __post_init__(self) -> None:
        check_int(self, "num_samples")
        check_int(self, "num_steps")
        check_int(self, "restarts")
        check_number(self, "tol", 0.0, optional=True)

    def settings(self) -> dict:
        return {**self.given(), "num_samples": self.num_samples}

    def run(self, setup, *, seed: int, progress: bool, log_likelihood: bool, chain_ids):
        backend = setup.backend
        if backend.device_count > 1:
            raise ConfigError(
                f"method='cavi' runs on one device; device={backend.device!r} names "
                f"{backend.device_count}. Name one device."
            )
        tol = default_tol(backend.precision) if self.tol is None else float(self.tol)
        return run_cavi(
            setup,
            self.num_samples,
            seed,
            progress,
            log_likelihood,
            num_steps=self.num_steps,
            tol=tol,
            restarts=self.restarts,
        )

    def importance_log_weights(self, setup, post, seed: int):
        return importance_log_weights(setup, post, seed=seed)
