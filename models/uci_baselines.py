"""The post-hoc baselines on the UCI harness (:mod:`ppl_bdl.models.uci`): MAP, MC dropout, the
Laplace approximation (last layer, full; all weights, KFAC) and SWAG, as option builders for
:func:`~ppl_bdl.models.uci.run_uci`.

Every baseline trains the deep-ensemble protocol's network (one hidden layer of the set's ReLU
units, N(0, 1) weights: :func:`~ppl_bdl.models.uci.uci_model`) for the set's epochs (40; protein
20) of ⌊N/B⌋ minibatches of B = 16 with Adam at lr 0.01, the budget of one ensemble member
(:func:`~ppl_bdl.models.uci.deep_ensemble_options`):

- ``"map"``: one network with a mean and a scale output (heteroscedastic), a one-member ensemble;
- ``"map_halfnormal"``: the same with one learned noise scale σ ~ HalfNormal(1), the Laplace
  fits' network and so their MAP;
- ``"mc_dropout"``: the heteroscedastic run with Dropout of rate ``p`` (0.05, Gal & Ghahramani
  2016) on the inputs and the hidden units, ``num_samples`` masks at prediction;
- ``"laplace_ll"``: the ``map_halfnormal`` run, then the Laplace approximation of the last
  layer with its full GGN precision, scored by the linearised ("GLM") predictive (Daxberger et
  al. 2021);
- ``"laplace_kron"``: the same with a KFAC precision over every weight (Ritter, Botev & Barber
  2018), GLM predictive;
- ``"swag"``: the heteroscedastic run, its iterates collected once an epoch over the last
  ``swag_epochs`` epochs into a rank-20 SWAG Gaussian (Maddox et al. 2019);
- ``"sghmc"``: the network with one learned noise scale sampled by SGHMC (Chen et al. 2014) at
  its defaults (the step size from its pilot run) for the same number of minibatch steps: the
  first half warmup, ``num_samples`` draws thinned from the second half. (With the scale output
  the pilot's step let chains diverge: boston split 3's predictions reached 10⁷, wine's chain a
  NaN.)

Two choices differ from the papers. The Laplace fits use one noise scale: the GGN linearises a
Normal likelihood's mean only, so a scale output of the network keeps its exact, indefinite
curvature in the full GGN (boston, split 0: 5 negative eigenvalues of the last layer's
precision), and KFAC, whose factors see the mean only, leaves the scale output's weights at
their prior (test log-likelihood −3.02 against the MAP's −2.37). SWAG runs the MAP's Adam
rather than momentum SGD: SGD from the start for the same 40 epochs diverged at lr 0.05/N and at
0.01/N and 0.002/N ended short of the MAP (yacht, split 0: SWAG test RMSE 1.73 and 2.60 against
the MAP's 1.28).

Example
-------
>>> from ppl_bdl.models import uci, uci_baselines
>>> options = uci_baselines.baseline_options("swag")
>>> split = uci.UCISplit("yacht", 0, None, [0.0] * 277, None, None, 0.0, 1.0)
>>> settings = options(split, uci.Protocol("yacht", 20, 50, 40))
>>> settings["num_steps"], settings["swa_start"], settings["collect_every"]   # 17 steps an epoch
(680, 340, 17)
>>> uci_baselines.baseline_options("laplace_kron").pred_type
'glm'

A run (benchmarks/uci_baselines.py prints the table)::

    options = uci_baselines.baseline_options("laplace_ll")
    result = uci.run_uci("yacht", options, splits=range(5), backend="numpyro",
                         model=options.model(uci.protocol("yacht")))
"""

from __future__ import annotations

from dataclasses import dataclass

from ppl_bdl.errors import ConfigError
from ppl_bdl.models.uci import Protocol, UCISplit, uci_model

#: The baselines by name, in the order the benchmark prints them.
BASELINES = ("map", "map_halfnormal", "mc_dropout", "laplace_ll", "laplace_kron", "swag", "sghmc")
#: The Laplace fits' settings by baseline.
LAPLACE = {
    "laplace_ll": dict(subset="last_layer", hessian="full"),
    "laplace_kron": dict(subset="all", hessian="kron"),
}


@dataclass(frozen=True)
class BaselineOptions:
    """A baseline's ``bdl.fit`` arguments for a split (call it with the split and the set's
    :class:`~ppl_bdl.models.uci.Protocol`): ``epochs`` (None: the set's) of ⌊N/B⌋ steps at
    batch size ``batch_size``, Adam at ``lr``; SWAG collects once an epoch over the last
    ``swag_epochs`` into ``rank`` deviations. ``p``: MC dropout's rate; ``num_samples``: the
    predictive's draws (masks, or draws of the Gaussian); ``noise``: the network's noise model
    (None: "halfnormal" for the Laplace fits, ``map_halfnormal`` and ``sghmc``, else
    "heteroscedastic").
    ``pred_type``: what :func:`~ppl_bdl.models.uci.run_uci` scores ("glm" for Laplace)."""

    method: str
    epochs: int | None = None
    batch_size: int = 16
    lr: float = 0.01
    p: float = 0.05
    swag_epochs: int = 20
    rank: int = 20
    num_samples: int = 200
    noise: str | None = None

    def __post_init__(self) -> None:
        if self.method not in BASELINES:
            raise ConfigError(f"unknown baseline {self.method!r}; known: {list(BASELINES)}.")

    @property
    def pred_type(self) -> str:
        return "glm" if self.method in LAPLACE else "nn"

    def model(self, proto: Protocol):
        """The set's network for this baseline (MC dropout's with its Dropout layers)."""
        p = self.p if self.method == "mc_dropout" else None
        one_scale = self.method in LAPLACE or self.method in ("map_halfnormal", "sghmc")
        noise = self.noise or ("halfnormal" if one_scale else "heteroscedastic")
        return uci_model(proto.num_hidden, noise, p=p)

    def __call__(self, data: UCISplit, proto: Protocol) -> dict:
        n = len(data.y_train)
        batch = min(self.batch_size, n)
        per_epoch = n // batch
        epochs = self.epochs or proto.num_epochs
        common = dict(batch_size=batch, num_steps=epochs * per_epoch)
        collected = min(self.swag_epochs, epochs)  # SWAG's iterates, one an epoch
        if self.method in ("map", "map_halfnormal"):
            return dict(method="ensemble", num_members=1, lr=self.lr, **common)
        if self.method == "mc_dropout":
            return dict(method="mc_dropout", lr=self.lr, num_samples=self.num_samples, **common)
        if self.method == "sghmc":
            kept = min(self.num_samples, common["num_steps"] // 2)
            return dict(
                method="sghmc",
                batch_size=batch,
                num_warmup=common["num_steps"] // 2,
                num_samples=kept,
                thinning=max(1, common["num_steps"] // 2 // kept),
                num_chains=1,
            )
        if self.method in LAPLACE:
            laplace = LAPLACE[self.method]
            return dict(
                method="laplace", lr=self.lr, num_samples=self.num_samples, **laplace, **common
            )
        return dict(
            method="swag",
            optimizer="adam",
            lr=self.lr,
            swa_start=(epochs - collected) * per_epoch,
            collect_every=per_epoch,
            rank=min(self.rank, collected),
            num_samples=self.num_samples,
            **common,
        )

    @property
    def label(self) -> str:
        epochs = self.epochs or "the set's"
        return f"{self.method} (B={self.batch_size}, {epochs} epochs)"


def baseline_options(method: str, **settings) -> BaselineOptions:
    """The options of baseline ``method`` (one of :data:`BASELINES`): see
    :class:`BaselineOptions` (and the module's example)."""
    return BaselineOptions(method, **settings)
