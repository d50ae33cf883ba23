"""``ppl-bdl fit``'s settings: which flag applies to which method, and every check of flags and
``--option`` keys that can run before a backend (torch or JAX, seconds to import) is loaded.

Example
-------
>>> "temperature" in method_options("sgld"), "num_steps" in method_options("sgld")
(True, False)
"""

from __future__ import annotations

import argparse
import inspect
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ppl_bdl.errors import ConfigError
from ppl_bdl.inference import optim
from ppl_bdl.inference.mcmc import kernels, schedules
from ppl_bdl.inference.mcmc.sgmcmc import DRIVER_OPTIONS, DRIVER_SUPPLIED
from ppl_bdl.inference.vi import guides
from ppl_bdl.inference.vi.objectives import OBJECTIVES
from ppl_bdl.inference.vi.runner import RUN_OPTIONS
from ppl_bdl.run.fit import NATIVE_OPTIONS

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
    if method == "vi":
        return "vi"
    if method not in kernels.available():
        methods = ", ".join([*kernels.available(), "vi"])
        raise ConfigError(f"--method {method!r}: unknown method; expected one of: {methods}.")
    return "sgmcmc" if kernels.get(method).kind == "sgmcmc" else method


def _family_text(families: Sequence[str]) -> str:
    sg = [k for k in kernels.available() if kernels.get(k).kind == "sgmcmc"]
    return ", ".join(f"SG-MCMC ({', '.join(sg)})" if f == "sgmcmc" else f for f in families)


def _guide_settings(guide: str | None) -> set[str]:
    """The settings of the named guide's factory; of every registered guide without a name (the
    guide ``fit`` picks by default is among them, and ``fit`` checks them against it)."""
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
    family = _family(method)
    if family == "vi":
        keys = set(RUN_OPTIONS) | _guide_settings(guide) | {"log_likelihood"}
    elif family == "sgmcmc":
        params = inspect.signature(kernels.get(method).factory).parameters.values()
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            return None
        keys = {p.name for p in params if p.name not in DRIVER_SUPPLIED} | set(DRIVER_OPTIONS)
        keys |= {"hold_params", "log_likelihood"}
    else:
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
    if "objective" in settings:
        _check_choice("--objective", settings["objective"], OBJECTIVES)
    if "schedule" in settings:
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
