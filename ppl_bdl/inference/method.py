"""Inference methods as typed objects: one frozen dataclass per method, its options as fields.

A method (:class:`~ppl_bdl.inference.mcmc.methods.NUTS`, :class:`~ppl_bdl.inference.vi.method.VI`,
...) is built once and checked once, at construction, as NumPyro's ``NUTS(...)`` and Optax's
transforms are: a bad value names the option, the value and the allowed range; a misspelt name
names the right one. ``fit(model, method=bdl.SGHMC(step_size=1e-3))`` runs it, and the string
form ``fit(model, method="sghmc", step_size=1e-3)`` builds the same object
(:func:`ppl_bdl.inference.methods.resolve_method`). The command line's flags and the docs' option
tables are read off the fields (:meth:`Method.options`), so a new field is a new flag.

A field is declared with :func:`option`, which keeps its documentation beside its default.

Example
-------
>>> import ppl_bdl as bdl
>>> bdl.NUTS(target_accept=0.9).target_accept
0.9
>>> bdl.NUTS(target_acept=0.9)
Traceback (most recent call last):
...
ppl_bdl.errors.ConfigError: unknown option 'target_acept' for method='nuts' (bdl.NUTS) (did you mean 'target_accept'?)...
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

from ppl_bdl.errors import ConfigError


def option(default: Any, doc: str) -> Any:
    """A method's field: its default and one line of documentation (the CLI's help, the docs'
    table).

    Example
    -------
    >>> from dataclasses import dataclass, fields
    >>> @dataclass(frozen=True)
    ... class Demo:
    ...     rate: float = option(0.1, "the rate")
    >>> fields(Demo)[0].metadata["doc"]
    'the rate'
    """
    if isinstance(default, list | dict | set):
        raise TypeError("an option's default must be immutable (a tuple, not a list)")
    return dataclasses.field(default=default, metadata={"doc": doc})


class OptionInfo(NamedTuple):
    """One option of a method, as the CLI and the docs read it."""

    name: str
    type: str
    default: Any
    doc: str


@dataclass(frozen=True)
class Method:
    """The base of every inference method.

    A method declares its options as fields (:func:`option`), checks them in
    ``__post_init__``, and runs on a prepared model in :meth:`run`. ``runs_chains``: its chains
    (ensemble: members) can be picked by ``chain_ids`` and handed to an executor in groups.
    ``hints`` maps an option it lacks to what to use instead (said in the error).
    """

    method_name: ClassVar[str] = ""
    runs_chains: ClassVar[bool] = False
    hints: ClassVar[dict[str, str]] = {}

    def __new__(cls, *args: Any, **kwargs: Any):
        # Unknown names are caught before dataclass's __init__ can raise a bare TypeError.
        check_names(cls, kwargs)
        return super().__new__(cls)

    @property
    def name(self) -> str:
        """The method's name as ``fit(method=...)`` spells it and ``post.method`` records it."""
        return self.method_name

    @property
    def num_chains_to_run(self) -> int:
        """How many chains (ensemble: members) the fit has; ``chain_ids`` index them."""
        return 1

    @classmethod
    def options(cls) -> list[OptionInfo]:
        """The method's options: name, type, default and documentation, in declaration order.

        Example
        -------
        >>> import ppl_bdl as bdl
        >>> [o.name for o in bdl.CAVI.options()]
        ['num_samples', 'num_steps', 'tol', 'restarts']
        """
        fields = {f.name: f for f in dataclasses.fields(cls)}
        return [
            OptionInfo(f.name, _type_text(f.type), f.default, f.metadata.get("doc", ""))
            for f in (fields[name] for name in _declaration_order(cls, fields))
        ]

    @classmethod
    def option_table(cls) -> str:
        """The options as a Markdown table (the docs' tables are made by this)."""
        rows = ["| option | type | default | meaning |", "|---|---|---|---|"]
        for o in cls.options():
            rows.append(f"| `{o.name}` | `{o.type}` | `{o.default!r}` | {o.doc} |")
        return "\n".join(rows)

    def given(self) -> dict[str, Any]:
        """The options that differ from their defaults and can be saved as settings (JSON
        values: numbers, strings, booleans)."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if is_plain(value) and value != f.default:
                out[f.name] = value
        return out

    def options_for(self, builder, base: type | None = None) -> dict[str, Any]:
        """The fields (of ``base``'s, when given) that ``builder`` takes as keywords: what a
        method hands the config its run is built from."""
        takes = inspect.signature(builder).parameters
        names = [f.name for f in dataclasses.fields(base or self)]
        return {n: getattr(self, n) for n in names if n in takes}

    def settings(self) -> dict[str, Any]:
        """What the fit saves in ``post.settings`` about the method."""
        return self.given()

    def run(self, setup, *, seed: int, progress: bool, log_likelihood: bool, chain_ids):
        """Run on a prepared model (:class:`~ppl_bdl.inference.setup.Setup`); a Posterior."""
        raise NotImplementedError

    def importance_log_weights(self, setup, post, seed: int):
        """Log-weights p/q of draws from a fitted approximation (the Pareto k̂ check); None for
        a method whose draws are not from an approximation with a density."""
        return None


def check_names(cls: type, given: dict[str, Any]) -> None:
    """A ConfigError for any name in ``given`` that is not an option of ``cls``, naming the
    closest option and what to use instead."""
    names = [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else []
    unknown = [k for k in given if k not in names]
    if not unknown or not names:
        return
    key = unknown[0]
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    hint = cls.hints.get(key)
    method = f"method={cls.method_name!r} (bdl.{cls.__name__})" if cls.method_name else cls.__name__
    if hint:
        text = f"{key}={given[key]!r} does not apply to {method}: {hint}"
    else:
        text = f"unknown option {key!r} for {method}"
        if close:
            text += f" (did you mean {close[0]!r}?)"
    if len(unknown) > 1:
        text += f" (nor {', '.join(repr(k) for k in unknown[1:])})"
    raise ConfigError(f"{text}. Its options: {', '.join(names)}.")


def check_params(setup, method: str, hold_params: bool) -> None:
    """MCMC samples latent sites only: a model's ``bdl.param`` sites would be held at their
    initial values, which is said and refused unless ``hold_params=True``."""
    if setup.params and not hold_params:
        names = sorted(setup.params)
        raise ConfigError(
            f"model {setup.bound.name!r} has bdl.param site(s) {names}; method={method!r} "
            "samples latent sites only and would hold them at their initial values. Fit them "
            "with method='vi' (point estimates; guide='delta' for MAP), make them latent "
            "(bdl.sample with a prior), or pass hold_params=True to hold them at the init "
            "given to bdl.param (e.g. a value a VI fit found: post.params)."
        )


# -- checks shared by the methods' constructors --------------------------------------------------
def _where(method: Method, name: str, value: Any) -> str:
    return f"{type(method).__name__}({name}={value!r})"


def check_int(method: Method, name: str, minimum: int = 1, *, optional: bool = False) -> None:
    """``method.name`` is an int >= ``minimum`` (None too, when ``optional``)."""
    value = getattr(method, name)
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(
            f"{_where(method, name, value)}: {name} must be an int >= {minimum}"
            + (" or None" if optional else "")
            + "."
        )


def check_number(
    method: Method,
    name: str,
    low: float | None = None,
    high: float | None = None,
    *,
    open_low: bool = True,
    open_high: bool = True,
    optional: bool = False,
) -> None:
    """``method.name`` is a number in the interval given (None too, when ``optional``)."""
    value = getattr(method, name)
    if value is None and optional:
        return
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if ok and low is not None:
        ok = value > low if open_low else value >= low
    if ok and high is not None:
        ok = value < high if open_high else value <= high
    if not ok and high is None and low is not None:
        bound = f"> {low:g}" if open_low else f">= {low:g}"
        raise ConfigError(
            f"{_where(method, name, value)}: {name} must be a number {bound}"
            + (" or None" if optional else "")
            + "."
        )
    if not ok:
        left = "(" if open_low else "["
        right = ")" if open_high else "]"
        interval = (
            f"{left}{'-inf' if low is None else low}, {'inf' if high is None else high}{right}"
        )
        raise ConfigError(
            f"{_where(method, name, value)}: {name} must be a number in {interval}"
            + (" or None" if optional else "")
            + "."
        )


def check_choice(
    method: Method, name: str, choices: Sequence[Any], *, optional: bool = False
) -> None:
    """``method.name`` is one of ``choices`` (None too, when ``optional``)."""
    value = getattr(method, name)
    if value is None and optional:
        return
    if isinstance(value, bool) or value not in choices:
        raise ConfigError(
            f"{_where(method, name, value)}: {name} must be one of "
            f"{', '.join(repr(c) for c in choices)}" + (" or None" if optional else "") + "."
        )


def check_bool(method: Method, name: str) -> None:
    value = getattr(method, name)
    if not isinstance(value, bool):
        raise ConfigError(f"{_where(method, name, value)}: {name} must be True or False.")


def _declaration_order(cls: type, fields: dict) -> list[str]:
    """The fields in declaration order, those of a base that lists its options after its
    subclasses' (``options_listed_last``: a shared set such as the MAP optimizer's) moved to
    the end; a field a subclass overrides stays in its base's set."""
    shared = [
        name
        for base in cls.__mro__
        if base.__dict__.get("options_listed_last")
        for name in base.__dict__.get("__annotations__", {})
        if name in fields
    ]
    return [name for name in fields if name not in shared] + shared


def is_plain(value: Any) -> bool:
    return value is None or isinstance(value, bool | int | float | str)


def _type_text(annotation: Any) -> str:
    return annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
