"""The cost of a Laplace fit's curvature step against one epoch of its MAP, on a 784-400-400-10
classifier (Normal(0, 1) priors, a Categorical likelihood) and synthetic MNIST-shaped data:
N images of 784 floats in [0, 1], labelled by a fixed random network (no download).

    PYTHONPATH=$PWD python benchmarks/laplace_cost.py [--backend numpyro|pyro]
        [--sizes 2000,10000] [--batch-size 128] [--epochs 5] [--repeats 2] [--ggn-samples 1]

For each N, in one process:

- one MAP epoch: N / B Adam steps of minibatch B, run as one compiled chunk of the MAP loop;
  the median over ``--epochs`` epochs of one MAP search, after the first (which compiles),
  the shorter of two searches (before and after the curvature steps: the machine's load
  varies);
- the curvature step at the MAP, as ``bdl.fit(..., method="laplace")`` runs it after the MAP
  (``subset="all"``, the GGN over the data in chunks of B): ``hessian="diag"`` (the diagonal
  and its check), and ``"kron"``: its Kronecker factors alone ("kron factors") and the whole
  step ("kron": the factors, their eigendecompositions (785 x 785 and 401 x 401: a cost that
  does not grow with N), the other sites);
  with ``--ggn-samples K`` each again with G (and the diagonal) estimated from K draws per
  image (``bdl.Laplace(ggn_samples=K)``) instead of one backward pass per class;
  "cold" is the first call (tracing and compiling included), "warm" a later one (the compiled
  pass is kept in the model's program cache, as it is for a refit).

The ratios printed are curvature / epoch (the warm time: the best of ``--repeats`` calls).
"""

from __future__ import annotations

import argparse
import math
import time
import warnings

import numpy as np

import ppl_bdl as bdl
from ppl_bdl import dist, nn
from ppl_bdl.inference.laplace.approximation import checked_precision
from ppl_bdl.inference.laplace.curvature import curvature
from ppl_bdl.inference.laplace.kron import fit_kron
from ppl_bdl.inference.laplace.layer_ggn import layer_pieces
from ppl_bdl.inference.laplace.method import Laplace, gaussian_coordinates
from ppl_bdl.inference.laplace.mode import find_mode
from ppl_bdl.inference.loop import driver
from ppl_bdl.inference.setup import prepare

SIZES = (784, 400, 400, 10)


def mnist_like(num: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``num`` images of 784 floats in [0, 1] and labels from a fixed random 784-64-10 network.

    >>> X, y = mnist_like(5); X.shape, y.shape
    ((5, 784), (5,))
    """
    rng = np.random.default_rng(seed)
    teacher = np.random.default_rng(1234)
    w1 = teacher.normal(size=(784, 64)) / 28.0
    w2 = teacher.normal(size=(64, 10))
    images = rng.uniform(size=(num, 784)).astype(np.float32)
    hidden = np.tanh((images - 0.5) @ w1)
    return images, np.argmax(hidden @ w2, axis=1)


def classifier():
    """The 784-400-400-10 ReLU classifier with Normal(0, 1) priors, as a DSL model.

    >>> model = classifier(); model.__name__
    'classifier'
    """
    net = nn.MLP("net", list(SIZES), activation="relu", prior=1.0)

    @bdl.model
    def classifier(X, y=None):
        logits = net.sample()
        with bdl.plate("data", X.shape[0]) as idx:
            bdl.sample("y", dist.Categorical(logits=logits(X[idx])), obs=y[idx])

    return classifier


def best(fn, repeats: int) -> tuple[float, object]:
    """The shortest of ``repeats`` timed calls of ``fn`` and its last result."""
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return min(times), out


class ChunkClock:
    """Stands in for the MAP loop's progress bar: the time at which each compiled chunk ended."""

    def __init__(self, total: int, name: str):
        self.ends = [time.perf_counter()]

    def update(self, steps: int, infos=None) -> None:
        self.ends.append(time.perf_counter())

    def close(self) -> None:
        pass


def epoch_time(setup, num: int, batch: int, epochs: int) -> tuple[float, np.ndarray]:
    """One MAP epoch's seconds (the median chunk of one epoch's steps, after the first, which
    compiles) and the MAP after ``epochs`` epochs."""
    per_epoch = math.ceil(num / batch)
    config = Laplace(
        num_steps=epochs * per_epoch, batch_size=batch, lr=1e-3, chunk_size=per_epoch
    ).config()
    clocks: list[ChunkClock] = []

    def clock(total, name):
        clocks.append(ChunkClock(total, name))
        return clocks[-1]

    saved, driver.progress_bar = driver.progress_bar, clock
    try:
        mode = find_mode(setup, config, None, 0, True)[0]
    finally:
        driver.progress_bar = saved
    return float(np.median(np.diff(clocks[0].ends)[1:])), mode


def curvature_times(
    setup, mode, batch: int, step: str, repeats: int, samples: int | None = None
) -> tuple[float, float]:
    """The seconds of a curvature ``step``: the first call (cold) and the best later one (warm).
    "diag": the diagonal and its check; "kron factors": the layers' A and G alone; "kron": the
    whole of ``hessian="kron"`` (the factors, their eigendecompositions, the other sites).
    ``samples``: the GGN estimated from that many draws per point (``ggn_samples``)."""
    index, sites = gaussian_coordinates(setup, "all", step.split()[0])

    def run():
        if step == "kron":
            return fit_kron(setup, mode, index, sites, batch, None, 0, 1, {}, samples)
        if step == "kron factors":
            return layer_pieces(setup, mode, set(sites), batch, "kron", samples)
        diagonal = curvature(setup, mode, "diag", "ggn", index, batch, estimate=(samples, 0))
        return checked_precision(diagonal, "diag", None)

    cold, _ = best(run, 1)
    warm, _ = best(run, repeats)
    return cold, warm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="numpyro", choices=("numpyro", "pyro"))
    parser.add_argument("--sizes", default="2000,10000", help="data sizes N, comma-separated")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=5, help="MAP epochs (the first compiles)")
    parser.add_argument(
        "--ggn-samples", type=int, default=1, help="also time ggn_samples=K (0: exact only)"
    )
    args = parser.parse_args()
    model = classifier()
    print(f"{args.backend}: {'-'.join(map(str, SIZES))} classifier, batch {args.batch_size}")
    print(
        f"{'N':>6} {'epoch s':>8} {'step':>16} {'cold s':>8} {'warm s':>8} {'cold x':>7} "
        f"{'warm x':>7}"
    )
    for num in (int(s) for s in args.sizes.split(",")):
        X, y = mnist_like(num)
        setup = prepare(model(X, y), args.backend, "float32", seed=0)
        epoch, mode = epoch_time(setup, num, args.batch_size, args.epochs)
        rows = []
        for samples in [None] + ([args.ggn_samples] if args.ggn_samples else []):
            for step in ("diag", "kron", "kron factors"):
                times = curvature_times(setup, mode, args.batch_size, step, args.repeats, samples)
                rows.append((step + ("" if samples is None else f" ({samples})"), *times))
        epoch = min(epoch, epoch_time(setup, num, args.batch_size, args.epochs)[0])
        for step, cold, warm in rows:
            print(
                f"{num:>6} {epoch:>8.2f} {step:>16} {cold:>8.2f} {warm:>8.2f} "
                f"{cold / epoch:>7.1f} {warm / epoch:>7.1f}",
                flush=True,
            )


if __name__ == "__main__":
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        main()
