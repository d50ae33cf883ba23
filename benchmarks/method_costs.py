"""What a fit costs, per method and backend, on a shipped BNN: the table of docs/inference.md.

The BNN regression of ``ppl_bdl.models.bnn`` (one hidden layer of 20 tanh units, 61 weights and a
noise scale) on the shipped sine data (80 points), fitted with NUTS (500 warmup + 500 draws),
SGLD and SGHMC (2000 warmup + 1000 draws, full batch, step size chosen by the pilot) and
mean-field VI (3000 steps), one chain each, on every installed backend. Wall-clock seconds of
the whole ``fit`` (compilation and set-up included: what a user waits for), best of
``--repeats``.

Usage::

    python benchmarks/method_costs.py [--repeats 2]
"""

from __future__ import annotations

import argparse
import time

import ppl_bdl as bdl
from ppl_bdl.models import bnn, regression

METHODS = {  # NUTS last: on Pyro it is the long one
    "sgld": dict(method="sgld", num_warmup=2000, num_samples=1000, init="median"),
    "sghmc": dict(method="sghmc", num_warmup=2000, num_samples=1000, init="median"),
    "vi (meanfield)": dict(method="vi", num_steps=3000, num_samples=1000, lr=0.01),
    "nuts": dict(method="nuts", num_warmup=500, num_samples=500),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    X, y = regression.sine_data()
    bound = bnn.make_bnn_regression(hidden=(20,))(X, y)
    backends = bdl.backends.available()
    for name in backends:
        bdl.backends.get(name).set_threads(1)
    for backend in backends:  # one line per fit as it ends
        for method, options in METHODS.items():
            chains = {} if options["method"] == "vi" else {"num_chains": 1}
            best = float("inf")
            for _ in range(args.repeats):
                start = time.perf_counter()
                bdl.fit(bound, backend=backend, seed=0, progress=False, **chains, **options)
                best = min(best, time.perf_counter() - start)
            print(f"{backend:<10} {method:<16} {best:8.1f} s", flush=True)


if __name__ == "__main__":
    main()
