"""A fitted amortized guide: encode new points, and estimate log p(x) by importance sampling with
the encoder as the proposal (``post.encode(X)``, ``post.log_marginal(X)``).

log p(x_i) = log E_{q(z|x_i)}[p(x_i, z) / q(z | x_i)] ≈ log (1/K) Σ_k w_ik, z_ik ~ q(z | x_i):
the IWAE bound with K particles (Burda et al. 2015; Eq. 3.18 of "Bayesian Computation in Deep Learning"), which tends to log
p(x_i) as K grows, from below (Jensen). Its Monte Carlo standard error per point is, by the delta
method, √(1/ESS_i − 1/K) with ESS_i = (Σ_k w_ik)² / Σ_k w_ik² (the effective sample size of the
weights). A model with global latents θ (a Bayesian decoder) draws θ_k from its guide per
particle: the estimate is then of log E_{q(θ)}[p(x_i | θ)], the predictive density of x_i.
"""

from __future__ import annotations

import inspect
import math as _pymath
from dataclasses import dataclass
from typing import Any

import numpy as np

from ppl_bdl.dsl.model import BoundModel, Model, unbound_message
from ppl_bdl.errors import ConfigError, DataError
from ppl_bdl.inference.mcmc.batched_hmc import EXTRA_NORMALS
from ppl_bdl.inference.vi.guides.amortized_sites import input_argument
from ppl_bdl.inference.vi.guides.base import FittedGuide, check_positive_int
from ppl_bdl.inference.vi.objectives_amortized import point_log_weights
from ppl_bdl.trace.model_trace import trace_model
from ppl_bdl.trace.pointwise import PointDensity

#: Particles times points per call of the importance sampler (bounds the memory of a call).
ROWS_PER_CALL = 1 << 14


@dataclass
class LogMarginal:
    """Importance-sampling estimates of log p(x_i), one per point.

    Attributes
    ----------
    per_point : ndarray (n,)
        log (1/K) Σ_k w_ik per point (nats).
    mc_se : ndarray (n,)
        Its Monte Carlo standard error, √(1/ESS − 1/K) (delta method).
    ess : ndarray (n,)
        The effective sample size of each point's K weights (K: q(z|x) is the posterior).
    num_particles : int
    """

    per_point: np.ndarray
    mc_se: np.ndarray
    ess: np.ndarray
    num_particles: int

    @property
    def total(self) -> float:
        """log p of all the points, Σ_i log p(x_i) (the points are independent given θ)."""
        return float(np.sum(self.per_point))

    def __repr__(self) -> str:
        return (
            f"<LogMarginal of {len(self.per_point)} points, K={self.num_particles}: total "
            f"{self.total:.4g} nats, mean {np.mean(self.per_point):.4g} per point (MC se "
            f"{np.sqrt(np.sum(self.mc_se**2)):.2g}); ESS per point: median "
            f"{np.median(self.ess):.3g} of {self.num_particles}>"
        )


class FittedAmortized(FittedGuide):
    """The fitted :class:`~ppl_bdl.inference.vi.guides.amortized.AmortizedGuide` of a posterior
    (``post.guide``): what every fitted guide offers, and :meth:`encode` and
    :meth:`log_marginal`."""

    #: The model's fitted ``bdl.param`` values (constrained, NumPy) that a refinement's chains
    #: target (set by the fit; None: the values the guide was built with).
    model_params: dict | None = None

    def encode(
        self, X, num_samples: int | None = None, seed: int = 0, params: dict | None = None
    ) -> dict[str, Any]:
        """q(z | x) of the rows of ``X`` (n, *event, as the encoder's training input).

        Without ``num_samples``: q_0's each local site's (loc, scale), NumPy arrays shaped (n,
        *site shape of one point), in the site's unconstrained space (its own space for a
        real-valued site). With ``num_samples=K``: K draws per point of each local site, in its
        own space, shaped (K, n, *site shape), from q_T (the encoder's draws refined by the
        guide's T MCMC steps at the model's ``params``, else the fitted ones; one draw of the
        global latents per k) or from q_0 when T = 0; ``seed`` seeds them."""
        g, backend = self.guide, self.guide.backend
        X = self._check_inputs(X)
        if num_samples is not None:
            K = check_positive_int("num_samples", num_samples)
            data = rebind(g.trace.bound, g.input_name, X)
            _, z = self._local_draws(data, K, seed, params)
            return self._constrained_sites(z)
        with backend.scope(), backend.activate():
            loc, scale = g.encode_all(g.unpack(backend.asarray(self.phi)), backend.asarray(X))
            loc, scale = np.asarray(backend.to_numpy(loc)), np.asarray(backend.to_numpy(scale))
        out, start = {}, 0
        for name, shape, size in g.local:
            cut = slice(start, start + size)
            out[name] = tuple(a[:, cut].reshape((len(X),) + shape) for a in (loc, scale))
            start += size
        return out

    def sample_unconstrained(self, n: int, seed: int = 0) -> np.ndarray:
        """``n`` draws of the flat unconstrained vector (n, D): q_0's, or with a refinement the
        local sites' refined draws of every training point (q_T)."""
        g, backend = self.guide, self.guide.backend
        if not g.refinement.steps:
            return super().sample_unconstrained(n, seed)
        theta_g, z = self._local_draws(g.trace.bound, n, seed, None)
        with backend.scope(), backend.activate():
            flat = g._assemble(backend.asarray(theta_g), backend.asarray(z))
            return np.asarray(backend.to_numpy(flat))

    def _local_draws(self, data: BoundModel, num: int, seed: int, params: dict | None):
        """(global draws (num, d_g), local draws (num, n, d)) of the points of ``data``: the
        encoder's, refined by the guide's chains at the model's ``params`` (see
        :meth:`encode`), NumPy."""
        g, backend = self.guide, self.guide.backend
        params = self.model_params if params is None else params
        name, position = input_argument(data, backend, g.input_name, _rows(data, g.input_name))
        n, d = _rows(data, name), g.local_dim
        with backend.scope(), backend.activate():
            model_params = (
                None if params is None else {k: backend.asarray(v) for k, v in params.items()}
            )
            local = frozenset(s for s, _, _ in g.local)
            density = PointDensity(data, backend, g.plate, local, model_params or g.params)
            phi = g.unpack(backend.asarray(self.phi))
            k_global, k_local = backend.random.split(backend.random.key(seed))
            theta_g = backend.math.zeros((num, 0))
            if g.global_guide is not None:
                theta_g, _ = g.global_guide.sample(g.split_params(phi)[0], k_global, num)
            theta_g = np.asarray(backend.to_numpy(theta_g))
            run = backend.jit(_draw_chunk(g, density, position))
            # Rows are (draw, point) pairs; without global latents, draws share one chain run.
            groups = (
                [(k, np.arange(n)) for k in range(num)]
                if theta_g.shape[1]
                else [(0, np.tile(np.arange(n), num))]
            )
            out = [
                self._group(run, phi, k_local, theta_g[k], density, rows, c)
                for c, (k, rows) in enumerate(groups)
            ]
        return theta_g, np.concatenate(out).reshape(num, n, d)

    def _group(self, run, phi, key, theta_g, density, rows: np.ndarray, group: int) -> np.ndarray:
        """The draws (len(rows), d) of the rows ``rows`` at the global draw ``theta_g``, in
        chunks of at most :data:`ROWS_PER_CALL` (the last one padded)."""
        backend = self.guide.backend
        size = min(len(rows), ROWS_PER_CALL)
        parts = []
        for c, start in enumerate(range(0, len(rows), size)):
            real = min(size, len(rows) - start)
            idx = rows[np.minimum(np.arange(start, start + size), len(rows) - 1)]
            key = backend.random.fold_in(backend.random.fold_in(key, group), c)
            z = run(phi, key, backend.asarray(theta_g), density.data, backend.asarray(idx, "int"))
            parts.append(np.asarray(backend.to_numpy(z), dtype=float)[:real])
        return np.concatenate(parts)

    def _constrained_sites(self, z: np.ndarray) -> dict[str, np.ndarray]:
        """Local draws (K, n, d) as each local site's values in its own space (K, n, *shape)."""
        g, backend = self.guide, self.guide.backend
        K, n = z.shape[:2]
        out, start = {}, 0
        with backend.scope(), backend.activate():
            for name, shape, size in g.local:
                u = backend.asarray(z[:, :, start : start + size].reshape((K, n) + shape))
                transform = backend.biject_to(g.layout.sites[name].native.support)
                value = u if transform is None else transform(u)
                out[name] = np.asarray(backend.to_numpy(value))
                start += size
        return out

    def log_marginal(
        self, bound, data, params: dict, num_particles: int = 1000, seed: int = 0
    ) -> LogMarginal:
        """Estimate log p(x_i) at each point of ``data`` (see the module docstring).

        ``data``: new inputs for the encoder's argument (the model's other arguments as
        ``bound``, the fitted model, has them), or a bound model ``model(X_new, ...)``.
        ``params``: the model's fitted ``bdl.param`` values (``post.params``)."""
        g, backend = self.guide, self.guide.backend
        K = check_positive_int("num_particles", num_particles)
        if not isinstance(data, BoundModel):
            if isinstance(data, Model):
                raise ConfigError(unbound_message(data))
            data = rebind(bound, g.input_name, self._check_inputs(data))
        name, position = input_argument(data, backend, g.input_name, _rows(data, g.input_name))
        n = _rows(data, name)
        trace_model(data, backend)  # a validating run: clear errors for data that does not fit
        d, size_g = g.local_dim, g.global_noise_size()
        points = max(1, min(n, ROWS_PER_CALL // K))
        with backend.scope(), backend.activate():
            model_params = {k: backend.asarray(v) for k, v in params.items()}
            local = frozenset(s for s, _, _ in g.local)
            density = PointDensity(data, backend, g.plate, local, model_params)
            phi = g.unpack(backend.asarray(self.phi))

            def chunk(phi, key, arrays, idx):
                x = arrays[position]
                if g.global_guide is None:
                    eps = backend.random.normal(key, (K, points, d))
                    noise = backend.math.zeros((0,))
                    return point_log_weights(g, density, phi, noise, eps, x, arrays, idx)[1]
                k_global, k_local = backend.random.split(key)
                noise = backend.random.normal(k_global, (K, size_g))
                eps = backend.random.normal(k_local, (K, 1, points, d))

                def particle(noise_k, eps_k):
                    return point_log_weights(g, density, phi, noise_k, eps_k, x, arrays, idx)[1][0]

                return backend.vmap(particle)(noise, eps)

            run = backend.jit(chunk)
            keys = backend.random.keys(backend.random.key(seed), -(-n // points))
            parts = []
            for c, start in enumerate(range(0, n, points)):
                real = min(points, n - start)
                idx = np.minimum(np.arange(start, start + points), n - 1)  # the last chunk padded
                lw = run(phi, keys[c], density.data, backend.asarray(idx, "int"))
                parts.append(np.asarray(backend.to_numpy(lw), dtype=float)[:, :real])
        log_w = np.concatenate(parts, axis=1)  # (K, n)
        top = log_w.max(axis=0)
        lse = top + np.log(np.sum(np.exp(log_w - top), axis=0))
        lse2 = 2 * top + np.log(np.sum(np.exp(2 * (log_w - top)), axis=0))
        ess = np.exp(2 * lse - lse2)
        mc_se = np.sqrt(np.maximum(1.0 / ess - 1.0 / K, 0.0))
        return LogMarginal(lse - _pymath.log(K), mc_se, ess, K)

    def _check_inputs(self, X: Any) -> np.ndarray:
        g = self.guide
        trained = g.trace.bound.data_arrays(g.backend)[0][g.input_index]
        event = tuple(int(s) for s in trained.shape[1:])
        try:
            X = np.asarray(X, dtype=float)
        except (TypeError, ValueError) as err:
            raise DataError(f"the encoder's inputs must be a numeric array: {err}") from None
        if X.ndim != 1 + len(event) or tuple(X.shape[1:]) != event or len(X) == 0:
            raise DataError(
                f"the encoder reads {g.input_name!r} with rows of shape {event} (it was fitted on "
                f"{tuple(int(s) for s in trained.shape)}); got an array of shape {X.shape}. Pass "
                f"(n, {', '.join(map(str, event))}) with n >= 1."
            )
        if not np.all(np.isfinite(X)):
            raise DataError("the encoder's inputs hold non-finite values; remove or impute them.")
        return X


def _draw_chunk(guide, density: PointDensity, position: int):
    """``run(phi, key, theta_g, arrays, idx) -> z (P, d)``: draws of q_0 at the points ``idx``,
    refined by the guide's chains (when it has T > 0 steps) at the global draw ``theta_g``."""
    backend, refinement = guide.backend, guide.refinement

    def run(phi, key, theta_g, arrays, idx):
        loc, scale = guide.encode(phi, arrays[position][idx])
        k_start, k_chain = backend.random.split(key)
        z0 = loc + scale * backend.random.normal(k_start, tuple(loc.shape))
        if not refinement.steps:
            return z0
        rows, d = int(loc.shape[0]), guide.local_dim
        noise = backend.random.normal(k_chain, (refinement.steps, rows, d + EXTRA_NORMALS))
        z, _ = guide.refine(density, phi, z0, loc, scale, theta_g, arrays, idx, None, noise)
        return z

    return run


def rebind(bound: BoundModel, name: str, X: np.ndarray) -> BoundModel:
    """``bound``'s model bound to the same arguments but ``name`` = ``X``."""
    arguments = inspect.signature(bound.model.fn).bind(*bound.args, **bound.kwargs)
    arguments.arguments[name] = X.astype(np.asarray(arguments.arguments[name]).dtype, copy=False)
    return bound.model(*arguments.args, **arguments.kwargs)


def _rows(bound: BoundModel, name: str) -> int:
    arguments = inspect.signature(bound.model.fn).bind(*bound.args, **bound.kwargs).arguments
    if name not in arguments or np.ndim(arguments[name]) < 1:
        raise ConfigError(
            f"log_marginal: the bound model {bound.name!r} has no array argument {name!r} (the "
            "input the encoder reads)."
        )
    return int(np.shape(arguments[name])[0])
