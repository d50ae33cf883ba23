"""Mode coverage of score-based diffusion models on a 2-D Gaussian mixture with known, unequal
weights: do the samplers put each mode's share of the draws where the data has it?

The data: 8 components N(c_k, 0.15² I) with c_k on a circle of radius 2 and weights 0.24, 0.20,
0.16, 0.12, 0.10, 0.08, 0.06, 0.04 (the largest six times the smallest). A score network (a
SiLU MLP with Fourier features of t) is trained by ``bdl.diffusion.fit`` under the VP and the VE
SDE (Song et al. 2021) on each backend, and each sampler ("euler": reverse-SDE Euler-Maruyama,
"pc": predictor-corrector, "ode": the probability-flow ODE) draws from it. Per sampler:

- the share of draws nearest to each mode against the true weights: the largest absolute error
  and the modes covered (a share of at least half the mode's weight);
- the share of draws off every mode (farther than 4 standard deviations from the nearest);
- the energy distance (Székely and Rizzo 2013; ``bdl.diffusion.energy_distance``) to fresh
  draws of the mixture.

The row "fresh true draws" is a second sample of the mixture of the same size: the errors that
sampling alone leaves. Every process runs on one thread.

Usage::

    python benchmarks/diffusion_modes.py                          # both backends, VP and VE
    python benchmarks/diffusion_modes.py --backends numpyro --sdes vp --plot modes.png
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import ppl_bdl as bdl
from ppl_bdl import nn

RADIUS, SPREAD = 2.0, 0.15
WEIGHTS = np.array([0.24, 0.20, 0.16, 0.12, 0.10, 0.08, 0.06, 0.04])
ANGLES = 2 * np.pi * np.arange(len(WEIGHTS)) / len(WEIGHTS)
MODES = RADIUS * np.stack([np.cos(ANGLES), np.sin(ANGLES)], axis=1)
SAMPLERS = ("euler", "pc", "ode")
#: One thread for XLA's CPU client (read when JAX starts) and for torch.
XLA_ONE_THREAD = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


def ring_mixture(n: int, seed: int) -> np.ndarray:
    """n draws of the mixture (float32)."""
    rng = np.random.default_rng(seed)
    component = rng.choice(len(WEIGHTS), size=n, p=WEIGHTS)
    return (MODES[component] + SPREAD * rng.normal(size=(n, 2))).astype(np.float32)


def mode_coverage(x: np.ndarray) -> dict:
    """The share of the draws nearest to each mode, how far from the weights, the modes
    covered and the share off every mode."""
    distance = np.linalg.norm(x[:, None, :] - MODES[None], axis=-1)
    nearest = distance.argmin(1)
    shares = np.bincount(nearest, minlength=len(WEIGHTS)) / len(x)
    return {
        "shares": shares,
        "max_error": float(np.abs(shares - WEIGHTS).max()),
        "covered": int((shares >= WEIGHTS / 2).sum()),
        "off_mode": float((distance.min(1) > 4 * SPREAD).mean()),
    }


def train(backend: str, sde: str, X: np.ndarray, args) -> tuple:
    """(the fitted ScoreModel, wall seconds, CPU seconds)."""
    features = 4
    net = nn.MLP(
        "score",
        [2 + 1 + 2 * features, args.hidden, args.hidden, args.hidden, 2],
        activation="silu",
        prior=nn.he_normal(),
    )
    wall, cpu = time.perf_counter(), time.process_time()
    model = bdl.diffusion.fit(
        net,
        X,
        sde=sde,
        backend=backend,
        time_features=features,
        batch_size=256,
        num_steps=args.steps,
        lr=2e-3,
        seed=args.seed,
    )
    return model, time.perf_counter() - wall, time.process_time() - cpu


def table_row(label: str, x: np.ndarray, reference: np.ndarray, seconds: float | None) -> str:
    cover = mode_coverage(x)
    shares = " ".join(f"{s:.3f}" for s in cover["shares"])
    energy = bdl.diffusion.energy_distance(x, reference)
    timing = "" if seconds is None else f"{seconds:.1f}"
    return (
        f"| {label} | {cover['max_error']:.3f} | {cover['covered']}/{len(WEIGHTS)} | "
        f"{cover['off_mode']:.3f} | {energy:.4f} | {shares} | {timing} |"
    )


def run_case(backend: str, sde: str, X: np.ndarray, args) -> dict:
    """Train one model, draw with each sampler, print its table; the draws by sampler."""
    model, wall, cpu = train(backend, sde, X, args)
    print(
        f"\n{backend}, {sde.upper()} SDE: {args.steps} steps trained in {wall:.1f} s wall, "
        f"{cpu:.1f} s CPU (final loss {model.losses[-len(model.losses) // 10 :].mean():.4f})"
    )
    print(
        "| sampler | max share error | modes covered | off-mode | energy distance | "
        "shares | sampling s |"
    )
    print("|---|---|---|---|---|---|---|")
    reference = ring_mixture(args.draws, seed=args.seed + 2)
    fresh = ring_mixture(args.draws, seed=args.seed + 3)
    print(table_row("fresh true draws", fresh, reference, None))
    draws = {"true draws": fresh}
    for sampler in SAMPLERS:
        start = time.perf_counter()
        x = model.sample(args.draws, sampler=sampler, steps=args.sample_steps, seed=args.seed + 1)
        draws[sampler] = x
        print(table_row(sampler, x, reference, time.perf_counter() - start))
    return draws


def plot(results: dict, path: str) -> None:
    """One row per (backend, SDE): the true draws, then each sampler's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = len(results)
    fig, axes = plt.subplots(rows, 4, figsize=(10, 2.6 * rows), squeeze=False)
    for row, ((backend, sde), draws) in zip(axes, results.items(), strict=True):
        for ax, (label, x) in zip(row, draws.items(), strict=True):
            ax.scatter(x[:, 0], x[:, 1], s=1, alpha=0.4, rasterized=True)
            ax.scatter(MODES[:, 0], MODES[:, 1], s=12, c="k", marker="x")
            ax.set_title(f"{label} ({backend}, {sde.upper()})", fontsize=8)
            ax.set_xlim(-3, 3)
            ax.set_ylim(-3, 3)
            ax.set_aspect("equal")
            ax.set_xticks([])
            ax.set_yticks([])
    fig.suptitle(
        "8-mode ring, weights 0.24 to 0.04 anticlockwise from (2, 0): data and samplers",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    print(f"saved {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", nargs="+", default=["numpyro", "pyro"])
    parser.add_argument("--sdes", nargs="+", default=["vp", "ve"], choices=["vp", "ve"])
    parser.add_argument("--n", type=int, default=4000, help="training points")
    parser.add_argument("--steps", type=int, default=4000, help="training steps")
    parser.add_argument("--hidden", type=int, default=128, help="width of the 3 hidden layers")
    parser.add_argument("--draws", type=int, default=4000, help="draws per sampler")
    parser.add_argument("--sample-steps", type=int, default=500, help="time steps per sampler")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", default=None, help="save a figure of the draws here")
    args = parser.parse_args()
    os.environ.setdefault("XLA_FLAGS", XLA_ONE_THREAD)
    X = ring_mixture(args.n, seed=args.seed)
    print(
        f"8-mode ring mixture, weights {WEIGHTS.tolist()}, N = {args.n}; MLP "
        f"11-{args.hidden}-{args.hidden}-{args.hidden}-2 SiLU, batch 256, Adam lr 2e-3 cosine; "
        f"{args.draws} draws, {args.sample_steps} sampler steps; one thread"
    )
    results = {}
    for backend in args.backends:
        bdl.backends.get(backend).set_threads(1)
        for sde in args.sdes:
            results[backend, sde] = run_case(backend, sde, X, args)
    if args.plot:
        plot(results, args.plot)


if __name__ == "__main__":
    main()
