"""Every inference method by name, and the string shortcut ``fit(model, method="sghmc", ...)``.

:func:`resolve_method` turns what ``fit`` is given into one method object: a name and options
build the method's class with them; an object given with options is copied with them
(``dataclasses.replace``, so its checks run again). Either way the same settings give the same
object, hence the same draws for the same seed.

Example
-------
>>> import ppl_bdl as bdl
>>> from ppl_bdl.inference.methods import resolve_method
>>> resolve_method("sghmc", {"step_size": 1e-3}) == bdl.SGHMC(step_size=1e-3)
True
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any

from ppl_bdl.errors import ConfigError
from ppl_bdl.inference.cavi.method import CAVI
from ppl_bdl.inference.ensemble import Ensemble
from ppl_bdl.inference.laplace import Laplace
from ppl_bdl.inference.mc_dropout import MCDropout
from ppl_bdl.inference.mcmc.kernels import registry
from ppl_bdl.inference.mcmc.methods import (
    HMC,
    NUTS,
    PSGLD,
    SGHMC,
    SGLD,
    SGMCMC,
    CyclicalSGHMC,
    CyclicalSGLD,
    kernel_method,
)
from ppl_bdl.inference.mcmc.replica_exchange import ReSGHMC, ReSGLD
from ppl_bdl.inference.method import Method
from ppl_bdl.inference.swag import SWAG
from ppl_bdl.inference.vi.method import VI

#: The methods with a class of their own, by the name ``fit(method=...)`` takes.
METHODS: dict[str, type[Method]] = {
    cls.method_name: cls
    for cls in (
        NUTS,
        HMC,
        SGLD,
        SGHMC,
        PSGLD,
        CyclicalSGLD,
        CyclicalSGHMC,
        ReSGLD,
        ReSGHMC,
        VI,
        CAVI,
        Ensemble,
        MCDropout,
        SWAG,
        Laplace,
    )
}

__all__ = ["METHODS", "SGMCMC", "available", "method_class", "resolve_method"]


def available() -> list[str]:
    """Every name ``fit(method=...)`` takes: the methods above and every registered kernel."""
    return sorted(set(METHODS) | set(registry.available()))


def method_class(name: str) -> type[Method]:
    """The class ``fit(method=name)`` builds (:class:`SGMCMC` for a registered kernel without a
    class of its own)."""
    if name in METHODS:
        return METHODS[name]
    if name in registry.available():
        return SGMCMC
    close = difflib.get_close_matches(str(name), available(), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ConfigError(
        f"method={name!r}: unknown method.{hint} Expected one of {available()}, or a method "
        "object such as bdl.NUTS(...)."
    )


def resolve_method(method: Any, options: dict[str, Any]) -> Method:
    """The method object ``fit`` runs: ``method`` (a name or a method object) with ``options``."""
    if isinstance(method, Method):
        return dataclasses.replace(method, **options) if options else method
    if not isinstance(method, str):
        raise ConfigError(
            f"method must be a method's name (one of {available()}) or a method object such as "
            f"bdl.NUTS(target_accept=0.9), got {method!r}."
        )
    cls = method_class(method)
    if cls is SGMCMC:
        return kernel_method(method, options)
    return cls(**options)


def options_page() -> str:
    """The docs' page of every method's options (docs/methods.md is this text; a test keeps it
    so): one table per method, read off the fields, with the flag ``ppl-bdl fit`` gives each.

    Example
    -------
    >>> "| `target_accept` (`--target-accept`) |" in options_page()
    True
    """
    parts = [
        "# Methods and their options",
        "",
        "Every method is a typed object (`bdl.NUTS(target_accept=0.9)`) and has a name for the",
        'string form (`bdl.fit(model, method="nuts", target_accept=0.9)`); both build the same',
        "object and give the same draws. Each option is checked when the object is built. The",
        "tables below are made from the classes' fields (`ppl-bdl methods`",
        "prints this page); `ppl-bdl fit` has a flag for each option.",
    ]
    classes = [*METHODS.items(), ("(a registered kernel)", SGMCMC)]
    for name, cls in classes:
        doc = (cls.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
        parts += [
            "",
            f'## `bdl.{cls.__name__}`: `method="{name}"`'
            if name in METHODS
            else f"## `bdl.{cls.__name__}`: {name}",
            "",
            " ".join(doc.split()),
            "",
        ]
        parts += ["| option | type | default | meaning |", "|---|---|---|---|"]
        for o in cls.options():
            cli = "--" + o.name.replace("_", "-")
            kind = o.type.replace("|", "\\|")  # a table's cell: its bar escaped
            parts.append(f"| `{o.name}` (`{cli}`) | `{kind}` | `{o.default!r}` | {o.doc} |")
    return "\n".join(parts) + "\n"
