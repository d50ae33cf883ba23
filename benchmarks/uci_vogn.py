"""Natural-gradient mean-field VI (``optimizer="vogn"``) against Adam's mean-field VI on the UCI
regression sets, through the UCI harness (:mod:`ppl_bdl.models.uci`), in one run.

Per set and split, :func:`ppl_bdl.models.uci.run_uci`: inputs and target standardised with the
training split's mean and sd; the network of the VI literature's protocol (one hidden layer of
the set's 50 ReLU units, N(0, 1) weights, PBP's Gamma(6, 6) noise precision:
``uci.uci_model(hidden, "gamma")``); mean-field VI with each optimizer for the same epochs of
⌊N/B⌋ minibatches of B = 32 on the cosine schedule (:func:`ppl_bdl.models.uci_vi.vogn_against_adam`;
the same seed per split, so the same minibatches and start for both); the test split scored by the
predictive mixture over 200 guide draws in the target's original units. Prints per set each
optimizer's test RMSE and log-likelihood (mean ± standard error over the splits) and final ELBO,
and the paired per-split difference vogn − adam of the test log-likelihood (mean ± its standard
error, :func:`ppl_bdl.models.uci.paired_difference`).

``--seed-groups G``: the comparison again with G groups of seeds, group j fitting split k with
seed 1000 j + k (group 0 is the test's and the harness's default); per group the paired
difference and whether it meets the bar (> −2 standard errors), then the mean over the groups
of their 5-split means ± its standard error (splits of one group share most of their start:
the guide's initial mean is the median of prior draws of seeds s, s + 1, ..., s + 19).

Usage::

    python benchmarks/uci_vogn.py [--sets yacht boston concrete] [--splits 5]
        [--backend numpyro] [--epochs 400] [--batch-size 32] [--seed-groups 1]
        [--curvature hessian|fisher|ggn]
"""

from __future__ import annotations

import argparse

import numpy as np

from ppl_bdl.models import uci, uci_vi


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", nargs="+", default=["yacht", "boston", "concrete"])
    parser.add_argument("--splits", type=int, default=5, help="the first K splits")
    parser.add_argument("--backend", default="numpyro")
    parser.add_argument("--epochs", type=int, default=uci_vi.COMPARISON_EPOCHS)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed-groups", type=int, default=1, help="groups of seeds (1000 j + k)")
    parser.add_argument("--curvature", default=None, help="vogn's curvature (default: its own)")
    args = parser.parse_args()
    if uci.uci_dir() is None:
        raise SystemExit("the UCI data is not here: put ../shared/data next to the repository")
    for name in args.sets:
        means = []
        for group in range(args.seed_groups):
            results = uci_vi.vogn_against_adam(
                name,
                args.backend,
                range(args.splits),
                args.epochs,
                args.batch_size,
                seed=1000 * group,
                curvature=args.curvature,
            )
            for result in results.values():
                elbo = -np.array([s.final_loss for s in result.scores])
                se = elbo.std(ddof=1) / np.sqrt(len(elbo)) if len(elbo) > 1 else float("nan")
                print(f"{result}; ELBO {elbo.mean():.1f} ± {se:.1f}", flush=True)
            diff, se = uci.paired_difference(results["vogn"], results["adam"])
            means.append(diff)
            per_split = [
                round(a.log_likelihood - b.log_likelihood, 4)
                for a, b in zip(results["vogn"].scores, results["adam"].scores, strict=True)
            ]
            print(
                f"{name} (seeds {1000 * group} + split): test LL vogn - adam {diff:.3f} ± "
                f"{se:.3f} ({diff / se:.1f} se, bar met: {diff > -2 * se}; per split "
                f"{per_split}); {args.epochs} epochs, batch {args.batch_size}",
                flush=True,
            )
        if len(means) > 1:
            se = np.std(means, ddof=1) / np.sqrt(len(means))
            print(
                f"{name}: over {len(means)} seed groups, vogn - adam {np.mean(means):.4f} ± "
                f"{se:.4f} (standard error of the groups' means)",
                flush=True,
            )


if __name__ == "__main__":
    main()
