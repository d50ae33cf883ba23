"""Errors raised by ppl_bdl.

Every error says where the mistake is (the site or argument), what was seen, what was expected and
what to do. They subclass the built-in exception a Python user would expect (``ValueError``,
``TypeError``, ``RuntimeError``) so ``except ValueError`` keeps working.
"""

from __future__ import annotations

from typing import Any


class PPLError(Exception):
    """Base class of every ppl_bdl error."""


class ModelError(PPLError, ValueError):
    """A model is written or called in a way that cannot run (duplicate site, bad shape, ...)."""


class DistributionError(PPLError, ValueError):
    """A distribution was given a parameter outside its domain or shapes that cannot broadcast."""


class DataError(PPLError, ValueError):
    """Bound or observed data is malformed (NaN, inf, wrong type, wrong backend)."""


class ConfigError(PPLError, ValueError):
    """An inference setting is unknown or out of range."""


class BackendError(PPLError, ImportError):
    """A backend is unknown or not installed."""


class InferenceError(PPLError, RuntimeError):
    """An inference run failed part-way (NaN loss, diverging chain).

    ``partial`` holds what the run had produced before the failure (a Posterior, or the fitted
    state), so a long run is never lost to one bad step.
    """

    def __init__(self, message: str, partial: Any = None):
        super().__init__(message)
        self.partial = partial


class LongLoop(PPLError):
    """A loop (``bdl.scan``) too long to unroll into a trace of a whole function: a backend's
    :meth:`~ppl_bdl.backend_protocol.Autodiff.scan` raises it while its
    :meth:`~ppl_bdl.backend_protocol.Autodiff.trace` traces, and ``trace`` catches it and keeps
    the function untraced around the loop (whose step the backend traces on its own). The
    core's evaluator lets it through rather than running the loop in Python."""


class RunInterrupted(InferenceError):
    """A run stopped by Ctrl-C (KeyboardInterrupt); ``partial`` holds what it had finished."""


def one_of(
    kind: str, seen: object, valid: list[str] | tuple[str, ...], hint: str = ""
) -> ConfigError:
    """Build the error for a name that is not in a list of valid names."""
    listing = ", ".join(repr(v) for v in sorted(valid))
    msg = f"unknown {kind} {seen!r}; expected one of: {listing}."
    if hint:
        msg += " " + hint
    return ConfigError(msg)
