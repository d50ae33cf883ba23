"""Repeated fits of one model: the first fit compiles, the next ones reuse its programs.

Thirty ``bdl.fit`` calls of the same 3-weight regression (SGLD, 200 steps, seeds 0-29) in one
process, each timed, with the process's memory maps counted after each; then the anchor, the
same fits with every compiled program dropped before each (``jax.clear_caches`` and the
backend's program cache cleared: what each fit cost when nothing was reused).

    python benchmarks/repeat_fits.py [--fits 30] [--baseline-fits 5] [--method sgld]
"""

from __future__ import annotations

import argparse
import time
import warnings

import jax
import numpy as np

import ppl_bdl as bdl
from ppl_bdl.backends import get as get_backend
from ppl_bdl.models import regression
from ppl_bdl.trace.programs import programs


def memory_maps() -> int:
    try:
        with open("/proc/self/maps", "rb") as maps:
            return maps.read().count(b"\n")
    except OSError:
        return 0


def run(fits: int, method: str, fresh: bool) -> tuple[list[float], list[int]]:
    X, y = regression.make_regression_data(n=100, d=3, seed=0)
    options = {"num_steps": 200} if method == "vi" else {"num_warmup": 100, "num_samples": 100}
    times, maps = [], []
    for seed in range(fits):
        if fresh:
            programs(get_backend("numpyro")).clear()
            jax.clear_caches()
        start = time.perf_counter()
        bdl.fit(
            regression.linear_regression(X, y),
            backend="numpyro",
            method=method,
            seed=seed,
            num_chains=1,
            progress=False,
            **options,
        )
        times.append(time.perf_counter() - start)
        maps.append(memory_maps())
    return times, maps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fits", type=int, default=30)
    parser.add_argument("--baseline-fits", type=int, default=5)
    parser.add_argument("--method", default="sgld")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    ours, ours_maps = run(args.fits, args.method, fresh=False)
    fresh, fresh_maps = run(args.baseline_fits, args.method, fresh=True)
    later, fresh_later = np.median(ours[1:]), np.median(fresh[1:])
    print(f"method={args.method}: {args.fits} fits reusing programs, {args.baseline_fits} fresh")
    print(f"ours : first {ours[0]:.2f} s, then median {later:.3f} s per fit")
    print(f"fresh: first {fresh[0]:.2f} s, then median {fresh_later:.3f} s per fit")
    print(f"per-fit ratio fresh/ours: {fresh_later / later:.1f}x")
    print(
        f"memory maps: ours {ours_maps[0]} -> {ours_maps[-1]} over fits 1-{args.fits} "
        f"({(ours_maps[-1] - ours_maps[1]) / max(1, len(ours_maps) - 2):+.1f} per fit after the "
        f"second); fresh {fresh_maps[0]} -> {fresh_maps[-1]}"
    )


if __name__ == "__main__":
    main()
