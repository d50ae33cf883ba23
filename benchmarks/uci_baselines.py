"""The post-hoc baselines on the UCI regression sets (MAP, MC dropout, Laplace, SWAG) beside the
published MC-dropout and deep-ensemble numbers.

Runs :func:`ppl_bdl.models.uci.run_uci` with each baseline of
:mod:`ppl_bdl.models.uci_baselines` (the deep-ensemble protocol's network and budget: one hidden
layer of the set's ReLU units, N(0, 1) weights, the set's 40 epochs of batch 16, Adam at lr
0.01; see that module for each method's settings and the two choices that differ from the
papers) on each set and split, and prints per set one line per baseline: test RMSE and test
log-likelihood (original units, mean ± standard error over the splits), the seconds of the
fits (scoring not counted), and the published MC-dropout (Gal & Ghahramani 2016) and
deep-ensemble (Lakshminarayanan et al. 2017) rows. Needs the shared UCI data
(../shared/data/uci or $PPL_BDL_DATA/uci).

Usage::

    python benchmarks/uci_baselines.py [--sets boston concrete energy wine yacht]
        [--splits 5] [--backend numpyro] [--methods map mc_dropout laplace_ll ...] [--epochs 40]
"""

from __future__ import annotations

import argparse

from ppl_bdl.models import uci, uci_baselines


def published(name: str) -> str:
    """The published MC-dropout and deep-ensemble rows of set ``name``, one line."""
    rows = []
    for label, table in (
        ("MC dropout", uci.PUBLISHED_MC_DROPOUT),
        ("ensembles", uci.PUBLISHED_DEEP_ENSEMBLES),
    ):
        (r, rpm), (ll, llpm) = table[name]["rmse"], table[name]["log_likelihood"]
        rows.append(f"{label} RMSE {r:.2f} ± {rpm:.2f}, log-lik {ll:.2f} ± {llpm:.2f}")
    return f"{name:9s} published: " + "; ".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sets", nargs="+", default=["boston", "concrete", "energy", "wine", "yacht"]
    )
    parser.add_argument("--splits", type=int, default=5, help="the first K splits")
    parser.add_argument("--backend", default="numpyro")
    parser.add_argument(
        "--methods",
        nargs="+",
        default=list(uci_baselines.BASELINES),
        choices=uci_baselines.BASELINES,
    )
    parser.add_argument("--epochs", type=int, default=None, help="epochs (None: the set's, 40)")
    parser.add_argument("--seed", type=int, default=0, help="split k is fitted with seed + k")
    args = parser.parse_args()
    if uci.uci_dir() is None:
        raise SystemExit("the UCI data is not here: put ../shared/data next to the repository")
    for name in args.sets:
        proto = uci.protocol(name)
        splits = range(min(args.splits, proto.num_splits))
        print(published(name), flush=True)
        for method in args.methods:
            options = uci_baselines.baseline_options(method, epochs=args.epochs)
            result = uci.run_uci(
                name,
                options,
                splits=splits,
                backend=args.backend,
                model=options.model(proto),
                seed=args.seed,
                label=f"{args.backend} {method}",
            )
            (r, rse), (ll, llse) = result.rmse, result.log_likelihood
            seconds = sum(s.seconds for s in result.scores)
            flagged = sum(bool(s.findings) for s in result.scores)
            print(
                f"{name:9s} {method:14s} {len(result.scores)} splits: RMSE {r:.2f} ± {rse:.2f}, "
                f"log-lik {ll:.2f} ± {llse:.2f}, {seconds:.0f} s ({flagged} splits with "
                "diagnostics findings)",
                flush=True,
            )


if __name__ == "__main__":
    main()
