"""The fitted factors of a CAVI run, as ``post.guide``: read them, draw from them, score draws.

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import dist
>>> @bdl.model
... def normal_mean(y):
...     mu = bdl.sample("mu", dist.Normal(0.0, 1.0))
...     with bdl.plate("data", y.shape[0]) as idx:
...         bdl.sample("y", dist.Normal(mu, 1.0), obs=y[idx])
>>> post = bdl.fit(normal_mean(np.array([1.0, 2.0, 3.0])), backend="numpyro", method="cavi",
...                num_samples=10, progress=False)
>>> post.guide.families, sorted(post.guide.params["mu"])
({'mu': 'Normal'}, ['covariance', 'loc', 'scale'])
>>> round(float(post.guide.params["mu"]["loc"]), 4), post.guide.sample(5)["mu"].shape
(1.5, (5,))
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ppl_bdl.dsl.dist import Dirichlet, Gamma, InverseGamma, MultivariateNormal
from ppl_bdl.inference.cavi.conjugate_model import Latent


class CAVIFactors:
    """The mean-field q = ∏_j q_j that CAVI fitted (``post.guide`` of ``method="cavi"``).

    ``params[site]`` (NumPy, in the site's own shape): a Normal site's ``loc``, ``scale`` (the
    marginal standard deviations) and ``covariance`` (over the site's flattened elements: one
    block per site); a Gamma precision's or an InverseGamma variance's ``concentration`` and
    ``rate`` (q is then a Gamma, or an InverseGamma, with them); a Dirichlet's
    ``concentration``; a Categorical assignment's ``probs`` (the responsibilities φ, site shape
    + (K,)). ``families[site]`` names q_site's family. ``sample(n)`` draws every latent site
    (the assignments included); ``sample_unconstrained`` and ``log_prob`` work on the flat
    unconstrained vector of the continuous sites, as a VI guide's do (Pareto k̂ uses them).
    ``phi`` is every parameter in one vector (what a saved posterior keeps).
    """

    name = "cavi"

    def __init__(self, latents: dict[str, Latent], state: dict, layout, backend):
        self.latents, self.layout, self.backend = latents, layout, backend
        self.state = {
            n: {k: np.asarray(v, dtype=float) for k, v in s.items()} for n, s in state.items()
        }
        self.settings: dict = {}
        self.families = {n: lat.family for n, lat in latents.items()}
        self._log_density = backend.jit(self._log_density_at)

    @property
    def params(self) -> dict[str, dict[str, np.ndarray]]:
        out = {}
        for name, lat in self.latents.items():
            s, shape = self.state[name], lat.shape
            if lat.family == "Normal":
                out[name] = {
                    "loc": s["mean"].reshape(shape),
                    "covariance": s["cov"],
                    "scale": np.sqrt(np.diag(s["cov"])).reshape(shape),
                }
            elif lat.family in ("Gamma", "InverseGamma"):
                out[name] = {"concentration": s["A"].reshape(shape), "rate": s["B"].reshape(shape)}
            elif lat.family == "Dirichlet":
                out[name] = {"concentration": s["alpha"].reshape(shape)}
            else:
                out[name] = {"probs": np.exp(s["logits"]).reshape(shape + (-1,))}
        return out

    @property
    def phi(self) -> np.ndarray:
        parts = [np.ravel(v) for p in self.params.values() for _, v in sorted(p.items())]
        return np.concatenate(parts) if parts else np.zeros(0)

    def sample(self, n: int, seed: int = 0) -> dict[str, np.ndarray]:
        """``n`` draws of every latent site from q, shaped ``(n, *site_shape)``."""
        rng = np.random.default_rng(seed)
        out = {}
        for name, lat in self.latents.items():
            s, shape = self.state[name], (n,) + lat.shape
            if lat.family == "Normal":
                cov = 0.5 * (s["cov"] + s["cov"].T)
                chol = np.linalg.cholesky(cov)
                draws = s["mean"] + rng.normal(size=(n, lat.size)) @ chol.T
            elif lat.family in ("Gamma", "InverseGamma"):
                draws = rng.gamma(s["A"], 1.0 / s["B"], size=(n, lat.size))
                draws = draws if lat.family == "Gamma" else 1.0 / draws
            elif lat.family == "Dirichlet":
                draws = rng.gamma(s["alpha"], size=(n,) + s["alpha"].shape)
                draws = draws / draws.sum(-1, keepdims=True)
            else:
                cdf = np.cumsum(np.exp(s["logits"]), axis=-1)
                u = rng.random((n, lat.size, 1)) * cdf[..., -1:]
                draws = np.minimum((u > cdf).sum(-1), lat.num_categories - 1)
            out[name] = draws.reshape(shape)
        return out

    def sample_unconstrained(self, n: int, seed: int = 0) -> np.ndarray:
        """``n`` draws of the flat unconstrained vector of the continuous sites, (n, d)."""
        return self.unconstrain(self.sample(n, seed))

    def unconstrain(self, draws: dict[str, np.ndarray]) -> np.ndarray:
        """Constrained draws ``(n, *shape)`` of every continuous site as flat unconstrained rows."""
        backend, parts = self.backend, []
        with backend.scope(), backend.activate():
            for slot in self.layout.slots:
                x = backend.asarray(draws[slot.name])
                transform = backend.biject_to(self.layout.sites[slot.name].native.support)
                u = x if transform is None else transform.inv(x)
                parts.append(np.asarray(backend.to_numpy(u), dtype=float).reshape(len(x), -1))
        return np.concatenate(parts, axis=1)

    def log_prob(self, theta: np.ndarray) -> np.ndarray:
        """log q of flat unconstrained rows (n, d): q's density of the constrained values
        times the Jacobian of the constraining maps (the density of θ itself)."""
        backend = self.backend
        theta = np.atleast_2d(np.asarray(theta, dtype=float))
        with backend.scope(), backend.activate():
            state = {
                n: {k: backend.asarray(v) for k, v in s.items()} for n, s in self.state.items()
            }
            total = self._log_density(backend.asarray(theta), state)
            return np.asarray(backend.to_numpy(total), dtype=float)

    def _log_density_at(self, theta, state: dict):
        backend, n, total = self.backend, theta.shape[0], 0.0
        for slot in self.layout.slots:
            u = backend.math.reshape(
                theta[:, slot.offset : slot.offset + slot.size], (n,) + slot.unconstrained_shape
            )
            transform = backend.biject_to(self.layout.sites[slot.name].native.support)
            x = u if transform is None else transform(u)
            if transform is not None:
                ladj = transform.log_abs_det_jacobian(u, x)
                total = total + backend.math.sum(backend.math.reshape(ladj, (n, -1)), axis=1)
            total = total + self._log_q(slot.name, state[slot.name], x, n)
        return total

    def _log_q(self, name: str, s: dict, x: Any, n: int):
        backend, lat, m = self.backend, self.latents[name], self.backend.math
        if lat.family == "Normal":
            spec = MultivariateNormal(s["mean"], covariance_matrix=s["cov"])
            return backend.distribution(spec).log_prob(m.reshape(x, (n, lat.size)))
        if lat.family == "Dirichlet":
            lp = backend.distribution(Dirichlet(s["alpha"])).log_prob(
                m.reshape(x, (n,) + tuple(s["alpha"].shape))
            )
        else:
            family = Gamma if lat.family == "Gamma" else InverseGamma
            lp = backend.distribution(family(s["A"], s["B"])).log_prob(m.reshape(x, (n, lat.size)))
        return m.sum(m.reshape(lp, (n, -1)), axis=1)

    def __repr__(self) -> str:
        listing = ", ".join(f"{n}: {f}" for n, f in self.families.items())
        return f"<CAVIFactors {listing}>"
