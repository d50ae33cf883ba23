"""A score model: s_θ(x, t) with its parameters and SDE, its samplers and its objective.

:func:`ppl_bdl.inference.diffusion.fit` returns a :class:`ScoreModel`; one can also be built from a
known score function (to check a sampler, or to sample a density known up to its normaliser).

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl.inference.diffusion import VPSDE
>>> sde = VPSDE()
>>> def score(x, t):              # data N(2, 0.5²): p_t = N(2 a(t), a(t)² 0.25 + σ(t)²)
...     a, s = sde.mean_coef(t, bdl.math), sde.std(t, bdl.math)
...     return -(x - 2.0 * a) / (0.25 * a * a + s * s)
>>> model = bdl.diffusion.ScoreModel(score, dim=1, sde=sde, backend="numpyro")
>>> x = model.sample(4000, sampler="ode", steps=200, seed=0)
>>> [round(float(v), 1) for v in (x.mean(), x.std())]
[2.0, 0.5]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ppl_bdl.backends import get as get_backend
from ppl_bdl.dsl.nn import Module
from ppl_bdl.errors import ConfigError, InferenceError, ModelError
from ppl_bdl.inference.diffusion.objectives import dsm_terms, exact_terms
from ppl_bdl.inference.diffusion.samplers import SamplerSpec, sampling_transition
from ppl_bdl.inference.diffusion.score import FunctionScore, NetworkScore
from ppl_bdl.inference.diffusion.sde import make_sde
from ppl_bdl.inference.ebm.loop import checked_int, run_transition

#: Rows per call when a model evaluates many points.
CHUNK = 8192


class ScoreModel:
    """A score s_θ(x, t) ≈ ∇_x log p_t(x) of points of D numbers, and its samplers.

    Parameters
    ----------
    score : ppl_bdl.dsl.nn.Module or callable
        A network (see :mod:`ppl_bdl.inference.diffusion.score` for its input and output) with
        its ``params``, or a function ``score(x, t)`` of :mod:`ppl_bdl.dsl.math` mapping (B, D)
        points and (B, 1) times to (B, D) scores (``score(x)`` when ``sde`` is None).
    params : dict, optional
        Site name -> array, one per weight site of a network.
    dim : int
        D, the size of a point.
    sde : "ve", "vp", VESDE, VPSDE or None
        The forward SDE the score belongs to (a VESDE needs its ``sigma_max``); None: a score
        of x alone, s(x) = ∇ log p(x), sampled by Langevin dynamics (Eq. 3.8).
    backend, precision, device
        As for :func:`ppl_bdl.run.fit`.
    time_features : int
        K, the Fourier features of t in a network's input.

    Attributes
    ----------
    params : dict of NumPy arrays
    losses : NumPy array (T,) or None
        The training loss of each step (after :func:`~ppl_bdl.inference.diffusion.fit`).
    history : dict of NumPy arrays
        Every training step's info: ``loss``, ``grad_norm``.
    settings : dict
        The settings of the fit.
    """

    def __init__(
        self,
        score: Module | Callable,
        params: dict | None = None,
        *,
        dim: int,
        sde: Any = "ve",
        backend=None,
        precision: str = "float32",
        device: str | None = None,
        time_features: int = 0,
    ):
        self.backend = get_backend(backend, precision, device)
        self.dim = checked_int("dim", dim, 1)
        self.sde = None if sde is None else make_sde(sde)
        if self.sde is not None and getattr(self.sde, "sigma_max", 0.0) is None:
            raise ConfigError(
                "a VE score model needs its sigma_max: give sde=bdl.diffusion.VESDE(sigma_max=...) "
                "(fit() sets it from the data)."
            )
        if isinstance(score, Module):
            features = checked_int("time_features", time_features, 0)
            self._score = NetworkScore(
                score, self.backend, dim=self.dim, sde=self.sde, time_features=features
            )
            self.params = _check_params(self._score.shapes, params)
        else:
            if params:
                raise ModelError("params are the weights of a network; a score function has none.")
            self._score = FunctionScore(score, dim=self.dim, sde=self.sde)
            self.params = {}
        self.network = score
        self.start_loc, self.start_scale = np.zeros(self.dim), np.ones(self.dim)
        self.losses: np.ndarray | None = None
        self.history: dict[str, np.ndarray] = {}
        self.settings: dict[str, Any] = {}

    def __repr__(self) -> str:
        kind = "score of x" if self.sde is None else f"{self.sde.name.upper()} SDE"
        trained = "" if self.losses is None else f", {len(self.losses)} training steps"
        return f"<ScoreModel on {self.backend.name}: D={self.dim}, {kind}{trained}>"

    def score(self, x, t=None) -> np.ndarray:
        """s_θ(x, t) at the rows of ``x`` (n, D) and time ``t`` (a number or n numbers in
        [0, 1]; None for a score of x alone): a NumPy array (n, D).

        Example
        -------
        >>> import ppl_bdl as bdl
        >>> model = bdl.diffusion.ScoreModel(lambda x: -x, dim=2, sde=None, backend="numpyro")
        >>> model.score([[1.0, -2.0]]).tolist()
        [[-1.0, 2.0]]
        """
        x = self._points(x)
        if (t is None) != (self.sde is None):
            raise ConfigError(
                "score(x, t) takes a time t in [0, 1] for a model of an SDE, and none for a "
                f"score of x alone; this model's sde is {self.sde!r}, t={t!r}."
            )
        times = None if t is None else np.broadcast_to(np.asarray(t, x.dtype), (len(x),))
        backend, out = self.backend, []
        with backend.scope(), backend.activate():
            params = self.device_params()
            for a in range(0, len(x), CHUNK):
                rows = backend.asarray(x[a : a + CHUNK])
                tt = None if times is None else backend.asarray(times[a : a + CHUNK])
                out.append(np.asarray(backend.to_numpy(self._score(params, rows, tt)), float))
        return np.concatenate(out)

    def sample(
        self,
        n: int,
        sampler: str = "euler",
        steps: int = 500,
        seed: int = 0,
        corrector_steps: int = 1,
        snr: float = 0.16,
        step_size: float = 0.1,
        integrator: str = "heun",
        progress: bool = False,
        chunk_size: int | None = None,
    ) -> np.ndarray:
        """n draws of x: ``sampler`` ("euler", "pc", "ode" or "langevin"; see
        :mod:`ppl_bdl.inference.diffusion.samplers`) from the SDE's prior at t = 1 down to its
        ``t_min``, on ``steps`` time steps (noise levels for "langevin").

        Parameters
        ----------
        corrector_steps, snr : int, float
            Langevin steps per time step and their signal-to-noise ratio ("pc"); Langevin
            steps per noise level ("langevin").
        step_size : float
            "langevin": α_i / σ_i² (the step at noise level σ_i); for a score of x alone, α.
        integrator : {"heun", "euler"}
            The probability-flow ODE's method ("ode").
        seed : int
            Same seed, same draws (on the same backend).

        Returns
        -------
        NumPy array (n, D)
        """
        n = checked_int("n", n, 1)
        spec = SamplerSpec.build(
            sampler,
            steps=steps,
            corrector_steps=corrector_steps,
            snr=snr,
            step_size=step_size,
            integrator=integrator,
        )
        if self.sde is None and spec.sampler != "langevin":
            raise ConfigError(
                f"sampler={sampler!r} integrates an SDE in time; a score of x alone (trained "
                "by exact score matching) is sampled by sampler='langevin' (Eq. 3.8)."
            )
        x0 = self._start(n, seed)
        backend = self.backend
        with backend.scope(), backend.activate():
            params = self.device_params()
            transition = sampling_transition(backend, self._score, self.sde, spec, x0.shape, params)
        run = run_transition(
            backend,
            transition,
            x0.reshape(-1),
            num_steps=spec.loop_steps,
            seed=seed,
            data=params,
            name=f"diffusion sample ({spec.sampler})",
            progress=progress,
            chunk_size=chunk_size,
            keep_last=True,
        )
        if run.failure is not None or run.draws is None:
            where = run.failure.step if run.failure is not None else spec.loop_steps
            raise InferenceError(
                f"sampling stopped at step {where} of {spec.loop_steps}: a draw or the score is "
                f"not finite (sampler {spec.sampler!r}). Try more steps, a smaller step_size "
                "or snr, or another sampler."
            )
        return np.asarray(run.draws[0, -1], dtype=float).reshape((n, self.dim))

    def loss_terms(self, X, seed: int = 0, repeats: int = 1) -> np.ndarray:
        """The training objective's terms at the rows of ``X`` (``repeats`` draws of (t, z) per
        row): ½‖σ(t) s_θ(x_t, t) + z‖² for a model of an SDE (weighted denoising score matching,
        Eq. 3.11), tr(∇_x s_θ(x)) + ½‖s_θ(x)‖² for a score of x alone (Eq. 3.10). Their mean
        is the objective's Monte Carlo estimate, their standard deviation / √count its
        standard error: a held-out loss.

        Example
        -------
        >>> import numpy as np, ppl_bdl as bdl
        >>> model = bdl.diffusion.ScoreModel(lambda x: -x, dim=1, sde=None, backend="numpyro")
        >>> model.loss_terms(np.array([[0.0], [2.0]])).tolist()   # −1 + ½x²
        [-1.0, 1.0]
        """
        x = np.repeat(self._points(X), checked_int("repeats", repeats, 1), axis=0)
        rng = np.random.default_rng([int(seed), 17])
        backend, out = self.backend, []
        with backend.scope(), backend.activate():
            params = self.device_params()
            for a in range(0, len(x), CHUNK):
                rows = backend.asarray(x[a : a + CHUNK])
                if self.sde is None:
                    terms = exact_terms(backend, self._score, params, rows)
                else:
                    t = rng.uniform(self.sde.t_min, 1.0, size=len(rows)).astype(x.dtype)
                    z = rng.normal(size=rows.shape).astype(x.dtype)
                    args = (backend.asarray(t), backend.asarray(z))
                    terms = dsm_terms(self._score, self.sde, params, rows, *args)
                out.append(np.asarray(backend.to_numpy(terms), dtype=float))
        return np.concatenate(out)

    def device_params(self) -> dict:
        """The parameters as arrays of the backend (run under ``backend.scope()``)."""
        return {k: self.backend.asarray(v) for k, v in self.params.items()}

    def _points(self, x) -> np.ndarray:
        dtype = np.float32 if self.backend.precision == "float32" else np.float64
        array = np.asarray(x, dtype=dtype)
        if array.ndim != 2 or array.shape[1] != self.dim:
            raise ConfigError(
                f"points have shape {array.shape}; expected (n, {self.dim}): rows of the "
                "model's D numbers."
            )
        return array

    def _start(self, n: int, seed: int) -> np.ndarray:
        """x at t = 1: the SDE's prior N(0, σ_prior² I); for a score of x alone, N(loc, scale²)
        per coordinate (the data's mean and standard deviation after a fit)."""
        rng = np.random.default_rng([int(seed), 13])
        z = rng.normal(size=(n, self.dim))
        if self.sde is None:
            return self._points(self.start_loc + self.start_scale * z)
        return self._points(self.sde.prior_std * z)


def _check_params(shapes: dict, params: dict | None) -> dict[str, np.ndarray]:
    if not isinstance(params, dict):
        raise ModelError(
            f"params must be a dict of site name -> array, one per weight site of the network "
            f"{list(shapes)}; got {type(params).__name__}."
        )
    missing, extra = sorted(set(shapes) - set(params)), sorted(set(params) - set(shapes))
    if missing or extra:
        raise ModelError(
            f"params do not match the score network's sites {list(shapes)}: missing {missing}, "
            f"unknown {extra}."
        )
    out = {}
    for name, shape in shapes.items():
        value = np.asarray(params[name], dtype=float)
        if value.shape != tuple(shape):
            raise ModelError(
                f"params[{name!r}] has shape {value.shape}; the network's site has {tuple(shape)}."
            )
        out[name] = value
    return out
