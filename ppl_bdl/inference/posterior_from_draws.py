"""From flat unconstrained draws to a :class:`~ppl_bdl.posterior.posterior.Posterior`: the model replayed
at the draws in compiled chunks (constrained latents, deterministic sites), the discrete sites
drawn per draw, and the pointwise log-likelihood computed the first time it is read."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from ppl_bdl.dsl.nn.dropout import DROPOUT_SEED as _SEED
from ppl_bdl.inference.setup import Setup
from ppl_bdl.posterior.posterior import Posterior
from ppl_bdl.trace.enumeration import posterior_draws
from ppl_bdl.trace.interpreter import SiteRecord
from ppl_bdl.trace.layout import ModelDensity
from ppl_bdl.trace.programs import keyed, programs, structure_key

#: Observed values times draws replayed per compiled call when building the posterior: bounds
#: the memory of a replay (its activations) on big data.
REPLAY_POINTS = 500_000


class _Replayer:
    """Replays the model at flat draws, in chunks of draws sized to bound memory."""

    def __init__(self, setup: Setup):
        self.setup = setup
        self.density = ModelDensity(setup.bound, setup.backend, setup.layout, setup.params)
        self.chunk = replay_chunk_size(setup)
        self._compiled: dict[tuple[bool, bool], Any] = {}
        # Without the log-likelihood, only the latent and deterministic values are wanted: when
        # none of them sits in the data plate, the model runs on one point of it.
        one_point = setup.trace.one_point()
        in_plate = any(
            s.kind == "deterministic" and any(f.name in (one_point or {}) for f in s.plates)
            for s in setup.sites.values()
        )
        self.values_batch = None if one_point is None or in_plate else one_point

    def __call__(
        self,
        flat: np.ndarray,
        log_likelihood: bool,
        discrete: dict | None = None,
        dropout_seeds: np.ndarray | None = None,
    ) -> tuple[dict, dict]:
        """Replay at flat draws (chain, draw, dim), with ``discrete`` values of the discrete
        latent sites (chain, draw, ...) where the model has any, and each draw's mask seed
        (chain, draw) where it has one (MC dropout)."""
        backend = self.setup.backend
        chains, draws, dim = flat.shape
        rows = flat.reshape(chains * draws, dim)
        discrete = {
            k: v.reshape((chains * draws,) + v.shape[2:]) for k, v in (discrete or {}).items()
        }
        if dropout_seeds is not None:
            discrete[_SEED] = np.asarray(dropout_seeds).reshape(chains * draws)
        size = min(self.chunk, len(rows))
        with backend.scope(), backend.activate():
            which = (log_likelihood, dropout_seeds is not None)
            if which not in self._compiled:
                self._compiled[which] = self._program(*which)
            replay = self._compiled[which]
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
                disc = {k: backend.asarray(v) for k, v in disc.items()}
                values, loglik = replay(backend.asarray(chunk), disc, self.density.data)
                for out, part in ((values_out, values), (loglik_out, loglik)):
                    for k, v in part.items():
                        v = backend.to_numpy(v)[:real]
                        if k not in out:
                            out[k] = np.empty((len(rows),) + v.shape[1:], v.dtype)
                        out[k][start : start + real] = v
        return (
            {k: v.reshape((chains, draws) + v.shape[1:]) for k, v in values_out.items()},
            {k: v.reshape((chains, draws) + v.shape[1:]) for k, v in loglik_out.items()},
        )

    def _program(self, log_likelihood: bool, seeded: bool = False):
        """The compiled replay, from the backend's program cache where the model has a key
        (another fit of the same model reuses it: :mod:`ppl_bdl.trace.programs`).
        ``seeded``: each draw has a mask seed (``disc[_SEED]``) for its Dropout layers."""
        backend, density = self.setup.backend, self.density
        batch = None
        if not log_likelihood and self.values_batch is not None:
            batch = {k: backend.asarray(v, "int") for k, v in self.values_batch.items()}

        def one(row, disc, data):
            seed = disc[_SEED] if seeded else None
            values = {k: v for k, v in disc.items() if k != _SEED}
            return density.replay(row, data, log_likelihood, batch, values, seed)

        def build():
            return backend.jit(backend.vmap(one, in_axes=(0, 0, None)))

        model = self.setup.program_key()
        key = keyed(
            lambda: (model, log_likelihood, structure_key(self.values_batch), "dropout" * seeded)
        )
        if model is None or key is None:
            return build()
        return programs(backend).get(("replay",) + key, build)


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
        self,
        replayer: _Replayer,
        flat: np.ndarray,
        names: list[str],
        discrete: dict | None = None,
        dropout_seeds: np.ndarray | None = None,
    ):
        self._replayer, self._flat, self._names = replayer, flat, list(names)
        self._discrete, self._seeds = discrete, dropout_seeds
        self._values: dict[str, np.ndarray] | None = None

    def _load(self) -> dict[str, np.ndarray]:
        if self._values is None:
            self._values = self._replayer(self._flat, True, self._discrete, self._seeds)[1]
            self._replayer = self._flat = self._discrete = self._seeds = None
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
    setup: Setup,
    flat: np.ndarray,
    sample_stats: dict,
    method: str,
    log_likelihood: bool = True,
    discrete: dict | None = None,
    dropout_seeds: np.ndarray | None = None,
    **extra,
):
    """A :class:`Posterior` from flat unconstrained draws shaped (chain, draw, dim); the
    discrete latent sites' draws are ``discrete`` (chain, draw, ...) where given (CAVI's q(z)),
    else drawn from p(z | θ, D). ``dropout_seeds`` (chain, draw): each draw's mask seed (MC
    dropout), kept as the sample statistic ``dropout_seed``; every replay of a draw (here, the
    log-likelihood, ``post.predict``) runs the model's Dropout layers with its masks."""
    flat = np.asarray(flat)
    replayer = _Replayer(setup)
    if setup.layout.discrete and not discrete:  # one draw per draw: p(z | θ, D)
        discrete = posterior_draws(replayer.density, flat, setup.settings.get("seed", 0))
    if dropout_seeds is not None:
        sample_stats = {**sample_stats, _SEED: np.asarray(dropout_seeds)}
    samples, _ = replayer(flat, False, discrete, dropout_seeds)
    samples.update(discrete or {})
    samples = {n: samples[n] for n in setup.sites if n in samples}  # the model's order
    observed = [n for n, s in setup.sites.items() if s.kind == "observed"]
    loglik = {}
    if log_likelihood:
        loglik = LazyLogLikelihood(replayer, flat, observed, discrete, dropout_seeds)
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
