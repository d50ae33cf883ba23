"""Building a VI run's guide: its initial point from prior draws (the fit's shared draws,
:func:`ppl_bdl.inference.starts.prior_draws`), and the guide from a name or a ``@bdl.guide``
function with its settings checked against the options its caller names."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ppl_bdl.errors import ConfigError, ModelError
from ppl_bdl.inference.setup import Setup
from ppl_bdl.inference.starts import initial_positions, prior_draws
from ppl_bdl.inference.vi import guides as guide_registry
from ppl_bdl.inference.vi.guides.amortized import Amortized, AmortizedGuide
from ppl_bdl.inference.vi.guides.amortized_refine import REFINE_OPTIONS, refinement_misplaced
from ppl_bdl.inference.vi.guides.base import GuideInit
from ppl_bdl.inference.vi.guides.custom import CustomGuide, bind_guide

#: The learning rate of a guide by default (others: 0.01): a flow's coupling networks diverged
#: at 0.01 on the shipped sine BNN (the loss went 185 -> 76,000 and sigma to 2.9 on NumPyro).
#: A full-rank guide on the shipped BNNs stalled at lr=0.01 at a loss 8 nats above what 0.003
#: reaches (Adam's noise floor: its d(d+1)/2 parameters).
DEFAULT_LR = {"flow": 1e-3, "fullrank": 3e-3}
#: Particles per step of a guide by default (others: 1). The flow's one-particle gradient is
#: noisy enough to bias where Adam ends: on the sine BNN sigma 0.20 with 1 particle (converged,
#: 20,000 and 50,000 steps alike), 0.18 with 8 (true 0.15). A full-rank guide's likewise: on the
#: demo's BNN its loss ended 2 nats above the mean-field guide's with 1 particle (sigma 0.205),
#: 12 nats below with 8 (sigma 0.165).
DEFAULT_PARTICLES = {"flow": 8, "fullrank": 8}
#: The most steps of a run to convergence (``num_steps=None``) of a guide by default (others:
#: :data:`~ppl_bdl.inference.vi.monitor.AUTO_MAX_STEPS`, 100,000). The flow's 8-particle step
#: costs most (on a 1-16-1 BNN: 0.5 ms on NumPyro, 4 ms on Pyro, one CPU core): at 20,000 steps
#: a default fit takes about a minute and a half on Pyro, with the plateau rule's backstop cuts
#: at 11,000, 14,000 and 17,000, and that BNN's noise sigma is 0.17 on both backends (true 0.15;
#: 0.17 too after the 49,000 steps a cap of 100,000 allowed, where the loss ends 7 nats lower:
#: pass ``num_steps`` for a longer run).
DEFAULT_MAX_STEPS = {"flow": 20_000}

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
    setup: Setup,
    spec: Any,
    init: GuideInit | Callable[[], GuideInit],
    seed: int,
    settings: dict,
    run_options: Iterable[str],
    batch_size: int | None = None,
):
    """A guide from a registered name, a ``@bdl.guide`` function or a
    :class:`~ppl_bdl.inference.vi.guides.Amortized`, with its settings checked (``run_options``: the method's
    own options, named in the error for an unknown setting). ``init``: the guide's starting
    point, or a function that makes it (prior draws: made only when a guide needs them)."""
    get_init = init if callable(init) else (lambda: init)
    if isinstance(spec, Amortized):
        guide = AmortizedGuide(
            spec,
            setup.trace,
            setup.layout,
            setup.params,
            seed,
            batch_size,
            get_init,
            lambda layout, init_g: _registered(
                spec.global_guide, layout, setup.backend, init_g, seed, settings, run_options
            ),
        )
        if settings and guide.global_guide is None:
            raise ConfigError(
                f"option(s) {sorted(settings)} configure the amortized guide's global guide "
                f"({spec.global_guide!r}), but model {setup.bound.name!r} has no latent site "
                "outside the amortized sites for it. Leave them out."
            )
        return guide
    bound = bind_guide(spec, setup.bound)
    if bound is not None:
        if settings:
            raise ConfigError(
                f"option(s) {sorted(settings)} do not apply to a custom guide (they configure the "
                "built-in guides). Known VI options: " + ", ".join(sorted(run_options)) + "."
            )
        return CustomGuide(setup.layout, setup.backend, get_init(), bound, seed=seed)
    if not isinstance(spec, str):
        raise ConfigError(
            f"guide must be a name ({', '.join(guide_registry.available())}), a @bdl.guide "
            f"function or guides.Amortized(encoder, sites=[...]), got {type(spec).__name__}."
        )
    return _registered(spec, setup.layout, setup.backend, get_init(), seed, settings, run_options)


def _registered(
    name: str,
    layout,
    backend,
    init: GuideInit,
    seed: int,
    settings: dict,
    run_options: Iterable[str],
):
    """The registered guide ``name`` on ``layout``, its settings checked against its factory."""
    misplaced = [k for k in REFINE_OPTIONS if k in settings]
    if misplaced:
        raise refinement_misplaced(misplaced, f"method='vi' with guide={name!r}")
    factory = guide_registry.get(name)
    accepted = set(inspect.signature(factory).parameters) - {"layout", "backend", "init", "seed"}
    unknown = set(settings) - accepted
    if unknown:
        raise ConfigError(
            f"unknown option(s) {sorted(unknown)} for method='vi' with guide={name!r}. Guide "
            f"settings: {sorted(accepted) or 'none'}; VI options: {sorted(run_options)}."
        )
    return factory(layout, backend, init, seed=seed, **settings)
