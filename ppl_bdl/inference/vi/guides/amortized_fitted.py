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

    def encode(self, X) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """q(z | x) of the rows of ``X`` (n, *event, as the encoder's training input): each local
        site's (loc, scale), NumPy arrays shaped (n, *site shape of one point), in the site's
        unconstrained space (its own space for a real-valued site)."""
        g, backend = self.guide, self.guide.backend
        X = self._check_inputs(X)
        with backend.scope(), backend.activate():
            loc, scale = g.encode_all(g.unpack(backend.asarray(self.phi)), backend.asarray(X))
            loc, scale = np.asarray(backend.to_numpy(loc)), np.asarray(backend.to_numpy(scale))
        out, start = {}, 0
        for name, shape, size in g.local:
            cut = slice(start, start + size)
            out[name] = tuple(a[:, cut].reshape((len(X),) + shape) for a in (loc, scale))
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
