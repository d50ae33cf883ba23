"""Energy-based models trained by Algorithm 3 of "Bayesian Computation in Deep Learning" (``bdl.ebm``), on shipped data:
points in the plane (a Gaussian mixture, two rings) and the stroke images of
:mod:`ppl_bdl.models.images`.

``python -m ppl_bdl.models.ebm --data mixture --backend numpyro`` trains one and prints how its
samples compare with the data (``--data rings`` or ``strokes``; ``--plot ebm.png`` draws them).

Example
-------
>>> from ppl_bdl.models import ebm
>>> X, model = ebm.fit_2d("numpyro", data="mixture", n=300, hidden=(8,), num_steps=20,
...                       chain_steps=2)
>>> model.sample(100).shape
(100, 2)
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

import ppl_bdl as bdl
from ppl_bdl import nn
from ppl_bdl.models import images

#: Settings of the 2-D examples: persistent SGLD chains of K = 20 steps at α = 0.01 (Eq. 3.7),
#: 1000 Adam updates with a cosine learning rate, so that θ settles and long chains from noise
#: sample the data's law (tests/test_ebm.py checks the moments).
SETTINGS_2D: dict[str, Any] = dict(
    sampler="sgld",
    chain_steps=20,
    step_size=0.01,
    persistent=True,
    batch_size=100,
    num_steps=1000,
    lr=2e-3,
    lr_schedule="cosine",
)
#: The stroke images (16 x 16): Langevin at a low temperature (drift α ∇E with α = 0.1, noise
#: √(2αT) = 0.014 per pixel: it samples exp(−E/T)), K = 40 steps kept in the pixels' range, and a
#: small energy regulariser (Du and Mordatch 2019). 1000 updates: about 3 minutes on a laptop
#: CPU; the buffer's images have the data's pixel spread and a mean image within 0.12 pixel sd.
SETTINGS_STROKES: dict[str, Any] = dict(
    sampler="sgld",
    chain_steps=40,
    step_size=0.1,
    temperature=1e-3,
    clip=True,
    energy_l2=0.1,
    persistent=True,
    batch_size=64,
    num_steps=1000,
    lr=1e-3,
    lr_schedule="cosine",
)


def gaussian_mixture_2d(n: int = 2000, seed: int = 0) -> np.ndarray:
    """n points of three equally weighted components N(c_k, 0.4² I), c_k = (−1.5, 0), (1.5, 0),
    (0, 1.5)."""
    rng = np.random.default_rng(seed)
    centers = np.array([[-1.5, 0.0], [1.5, 0.0], [0.0, 1.5]])
    return centers[rng.integers(0, 3, n)] + 0.4 * rng.normal(size=(n, 2))


def rings_2d(n: int = 2000, radii=(1.0, 2.0), noise: float = 0.1, seed: int = 0) -> np.ndarray:
    """n points on concentric circles (equally many per ring) with Gaussian noise."""
    rng = np.random.default_rng(seed)
    radius = np.asarray(radii, dtype=float)[rng.integers(0, len(radii), n)]
    angle = rng.uniform(0.0, 2 * np.pi, n)
    ring = np.stack([radius * np.cos(angle), radius * np.sin(angle)], axis=1)
    return ring + noise * rng.normal(size=(n, 2))


def energy_mlp(in_features: int = 2, hidden=(64, 64), name: str = "energy") -> nn.MLP:
    """E(x): an MLP with SiLU units (smooth, so ∇_x E is too) and one output."""
    return nn.MLP(name, [in_features, *hidden, 1], activation="silu", prior=nn.he_normal())


def energy_cnn(size: int = 16, channels: int = 1, width: int = 16) -> nn.Sequential:
    """E(x) of images (N, C, size, size): two stride-2 convolutions, then one linear output."""
    final = width * 2 * ((size + 3) // 4) ** 2
    return nn.Sequential(
        "energy",
        [
            nn.Conv2d("conv1", channels, width, 3, stride=2, padding=1),
            "silu",
            nn.Conv2d("conv2", width, 2 * width, 3, stride=2, padding=1),
            "silu",
            nn.Flatten(),
            nn.Dense("out", final, 1),
        ],
        prior=nn.he_normal(),
    )


def stroke_images(n: int = 1000, size: int = 16, seed: int = 0) -> np.ndarray:
    """Stroke images (N, 1, size, size) of :func:`images.make_stroke_images` (4 angles, little
    pixel noise); the labels are not used."""
    X, _ = images.make_stroke_images(n=n, num_classes=4, size=size, noise=0.05, seed=seed)
    return X


def fit_2d(
    backend: str = "numpyro",
    data: str = "mixture",
    n: int = 2000,
    seed: int = 0,
    hidden=(64, 64),
    **options: Any,
):
    """(X, the trained EnergyModel) on ``data`` ("mixture" or "rings"), with an MLP energy of
    ``hidden`` widths; ``options`` override :data:`SETTINGS_2D`."""
    X = {"mixture": gaussian_mixture_2d, "rings": rings_2d}[data](n, seed=seed)
    settings = {**SETTINGS_2D, **options}
    return X, bdl.ebm.fit(energy_mlp(hidden=hidden), X, backend=backend, seed=seed, **settings)


def fit_strokes(
    backend: str = "numpyro", n: int = 1000, size: int = 16, seed: int = 0, **options: Any
):
    """(X, the trained EnergyModel) on stroke images of ``size`` x ``size``."""
    X = stroke_images(n, size, seed)
    settings = {**SETTINGS_STROKES, **options}
    return X, bdl.ebm.fit(energy_cnn(size), X, backend=backend, seed=seed, **settings)


def compare(X: np.ndarray, x: np.ndarray) -> dict[str, float]:
    """How draws ``x`` compare with the data ``X``: the mean difference in units of the data's sd
    (largest coordinate) and the relative difference of the covariances (Frobenius)."""
    X2, x2 = X.reshape(len(X), -1), x.reshape(len(x), -1)
    mean = float(np.max(np.abs(x2.mean(0) - X2.mean(0)) / (X2.std(0) + 1e-12)))
    cov = np.cov(X2.T)
    rel = float(np.linalg.norm(np.cov(x2.T) - cov) / np.linalg.norm(cov))
    return {"mean_error_sd": round(mean, 3), "cov_error_rel": round(rel, 3)}


def compare_images(X: np.ndarray, x: np.ndarray) -> dict[str, float]:
    """How images ``x`` compare with ``X``: the RMS difference of the mean images and the pixel
    standard deviations (each in units of the data's pixel sd)."""
    scale = float(X.std())
    return {
        "mean_image_rms": round(float(np.sqrt(np.mean((x.mean(0) - X.mean(0)) ** 2))) / scale, 3),
        "pixel_sd": round(float(x.std()) / scale, 3),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", choices=["mixture", "rings", "strokes"], default="mixture")
    parser.add_argument("--backend", default="numpyro")
    parser.add_argument("--steps", type=int, default=None, help="training updates T")
    parser.add_argument("--chain-steps", type=int, default=None, help="K, chain steps per update")
    parser.add_argument("--draws", type=int, default=2000, help="chains drawn after training")
    parser.add_argument("--sample-steps", type=int, default=1000, help="their steps from noise")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", default=None, help="save a figure of data and samples here")
    args = parser.parse_args(argv)
    options = {} if args.steps is None else {"num_steps": args.steps}
    if args.chain_steps is not None:
        options["chain_steps"] = args.chain_steps
    start = time.perf_counter()
    if args.data == "strokes":
        X, model = fit_strokes(args.backend, seed=args.seed, **options)
        draws = {"from the buffer": model.sample(min(args.draws, 64), seed=1)}
    else:
        X, model = fit_2d(args.backend, args.data, seed=args.seed, **options)
        steps = args.sample_steps
        draws = {
            "from the buffer, 100 steps": model.sample(args.draws, steps=100, seed=1),
            f"from noise, {steps} steps": model.sample(args.draws, steps, start="noise", seed=1),
        }
    print(f"{model} trained in {time.perf_counter() - start:.1f} s")
    print(
        f"loss over the last 10% of updates: {model.losses[-len(model.losses) // 10 :].mean():.4f}"
    )
    measure = compare_images if args.data == "strokes" else compare
    for label, x in draws.items():
        print(f"samples {label}: {measure(X, x)}")
    noise = np.random.default_rng(0).uniform(*model.box, size=(len(X), model.box[0].size))
    print(
        f"mean energy: data {model.energy(X).mean():.3f}, "
        f"uniform noise {model.energy(noise.reshape(X.shape)).mean():.3f}"
    )
    if args.plot:
        _plot(X, draws, args.data, args.plot)


def _plot(X: np.ndarray, draws: dict, data: str, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if data == "strokes":
        fig, axes = plt.subplots(2, 8, figsize=(12, 3.4))
        x = next(iter(draws.values()))
        for i, ax in enumerate(axes.flat):
            image = X[i] if i < 8 else x[i - 8]
            ax.imshow(image[0], cmap="gray")
            ax.set_axis_off()
        axes[0, 0].set_title("data", loc="left")
        axes[1, 0].set_title("EBM samples", loc="left")
    else:
        fig, axes = plt.subplots(1, 1 + len(draws), figsize=(4 * (1 + len(draws)), 4))
        for ax, (label, x) in zip(axes, {"data": X, **draws}.items(), strict=True):
            ax.scatter(x[:, 0], x[:, 1], s=2)
            ax.set_title(label)
            ax.set_xlabel("x1")
            ax.set_ylabel("x2")
    fig.suptitle(f"EBM trained by Algorithm 3 ({data})")
    fig.savefig(path, dpi=100, bbox_inches="tight")
    print(f"saved {path}")


if __name__ == "__main__":
    main()
