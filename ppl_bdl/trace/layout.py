"""From a model to what the inference algorithms work on: a flat unconstrained vector.

:class:`LatentLayout` lays every continuous latent site out in one flat vector of the
unconstrained space (each support mapped to R^k by the backend's bijection), so kernels and
guides are written once for a single array. :class:`ModelDensity` gives the potential energy
U(θ) = −log p(θ, D) (minus log-Jacobians) of a flat vector, optionally on a minibatch. Both read
a recorded run of the model (:mod:`ppl_bdl.trace.model_trace`; :func:`trace_model` is importable from here
too).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ppl_bdl.dsl.bound_data import fill_data
from ppl_bdl.dsl.nn.dropout import ActiveDropout
from ppl_bdl.errors import ModelError
from ppl_bdl.trace.enumeration import Enumeration, discrete_latents
from ppl_bdl.trace.interpreter import Evaluator, SiteRecord
from ppl_bdl.trace.model_trace import trace_model

__all__ = ["LatentLayout", "LatentSlot", "ModelDensity", "trace_model"]


@dataclass(frozen=True)
class LatentSlot:
    """Where one latent site lives in the flat vector."""

    name: str
    shape: tuple[int, ...]
    unconstrained_shape: tuple[int, ...]
    offset: int
    size: int


class LatentLayout:
    """The continuous latent sites of a model, laid out in one flat unconstrained vector.

    Example
    -------
    >>> import numpy as np, ppl_bdl as bdl
    >>> from ppl_bdl import dist
    >>> from ppl_bdl.trace.layout import LatentLayout, trace_model
    >>> @bdl.model
    ... def m():
    ...     bdl.sample("w", dist.Normal(0.0, 1.0), shape=(2, 3))
    ...     bdl.sample("s", dist.HalfNormal(1.0))
    >>> backend = bdl.backends.get("numpyro")
    >>> layout = LatentLayout.from_sites(trace_model(m(), backend), backend)
    >>> layout.dim
    7
    """

    def __init__(
        self, slots: list[LatentSlot], sites: dict[str, SiteRecord], discrete: list[str] = ()
    ):
        self.slots = slots
        self.sites = sites
        self.dim = sum(s.size for s in slots)
        #: The discrete latent sites, summed out of the potential (:mod:`ppl_bdl.trace.enumeration`).
        self.discrete = list(discrete)

    @classmethod
    def from_sites(cls, sites: dict[str, SiteRecord], backend, allow_discrete: bool = True):
        """The layout of ``sites``' continuous latents; discrete latents (checked for
        enumeration) are listed in ``discrete``, or refused where ``allow_discrete`` is False."""
        discrete = [s.name for s in sites.values() if s.kind == "latent" and s.is_discrete]
        if discrete and not allow_discrete:
            raise ModelError(
                f"the model has discrete latent sites {discrete}, which this method cannot move. "
                "fit(..., method='nuts' | 'hmc' | 'vi' | an SG-MCMC kernel without batch_size) "
                "sums them out; or observe them."
            )
        discrete = discrete_latents(sites)
        slots, offset = [], 0
        for site in sites.values():
            if site.kind != "latent" or site.is_discrete:
                continue
            transform = backend.biject_to(site.native.support)
            shape = tuple(site.shape.value)
            ushape = shape if transform is None else tuple(transform.inverse_shape(shape))
            size = int(np.prod(ushape, dtype=np.int64))
            slots.append(LatentSlot(site.name, shape, ushape, offset, size))
            offset += size
        return cls(slots, sites, discrete)

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.slots]

    def unflatten(self, flat, backend=None) -> dict[str, Any]:
        """Split a flat vector (or a batch of them, leading dims kept) into unconstrained sites;
        a tuple of per-site blocks (:meth:`blocks`) is named as it is, without a copy.

        With ``backend``, in one ``split`` op: on torch the gradient of slices is a full-size
        zero vector per site, summed (at the 784-400-400-10 net: most of a traced step's
        overhead); a split's gradient is one concatenation."""
        if isinstance(flat, tuple | list):
            return {s.name: block for s, block in zip(self.slots, flat, strict=True)}
        lead = tuple(flat.shape[:-1])
        if backend is not None and self.slots:
            pieces = backend.math.split(flat, [s.size for s in self.slots], axis=-1)
            return {
                s.name: piece.reshape(lead + s.unconstrained_shape)
                for s, piece in zip(self.slots, pieces, strict=True)
            }
        return {
            s.name: flat[..., s.offset : s.offset + s.size].reshape(lead + s.unconstrained_shape)
            for s in self.slots
        }

    def blocks(self, flat, backend) -> tuple:
        """One flat vector (one point) as a tuple of per-site blocks, each in its site's
        unconstrained shape: how SG-MCMC kernels hold their position in ``fit``'s loop (the
        model reads each site as it is, and its gradient comes back per site, with no slicing
        or concatenation per step; :meth:`join` makes the flat row of a kept draw)."""
        return tuple(self.unflatten(flat, backend)[s.name] for s in self.slots)

    def join(self, blocks: tuple, backend) -> Any:
        """The flat vector of a tuple of per-site blocks (the inverse of :meth:`blocks`; blocks
        with leading dims, a batch of chains, give a batch of flat vectors)."""
        parts = []
        for s, block in zip(self.slots, blocks, strict=True):
            lead = tuple(block.shape[: len(block.shape) - len(s.unconstrained_shape)])
            parts.append(backend.math.reshape(block, lead + (s.size,)))
        return backend.math.concatenate(parts, axis=-1)

    def flatten(self, unconstrained: dict[str, Any], backend) -> Any:
        parts = [backend.math.reshape(unconstrained[s.name], (-1,)) for s in self.slots]
        return backend.math.concatenate(parts)

    def unconstrain(self, values: dict[str, Any], backend) -> np.ndarray:
        """Map constrained site values (one point) to the flat unconstrained vector, as NumPy."""
        parts = self.unconstrain_sites(values, backend)
        return np.concatenate([parts[s.name] for s in self.slots]) if self.slots else np.zeros(0)

    def unconstrain_sites(self, values: dict[str, Any], backend) -> dict[str, np.ndarray]:
        """Constrained values of some latent sites (one point) -> each site's unconstrained
        values, flat, as NumPy."""
        out = {}
        for s in self.slots:
            if s.name in values:
                u = _inverse(self.sites[s.name], backend.asarray(values[s.name]), backend)
                out[s.name] = np.asarray(backend.to_numpy(u), dtype=float).reshape(-1)
        return out

    def unconstrained_flat(self, sites: dict[str, SiteRecord], backend) -> Any:
        """The latent sites of a recorded run (one point) -> the flat unconstrained vector, each
        value through its own site's support, as a backend array: backend operations only, so
        it runs inside ``jit`` and ``vmap`` (the prior draws do)."""
        return self.flatten(
            {s.name: _inverse(sites[s.name], sites[s.name].value, backend) for s in self.slots},
            backend,
        )


def _inverse(site: SiteRecord, value, backend):
    """``value`` of ``site`` mapped to the unconstrained space by its support's bijection."""
    transform = backend.biject_to(site.native.support)
    return value if transform is None else transform.inv(value)


class ModelDensity:
    """The model's potential energy and its replays, with the data's arrays passed explicitly.

    ``U(θ) = −log p(θ, D) − log|J|`` for a flat unconstrained θ or a tuple of per-site blocks
    (:meth:`potential`), or for a dict of unconstrained site values (:meth:`site_potential`).
    ``batch`` maps a plate name to minibatch indices: the sites in that plate are scaled by
    ``N / |batch|`` (Eq. 2.8 of "Bayesian Computation in Deep Learning"), so U is an unbiased estimate of the full-data
    potential. ``exclude`` leaves the named latent sites' own log density out (see
    ``Evaluator``). The model's ``param`` values are ``params``, or those passed per call (VI
    optimises them).

    ``data`` is the list of the bound data's arrays (:meth:`BoundModel.data_arrays`; the
    bound model's own by default): compiled loops pass it as an argument, so the data is never
    baked into a compiled program.

    A model with discrete latent sites (``layout.discrete``) has the potential of its
    continuous latents with the discrete ones summed out by the backend
    (:class:`~ppl_bdl.trace.enumeration.Enumeration`, ``self.enumeration``); it takes no minibatches.

    Example
    -------
    >>> import numpy as np, ppl_bdl as bdl
    >>> from ppl_bdl import dist
    >>> from ppl_bdl.trace.layout import LatentLayout, ModelDensity, trace_model
    >>> @bdl.model
    ... def m(y):
    ...     mu = bdl.sample("mu", dist.Normal(0.0, 1.0))
    ...     bdl.sample("y", dist.Normal(mu, 1.0), obs=y)
    >>> backend = bdl.backends.get("numpyro")
    >>> bound = m(np.array(0.0))
    >>> layout = LatentLayout.from_sites(trace_model(bound, backend), backend)
    >>> density = ModelDensity(bound, backend, layout)
    >>> with backend.activate():
    ...     value, grad = density.value_and_grad(backend.asarray([1.0]))
    >>> round(float(value), 4), np.asarray(grad).tolist()
    (2.8379, [2.0])
    """

    def __init__(
        self,
        bound,
        backend,
        layout: LatentLayout,
        params: dict | None = None,
        exclude: frozenset = frozenset(),
    ):
        self.bound, self.backend, self.layout = bound, backend, layout
        self.params, self.exclude = params, exclude
        self.data, self._template = bound.data_arrays(backend)
        self.enumeration = None
        if layout.discrete:
            self.enumeration = Enumeration(bound, backend, layout.sites, self._template, exclude)

    def _run(self, evaluator: Evaluator, data, dropout: ActiveDropout | None = None) -> Evaluator:
        self.bound.run_with(
            evaluator,
            fill_data(self._template, self.data if data is None else data),
            () if dropout is None else (dropout,),
        )
        return evaluator

    def site_potential(
        self, sites: dict, data=None, batch=None, params=None, observed=None, dropout=None
    ):
        if self.enumeration is not None:
            if batch is not None:
                raise ModelError(_NO_MINIBATCH.format(self.layout.discrete))
            return -self.enumeration.log_density(
                sites,
                self.data if data is None else data,
                self.params if params is None else params,
            )
        ev = Evaluator(
            self.backend,
            unconstrained=sites,
            params=self.params if params is None else params,
            batch=batch,
            exclude=self.exclude,
            observed=observed,
        )
        return -self._run(ev, data, dropout).log_joint

    def potential(self, flat, data=None, batch=None, params=None, observed=None, dropout=None):
        """U at the flat θ; ``observed`` (site name -> value) replaces observed sites' data;
        ``dropout``, an :class:`~ppl_bdl.dsl.nn.dropout.ActiveDropout` for the run, turns the
        model's Dropout layers on (MC dropout's training step)."""
        sites = self.layout.unflatten(flat, self.backend)
        return self.site_potential(sites, data, batch, params, observed, dropout)

    def simulate(self, flat, key, data=None, batch=None, params=None) -> dict:
        """The observed sites drawn from the model at the flat θ (site name -> value, of the
        shape the site has on ``batch``): the labels of a sampled-label Fisher."""
        ev = Evaluator(
            self.backend,
            unconstrained=self.layout.unflatten(flat, self.backend),
            key=key,
            params=self.params if params is None else params,
            batch=batch,
            predictive=True,
            record=True,
        )
        sites = self._run(ev, data).sites
        return {n: s.value for n, s in sites.items() if s.kind == "observed"}

    def value_and_grad(self, flat, data=None, batch=None, params=None):
        """(U, ∇U) at θ, a flat vector (∇U flat) or a tuple of per-site blocks
        (:meth:`LatentLayout.blocks`; ∇U in blocks, read and returned without slicing or
        concatenating: the form SG-MCMC's loop uses)."""
        return self.backend.value_and_grad(lambda f: self.potential(f, data, batch, params))(flat)

    def replay(
        self,
        flat,
        data=None,
        log_likelihood: bool = True,
        batch=None,
        discrete=None,
        dropout_seed=None,
    ):
        """Constrained latents and deterministics at one flat draw, and (optionally) the
        pointwise log-likelihood of each observed site (ArviZ's log_likelihood group).
        ``batch`` runs a plate on some of its points only (see :class:`Evaluator`);
        ``discrete`` holds values of the discrete latent sites (drawn after the fit);
        ``dropout_seed``, the draw's mask seed (MC dropout), runs its Dropout layers with the
        draw's masks."""
        ev = Evaluator(
            self.backend,
            unconstrained=self.layout.unflatten(flat),
            params=self.params,
            record=True,
            batch=batch,
            values=discrete,
        )
        dropout = None
        if dropout_seed is not None:
            dropout = ActiveDropout.from_seed(self.backend, dropout_seed)
        sites = self._run(ev, data, dropout).sites
        values = {n: s.value for n, s in sites.items() if s.kind in ("latent", "deterministic")}
        if not log_likelihood:
            return values, {}
        return values, {n: s.log_prob for n, s in sites.items() if s.kind == "observed"}


_NO_MINIBATCH = (
    "the model has discrete latent sites {}, summed out over the whole data set: minibatches "
    "(batch_size=...) are not supported with them. Fit without batch_size."
)
