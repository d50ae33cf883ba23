"""A variational auto-encoder on the stroke images of :mod:`ppl_bdl.models.images`: Algorithm 4 of
"Bayesian Computation in Deep Learning" (Kingma & Welling 2014), written in the DSL and fitted by ``method="vi"`` with an
amortized guide (:class:`ppl_bdl.inference.vi.guides.Amortized`).

The model: z_i ~ N(0, I) (``latent_dim``), x_i | z_i ~ Bernoulli(logits = f_θ(z_i)) on binarised
pixels, or N(f_θ(z_i), σ²) on grey levels (σ a ``bdl.param``); the decoder f_θ is a dense or a
convolutional :mod:`ppl_bdl.dsl.nn` network whose weights are ``bdl.param`` sites (fitted by maximum
likelihood, as in the VAE of the text), or sample sites with He priors
(``bayesian_decoder=True``: their guide is the amortized guide's global one, mean-field by
default). The encoder g_φ(x) = [μ_φ(x), ρ_φ(x)] (σ = softplus(ρ)) is the mirror network.

``python -m ppl_bdl.models.vae --backend numpyro`` fits one and prints the per-point ELBO and
IWAE bounds on held-out images (``--architecture conv``, ``--likelihood gaussian``,
``--objective iwae --num-particles 5``).

Example
-------
>>> from ppl_bdl.models import vae
>>> post, X = vae.fit_vae("numpyro", n=64, size=8, latent_dim=2, hidden=16, num_steps=20,
...                       batch_size=16, num_samples=2)
>>> loc, scale = post.encode(X[:3])["z"]
>>> loc.shape
(3, 2)
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

import ppl_bdl as bdl
from ppl_bdl import dist, guides, nn
from ppl_bdl import math as bm
from ppl_bdl.errors import ConfigError
from ppl_bdl.models import images

#: The settings of a fit (Algorithm 4 of "Bayesian Computation in Deep Learning": minibatch SGD on the ELBO, here Adam):
#: 64 images per step, lr 1e-3 decayed on a cosine.
SETTINGS: dict[str, Any] = dict(batch_size=64, lr=1e-3, schedule="cosine", num_samples=10)
LIKELIHOODS = ("bernoulli", "gaussian")
ARCHITECTURES = ("dense", "conv")


def stroke_images(n: int = 1000, size: int = 16, likelihood: str = "bernoulli", seed: int = 0):
    """Stroke images (n, 1, size, size), float32: binarised (pixel > 0.4) for the Bernoulli
    likelihood, grey levels with little noise for the Gaussian one."""
    X, _ = images.make_stroke_images(n=n, num_classes=4, size=size, noise=0.05, seed=seed)
    return (X > 0.4).astype(np.float32) if likelihood == "bernoulli" else X


def upsample2(x):
    """Nearest-neighbour upsampling of NCHW images by 2 (each pixel repeated 2 x 2)."""
    n, c, h, w = (int(s) for s in x.shape)
    repeated = x[:, :, :, None, :, None] * bm.ones((1, 1, 1, 2, 1, 2))
    return bm.reshape(repeated, (n, c, 2 * h, 2 * w))


def networks(architecture: str, size: int, latent_dim: int, hidden: int = 256):
    """(encoder, decoder) :mod:`ppl_bdl.dsl.nn` networks for ``size`` x ``size`` one-channel
    images: the encoder maps (B, 1, size, size) to (B, 2 · latent_dim), the decoder (B,
    latent_dim) to (B, 1, size, size) (logits or means)."""
    if architecture not in ARCHITECTURES:
        raise ConfigError(f"architecture must be one of {ARCHITECTURES}, got {architecture!r}.")
    pixels = size * size

    def to_image(x):
        return bm.reshape(x, (int(x.shape[0]), 1, size, size))

    if architecture == "dense":
        encoder = nn.Sequential(
            "encoder",
            [
                nn.Flatten(),
                nn.Dense("hidden", pixels, hidden),
                "relu",
                nn.Dense("out", hidden, 2 * latent_dim),
            ],
            prior=nn.he_normal(),
        )
        decoder = nn.Sequential(
            "decoder",
            [
                nn.Dense("hidden", latent_dim, hidden),
                "relu",
                nn.Dense("out", hidden, pixels),
                to_image,
            ],
            prior=nn.he_normal(),
        )
        return encoder, decoder
    if size % 4:
        raise ConfigError(
            f"the conv networks halve the image twice: size must be a multiple of 4, got {size}."
        )
    quarter = size // 4

    def to_maps(x):
        return bm.reshape(x, (int(x.shape[0]), 32, quarter, quarter))

    encoder = nn.Sequential(
        "encoder",
        [
            nn.Conv2d("conv1", 1, 16, 3, stride=2, padding=1),
            "relu",
            nn.Conv2d("conv2", 16, 32, 3, stride=2, padding=1),
            "relu",
            nn.Flatten(),
            nn.Dense("out", 32 * quarter * quarter, 2 * latent_dim),
        ],
        prior=nn.he_normal(),
    )
    decoder = nn.Sequential(
        "decoder",
        [
            nn.Dense("hidden", latent_dim, 32 * quarter * quarter),
            "relu",
            to_maps,
            upsample2,
            nn.Conv2d("conv1", 32, 16, 3, padding=1),
            "relu",
            upsample2,
            nn.Conv2d("conv2", 16, 1, 3, padding=1),
        ],
        prior=nn.he_normal(),
    )
    return encoder, decoder


def initial_weights(network: nn.Module, seed: int = 0) -> dict[str, np.ndarray]:
    """One draw of each weight's (Normal) prior, NumPy float32: where ``bdl.param`` weights
    start."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in network.sites().items():
        prior = network.priors()[name]
        loc, scale = (float(np.asarray(prior.params[k])) for k in ("loc", "scale"))
        out[name] = (loc + scale * rng.normal(size=shape)).astype(np.float32)
    return out


def vae_model(
    decoder: nn.Module,
    latent_dim: int,
    likelihood: str = "bernoulli",
    bayesian_decoder: bool = False,
    seed: int = 0,
):
    """The VAE's generative model as a ``@bdl.model`` of the images ``X`` (n, 1, size, size)."""
    if likelihood not in LIKELIHOODS:
        raise ConfigError(f"likelihood must be one of {LIKELIHOODS}, got {likelihood!r}.")
    init = None if bayesian_decoder else initial_weights(decoder, seed)

    @bdl.model
    def vae(X):
        if bayesian_decoder:
            f = decoder.sample()
        else:
            f = nn.SampledNetwork(decoder, {k: bdl.param(k, v) for k, v in init.items()})
        if likelihood == "gaussian":
            sigma = bdl.param("sigma", 0.1, constraint="positive")
        with bdl.plate("data", X.shape[0]) as idx:
            z = bdl.sample("z", dist.Normal(0.0, 1.0), shape=(latent_dim,))
            out = f(z)
            event = tuple(X.shape[1:])
            if likelihood == "bernoulli":
                bdl.sample("x", dist.Bernoulli(logits=out), obs=X[idx], shape=event)
            else:
                bdl.sample("x", dist.Normal(out, sigma), obs=X[idx], shape=event)

    return vae


def fit_vae(
    backend: str = "numpyro",
    n: int = 1000,
    size: int = 16,
    latent_dim: int = 4,
    likelihood: str = "bernoulli",
    architecture: str = "dense",
    hidden: int = 256,
    bayesian_decoder: bool = False,
    num_steps: int = 2000,
    seed: int = 0,
    **options: Any,
):
    """(the posterior, the images X) of a VAE fitted to ``n`` stroke images; ``options`` go to
    ``bdl.fit`` over :data:`SETTINGS` (``objective="iwae"``, ``num_particles=5``, ``lr=...``),
    those named ``refine_*`` to the amortized guide (``refine_steps=5``: its draws refined by
    MCMC, :mod:`ppl_bdl.inference.vi.guides.amortized_refine`)."""
    X = stroke_images(n, size, likelihood, seed)
    encoder, decoder = networks(architecture, size, latent_dim, hidden)
    model = vae_model(decoder, latent_dim, likelihood, bayesian_decoder, seed)
    refine = {k: options.pop(k) for k in list(options) if k.startswith("refine_")}
    settings = {**SETTINGS, **options}
    post = bdl.fit(
        model(X),
        backend=backend,
        method="vi",
        num_steps=num_steps,
        seed=seed,
        guide=guides.Amortized(encoder, sites=["z"], **refine),
        progress=False,
        **settings,
    )
    return post, X


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Fit a VAE to stroke images (Algorithm 4).")
    parser.add_argument("--backend", default="numpyro")
    parser.add_argument("--architecture", choices=ARCHITECTURES, default="dense")
    parser.add_argument("--likelihood", choices=LIKELIHOODS, default="bernoulli")
    parser.add_argument("--objective", choices=["elbo", "iwae"], default="elbo")
    parser.add_argument("--num-particles", type=int, default=1)
    parser.add_argument("--latent-dim", type=int, default=4)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--hidden", type=int, default=256, help="the networks' hidden width")
    parser.add_argument("--held-out", type=int, default=500, help="held-out images scored")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    post, X = fit_vae(
        args.backend,
        n=args.n,
        size=args.size,
        latent_dim=args.latent_dim,
        likelihood=args.likelihood,
        architecture=args.architecture,
        hidden=args.hidden,
        num_steps=args.steps,
        objective=args.objective,
        num_particles=args.num_particles,
    )
    print(
        f"fitted in {time.perf_counter() - start:.1f} s; last losses / point: "
        f"{np.mean(post.losses[-100:]) / args.n:.2f} nats"
    )
    test = stroke_images(args.held_out, args.size, args.likelihood, seed=1)
    for K in (1, 10, 100):
        bound = post.log_marginal(test, num_particles=K)
        label = f"IWAE_{K}" + (" (the ELBO)" if K == 1 else "")
        print(f"held-out {label}: {np.mean(bound.per_point):.3f} nats per image")


if __name__ == "__main__":
    main()
