"""VI with ``num_chains``: independent fits run side by side as the driver's chains.

Fit c starts from its own initial point and has its own noise, minibatch order and draws, all
from :func:`fit_seed`; one fit is exactly what VI was before ``num_chains``. The settings a fit
reports are the value itself for one fit and a list over the fits for several (:func:`each`).

Example
-------
>>> fit_seed(7, 0), fit_seed(7, 1) != 7
(7, True)
>>> each([3], True), each([3, 4], False)
(3, [3, 4])
>>> check_fits(4, model_params=None)
4
"""

from __future__ import annotations

from typing import Any

from ppl_bdl.errors import ConfigError
from ppl_bdl.inference.loop.chunked_run import chain_seed


def fit_seed(seed: int, fit: int) -> int:
    """The seed of fit ``fit`` of ``num_chains`` (its start, minibatch order and draws): the
    fit's own seed for the first (one fit is what it was before ``num_chains``), a chain's
    seed for the others."""
    return seed if fit == 0 else chain_seed(seed, fit)


def each(values: list, one: bool):
    """One fit's value itself; a list over several fits."""
    return values[0] if one else values


def check_fits(num_chains: Any, model_params) -> int:
    """``num_chains`` independent fits: an int >= 1; one when the model has ``bdl.param`` sites
    (each fit would have its own point estimates, and a Posterior holds one set)."""
    if isinstance(num_chains, bool) or not isinstance(num_chains, int) or num_chains < 1:
        raise ConfigError(
            f"num_chains must be an int >= 1 (independent VI fits), got {num_chains!r}."
        )
    if num_chains > 1 and model_params is not None:
        raise ConfigError(
            f"num_chains={num_chains} with method='vi' on a model with bdl.param sites "
            f"{sorted(model_params.shapes)}: each fit would find its own point estimates, and a "
            "Posterior holds one set. Run the fits one at a time (a seed each), or make the "
            "params latent (bdl.sample with a prior)."
        )
    return num_chains
