"""CAVI's closed-form coordinate updates and its ELBO, written once on the backend's math.

For a model recognised by :mod:`.conjugacy`, the mean-field family (Eq. 38 of "Advancements in Variational Inference"; a
Normal site's elements form one block, Eq. 39) is q = ∏_j q_j with q_j in the family of latent
j's complete conditional: a Normal N(mean, cov) per Normal site (its precision P and linear
term h accumulated from its factors, cov = P⁻¹, mean = cov h), a Gamma(A, B) for a Gamma
precision τ (for an InverseGamma variance v, q(v) is InverseGamma(A, B), i.e. 1/v ~ Gamma(A, B)),
a Dirichlet(α) per Dirichlet row, a Categorical (probs = softmax(logits)) per assignment.

The update of q_j is Eq. 49 of "Advancements in Variational Inference": argmax of the ELBO over q_j with the other factors
held, which for a conjugate complete conditional is q_j ∝ exp E_{-j}[log p(x, θ)] (Blei,
Kucukelbir & McAuliffe 2017, Eq. 18): its natural parameters are the prior's plus each child
factor's expected sufficient statistics. For the Gaussian mixture of Section 4.4 of "Advancements in Variational Inference"
they are its two updates, of the responsibilities φ and of the components, generalised from its
unit-variance components to Gamma precisions and Dirichlet weights: log φ_ik = E[log π_k]
+ ½E[log τ_k] − ½E[τ_k] E[(x_i − μ_k)²] + const, and μ_k's precision 1/s₀² + Σ_i φ_ik E[τ_k].

The ELBO (Eq. 44 of "Advancements in Variational Inference") is evaluated in closed form: Σ over factors of E_q[log p(site |
parents)] plus the entropy of every q_j. Each coordinate update can only raise it.

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import dist
>>> from ppl_bdl.inference.common import prepare
>>> from ppl_bdl.inference.cavi.conjugacy import recognise
>>> @bdl.model
... def normal_mean(y):
...     mu = bdl.sample("mu", dist.Normal(0.0, 1.0))
...     with bdl.plate("data", y.shape[0]) as idx:
...         bdl.sample("y", dist.Normal(mu, 1.0), obs=y[idx])
>>> setup = prepare(normal_mean(np.array([1.0, 2.0, 3.0])), "numpyro", "float64", 0)
>>> program = CAVIProgram(recognise(setup), setup.backend)
>>> backend = setup.backend
>>> with backend.scope(), backend.activate():
...     state, elbo = program.sweep(program.initial_state(np.random.default_rng(0)),
...                                 program.constants())
>>> float(state["mu"]["mean"][0]), float(state["mu"]["cov"][0, 0])  # 6 / 4 and 1 / 4
(1.5, 0.25)
"""

from __future__ import annotations

import math

import numpy as np

from ppl_bdl.inference.cavi.conjugate_model import ConjugateModel, Factor

LOG_2PI = math.log(2.0 * math.pi)
#: Responsibilities below exp(-80) (1.8e-35, a normal float32) count as that: exp of a float32
#: that underflows takes torch's slow path (x 50 on a sweep), and the ELBO moves by < 1e-33.
LOG_TINY = -80.0
_GAMMAS = ("Gamma", "InverseGamma")


class CAVIProgram:
    """The updates and the ELBO of one recognised model: :meth:`sweep` updates every factor
    once (continuous sites in model order, then the assignments) and returns the ELBO.

    ``state[site]``: Normal ``mean`` (d,), ``cov`` (d, d), ``logdet`` (of cov); Gamma and
    InverseGamma ``A``, ``B`` (d,); Dirichlet ``alpha`` (rows, K); Categorical ``logits``
    (n, K), normalised. ``consts``: one dict of backend arrays per factor
    (:meth:`constants`), passed in so that the data is not baked into a compiled sweep."""

    def __init__(self, model: ConjugateModel, backend):
        self.model, self.backend, self.m = model, backend, backend.math
        self.latents = model.latents
        firsts = [n for n, lat in self.latents.items() if lat.family == "Categorical"]
        self.order = firsts + [n for n in self.latents if n not in firsts]
        self.own = {f.site: i for i, f in enumerate(model.factors) if not f.observed}
        self.children = {
            n: [i for i, f in enumerate(model.factors) if n in f.parents()] for n in self.latents
        }

    # -- set-up ---------------------------------------------------------------------------
    def constants(self) -> list[dict]:
        out = []
        for f in self.model.factors:
            consts = dict(f.consts)
            for key in ("c", "C"):
                if key in consts:
                    consts["logc"] = np.log(consts[key].sum(1) if key == "C" else consts[key])
            out.append(
                {k: self.backend.asarray(np.asarray(v, dtype=float)) for k, v in consts.items()}
            )
        return out

    def initial_state(self, rng: np.random.Generator) -> dict:
        """Every q at its own prior where that is constant (a Normal's N(b, diag(1/c)), else
        N(0, I)), the assignments at uniform responsibilities, and the means of mixture
        components apart: at data points picked by k-means++ seeding (Arthur & Vassilvitskii
        2007) from an observed site that mixes over them, else at a prior draw. A sweep updates
        the assignments first, as Section 4.4 of "Advancements in Variational Inference" does from its random means."""
        state = {}
        for name, lat in self.latents.items():
            f = self.model.factors[self.own[name]]
            if lat.family == "Normal":
                mean = f.consts["b"] if f.loc.kind == "const" else np.zeros(lat.size)
                var = 1.0 / f.consts["c"] if f.prec.kind == "const" else np.ones(lat.size)
                mixed = [
                    g
                    for g in self.model.factors
                    if g.family == "Normal" and g.loc.kind == "indexed" and g.loc.parents[0] == name
                ]
                data = [g.consts["y"] for g in mixed if g.observed]
                if data:
                    mean = _kmeans_pp(data[0], lat.size, rng)
                elif mixed:
                    mean = mean + np.sqrt(var) * rng.normal(size=lat.size)
                s = {"mean": mean, "cov": np.diag(var), "logdet": np.sum(np.log(var))}
            elif lat.family in _GAMMAS:
                s = {"A": f.consts["a0"], "B": f.consts["b0"]}
            elif lat.family == "Dirichlet":
                s = {"alpha": f.consts["alpha0"]}
            else:
                s = {"logits": np.full((lat.size, lat.num_categories), -np.log(lat.num_categories))}
            state[name] = {
                k: self.backend.asarray(np.asarray(v, dtype=float)) for k, v in s.items()
            }
        return state

    # -- expectations under q -------------------------------------------------------------
    def expect(self, name: str, state: dict) -> dict:
        m, s, family = self.m, state[name], self.latents[name].family
        if family == "Normal":
            return {"mean": s["mean"], "var": m.diag(s["cov"]), "cov": s["cov"]}
        if family in _GAMMAS:  # of t = τ, or t = 1/v: Gamma(A, B) either way
            return {"t": s["A"] / s["B"], "logt": m.digamma(s["A"]) - m.log(s["B"])}
        if family == "Dirichlet":
            total = m.sum(s["alpha"], axis=-1, keepdims=True)
            return {"logpi": m.digamma(s["alpha"]) - m.digamma(total)}
        logits = m.maximum(s["logits"], LOG_TINY)
        return {"probs": m.exp(logits), "logits": logits}

    def weights(self, f: Factor, state: dict):
        """The responsibilities φ (n, K) of the factor's assignment, or ones (n, 1)."""
        z = f.assign
        return self.expect(z, state)["probs"] if z else self.m.ones((f.size, 1))

    def normal_stats(self, f: Factor, c: dict, state: dict) -> dict:
        """E[precision], E[log precision], E[loc], Var[loc], E[value], Var[value] and the
        expected log density ``ell`` of a Normal factor, (n, 1) or (n, K) per component."""
        m = self.m
        if f.prec.kind == "const":
            ep, elp = c["c"][:, None], c["logc"][:, None]
        else:
            t = self.expect(f.prec.parents[0], state)
            if f.prec.kind == "map":
                ep, elp = (c["C"] @ t["t"])[:, None], (c["logc"] + c["M"] @ t["logt"])[:, None]
            else:
                ep, elp = c["c"][:, None] * t["t"][None, :], c["logc"][:, None] + t["logt"][None]
        if f.loc.kind == "indexed":
            mu = self.expect(f.loc.parents[0], state)
            el, vl = mu["mean"][None, :], mu["var"][None, :]
        else:
            el, vl = c["b"], 0.0
            for p in f.loc.parents:
                e = self.expect(p, state)
                el = el + c[f"A:{p}"] @ e["mean"]
                vl = vl + m.sum((c[f"A:{p}"] @ e["cov"]) * c[f"A:{p}"], axis=1)
            el, vl = el[:, None], (vl[:, None] if f.loc.parents else 0.0)
        if f.observed:
            ey, vy = c["y"][:, None], 0.0
        else:
            e = self.expect(f.site, state)
            ey, vy = e["mean"][:, None], e["var"][:, None]
        sq = (ey - el) ** 2 + vy + vl
        ell = 0.5 * elp - 0.5 * LOG_2PI - 0.5 * ep * sq
        return {"ep": ep, "el": el, "ey": ey, "sq": sq, "ell": ell}

    def categorical_logp(self, f: Factor, c: dict, state: dict):
        if f.probs.kind == "const":
            return c["logp"]
        return c["R"] @ self.expect(f.probs.parents[0], state)["logpi"]

    # -- the coordinate updates (Eq. 49 of "Advancements in Variational Inference") -------------------------------------
    def update(self, name: str, state: dict, consts: list) -> dict:
        """q_name's optimum given every other factor of ``state``."""
        family, m = self.latents[name].family, self.m
        factors = [(i, self.model.factors[i], consts[i]) for i in self.children[name]]
        own = consts[self.own[name]]
        if family == "Normal":
            return self._normal(name, state, consts)
        if family in _GAMMAS:
            A, B = own["a0"], own["b0"]
            for _, f, c in factors:
                st, phi = self.normal_stats(f, c, state), self.weights(f, state)
                if f.prec.kind == "map":
                    A = A + 0.5 * m.sum(c["M"], axis=0)
                    B = B + 0.5 * (m.transpose(c["C"]) @ m.sum(phi * st["sq"], axis=1))
                else:
                    A = A + 0.5 * m.sum(phi, axis=0)
                    B = B + 0.5 * m.sum(phi * c["c"][:, None] * st["sq"], axis=0)
            return {"A": A, "B": B}
        if family == "Dirichlet":
            alpha = own["alpha0"]
            for _, f, c in factors:
                phi = c["onehot"] if f.observed else self.expect(f.site, state)["probs"]
                alpha = alpha + m.transpose(c["R"]) @ phi
            return {"alpha": alpha}
        logits = self.categorical_logp(self.model.factors[self.own[name]], own, state)
        for _, f, c in factors:
            logits = logits + self.normal_stats(f, c, state)["ell"]
        return {"logits": m.log_softmax(logits, axis=-1)}

    def _normal(self, name: str, state: dict, consts: list) -> dict:
        m, d = self.m, self.latents[name].size
        P, h = m.zeros((d, d)), m.zeros((d,))
        for i in [self.own[name]] + self.children[name]:
            f, c = self.model.factors[i], consts[i]
            st, phi = self.normal_stats(f, c, state), self.weights(f, state)
            if f.site == name:  # its own distribution: precision E[prec], centre E[loc]
                P = P + m.diag(m.sum(phi * st["ep"], axis=1))
                h = h + m.sum(phi * st["ep"] * st["el"], axis=1)
            elif f.loc.kind == "indexed":  # name is the component means μ of a mixture
                w = phi * st["ep"]
                P = P + m.diag(m.sum(w, axis=0))
                h = h + m.sum(w * st["ey"], axis=0)
            else:  # name is in the affine loc b + Σ A_p x_p: the residual without it
                A, w = c[f"A:{name}"], m.sum(phi * st["ep"], axis=1)
                rest = st["el"][:, 0] - A @ state[name]["mean"]
                P = P + m.transpose(A) @ (w[:, None] * A)
                h = h + m.transpose(A) @ (w * (st["ey"][:, 0] - rest))
        L = m.cholesky(P)
        L_inv = m.triangular_solve(L, m.eye(d), lower=True)
        cov = m.transpose(L_inv) @ L_inv
        return {"mean": cov @ h, "cov": cov, "logdet": -2.0 * m.sum(m.log(m.diag(L)))}

    def sweep(self, state: dict, consts: list):
        """One pass of coordinate updates; the new state and its ELBO."""
        state = dict(state)
        for name in self.order:
            state[name] = self.update(name, state, consts)
        return state, self.elbo(state, consts)

    # -- the ELBO (Eq. 44 of "Advancements in Variational Inference") ---------------------------------------------------
    def elbo(self, state: dict, consts: list):
        m = self.m
        total = 0.0
        for f, c in zip(self.model.factors, consts, strict=True):
            if f.family == "constant":
                total = total + c["logp"]
            elif f.family == "Normal":
                total = total + m.sum(
                    self.weights(f, state) * self.normal_stats(f, c, state)["ell"]
                )
            elif f.family == "Categorical":
                phi = c["onehot"] if f.observed else self.expect(f.site, state)["probs"]
                total = total + m.sum(phi * self.categorical_logp(f, c, state))
            elif f.family in _GAMMAS:
                t, sign = self.expect(f.site, state), -1.0 if f.family == "Gamma" else 1.0
                a0, b0 = c["a0"], c["b0"]
                total = total + m.sum(
                    a0 * m.log(b0) - m.lgamma(a0) + (a0 + sign) * t["logt"] - b0 * t["t"]
                )
            else:  # Dirichlet
                a0 = c["alpha0"]
                logpi = self.expect(f.site, state)["logpi"]
                total = total + m.sum(m.lgamma(m.sum(a0, axis=-1)) - m.sum(m.lgamma(a0), axis=-1))
                total = total + m.sum((a0 - 1.0) * logpi)
        for name in self.latents:
            total = total + self.entropy(name, state)
        return total

    def entropy(self, name: str, state: dict):
        m, s, lat = self.m, state[name], self.latents[name]
        if lat.family == "Normal":
            return 0.5 * lat.size * (1.0 + LOG_2PI) + 0.5 * s["logdet"]
        if lat.family in _GAMMAS:
            A, B = s["A"], s["B"]
            h = m.sum(A - m.log(B) + m.lgamma(A) + (1.0 - A) * m.digamma(A))
            # v = 1/t: H[v] = H[t] - 2 E[log t]
            return h if lat.family == "Gamma" else h - 2.0 * m.sum(self.expect(name, state)["logt"])
        if lat.family == "Dirichlet":
            a = s["alpha"]
            a0 = m.sum(a, axis=-1)
            k = lat.num_categories
            return m.sum(
                m.sum(m.lgamma(a), axis=-1)
                - m.lgamma(a0)
                + (a0 - k) * m.digamma(a0)
                - m.sum((a - 1.0) * m.digamma(a), axis=-1)
            )
        e = self.expect(name, state)
        return -m.sum(e["probs"] * e["logits"])


def _kmeans_pp(y: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """``k`` of the points ``y``: the first at random, each next with probability proportional
    to its squared distance to the nearest one picked (k-means++ seeding)."""
    picked = [y[rng.integers(len(y))]]
    for _ in range(k - 1):
        d2 = np.min((y[:, None] - np.asarray(picked)[None, :]) ** 2, axis=1)
        p = d2 / d2.sum() if d2.sum() > 0 else None
        picked.append(y[rng.choice(len(y), p=p)])
    return np.asarray(picked, dtype=float)
