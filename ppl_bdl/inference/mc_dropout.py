"""MC dropout: ``fit(bound, method="mc_dropout")`` (Gal & Ghahramani, *Dropout as a Bayesian
Approximation: Representing Model Uncertainty in Deep Learning*, ICML 2016).

**Training.** One MAP fit of the model with its :class:`~ppl_bdl.dsl.nn.Dropout` layers on: the
optimizer minimises the model's potential U(θ) = −log p(θ, D) − log|J| (the likelihood
minibatched and scaled by N/B, as an ensemble's member does, :mod:`ppl_bdl.inference.ensemble`),
each step's network run with fresh masks, one per point of the minibatch and unit (inverted
dropout: a unit kept with probability 1 − p is scaled by 1/(1 − p)). The masks' noise is
drawn from the step's key (``fold_in`` per layer), so a run is reproducible from its seed; it is
drawn outside the traced gradient and handed to it (the same pure potential on both
backends).

**The weight decay is the prior.** Their dropout objective, Eq. (1), is
L = (1/N) Σ_i E(y_i, ŷ_i) + λ Σ_l (‖W_l‖² + ‖b_l‖²). They derive its L2 term from a Gaussian
prior N(0, l⁻² I) on the weights: with the Bernoulli approximating distribution W = M·diag(z),
z ~ Bernoulli(keep), the KL term of the variational objective is approximately
Σ_l (keep·l²/2) ‖M_l‖² + (l²/2) ‖m_l‖² (Section 3), and dividing the objective by Nτ (τ the
likelihood's precision) gives Eq. (1) with λ = keep·l² / (2Nτ). Here the L2 term is the model's
own −log p(θ): nothing is added. A Normal(0, s²) prior on a weight contributes ‖θ‖²/(2s²) to
U, and U/N is Eq. (1) up to the factor τ; in the inverted parametrisation used here
(θ = keep·M) that is their prior with l² = keep/s² on a matrix whose inputs are dropped, and
l² = 1/s² on the others (biases, a first layer whose inputs are kept). To strengthen or weaken
the decay, change the prior's scale. With p = 0 the fit is exactly the MAP of the model without
dropout.

**The posterior.** ``num_samples`` draws, each a pair (the MAP weights, a mask seed): the
weights are in ``post.samples`` (the same at every draw) and the seeds in
``post.sample_stats["dropout_seed"]`` (shape (1, num_samples)). Every replay of a draw (its
deterministic sites, the pointwise log-likelihood for LOO/WAIC, ``post.predict``,
``post.evaluate``, ``post.to_arviz(posterior_predictive=True)``) runs the Dropout layers with the
masks of its seed: one mask per layer shared by every point, so a draw is one network
W·diag(z), a draw from their q(ω), and the predictive mean over draws is their MC dropout
estimate (1/T) Σ_t ŷ(x*, W^t) (Section 4). The uncertainty split reads the draws like any
posterior's (aleatoric: the likelihood's own variance or entropy; epistemic: the spread over
masks). A saved posterior keeps the seeds, so a loaded one predicts the same.

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import dist, nn
>>> X, y = np.linspace(-2, 2, 40)[:, None], np.sin(np.linspace(-2, 2, 40))
>>> net = nn.MLP("net", [1, 16, 16, 1], activation="tanh", p=0.1)
>>> @bdl.model
... def m(X, y=None):
...     f = net.sample()
...     with bdl.plate("data", X.shape[0]) as idx:
...         bdl.sample("y", dist.Normal(f(X[idx])[..., 0], 0.1),
...                    obs=None if y is None else y[idx])
>>> post = bdl.fit(m(X, y), backend="pyro", method="mc_dropout", num_steps=100, lr=0.01,
...                num_samples=20, progress=False)
>>> post.samples["net.0.weight"].shape, post.sample_stats["dropout_seed"].shape
((1, 20, 1, 16), (1, 20))
>>> pred = post.predict(m(X))
>>> bool((pred.epistemic > 0).all())   # the masks' spread
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ppl_bdl.backend_protocol import Batch, Transition
from ppl_bdl.backends import get as get_backend
from ppl_bdl.dsl.nn.dropout import DROPOUT_SEED, ActiveDropout
from ppl_bdl.errors import ConfigError, InferenceError, RunInterrupted
from ppl_bdl.inference.ensemble import EnsembleConfig, MAPTraining, run_map_steps
from ppl_bdl.inference.method import (
    check_int,
    check_params,
    option,
)
from ppl_bdl.inference.posterior_from_draws import build_posterior
from ppl_bdl.inference.setup import Setup, minibatch_plate
from ppl_bdl.inference.starts import initial_positions
from ppl_bdl.trace.interpreter import Evaluator
from ppl_bdl.trace.layout import ModelDensity

#: Mixed into the fit's seed for the draws' mask seeds (apart from the training masks' keys).
_SEED_STREAM = 0x6D63


@dataclass(frozen=True)
class DropoutSites:
    """The Dropout layers a model's run goes through: ``calls`` (path, p) in order, and the
    shapes of the noise of those with p > 0 at the training step's input shapes."""

    calls: list[tuple[str, float]]
    shapes: list[tuple[int, ...]]


def find_dropout(setup: Setup, density: ModelDensity, plate: tuple[str, int] | None, batch_size):
    """The model's Dropout layers, read off one run of its potential at the step's shapes (a
    minibatch of ``batch_size`` points, or the full data); a ConfigError naming what to add
    when there is none."""
    backend = setup.backend
    with backend.scope(), backend.activate():
        indices = None
        if plate:
            indices = {plate[0]: backend.asarray(np.zeros(batch_size), dtype="int")}
        active = ActiveDropout(backend, key=backend.random.key(0))
        flat = backend.asarray(np.zeros(setup.layout.dim))
        density.potential(flat, density.data, indices, dropout=active)
    if not active.calls:
        raise ConfigError(
            f"method='mc_dropout': model {setup.bound.name!r} has no Dropout layer, so there is "
            "nothing to drop and the fit would be a plain MAP. Add dropout to its network: "
            "p=... on nn.MLP (nn.MLP('net', [8, 50, 1], p=0.1)) or an nn.Dropout(p) layer in "
            "an nn.Sequential (before the Dense layers whose inputs it drops)."
        )
    return DropoutSites(active.calls, active.shapes)


def mc_dropout_transition(
    setup: Setup, config: EnsembleConfig, plate: tuple[str, int] | None
) -> tuple[Transition, list, DropoutSites]:
    """The training transition, the data's arrays its steps read, and the model's Dropout
    layers. ``init``: the optimizer's state at the position; ``step``: fresh noise for every
    Dropout layer from the step's key, the potential's value and gradient with them on the
    minibatch, the optimizer's update at the step's rate (skipped where not finite); info
    ``loss`` and ``grad_norm``; ``emit``: the position."""
    backend, dim = setup.backend, setup.layout.dim
    density = ModelDensity(setup.bound, backend, setup.layout, setup.params)
    sites = find_dropout(setup, density, plate, config.batch_size)
    plate_name = plate[0] if plate else None
    optimizer = backend.optimizer(config.optimizer)
    m, random = backend.math, backend.random

    def potential_and_grad(position, batch: Batch, noise):
        indices = None if batch.indices is None else {plate_name: batch.indices}

        def potential(flat):
            active = ActiveDropout(backend, noise=noise)
            return density.potential(flat, batch.data, indices, dropout=active)

        return backend.value_and_grad(potential)(position)

    with backend.scope(), backend.activate():
        example_idx = backend.asarray(np.zeros(config.batch_size), dtype="int") if plate else None
        example_z = tuple(backend.asarray(np.zeros(s)) for s in sites.shapes)
        example = (backend.asarray(np.zeros(dim)), Batch(density.data, example_idx), example_z)
        potential_and_grad = backend.trace(potential_and_grad, example)

    def init(key, position, data):
        params = {"theta": position}
        return {"params": params, "optimizer": optimizer.init(params)}

    def step(key, state, batch, rate):
        noise = tuple(
            random.normal(random.fold_in(key, i), shape) for i, shape in enumerate(sites.shapes)
        )
        loss, grad = potential_and_grad(state["params"]["theta"], batch, noise)
        grad_norm = m.sqrt(m.sum(grad * grad))
        ok = m.isfinite(loss) & m.isfinite(grad_norm)
        params, opt_state = optimizer.update(
            {"theta": grad}, state["optimizer"], state["params"], ok, rate
        )
        return {"params": params, "optimizer": opt_state}, {"loss": loss, "grad_norm": grad_norm}

    def emit(state):
        return state["params"]["theta"]

    return Transition(init, step, emit), density.data, sites


def mask_seeds(seed: int, num_samples: int) -> np.ndarray:
    """The draws' mask seeds, (1, num_samples) integers in [0, 2³¹): from the fit's seed only.

    Example
    -------
    >>> mask_seeds(0, 3).shape
    (1, 3)
    """
    state = np.random.SeedSequence([seed, _SEED_STREAM]).generate_state(num_samples, np.uint32)
    return (state >> np.uint32(1)).astype(np.int64)[None]


def dropout_masks(post, bound, draw: int = 0) -> dict[str, np.ndarray]:
    """The masks of draw ``draw`` of an MC dropout posterior at the inputs of ``bound``: Dropout
    layer path -> its mask (0 or 1/(1 − p), one per unit, shared by the points), as
    ``post.predict`` and the log-likelihood apply them.

    Example
    -------
    >>> import numpy as np, ppl_bdl as bdl
    >>> from ppl_bdl import dist, nn
    >>> from ppl_bdl.inference.mc_dropout import dropout_masks
    >>> net = nn.MLP("net", [1, 8, 1], p=0.2)
    >>> @bdl.model
    ... def m(X, y=None):
    ...     f = net.sample()
    ...     with bdl.plate("data", X.shape[0]) as idx:
    ...         bdl.sample("y", dist.Normal(f(X[idx])[..., 0], 0.1),
    ...                    obs=None if y is None else y[idx])
    >>> X, y = np.linspace(-1, 1, 10)[:, None], np.linspace(-1, 1, 10)
    >>> post = bdl.fit(m(X, y), backend="pyro", method="mc_dropout", num_steps=20,
    ...                num_samples=5, progress=False)
    >>> masks = dropout_masks(post, m(X), draw=3)
    >>> list(masks), masks["net[2]"].shape   # one mask per unit: 0, or kept and scaled by 1/0.8
    (['net[2]'], (8,))
    >>> sorted(set(np.round(masks["net[2]"], 4).tolist())) in ([0.0, 1.25], [1.25], [0.0])
    True
    """
    seeds = post.sample_stats.get(DROPOUT_SEED)
    if seeds is None:
        raise ConfigError(
            f"dropout_masks needs a posterior of method='mc_dropout' (its draws carry mask "
            f"seeds); this one is of method {post.method!r}."
        )
    backend = get_backend(post.backend, precision=post.precision)
    values = {
        n: np.asarray(post.samples[n]).reshape((-1,) + post.samples[n].shape[2:])[draw]
        for n in post.latent_names
    }
    with backend.scope(), backend.activate():
        evaluator = Evaluator(
            backend,
            values={n: backend.asarray(v) for n, v in values.items()},
            params={n: backend.asarray(v) for n, v in post.params.items()},
            key=backend.random.key(0),
            predictive=True,
            missing="prior",
        )
        seed = int(np.asarray(seeds).reshape(-1)[draw])
        active = ActiveDropout.from_seed(backend, seed, record=True)
        bound.run_with(evaluator, handlers=(active,))
        return {path: backend.to_numpy(mask) for path, mask in active.masks.items()}


def run_mc_dropout(
    setup: Setup,
    config: EnsembleConfig,
    num_samples: int,
    *,
    seed: int,
    init: Any = None,
    progress: bool = False,
    log_likelihood: bool = True,
):
    """Train with dropout on and return the posterior of ``num_samples`` (weights, mask seed)
    draws, with ``post.losses`` (every step's loss) and ``post.settings["dropout"]`` (the
    layers' paths and rates)."""
    plate = minibatch_plate(setup, config.batch_size)
    transition, data, sites = mc_dropout_transition(setup, config, plate)
    setup.settings["dropout"] = [[path, p] for path, p in sites.calls]
    positions = initial_positions(setup, init, 1, seed)
    run = run_map_steps(
        setup,
        transition,
        data,
        positions,
        config,
        plate,
        seed=seed,
        kind="mc_dropout",
        progress=progress,
        chain_ids=[0],
    )
    if run.failure is not None:
        _raise_failure(run)
    theta = np.asarray(run.draws)[:, -1:]  # (1, 1, dim): the weights after the last step
    return build_posterior(
        setup,
        np.repeat(theta, num_samples, axis=1),
        {},
        "mc_dropout",
        log_likelihood=log_likelihood,
        dropout_seeds=mask_seeds(seed, num_samples),
        losses=run.step_infos["loss"][0].astype(float),
    )


def _raise_failure(run) -> None:
    failure = run.failure
    if failure.reason == "interrupted":
        raise RunInterrupted(f"the MC dropout fit was interrupted at step {failure.step}.")
    raise InferenceError(
        f"MC dropout: the loss or its gradient is not finite (NaN or inf) at step "
        f"{failure.step}. Try a smaller lr, clip_norm=..., or check the model's priors and data."
    )


# -- the method ------------------------------------------------------------------------------
@dataclass(frozen=True)
class MCDropout(MAPTraining):
    """MC dropout (Gal & Ghahramani 2016): one MAP fit with the model's Dropout layers on, then
    ``num_samples`` draws, each the fitted weights with its own dropout masks.

    Example
    -------
    >>> import ppl_bdl as bdl
    >>> bdl.MCDropout(num_samples=50, lr=0.005).num_samples
    50
    """

    num_samples: int = option(100, "draws: the fitted weights, each with its own dropout masks")
    num_steps: int = option(2000, "optimizer steps (each with fresh dropout masks)")

    method_name: ClassVar[str] = "mc_dropout"
    hints: ClassVar[dict[str, str]] = {
        "p": "the dropout rate is the model's: nn.Dropout(p) or nn.MLP(..., p=...)",
        "num_chains": "MC dropout is one fit; its draws are dropout masks (num_samples)",
        "num_warmup": "MC dropout runs num_steps optimizer steps (no warmup)",
        "num_members": "MC dropout is one fit; its draws are dropout masks (num_samples)",
    }

    def __post_init__(self) -> None:
        check_int(self, "num_samples")
        super().__post_init__()

    def config(self) -> EnsembleConfig:
        """The training run's settings (those of a one-member ensemble)."""
        return self.training_config()

    def settings(self) -> dict:
        return {**self.given(), "num_samples": self.num_samples, "num_steps": self.num_steps}

    def run(self, setup, *, seed: int, progress: bool, log_likelihood: bool, chain_ids):
        check_params(setup, self.name, self.hold_params)
        if setup.layout.discrete:
            raise ConfigError(
                f"method='mc_dropout' fits continuous weights by gradient steps; model "
                f"{setup.bound.name!r} has discrete latent sites {setup.layout.discrete}. Use "
                "method='nuts' or 'vi', which sum them out."
            )
        return run_mc_dropout(
            setup,
            self.config(),
            self.num_samples,
            seed=seed,
            init=self.init,
            progress=progress,
            log_likelihood=log_likelihood,
        )
