"""What is off with a fit, said in one place: the findings every fit is checked for.

After every fit, :func:`check_fit` looks at the result and lists what a user should not trust:
for MCMC, R-hat above 1.01 (rank-normalised split R-hat, Vehtari et al. 2021, as ArviZ computes
it; only with two chains or more), bulk or tail ESS below 100 per chain, divergent transitions,
draws that hit the maximum tree depth, mean acceptance far from its target; for VI, a run stopped
on a diverging loss, a loss that ended far above its running minimum or has not flattened, and the
Pareto k̂ of the importance weights p(x, θ) / q(θ) at draws from the guide (PSIS, Vehtari et al.
2024, as :func:`arviz.psislw` computes it). Each :class:`Finding` names the sites concerned, the
value seen, the threshold and what to try. ``fit`` logs the report as one
:class:`ConvergenceWarning`, keeps it as ``post.diagnostics``, and with ``strict=True`` raises
:class:`ConvergenceError` instead (the posterior in ``error.partial``).

Example
-------
>>> from ppl_bdl.diagnostics import Diagnostics, Finding
>>> d = Diagnostics([Finding("rhat", ("mu",), 1.2, 1.01, "run longer chains")])
>>> print(d.report())
1 problem found:
- R-hat 1.2 > 1.01 at mu: run longer chains
>>> bool(Diagnostics([]))
False
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import InferenceError


class ConvergenceWarning(UserWarning):
    """A fit finished but its diagnostics say its result should not be trusted as it is."""


class ConvergenceError(InferenceError):
    """``fit(..., strict=True)``: the diagnostics found problems; ``error.partial`` holds the
    posterior and ``error.findings`` the :class:`Diagnostics`."""

    def __init__(self, message: str, partial=None, findings=None):
        super().__init__(message, partial=partial)
        self.findings = findings if findings is not None else Diagnostics([])


#: How each kind of finding reads: ``{value}`` and ``{threshold}`` are filled in.
_LABELS = {
    "rhat": "R-hat {value:.3g} > {threshold:.3g}",
    "ess_bulk": "bulk ESS {value:.3g} per chain < {threshold:.3g}",
    "ess_tail": "tail ESS {value:.3g} per chain < {threshold:.3g}",
    "divergences": "{value:.0f} divergent transitions (> {threshold:.0f})",
    "tree_depth": "{value:.0%} of draws hit the maximum tree depth (> {threshold:.0%})",
    "acceptance": "mean acceptance {value:.2f}, target {threshold:.2f}",
    "vi_diverged": "the VI loss diverged at step {value:.0f}",
    "vi_above_minimum": "the final VI loss is {value:.3g} above its running minimum (> {threshold:.3g})",
    "vi_not_flat": "the VI loss still moves {value:.2%} over the last 10% of steps (> {threshold:.2%})",
    "psis_khat": "Pareto k̂ {value:.2f} > {threshold:.2f}",
    "cost": "{value:.0f} latent dimensions (> {threshold:.0f})",
}


@dataclass(frozen=True)
class Finding:
    """One thing that is off: its ``kind`` (a key of the table above), the ``sites`` concerned
    (empty when it is about the fit as a whole), the ``value`` seen, the ``threshold`` it was held
    against, and ``advice``: what to try."""

    kind: str
    sites: tuple[str, ...]
    value: float
    threshold: float
    advice: str

    @property
    def message(self) -> str:
        label = _LABELS.get(self.kind, self.kind + " {value:.3g} (threshold {threshold:.3g})")
        text = label.format(value=self.value, threshold=self.threshold)
        if self.sites:
            shown = ", ".join(self.sites[:5])
            more = len(self.sites) - 5
            text += f" at {shown}" + (f" and {more} more" if more > 0 else "")
        return f"{text}: {self.advice}"

    def __str__(self) -> str:
        return self.message


class Diagnostics(tuple):
    """The findings of one fit (a tuple of :class:`Finding`; empty and falsy when clean)."""

    def __new__(cls, findings=()):
        return super().__new__(cls, tuple(findings))

    def report(self) -> str:
        """The findings as text, one line each ("no problems found" when clean)."""
        if not self:
            return "Diagnostics: no problems found."
        head = f"{len(self)} problem{'s' if len(self) > 1 else ''} found:"
        return "\n".join([head] + [f"- {f.message}" for f in self])

    def kinds(self) -> list[str]:
        """The kinds of the findings, in order."""
        return [f.kind for f in self]

    def __repr__(self) -> str:
        return f"Diagnostics({list(self)!r})"
