"""The Laplace approximation: ``fit(bound, method="laplace")``, ``bdl.Laplace(...)``.

The posterior is approximated by a Gaussian at the MAP θ* whose precision is the curvature
of the potential U(θ) = −log p(θ, D) − log|J| there (MacKay 1992; Daxberger et al. 2021,
"Laplace Redux", Eq. 3): N(θ*, P⁻¹) in the unconstrained space, P = ∇²U(θ*) or its generalised
Gauss-Newton (:mod:`ppl_bdl.inference.laplace.curvature`), mapped to each site's support
through its bijection. The prior is the model's own.

1. The MAP: the backend's optimizer on U, as one member of a deep ensemble
   (:mod:`ppl_bdl.inference.laplace.mode`), or ``init`` as it is with ``num_steps=0``.
2. The curvature over the Gaussian coordinates (``subset="all"``, or ``"last_layer"``: the
   last ``nn`` layer's weight and bias, every other latent held at θ*): ``hessian="full"``
   (the matrix) or ``"diag"`` (its diagonal), ``curvature="ggn"`` or ``"hessian"``.
3. A precision that is not positive definite is refused, saying how; ``damping`` adds a
   constant to the diagonal. ``prior_precision="marglik"`` rescales the precision of the
   Normal priors by maximising the Laplace evidence (:mod:`ppl_bdl.inference.laplace.marglik`).
4. ``num_samples`` draws of the Gaussian, mapped to the sites' supports: a Posterior like any
   other (ArviZ export, predict, save); ``post.guide`` is the
   :class:`~ppl_bdl.inference.laplace.approximation.LaplaceApproximation`, which
   ``post.predict(..., pred_type="glm")`` reads.

The default ``curvature="ggn"`` (Jᵀ Λ J plus the priors' Hessian; Immer, Korzepa & Bauer 2021)
is positive semi-definite for the supported likelihoods wherever θ* lands, so a MAP that an
optimizer left short of a stationary point (a network's, always) still gives a valid Gaussian,
and it is the curvature of the linearised model that the ``"glm"`` predictive uses (Immer et
al. 2021, Sec. 3); the exact Hessian (``"hessian"``) can be indefinite there. For a model whose
outputs are linear in θ (a linear-Gaussian regression) the two are equal. Only the outputs
are linearised: a likelihood's other parameter that the network also outputs (the scale of a
heteroscedastic head) keeps its exact curvature, which can be indefinite, and ``"kron"``
refuses such a model (its factors would leave the weights that move the scale at their prior).

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import dist
>>> @bdl.model
... def m(y):
...     mu = bdl.sample("mu", dist.Normal(0.0, 1.0))
...     with bdl.plate("data", y.shape[0]) as idx:
...         bdl.sample("y", dist.Normal(mu, 1.0), obs=y[idx])
>>> post = bdl.fit(m(np.ones(3)), backend="numpyro", method="laplace", lr=0.1,
...                num_steps=300, progress=False)
>>> round(float(post.guide.mode[0]), 3), post.guide.precision.tolist()   # 3/4 and 1 + 3
(0.75, [[4.0]])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ppl_bdl.errors import ConfigError, ModelError
from ppl_bdl.inference.ensemble import EnsembleConfig, MAPTraining
from ppl_bdl.inference.laplace.approximation import LaplaceApproximation, checked_precision
from ppl_bdl.inference.laplace.curvature import curvature
from ppl_bdl.inference.laplace.kron import fit_kron
from ppl_bdl.inference.laplace.marglik import rescale_kron_prior, rescale_prior
from ppl_bdl.inference.laplace.mode import find_mode
from ppl_bdl.inference.method import (
    check_choice,
    check_int,
    check_number,
    check_params,
    option,
)
from ppl_bdl.inference.posterior_from_draws import build_posterior

#: The most Gaussian coordinates ``hessian="full"`` takes: the (k, k) matrix (134 MB in float64
#: at k = 4096) is built on the backend and checked (its eigenvalues) and factorised on the host.
#: Measured on a 1-h-1 BNN (NumPyro, 2 shared CPU cores): k = 1000, the GGN in 2.4 s and the
#: host's linear algebra in 7 s; k = 3001, 9.5 s and 48 s; k = 4096, 16 s and 80 s, growing as
#: k³. Beyond it ``hessian="diag"`` (k = 4096: 11 s) or ``subset="last_layer"``.
FULL_LIMIT = 4096


@dataclass(frozen=True)
class Laplace(MAPTraining):
    """The Laplace approximation (MacKay 1992; Daxberger et al. 2021): a Gaussian at the MAP
    whose precision is the potential's Hessian or generalised Gauss-Newton.

    Example
    -------
    >>> import ppl_bdl as bdl
    >>> bdl.Laplace(hessian="diag", subset="last_layer").curvature
    'ggn'
    """

    num_samples: int = option(1000, "draws of the Gaussian")
    num_steps: int = option(2000, "optimizer steps to the MAP (0: init is the MAP)")
    hessian: str = option(
        "full", "'full' (the matrix), 'diag' (its diagonal) or 'kron' (KFAC of nn.Dense layers)"
    )
    curvature: str = option("ggn", "'ggn' (generalised Gauss-Newton) or 'hessian' (exact)")
    subset: str = option("all", "'all' latents, or 'last_layer' (the last nn layer's weights)")
    ggn_samples: int | None = option(
        None,
        "None: the exact GGN of the nn layers; k: its Monte Carlo estimate from k draws per "
        "data point (K-FAC's sampled Fisher), for hessian='kron' or 'diag'",
    )
    damping: float | None = option(None, "added to the precision's diagonal (None: nothing)")
    prior_precision: str | None = option(
        None, "None: the model's prior; 'marglik': rescale Normal priors' precision"
    )
    batch_size: int | None = option(None, "minibatch of the MAP steps and of the curvature")
    init: Any = option(None, "the start (or with num_steps=0 the MAP): a Posterior or a dict")

    min_steps: ClassVar[int] = 0
    method_name: ClassVar[str] = "laplace"
    hints: ClassVar[dict[str, str]] = {
        "num_chains": "a Laplace fit is one Gaussian: its draws are one chain",
        "num_warmup": "the MAP is found in num_steps optimizer steps (no warmup)",
        "num_members": "a Laplace fit has one MAP (method='ensemble' fits several)",
    }

    def __post_init__(self) -> None:
        check_int(self, "num_samples")
        check_choice(self, "hessian", ("full", "diag", "kron"))
        check_choice(self, "curvature", ("ggn", "hessian"))
        check_choice(self, "subset", ("all", "last_layer"))
        check_number(self, "damping", 0.0, optional=True)
        check_int(self, "ggn_samples", optional=True)
        if self.ggn_samples is not None and (self.hessian == "full" or self.curvature != "ggn"):
            raise ConfigError(
                f"ggn_samples={self.ggn_samples} estimates the nn layers' GGN blocks of "
                f"hessian='kron' or 'diag' with curvature='ggn'; got hessian={self.hessian!r}, "
                f"curvature={self.curvature!r}. Use hessian='kron' or 'diag', or leave "
                "ggn_samples out (the exact curvature)."
            )
        check_choice(self, "prior_precision", ("marglik",), optional=True)
        if self.hessian == "kron" and self.curvature != "ggn":
            raise ConfigError(
                f"hessian='kron' factors the generalised Gauss-Newton of the nn layers; got "
                f"curvature={self.curvature!r}. Use curvature='ggn' with 'kron', or "
                "hessian='full' or 'diag' for the exact Hessian."
            )
        super().__post_init__()

    def config(self) -> EnsembleConfig | None:
        """The MAP run's settings (one ensemble member); None for ``num_steps=0``."""
        return None if self.num_steps == 0 else self.training_config()

    def run(self, setup, *, seed: int, progress: bool, log_likelihood: bool, chain_ids):
        check_params(setup, self.name, self.hold_params)
        index, sites = gaussian_coordinates(setup, self.subset, self.hessian)
        mode, losses = find_mode(setup, self.config(), self.init, seed, progress)
        settings = {"sites": list(sites), "latent": list(setup.layout.names)}
        if self.hessian == "kron":
            approx = fit_kron(
                setup,
                mode,
                index,
                sites,
                self.batch_size,
                self.damping,
                seed,
                self.num_samples,
                settings,
                self.ggn_samples,
            )
            if self.prior_precision == "marglik":
                scale = rescale_kron_prior(setup, approx, self.damping)
                settings["prior_precision_scale"] = scale
            return self._posterior(setup, approx, sites, settings, log_likelihood, losses)
        matrix = curvature(
            setup,
            mode,
            self.hessian,
            self.curvature,
            index,
            self.batch_size,
            estimate=(self.ggn_samples, seed),
        )
        if self.prior_precision == "marglik":
            matrix, settings["prior_precision_scale"] = rescale_prior(
                setup, mode, matrix, self.hessian, index
            )
        precision = checked_precision(matrix, self.hessian, self.damping, self.curvature)
        approx = LaplaceApproximation(
            mode, index, precision, self.hessian, sites, settings, seed, self.num_samples
        )
        return self._posterior(setup, approx, sites, settings, log_likelihood, losses)

    def _posterior(self, setup, approx, sites, settings, log_likelihood, losses):
        setup.settings["laplace_sites"] = list(sites)  # saved with the posterior
        if "prior_precision_scale" in settings:
            setup.settings["prior_precision_scale"] = settings["prior_precision_scale"]
        return build_posterior(
            setup,
            approx.fit_draws()[None],
            {},
            self.name,
            log_likelihood=log_likelihood,
            guide=approx,
            losses=losses,
        )


def gaussian_coordinates(setup, subset: str, hessian: str) -> tuple[np.ndarray, tuple[str, ...]]:
    """The flat coordinates the Gaussian covers, and their sites; the model's and the size's
    checks."""
    layout = setup.layout
    if layout.discrete:
        raise ModelError(
            f"method='laplace' puts a Gaussian on continuous latents; model "
            f"{setup.bound.name!r} has discrete latent site(s) {layout.discrete}. Observe them, "
            "make them continuous, or fit with method='nuts' or 'vi' (which sum them out)."
        )
    sites = tuple(layout.names) if subset == "all" else last_layer(setup)
    slots = [s for s in layout.slots if s.name in sites]
    index = np.concatenate([np.arange(s.offset, s.offset + s.size) for s in slots])
    if hessian == "full" and len(index) > FULL_LIMIT:
        raise ConfigError(
            f"method='laplace' with hessian='full' over {len(index)} weights (subset="
            f"{subset!r}) would build a {len(index)} x {len(index)} precision; the limit is "
            f"{FULL_LIMIT}. Use hessian='diag' or subset='last_layer'."
        )
    return index, sites


def last_layer(setup) -> tuple[str, ...]:
    """The latent sites of the model's last ``nn`` layer: the last ``{path}.weight`` site in
    the order the model samples them, with the ``{path}.*`` sites beside it (its bias)."""
    names = setup.layout.names
    weights = [n for n in names if n.endswith(".weight")]
    if not weights:
        raise ConfigError(
            f"subset='last_layer' needs an nn layer (latent sites named '<path>.weight', as "
            f"nn.Dense and nn.MLP name theirs); model {setup.bound.name!r} has latent sites "
            f"{names}. Use subset='all'."
        )
    path = weights[-1][: -len(".weight")]
    return tuple(n for n in names if n.rsplit(".", 1)[0] == path)
