"""Deep ensembles on the UCI regression sets against the published deep-ensemble numbers.

Runs :func:`ppl_bdl.models.uci.run_uci` with the deep-ensemble protocol
(:func:`ppl_bdl.models.uci.deep_ensemble_options`: 5 members, 40 epochs, batch size 16, Adam at
lr 0.01, the heteroscedastic one-hidden-layer ReLU network) on each set and split, and prints one
line per set: test RMSE and test log-likelihood (original units, mean ± standard error over the
splits) beside Lakshminarayanan et al. 2017's, and the total seconds. Needs the shared UCI data
(../shared/data/uci or $PPL_BDL_DATA/uci).

Usage::

    python benchmarks/uci_ensembles.py [--sets boston concrete yacht] [--splits 20]
        [--backend numpyro] [--noise heteroscedastic] [--anchored] [--prior he]
        [--batch-size 16] [--lr 0.01]

``--prior he``: He's fan-in scaled normal prior (``nn.he_normal()``) instead of N(0, 1), the
prior an anchored ensemble needs (see :func:`ppl_bdl.models.uci.uci_model`).
"""

from __future__ import annotations

import argparse

from ppl_bdl import nn
from ppl_bdl.models import uci

PRIORS = {"normal": None, "he": nn.he_normal()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", nargs="+", default=["boston", "concrete", "yacht"])
    parser.add_argument("--splits", type=int, default=None, help="the first K splits (all)")
    parser.add_argument("--backend", default="numpyro")
    parser.add_argument("--noise", default="heteroscedastic")
    parser.add_argument("--anchored", action="store_true")
    parser.add_argument("--prior", choices=sorted(PRIORS), default="normal")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--members", type=int, default=5)
    args = parser.parse_args()
    if uci.uci_dir() is None:
        raise SystemExit("the UCI data is not here: put ../shared/data next to the repository")
    extra = {"anchored": True} if args.anchored else {}
    options = uci.deep_ensemble_options(args.members, args.batch_size, args.lr, **extra)
    for name in args.sets:
        proto = uci.protocol(name)
        splits = range(min(args.splits or proto.num_splits, proto.num_splits))
        model = uci.uci_model(proto.num_hidden, args.noise, PRIORS[args.prior])
        result = uci.run_uci(
            name,
            options,
            splits=splits,
            backend=args.backend,
            model=model,
            label=f"{args.backend} {args.noise} {args.prior}",
        )
        flagged = sum(bool(s.findings) for s in result.scores)
        print(
            f"{result}; within the published ±: {result.matches_published()}; "
            f"{flagged} splits with diagnostics findings",
            flush=True,
        )


if __name__ == "__main__":
    main()
