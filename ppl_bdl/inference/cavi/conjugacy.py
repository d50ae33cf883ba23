"""Recognising a conditionally conjugate model by probing it, for CAVI (:mod:`.cavi`).

No symbolic tracer: the model is replayed by the core's evaluator at chosen values of its latent
sites, and the parameters of every site's distribution are read off the trace.

1. **Dependence.** Each latent is moved alone from a random base point; a site whose parameter
   changes depends on it.
2. **Links.** Each dependence must be one CAVI updates in closed form:

   - a Normal site's ``loc`` is *affine* in Normal latents, ``A x + b``: ``b`` is read at
     x = 0, each column of ``A`` at a unit vector, and a random x and −x/2 must give
     ``A x + b``;
   - or it is a Normal latent *indexed* by a Categorical assignment, ``locs[z]`` (the mixture
     of Section 4.4 of "Advancements in Variational Inference"): checked at random distinct ``locs`` and random ``z``;
   - a Normal site's precision 1 / scale² is ``c · τ`` for one element of a Gamma latent τ
     (a fixed map, e.g. one τ for all points), or ``c · τ[z]``; an InverseGamma latent v
     enters as the variance ``scale² = v / c`` (its precision 1/v is Gamma-distributed);
   - a Categorical site's ``probs`` are rows of a Dirichlet latent (a fixed map).

   A latent's own distribution must have constant parameters unless it is a Normal (a Normal
   may sit in a hierarchy through the same links).
3. Anything else is a :class:`~ppl_bdl.errors.ConfigError` that names the latent site whose
   complete conditional is not conjugate, the site it enters and how, and what to use instead.

Each probe is one run of the model, compiled once (``backend.jit``) for all of them (a Normal
parent of size d in an affine loc costs d + 3 runs; at most :data:`MAX_PROBED` elements). The result, a :class:`ConjugateModel`, holds each
factor's constants as NumPy arrays, one row per element of its site (flattened in C order).

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import dist
>>> from ppl_bdl.inference.common import prepare
>>> @bdl.model
... def normal_mean(y):
...     mu = bdl.sample("mu", dist.Normal(0.0, 10.0))
...     with bdl.plate("data", y.shape[0]) as idx:
...         bdl.sample("y", dist.Normal(2.0 * mu + 1.0, 0.5), obs=y[idx])
>>> model = recognise(prepare(normal_mean(np.zeros(3)), "numpyro", "float64", 0))
>>> y = model.factors[-1]
>>> y.loc.kind, y.loc.parents, y.consts["A:mu"].ravel().tolist(), y.prec.kind
('affine', ('mu',), [2.0, 2.0, 2.0], 'const')
"""

from __future__ import annotations

import numpy as np

from ppl_bdl.errors import ConfigError
from ppl_bdl.inference.cavi.conjugate_model import (
    LATENT_FAMILIES,
    ConjugateModel,
    Factor,
    Latent,
    Link,
)
from ppl_bdl.trace.interpreter import Evaluator

#: Elements of the Normal latents an affine loc may be probed in (one model run each).
MAX_PROBED = 1000

_WHAT_WORKS = (
    "CAVI recognises: Normal latents in the affine loc of Normal sites (or indexed by a "
    "Categorical assignment, locs[z]); Gamma precisions (scale = 1/sqrt(prec), or prec[z]) and "
    "InverseGamma variances (scale = sqrt(var)) of Normal sites; Dirichlet probs of Categorical "
    "sites. Fit this model with method='vi' (any continuous latents) or method='nuts'."
)


def recognise(setup, seed: int = 0) -> ConjugateModel:
    """The conjugate structure of ``setup``'s model, or a ConfigError naming the site that is
    not conjugate (see the module's docstring)."""
    return _Prober(setup, np.random.default_rng(seed)).model()


class _Prober:
    def __init__(self, setup, rng: np.random.Generator):
        self.setup, self.backend, self.rng = setup, setup.backend, rng
        self.tol = 1e-4 if setup.backend.precision == "float32" else 1e-9
        self.latents: dict[str, Latent] = {}
        for name, site in setup.sites.items():
            if site.kind == "factor":
                raise self._error(None, f"bdl.factor site {name!r} adds an arbitrary log-weight")
            if "scan" in site.extra:
                raise self._error(None, f"site {name!r} sits in bdl.scan (sites stacked in time)")
            if site.kind != "latent":
                continue
            family = site.spec.name
            if family not in LATENT_FAMILIES:
                hint = (
                    " For a Normal's noise, sample a Gamma precision and use scale=1/sqrt(prec)."
                    if family in ("HalfNormal", "HalfCauchy", "LogNormal", "Exponential")
                    else ""
                )
                raise ConfigError(
                    f"method='cavi' on {setup.bound.name!r}: latent site {name!r} has a {family} "
                    f"distribution, whose complete conditional CAVI has no closed-form update "
                    f"for (it updates {', '.join(LATENT_FAMILIES)} latents).{hint} {_WHAT_WORKS}"
                )
            shape = tuple(site.shape.value)
            k = shape[-1] if family == "Dirichlet" else 0
            if family == "Categorical":
                k = site.spec.num_categories
            size = int(np.prod(shape[:-1] if family == "Dirichlet" else shape, dtype=np.int64))
            self.latents[name] = Latent(name, family, shape, size, k)
        self.base = {n: self.draw(n) for n in self.latents}
        self._params = setup.backend.jit(self._params_at)  # one compiled run for every probe

    # -- running the model ----------------------------------------------------------------
    def draw(self, name: str) -> np.ndarray:
        lat, rng = self.latents[name], self.rng
        if lat.family == "Normal":
            return rng.normal(size=lat.shape)
        if lat.family in ("Gamma", "InverseGamma"):
            return rng.uniform(0.5, 2.0, size=lat.shape)
        if lat.family == "Dirichlet":
            return rng.dirichlet(np.ones(lat.num_categories), size=lat.shape[:-1])
        return rng.integers(lat.num_categories, size=lat.shape)

    def _params_at(self, values: dict) -> dict:
        ev = Evaluator(self.backend, values=values, params=self.setup.params, record=True)
        self.setup.bound.run_with(ev)
        return {
            n: {k: self.backend.math.asarray(v) for k, v in s.spec.params.items()}
            for n, s in ev.sites.items()
            if s.kind in ("latent", "observed")
        }

    def run(self, **changes) -> dict:
        """The parameters of every site with the latents at ``changes`` (else at the base)."""
        backend = self.backend
        values = {**self.base, **changes}
        with backend.scope(), backend.activate():
            out = self._params({k: backend.asarray(v) for k, v in values.items()})
            return {n: {k: backend.to_numpy(v) for k, v in p.items()} for n, p in out.items()}

    def param(self, params: dict, name: str, key: str) -> np.ndarray:
        """Parameter ``key`` of site ``name``, broadcast to one row per element."""
        site = self.setup.sites[name]
        value = np.asarray(params[name][key], dtype=float)
        shape = tuple(site.shape.value)
        if site.spec.name == "Categorical":
            full = np.broadcast_to(value, shape + value.shape[-1:])
            if key == "logits":  # normalised: log-probs
                top = full.max(-1, keepdims=True)
                full = full - top - np.log(np.exp(full - top).sum(-1, keepdims=True))
            return full.reshape(-1, full.shape[-1])
        full = np.broadcast_to(value, shape)
        return full.reshape(-1, shape[-1]) if site.spec.name == "Dirichlet" else full.reshape(-1)

    def close(self, got, want) -> bool:
        return bool(np.all(np.abs(got - want) <= self.tol * (1.0 + np.abs(want).max())))

    # -- the model ------------------------------------------------------------------------
    def model(self) -> ConjugateModel:
        sites = self.setup.sites
        base = self.run()
        keys = {
            n: list(s.spec.params) for n, s in sites.items() if s.kind in ("latent", "observed")
        }
        depends: dict[tuple[str, str], set[str]] = {}
        for latent in self.latents:
            moved = self.run(**{latent: self.moved(latent)})
            for name, params in keys.items():
                for key in params:
                    if not np.array_equal(
                        self.param(base, name, key), self.param(moved, name, key)
                    ):
                        depends.setdefault((name, key), set()).add(latent)
        factors = []
        for name, params in keys.items():
            deps = {key: sorted(depends.get((name, key), ())) for key in params}
            factors.append(self.factor(name, base, deps))
        return ConjugateModel(self.latents, factors)

    def moved(self, name: str) -> np.ndarray:
        lat = self.latents[name]
        if lat.family == "Categorical":  # every element to another category
            return (self.base[name] + 1) % max(lat.num_categories, 1)
        return self.draw(name)

    def factor(self, name: str, base: dict, deps: dict) -> Factor:
        site = self.setup.sites[name]
        family, observed = site.spec.name, site.kind == "observed"
        size = int(np.prod(site.shape.batch + site.shape.extra, dtype=np.int64))
        parents = {key: p for key, p in deps.items() if p}
        if family not in ("Normal", "Categorical") and not parents:
            if observed:  # a constant term of the joint
                logp = float(np.sum(self.backend.to_numpy(site.log_prob)))
                return Factor(name, "constant", True, size, consts={"logp": logp})
            p = {k: self.param(base, name, k) for k in site.spec.params}
            if family == "Dirichlet":
                return Factor(name, family, False, size, consts={"alpha0": p["concentration"]})
            return Factor(
                name, family, False, size, consts={"a0": p["concentration"], "b0": p["rate"]}
            )
        if family == "Normal":
            f = Factor(name, family, observed, size)
            f.loc = self.loc_link(f, base, parents.get("loc", []))
            f.prec = self.prec_link(f, base, parents.get("scale", []))
            if f.loc.assign and f.prec.assign and f.loc.assign != f.prec.assign:
                raise self._error(
                    f.prec.assign,
                    f"site {name!r} mixes over two assignments "
                    f"({f.loc.assign!r}, {f.prec.assign!r})",
                )
        elif family == "Categorical":
            f = Factor(name, family, observed, size)
            f.probs = self.probs_link(f, base, parents)
        else:
            key, latents = next(iter(parents.items()))
            raise self._error(
                latents[0],
                f"it enters the {family} site {name!r} through its "
                f"{key!r}; only Normal and Categorical sites may depend on latents",
            )
        if observed:
            value = np.asarray(self.backend.to_numpy(site.value), float).reshape(-1)
            if family == "Categorical":
                k = self.param(base, name, next(iter(site.spec.params))).shape[-1]
                f.consts["onehot"] = np.eye(k)[value.astype(int)]
            else:
                f.consts["y"] = value
        return f

    # -- links ----------------------------------------------------------------------------
    def split(self, parents: list[str], site: str, key: str, allowed: tuple[str, ...]) -> dict:
        by_family: dict[str, list[str]] = {}
        for p in parents:
            family = self.latents[p].family
            if family not in allowed:
                raise self._error(
                    p, f"it enters site {site!r} through its {key!r} (a {family} latent there)"
                )
            by_family.setdefault(family, []).append(p)
        return by_family

    def loc_link(self, f: Factor, base: dict, parents: list[str]) -> Link:
        name = f.site
        if not parents:
            f.consts["b"] = self.param(base, name, "loc")
            return Link("const")
        fam = self.split(parents, name, "loc", ("Normal", "Categorical"))
        normals, cats = fam.get("Normal", []), fam.get("Categorical", [])
        if cats:
            mu, z = (normals or [None])[0], cats[0]
            self.check_indexed(f, mu, z, "loc", parents)
            for _ in range(2):
                locs, assign = self.draw(mu), self.draw(z)
                got = self.param(self.run(**{mu: locs, z: assign}), name, "loc")
                if not self.close(got, np.broadcast_to(locs[assign], got.shape)):
                    raise self._error(
                        mu, f"site {name!r}'s loc depends on {mu!r} and {z!r} but is not {mu}[{z}]"
                    )
            return Link("indexed", (mu,), z)
        zero = {p: np.zeros(self.latents[p].shape) for p in normals}
        self.budget(name, "loc", normals)
        b = self.param(self.run(**zero), name, "loc")
        f.consts["b"] = b
        for p in normals:
            lat, cols = self.latents[p], []
            for m in range(lat.size):
                unit = np.zeros(lat.size)
                unit[m] = 1.0
                cols.append(
                    self.param(self.run(**{**zero, p: unit.reshape(lat.shape)}), name, "loc") - b
                )
            f.consts[f"A:{p}"] = np.stack(cols, axis=1)
        point = {p: self.draw(p) for p in normals}
        for scale in (1.0, -0.5):  # a random point and one on the other side (|x| is not affine)
            at = {p: scale * x for p, x in point.items()}
            want = b + sum(f.consts[f"A:{p}"] @ at[p].reshape(-1) for p in normals)
            if not self.close(self.param(self.run(**at), name, "loc"), want):
                raise self._error(normals[0], f"site {name!r}'s loc is not affine in {normals}")
        return Link("affine", tuple(normals))

    def budget(self, site: str, key: str, latents: list[str]) -> None:
        if sum(self.latents[p].size for p in latents) > MAX_PROBED:
            raise ConfigError(
                f"method='cavi': the {key!r} of site {site!r} depends on {latents}, over "
                f"{MAX_PROBED} elements in all; recognising it would cost one model run per "
                "element. Use method='vi' for a model of this size."
            )

    def check_indexed(self, f: Factor, mu, z: str, key: str, parents: list[str]) -> None:
        lat = self.latents.get(mu) if mu else None
        if mu is None or len(parents) != 2 or len(lat.shape) != 1:
            raise self._error(
                z,
                f"it indexes the {key!r} of site {f.site!r} with other "
                f"latents {parents}: expected one 1-D latent indexed by {z!r}",
            )
        if lat.shape[0] != self.latents[z].num_categories or self.latents[z].size != f.size:
            raise self._error(
                z,
                f"{mu}[{z}] in site {f.site!r}: {mu!r} has shape {lat.shape}, "
                f"{z!r} has {self.latents[z].num_categories} categories and "
                f"{self.latents[z].size} elements, the site {f.size}: expected "
                "one component per category and one assignment per element",
            )

    def prec_link(self, f: Factor, base: dict, parents: list[str]) -> Link:
        name = f.site
        if not parents:
            f.consts["c"] = self.param(base, name, "scale") ** -2.0
            return Link("const")
        fam = self.split(parents, name, "scale", ("Gamma", "InverseGamma", "Categorical"))
        gammas = fam.get("Gamma", []) + fam.get("InverseGamma", [])
        cats = fam.get("Categorical", [])
        if len(gammas) != 1:
            raise self._error(
                (gammas or cats)[-1],
                f"site {name!r}'s scale depends on "
                f"{parents}: expected one Gamma precision or InverseGamma variance "
                "(indexed by at most one assignment)",
            )
        tau = gammas[0]
        inverse = self.latents[tau].family == "InverseGamma"

        def precision(t, **more):  # the precision at t = τ (Gamma) or t = 1/v (InverseGamma)
            sites = self.run(**{tau: 1.0 / t if inverse else t}, **more)
            return self.param(sites, name, "scale") ** -2.0

        if cats:
            z = cats[0]
            self.check_indexed(f, tau, z, "scale", parents)
            coefs = []
            for _ in range(2):
                t, assign = self.draw(tau), self.draw(z)
                coefs.append(precision(t, **{z: assign}) / np.broadcast_to(t[assign], (f.size,)))
            if not self.close(coefs[0], coefs[1]):
                raise self._error(tau, f"site {name!r}'s precision is not c * {tau}[{z}]")
            f.consts["c"] = coefs[0]
            return Link("indexed", (tau,), z)
        shape, size = self.latents[tau].shape, self.latents[tau].size
        self.budget(name, "scale", [tau])
        ones = np.ones(size)
        at_one = precision(ones.reshape(shape))
        cols = []
        for m in range(size):
            bumped = ones.copy()
            bumped[m] = 2.0
            cols.append(precision(bumped.reshape(shape)) - at_one)
        C = np.stack(cols, axis=1)
        t = self.draw(tau)
        nonzero = np.abs(C) > self.tol * np.abs(C).max()
        linear = self.close(at_one, C.sum(1)) and self.close(precision(t), C @ t.reshape(-1))
        if not linear or not np.all(nonzero.sum(1) == 1):
            how = "1 / scale² = c * prec" if not inverse else "scale² = var / c"
            raise self._error(
                tau,
                f"it enters site {name!r}'s scale, but not as {how} for "
                "one element of it per element of the site",
            )
        f.consts["C"], f.consts["M"] = np.where(nonzero, C, 0.0), nonzero.astype(float)
        return Link("map", (tau,))

    def probs_link(self, f: Factor, base: dict, parents: dict) -> Link:
        name = f.site
        if not parents:
            key = next(iter(self.setup.sites[name].spec.params))
            p = self.param(base, name, key)
            f.consts["logp"] = np.log(p / p.sum(-1, keepdims=True)) if key == "probs" else p
            return Link("const")
        key, latents = next(iter(parents.items()))
        fam = self.split(latents, name, key, ("Dirichlet",))
        if key != "probs" or len(fam["Dirichlet"]) != 1:
            raise self._error(
                latents[0],
                f"it enters site {name!r}'s {key!r}: expected the "
                "probs of a Categorical to be rows of one Dirichlet latent",
            )
        pi = latents[0]
        rows_at = [self.draw(pi).reshape(-1, self.latents[pi].num_categories) for _ in range(2)]
        got = [
            self.param(self.run(**{pi: r.reshape(self.latents[pi].shape)}), name, key)
            for r in rows_at
        ]
        match = np.abs(got[0][:, None, :] - rows_at[0][None]).sum(-1).argmin(1)
        if not (self.close(got[0], rows_at[0][match]) and self.close(got[1], rows_at[1][match])):
            raise self._error(pi, f"site {name!r}'s probs are not rows of {pi!r}")
        f.consts["R"] = np.eye(len(rows_at[0]))[match]
        return Link("map", (pi,))

    def _error(self, latent: str | None, how: str) -> ConfigError:
        who = "the model is not conditionally conjugate: "
        if latent:
            who = f"the complete conditional of latent site {latent!r} is not conjugate: "
        return ConfigError(f"method='cavi' on {self.setup.bound.name!r}: {who}{how}. {_WHAT_WORKS}")
