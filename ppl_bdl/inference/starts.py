"""Where the chains of a fit start (``init=``), and prior draws of the flat latent vector.

Prior draws are one vectorised, compiled run of the model (the backend's ``vmap`` over seeds,
``jit``), made once per setup and seed and shared by the MCMC start (``init="median"``) and the
guide's initial point (:func:`ppl_bdl.inference.vi.guide_setup.guide_init`).

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import dist
>>> from ppl_bdl.inference.setup import prepare
>>> from ppl_bdl.inference.starts import initial_positions
>>> @bdl.model
... def m():
...     bdl.sample("w", dist.Normal(0.0, 1.0), shape=(3,))
>>> setup = prepare(m(), "numpyro", "float32", seed=0)
>>> initial_positions(setup, "median", num_chains=4, seed=0).shape
(4, 3)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ppl_bdl.dsl.bound_data import fill_data
from ppl_bdl.dsl.model import BoundModel
from ppl_bdl.errors import ConfigError, ModelError
from ppl_bdl.inference.setup import Setup
from ppl_bdl.posterior.posterior import Posterior
from ppl_bdl.trace.interpreter import Evaluator
from ppl_bdl.trace.layout import LatentLayout
from ppl_bdl.trace.model_trace import trace_model

#: Jitter of the prior median, in prior standard deviations, for ``init="median"``.
MEDIAN_JITTER = 0.1
#: Prior draws that estimate the median and spread for ``init="median"``.
MEDIAN_DRAWS = 25
#: Prior draws made at once per fit and seed (the guide's init reads the first 20 of them).
PRIOR_DRAWS = MEDIAN_DRAWS


def initial_positions(setup: Setup, init: Any, num_chains: int, seed: int) -> np.ndarray:
    """Initial flat unconstrained positions, one row per chain.

    ``init`` is None (the default: "median", or "uniform" when the model has a flat prior, which
    has no draws), "uniform" (uniform on [-2, 2] in the unconstrained space, as Stan and NumPyro do),
    "prior" (a prior draw per chain), "median" (the prior median, estimated from 25 prior draws,
    plus a jitter of :data:`MEDIAN_JITTER` prior standard deviations per chain: each chain starts
    near the prior's centre, not all at one point; a good start for neural networks), a dict of
    constrained values for some sites (the rest uniform), or a :class:`~ppl_bdl.Posterior` of
    the same model (a VI or MAP fit: chain c starts at its draw c, taken round-robin).
    """
    layout = setup.layout
    rng = np.random.default_rng(seed)
    if init is None:  # the default: the prior's centre; uniform where a flat prior has none
        try:
            return initial_positions(setup, "median", num_chains, seed)
        except ModelError:
            init = "uniform"
    if isinstance(init, str) and init == "uniform":
        return rng.uniform(-2.0, 2.0, size=(num_chains, layout.dim))
    if isinstance(init, Posterior):
        return _from_posterior(setup, init, num_chains)
    if isinstance(init, dict):
        unknown = set(init) - set(layout.names)
        if unknown:
            raise ConfigError(
                f"init has values for {sorted(unknown)}, which are not latent sites of the model "
                f"(latent sites: {layout.names})."
            )
        return _from_values(setup, init, rng.uniform(-2.0, 2.0, size=(num_chains, layout.dim)))
    if init in ("prior", "median"):
        draws = prior_draws(setup, num_chains if init == "prior" else MEDIAN_DRAWS, seed)
        if init == "prior":
            return draws
        q25, median, q75 = np.percentile(draws, [25, 50, 75], axis=0)
        sd = (q75 - q25) / 1.349  # the standard deviation of a normal with that spread
        return median + MEDIAN_JITTER * sd * rng.normal(size=(num_chains, layout.dim))
    raise ConfigError(
        "init must be 'uniform', 'prior', 'median', a dict of site values or a Posterior, got "
        f"{init!r}."
    )


def _from_values(setup: Setup, init: dict, rows: np.ndarray) -> np.ndarray:
    """``rows`` (chains, d) with the sites of ``init`` (constrained values) set in every row.

    The model runs once with the values, validating them (an invalid value is named by the site
    it breaks); the other sites keep their uniform start."""
    backend, layout = setup.backend, setup.layout
    values = {k: backend.asarray(v) for k, v in init.items()}
    trace_model(setup.bound, backend, values=values, check_bounds=False)
    given = layout.unconstrain_sites(values, backend)
    for slot in layout.slots:
        if slot.name in given:
            if given[slot.name].size != slot.size:
                raise ConfigError(
                    f"init: the value of {slot.name!r} has shape "
                    f"{tuple(np.shape(init[slot.name]))}; the model's site has {slot.shape}."
                )
            rows[:, slot.offset : slot.offset + slot.size] = given[slot.name]
    return rows


def prior_draws(setup: Setup, count: int, seed: int) -> np.ndarray:
    """``count`` prior draws of the flat unconstrained latent vector (count, d).

    Made once per setup and seed (:data:`PRIOR_DRAWS` of them, or ``count`` if more) and kept:
    the MCMC start and the guide's initial point read the same draws."""
    if seed not in setup.prior or len(setup.prior[seed]) < count:
        setup.prior[seed] = _draw_prior(setup, max(count, PRIOR_DRAWS), seed)
    return setup.prior[seed][:count]


def _draw_prior(setup: Setup, count: int, seed: int) -> np.ndarray:
    """``count`` draws, one call of the compiled prior program (:func:`_prior_program`) each,
    draw i from the seed ``seed + i``."""
    backend = setup.backend
    data, _ = setup.bound.data_arrays(backend)
    with backend.scope(), backend.activate():
        program = _prior_program(setup)
        draws = [
            backend.to_numpy(program(backend.asarray(s, "int"), data))
            for s in range(seed, seed + count)
        ]
        return np.asarray(np.stack(draws), dtype=float)


def _prior_program(setup: Setup):
    """``draw(seed, data)``: the model run once with every site drawn from its prior from the key
    of ``seed``, compiled (``jit``) and called once per seed: on JAX a program mapped over the
    seeds took twice as long to compile (1.6 against 0.8 s for eight schools, 3.5 against 1.3 s
    for a small BNN), and 20 calls cost microseconds. Draw i is the one a run of the model
    from the key of seed i makes (as a start from that seed always was). It is kept on the
    model (:attr:`~ppl_bdl.dsl.model.Model.compiled`) per backend, data structure, data plate and
    latent layout, so another fit of the model reuses it; the data is an argument, not baked in.

    The model runs on one point of its data plate when every latent site is global: the draws
    need no likelihood, and a deep network's forward pass over all the data, once per draw,
    would cost more than the fit."""
    backend, layout, model = setup.backend, setup.layout, setup.bound.model
    _, template = setup.bound.data_arrays(backend)
    plate = setup.trace.data_plate
    key = (
        "prior draws",
        backend.name,
        backend.precision,
        backend.device,
        repr(template),
        plate,
        tuple(layout.slots),
    )
    if key not in model.compiled:
        # The program keeps no data: the data comes in as an argument, and the layout it keeps
        # is the slots alone (each draw is unconstrained by its own run's supports).
        unbound = BoundModel(model, (), {})
        slots = LatentLayout(layout.slots, sites={})
        batch = None if plate is None else {plate: np.zeros(1, np.int64)}

        def draw(seed, data):
            indices = (
                None if batch is None else {k: backend.asarray(v, "int") for k, v in batch.items()}
            )
            run = Evaluator(
                backend, key=backend.random.key(seed), missing="prior", batch=indices, record=True
            )
            unbound.run_with(run, fill_data(template, data))
            return slots.unconstrained_flat(run.sites, backend)

        model.compiled[key] = backend.jit(draw)
    return model.compiled[key]


def _from_posterior(setup: Setup, post, num_chains: int) -> np.ndarray:
    """Chain c starts at draw c (round-robin) of a posterior of the same model."""
    missing = [n for n in setup.layout.names if n not in post.samples]
    if missing:
        raise ConfigError(
            f"init is a posterior without the model's latent site(s) {missing} (it has "
            f"{sorted(post.samples)}): pass a posterior of the same model."
        )
    backend, layout = setup.backend, setup.layout
    flat = {
        n: np.asarray(post.samples[n]).reshape((-1,) + post.samples[n].shape[2:])
        for n in layout.names
    }
    total = len(next(iter(flat.values())))
    rows = []
    for chain in range(num_chains):
        values = {n: v[chain % total] for n, v in flat.items()}
        for slot in layout.slots:
            if tuple(np.shape(values[slot.name])) != slot.shape:
                raise ConfigError(
                    f"init: the posterior's site {slot.name!r} has shape "
                    f"{np.shape(values[slot.name])}; the model's has {slot.shape}."
                )
        rows.append(layout.unconstrain(values, backend))
    return np.stack(rows)
