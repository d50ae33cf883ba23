"""Variational inference as a typed method object: ``bdl.VI(guide="flow", lr=1e-3)``.

Its fields are the run's options (the objective, the optimizer and its schedule, the steps, the
start) and the guide's own settings (``rank``, ``num_layers``, ...), checked at construction;
:func:`~ppl_bdl.inference.vi.runner.run_vi` runs it. A field left at None takes the default the
run picks for the guide and optimizer (the learning rate: 0.01, 0.003 for fullrank, 0.001 for
flow, 0.05 for vogn; the particles: 1, 8 for flow; the schedule: "plateau" when ``num_steps`` is
None, else "constant").

Example
-------
>>> import ppl_bdl as bdl
>>> bdl.VI(guide="lowrank", rank=5).run_options()["rank"]
5
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import Any, ClassVar

from ppl_bdl.errors import ConfigError
from ppl_bdl.inference.method import Method, check_choice, check_int, check_number, is_plain, option
from ppl_bdl.inference.vi import guides
from ppl_bdl.inference.vi.guides.amortized_refine import REFINE_OPTIONS
from ppl_bdl.inference.vi.natural import CURVATURES, NATURAL_OPTIMIZERS
from ppl_bdl.inference.vi.objectives import KL_MODES, OBJECTIVES
from ppl_bdl.inference.vi.psis import importance_log_weights
from ppl_bdl.inference.vi.runner import run_vi
from ppl_bdl.optim import OPTIMIZERS

#: The fields that are the guide's own settings (passed to the guide's factory).
GUIDE_SETTINGS = ("rank", "blocks", "num_layers", "hidden", "layer", "init_scale", "max_dim")


@dataclass(frozen=True)
class VI(Method):
    """Stochastic variational inference: a guide fitted by gradient steps on an objective (the
    ELBO, "Bayesian Computation in Deep Learning", Eq. 2.13-2.19; Rényi's α-bound, Li & Turner
    2016; IWAE, Burda et al. 2016), then ``num_samples`` draws from it.

    Example
    -------
    >>> import ppl_bdl as bdl
    >>> bdl.VI(guide="flow", num_steps=2000).guide
    'flow'
    """

    num_samples: int = option(1000, "draws from the fitted guide")
    num_chains: int = option(1, "independent fits run side by side, one chain each")
    guide: Any = option(
        "meanfield",
        "'meanfield', 'lowrank', 'fullrank', 'flow', 'delta', a registered name, a @bdl.guide "
        "function or guides.Amortized(...)",
    )
    objective: str = option("elbo", "'elbo', 'renyi' or 'iwae'")
    alpha: float | None = option(None, "the Rényi bound's α (objective='renyi')")
    kl: str = option("auto", "'auto', 'analytic' or 'mc': how the KL term is computed")
    gradient: str = option("total", "'total' or 'path' (the path derivative, Roeder et al. 2017)")
    num_particles: int | None = option(None, "draws per step (None: 1; 8 for flow)")
    num_steps: int | None = option(
        None, "optimizer steps (None: until the loss converges, 2,000 to 100,000; 20,000 for flow)"
    )
    batch_size: int | None = option(None, "minibatch size (None: the full data)")
    optimizer: str = option("adam", "'adam', 'sgd', 'vogn' or 'vadam' (natural gradients)")
    lr: float | None = option(None, "the learning rate (None: the guide's and optimizer's)")
    momentum: float | None = option(None, "sgd's momentum (None: 0)")
    schedule: str | None = option(
        None, "'plateau', 'constant', 'exponential' or 'cosine' (None: see the module)"
    )
    decay: float | None = option(None, "the exponential and cosine schedules' final factor")
    clip_norm: float | None = option(None, "clip each step's gradient to this norm")
    init_loc: Any = option(
        "median", "the start: 'median', 'prior', a dict of site values or a flat array"
    )
    chunk_size: int | None = option(None, "steps per compiled call (None: chosen by the driver)")
    plateau_factor: float | None = option(None, "plateau: the lr's cut (None: 0.5)")
    plateau_patience: int | None = option(None, "plateau: segments of a flat window (None: 3)")
    plateau_cuts: int | None = option(None, "plateau: the most cuts (None: 3)")
    beta1: float | None = option(None, "vogn/vadam: the gradient average's weight")
    beta2: float | None = option(None, "vogn/vadam: the curvature average's weight")
    curvature: str | None = option(None, "vogn: 'hessian' (the default), 'ggn' or 'fisher'")
    rank: int | None = option(None, "lowrank: the rank of the factor")
    blocks: str | None = option(None, "lowrank: 'site' (a factor per site) or 'joint'")
    num_layers: int | None = option(None, "flow: the number of layers (None: 4)")
    hidden: int | None = option(None, "flow: hidden units of each layer's network (None: 64)")
    layer: str | None = option(None, "flow: 'coupling' or another registered layer")
    init_scale: float | None = option(None, "the guide's initial scale")
    max_dim: int | None = option(None, "fullrank: the most latent dimensions it accepts")
    guide_settings: Any = option(None, "other settings of a registered guide, a dict")

    method_name: ClassVar[str] = "vi"
    hints: ClassVar[dict[str, str]] = {
        "num_warmup": "VI runs num_steps optimizer steps (no warmup)",
        "thinning": "VI keeps num_samples draws from the fitted guide (no chain to thin)",
        "init": "VI's start is init_loc",
        "hold_params": "VI fits the model's bdl.param sites as point estimates",
        "step_size": "VI's learning rate is lr",
        **{
            name: "it configures the MCMC refinement of an amortized guide's draws; pass it to "
            f"the guide: guide=guides.Amortized(encoder, sites=[...], {name}=...)"
            for name in REFINE_OPTIONS
        },
    }

    def __post_init__(self) -> None:
        check_int(self, "num_samples")
        check_int(self, "num_chains")
        check_choice(self, "objective", OBJECTIVES)
        check_choice(self, "kl", KL_MODES)
        check_choice(self, "optimizer", OPTIMIZERS + NATURAL_OPTIMIZERS)
        check_choice(self, "curvature", CURVATURES, optional=True)
        for name in ("num_particles", "num_steps", "batch_size", "chunk_size", "rank"):
            check_int(self, name, optional=True)
        for name in ("num_layers", "hidden", "max_dim"):
            check_int(self, name, optional=True)
        for name in ("lr", "clip_norm", "init_scale"):
            check_number(self, name, 0.0, optional=True)
        self._check_guide_settings()

    def _check_guide_settings(self) -> None:
        if isinstance(self.guide, str) and self.guide not in guides.available():
            raise ConfigError(
                f"VI(guide={self.guide!r}): no guide of that name; expected one of "
                f"{', '.join(repr(g) for g in guides.available())}, a @bdl.guide function or "
                "guides.Amortized(...)."
            )
        if self.guide_settings is not None and not isinstance(self.guide_settings, dict):
            raise ConfigError(
                f"VI(guide_settings={self.guide_settings!r}): a dict of the guide's settings."
            )
        given = [n for n in GUIDE_SETTINGS if getattr(self, n) is not None]
        if not given or not isinstance(self.guide, str) or self.guide not in guides.available():
            return
        accepted = inspect.signature(guides.get(self.guide)).parameters
        wrong = [n for n in given if n not in accepted]
        if wrong:
            takes = [n for n in GUIDE_SETTINGS if n in accepted]
            raise ConfigError(
                f"VI(guide={self.guide!r}, {wrong[0]}=...): {wrong[0]} is not a setting of the "
                f"{self.guide} guide; its settings: {', '.join(takes) or 'none'}."
            )

    def run_options(self) -> dict[str, Any]:
        """The options as :func:`~ppl_bdl.inference.vi.runner.run_vi` takes them: those set away
        from their defaults (a default here is the run's own)."""
        options = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in ("num_samples", "num_chains", "guide_settings")
            and getattr(self, f.name) is not f.default
            and not (is_plain(getattr(self, f.name)) and getattr(self, f.name) == f.default)
        }
        return {**options, **(self.guide_settings or {})}

    def settings(self) -> dict[str, Any]:
        settings = {**self.given(), "num_samples": self.num_samples}
        settings.pop("guide_settings", None)
        return settings

    def run(self, setup, *, seed: int, progress: bool, log_likelihood: bool, chain_ids):
        return run_vi(
            setup,
            num_samples=self.num_samples,
            seed=seed,
            progress=progress,
            log_likelihood=log_likelihood,
            num_chains=self.num_chains,
            **self.run_options(),
        )

    def importance_log_weights(self, setup, post, seed: int):
        return importance_log_weights(setup, post, seed=seed)
