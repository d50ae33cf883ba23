"""What every variational guide shares.

A guide is a distribution q_φ over the flat unconstrained vector θ ∈ R^d of a model's latent sites
(:class:`~ppl_bdl.trace.layout.LatentLayout`). All its parameters φ live in one flat vector too
(:class:`ParamLayout`), so one optimizer step of one array drives every guide on every backend.
Guides are written once against the backend's math namespace (``self.m``) and random keys, never
once per backend.

Example
-------
>>> from ppl_bdl.inference.vi.guides.base import ParamLayout
>>> import numpy as np
>>> pl = ParamLayout({"loc": (3,), "factor": (3, 2)})
>>> pl.size
9
>>> pl.pack({"loc": np.zeros(3), "factor": np.ones((3, 2))}).shape
(9,)
"""

from __future__ import annotations

import math as _pymath
from dataclasses import dataclass
from typing import Any

import numpy as np

from ppl_bdl.dsl import random
from ppl_bdl.errors import ConfigError

LOG_2PI = _pymath.log(2.0 * _pymath.pi)


class ParamLayout:
    """Named parameter arrays packed into one flat vector."""

    def __init__(self, shapes: dict[str, tuple[int, ...]]):
        self.shapes = {k: tuple(int(s) for s in v) for k, v in shapes.items()}
        self.offsets: dict[str, tuple[int, int]] = {}
        offset = 0
        for name, shape in self.shapes.items():
            size = int(np.prod(shape, dtype=np.int64))
            self.offsets[name] = (offset, size)
            offset += size
        self.size = offset

    def pack(self, values: dict[str, np.ndarray]) -> np.ndarray:
        parts = [np.asarray(values[n], dtype=float).reshape(-1) for n in self.shapes]
        return np.concatenate(parts) if parts else np.zeros(0)

    def unpack(self, flat) -> dict[str, Any]:
        """Views of a flat (backend or NumPy) vector, reshaped to each parameter's shape."""
        out = {}
        for name, shape in self.shapes.items():
            start, size = self.offsets[name]
            out[name] = flat[start : start + size].reshape(shape)
        return out


@dataclass
class GuideInit:
    """Where a guide starts: the initial mean of θ and a per-coordinate prior scale (both length d)."""

    loc: np.ndarray
    prior_scale: np.ndarray


def inverse_softplus(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=float)
    return np.where(x > 20.0, x, np.log(np.expm1(np.minimum(x, 20.0))))


class Guide:
    """Base class of the built-in guides over the flat unconstrained latent vector.

    Subclasses set ``param_layout`` in ``__init__`` and implement :meth:`initial_params`,
    :meth:`transform` (draws from standard-normal noise: the reparameterisation) and
    :meth:`log_prob`, and :meth:`noise_shape` when their noise is not (num, d). ``self.m`` is
    the backend's math namespace.
    """

    name = "guide"
    #: True when q factorises into independent Gaussians per coordinate (analytic KL applies).
    is_diagonal_gaussian = False
    #: True when draws are reparameterised from noise (:meth:`transform`) and :meth:`log_prob`
    #: is q's density: the path-derivative gradient (``gradient="path"``) applies.
    path_gradient = True

    def __init__(self, layout, backend, init: GuideInit, seed: int = 0):
        self.layout = layout
        self.backend = backend
        self.m = backend.math
        self.dim = layout.dim
        self.init = init
        self.seed = seed
        self.param_layout = ParamLayout({})

    # -- to implement ---------------------------------------------------------------------------
    def initial_params(self) -> dict[str, np.ndarray]:  # pragma: no cover - abstract
        raise NotImplementedError

    def noise_shape(self, num: int) -> tuple[int, ...] | None:
        """The shape of the standard-normal noise of ``num`` draws (None: the guide draws with
        a key itself, see :meth:`sample`)."""
        return (num, self.dim)

    def transform(self, params: dict, eps, mask=None):  # pragma: no cover - abstract
        """Reparameterised draws θ (num, d) from noise ``eps`` (:meth:`noise_shape`), and their
        log q (num,); with ``mask`` (0/1 per coordinate) only masked-in coordinates count in
        log q (the others have their KL computed in closed form)."""
        raise NotImplementedError

    def sample(self, params: dict, key, num: int, mask=None):
        """``num`` reparameterised draws θ (num, d) and their log q (num,)."""
        eps = random.normal(key, self.noise_shape(num), backend=self.backend)
        return self.transform(params, eps, mask)

    def log_prob(self, params: dict, theta):  # pragma: no cover - abstract
        """log q(θ) for θ shaped (n, d)."""
        raise NotImplementedError

    # -- shared ---------------------------------------------------------------------------------
    def initial_flat(self) -> np.ndarray:
        return self.param_layout.pack(self.initial_params())

    def unpack(self, phi) -> dict[str, Any]:
        return self.param_layout.unpack(phi)

    def describe(self, params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Readable parameters (e.g. scales instead of their softplus preimage), as NumPy."""
        return dict(params)

    def fitted(self, phi, settings: dict | None = None) -> FittedGuide:
        """The guide at the fitted parameters ``phi`` (flat), as ``Posterior.guide``."""
        return FittedGuide(self, phi, settings)

    def _standard_normal_log_prob(self, eps):
        return -0.5 * self.m.sum(eps * eps, axis=-1) - 0.5 * eps.shape[-1] * LOG_2PI


def check_init_scale(init_scale: Any) -> float:
    if (
        isinstance(init_scale, bool)
        or not isinstance(init_scale, int | float)
        or not init_scale > 0
    ):
        raise ConfigError(f"init_scale must be a number > 0, got {init_scale!r}.")
    return float(init_scale)


def check_positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ConfigError(f"{name} must be an int >= 1, got {value!r}.")
    return int(value)


class FittedGuide:
    """A fitted guide, as ``Posterior.guide``: draw from it, score values, read its parameters.

    ``params`` are the fitted parameters as a person reads them, NumPy arrays in their own
    space: a mean-field guide's ``loc`` and ``scale`` (not the scale's softplus preimage
    ``rho``), a low-rank guide's ``loc`` and ``covariance``, a delta guide's point as each site's
    value (constrained: a positive scale as itself), a custom guide's ``bdl.param`` values after
    their constraints. ``raw_params`` are the unconstrained values the optimizer moved
    (``phi`` is the same, as one flat vector: what :func:`ppl_bdl.load` restores from).
    ``sample(n)`` returns constrained draws per latent site; ``log_prob(values)`` scores
    constrained values (the density in the constrained space, change of variables included).

    Example
    -------
    >>> import numpy as np, ppl_bdl as bdl
    >>> from ppl_bdl import dist
    >>> @bdl.model
    ... def m():
    ...     bdl.sample("z", dist.Normal(1.0, 2.0))
    >>> post = bdl.fit(m(), backend="numpyro", method="vi", num_steps=500, lr=0.05,
    ...                num_samples=100, progress=False)
    >>> draws = post.guide.sample(10)
    >>> draws["z"].shape
    (10,)
    >>> sorted(post.guide.params), sorted(post.guide.raw_params)
    (['loc', 'scale'], ['loc', 'rho'])
    >>> bool(post.guide.params["scale"][0] > 0)
    True
    """

    def __init__(self, guide: Guide, phi: np.ndarray, settings: dict | None = None):
        self.guide = guide
        self.phi = np.asarray(phi)
        self.name = guide.name
        #: The guide's own options as given to ``fit`` (``rank``, ``num_layers``, ...), so a saved
        #: posterior can rebuild it (:func:`ppl_bdl.load` with ``model=``).
        self.settings = dict(settings or {})

    @property
    def params(self) -> dict[str, np.ndarray]:
        """The fitted parameters in their readable space (scales, covariances, constrained
        values), as NumPy arrays; :attr:`raw_params` has the unconstrained ones. A low-rank or
        full-rank guide's covariance is dense, d x d: on a large network read ``raw_params``."""
        return self.guide.describe(self.raw_params)

    @property
    def raw_params(self) -> dict[str, np.ndarray]:
        """The unconstrained parameters the optimizer moved (``phi`` unpacked by name)."""
        return {k: np.asarray(v) for k, v in self.guide.param_layout.unpack(self.phi).items()}

    def describe(self) -> dict[str, np.ndarray]:
        """The same as :attr:`params` (kept for code written before ``params`` was readable)."""
        return self.params

    def sample_unconstrained(self, n: int, seed: int = 0) -> np.ndarray:
        """``n`` draws of the flat unconstrained vector, shaped (n, d)."""
        backend = self.guide.backend
        with backend.scope(), backend.activate():
            phi = self.guide.unpack(backend.asarray(self.phi))
            theta, _ = self.guide.sample(phi, backend.random.key(seed), n)
            return np.asarray(backend.to_numpy(theta))

    def sample(self, n: int, seed: int = 0) -> dict[str, np.ndarray]:
        """``n`` constrained draws of every latent site, shaped (n, *site_shape)."""
        return constrain(self.guide.layout, self.guide.backend, self.sample_unconstrained(n, seed))

    def log_prob(self, values: dict[str, Any] | np.ndarray) -> np.ndarray:
        """log q of constrained site values (dict of arrays with a leading draw axis), or of flat
        unconstrained vectors shaped (n, d) (then the density of θ itself)."""
        backend, layout = self.guide.backend, self.guide.layout
        with backend.scope(), backend.activate():
            phi = self.guide.unpack(backend.asarray(self.phi))
            if not isinstance(values, dict):
                theta = backend.asarray(np.atleast_2d(np.asarray(values, dtype=float)))
                return np.asarray(backend.to_numpy(self.guide.log_prob(phi, theta)))
            missing = set(layout.names) - set(values)
            if missing:
                raise ConfigError(
                    f"log_prob needs a value for every latent site; missing {sorted(missing)} "
                    f"(latent sites: {layout.names})."
                )
            parts, log_det = [], 0.0
            n = None
            for slot in layout.slots:
                x = backend.asarray(np.asarray(values[slot.name], dtype=float))
                n = x.shape[0] if x.ndim > len(slot.shape) else 1
                x = x.reshape((n,) + slot.shape)
                transform = backend.biject_to(layout.sites[slot.name].native.support)
                u = x if transform is None else transform.inv(x)
                if transform is not None:
                    ladj = transform.log_abs_det_jacobian(u, x)
                    log_det = log_det + backend.math.sum(
                        backend.math.reshape(ladj, (n, -1)), axis=1
                    )
                parts.append(backend.math.reshape(u, (n, -1)))
            theta = backend.math.concatenate(parts, axis=1)
            return np.asarray(backend.to_numpy(self.guide.log_prob(phi, theta) - log_det))

    def encode(self, X):
        """q(z | x) of new points: an amortized guide's (:mod:`ppl_bdl.inference.vi.guides.amortized`)."""
        raise ConfigError(_NOT_AMORTIZED.format(what="encode", name=self.name))

    def log_marginal(self, bound, data, params: dict, num_particles: int = 1000, seed: int = 0):
        """log p(x) by importance sampling: an amortized guide's."""
        raise ConfigError(_NOT_AMORTIZED.format(what="log_marginal", name=self.name))

    def __repr__(self) -> str:
        return f"<FittedGuide {self.name}: {self.guide.param_layout.size} parameters, d={self.guide.dim}>"


_NOT_AMORTIZED = (
    "{what} needs an amortized guide, whose encoder maps a point to q(z|x): fit with "
    "guide=guides.Amortized(encoder, sites=[...]) (docs/inference.md, Amortized inference). This posterior's guide is "
    "{name!r}, with no encoder."
)


def constrain(layout, backend, flat) -> dict[str, np.ndarray]:
    """Flat unconstrained vectors ``flat`` (n, d) as constrained values of every latent site,
    shaped (n, *site_shape), NumPy (each site through its support's bijection)."""
    flat = np.atleast_2d(np.asarray(flat))
    n = flat.shape[0]
    with backend.scope(), backend.activate():
        out = {}
        for name, u in layout.unflatten(backend.asarray(flat)).items():
            transform = backend.biject_to(layout.sites[name].native.support)
            value = u if transform is None else transform(u)
            shape = (n,) + _slot(layout, name).shape
            out[name] = np.asarray(backend.to_numpy(value)).reshape(shape)
    return out


def _slot(layout, name: str):
    return next(s for s in layout.slots if s.name == name)
