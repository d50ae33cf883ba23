"""The per-step cost at every network size: ours against hand-written loops, in one process.

For each size of :data:`anchors.SIZES` (the toy 8-50-1 regression net, N = 10^5, B = 100; the
UCI-sized 13-50-1, N = 500, B = 32; and ReLU classifiers 784-100-10 up to 784-1200-1200-10, the
size of Blundell et al. 2015, on MNIST-shaped data, N = 20,000, B = 128) and each method (SGLD,
SGHMC, mean-field VI), it times

- ours: the loop ``bdl.fit`` runs, set up once (the model traced, the step compiled), then run
  for ``steps`` steps per call: the same transition, chunks, minibatch indices, kept draws and
  read-back as a fit, without the once-per-fit set-up and posterior (``--whole-fit`` times whole
  ``bdl.fit`` calls instead);
- the anchors of :mod:`anchors`: a hand-written ``jit(lax.scan)`` JAX loop of the same update
  (noise drawn in the step), BlackJAX's sgld and sghmc (per gradient evaluation), and a
  hand-written torch loop.

Per-step time is (best time at ``long`` − best at ``short``) / (long − short): set-up and
compilation cancel; the variants are interleaved, each the best of ``--repeats``. Printed per
size and method: ours (NumPyro) / hand-written JAX (target <= 1.2), BlackJAX / ours (target >=
1.0), ours (Pyro) / hand-written torch (target <= 1.3).

Usage::

    python benchmarks/dl_scale.py                                  # every size, method, backend
    python benchmarks/dl_scale.py --sizes 8-50-1,784-200-200-10 --methods sgld --repeats 5
    python benchmarks/dl_scale.py --memory                         # peak memory of a fit
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import time

import anchors

import ppl_bdl as bdl

#: Steps of the short and the long run per size (the long run takes a few seconds per variant).
LENGTHS = {
    "8-50-1": (4_000, 20_000),
    "13-50-1": (4_000, 20_000),
    "784-100-10": (400, 2_000),
    "784-200-200-10": (200, 1_000),
    "784-400-400-10": (100, 400),
    "784-1200-1200-10": (30, 120),
}
KEPT = 10


def ours(backend: str, method: str, size: anchors.Size, data):
    """``run(steps)``: our loop for ``steps`` steps (set up once; see the module docstring)."""
    return anchors.ours_loop(
        backend, method, anchors.model(size)(*data), size.batch, size.sgld_step
    )


def whole_fit(backend: str, method: str, size: anchors.Size, data):
    """``run(steps)``: a whole ``bdl.fit`` of ``steps`` steps (everything included)."""
    bound = anchors.model(size)(*data)
    options = dict(batch_size=size.batch, progress=False, log_likelihood=False, seed=0)
    if method == "vi":
        options.update(method="vi", guide="meanfield", lr=anchors.VI_LR, num_samples=KEPT)
    else:
        options.update(method=method, step_size=size.sgld_step, num_chains=1, num_samples=KEPT)
        if method == "sghmc":
            options["momentum_decay"] = anchors.SGHMC_DECAY

    def run(steps: int):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if method == "vi":
                bdl.fit(bound, backend=backend, num_steps=steps, **options)
            else:
                bdl.fit(bound, backend=backend, num_warmup=steps - KEPT, **options)

    return run


#: The clocks ``--clock`` offers: wall time, or the process's CPU time (every thread's), which a
#: shared machine disturbs far less (run pinned to one core: ``taskset -c 1 python ...``).
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def per_step(runs: dict, short: int, long: int, repeats: int, clock: str = "wall") -> dict:
    """ms per step of each ``run(steps)`` (see the module docstring)."""
    now = CLOCKS[clock]
    best = {(name, n): math.inf for name in runs for n in (short, long)}
    for run in runs.values():
        run(short)  # warm up: compilation
        run(long)
    for _ in range(repeats):
        for name, run in runs.items():
            for n in (short, long):
                start = now()
                run(n)
                best[name, n] = min(best[name, n], now() - start)
    return {name: 1e3 * (best[name, long] - best[name, short]) / (long - short) for name in runs}


def sweep(
    sizes, methods, backends, repeats: int, whole: bool, scale: float = 1.0, clock: str = "wall"
) -> list:
    """Time every size x method; print as it goes; return the rows."""
    rows = []
    ours_of = whole_fit if whole else ours
    for name in sizes:
        size = anchors.SIZES[name]
        data = anchors.make_data(size)
        short, long = (max(2, int(scale * n)) for n in LENGTHS[name])
        for method in methods:
            runs = {}
            if "numpyro" in backends:
                runs["jax"] = anchors.make_jax(size, method, data)
                if method != "vi":
                    runs["blackjax"] = anchors.make_blackjax(size, method, data)
                runs["ours numpyro"] = ours_of("numpyro", method, size, data)
            if "pyro" in backends:
                runs["torch"] = anchors.make_torch(size, method, data)
                runs["ours pyro"] = ours_of("pyro", method, size, data)
            times = per_step(runs, short, long, repeats, clock)
            row = {"size": name, "method": method, **times}
            rows.append(row)
            print(_format(row), flush=True)
    return rows


def _format(row: dict) -> str:
    parts = [f"{row['size']:>17s} {row['method']:>5s}"]
    for key in ("jax", "blackjax", "ours numpyro", "torch", "ours pyro"):
        if key in row:
            parts.append(f"{key} {row[key]:8.4f}")
    if "jax" in row:
        parts.append(f"| ours/jax {row['ours numpyro'] / row['jax']:5.2f} (<=1.2)")
    if "blackjax" in row:
        parts.append(f"blackjax/ours {row['blackjax'] / row['ours numpyro']:5.2f} (>=1)")
    if "torch" in row:
        parts.append(f"ours/torch {row['ours pyro'] / row['torch']:5.2f} (<=1.3)")
    return "  ".join(parts)


def memory_probe() -> None:
    """In this (fresh) process: peak memory of a fit keeping 100 draws of 784-400-400-10."""
    import resource

    size = anchors.SIZES["784-400-400-10"]
    data = anchors.make_data(anchors.Size(size.layers, "relu", 60_000, 128))
    bound = anchors.model(size)(*data)
    options = dict(
        backend="numpyro",
        method="sgld",
        step_size=1e-6,
        batch_size=128,
        num_chains=1,
        progress=False,
        log_likelihood=False,
    )
    bdl.fit(bound, num_warmup=2, num_samples=2, **options)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    post = bdl.fit(bound, num_warmup=10, num_samples=100, **options)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    draws = sum(v.nbytes for v in post.samples.values()) / 2**20
    mb = sum(a.nbytes for a in data) / 2**20
    print(
        f"kept draws {draws:.0f} MB, data {mb:.0f} MB; peak memory before the fit "
        f"{before:.0f} MB, after {after:.0f} MB: the fit added {after - before:.0f} MB "
        f"({(after - before) / draws:.2f}x the draws; target <= 2x the draws plus the data, "
        f"{2 * draws + mb:.0f} MB)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(anchors.SIZES))
    parser.add_argument("--methods", default="sgld,sghmc,vi")
    parser.add_argument("--backends", default="numpyro,pyro")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--scale", type=float, default=1.0, help="run lengths x this")
    parser.add_argument("--whole-fit", action="store_true", help="time whole bdl.fit calls")
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="wall time, or process CPU time (steadier on a shared machine)",
    )
    parser.add_argument("--memory", action="store_true", help="measure a fit's peak memory")
    parser.add_argument("--memory-probe", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_probe:
        return memory_probe()
    if args.memory:
        subprocess.run([sys.executable, __file__, "--memory-probe"], check=True)
        return None
    backends = [b for b in args.backends.split(",") if b in bdl.backends.available()]
    if "pyro" in backends and args.clock == "cpu":
        import torch

        # One intra-op thread for every contender alike: the CPU clock counts every thread's
        # time, spinning included, which a second thread on a pinned core would add.
        torch.set_num_threads(1)
    print(
        f"ms per step ({args.clock} clock); ours: "
        f"{'whole bdl.fit' if args.whole_fit else 'the fit loop'}"
    )
    sweep(
        args.sizes.split(","),
        args.methods.split(","),
        backends,
        args.repeats,
        args.whole_fit,
        args.scale,
        args.clock,
    )
    return None


if __name__ == "__main__":
    main()
