"""A score-based diffusion model of the shipped stroke images, scored on held-out images against
baselines a working model should beat.

The data: 16 x 16 stroke images of :func:`ppl_bdl.models.ebm.stroke_images` (the EBM's: 4 stroke
angles with a blob, random length, width, place and contrast, pixel noise 0.05), flattened to
256 numbers and standardised by the training pixels' mean and standard deviation (two numbers);
disjoint training and held-out images from one draw. The model: a VP SDE (Song et al. 2021) and
an MLP score network (256 + 1 + 16 time inputs, two hidden SiLU layers of 1024, 256 outputs)
trained by ``bdl.diffusion.fit``'s weighted denoising score matching on each backend, one
thread.

Reported per backend:

- the held-out loss: the denoising score-matching objective (Eq. 3.11, λ(t) = σ(t)²) on the
  held-out images, ``model.loss_terms(X_held_out, seed=1, repeats=4)``: the same draws of
  (t, z) for every model, so differences are paired. Against the network before training, the
  zero score (D/2 exactly) and the exact score of the Gaussian N(x̄, Ĉ) fitted to the training
  images (``bdl.diffusion.fit_gaussian``);
- the energy distance (Székely and Rizzo 2013; ``bdl.diffusion.energy_distance``, pixel units)
  of each sampler's draws to the held-out images, against draws of that fitted Gaussian and
  against training images (the same law: the estimate's noise); and the share of draws with a
  pixel outside the training pixels' range;
- wall and CPU seconds of training and sampling.

Usage::

    python benchmarks/diffusion_images.py                     # both backends
    python benchmarks/diffusion_images.py --backends numpyro --steps 2000 --plot strokes.png
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import ppl_bdl as bdl
from ppl_bdl import nn
from ppl_bdl.inference.diffusion.trainer import ScoreTrainer
from ppl_bdl.models.ebm import stroke_images

SIZE, TIME_FEATURES, REPEATS = 16, 8, 4
#: One thread for XLA's CPU client (read when JAX starts).
XLA_ONE_THREAD = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


class Data:
    """Training and held-out images, flat, and the standardisation both share."""

    def __init__(self, n_train: int, n_held_out: int, seed: int):
        images = stroke_images(n_train + n_held_out, SIZE, seed).reshape(n_train + n_held_out, -1)
        self.train, self.held_out = images[:n_train], images[n_train:]
        self.mean, self.scale = float(self.train.mean()), float(self.train.std())

    def standardise(self, x: np.ndarray) -> np.ndarray:
        return ((x - self.mean) / self.scale).astype(np.float32)

    def pixels(self, z: np.ndarray) -> np.ndarray:
        return z * self.scale + self.mean


def heldout_loss(model, data: Data) -> np.ndarray:
    """The objective's terms on the held-out images (fixed seed: the same (t, z) for all)."""
    return model.loss_terms(data.standardise(data.held_out), seed=1, repeats=REPEATS)


def mean_and_error(terms: np.ndarray) -> str:
    return f"{terms.mean():.3f} ± {terms.std() / np.sqrt(len(terms)):.3f}"


def train(backend: str, data: Data, args) -> tuple:
    """(the trained model, the held-out loss terms before training, wall s, CPU s)."""
    dim = data.train.shape[1]
    net = nn.MLP(
        "score",
        [dim + 1 + 2 * TIME_FEATURES, args.hidden, args.hidden, dim],
        activation="silu",
        prior=nn.he_normal(),
    )
    trainer = ScoreTrainer(
        net,
        data.standardise(data.train),
        sde="vp",
        backend=backend,
        time_features=TIME_FEATURES,
        batch_size=args.batch_size,
        num_steps=args.steps,
        lr=args.lr,
        seed=args.seed,
    )
    untrained = heldout_loss(trainer.model, data)
    wall, cpu = time.perf_counter(), time.process_time()
    trainer.run(args.steps)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if trainer.failure is not None:
        raise RuntimeError(f"training stopped at step {trainer.failure.step}")
    return trainer.model, untrained, wall, cpu


def loss_table(model, untrained: np.ndarray, gaussian, data: Data) -> None:
    """The held-out loss of the trained network against the baselines (mean ± s.e.)."""
    trained, reference = heldout_loss(model, data), heldout_loss(gaussian, data)
    dim = data.train.shape[1]
    print("| score | held-out loss |")
    print("|---|---|")
    print(f"| trained network | {mean_and_error(trained)} |")
    print(f"| the network before training | {mean_and_error(untrained)} |")
    print(f"| zero score | {dim / 2:.3f} |")
    print(f"| Gaussian fitted to the training images (exact score) | {mean_and_error(reference)} |")
    print(f"| trained − Gaussian (paired) | {mean_and_error(trained - reference)} |")
    tail = model.losses[-len(model.losses) // 10 :].mean()
    print(f"(training loss over the last 10% of steps: {tail:.3f})")


def energy_table(model, gaussian_draws: np.ndarray, data: Data, args) -> dict:
    """Energy distances to the held-out images; the samples by sampler (pixel units)."""
    held_out = data.held_out[: args.draws]
    floor = bdl.diffusion.energy_distance(data.train[: args.draws], held_out)
    low, high = data.train.min(), data.train.max()
    print(
        "| draws | energy distance to held-out | pixel range | outside the data's range | "
        "sampling s (wall / CPU) |"
    )
    print("|---|---|---|---|---|")
    print(f"| training images (same law) | {floor:.4f} | | | |")
    gauss = bdl.diffusion.energy_distance(gaussian_draws, held_out)
    print(f"| Gaussian fitted to the training images | {gauss:.4f} | | | |")
    samples = {}
    for sampler in args.samplers:
        wall, cpu = time.perf_counter(), time.process_time()
        z = model.sample(args.draws, sampler=sampler, steps=args.sample_steps, seed=args.seed + 2)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        x = samples[sampler] = data.pixels(z)
        distance = bdl.diffusion.energy_distance(x, held_out)
        outside = ((x < low) | (x > high)).any(1).mean()
        print(
            f"| {sampler}, {args.sample_steps} steps | {distance:.4f} | "
            f"[{x.min():.2f}, {x.max():.2f}] | {outside:.3f} | {wall:.1f} / {cpu:.1f} |"
        )
    return samples


def plot(rows: dict, path: str, columns: int = 10) -> None:
    """One row of images per entry of ``rows`` (label -> flat images)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(rows), columns, figsize=(columns, 1.15 * len(rows)))
    low, high = np.percentile(rows["held-out images"], [0.5, 99.5])
    for row, (label, images) in zip(axes, rows.items(), strict=True):
        for i, ax in enumerate(row):
            ax.imshow(images[i].reshape(SIZE, SIZE), cmap="gray", vmin=low, vmax=high)
            ax.set_xticks([])
            ax.set_yticks([])
        row[0].set_ylabel(label, rotation=0, ha="right", va="center", fontsize=8)
    fig.suptitle("16 x 16 stroke images: data, a fitted Gaussian, VP diffusion samples")
    fig.savefig(path, dpi=72, bbox_inches="tight")
    print(f"saved {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", nargs="+", default=["numpyro", "pyro"])
    parser.add_argument("--n-train", type=int, default=5000)
    parser.add_argument("--n-held-out", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=8000, help="training steps")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1e-3, help="Adam, cosine decay")
    parser.add_argument("--hidden", type=int, default=1024, help="width of the 2 hidden layers")
    parser.add_argument("--samplers", nargs="+", default=["euler", "pc", "ode"])
    parser.add_argument("--draws", type=int, default=1000, help="draws per sampler")
    parser.add_argument("--sample-steps", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", default=None, help="save a grid of images here")
    args = parser.parse_args()
    os.environ.setdefault("XLA_FLAGS", XLA_ONE_THREAD)
    data = Data(args.n_train, args.n_held_out, args.seed)
    dim = data.train.shape[1]
    print(
        f"stroke images {SIZE}x{SIZE}: {args.n_train} training, {args.n_held_out} held out; VP "
        f"SDE, MLP {dim + 1 + 2 * TIME_FEATURES}-{args.hidden}-{args.hidden}-{dim} SiLU, batch "
        f"{args.batch_size}, Adam lr {args.lr:g} cosine, {args.steps} steps; one thread"
    )
    rng = np.random.default_rng(args.seed + 3)
    cov = np.cov(data.train.T, bias=True)
    gaussian_draws = rng.multivariate_normal(data.train.mean(0), cov, size=args.draws)
    rows = {"held-out images": data.held_out, "Gaussian fit": gaussian_draws}
    for backend in args.backends:
        bdl.backends.get(backend).set_threads(1)
        model, untrained, wall, cpu = train(backend, data, args)
        print(f"\n{backend}: trained in {wall:.1f} s wall, {cpu:.1f} s CPU")
        gaussian = bdl.diffusion.fit_gaussian(data.standardise(data.train), backend=backend)
        loss_table(model, untrained, gaussian, data)
        samples = energy_table(model, gaussian_draws, data, args)
        rows.update({f"{backend}, {name}": x for name, x in samples.items()})
    if args.plot:
        plot(rows, args.plot)


if __name__ == "__main__":
    main()
