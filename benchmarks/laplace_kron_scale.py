"""``hessian="kron"`` on a ResNet-20-sized network (He et al. 2016: 3 stages of 3 residual
blocks, 16/32/64 channels, ~270k weights): its time and peak memory, against what a (d, d)
precision would take. Small images keep it cheap on a CPU; the weights are what matter.

    PYTHONPATH=$PWD python benchmarks/laplace_kron_scale.py [--size 8] [--points 64]
"""

from __future__ import annotations

import argparse
import resource
import time
import warnings

import numpy as np

import ppl_bdl as bdl
from ppl_bdl import dist, nn


def resnet20(classes: int = 10) -> nn.Sequential:
    layers, width = [nn.Conv2d("stem", 3, 16, 3, padding=1), "relu"], 16
    for stage, channels in enumerate((16, 32, 64)):
        for block in range(3):
            stride = 2 if stage and not block else 1
            shortcut = (
                nn.Conv2d("shortcut", width, channels, 1, stride=stride)
                if (stride, width) != (1, channels)
                else None
            )
            body = [
                nn.Conv2d("conv1", width, channels, 3, stride=stride, padding=1),
                "relu",
                nn.Conv2d("conv2", channels, channels, 3, padding=1),
            ]
            layers.append(nn.Residual(f"s{stage}b{block}", body, shortcut, activation="relu"))
            width = channels
    layers += [nn.GlobalAvgPool2d(), nn.Dense("fc", 64, classes)]
    return nn.Sequential("resnet", layers, prior=nn.he_normal())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=8)
    parser.add_argument("--points", type=int, default=64)
    parser.add_argument("--backend", default="numpyro")
    args = parser.parse_args()
    net = resnet20()

    @bdl.model
    def model(X, y=None):
        f = net.sample()
        with bdl.plate("data", X.shape[0]) as idx:
            bdl.sample("y", dist.Categorical(logits=f(X[idx])), obs=y[idx])

    rng = np.random.default_rng(0)
    X = rng.normal(size=(args.points, 3, args.size, args.size)).astype(np.float32)
    y = rng.integers(0, 10, args.points)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        post = bdl.fit(
            model(X, y),
            backend=args.backend,
            method="laplace",
            hessian="kron",
            num_steps=1,
            num_samples=8,
            batch_size=32,
            progress=False,
        )
    seconds = time.perf_counter() - start
    approx = post.guide
    d = len(approx.mode)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB -> MB on Linux
    print(
        f"weights d = {d}, layers factored = {len(approx.blocks)}, rest = {len(approx.rest_index)}"
    )
    print(f"fit (1 MAP step, kron curvature over {args.points} points, 8 draws): {seconds:.1f} s")
    print(f"peak RSS {peak:.0f} MB; a float64 (d, d) precision would be {8 * d * d / 1e9:.0f} GB")
    print(f"log det P = {approx.log_det_precision():.1f}")


if __name__ == "__main__":
    main()
