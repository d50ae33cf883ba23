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
import inspect
import json
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .cli_data import bind, load_model, read_data
from .errors import ConfigError, InferenceError, PPLError

# -- fit's settings, checked against the method before any backend is imported ----------------
#: The method families a setting can apply to: "vi", "sgmcmc" (every registered SG-MCMC kernel)
#: and the native samplers by name.
MCMC = ("nuts", "hmc", "sgmcmc")

#: First-class flags of ``fit`` (by ``fit`` keyword) and the methods each applies to. Settings
#: common to every method (--num-samples, --seed, ...) are not listed: they always apply.
FIT_FLAGS: dict[str, tuple[str, ...]] = {
    "num_warmup": MCMC,
    "num_chains": MCMC,
    "thinning": MCMC,
    "init": ("vi", *MCMC),  # VI's start is its init_loc
    "num_steps": ("vi", "hmc"),  # VI: optimizer steps; HMC: leapfrog steps per draw
    "step_size": MCMC,
    "batch_size": ("vi", "sgmcmc"),
    "schedule": ("vi", "sgmcmc"),
    "guide": ("vi",),
    "lr": ("vi",),
    "objective": ("vi",),
    "num_particles": ("vi",),
    "target_accept": ("nuts", "hmc"),
    "max_tree_depth": ("nuts",),
    "dense_mass": ("nuts", "hmc"),
}

#: ``fit`` keywords that every method takes and that have a flag; never an --option.
COMMON_FLAGS = ("num_samples", "seed", "precision", "device", "progress", "strict", "backend")

#: Where a flag does not apply, the flag that does the job there (if any).
_INSTEAD = {
    ("lr", "sgmcmc"): "--step-size (SG-MCMC's learning rate)",
    ("step_size", "vi"): "--lr",
    ("num_steps", "sgmcmc"): "--num-warmup, --num-samples (it runs warmup + samples x thinning)",
    ("num_steps", "nuts"): "--max-tree-depth (NUTS picks its number of steps per draw)",
    ("num_warmup", "vi"): "--num-steps",
    ("max_tree_depth", "hmc"): "--num-steps (HMC's fixed number of leapfrog steps)",
    ("schedule", "nuts"): "--step-size (adapted during warmup)",
    ("schedule", "hmc"): "--step-size (adapted during warmup)",
}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _family(method: str) -> str:
    """The method's family ("vi", "sgmcmc" or the native sampler's name); or an error."""
    from . import kernels

    if method == "vi":
        return "vi"
    if method not in kernels.available():
        methods = ", ".join([*kernels.available(), "vi"])
        raise ConfigError(f"--method {method!r}: unknown method; expected one of: {methods}.")
    return "sgmcmc" if kernels.get(method).kind == "sgmcmc" else method


def _family_text(families: Sequence[str]) -> str:
    from . import kernels

    sg = [k for k in kernels.available() if kernels.get(k).kind == "sgmcmc"]
    return ", ".join(f"SG-MCMC ({', '.join(sg)})" if f == "sgmcmc" else f for f in families)


def _guide_settings(guide: str | None) -> set[str]:
    """The settings of the named guide's factory; of every registered guide without a name (the
    guide ``fit`` picks by default is among them, and ``fit`` checks them against it)."""
    from . import guides

    names = guides.available() if guide is None else [guide]
    fixed = {"layout", "backend", "init", "seed"}
    return {p for g in names for p in inspect.signature(guides.get(g)).parameters} - fixed


def method_options(method: str, guide: str | None = None) -> list[str] | None:
    """The ``--option`` keys that apply to ``method`` (and, for VI, to ``guide``), read from the
    registries without importing a backend; None where a kernel takes any keyword.

    Example
    -------
    >>> "temperature" in method_options("sgld"), "num_steps" in method_options("sgld")
    (True, False)
    """
    from . import kernels

    family = _family(method)
    if family == "vi":
        from .inference.vi import RUN_OPTIONS

        keys = set(RUN_OPTIONS) | _guide_settings(guide) | {"log_likelihood"}
    elif family == "sgmcmc":
        from .inference.sgmcmc import DRIVER_OPTIONS, DRIVER_SUPPLIED

        params = inspect.signature(kernels.get(method).factory).parameters.values()
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            return None
        keys = {p.name for p in params if p.name not in DRIVER_SUPPLIED} | set(DRIVER_OPTIONS)
        keys |= {"hold_params", "log_likelihood"}
    else:
        from .fit import NATIVE_OPTIONS

        keys = set(NATIVE_OPTIONS) | {"hold_params", "log_likelihood"}
    # A setting with a flag reaches as far as its flag: --option num_steps=... is no more a
    # setting of NUTS than --num-steps is.
    return sorted(k for k in keys if k not in FIT_FLAGS or family in FIT_FLAGS[k])


def _option_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_options(items: Sequence[str] | None) -> dict[str, Any]:
    """``--option KEY=VALUE`` items -> a dict (VALUE read as JSON where it parses, else a string)."""
    options: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise ConfigError(
                f"--option {item!r}: expected KEY=VALUE, e.g. --option dense_mass=true."
            )
        key, value = item.split("=", 1)
        options[key.strip().replace("-", "_")] = _option_value(value)
    return options


def fit_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The method's settings from the flags and ``--option``, checked against ``--method``.

    Imports no backend: every check reads the registries of the core, so a flag or option that
    does not apply is an error at once, naming the flag, the method and what applies.
    """
    method = args.method
    family = _family(method)
    flags = {n: getattr(args, n) for n in FIT_FLAGS if getattr(args, n, None) is not None}
    for name in flags:
        if family not in FIT_FLAGS[name]:
            instead = _INSTEAD.get((name, family))
            applies = [_flag(n) for n in FIT_FLAGS if family in FIT_FLAGS[n]]
            raise ConfigError(
                f"{_flag(name)} does not apply to --method {method}; it applies to "
                f"{_family_text(FIT_FLAGS[name])}."
                + (f" For {method} use {instead}." if instead else "")
                + f" Flags for {method}: {', '.join(applies)}; more with --option KEY=VALUE "
                f"(`ppl-bdl fit --help`)."
            )
    options = parse_options(args.option)
    for key in options:
        if key in COMMON_FLAGS or key in ("num_warmup", "num_chains", "thinning", "init"):
            raise ConfigError(f"--option {key}=...: use the flag {_flag(key)}.")
        if key in flags or (key == "init_loc" and "init" in flags):
            flag = _flag("init" if key == "init_loc" else key)
            raise ConfigError(f"--option {key}=... and {flag} both set {key}; give it once.")
    settings = {**flags, **options}
    guide = settings.get("guide")
    if guide is not None:
        from . import guides

        _check_choice("--guide", guide, guides.available())
    allowed = method_options(method, guide)
    unknown = sorted(set(options) - set(allowed)) if allowed is not None else []
    if unknown:
        where = f"--method {method}" + (f" with --guide {guide}" if guide else "")
        flagged = [_flag(k) for k in allowed if k in FIT_FLAGS]
        raise ConfigError(
            f"--option {', '.join(unknown)}: not a setting of {where}. Its settings: "
            f"{', '.join(k for k in allowed if k not in FIT_FLAGS)}; and as flags: "
            f"{', '.join(flagged)}."
        )
    _check_values(settings, method, family)
    if family == "vi" and "init" in settings:
        settings["init_loc"] = settings.pop("init")
    return settings


def _check_choice(flag: str, value: Any, valid: Sequence[str]) -> None:
    if value not in valid:
        raise ConfigError(f"{flag} {value!r}: expected one of: {', '.join(valid)}.")


def _check_values(settings: dict[str, Any], method: str, family: str) -> None:
    """Names that the registries list are checked here, before the backend is imported; numbers
    were checked by the parser."""
    from . import kernels

    if "objective" in settings:
        from .objectives import OBJECTIVES

        _check_choice("--objective", settings["objective"], OBJECTIVES)
    if "schedule" in settings:
        from . import optim, schedules

        valid = optim.SCHEDULES if family == "vi" else schedules.SCHEDULES
        # cSGLD and cSGHMC (a kernel with exploration stages) run on the cyclical schedule only
        if (
            family == "sgmcmc"
            and "exploration" in inspect.signature(kernels.get(method).factory).parameters
        ):
            valid = ("cyclical",)
        _check_choice(f"--schedule (method {method})", settings["schedule"], valid)
    if settings.get("step_size") == "auto" and family != "sgmcmc":
        raise ConfigError(
            f"--step-size auto: only SG-MCMC picks its step size by a pilot run; {method} adapts "
            "its own during warmup: give a number > 0 or leave --step-size out."
        )
    init = settings.get("init")
    if isinstance(init, list) and family != "vi":
        raise ConfigError(
            f"--init: a flat array is VI's start only; for {method} give a JSON object of site "
            "values, e.g. --init '{\"sigma\": 1.0}', or a name (median, uniform, prior)."
        )
    if isinstance(init, str):
        names = ["median", "prior"] if family == "vi" else ["median", "uniform", "prior"]
        names.append("a JSON object of site values" + (" or array" if family == "vi" else ""))
        _check_choice(f"--init (method {method})", init, names)


def check_output(path: Path, force: bool, flag: str = "--out") -> None:
    """Refuse to overwrite ``path`` unless ``--force``; checked before the fit, not after it."""
    if path.is_dir():
        raise ConfigError(f"{flag} {path} is a folder; give a file name, e.g. {path / 'fit.nc'}.")
    if path.exists() and not force:
        raise ConfigError(
            f"{flag} {path} exists; pass --force to overwrite it, or choose another {flag}."
        )


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
    from . import backends

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
    from .demo import run_demo

    run_demo(out, backends=args.backends, quick=args.quick, seed=args.seed)
    return 0


def _backend_name(name: str | None) -> str:
    """The backend ``fit`` will run on, resolved without importing it."""
    from . import backends

    if name is None:
        return backends.default()
    if name not in backends.available():
        backends.get(name)  # raises the error that lists the installed backends
    return name


def cmd_fit(args: argparse.Namespace) -> int:
    settings = fit_settings(args)  # first: it fails in a blink, the backend import does not
    backend = _backend_name(args.backend)
    model = load_model(args.model)
    out = Path(args.out or f"{model.name}_{backend}_{args.method}.nc")
    check_output(out, args.force)
    bound = bind(model, read_data(args.data))

    import ppl_bdl as bdl

    from .diagnostics import ConvergenceError, ConvergenceWarning

    if args.threads:
        bdl.backends.get(backend).set_threads(args.threads)
    try:
        with warnings.catch_warnings():
            # The report is printed below, once, as a block after the summary.
            warnings.simplefilter("ignore", ConvergenceWarning)
            post = bdl.fit(
                bound, backend=backend, method=args.method, num_samples=args.num_samples,
                seed=args.seed, precision=args.precision, device=args.device,
                progress=args.progress, strict=args.strict, **settings,
            )  # fmt: skip
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
def _int_at_least(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _probability(text: str) -> float:
    value = _positive_float(text)
    if not value < 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1), got {text}")
    return value


def _step_size(text: str) -> float | str:
    return "auto" if text == "auto" else _positive_float(text)


def _init(text: str) -> Any:
    value = _option_value(text)
    return value if isinstance(value, dict | list) else text


def _add_fit_flags(p: argparse.ArgumentParser) -> None:
    # One flag a line reads as the table it is (docs/cli.md has the long form).
    # fmt: off
    g = p.add_argument_group("every method")
    g.add_argument("--data", metavar="FILE", required=True,
                   help="a .npz, .csv or .json file (docs/cli.md)")
    g.add_argument("--backend", metavar="NAME", help="pyro or numpyro (default: NumPyro)")
    g.add_argument("--method", metavar="NAME", default="nuts",
                   help="nuts (default), hmc, sgld, sghmc, psgld, csgld, csghmc or vi")
    g.add_argument("--num-samples", metavar="N", type=_int_at_least(1), default=1000,
                   help="draws kept per chain; VI: draws from the guide (1000)")
    g.add_argument("--seed", metavar="N", type=int, default=0)
    g.add_argument("--precision", default="float32", choices=["float32", "float64"])
    g.add_argument("--device", metavar="DEV", help="cpu, cuda, cuda:1, ... (the backend's)")
    g.add_argument("--init", type=_init,
                   help="median, prior, uniform (MCMC) or a JSON object; VI: its init_loc")
    g.add_argument("--option", action="append", metavar="KEY=VALUE",
                   help="any other setting of the method (VALUE read as JSON)")
    g.add_argument("--threads", metavar="N", type=_int_at_least(1),
                   help="intra-op CPU threads, where the backend has the setting")
    g.add_argument("--progress", action=argparse.BooleanOptionalAction,
                   help="a progress bar on stderr (default: on a terminal, unless $CI)")
    g.add_argument("--strict", action="store_true",
                   help="exit 1 and write nothing when the fit's checks find a problem")
    g.add_argument("--out", metavar="FILE", help="NetCDF output (MODEL_BACKEND_METHOD.nc)")
    g.add_argument("--force", action="store_true", help="overwrite --out if it exists")

    g = p.add_argument_group("MCMC (nuts, hmc and the SG-MCMC kernels)")
    g.add_argument("--num-warmup", metavar="N", type=_int_at_least(0), help="per chain (1000)")
    g.add_argument("--num-chains", metavar="N", type=_int_at_least(1), help="chains (4)")
    g.add_argument("--thinning", metavar="N", type=_int_at_least(1), help="keep every N-th (1)")
    g.add_argument("--step-size", metavar="X", type=_step_size,
                   help="SG-MCMC: a number or auto (default); NUTS/HMC: the initial one")
    g.add_argument("--target-accept", metavar="P", type=_probability, help="NUTS/HMC (0.8)")
    g.add_argument("--max-tree-depth", metavar="N", type=_int_at_least(1), help="NUTS (10)")
    g.add_argument("--dense-mass", action="store_true", default=None, help="NUTS/HMC")

    g = p.add_argument_group("VI (and --num-steps of HMC, --batch-size, --schedule of SG-MCMC)")
    g.add_argument("--num-steps", metavar="N", type=_int_at_least(1),
                   help="VI: optimizer steps; HMC: leapfrog steps per draw (10)")
    g.add_argument("--guide", metavar="NAME", help="meanfield (default), lowrank, fullrank, "
                   "flow, delta")
    g.add_argument("--lr", metavar="X", type=_positive_float, help="the learning rate")
    g.add_argument("--objective", metavar="NAME", help="elbo (default), renyi, iwae")
    g.add_argument("--num-particles", metavar="N", type=_int_at_least(1), help="per step (1)")
    g.add_argument("--batch-size", metavar="N", type=_int_at_least(1),
                   help="VI, SG-MCMC: minibatch size (default: the full data)")
    g.add_argument("--schedule", metavar="NAME",
                   help="VI: constant, exponential, cosine; SG-MCMC: constant, polynomial, "
                   "cyclical")
    # fmt: on


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
    p.add_argument("--force", action="store_true", help="overwrite the files of an earlier demo")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser(
        "fit",
        help="fit MODULE:MODEL to a data file and write NetCDF",
        description="Fit MODULE:MODEL to a data file and write the posterior as NetCDF. A flag "
        "that does not apply to --method is an error; see docs/cli.md.",
    )  # fmt: skip
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
