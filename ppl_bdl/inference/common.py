"""What every inference method shares: setup of a bound model, initial points, and turning flat
unconstrained draws into a :class:`~ppl_bdl.posterior.Posterior`."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..backends import get as get_backend
from ..errors import ConfigError, ModelError
from ..interpreter import SiteRecord
from ..layout import LatentLayout, ModelDensity, trace_model
from ..model import BoundModel

#: Observed values times draws replayed per compiled call when building the posterior: bounds
#: the memory of a replay (its activations) on big data.
REPLAY_POINTS = 500_000


@dataclass
class Setup:
    """A bound model prepared on one backend (with its device and precision)."""

    bound: BoundModel
    backend: Any
    sites: dict[str, SiteRecord]
    layout: LatentLayout
    params: dict
    settings: dict = field(default_factory=dict)


def prepare(
    bound, backend: str | None, precision: str, seed: int, device: str | None = None,
    allow_discrete: bool = True,
) -> Setup:  # fmt: skip
    """Validate and trace ``bound`` on ``backend`` (on ``device``); lay out its latents (its
    discrete latents are summed out of the potential: :mod:`ppl_bdl.enumeration`)."""
    from ..layout import _unbound_message

    if not isinstance(bound, BoundModel):
        raise ModelError(_unbound_message(bound))
    be = get_backend(backend, precision=precision, device=device)
    sites = trace_model(bound, be, seed=seed)
    layout = LatentLayout.from_sites(sites, be, allow_discrete=allow_discrete)
    if layout.dim == 0:
        raise ModelError(
            f"model {bound.name!r} has no continuous latent sites to infer (sites: "
            f"{list(sites)}). Add a bdl.sample site without obs."
        )
    params = {n: s.value for n, s in sites.items() if s.kind == "param"}
    return Setup(bound, be, sites, layout, params)


#: Jitter of the prior median, in prior standard deviations, for ``init="median"``.
MEDIAN_JITTER = 0.1
#: Prior draws that estimate the median and spread for ``init="median"``.
MEDIAN_DRAWS = 25


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
    from ..posterior import Posterior

    be, layout = setup.backend, setup.layout
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
        rows = []
        for chain in range(num_chains):
            sites = trace_model(
                setup.bound, be, seed=seed + chain, missing="uniform",
                values={k: be.asarray(v) for k, v in init.items()},
            )  # fmt: skip
            rows.append(layout.unconstrain({n: sites[n].value for n in layout.names}, be))
        return np.stack(rows)
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


def prior_draws(setup: Setup, count: int, seed: int) -> np.ndarray:
    """``count`` prior draws of the flat unconstrained latent vector (count, d).

    The model runs on one point of its data plate when every latent site is global: the draws
    need no likelihood, and a deep network's forward pass over all the data, ``count`` times,
    would cost more than the fit."""
    be, layout = setup.backend, setup.layout
    batch = _one_point(setup)
    rows = []
    for i in range(count):
        sites = trace_model(setup.bound, be, seed=seed + i, missing="prior", validate=False,
                            batch=batch)  # fmt: skip
        rows.append(layout.unconstrain({n: sites[n].value for n in layout.names}, be))
    return np.stack(rows)


def _one_point(setup: Setup) -> dict | None:
    plates = {f.name for s in setup.sites.values() if s.kind == "observed" for f in s.plates}
    latent_plates = {f.name for s in setup.sites.values() if s.kind == "latent" for f in s.plates}
    if len(plates) != 1 or plates & latent_plates:
        return None
    return {next(iter(plates)): np.zeros(1, np.int64)}


def _from_posterior(setup: Setup, post, num_chains: int) -> np.ndarray:
    """Chain c starts at draw c (round-robin) of a posterior of the same model."""
    missing = [n for n in setup.layout.names if n not in post.samples]
    if missing:
        raise ConfigError(
            f"init is a posterior without the model's latent site(s) {missing} (it has "
            f"{sorted(post.samples)}): pass a posterior of the same model."
        )
    be, layout = setup.backend, setup.layout
    flat = {n: np.asarray(post.samples[n]).reshape((-1,) + post.samples[n].shape[2:])
            for n in layout.names}  # fmt: skip
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
        rows.append(layout.unconstrain(values, be))
    return np.stack(rows)


class _Replayer:
    """Replays the model at flat draws, in chunks of draws sized to bound memory."""

    def __init__(self, setup: Setup):
        self.setup = setup
        self.density = ModelDensity(setup.bound, setup.backend, setup.layout, setup.params)
        self.chunk = replay_chunk_size(setup)
        self._compiled: dict[bool, Any] = {}
        # Without the log-likelihood, only the latent and deterministic values are wanted: when
        # none of them sits in the data plate, the model runs on one point of it.
        one_point = _one_point(setup)
        in_plate = any(
            s.kind == "deterministic" and any(f.name in (one_point or {}) for f in s.plates)
            for s in setup.sites.values()
        )
        self.values_batch = None if one_point is None or in_plate else one_point

    def __call__(
        self, flat: np.ndarray, log_likelihood: bool, discrete: dict | None = None
    ) -> tuple[dict, dict]:
        """Replay at flat draws (chain, draw, dim), with ``discrete`` values of the discrete
        latent sites (chain, draw, ...) where the model has any."""
        be = self.setup.backend
        chains, draws, dim = flat.shape
        rows = flat.reshape(chains * draws, dim)
        discrete = {
            k: v.reshape((chains * draws,) + v.shape[2:]) for k, v in (discrete or {}).items()
        }
        size = min(self.chunk, len(rows))
        with be.scope(), be.activate():
            if log_likelihood not in self._compiled:
                density = self.density
                batch = None
                if not log_likelihood and self.values_batch is not None:
                    batch = {k: be.asarray(v, "int") for k, v in self.values_batch.items()}
                self._compiled[log_likelihood] = be.jit(
                    be.vmap(
                        lambda row, disc, data: density.replay(
                            row, data, log_likelihood, batch, disc
                        ),
                        in_axes=(0, 0, None),
                    )
                )
            replay = self._compiled[log_likelihood]
            # Each chunk is written into arrays of all the draws (no list of parts to join:
            # the draws are held once on the host, not twice).
            values_out: dict[str, np.ndarray] = {}
            loglik_out: dict[str, np.ndarray] = {}
            for start in range(0, len(rows), size):
                chunk = rows[start : start + size]
                disc = {k: v[start : start + size] for k, v in discrete.items()}
                real = len(chunk)
                if real < size:  # one compiled shape: pad the last chunk
                    chunk, disc = (
                        pad_rows(chunk, size),
                        {k: pad_rows(v, size) for k, v in disc.items()},
                    )
                disc = {k: be.asarray(v) for k, v in disc.items()}
                values, loglik = replay(be.asarray(chunk), disc, self.density.data)
                for out, part in ((values_out, values), (loglik_out, loglik)):
                    for k, v in part.items():
                        v = be.to_numpy(v)[:real]
                        if k not in out:
                            out[k] = np.empty((len(rows),) + v.shape[1:], v.dtype)
                        out[k][start : start + real] = v
        return (
            {k: v.reshape((chains, draws) + v.shape[1:]) for k, v in values_out.items()},
            {k: v.reshape((chains, draws) + v.shape[1:]) for k, v in loglik_out.items()},
        )


def replay_chunk_size(setup: Setup, most: int = 256) -> int:
    """Draws per compiled call of a full-data replay: observed values times draws stay within
    :data:`REPLAY_POINTS` (the replay's activations), at most ``most``."""
    points = sum(
        int(np.prod(np.shape(s.value))) for s in setup.sites.values() if s.kind == "observed"
    )
    return max(1, min(most, REPLAY_POINTS // max(1, points)))


def pad_rows(array: np.ndarray, size: int) -> np.ndarray:
    """``array`` with its last row repeated up to ``size`` rows (one compiled shape)."""
    return np.concatenate([array, np.repeat(array[-1:], size - len(array), axis=0)])


class LazyLogLikelihood(Mapping):
    """The pointwise log-likelihood of every observed site at every draw, computed in chunks
    the first time a value is read (ArviZ export, LOO, WAIC), not at fit time."""

    def __init__(
        self, replayer: _Replayer, flat: np.ndarray, names: list[str], discrete: dict | None = None
    ):
        self._replayer, self._flat, self._names = replayer, flat, list(names)
        self._discrete = discrete
        self._values: dict[str, np.ndarray] | None = None

    def _load(self) -> dict[str, np.ndarray]:
        if self._values is None:
            self._values = self._replayer(self._flat, True, self._discrete)[1]
            self._replayer = self._flat = self._discrete = None
        return self._values

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._names:
            raise KeyError(name)
        return self._load()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __repr__(self) -> str:
        state = "computed" if self._values is not None else "computed when first read"
        return f"<pointwise log-likelihood of {self._names} ({state})>"


def build_posterior(
    setup: Setup, flat: np.ndarray, sample_stats: dict, method: str,
    log_likelihood: bool = True, discrete: dict | None = None, **extra,
):  # fmt: skip
    """A :class:`Posterior` from flat unconstrained draws shaped (chain, draw, dim); the
    discrete latent sites' draws are ``discrete`` (chain, draw, ...) where given (CAVI's q(z)),
    else drawn from p(z | θ, D)."""
    from ..posterior import Posterior

    flat = np.asarray(flat)
    replayer = _Replayer(setup)
    if setup.layout.discrete and not discrete:  # one draw per draw: p(z | θ, D)
        from ..enumeration import posterior_draws

        discrete = posterior_draws(replayer.density, flat, setup.settings.get("seed", 0))
    samples, _ = replayer(flat, False, discrete)
    samples.update(discrete or {})
    samples = {n: samples[n] for n in setup.sites if n in samples}  # the model's order
    observed = [n for n, s in setup.sites.items() if s.kind == "observed"]
    loglik = LazyLogLikelihood(replayer, flat, observed, discrete) if log_likelihood else {}
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
        latent_names=setup.layout.names + setup.layout.discrete,
        settings=_json_settings(setup.settings),
        **extra,
    )


def _json_settings(settings: dict) -> dict:
    """The fit's settings as plain JSON-able values (NumPy scalars become Python numbers)."""
    out = {}
    for key, value in settings.items():
        if isinstance(value, np.generic):
            value = value.item()
        out[key] = value
    return out


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
            time = 1 if "scan" in site.extra else 0
            plate_of = (
                {ndim + f.dim: f.name for f in site.plates}
                if ndim == len(site.plates) + time
                else {}
            )
            if time:
                plate_of[0] = site.extra["scan"]
            dims[name] = [plate_of.get(i, f"{name}_dim_{i}") for i in range(ndim)]
            continue
        by_position = {len(site.shape.batch) + f.dim: f.name for f in site.plates}
        if "scan" in site.extra:  # the leading axis of a site stacked by bdl.scan
            by_position[0] = site.extra["scan"]
        names = [by_position.get(i, f"{name}_dim_{i}") for i in range(len(site.shape.batch))]
        rest = len(site.shape.extra) + len(site.shape.event)
        names += [f"{name}_dim_{i}" for i in range(len(names), len(names) + rest)]
        dims[name] = names
    return dims
