"""Building a VI run's guide: its initial point from prior draws (the fit's shared draws,
:func:`ppl_bdl.inference.starts.prior_draws`), and the guide from a name or a ``@bdl.guide``
function with its settings checked against the options its caller names."""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any

import numpy as np

from .. import guides as guide_registry
from ..errors import ConfigError, ModelError
from ..guides.base import GuideInit
from ..guides.custom import CustomGuide, bind_guide
from .setup import Setup
from .starts import initial_positions, prior_draws

#: Prior draws used to set a guide's initial mean and per-coordinate scale.
INIT_DRAWS = 20


def guide_init(setup: Setup, init_loc: Any, seed: int) -> GuideInit:
    """The guide's initial mean (``init_loc``: "prior", "median" or a dict of site values) and
    per-coordinate prior scale, both from prior draws in the unconstrained space."""
    dim = setup.layout.dim
    if isinstance(init_loc, np.ndarray | list | tuple):
        loc = np.asarray(init_loc, dtype=float).reshape(-1)
        if loc.shape != (dim,):
            raise ConfigError(f"init_loc has {loc.size} values; the model has {dim} latent dims.")
    elif not (isinstance(init_loc, dict) or init_loc in ("prior", "median")):
        raise ConfigError(
            f"init_loc must be 'prior', 'median', a dict of site values or a flat array, got {init_loc!r}."
        )
    try:
        draws = prior_draws(setup, INIT_DRAWS, seed)
    except ModelError:  # an improper (flat) prior has no draws: fall back to N(0, 1)-ish
        draws = None
    if draws is None or not np.all(np.isfinite(draws)):
        scale = np.ones(dim)
        center = np.zeros(dim)
        first = np.zeros(dim)
    else:
        scale = np.clip(draws.std(axis=0), 1e-3, 1e3)
        center, first = np.median(draws, axis=0), draws[0]
    if isinstance(init_loc, dict):
        loc = initial_positions(setup, init_loc, 1, seed)[0]
    elif isinstance(init_loc, str):
        loc = first if init_loc == "prior" else center
    return GuideInit(loc=np.asarray(loc, dtype=float), prior_scale=np.asarray(scale, dtype=float))


def build_guide(
    setup: Setup, spec: Any, init: GuideInit, seed: int, settings: dict, run_options: Iterable[str]
):
    """A guide from a registered name or a ``@bdl.guide`` function, with its settings checked
    (``run_options``: the method's own options, named in the error for an unknown setting)."""
    bound = bind_guide(spec, setup.bound)
    if bound is not None:
        if settings:
            raise ConfigError(
                f"option(s) {sorted(settings)} do not apply to a custom guide (they configure the "
                "built-in guides). Known VI options: " + ", ".join(sorted(run_options)) + "."
            )
        return CustomGuide(setup.layout, setup.backend, init, bound, seed=seed)
    if not isinstance(spec, str):
        raise ConfigError(
            f"guide must be a name ({', '.join(guide_registry.available())}) or a @bdl.guide "
            f"function, got {type(spec).__name__}."
        )
    factory = guide_registry.get(spec)
    accepted = set(inspect.signature(factory).parameters) - {"layout", "backend", "init", "seed"}
    unknown = set(settings) - accepted
    if unknown:
        raise ConfigError(
            f"unknown option(s) {sorted(unknown)} for method='vi' with guide={spec!r}. Guide "
            f"settings: {sorted(accepted) or 'none'}; VI options: {sorted(run_options)}."
        )
    return factory(setup.layout, setup.backend, init, seed=seed, **settings)
