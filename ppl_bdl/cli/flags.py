"""``ppl-bdl fit``'s method flags, made from the method classes' fields (one source): a new
field is a new flag. Every flag is checked against ``--method`` by building the method object
(:mod:`ppl_bdl.inference.method`), which imports no backend (torch or JAX, seconds to import),
so a flag that does not apply fails at once.

Example
-------
>>> "--target-accept" in [flag for flag, _ in method_flags()]
True
>>> applies_to("max_tree_depth")
['nuts']
"""

from __future__ import annotations

import argparse
import difflib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ppl_bdl.errors import ConfigError
from ppl_bdl.inference.method import Method, OptionInfo
from ppl_bdl.inference.methods import METHODS, SGMCMC, available, method_class, resolve_method

#: Fields of the method classes that are no flag: SGMCMC's kernel is ``--method`` itself.
NOT_FLAGS = ("kernel",)


def _classes() -> list[type[Method]]:
    return [*METHODS.values(), SGMCMC]


def flag(name: str) -> str:
    """``num_warmup`` -> ``--num-warmup``."""
    return "--" + name.replace("_", "-")


def method_flags() -> list[tuple[str, OptionInfo]]:
    """One flag per option name of any method (the first class's documentation), in order."""
    seen: dict[str, OptionInfo] = {}
    for cls in _classes():
        for info in cls.options():
            if info.name not in NOT_FLAGS:
                seen.setdefault(info.name, info)
    return [(flag(name), info) for name, info in seen.items()]


def applies_to(name: str) -> list[str]:
    """The methods (by name) that have the option ``name``."""
    return [m for m, cls in METHODS.items() if name in {o.name for o in cls.options()}]


def add_method_flags(parser: argparse.ArgumentParser) -> None:
    """Add a flag for every method option (values read as JSON where they parse, else text)."""
    group = parser.add_argument_group(
        "method options (each applies to the methods listed; see each method's class)"
    )
    for name, info in method_flags():
        methods = applies_to(info.name) or ["SG-MCMC kernels"]
        text = f"{info.doc} [{', '.join(methods)}; default {info.default!r}]".replace("%", "%%")
        if info.type == "bool":
            group.add_argument(name, action=argparse.BooleanOptionalAction, help=text)
        else:
            group.add_argument(name, type=option_value, metavar="X", help=text)


def option_value(text: str) -> Any:
    """A flag's value: JSON where it parses (numbers, true, lists, objects), else the text."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_options(items: Sequence[str] | None) -> dict[str, Any]:
    """``--option KEY=VALUE`` items -> a dict (VALUE read as JSON where it parses)."""
    options: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise ConfigError(f"--option {item!r}: expected KEY=VALUE, e.g. --option decay=0.9.")
        key, value = item.split("=", 1)
        options[key.strip().replace("-", "_")] = option_value(value)
    return options


def build_method(args: argparse.Namespace) -> Method:
    """The method object of ``--method`` and its flags (and ``--option`` items: a registered
    kernel's or guide's own settings), every value checked by its constructor."""
    cls = method_class(args.method)
    given = {
        info.name: getattr(args, info.name)
        for _, info in method_flags()
        if getattr(args, info.name, None) is not None
    }
    extra = parse_options(args.option)
    for key in extra:
        if key in given:
            raise ConfigError(f"--option {key}=... and {flag(key)} both set {key}; give it once.")
        if key in {info.name for _, info in method_flags()} or key in COMMON:
            raise ConfigError(f"--option {key}=...: use the flag {flag(key)}.")
    if cls is not SGMCMC:
        _check_applies(args.method, cls, list(given))
        _check_applies(args.method, cls, list(extra), given_as="--option ")
    return resolve_method(args.method, {**given, **extra})


#: ``fit`` keywords of every method that have a flag of their own.
COMMON = ("seed", "precision", "device", "progress", "strict", "backend")


def _check_applies(
    method: str, cls: type[Method], names: list[str], given_as: str | None = None
) -> None:
    own = [o.name for o in cls.options()]
    for name in names:
        if name in own:
            continue
        methods = applies_to(name)
        hint = cls.hints.get(name)
        close = difflib.get_close_matches(name, own, n=1, cutoff=0.6)
        shown = f"{given_as}{name}" if given_as else flag(name)
        text = f"{shown} does not apply to --method {method}"
        text += f"; it applies to {', '.join(methods)}" if methods else ""
        text += f". For {method}: {hint}" if hint else ""
        text += f". Did you mean {flag(close[0])}?" if close and not hint else ""
        raise ConfigError(
            f"{text}. Flags for {method}: {', '.join(flag(o) for o in own)} (`ppl-bdl fit --help`)."
        )


def check_output(path: Path, force: bool, flag_name: str = "--out") -> None:
    """Refuse to overwrite ``path`` unless ``--force``; checked before the fit, not after it."""
    if path.is_dir():
        raise ConfigError(
            f"{flag_name} {path} is a folder; give a file name, e.g. {path / 'fit.nc'}."
        )
    if path.exists() and not force:
        raise ConfigError(
            f"{flag_name} {path} exists; pass --force to overwrite it, or choose another "
            f"{flag_name}."
        )


def methods_text() -> str:
    """``--method``'s help: every method's name."""
    return ", ".join(available())
