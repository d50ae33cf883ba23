"""What every inference method shares: setup of a bound model, initial points, and turning flat
unconstrained draws into a :class:`~ppl_bdl.posterior.Posterior`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backends import get as get_backend
from ..errors import ConfigError, ModelError
from ..interpreter import SiteRecord
from ..layout import LatentLayout, make_replay, trace_model
from ..model import BoundModel

#: Draws replayed per compiled call when building the posterior (bounds memory on big data).
REPLAY_CHUNK = 1000


@dataclass
class Setup:
    """A bound model prepared on one backend."""

    bound: BoundModel
    backend: Any
    sites: dict[str, SiteRecord]
    layout: LatentLayout
    params: dict


def prepare(bound, backend: str, precision: str, seed: int, allow_discrete=False) -> Setup:
    """Validate and trace ``bound`` on ``backend``; lay out its latents."""
    from ..layout import _unbound_message

    if not isinstance(bound, BoundModel):
        raise ModelError(_unbound_message(bound))
    be = get_backend(backend, precision=precision)
    sites = trace_model(bound, be, seed=seed)
    layout = LatentLayout.from_sites(sites, be, allow_discrete=allow_discrete)
    if layout.dim == 0:
        raise ModelError(
            f"model {bound.name!r} has no continuous latent sites to infer (sites: "
            f"{list(sites)}). Add a bdl.sample site without obs."
        )
    params = {n: s.value for n, s in sites.items() if s.kind == "param"}
    return Setup(bound, be, sites, layout, params)


def initial_positions(setup: Setup, init: Any, num_chains: int, seed: int) -> np.ndarray:
    """Initial flat unconstrained positions, one row per chain.

    ``init`` is "uniform" (uniform on [-2, 2] in the unconstrained space, as Stan and NumPyro do),
    "prior" (a prior draw), "median" (the prior median, estimated from prior draws), or a dict of
    constrained values for some sites (the rest uniform).
    """
    be, layout = setup.backend, setup.layout
    rng = np.random.default_rng(seed)
    if isinstance(init, str) and init == "uniform":
        return rng.uniform(-2.0, 2.0, size=(num_chains, layout.dim))
    if isinstance(init, dict):
        unknown = set(init) - set(layout.names)
        if unknown:
            raise ConfigError(
                f"init has values for {sorted(unknown)}, which are not latent sites of the model "
                f"(latent sites: {layout.names})."
            )
        rows = []
        for chain in range(num_chains):
            sites = trace_model(
                setup.bound,
                be,
                seed=seed + chain,
                missing="uniform",
                values={k: be.asarray(v) for k, v in init.items()},
            )
            rows.append(layout.unconstrain({n: sites[n].value for n in layout.names}, be))
        return np.stack(rows)
    if init in ("prior", "median"):
        draws = []
        count = num_chains if init == "prior" else 101
        for i in range(count):
            sites = trace_model(setup.bound, be, seed=seed + i, missing="prior", validate=False)
            draws.append(layout.unconstrain({n: sites[n].value for n in layout.names}, be))
        draws = np.stack(draws)
        if init == "median":
            return np.repeat(np.median(draws, axis=0, keepdims=True), num_chains, axis=0)
        return draws
    raise ConfigError(
        f"init must be 'uniform', 'prior', 'median' or a dict of site values, got {init!r}."
    )


def replay_draws(setup: Setup, flat: np.ndarray) -> tuple[dict, dict]:
    """Constrained latents, deterministics and pointwise log-likelihoods for flat draws
    shaped (chain, draw, dim), as NumPy arrays shaped (chain, draw, ...)."""
    be = setup.backend
    chains, draws, dim = flat.shape
    rows = flat.reshape(chains * draws, dim)
    with be.precision_scope(), be.activate():
        replay = be.jit(be.vmap(make_replay(setup.bound, be, setup.layout, setup.params)))
        values_parts, loglik_parts = [], []
        for start in range(0, rows.shape[0], REPLAY_CHUNK):
            chunk = be.asarray(rows[start : start + REPLAY_CHUNK])
            values, loglik = replay(chunk)
            values_parts.append({k: be.to_numpy(v) for k, v in values.items()})
            loglik_parts.append({k: be.to_numpy(v) for k, v in loglik.items()})

    def merge(parts):
        return {
            k: np.concatenate([p[k] for p in parts]).reshape(
                (chains, draws) + parts[0][k].shape[1:]
            )
            for k in parts[0]
        }

    return merge(values_parts), merge(loglik_parts)


def build_posterior(setup: Setup, flat: np.ndarray, sample_stats: dict, method: str, **extra):
    """A :class:`Posterior` from flat unconstrained draws shaped (chain, draw, dim)."""
    from ..posterior import Posterior

    samples, loglik = replay_draws(setup, np.asarray(flat))
    return Posterior(
        samples=samples,
        sample_stats=sample_stats,
        log_likelihood=loglik,
        observed_data={
            n: setup.backend.to_numpy(s.value)
            for n, s in setup.sites.items()
            if s.kind == "observed"
        },
        dims=site_dims(setup.sites),
        method=method,
        backend=setup.backend.name,
        precision=setup.backend.precision,
        model=setup.bound,
        params={k: setup.backend.to_numpy(v) for k, v in setup.params.items()},
        latent_names=setup.layout.names,
        **extra,
    )


def site_dims(sites: dict[str, SiteRecord]) -> dict[str, list[str]]:
    """ArviZ dims: plate dimensions are named after the plate, the others ``{site}_dim_{i}``."""
    dims = {}
    for name, site in sites.items():
        if site.kind in ("param", "factor"):
            continue
        if site.shape is None:  # deterministic: the shape of its value
            ndim = len(getattr(site.value, "shape", ()))
            # One axis per enclosing plate (theta = mu + tau * theta_trans in a plate): name them
            # after the plates, as for sample sites; otherwise the layout is unknown.
            plate_of = (
                {ndim + f.dim: f.name for f in site.plates} if ndim == len(site.plates) else {}
            )
            dims[name] = [plate_of.get(i, f"{name}_dim_{i}") for i in range(ndim)]
            continue
        by_position = {len(site.shape.batch) + f.dim: f.name for f in site.plates}
        names = [by_position.get(i, f"{name}_dim_{i}") for i in range(len(site.shape.batch))]
        rest = len(site.shape.extra) + len(site.shape.event)
        names += [f"{name}_dim_{i}" for i in range(len(names), len(names) + rest)]
        dims[name] = names
    return dims
