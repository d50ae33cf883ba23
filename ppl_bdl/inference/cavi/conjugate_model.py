"""The conjugate structure of a model, as :mod:`.conjugacy` recognises it and CAVI
(:mod:`.cavi_updates`) updates it: its latent sites and one factor per site, whose parameters
are linked to latents in one of the ways CAVI updates in closed form.

Example
-------
>>> f = Factor("y", "Normal", observed=True, size=3, loc=Link("indexed", ("locs",), "z"))
>>> f.assign, sorted(f.parents())
('z', ['locs', 'z'])
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: The latent families CAVI updates in closed form.
LATENT_FAMILIES = ("Normal", "Gamma", "InverseGamma", "Dirichlet", "Categorical")


@dataclass
class Link:
    """How one parameter of a site depends on latents.

    ``kind``: "const"; "affine" (loc = b + Σ_p A_p x_p over ``parents``); "indexed"
    (loc = parent[z], precision = c · parent[z], with ``assign`` = z); "map" (precision
    = C @ t with one nonzero per row, t = τ or 1/v of ``parent``; probs = R @ π)."""

    kind: str
    parents: tuple[str, ...] = ()
    assign: str | None = None


@dataclass
class Factor:
    """One site's term log p(site | its parents) of the joint.

    ``family``: the site's distribution (or "constant": an observed site whose parameters
    depend on no latent, its log density ``consts["logp"]``). ``loc`` and ``prec`` link a Normal
    site's parameters, ``probs`` a Categorical's. ``consts``: "y" (observed values), "b",
    "A:<parent>", "c" (precision coefficients), "C" and "M" (a precision map and its 0/1
    pattern), "logp" (constant log-probs), "R" (Dirichlet rows), "a0"/"b0" (a Gamma or
    InverseGamma prior), "alpha0" (a Dirichlet prior), "onehot" (observed labels)."""

    site: str
    family: str
    observed: bool
    size: int
    loc: Link | None = None
    prec: Link | None = None
    probs: Link | None = None
    consts: dict = field(default_factory=dict)

    @property
    def assign(self) -> str | None:
        """The Categorical assignment z this factor is a mixture over, if any."""
        for link in (self.loc, self.prec):
            if link is not None and link.assign is not None:
                return link.assign
        return None

    def parents(self) -> set[str]:
        out = set()
        for link in (self.loc, self.prec, self.probs):
            if link is not None:
                out.update(link.parents)
                out.update([link.assign] if link.assign else [])
        return out


@dataclass
class Latent:
    """A latent site: its family, value shape, element count and categories (Dirichlet,
    Categorical)."""

    name: str
    family: str
    shape: tuple[int, ...]
    size: int
    num_categories: int = 0


@dataclass
class ConjugateModel:
    """The latent sites (by name, in the model's order) and one factor per site."""

    latents: dict[str, Latent]
    factors: list[Factor]
