"""The ``ppl-bdl`` command line: ``demo``, ``fit`` and ``info``.

Examples
--------
::

    ppl-bdl info
    ppl-bdl demo --out demo_out --backends numpyro
    ppl-bdl fit ppl_bdl.models.regression:linear_regression --data docs/examples/regression.csv \\
        --backend pyro --method nuts --num-warmup 500 --num-samples 500 --out post.nc
    ppl-bdl fit mymodels.py:bnn --data d.npz --method vi --num-steps 20000 --guide flow \\
        --out fit.nc --force

``fit`` reads the data into the model's arguments by name: the keys of a ``.npz`` or ``.json``
file, or the columns of a ``.csv`` file, where columns ``X.0, X.1, ...`` (or ``X[0], X[1], ...``)
are stacked into a matrix argument ``X`` and a column ``y`` is a vector argument ``y``
(docs/cli.md). Its flags are checked against the method before the backend (torch or JAX, seconds
to import) is loaded, so a flag that does not apply fails at once.
"""

from __future__ import annotations

import argparse
import platform
import sys
import warnings
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np

import ppl_bdl as bdl
from ppl_bdl import __version__, backends
from ppl_bdl.cli import demo
from ppl_bdl.cli.data import bind, load_model, read_data
from ppl_bdl.cli.flags import add_method_flags, build_method, check_output, methods_text
from ppl_bdl.errors import ConfigError, InferenceError, PPLError
from ppl_bdl.inference.methods import options_page
from ppl_bdl.inference.vi import guides
from ppl_bdl.posterior.diagnostics import ConvergenceError, ConvergenceWarning


# -- commands -------------------------------------------------------------------------------------
def cmd_info(args: argparse.Namespace) -> int:
    """Backends (installed and known), kernels, guides and library versions."""

    def ver(dist: str) -> str:
        try:
            return version(dist)
        except PackageNotFoundError:
            return "not installed"

    print(f"ppl_bdl {__version__} (Python {platform.python_version()})")
    print(f"backends installed: {', '.join(backends.available()) or 'none'}")
    print(f"backends known:     {', '.join(sorted(backends.registered()))}")
    print(f"methods (fit method=): {methods_text()}")
    print(f"guides (method='vi'):  {', '.join(guides.available()) or 'none registered'}")
    print("versions:")
    for dist in ("numpy", "scipy", "arviz", "xarray", "matplotlib", *backends.libraries()):
        print(f"  {dist:<11} {ver(dist)}")
    return 0


def cmd_methods(args: argparse.Namespace) -> int:
    """Every method's options as Markdown tables (docs/methods.md is this page)."""
    print(options_page(), end="")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file; the demo writes into a folder.")
    names = args.backends or backends.available()
    # The demo names every file it writes BACKEND_*, so these are the ones it would overwrite.
    earlier = sorted(
        p.name for b in names for p in (out.glob(f"{b}_*") if out.is_dir() else []) if p.is_file()
    )
    if earlier and not args.force:
        shown = ", ".join(earlier[:3]) + (
            f" and {len(earlier) - 3} more" if len(earlier) > 3 else ""
        )
        raise ConfigError(
            f"--out {out} already holds {shown}; pass --force to overwrite them, or choose "
            "another --out."
        )
    demo.run_demo(
        out,
        backends=args.backends,
        quick=args.quick,
        seed=args.seed,
        full=args.full,
        sequential=args.sequential,
    )
    return 0


def _backend_name(name: str | None) -> str:
    """The backend ``fit`` will run on, resolved without importing it."""
    if name is None:
        return backends.default()
    if name not in backends.available():
        backends.get(name)  # raises the error that lists the installed backends
    return name


def cmd_fit(args: argparse.Namespace) -> int:
    method = build_method(args)  # first: it fails in a blink, the backend import does not
    backend = _backend_name(args.backend)
    model = load_model(args.model)
    out = Path(args.out or f"{model.name}_{backend}_{args.method}.nc")
    check_output(out, args.force)
    bound = bind(model, read_data(args.data))
    if args.threads:
        backends.get(backend).set_threads(args.threads)
    try:
        with warnings.catch_warnings():
            # The report is printed below, once, as a block after the summary.
            warnings.simplefilter("ignore", ConvergenceWarning)
            post = bdl.fit(  # read off the package when called: tests stand in for it
                bound,
                backend=backend,
                method=method,
                seed=args.seed,
                precision=args.precision,
                device=args.device,
                progress=args.progress,
                strict=args.strict,
            )
    except ConvergenceError as e:
        print(
            f"ppl-bdl fit: error (--strict): the fit did not pass its checks; nothing written "
            f"to {out}.\n{e.findings.report()}",
            file=sys.stderr,
        )
        return 1
    import pandas as pd

    with (
        warnings.catch_warnings(),
        pd.option_context("display.max_rows", 60, "display.max_columns", 20, "display.width", 140),
    ):
        warnings.simplefilter("ignore", ConvergenceWarning)  # said once, in the block below
        print(post.summary())
    if "diverging" in post.sample_stats:
        print(f"divergences: {int(np.sum(post.sample_stats['diverging']))}")
    if post.diagnostics:
        print(f"ppl-bdl fit: warning: {post.diagnostics.report()}", file=sys.stderr)
    out.parent.mkdir(parents=True, exist_ok=True)
    post.save(out)
    print(f"wrote {out.resolve()}")
    return 0


# -- parser -----------------------------------------------------------------------------------------
def _add_fit_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("every method")
    g.add_argument(
        "--data", metavar="FILE", required=True, help="a .npz, .csv or .json file (docs/cli.md)"
    )
    g.add_argument("--backend", metavar="NAME", help="pyro or numpyro (default: NumPyro)")
    g.add_argument("--method", metavar="NAME", default="nuts", help=f"one of {methods_text()}")
    g.add_argument("--seed", metavar="N", type=int, default=0)
    g.add_argument("--precision", default="float32", choices=["float32", "float64"])
    g.add_argument("--device", metavar="DEV", help="cpu, cuda, cuda:1, ... (the backend's)")
    g.add_argument(
        "--option",
        action="append",
        metavar="KEY=VALUE",
        help="a registered kernel's or guide's own setting (VALUE read as JSON)",
    )
    g.add_argument("--threads", metavar="N", type=int, help="intra-op CPU threads")
    g.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        help="a progress bar on stderr (default: on a terminal, unless $CI)",
    )
    g.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 and write nothing when the fit's checks find a problem",
    )
    g.add_argument("--out", metavar="FILE", help="NetCDF output (MODEL_BACKEND_METHOD.nc)")
    g.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    add_method_flags(p)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ppl-bdl",
        description="Write a Bayesian model once; run it on Pyro or NumPyro; read it in ArviZ.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("info", help="installed backends, kernels and versions")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("methods", help="every inference method's options, as tables")
    p.set_defaults(func=cmd_methods)

    p = sub.add_parser("demo", help="fit a BNN regression and eight schools on every backend")
    p.add_argument("--out", default="ppl_bdl_demo", help="output folder (default: ./ppl_bdl_demo)")
    p.add_argument("--backends", nargs="+", default=None, help="backends (default: all installed)")
    p.add_argument("--quick", action="store_true", help="very short chains (a smoke test)")
    p.add_argument(
        "--sequential",
        action="store_true",
        help="one backend after another in this process (default: a process per backend)",
    )
    p.add_argument(
        "--full", action="store_true", help="also the BNN by SGHMC and VI (a slower tour)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--force", action="store_true", help="overwrite the files of an earlier demo")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser(
        "fit",
        help="fit MODULE:MODEL to a data file and write NetCDF",
        description="Fit MODULE:MODEL to a data file and write the posterior as NetCDF. A flag "
        "that does not apply to --method is an error; see docs/cli.md.",
    )
    p.add_argument("model", help="MODULE:MODEL or path/to/file.py:MODEL")
    _add_fit_flags(p)
    p.set_defaults(func=cmd_fit)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ppl-bdl`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except PPLError as e:
        print(f"ppl-bdl {args.command}: {type(e).__name__}: {e}", file=sys.stderr)
        # 2 for a mistake in the input (as argparse exits), 1 for a run that failed
        return 1 if isinstance(e, InferenceError) else 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
