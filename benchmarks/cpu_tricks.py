"""What the NumPyro backend's CPU tricks buy: each on and off, in one process.

The backend's ``cpu_tricks`` setting (``PPL_BDL_CPU_TRICKS=0`` turns it off) holds two speed-ups:

- **random**: a step's key (``fold_in``) and its Gaussian draws (``normal``) with Threefry-2x32
  written out round by round (``backends/numpyro/random.py``) instead of ``jax.random``'s (the
  same bits);
- **loop**: the CPU loop's segments (lean steps between kept ones, ``_segment_run`` in
  ``backends/numpyro/loop.py``) instead of a plain ungated ``lax.scan`` of the chunk.

For SGLD and mean-field VI at a toy size (a 3-weight linear regression, N = 1,000, B = 32) and a
network size (the 784-100-10 ReLU classifier of :mod:`anchors`, N = 20,000, B = 128) it times
the fit loop (:func:`anchors.ours_loop`: set up once, then the loop ``bdl.fit`` runs) with both
tricks on (the default), each one off, and both off, and prints ms per step and each variant's
time over the default's (above 1: the trick pays). Per step: (best at the long run − best at
the short) / (long − short), the variants interleaved (:func:`dl_scale.per_step`).

Usage::

    taskset -c 1 python benchmarks/cpu_tricks.py --clock cpu --repeats 3
    python benchmarks/cpu_tricks.py --sizes 3-weight --methods sgld --repeats 1   # quick look
"""

from __future__ import annotations

import argparse

import anchors
import numpy as np
from dl_scale import CLOCKS, per_step

import ppl_bdl as bdl
from ppl_bdl import dist
from ppl_bdl.backends.numpyro.backend import NumPyroBackend
from ppl_bdl.backends.numpyro.loop import compile_loop


class _SegmentsBackend(NumPyroBackend):
    """A backend on one CPU with the loop's segments whatever ``cpu_tricks`` says."""

    def compile_loop(self, step, emit):
        return compile_loop(step, emit, on_cpu=True, cpu_segments=True)


class _ScanBackend(NumPyroBackend):
    """A backend on one CPU with the plain scan whatever ``cpu_tricks`` says."""

    def compile_loop(self, step, emit):
        return compile_loop(step, emit, on_cpu=True, cpu_segments=False)


def variants() -> dict:
    """The four backends: name -> backend (both tricks on, each off, both off)."""
    return {
        "on": NumPyroBackend(cpu_tricks=True),
        "random off": _SegmentsBackend(cpu_tricks=False),
        "loop off": _ScanBackend(cpu_tricks=True),
        "both off": NumPyroBackend(cpu_tricks=False),
    }


@bdl.model
def regression(X, y):
    w = bdl.sample("w", dist.Normal(0.0, 1.0), shape=(3,))
    with bdl.plate("data", X.shape[0]) as idx:
        bdl.sample("y", dist.Normal(X[idx] @ w, 0.5), obs=y[idx])


def _regression_data(n: int = 1_000):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, 3)).astype(np.float32)
    y = (X @ np.array([1.0, -2.0, 0.5]) + 0.5 * rng.normal(size=n)).astype(np.float32)
    return X, y


#: Per size: the bound model's maker, the batch, SGLD's step size, the short and long runs.
SIZES = {
    "3-weight": (lambda: regression(*_regression_data()), 32, 1e-4, (4_000, 20_000)),
    "784-100-10": (
        lambda: anchors.model(anchors.SIZES["784-100-10"])(
            *anchors.make_data(anchors.SIZES["784-100-10"])
        ),
        128,
        anchors.SIZES["784-100-10"].sgld_step,
        (400, 2_000),
    ),
}


def sweep(sizes, methods, repeats: int, clock: str, scale: float) -> list:
    """Time every size x method x variant; print a row per size and method; return the rows."""
    rows = []
    for name in sizes:
        make_bound, batch, step_size, lengths = SIZES[name]
        bound = make_bound()
        short, long = (max(2, int(scale * n)) for n in lengths)
        for method in methods:
            runs = {
                variant: anchors.ours_loop(backend, method, bound, batch, step_size)
                for variant, backend in variants().items()
            }
            times = per_step(runs, short, long, repeats, clock)
            row = {"size": name, "method": method, **times}
            rows.append(row)
            print(_format(row), flush=True)
    return rows


def _format(row: dict) -> str:
    on = row["on"]
    parts = [f"{row['size']:>10s} {row['method']:>4s}  on {on:8.4f} ms"]
    for key in ("random off", "loop off", "both off"):
        parts.append(f"{key} {row[key]:8.4f} ({row[key] / on:4.2f}x)")
    return "  ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(SIZES))
    parser.add_argument("--methods", default="sgld,vi")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--scale", type=float, default=1.0, help="run lengths x this")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    args = parser.parse_args()
    print(
        f"ms per step ({args.clock} clock); (x): the variant's time over 'on' (>1: the trick pays)"
    )
    sweep(args.sizes.split(","), args.methods.split(","), args.repeats, args.clock, args.scale)


if __name__ == "__main__":
    main()
