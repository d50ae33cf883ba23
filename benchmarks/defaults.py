"""Every method at its defaults on two BNN regressions: does it finish, and is the fit right?

The models: the demo's BNN (``make_bnn_regression(hidden=(10,))`` on the shipped sine data, every
fourth point held out: 60 points) and a 1-16-1 tanh BNN on 120 points of the sine data
(``make_sine_data(n=120)``); both have the true noise sigma = 0.15. Each method runs at its
defaults (``bdl.fit(model, method=name)``, VI once per guide) in a process of its own, stopped
after ``--limit`` seconds. Printed per run: the wall and CPU seconds, and the correctness
number: the posterior mean of sigma and its error relative to the truth (CAVI applies to
conjugate models only: listed as not applicable).

Usage::

    python benchmarks/defaults.py                               # everything, both backends
    python benchmarks/defaults.py --backends pyro --methods vi:flow nuts --limit 300
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

TRUE_SIGMA = 0.15
MODELS = ("demo", "bnn16")
METHODS = (
    "nuts",
    "hmc",
    "sgld",
    "sghmc",
    "psgld",
    "csgld",
    "csghmc",
    "vi:meanfield",
    "vi:lowrank",
    "vi:fullrank",
    "vi:flow",
    "vi:delta",
    "ensemble",
    "cavi",
)

#: Run in a child process: fit one method at its defaults, print a JSON line.
CHILD = """
import json, sys, time, warnings
import numpy as np
import ppl_bdl as bdl
from ppl_bdl.models import bnn, regression
backend, model, method = sys.argv[1:4]
bdl.backends.get(backend).set_threads(1)
if model == "demo":
    X, y = regression.sine_data()
    train = np.arange(len(y)) % 4 != 0
    bound = bnn.make_bnn_regression(hidden=(10,))(X[train], y[train])
else:
    X, y = regression.make_sine_data(n=120)
    bound = bnn.make_bnn_regression(hidden=(16,))(X, y)
name, _, guide = method.partition(":")
options = {"guide": guide} if guide else {}
warnings.simplefilter("ignore")
wall, cpu = time.perf_counter(), time.process_time()
post = bdl.fit(bound, backend=backend, method=name, progress=False, **options)
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
steps = post.settings.get("steps_run")
sigma = float(np.mean(post.samples["sigma"]))
print(json.dumps(dict(wall=wall, cpu=cpu, sigma=sigma, steps=steps)))
"""


def run_one(backend: str, model: str, method: str, limit: float) -> dict:
    """One fit in a child process: its JSON result, or why there is none."""
    if method == "cavi":
        return {"note": "not applicable (conjugate models only)"}
    start = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, "-c", CHILD, backend, model, method],
            capture_output=True,
            text=True,
            timeout=limit,
        )
    except subprocess.TimeoutExpired:
        return {"note": f"not finished after {limit:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        return {"note": f"failed after {time.perf_counter() - start:.0f} s: {tail[0][:80]}"}
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backends", nargs="+", default=["numpyro", "pyro"])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--limit", type=float, default=240.0, help="seconds before a run stops")
    args = parser.parse_args()
    print("| backend | model | method | wall s | CPU s | steps | sigma | error |")
    print("|---|---|---|---|---|---|---|---|")
    for backend in args.backends:
        for model in args.models:
            for method in args.methods:
                r = run_one(backend, model, method, args.limit)
                if "note" in r:
                    print(f"| {backend} | {model} | {method} | {r['note']} | | | | |", flush=True)
                    continue
                error = abs(r["sigma"] - TRUE_SIGMA) / TRUE_SIGMA
                steps = "" if r["steps"] is None else r["steps"]
                print(
                    f"| {backend} | {model} | {method} | {r['wall']:.0f} | {r['cpu']:.0f} | "
                    f"{steps} | {r['sigma']:.3f} | {error:.0%} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
