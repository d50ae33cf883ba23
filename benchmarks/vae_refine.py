"""Held-out log-likelihood of the shipped VAE fitted without and with MCMC-refined draws
(``guides.Amortized(..., refine_steps=T)``; Hoffman 2017), in one process.

Both fits: ``models/vae.py`` (Bernoulli pixels, dense networks), the same data, seed, steps and
optimizer; the refined one runs T HMC steps per draw (``refine_leapfrog`` leapfrog steps, the
step size adapted toward a mean acceptance of 0.8) and fits the decoder on the refined draws.
Printed: seconds per fit and their ratio, and the held-out log p(x) per image (the IWAE estimate
with K particles, ``post.log_marginal``, which uses q_0 as its proposal in both) with the
standard error of the mean per-image difference.

Usage::

    python benchmarks/vae_refine.py --n 1000 --size 12 --steps 3000 --refine-steps 5
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from ppl_bdl.models import vae


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="numpyro")
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--size", type=int, default=12)
    parser.add_argument("--latent-dim", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--refine-steps", type=int, default=5)
    parser.add_argument("--leapfrog", type=int, default=4)
    parser.add_argument("--held-out", type=int, default=500)
    parser.add_argument("--particles", type=int, default=500)
    args = parser.parse_args(argv)
    common = dict(
        n=args.n,
        size=args.size,
        latent_dim=args.latent_dim,
        hidden=args.hidden,
        num_steps=args.steps,
        batch_size=50,
        lr=3e-3,
        num_samples=2,
    )
    test = vae.stroke_images(args.held_out, args.size, seed=1)
    scores, seconds = [], []
    refined = dict(
        refine_steps=args.refine_steps, refine_leapfrog=args.leapfrog, refine_target_accept=0.8
    )
    for refine in ({}, refined):
        start = time.perf_counter()
        post, _ = vae.fit_vae(args.backend, **common, **refine)
        seconds.append(time.perf_counter() - start)
        scores.append(post.log_marginal(test, num_particles=args.particles).per_point)
        step = post.guide.params.get("refine:step_size")
        print(
            f"T={refine.get('refine_steps', 0)}: fit {seconds[-1]:.1f} s, held-out log p(x) "
            f"{scores[-1].mean():.3f} nats per image"
            + ("" if step is None else f", adapted step size {float(step[0]):.3f}")
        )
    diff = scores[1] - scores[0]
    print(
        f"refined - plain: {diff.mean():+.3f} nats per image (se {diff.std(ddof=1) / np.sqrt(len(diff)):.3f}); "
        f"time ratio {seconds[1] / seconds[0]:.2f}"
    )


if __name__ == "__main__":
    main()
