"""The MCMC methods as typed objects: NUTS (the backend's), HMC (the core's, with Stan's warmup) and the SG-MCMC kernels.

Each class's fields are its options, checked at construction (:mod:`ppl_bdl.inference.method`);
:meth:`run` hands them to the one driver (:func:`~ppl_bdl.inference.mcmc.native.run_native_mcmc`,
:func:`~ppl_bdl.inference.mcmc.sgmcmc.run_sgmcmc`). A kernel registered with
:func:`ppl_bdl.kernels.register` runs as :class:`SGMCMC` with ``kernel=`` its name; a built-in
kernel has a class of its own whose extra fields are the kernel's settings.

Example
-------
>>> import ppl_bdl as bdl
>>> bdl.SGHMC(step_size=1e-3, friction=0.1).kernel_options()
{'friction': 0.1, 'momentum_decay': None, 'mass': 1.0, 'temperature': 1.0, 'noise_estimate': 0.0, 'resample_every': None}
"""

from __future__ import annotations

import dataclasses
import inspect
import warnings
from dataclasses import dataclass
from typing import Any, ClassVar

from ppl_bdl.errors import ConfigError
from ppl_bdl.inference.mcmc.elbo_tuning import (
    DEFAULT_INITIAL_STEP_SIZE,
    ElboTuning,
    run_elbo_hmc,
)
from ppl_bdl.inference.mcmc.hmc_kernel import DEFAULT_LEAPFROG_STEPS
from ppl_bdl.inference.mcmc.kernels import registry
from ppl_bdl.inference.mcmc.native import NativeConfig, run_native_mcmc
from ppl_bdl.inference.mcmc.neutra import check_neutra
from ppl_bdl.inference.mcmc.sgmcmc import DRIVER_SUPPLIED, SGMCMCConfig, run_sgmcmc
from ppl_bdl.inference.method import (
    Method,
    check_bool,
    check_choice,
    check_int,
    check_number,
    check_params,
    option,
)

#: Latent dimensions above which NUTS warns before it starts: every draw costs up to
#: 2^max_tree_depth gradients of the full data, which on a network's posterior is the usual case.
NUTS_DIM_WARNING = 500
#: A ``max_tree_depth`` at or below this bounds NUTS's cost enough not to warn (32 gradients).
BOUNDED_TREE_DEPTH = 5
#: How HMC sets its step size and mass: the backend's warmup, or tuned by the ELBO.
ADAPTATIONS = ("dual_averaging", "elbo")
#: HMC's options of ``adapt="elbo"`` (NUTS refuses them, saying to use HMC).
ELBO_OPTIONS = (
    "adapt",
    "elbo_steps",
    "elbo_lr",
    "elbo_chain_length",
    "elbo_particles",
    "elbo_tune_init",
    "elbo_init_scale",
    "elbo_init_inflation",
)


class CostWarning(UserWarning):
    """A fit is set up in a way that will cost far more than an alternative that suits it."""


@dataclass(frozen=True)
class ChainMethod(Method):
    """What every MCMC method has: chains of ``num_warmup + num_samples * thinning`` steps."""

    num_warmup: int = option(1000, "steps per chain before draws are kept")
    num_samples: int = option(1000, "draws kept per chain")
    num_chains: int = option(4, "independent chains")
    thinning: int = option(1, "keep every thinning-th draw after warmup")
    init: Any = option(
        None,
        "where chains start: 'median' (the default: the prior's centre, jittered), "
        "'uniform', 'prior', a dict of site values or a Posterior",
    )
    hold_params: bool = option(
        False, "hold the model's bdl.param sites at their initial values (else an error)"
    )

    runs_chains: ClassVar[bool] = True

    def __post_init__(self) -> None:
        check_int(self, "num_warmup", 0)
        check_int(self, "num_samples")
        check_int(self, "num_chains")
        check_int(self, "thinning")
        check_bool(self, "hold_params")

    @property
    def num_chains_to_run(self) -> int:
        return self.num_chains

    def settings(self) -> dict[str, Any]:
        return {
            **self.given(),
            "num_warmup": self.num_warmup,
            "num_samples": self.num_samples,
            "num_chains": self.num_chains,
            "thinning": self.thinning,
        }

    def _lengths(self, seed: int, progress: bool, log_likelihood: bool, chain_ids) -> dict:
        return dict(
            num_warmup=self.num_warmup,
            num_samples=self.num_samples,
            num_chains=self.num_chains,
            thinning=self.thinning,
            seed=seed,
            init=self.init,
            progress=progress,
            log_likelihood=log_likelihood,
            chain_ids=chain_ids,
        )


# -- the backends' own samplers ------------------------------------------------------------------
@dataclass(frozen=True)
class _Native(ChainMethod):
    target_accept: float = option(0.8, "the acceptance rate warmup adapts the step size to")
    step_size: float | None = option(None, "the initial step size (adapted during warmup)")
    dense_mass: bool = option(False, "adapt a dense mass matrix (else diagonal)")
    chain_method: str | None = option(
        None, "'sequential' or 'vectorized' (None: vectorized when chains span several devices)"
    )
    chunk_size: int | None = option(None, "steps per compiled call (None: chosen by the driver)")
    neutra: Any = option(
        None,
        "a Posterior of method='vi', guide='flow' on this model: sample in the flow's base "
        "space (NeuTra, Hoffman et al. 2019)",
    )

    hints: ClassVar[dict[str, str]] = {
        "batch_size": "NUTS and HMC use the full data each step; for minibatches use an "
        "SG-MCMC method (bdl.SGHMC, bdl.SGLD)",
        "schedule": "the step size is adapted during warmup",
        "lr": "the step size is adapted during warmup (step_size sets the initial one)",
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.step_size, str):
            raise ConfigError(
                f"{type(self).__name__}(step_size={self.step_size!r}): only SG-MCMC picks its step "
                f"size by a pilot run; {type(self).__name__} adapts its own during warmup. Give "
                "a number > 0 (the initial step size) or leave step_size out."
            )
        self.config()  # NativeConfig's checks
        if self.neutra is not None:
            check_neutra(self.neutra, type(self).__name__)

    def config(self) -> NativeConfig:
        return NativeConfig.build(self.method_name, **self.options_for(NativeConfig.build))

    def run(self, setup, *, seed: int, progress: bool, log_likelihood: bool, chain_ids):
        check_params(setup, self.name, self.hold_params)
        _warn_cost(setup, self.name, getattr(self, "max_tree_depth", None))
        lengths = self._lengths(seed, progress, log_likelihood, chain_ids)
        return run_native_mcmc(setup, self.config(), **lengths, neutra=self.neutra)


@dataclass(frozen=True)
class NUTS(_Native):
    """The No-U-Turn Sampler of the backend (NumPyro's or Pyro's NUTS; Hoffman & Gelman 2014),
    with its warmup adaptation of the step size and mass matrix.

    Example
    -------
    >>> import ppl_bdl as bdl
    >>> bdl.NUTS(target_accept=0.9, num_chains=2).num_chains
    2
    """

    max_tree_depth: int = option(10, "at most 2^max_tree_depth leapfrog steps per draw")

    method_name: ClassVar[str] = "nuts"
    hints: ClassVar[dict[str, str]] = {
        **_Native.hints,
        "num_steps": "NUTS picks its number of leapfrog steps per draw; bound it with "
        "max_tree_depth (or use bdl.HMC(num_steps=...))",
        **{
            name: "NUTS adapts its step size and mass by dual averaging during warmup; tuning "
            "them by the ELBO differentiates through a fixed number of leapfrog steps: use "
            "bdl.HMC(adapt='elbo', num_steps=...)"
            for name in ELBO_OPTIONS
        },
    }


@dataclass(frozen=True)
class HMC(_Native):
    """Hamiltonian Monte Carlo with a fixed number of leapfrog steps per draw (Neal 2011).

    ``adapt="dual_averaging"`` (the default) adapts the step size and mass during warmup as
    Stan does (:mod:`~ppl_bdl.inference.mcmc.hmc_warmup`); the same kernel on every backend. ``adapt="elbo"`` tunes the step size and a diagonal mass (and the
    chains' initial distribution q_0) by gradient ascent on an ELBO-like objective
    differentiated through ``elbo_chain_length`` HMC moves (Campbell et al. 2021; "Bayesian
    Computation in Deep Learning", Eq. 3.19), then samples with them fixed
    (:mod:`~ppl_bdl.inference.mcmc.elbo_tuning`).

    Example
    -------
    >>> import ppl_bdl as bdl
    >>> bdl.HMC(num_steps=20).num_steps
    20
    >>> bdl.HMC(adapt="elbo", elbo_steps=500).elbo_config().steps
    500
    """

    num_steps: int | None = option(None, "leapfrog steps per draw (None: the backend's, 10)")
    adapt: str = option(
        "dual_averaging",
        "'dual_averaging' (warmup adapts ε and the mass) or 'elbo' (ε and a diagonal mass "
        "tuned by an ELBO through HMC moves, Campbell et al. 2021; warmup: burn-in only)",
    )
    elbo_steps: int = option(500, "adapt='elbo': Adam steps of the tuning")
    elbo_lr: float = option(0.03, "adapt='elbo': the tuning's learning rate")
    elbo_chain_length: int = option(3, "adapt='elbo': T, HMC moves per sample of the objective")
    elbo_particles: int = option(4, "adapt='elbo': samples of the objective per tuning step")
    elbo_tune_init: bool = option(
        True, "adapt='elbo': fit q_0's mean and scale by q_0's ELBO (else: init, elbo_init_scale)"
    )
    elbo_init_scale: float = option(
        1.0, "adapt='elbo': q_0's initial standard deviation (unconstrained space)"
    )
    elbo_init_inflation: float = option(
        2.0, "adapt='elbo': the objective's chains start from q_0 widened by this factor (>= 1)"
    )

    method_name: ClassVar[str] = "hmc"
    hints: ClassVar[dict[str, str]] = {
        **_Native.hints,
        "max_tree_depth": "HMC runs a fixed number of leapfrog steps: set num_steps",
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice(self, "adapt", ADAPTATIONS)
        check_int(self, "elbo_steps")
        check_number(self, "elbo_lr", 0.0)
        check_int(self, "elbo_chain_length")
        check_int(self, "elbo_particles")
        check_bool(self, "elbo_tune_init")
        check_number(self, "elbo_init_scale", 0.0)
        check_number(self, "elbo_init_inflation", 1.0, open_low=False)
        if self.adapt == "elbo":
            self._check_elbo()
            return
        for f in dataclasses.fields(self):
            if f.name.startswith("elbo_") and getattr(self, f.name) != f.default:
                raise ConfigError(
                    f"HMC({f.name}={getattr(self, f.name)!r}): {f.name} is a setting of "
                    "adapt='elbo'; this HMC adapts by dual averaging. Pass adapt='elbo' too, "
                    f"or leave {f.name} out."
                )

    def _check_elbo(self) -> None:
        refused = {
            "dense_mass": (self.dense_mass, "the ELBO tunes a diagonal mass"),
            "neutra": (self.neutra, "the ELBO-tuned kernel samples the model's own space"),
        }
        for name, (value, why) in refused.items():
            if value not in (False, None):
                raise ConfigError(
                    f"HMC(adapt='elbo', {name}={value!r}): {why}. Leave {name} out, or use "
                    "adapt='dual_averaging'."
                )

    def elbo_config(self) -> ElboTuning:
        """The ELBO tuning's settings (``adapt='elbo'``)."""
        return ElboTuning(
            steps=self.elbo_steps,
            lr=float(self.elbo_lr),
            chain_length=self.elbo_chain_length,
            particles=self.elbo_particles,
            num_steps=self.num_steps or DEFAULT_LEAPFROG_STEPS,
            tune_init=self.elbo_tune_init,
            init_scale=float(self.elbo_init_scale),
            init_inflation=float(self.elbo_init_inflation),
            step_size=float(self.step_size or DEFAULT_INITIAL_STEP_SIZE),
        )

    def run(self, setup, *, seed: int, progress: bool, log_likelihood: bool, chain_ids):
        if self.adapt == "dual_averaging":
            return super().run(
                setup,
                seed=seed,
                progress=progress,
                log_likelihood=log_likelihood,
                chain_ids=chain_ids,
            )
        check_params(setup, self.name, self.hold_params)
        lengths = self._lengths(seed, progress, log_likelihood, chain_ids)
        return run_elbo_hmc(
            setup,
            self.elbo_config(),
            **lengths,
            chunk_size=self.chunk_size,
            vectorize=self.chain_method != "sequential",
        )


def _warn_cost(setup, method: str, max_tree_depth: int | None) -> None:
    """NUTS on a large model or a network's weights: a warning before it starts. Each draw costs
    up to 2^max_tree_depth full-data gradients, and a network's posterior (weights whose scales
    and correlations no mass matrix captures) makes nearly every draw reach that depth."""
    if method != "nuts":
        return  # HMC's cost is fixed: num_steps gradients a draw
    dim = setup.layout.dim
    weights = [n for n in setup.layout.names if n.endswith(".weight")]
    if max_tree_depth <= BOUNDED_TREE_DEPTH:
        weights = []  # a shallow tree bounds a small network's cost
    if dim <= NUTS_DIM_WARNING and not weights:
        return
    why = (
        f"{dim} latent dimensions (> {NUTS_DIM_WARNING})"
        if dim > NUTS_DIM_WARNING
        else f"a network's weights ({', '.join(weights)})"
    )
    warnings.warn(
        f"NUTS on {setup.bound.name!r}: {why}. Each draw costs up to 2^max_tree_depth "
        "full-data gradients and, on a network's posterior, usually reaches that depth: expect "
        "minutes for a small network, hours for a large one. Use method='sghmc' (or 'sgld', "
        "'csghmc'; batch_size=... for minibatches), method='vi' or method='hmc'; or set "
        "max_tree_depth=5 to bound the cost.",
        CostWarning,
        stacklevel=5,
    )


# -- SG-MCMC -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SGMCMCBase(ChainMethod):
    """What every stochastic-gradient MCMC method has: the driver's settings (minibatches, the
    step size and its schedule, control variates). A subclass adds its kernel's own settings
    as fields and names its registered kernel in ``method_name``."""

    num_warmup: int = option(
        5000,
        "steps per chain before draws are kept (SG-MCMC takes small steps: its burn-in is long)",
    )
    step_size: float | str = option(
        "auto",
        "the step size α_0 (a number > 0), or 'auto': chosen by a short pilot run at the start "
        "and again halfway through the warmup (the smaller of the two)",
    )
    batch_size: int | None = option(None, "minibatch size (None: the full data)")
    schedule: str | None = option(
        None, "'constant' (the default), 'polynomial' or 'cyclical' (cyclical kernels: always)"
    )
    num_cycles: int = option(4, "cycles of the cyclical schedule")
    decay_offset: float = option(1.0, "the polynomial schedule's offset b: α_t = α_0 (b + t)^-γ")
    decay_power: float = option(0.55, "the polynomial schedule's power γ")
    chunk_size: int | None = option(None, "steps per compiled call (None: chosen by the driver)")
    control_variate: str | None = option(None, "None or 'svrg' (Dubey et al. 2016)")
    anchor_period: int | None = option(
        None, "svrg: steps between full-data gradients (None: one epoch)"
    )

    hints: ClassVar[dict[str, str]] = {
        "lr": "an SG-MCMC method's learning rate is its step_size",
        "num_steps": "it runs num_warmup + num_samples * thinning steps",
        "target_accept": "SG-MCMC has no accept step; set step_size",
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        _build_kernel(self.config())  # the kernel's own checks of its settings' values

    def kernel_options(self) -> dict[str, Any]:
        """The kernel's own settings: the fields a kernel's class adds to the driver's."""
        base = {f.name for f in dataclasses.fields(SGMCMCBase)}
        return {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in base
        }

    def config(self) -> SGMCMCConfig:
        driver = self.options_for(SGMCMCConfig.build, SGMCMCBase)
        return SGMCMCConfig.build(self.name, **driver, **self.kernel_options())

    def run(self, setup, *, seed: int, progress: bool, log_likelihood: bool, chain_ids):
        check_params(setup, self.name, self.hold_params)
        lengths = self._lengths(seed, progress, log_likelihood, chain_ids)
        return run_sgmcmc(setup, self.config(), **lengths)


@dataclass(frozen=True)
class SGMCMC(SGMCMCBase):
    """Any registered SG-MCMC kernel (:func:`ppl_bdl.kernels.register`) by name, its own
    settings in ``kernel_settings``; ``fit(method="my_kernel", ...)`` builds this for a kernel
    without a class of its own. The built-in kernels have classes (:class:`SGLD`,
    :class:`SGHMC`, :class:`PSGLD`, :class:`CyclicalSGLD`, :class:`CyclicalSGHMC`).

    Example
    -------
    >>> import ppl_bdl as bdl
    >>> bdl.SGMCMC(kernel="sgld", step_size=1e-3, kernel_settings={"temperature": 0.5}).name
    'sgld'
    """

    kernel: str = option("sgld", "the registered kernel's name (bdl.kernels.available())")
    kernel_settings: Any = option(None, "the kernel's own settings, a dict (None: its defaults)")

    def __post_init__(self) -> None:
        if not isinstance(self.kernel, str):
            raise ConfigError(f"SGMCMC(kernel={self.kernel!r}): kernel must be a kernel's name.")
        if self.kernel_settings is not None and not isinstance(self.kernel_settings, dict):
            raise ConfigError(
                f"SGMCMC(kernel_settings={self.kernel_settings!r}): a dict of the kernel's "
                "settings, or None."
            )
        super().__post_init__()

    @property
    def name(self) -> str:
        return self.kernel

    def kernel_options(self) -> dict[str, Any]:
        return dict(self.kernel_settings or {})


def _build_kernel(config: SGMCMCConfig) -> None:
    """Build the kernel once with a stand-in gradient, so that its factory checks its settings
    at construction (nothing runs)."""
    params = inspect.signature(config.entry.factory).parameters
    supplied = {"num_steps": 1, "num_cycles": config.num_cycles}
    extra = {k: v for k, v in supplied.items() if k in params and k in DRIVER_SUPPLIED}
    config.entry.factory(lambda position, batch: (0.0, position), **config.kernel_options, **extra)


@dataclass(frozen=True)
class SGLD(SGMCMCBase):
    """Stochastic gradient Langevin dynamics (Welling & Teh 2011; "Bayesian Computation in Deep
    Learning", Eq. 2.8-2.9).

    Example
    -------
    >>> import ppl_bdl as bdl
    >>> bdl.SGLD(step_size=1e-4, batch_size=32).name
    'sgld'
    """

    temperature: float = option(1.0, "T scales the injected noise (1: the posterior)")

    method_name: ClassVar[str] = "sgld"


@dataclass(frozen=True)
class SGHMC(SGMCMCBase):
    """Stochastic gradient Hamiltonian Monte Carlo (Chen et al. 2014; "Bayesian Computation in
    Deep Learning", Eq. 2.11-2.12), in the learning-rate / momentum-decay form.

    Example
    -------
    >>> import ppl_bdl as bdl
    >>> bdl.SGHMC(step_size=1e-3, friction=0.1).friction
    0.1
    """

    friction: float | None = option(
        None, "C of Eq. 2.12 (the momentum decay is then C √(η / M)); or give momentum_decay"
    )
    momentum_decay: float | None = option(None, "α in [0, 1] (None: 0.1 unless friction is set)")
    mass: Any = option(1.0, "the diagonal mass M: a number or one per coordinate")
    temperature: float = option(1.0, "T scales the injected noise (1: the posterior)")
    noise_estimate: float = option(0.0, "B̂, the gradient noise subtracted from the injected")
    resample_every: int | None = option(None, "redraw the momentum every k steps (None: never)")

    method_name: ClassVar[str] = "sghmc"


@dataclass(frozen=True)
class PSGLD(SGMCMCBase):
    """RMSprop-preconditioned SGLD (Li et al. 2016).

    Example
    -------
    >>> import ppl_bdl as bdl
    >>> bdl.PSGLD(decay=0.95).decay
    0.95
    """

    temperature: float = option(1.0, "T scales the injected noise (1: the posterior)")
    decay: float = option(0.99, "ρ in [0, 1), the moving-average weight of squared gradients")
    epsilon: float = option(1e-5, "λ, the preconditioner's floor")

    method_name: ClassVar[str] = "psgld"


@dataclass(frozen=True)
class CyclicalSGLD(SGMCMCBase):
    """Cyclical SGLD (Zhang et al. 2020; "Bayesian Computation in Deep Learning", Eq. 2.10): a
    cyclical step size whose cycles begin with an exploration stage; draws are kept in the
    sampling stages only.

    Example
    -------
    >>> import ppl_bdl as bdl
    >>> bdl.CyclicalSGLD(num_cycles=2, exploration=0.5).name
    'csgld'
    """

    num_warmup: int = option(
        10000,
        "steps per chain before draws are kept (its chains settle more slowly than SGLD's: "
        "no noise in the exploration stages, half the step on average)",
    )
    exploration: float = option(0.8, "β in [0, 1): the fraction of each cycle that explores")
    temperature: float = option(1.0, "T of the noise in sampling stages")

    method_name: ClassVar[str] = "csgld"


@dataclass(frozen=True)
class CyclicalSGHMC(SGMCMCBase):
    """Cyclical SGHMC (Zhang et al. 2020): SGD with momentum in exploration stages, SGHMC in
    sampling stages.

    Example
    -------
    >>> import ppl_bdl as bdl
    >>> bdl.CyclicalSGHMC(step_size=1e-3).name
    'csghmc'
    """

    exploration: float = option(0.8, "β in [0, 1): the fraction of each cycle that explores")
    friction: float | None = option(None, "C of Eq. 2.12; or give momentum_decay")
    momentum_decay: float | None = option(None, "α in [0, 1] (None: 0.1 unless friction is set)")
    mass: Any = option(1.0, "the diagonal mass M: a number or one per coordinate")
    temperature: float = option(1.0, "T of the noise in sampling stages")
    noise_estimate: float = option(0.0, "B̂, the gradient noise subtracted from the injected")

    method_name: ClassVar[str] = "csghmc"


def kernel_method(name: str, options: dict[str, Any]) -> SGMCMC:
    """A registered kernel without a class of its own as :class:`SGMCMC`: the options that are
    not the driver's are the kernel's settings."""
    entry = registry.get(name)
    if entry.kind != "sgmcmc":
        raise ConfigError(f"method {name!r} is not an SG-MCMC kernel.")
    fields = {f.name for f in dataclasses.fields(SGMCMCBase)}
    driver = {k: v for k, v in options.items() if k in fields}
    own = {k: v for k, v in options.items() if k not in fields}
    return SGMCMC(kernel=name, kernel_settings=own or None, **driver)
