"""What is off with a fit, said in one place: the findings every fit is checked for.

After every fit, :func:`check_fit` looks at the result and lists what a user should not trust:
for MCMC, R-hat above 1.01 (rank-normalised split R-hat, Vehtari et al. 2021, as ArviZ computes
it; only with two chains or more), bulk or tail ESS below 100 per chain, divergent transitions,
draws that hit the maximum tree depth, mean acceptance far from its target; for VI, a run stopped
on a diverging loss, a run to convergence (``num_steps=None``) that reached its step cap first,
a loss that ended far above its running minimum or has not flattened, and the
Pareto k̂ of the importance weights p(x, θ) / q(θ) at draws from the guide (PSIS, Vehtari et al.
2024, as :func:`arviz.psislw` computes it); for an ensemble, each member's loss curve as VI's
(no R-hat or ESS: its members are optima, not chains). Each :class:`Finding` names the sites
concerned, the value seen, the threshold and what to try. ``fit`` logs the report as one
:class:`ConvergenceWarning`, keeps it as ``post.diagnostics``, and with ``strict=True`` raises
:class:`ConvergenceError` instead (the posterior in ``error.partial``).

Example
-------
>>> from ppl_bdl.posterior.diagnostics import Diagnostics, Finding
>>> d = Diagnostics([Finding("rhat", ("mu",), 1.2, 1.01, "run longer chains")])
>>> print(d.report())
1 problem found:
- R-hat 1.2 > 1.01 at mu: run longer chains
>>> bool(Diagnostics([]))
False
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace

import numpy as np

from ppl_bdl.errors import InferenceError
from ppl_bdl.posterior.arviz_export import quiet_arviz
from ppl_bdl.posterior.loss_curves import CURVE_ADVICE as _CURVE_ADVICE
from ppl_bdl.posterior.loss_curves import VI_ABOVE_MINIMUM_SE, VI_RELATIVE_CHANGE  # noqa: F401 (thresholds)
from ppl_bdl.posterior.loss_curves import loss_curve_checks as _loss_curve_checks


class ConvergenceWarning(UserWarning):
    """A fit finished but its diagnostics say its result should not be trusted as it is."""


class ConvergenceError(InferenceError):
    """``fit(..., strict=True)``: the diagnostics found problems; ``error.partial`` holds the
    posterior and ``error.findings`` the :class:`Diagnostics`."""

    def __init__(self, message: str, partial=None, findings=None):
        super().__init__(message, partial=partial)
        self.findings = findings if findings is not None else Diagnostics([])


#: What to try against a funnel (a site whose scale is another latent): its non-centred form.
REPARAM_ADVICE = "bdl.reparam(model, {site: bdl.LocScale(0)})"

#: How each kind of finding reads: ``{value}`` and ``{threshold}`` are filled in.
_LABELS = {
    "rhat": "R-hat {value:.3g} > {threshold:.3g}",
    "ess_bulk": "bulk ESS {value:.3g} per chain < {threshold:.3g}",
    "ess_tail": "tail ESS {value:.3g} per chain < {threshold:.3g}",
    "divergences": "{value:.0f} divergent transitions (> {threshold:.0f})",
    "tree_depth": "{value:.0%} of draws hit the maximum tree depth (> {threshold:.0%})",
    "acceptance": "mean acceptance {value:.2f}, target {threshold:.2f}",
    "vi_diverged": "the VI loss diverged at step {value:.0f}",
    "vi_not_converged": "the VI run reached its cap of {value:.0f} steps before its loss converged",
    "vi_above_minimum": "the final VI loss is {value:.3g} above its running minimum (> {threshold:.3g})",
    "vi_not_flat": (
        "the VI loss still fell by {value:.1%} of its whole fall over the last 10% of steps "
        "(> {threshold:.0%})"
    ),
    "ensemble_above_minimum": "member losses ended up to {value:.3g} above their running minimum "
    "(> {threshold:.3g})",
    "ensemble_not_flat": "member losses still fell by up to {value:.1%} of their whole fall "
    "over the last 10% of steps (> {threshold:.0%})",
    "map_above_minimum": "the training loss ended {value:.3g} above its running minimum "
    "(> {threshold:.3g})",
    "map_not_flat": "the training loss still fell by {value:.1%} of its whole fall over the last "
    "10% of steps (> {threshold:.0%})",
    "psis_khat": "Pareto k̂ {value:.2f} > {threshold:.2f}",
    "cavi_not_converged": "CAVI's ELBO still changed by more than tol={threshold:.2g} after "
    "{value:.0f} sweeps",
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
        digits = visible_digits(self.value, self.threshold)
        text = label.replace(":.3g}", f":.{digits}g}}").format(
            value=self.value, threshold=self.threshold
        )
        if self.sites:
            shown = ", ".join(self.sites[:5])
            more = len(self.sites) - 5
            text += f" at {shown}" + (f" and {more} more" if more > 0 else "")
        return f"{text}: {self.advice}"

    def __str__(self) -> str:
        return self.message


def visible_digits(value: float, threshold: float, least: int = 3, most: int = 8) -> int:
    """The fewest significant digits (at least ``least``) that print ``value`` and
    ``threshold`` apart, so a finding never reads "R-hat 1.01 > 1.01".

    Example
    -------
    >>> visible_digits(1.014, 1.01), visible_digits(2.5, 1.01)
    (4, 3)
    """
    for digits in range(least, most + 1):
        if f"{value:.{digits}g}" != f"{threshold:.{digits}g}":
            return digits
    return most


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


# -- thresholds --------------------------------------------------------------------------------
#: R-hat above this flags a site (Vehtari et al. 2021, Section 4: 1.01).
RHAT_MAX = 1.01
#: Bulk and tail ESS below this many per chain flag a site (Vehtari et al. 2021: 100 per chain).
ESS_PER_CHAIN_MIN = 100
#: Coordinates of one site that R-hat and ESS are computed on; larger sites are checked on a
#: fixed random subset of this many (a network's weights: the check must cost less than the fit).
MAX_CHECKED_ELEMENTS = 256
#: Fraction of draws at the maximum tree depth above which NUTS is flagged.
TREE_DEPTH_FRACTION = 0.0
#: Mean acceptance further than this from ``target_accept`` is flagged.
ACCEPTANCE_GAP = 0.15
#: Pareto k̂ above this flags the guide (Vehtari et al. 2024, Section 3.2.4: 0.7).
KHAT_MAX = 0.7


def check_fit(post, log_weights=None) -> Diagnostics:
    """Every check that applies to ``post``'s method: MCMC (NUTS, HMC, SG-MCMC), VI or an
    ensemble.

    ``log_weights`` are log p(x, θ_s) - log q(θ_s) at draws from a VI guide, for Pareto k̂
    (:func:`ppl_bdl.inference.vi.psis.importance_log_weights`); None skips that check.

    Example
    -------
    >>> import numpy as np
    >>> from ppl_bdl.posterior.posterior import Posterior
    >>> rng = np.random.default_rng(0)
    >>> stuck = np.stack([rng.normal(0, 1, 400), rng.normal(5, 1, 400)])  # two chains apart
    >>> check_fit(Posterior(samples={"mu": stuck}, method="sgld")).kinds()
    ['rhat', 'ess_bulk']
    """
    if post.method == "vi" and np.ndim(post.losses) == 2:  # several fits: each checked
        return Diagnostics(vi_fits_findings(post.losses, post.settings, log_weights))
    if post.method == "vi":
        return Diagnostics(vi_findings(post.losses, post.settings, log_weights))
    if post.method == "cavi":
        return Diagnostics(cavi_findings(post.settings, log_weights))
    if post.method == "ensemble":
        return Diagnostics(ensemble_findings(post.losses, post.settings.get("members")))
    if post.method == "mc_dropout":  # one MAP fit's loss curve; its draws differ by masks only
        return Diagnostics(map_findings(post.losses))
    if post.method == "swag":  # independent draws from fitted Gaussians: no mixing to check
        return Diagnostics()
    findings = mcmc_findings(post)
    findings += sampler_findings(post.sample_stats, post.method, post.settings)
    return Diagnostics(findings)


def mcmc_findings(post) -> list[Finding]:
    """R-hat (two chains or more) and bulk/tail ESS per chain of every latent site."""
    import arviz as az

    names = [n for n in post.latent_names if n in post.samples]
    arrays = {}
    for name in names:
        draws = np.asarray(post.samples[name])
        if draws.ndim < 2 or not np.issubdtype(draws.dtype, np.floating):
            continue  # discrete draws (enumerated sites) are not checked for mixing
        flat = draws.reshape(draws.shape[:2] + (-1,))
        if flat.shape[-1] > MAX_CHECKED_ELEMENTS:
            pick = np.random.default_rng(0).choice(flat.shape[-1], MAX_CHECKED_ELEMENTS, False)
            flat = flat[..., np.sort(pick)]
        arrays[name] = flat
    chains = post.num_chains if post.samples else 0
    draws = post.num_draws if post.samples else 0
    if not arrays or draws < 4:
        return []
    dataset = az.convert_to_dataset({k: v for k, v in arrays.items()})
    findings = []
    with warnings.catch_warnings(), quiet_arviz():  # constant sites: NaN, a RuntimeWarning
        warnings.simplefilter("ignore")
        if chains >= 2:
            rhat = _worst(az.rhat(dataset), max)
            bad = {n: v for n, v in rhat.items() if v > RHAT_MAX}
            if bad:
                findings.append(
                    Finding(
                        "rhat",
                        _by_value(bad, reverse=True),
                        max(bad.values()),
                        RHAT_MAX,
                        "the chains disagree (not mixed, or stuck in different modes); run more "
                        f"warmup and samples, or reparameterise: {REPARAM_ADVICE}",
                    )
                )
        for kind in ("bulk", "tail"):
            ess = _worst(az.ess(dataset, method=kind), min)
            bad = {n: v / chains for n, v in ess.items() if v / chains < ESS_PER_CHAIN_MIN}
            if bad:
                findings.append(
                    Finding(
                        f"ess_{kind}",
                        _by_value(bad),
                        min(bad.values()),
                        ESS_PER_CHAIN_MIN,
                        "too few effective draws for reliable "
                        + ("means and sds" if kind == "bulk" else "intervals and tail quantiles")
                        + "; run more samples (or thin less), or raise the step size",
                    )
                )
    return findings


def sampler_findings(stats: dict, method: str, settings: dict) -> list[Finding]:
    """Divergences, saturated tree depth and acceptance of NUTS/HMC draws."""
    findings = []
    if "diverging" in stats:
        count = int(np.sum(stats["diverging"]))
        if count:
            findings.append(
                Finding(
                    "divergences",
                    (),
                    count,
                    0,
                    "the sampler met curvature it cannot follow, so the posterior may be biased; "
                    f"raise target_accept (e.g. 0.95) or non-centre: {REPARAM_ADVICE}",
                )
            )
    if method == "nuts" and "tree_depth" in stats:
        depth = int(settings.get("max_tree_depth", 10))
        share = float(np.mean(np.asarray(stats["tree_depth"]) >= depth))
        if share > TREE_DEPTH_FRACTION:
            findings.append(
                Finding(
                    "tree_depth",
                    (),
                    share,
                    TREE_DEPTH_FRACTION,
                    f"trajectories were cut at max_tree_depth={depth} (each such draw cost "
                    f"{2**depth - 1} gradient evaluations, and the chain explores slowly); for a "
                    "network use method='sghmc' or 'vi', otherwise raise max_tree_depth or "
                    f"reparameterise: {REPARAM_ADVICE}",
                )
            )
    # An ELBO-tuned HMC has no acceptance target: its step size maximises the objective.
    tuned = settings.get("adapt") == "elbo"
    if method in ("nuts", "hmc") and "acceptance_rate" in stats and not tuned:
        target = float(settings.get("target_accept", 0.8))
        mean = float(np.mean(stats["acceptance_rate"]))
        if abs(mean - target) > ACCEPTANCE_GAP:
            findings.append(
                Finding(
                    "acceptance",
                    (),
                    mean,
                    target,
                    "the step size did not adapt to the target; run a longer warmup"
                    + (", or set a smaller step_size" if mean < target else ""),
                )
            )
    return findings


def vi_findings(losses, settings: dict, log_weights=None) -> list[Finding]:
    """VI's checks: a run stopped on a diverging loss, a run to convergence that hit its cap
    (``settings["converged"]`` False), a loss that ended far above its running minimum or has
    not flattened, and the Pareto k̂ of the importance weights."""
    findings = []
    losses = np.asarray(losses if losses is not None else [], dtype=float)
    if settings.get("stop_reason") == "diverging":
        best = settings.get("best_step")
        findings.append(
            Finding(
                "vi_diverged",
                (),
                float(settings.get("stopped_at") or len(losses)),
                0,
                f"the run stopped there and returned the guide at step {best}, its best smoothed "
                "loss; lower lr, or set clip_norm",
            )
        )
    elif losses.size >= 50:
        findings += _loss_curve_findings(losses)
    if settings.get("num_steps", 0) is None and settings.get("converged") is False:
        findings.append(
            Finding(
                "vi_not_converged",
                (),
                float(settings.get("steps_run") or losses.size),
                0,
                "the guide is the one at its best loss so far, not a converged fit; pass a larger "
                "num_steps (e.g. twice as many, with schedule='plateau') or a larger lr, and look "
                "at post.losses",
            )
        )
    if log_weights is not None:
        khat = pareto_khat(log_weights)
        if khat > KHAT_MAX:
            findings.append(
                Finding(
                    "psis_khat",
                    (),
                    khat,
                    KHAT_MAX,
                    "the guide is far from the posterior where it matters (importance weights "
                    "p/q with a heavy tail): trust its means more than its tails; try a richer "
                    "guide (lowrank, flow) or MCMC",
                )
            )
    return findings


def vi_fits_findings(losses, settings: dict, log_weights=None) -> list[Finding]:
    """:func:`vi_findings` of each of several VI fits (``num_chains``; losses (fit, step), the
    run's per-fit settings as lists), each finding naming its fit."""
    findings = []
    for c, curve in enumerate(losses):
        own = {k: v[c] if isinstance(v, list) else v for k, v in settings.items()}
        weights = log_weights[c] if log_weights is not None else None
        findings += [replace(f, sites=(f"fit {c}",)) for f in vi_findings(curve, own, weights)]
    return findings


def cavi_findings(settings: dict, log_weights=None) -> list[Finding]:
    """CAVI's checks: the run reached ``num_steps`` before the ELBO's relative change fell below
    ``tol``, and the Pareto k̂ of the fitted q (as for VI). (Its ELBO never falls: a fall stops
    the fit with an error.)"""
    findings = []
    if settings.get("converged") is False:
        findings.append(
            Finding(
                "cavi_not_converged",
                (),
                float(settings.get("steps_run", 0)),
                float(settings.get("tol", 0.0)),
                "raise num_steps (or loosen tol)",
            )
        )
    if log_weights is not None and np.ptp(log_weights) <= 1e-9 * (1 + np.abs(log_weights).max()):
        log_weights = None  # equal weights: q is the posterior itself (a conjugate model)
    return findings + vi_findings(None, {}, log_weights)


def _loss_curve_findings(losses, kind: str = "vi") -> list[Finding]:
    """A loss curve's checks as findings of ``kind`` ("vi": a VI fit's; "map": a training
    run's)."""
    checks = _loss_curve_checks(losses)
    return [Finding(f"{kind}_{k}", (), *v, _CURVE_ADVICE[k]) for k, v in checks.items()]


def map_findings(losses) -> list[Finding]:
    """One MAP training run's checks (MC dropout): its loss curve, as VI's, read as training.

    Example
    -------
    >>> import numpy as np
    >>> [f.kind for f in map_findings(np.linspace(100.0, 0.0, 200))]
    ['map_not_flat']
    """
    curve = np.asarray(losses if losses is not None else (), dtype=float).reshape(-1)
    return _loss_curve_findings(curve, "map") if curve.size >= 50 else []


def ensemble_findings(losses, members=None) -> list[Finding]:
    """An ensemble's checks (:mod:`ppl_bdl.inference.ensemble`): each member's loss curve (as
    VI's), the members concerned named (``members``: the rows' member numbers, default 0, 1,
    ...; a fit of some ``chain_ids``); no R-hat or ESS (the members are independent optima, one
    draw each). A member whose loss turns non-finite stops the fit with an error instead.

    Example
    -------
    >>> import numpy as np
    >>> flat, falling = np.full(200, 5.0), np.linspace(100.0, 0.0, 200)
    >>> [f.sites for f in ensemble_findings(np.stack([flat, falling]), members=[3, 4])]
    [('member 4',)]
    """
    losses = np.asarray(losses if losses is not None else np.zeros((0, 0)), dtype=float)
    curves, failed = (losses.reshape(-1, losses.shape[-1]) if losses.size else []), {}
    members = range(len(curves)) if members is None else members
    for member, curve in zip(members, curves, strict=True):
        if curve.size >= 50:
            for kind, value in _loss_curve_checks(curve).items():
                failed.setdefault(kind, {})[f"member {member}"] = value
    findings = []
    for kind, members in failed.items():
        worst = max(members, key=lambda k: members[k][0])
        findings.append(
            Finding(f"ensemble_{kind}", tuple(members), *members[worst], _CURVE_ADVICE[kind])
        )
    return findings


def pareto_khat(log_weights) -> float:
    """Pareto k̂ of importance weights given as logs, by PSIS as ArviZ computes it.

    Example
    -------
    >>> import numpy as np
    >>> round(pareto_khat(np.random.default_rng(0).normal(size=1000) * 0.1), 1) < 0.5
    True
    """
    import arviz as az

    log_weights = np.asarray(log_weights, dtype=float).reshape(-1)
    if not np.all(np.isfinite(log_weights)):
        return float("inf")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if hasattr(az, "psislw"):  # ArviZ 0.x
            _, khat = az.psislw(log_weights - log_weights.max())
        else:  # ArviZ 1.x: the array functions of arviz-stats
            from arviz_stats.base import array_stats

            _, khat = array_stats.psislw(log_weights - log_weights.max())
    return float(np.asarray(khat))


def _worst(dataset, pick) -> dict[str, float]:
    """Per variable, the worst value over its elements (NaN elements, constant sites, skipped)."""
    out = {}
    for name, values in dataset.data_vars.items():
        finite = np.asarray(values.values, dtype=float)
        finite = finite[np.isfinite(finite)]
        if finite.size:
            out[str(name)] = float(pick(finite))
    return out


def _by_value(values: dict[str, float], reverse: bool = False) -> tuple[str, ...]:
    """Site names, the worst first."""
    return tuple(sorted(values, key=values.get, reverse=reverse))
