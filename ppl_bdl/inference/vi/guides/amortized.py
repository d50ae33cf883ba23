"""Amortized guides: q(z_i | x_i) = N(μ_φ(x_i), σ_φ(x_i)²) from an encoder network, for the
local latent sites of the data plate (one z_i per point).

An amortized guide replaces N sets of free variational parameters of a per-point latent by one
network g_φ(x) = [μ_φ(x), ρ_φ(x)], σ = softplus(ρ), that maps a point's inputs to them: Section 3.3.1 of
"Bayesian Computation in Deep Learning" and Algorithm 4 (a variational auto-encoder; Kingma & Welling 2014, Rezende et al.
2014). A step encodes only the minibatch's points, so it costs O(B), and a new point is encoded
by one pass (``post.encode(X)``). The model's other latents (its global ones: a Bayesian
decoder's weights) keep a global guide over the flat unconstrained vector of their own
(``global_guide``, mean-field by default; ``"delta"`` is MAP); its ``bdl.param`` sites are fitted
as point estimates as in every VI fit. The objectives (:mod:`ppl_bdl.inference.vi.objectives_amortized`)
take the ELBO, IWAE or Rényi bound per point (Eq. 3.16-3.18 of "Bayesian Computation in Deep Learning").

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import dist, guides, nn
>>> @bdl.model
... def factor_model(X):
...     W = bdl.param("W", np.ones((1, 3)))
...     with bdl.plate("data", X.shape[0]) as idx:
...         z = bdl.sample("z", dist.Normal(0.0, 1.0), shape=(1,))
...         bdl.sample("x", dist.Normal(z @ W, 0.5), obs=X[idx], shape=(3,))
>>> X = np.random.default_rng(0).normal(size=(200, 3))
>>> encoder = nn.Dense("enc", 3, 2, prior=nn.glorot_normal())  # 2 outputs: [mu, rho]
>>> post = bdl.fit(factor_model(X), backend="numpyro", method="vi",
...                guide=guides.Amortized(encoder, sites=["z"]), num_steps=300, batch_size=50,
...                num_samples=10, progress=False)
>>> loc, scale = post.encode(X[:5])["z"]
>>> loc.shape, scale.shape
((5, 1), (5, 1))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ppl_bdl.dsl.nn import Module, SampledNetwork, initial_values
from ppl_bdl.errors import ConfigError, ModelError, one_of
from ppl_bdl.inference.mcmc.batched_hmc import hmc_chains
from ppl_bdl.inference.vi.guides.amortized_fitted import FittedAmortized
from ppl_bdl.inference.vi.guides.amortized_refine import LOG_STEP_SIZE, Refinement
from ppl_bdl.inference.vi.guides.amortized_sites import global_layout, input_argument, local_plate
from ppl_bdl.inference.vi.guides.base import LOG_2PI, Guide, GuideInit, ParamLayout
from ppl_bdl.trace.layout import LatentLayout

#: The families of q(z_i | x_i): a diagonal Gaussian in the unconstrained space of each site.
FAMILIES = ("normal",)
#: The prefix of the encoder's weights among the guide's parameters.
ENCODER = "encoder:"
#: The prefix of a refinement's parameters (its adapted step size).
REFINE = "refine:"
#: Points encoded per call outside the training loop (bounds the activations held at once).
ENCODE_CHUNK = 4096


class Amortized:
    """An amortized guide, as ``fit(..., method="vi", guide=guides.Amortized(encoder, ...))``.

    Parameters
    ----------
    encoder : ppl_bdl.dsl.nn.Module
        A :mod:`ppl_bdl.dsl.nn` network or a lifted torch / equinox module (:func:`ppl_bdl.dsl.nn.lift`)
        that maps a batch of inputs ``(B, *event)`` to (B, 2·d): [μ, ρ] of q(z_i | x_i) with σ =
        softplus(ρ), d the number of unconstrained coordinates of one point's local sites, in the
        order of ``sites``. ("Bayesian Computation in Deep Learning" has g_φ(x) = [μ, log σ], Section 3.3.1, with softplus in
        place of exp, as the mean-field guide's σ: σ then grows linearly in the encoder's last
        layer, not exponentially, and the first steps on inputs that are not standardised do
        not overflow.) Its weights are the guide's parameters,
        started at a lifted module's own values or at a draw of each weight's prior (give it a
        fan-scaled prior: ``nn.he_normal()``).
    sites : list of str
        The local latent sites: every latent site inside the data plate (the plate of the
        observed sites), each in that plate only, with one value per point.
    family : str
        ``"normal"``: a diagonal Gaussian in each site's unconstrained space.
    inputs : str, optional
        The model argument the encoder reads, indexed by the plate's points (default: the one
        array argument whose first axis has the plate's size).
    global_guide : str
        The registered guide (``"meanfield"``, ``"lowrank"``, ``"delta"``, ...) of the model's
        other latent sites; the fit's guide settings (``init_scale=``, ``rank=``) go to it.
    refine_steps : int
        T >= 0: each draw z_0 ~ q_0(z | x) of the encoder is refined by T steps of a Markov
        kernel that leaves p(z | x, θ) invariant, and the model is fitted on the refined draws
        (:mod:`ppl_bdl.inference.vi.guides.amortized_refine`; Hoffman 2017). 0: none.
    refine_kernel : str
        ``"hmc"`` (Metropolis-adjusted HMC) or ``"langevin"`` (MALA, Metropolis-adjusted).
    refine_step_size : float
        The kernel's step size, in the coordinates (z − μ_φ(x)) / σ_φ(x) the encoder standardises.
    refine_leapfrog : int
        Leapfrog steps of one HMC step (``"langevin"``: 1).
    refine_target_accept : float, optional
        None: a fixed step size. A number in (0, 1): the step size is adapted during training
        toward this mean acceptance probability (then fitted as the guide's
        ``refine:log_step_size``).

    Example
    -------
    >>> from ppl_bdl import guides, nn
    >>> guides.Amortized(nn.MLP("enc", [4, 16, 4]), sites=["z"])
    Amortized(encoder='enc', sites=['z'], family='normal', global_guide='meanfield')
    """

    name = "amortized"

    def __init__(
        self,
        encoder: Module,
        sites: Sequence[str] | str = ("z",),
        family: str = "normal",
        inputs: str | None = None,
        global_guide: str = "meanfield",
        refine_steps: int = 0,
        refine_kernel: str = "hmc",
        refine_step_size: float = 0.25,
        refine_leapfrog: int = 4,
        refine_target_accept: float | None = None,
    ):
        if not isinstance(encoder, Module):
            raise ConfigError(
                f"Amortized: the encoder must be a ppl_bdl.dsl.nn network (nn.MLP, nn.Sequential, ...) "
                f"or a lifted torch/equinox module (nn.lift(module)); got "
                f"{type(encoder).__name__}. It maps a batch of inputs to [mu, rho], sigma = softplus(rho)."
            )
        sites = [sites] if isinstance(sites, str) else list(sites)
        if (
            not sites
            or not all(isinstance(s, str) and s for s in sites)
            or len(set(sites)) < len(sites)
        ):
            raise ConfigError(
                f"Amortized: sites must be a non-empty list of distinct site names (the local "
                f"latent sites inside the data plate), got {sites!r}."
            )
        if family not in FAMILIES:
            raise one_of("Amortized family", family, FAMILIES)
        if inputs is not None and not (isinstance(inputs, str) and inputs):
            raise ConfigError(f"Amortized: inputs must be an argument name, got {inputs!r}.")
        if not isinstance(global_guide, str):
            raise ConfigError(
                f"Amortized: global_guide must be the name of a registered guide ('meanfield', "
                f"'lowrank', 'delta', ...), got {type(global_guide).__name__}."
            )
        self.encoder, self.sites, self.family = encoder, sites, family
        self.inputs, self.global_guide = inputs, global_guide
        self.refinement = Refinement.build(
            refine_steps, refine_kernel, refine_step_size, refine_leapfrog, refine_target_accept
        )

    def __repr__(self) -> str:
        r = self.refinement
        refine = f", refine_steps={r.steps}, refine_kernel={r.kernel!r}" if r.steps else ""
        return (
            f"Amortized(encoder={self.encoder.path!r}, sites={self.sites}, "
            f"family={self.family!r}, global_guide={self.global_guide!r}{refine})"
        )


class AmortizedGuide(Guide):
    """An :class:`Amortized` guide built on one model (see the module docstring).

    Over the flat unconstrained vector of *all* latent sites (so a fitted guide draws, scores
    and feeds the posterior as every guide does: the local sites at every point of the data),
    and, for the per-point objectives, piece by piece: :meth:`encode` (loc, scale of the
    minibatch's points), :meth:`global_draw`, :meth:`local_sites`.

    ``global_guide(layout, init)`` builds the guide of the global sites on their own layout
    (None when the model has none); ``init()`` gives the global guide's starting point.
    """

    name = "amortized"

    def __init__(
        self,
        spec: Amortized,
        trace,
        layout: LatentLayout,
        params: dict,
        seed: int,
        batch_size: int | None,
        init: Callable[[], GuideInit],
        global_guide: Callable,
    ):
        super().__init__(layout, trace.backend, None, seed)
        self.spec, self.trace, self.params = spec, trace, params
        self.plate, self.size = local_plate(spec.sites, trace, layout)
        self.batch = self.size if batch_size is None else int(batch_size)
        slots = {s.name: s for s in layout.slots}
        #: (site, unconstrained shape of one point, its size), in ``spec.sites`` order.
        self.local = [
            (n, slots[n].unconstrained_shape[1:], slots[n].size // self.size) for n in spec.sites
        ]
        self.local_dim = sum(size for _, _, size in self.local)
        self.global_layout, self.global_index = global_layout(layout, set(spec.sites))
        self.global_guide = None
        if self.global_layout.dim:
            full = init()
            idx = self.global_index
            sub = GuideInit(loc=full.loc[idx], prior_scale=full.prior_scale[idx])
            self.global_guide = global_guide(self.global_layout, sub)
        self.input_name, self.input_index = input_argument(
            trace.bound, trace.backend, spec.inputs, self.size
        )
        self.encoder = spec.encoder
        self._encoder_init = initial_values(self.encoder, self.backend, seed)
        shapes = {} if self.global_guide is None else dict(self.global_guide.param_layout.shapes)
        shapes.update({ENCODER + k: v.shape for k, v in self._encoder_init.items()})
        self.refinement = spec.refinement
        if self.refinement.adapts:
            shapes[LOG_STEP_SIZE] = (1,)
        self.param_layout = ParamLayout(shapes)
        self._check_encoder()

    # -- pieces of the per-point objectives --------------------------------------------------
    def split_params(self, params: dict) -> tuple[dict, dict]:
        """(the global guide's parameters, the encoder's weights by site name)."""
        enc = {k[len(ENCODER) :]: v for k, v in params.items() if k.startswith(ENCODER)}
        own = (ENCODER, REFINE)
        return {k: v for k, v in params.items() if not k.startswith(own)}, enc

    def encode(self, params: dict, x) -> tuple[Any, Any]:
        """loc and scale of q(z | x) for a batch of inputs ``x``: each (B, d), d =
        ``local_dim`` (the sites' unconstrained coordinates, in ``spec.sites`` order)."""
        _, enc = self.split_params(params)
        out = SampledNetwork(self.encoder, enc)(x)
        out = self.m.reshape(out, (int(x.shape[0]), 2 * self.local_dim))
        loc, rho = out[:, : self.local_dim], out[:, self.local_dim :]
        return loc, self.m.softplus(rho)

    def inputs(self, data) -> Any:
        """The encoder's input array among the data's arrays (``BoundModel.data_arrays``)."""
        return data[self.input_index]

    def global_noise_size(self) -> int:
        return 0 if self.global_guide is None else int(np.prod(self.global_guide.noise_shape(1)))

    def global_draw(self, params: dict, eps, path: bool = False) -> tuple[Any, Any]:
        """One draw θ_g (d_g,) of the global sites from flat noise ``eps`` and its log q (with
        ``path``, at the global guide's parameters held constant: the path derivative)."""
        if self.global_guide is None:
            return self.m.zeros((0,)), 0.0
        gparams, _ = self.split_params(params)
        theta, log_q = self.global_guide.transform(
            gparams, self.m.reshape(eps, self.global_guide.noise_shape(1))
        )
        if path:  # Roeder et al. 2017, Eq. 8
            fixed = {k: self.m.stop_gradient(v) for k, v in gparams.items()}
            log_q = self.global_guide.log_prob(fixed, theta)
        return theta[0], log_q[0]

    def local_sites(self, z) -> dict[str, Any]:
        """Rows of local coordinates z (R, d) -> each local site's unconstrained values
        ``(R, *point shape)``."""
        rows = int(z.shape[0])
        sizes = [size for _, _, size in self.local]
        pieces = self.m.split(z, sizes, axis=-1) if len(sizes) > 1 else [z]
        return {
            name: self.m.reshape(piece, (rows,) + shape)
            for (name, shape, _), piece in zip(self.local, pieces, strict=True)
        }

    def global_sites(self, theta_g) -> dict[str, Any]:
        return self.global_layout.unflatten(theta_g, self.backend) if self.global_layout.dim else {}

    def noise_shape(self, num: int) -> tuple[int]:
        """The noise of one training step of ``num`` particles, flat: one draw of the global
        sites, then ``num`` draws of the local coordinates of the ``batch`` points, then their
        chains' noise (a refinement's)."""
        rows = num * self.batch
        chains = self.refinement.noise_size(rows, self.local_dim)
        return (self.global_noise_size() + rows * self.local_dim + chains,)

    def step_size(self, params: dict) -> Any:
        """The refinement's step size: fixed, or the adapted one in ``params``."""
        if not self.refinement.adapts:
            return self.refinement.step_size
        return self.m.exp(self.m.reshape(params[LOG_STEP_SIZE], ()))

    def refine(self, density, params, z0, loc, scale, theta_g, data, rows, model_params, noise):
        """The refined draws z_T (R, d) of the rows ``rows`` of the data plate from z_0 (R, d),
        q_0's loc and scale (R, d), at the global draw θ_g, and the mean acceptance
        probability; ``noise`` (T, R, d + 4). Everything is held constant (no gradient)."""
        m = self.m
        sites = self.global_sites(m.stop_gradient(theta_g))
        if model_params is not None:
            model_params = {k: m.stop_gradient(v) for k, v in model_params.items()}

        def log_density(z):
            return density({**sites, **self.local_sites(z)}, data, rows, model_params)[1]

        step = m.stop_gradient(self.step_size(params))
        fixed = [m.stop_gradient(a) for a in (loc, scale, z0)]
        z, accept = hmc_chains(
            log_density, *fixed, noise, step, self.refinement.leapfrog, self.backend
        )
        return m.stop_gradient(z), m.stop_gradient(accept)

    # -- the guide over the whole flat vector (the fitted guide, the posterior) ---------------
    def initial_params(self) -> dict[str, np.ndarray]:
        params = {} if self.global_guide is None else self.global_guide.initial_params()
        params.update({ENCODER + k: v for k, v in self._encoder_init.items()})
        if self.refinement.adapts:
            params[LOG_STEP_SIZE] = np.full(1, np.log(self.refinement.step_size))
        return params

    def encode_all(self, params: dict, X) -> tuple[Any, Any]:
        """loc, scale (n, d) of every row of ``X``, encoded in chunks."""
        parts = [
            self.encode(params, X[s : s + ENCODE_CHUNK])
            for s in range(0, int(X.shape[0]), ENCODE_CHUNK)
        ]
        if len(parts) == 1:
            return parts[0]
        return tuple(self.m.concatenate([p[i] for p in parts], axis=0) for i in (0, 1))

    def sample(self, params: dict, key, num: int, mask=None):
        """``num`` draws of the whole flat vector: the global sites from their guide, every
        point's local sites from q(z_i | x_i); and their log q."""
        m, backend = self.m, self.backend
        k_global, k_local = backend.random.split(key)
        loc, scale = self.encode_all(params, self.inputs(self.trace.bound.data_arrays(backend)[0]))
        eps = backend.random.normal(k_local, (num,) + tuple(loc.shape))
        z = loc + scale * eps
        log_q = m.sum(m.reshape(-m.log(scale) - 0.5 * eps * eps, (num, -1)), axis=1)
        log_q = log_q - 0.5 * self.size * self.local_dim * LOG_2PI
        theta_g = m.zeros((num, 0))
        if self.global_guide is not None:
            theta_g, log_q_g = self.global_guide.sample(self.split_params(params)[0], k_global, num)
            log_q = log_q + log_q_g
        return self._assemble(theta_g, z), log_q

    def log_prob(self, params: dict, theta):
        """log q of flat vectors ``theta`` (n, D): the global guide's and every point's."""
        m, backend = self.m, self.backend
        n = int(theta.shape[0])
        loc, scale = self.encode_all(params, self.inputs(self.trace.bound.data_arrays(backend)[0]))
        slots = {s.name: s for s in self.layout.slots}
        parts = [
            m.reshape(
                theta[:, slots[name].offset : slots[name].offset + slots[name].size],
                (n, self.size, size),
            )
            for name, _, size in self.local
        ]
        z = parts[0] if len(parts) == 1 else m.concatenate(parts, axis=2)
        u = (z - loc) / scale
        out = m.sum(m.reshape(-m.log(scale) - 0.5 * u * u, (n, -1)), axis=1)
        out = out - 0.5 * self.size * self.local_dim * LOG_2PI
        if self.global_guide is not None:
            index = backend.asarray(self.global_index, "int")
            out = out + self.global_guide.log_prob(self.split_params(params)[0], theta[:, index])
        return out

    def transform(self, params, eps, mask=None):
        raise NotImplementedError(
            "an amortized guide draws with sample() (the whole vector) or piece by piece for "
            "the per-point objectives (ppl_bdl.inference.vi.objectives_amortized)."
        )

    def fitted(self, phi, settings: dict | None = None) -> FittedAmortized:
        return FittedAmortized(self, phi, settings)

    def describe(self, params: dict) -> dict[str, np.ndarray]:
        gparams, enc = self.split_params(params)
        out = {} if self.global_guide is None else self.global_guide.describe(gparams)
        out.update({ENCODER + k: np.asarray(v) for k, v in enc.items()})
        if LOG_STEP_SIZE in params:
            out["refine:step_size"] = np.exp(np.asarray(params[LOG_STEP_SIZE]))
        return out

    def _assemble(self, theta_g, z):
        """The flat vectors (n, D) from global draws (n, d_g) and local ones (n, N, d)."""
        m, n = self.m, int(z.shape[0])
        local_at, start = {}, 0
        for name, _, size in self.local:
            local_at[name] = (start, size)
            start += size
        parts, g = [], 0
        for slot in self.layout.slots:
            if slot.name in local_at:
                a, size = local_at[slot.name]
                parts.append(m.reshape(z[:, :, a : a + size], (n, slot.size)))
            else:
                parts.append(theta_g[:, g : g + slot.size])
                g += slot.size
        return parts[0] if len(parts) == 1 else m.concatenate(parts, axis=1)

    def _check_encoder(self) -> None:
        backend = self.backend
        X = self.inputs(self.trace.bound.data_arrays(backend)[0])
        probe = X[: min(2, self.size)]
        want = (int(probe.shape[0]), 2 * self.local_dim)
        with backend.scope(), backend.activate():
            values = {k: backend.asarray(v) for k, v in self._encoder_init.items()}
            try:
                out = SampledNetwork(self.encoder, values)(probe)
            except ModelError as err:
                raise ModelError(
                    f"the encoder {self.encoder.path!r} failed on a batch of the input "
                    f"{self.input_name!r} of shape {tuple(probe.shape)}: {err}"
                ) from err
        seen = tuple(int(s) for s in out.shape)
        if seen != want:
            sizes = " + ".join(f"{size} ({name})" for name, _, size in self.local)
            raise ModelError(
                f"the encoder {self.encoder.path!r} maps the inputs {self.input_name!r} of shape "
                f"{tuple(probe.shape)} to shape {seen}; q(z|x) of the sites {self.spec.sites} "
                f"needs {want}: 2 x ({sizes}) = {want[1]} outputs per point, [mu, rho] (sigma = softplus(rho)) of "
                "the sites' unconstrained coordinates in the order of sites=. End the encoder "
                f"with a layer of {want[1]} outputs."
            )


def log_normal(eps, scale, m) -> Any:
    """log N(z; loc, scale²) at z = loc + scale · eps, summed over the last axis."""
    return m.sum(-m.log(scale) - 0.5 * eps * eps, axis=-1) - 0.5 * int(eps.shape[-1]) * LOG_2PI


__all__ = ["ENCODER", "FAMILIES", "Amortized", "AmortizedGuide", "log_normal"]
