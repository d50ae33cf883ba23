"""The ``ppl-bdl`` command line: ``demo``, ``fit`` and ``info``.

Examples
--------
::

    ppl-bdl info
    ppl-bdl demo --out demo_out --backends numpyro
    ppl-bdl fit ppl_bdl.models.regression:linear_regression --data data.csv \\
        --backend pyro --method nuts --num-warmup 500 --num-samples 500 --out post.nc

``fit`` reads the data into the model's arguments by name: the keys of a ``.npz`` or ``.json``
file, or the columns of a ``.csv`` file, where columns ``X.0, X.1, ...`` (or ``X[0], X[1], ...``)
are stacked into a matrix argument ``X`` and a column ``y`` is a vector argument ``y``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ConfigError, DataError, PPLError

_MATRIX_COLUMN = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)(\.(?P<i>\d+)|\[(?P<j>\d+)\])$")


# -- data -----------------------------------------------------------------------------------------
def _scalar(value: np.ndarray) -> Any:
    """0-d arrays become Python numbers (a plate size or ``K`` must be an int)."""
    if value.ndim == 0:
        return value.item()
    return value


def read_data(path: str | Path) -> dict[str, Any]:
    """Read ``path`` (.npz, .csv or .json) into a dict of model arguments.

    Example
    -------
    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "d.csv")
    >>> _ = open(p, "w").write("X.0,X.1,y\\n1,2,3\\n4,5,6\\n")
    >>> sorted((k, v.shape) for k, v in read_data(p).items())
    [('X', (2, 2)), ('y', (2,))]
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"--data: no file at {path}.")
    suffix = path.suffix.lower()
    if suffix == ".npz":
        with np.load(path, allow_pickle=False) as f:
            return {k: _scalar(np.asarray(f[k])) for k in f.files}
    if suffix == ".json":
        with open(path) as f:
            raw = json.load(f)
        if not isinstance(raw, dict):
            raise DataError(f"--data {path}: a JSON file must hold an object of name -> value.")
        return {k: np.asarray(v) if isinstance(v, list) else v for k, v in raw.items()}
    if suffix == ".csv":
        import pandas as pd

        frame = pd.read_csv(path)
        out: dict[str, Any] = {}
        matrices: dict[str, dict[int, np.ndarray]] = {}
        for column in frame.columns:
            m = _MATRIX_COLUMN.match(str(column))
            if m:
                index = int(m.group("i") if m.group("i") is not None else m.group("j"))
                matrices.setdefault(m.group("name"), {})[index] = frame[column].to_numpy()
            else:
                out[str(column)] = frame[column].to_numpy()
        for name, cols in matrices.items():
            if name in out:
                raise DataError(f"--data {path}: column {name!r} and columns {name}.0, ... clash.")
            if sorted(cols) != list(range(len(cols))):
                raise DataError(
                    f"--data {path}: matrix columns of {name!r} must be numbered 0..{len(cols) - 1}, "
                    f"got {sorted(cols)}."
                )
            out[name] = np.column_stack([cols[i] for i in range(len(cols))])
        return out
    raise DataError(f"--data {path}: unsupported file type {suffix!r}; use .npz, .csv or .json.")


def load_model(target: str):
    """``module:attribute`` (or ``path/to/file.py:attribute``) -> the :class:`~ppl_bdl.Model`."""
    from .model import Model

    if ":" not in target:
        raise ConfigError(
            f"model {target!r}: expected MODULE:MODEL, e.g. ppl_bdl.models.regression:linear_regression."
        )
    module_name, attr = target.rsplit(":", 1)
    if module_name.endswith(".py"):
        path = Path(module_name)
        if not path.is_file():
            raise ConfigError(f"model {target!r}: no file {path}.")
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise ConfigError(f"model {target!r}: cannot import {module_name!r} ({e}).") from None
    if not hasattr(module, attr):
        models = sorted(k for k, v in vars(module).items() if isinstance(v, Model))
        raise ConfigError(f"model {target!r}: {module_name} has no {attr!r}; its models: {models}.")
    found = getattr(module, attr)
    if not isinstance(found, Model):
        raise ConfigError(
            f"model {target!r} is a {type(found).__name__}, not a model made with @ppl_bdl.model."
        )
    return found


def bind(model, data: dict[str, Any]):
    """Bind ``data`` to ``model`` by argument name; clear errors for missing or unknown names."""
    params = inspect.signature(model.fn).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    unknown = [k for k in data if k not in params and not takes_any]
    if unknown:
        raise DataError(
            f"--data has {unknown}, which {model.name}() does not take; its arguments: {list(params)}."
        )
    missing = [
        n for n, p in params.items()
        if p.default is inspect.Parameter.empty and n not in data
        and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]  # fmt: skip
    if missing:
        raise DataError(
            f"--data lacks {missing}, which {model.name}() needs; it has {sorted(data)}."
        )
    return model(**data)


def _option_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


# -- commands -------------------------------------------------------------------------------------
def cmd_info(args: argparse.Namespace) -> int:
    """Backends (installed and known), kernels, guides and library versions."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    import ppl_bdl as bdl

    def ver(dist: str) -> str:
        try:
            return version(dist)
        except PackageNotFoundError:
            return "not installed"

    print(f"ppl_bdl {bdl.__version__} (Python {platform.python_version()})")
    print(f"backends installed: {', '.join(bdl.backends.available()) or 'none'}")
    print(f"backends known:     {', '.join(sorted(bdl.backends.registered()))}")
    print(f"kernels (fit method=): {', '.join(bdl.kernels.available())}, vi")
    print(f"guides (method='vi'):  {', '.join(bdl.guides.available()) or 'none registered'}")
    print("versions:")
    for dist in ("numpy", "scipy", "arviz", "xarray", "matplotlib", *bdl.backends.libraries()):
        print(f"  {dist:<11} {ver(dist)}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    run_demo(args.out, backends=args.backends, quick=args.quick, seed=args.seed)
    return 0


def cmd_fit(args: argparse.Namespace) -> int:
    import ppl_bdl as bdl

    model = load_model(args.model)
    bound = bind(model, read_data(args.data))
    options = {}
    for item in args.option or []:
        if "=" not in item:
            raise ConfigError(
                f"--option {item!r}: expected KEY=VALUE, e.g. --option dense_mass=true."
            )
        key, value = item.split("=", 1)
        options[key.strip().replace("-", "_")] = _option_value(value)
    for key in ("target_accept", "max_tree_depth"):
        if getattr(args, key) is not None:
            options[key] = getattr(args, key)
    if args.dense_mass:
        options["dense_mass"] = True
    if args.threads:
        bdl.backends.get(args.backend).set_threads(args.threads)
    post = bdl.fit(
        bound, backend=args.backend, method=args.method, num_warmup=args.num_warmup,
        num_samples=args.num_samples, num_chains=args.num_chains, thinning=args.thinning,
        seed=args.seed, precision=args.precision, progress=args.progress, **options,
    )  # fmt: skip
    import pandas as pd

    with pd.option_context("display.max_rows", 60, "display.max_columns", 20, "display.width", 140):
        print(post.summary())
    if "diverging" in post.sample_stats:
        print(f"divergences: {int(np.sum(post.sample_stats['diverging']))}")
    out = Path(args.out or f"{model.name}_{args.backend}_{args.method}.nc")
    out.parent.mkdir(parents=True, exist_ok=True)
    post.save(out)
    print(f"wrote {out.resolve()}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ppl-bdl",
        description="Write a Bayesian model once; run it on Pyro or NumPyro; read it in ArviZ.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("info", help="installed backends, kernels and versions")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("demo", help="fit a BNN regression and eight schools on every backend")
    p.add_argument("--out", default="ppl_bdl_demo", help="output folder (default: ./ppl_bdl_demo)")
    p.add_argument("--backends", nargs="+", default=None, help="backends (default: all installed)")
    p.add_argument("--quick", action="store_true", help="very short chains (a smoke test)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("fit", help="fit MODULE:MODEL to a data file and write NetCDF")
    p.add_argument("model", help="MODULE:MODEL or path/to/file.py:MODEL")
    p.add_argument(
        "--data", required=True, help="a .npz, .csv or .json file; names = model arguments"
    )
    p.add_argument("--backend", default=None, help="default: NumPyro if installed")
    p.add_argument("--method", default="nuts")
    p.add_argument("--num-warmup", type=int, default=None, help="MCMC (default 1000)")
    p.add_argument("--num-samples", type=int, default=1000)
    p.add_argument("--num-chains", type=int, default=None, help="MCMC (default 4)")
    p.add_argument("--thinning", type=int, default=None, help="MCMC (default 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--precision", default="float32", choices=["float32", "float64"])
    p.add_argument("--target-accept", type=float, default=None)
    p.add_argument("--max-tree-depth", type=int, default=None)
    p.add_argument("--dense-mass", action="store_true")
    p.add_argument(
        "--option", action="append", metavar="KEY=VALUE", help="any other fit option (JSON value)"
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="intra-op CPU threads (where the backend has the setting)",
    )
    p.add_argument("--progress", action="store_true", help="show a progress bar")
    p.add_argument("--out", default=None, help="NetCDF output (default: MODEL_BACKEND_METHOD.nc)")
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
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
