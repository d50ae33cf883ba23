"""NeuTra (Hoffman et al. 2019) against the centred form, ``bdl.LocScale(0)`` and the form written
non-centred by hand, under NUTS on NumPyro, on Neal's funnel and on eight schools centred.

For each model and form: divergent transitions, the smallest bulk ESS over the latents per
gradient (leapfrog step), and the fit's seconds. NeuTra's flow (4 affine-coupling layers, fitted
to the centred model by VI) runs first; its fit's seconds are printed apart.

Usage::

    python benchmarks/neutra.py                 # both models, seed 0
    python benchmarks/neutra.py --models schools --seed 1
"""

from __future__ import annotations

import argparse
import time
import warnings

import arviz as az
import numpy as np

import ppl_bdl as bdl
from ppl_bdl.models import posteriordb as pdb
from ppl_bdl.models.funnel import funnel_centred, funnel_noncentred

NUTS = dict(num_warmup=500, num_samples=1000, num_chains=4)
FLOW = dict(num_layers=4, hidden=32, num_steps=5000, lr=0.003, num_samples=10)


def forms(model: str):
    """(the centred model, its site to decentre, the hand-written non-centred model, the
    latents whose ESS is read)."""
    if model == "funnel":
        return funnel_centred(), "x", funnel_noncentred(), ("v", "x")
    data = pdb.eight_schools_data()
    centred = pdb.eight_schools_centered(**data)
    return centred, "theta", pdb.eight_schools_noncentered(**data), ("mu", "tau", "theta")


def ess_per_gradient(post, names) -> float:
    ess = az.ess(az.convert_to_dataset({n: post.samples[n] for n in names}))
    smallest = min(float(np.min(ess[n].values)) for n in names)
    return smallest / float(np.sum(post.sample_stats["n_steps"]))


def run(model: str, seed: int) -> None:
    centred, site, noncentred, names = forms(model)
    start = time.perf_counter()
    flow = bdl.fit(
        centred, backend="numpyro", method="vi", guide="flow", seed=seed, progress=False, **FLOW
    )
    print(f"{model}: the flow's fit {time.perf_counter() - start:.1f} s")
    candidates = {
        "centred": (centred, {}),
        "LocScale(0)": (bdl.reparam(centred, {site: bdl.LocScale(0)}), {}),
        "non-centred by hand": (noncentred, {}),
        "NeuTra": (centred, {"neutra": flow}),
    }
    for form, (bound, extra) in candidates.items():
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", bdl.ConvergenceWarning)
            post = bdl.fit(
                bound,
                backend="numpyro",
                method=bdl.NUTS(**extra, **NUTS),
                seed=seed,
                progress=False,
            )
        seconds = time.perf_counter() - start
        divergent = int(np.sum(post.sample_stats["diverging"]))
        rate = ess_per_gradient(post, names)
        print(f"| {model} | {form} | {divergent} | {rate:.4f} | {seconds:.1f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["funnel", "schools"])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print("| model | form | divergences | min bulk ESS / gradient | s |")
    print("|---|---|---|---|---|")
    for model in args.models:
        run(model, args.seed)


if __name__ == "__main__":
    main()
