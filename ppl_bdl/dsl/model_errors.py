"""Errors raised inside a model, re-raised as a ModelError that says where they happened.

Two kinds: shape errors of the array library, and a model value used as a Python value
(:func:`conversion_error`). First, shape errors.

A shape mismatch in a model surfaces from the array library with no site in sight
(``dot_general requires contracting dimensions to have the same shape``, ``mat1 and mat2 shapes
cannot be multiplied``). :meth:`BoundModel.run_with <ppl_bdl.dsl.model.BoundModel.run_with>` hands such
an error to :func:`shape_error`, which names the model, the model's line (the innermost frame in
the model's source file) and the site, as precisely as it can tell:

* the error came from inside a primitive (``sample`` building its value or log density): that
  site, which the runtime was computing when it failed;
* the failing expression lies inside the arguments of a ``sample`` / ``deterministic`` /
  ``factor`` / ``param`` call with a literal name on that line: that site;
* otherwise: after the last site the model finished, in the code before the next one.

Only errors whose message speaks of shapes, sizes, dimensions, broadcasting or bounds are
wrapped; errors of ppl_bdl itself and anything else pass through untouched.

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import dist
>>> @bdl.model
... def reg(X, y):
...     w = bdl.sample("w", dist.Normal(0.0, 1.0), shape=(3,))
...     with bdl.plate("data", X.shape[0]) as idx:
...         bdl.sample("y", dist.Normal(X[idx] @ w, 1.0), obs=y[idx])
>>> bdl.fit(reg(np.ones((4, 2)), np.zeros(4)), num_warmup=5, num_samples=5, num_chains=1)
Traceback (most recent call last):
...
ppl_bdl.errors.ModelError: model 'reg': a shape error in the arguments of site 'y', ...
"""

from __future__ import annotations

import ast
import inspect
import linecache
import re
import traceback
from typing import Any

import numpy as np

from ppl_bdl.errors import DataError, ModelError, PPLError

#: Words of the array libraries' shape errors (matmul, broadcasting, reshape, indexing).
_SHAPE_WORDS = re.compile(
    r"shape|size mismatch|size of tensor|cannot be multiplied|broadcasting|broadcast together|"
    r"out of bounds|out of range|dimension|contracting",
    re.IGNORECASE,
)
#: Not shape errors although they may use those words: a traced value used as a Python bool or
#: int, an argument of the wrong type (a list where an array is needed), a wrong dtype.
_NOT_SHAPE = re.compile(
    r"tracer|requires ndarray or scalar|must be of integer type|determine dtype|unsupported operand",
    re.IGNORECASE,
)
#: The primitives that name a site with their first argument.
_SITE_CALLS = frozenset({"sample", "deterministic", "factor", "param"})


def is_shape_error(err: BaseException) -> bool:
    """Whether ``err`` is an array library's shape error (and not already one of ours)."""
    if isinstance(err, PPLError) or not isinstance(
        err, TypeError | ValueError | RuntimeError | IndexError
    ):
        return False
    text = str(err)
    return bool(_SHAPE_WORDS.search(text)) and not _NOT_SHAPE.search(text)


def shape_error(model: Any, runtime: Any, err: BaseException) -> ModelError:
    """The ModelError for shape error ``err`` raised while ``model`` ran under ``runtime``."""
    text = _located(model, runtime, err, "a shape error")
    first = str(err).strip().split("\n--------------------")[0]  # JAX's traceback note
    text += (
        f"\n{type(err).__name__}: {first}\nCheck the shapes on that line: a site's shape= and "
        "plates, and the data's shapes, must agree (print x.shape inside the model to see them)."
    )
    return ModelError(text)


def _located(model: Any, runtime: Any, err: BaseException, what: str) -> str:
    """``model 'm': <what> <where>, at <file>:<line>:\n    <source line>``."""
    frame = _model_frame(err, getattr(getattr(model, "fn", None), "__code__", None))
    entered = getattr(runtime, "current_site", None)
    done = getattr(runtime, "last_site", None)
    site = None
    if entered is not None and entered != done:
        where = f"while computing site {entered!r} (its value or log density)"
    else:
        site = _site_of_expression(frame) if frame is not None else None
        if site is not None:
            where = f"in the arguments of site {site!r}"
        elif done is not None:
            where = f"after site {done!r} (the last site computed), before the next site"
        else:
            where = "before the first site"
    text = f"model {getattr(model, 'name', '?')!r}: {what} {where}"
    if frame is not None:
        text += f", at {frame.filename}:{frame.lineno}"
        if frame.line:
            text += f":\n    {frame.line.strip()}"
    return text


# -- data read past its end -------------------------------------------------------------------------
#: What the array libraries say of an index out of bounds: the axis and its size (torch:
#: "index 80 is out of bounds for dimension 0 with size 80"; JAX's checked indexing: "... of
#: shape (80,): index 80 is out of bounds for axis 0 with size 80").
_OUT_OF_BOUNDS = re.compile(
    r"index (-?\d+) is out of bounds for (?:axis|dimension) (\d+) with size (\d+)"
)


def read_past_the_end(bound: Any, runtime: Any, err: BaseException, plates: dict) -> DataError:
    """The DataError for data shorter than the plate whose indices read it: the site (and the
    model's line), the data's shape seen, the plate's size expected, and what to do.

    ``err`` is the array library's out-of-bounds error (or a ModelError caused by it);
    ``runtime`` the run it happened in (None: a run after which the site is found from the
    frames the backend attached, ``err.source_frames``); ``plates`` the plates entered, name ->
    size."""
    cause = err.__cause__ if isinstance(err, ModelError) and err.__cause__ is not None else err
    text = str(cause).strip().split("\n--------------------")[0]
    found = _OUT_OF_BOUNDS.search(text)
    where = _located(bound.model, runtime, cause, "reads data past its end")
    if found is None:  # an unknown wording: the library's own, with the plates
        listed = ", ".join(f"{n!r} (size {k})" for n, k in plates.items())
        return DataError(
            f"{where}\n{text} An array indexed with a plate's indices needs the plate's size on "
            f"that axis (plates: {listed}). Bind data of the plate's size, or give the plate "
            "the data's size."
        )
    index, axis, size = (int(g) for g in found.groups())
    longer = {n: k for n, k in plates.items() if k > size} or plates
    plate = " or ".join(f"{n!r} (size {k})" for n, k in longer.items())
    expected = " or ".join(str(k) for k in longer.values())
    data = _data_named(bound, axis, size)
    name = next(iter(longer)) if len(longer) == 1 else "..."
    return DataError(
        f"{where}\n{data} is indexed on axis {axis} with the indices of plate {plate}: "
        f"it has {size} entries on that axis, the plate expects {expected} (index {index} is "
        f"past its end). Bind data with {expected} entries on axis {axis}, or give the plate "
        f"the data's size (bdl.plate({name!r}, {size}), or the data's .shape[{axis}])."
    )


def _data_named(bound: Any, axis: int, size: int) -> str:
    """The bound argument that has ``size`` entries on ``axis`` (named, with its shape), where
    one alone has; else "an array of the model"."""
    try:
        bound_args = inspect.signature(bound.model.fn).bind(*bound.args, **bound.kwargs)
    except (TypeError, ValueError):
        return "an array of the model"
    matches = [
        (name, np.shape(value))
        for name, value in bound_args.arguments.items()
        if isinstance(value, np.ndarray) and value.ndim > axis and value.shape[axis] == size
    ]
    if len(matches) != 1:
        return f"an array of the model with {size} entries on axis {axis}"
    name, shape = matches[0]
    return f"the data {name!r} (shape {shape}), or an array made from it,"


# -- a model value used as a Python value ----------------------------------------------------------
class ValueConversionError(TypeError):
    """Raised by a backend when the model's code turns a model value into a Python bool, number
    or NumPy array in a validating run (on torch, where a traced step would otherwise freeze
    the outcome); :meth:`BoundModel.run_with <ppl_bdl.dsl.model.BoundModel.run_with>` turns it into
    the ModelError of :func:`conversion_error`."""


#: The array libraries' errors for the same mistake under a trace (JAX's, by class name), and
#: NumPy's for a ufunc applied to an array that opts out of them (``__array_ufunc__ = None``).
_CONVERSION_CLASSES = frozenset(
    {
        "ConcretizationTypeError",
        "TracerBoolConversionError",
        "TracerIntegerConversionError",
        "TracerArrayConversionError",
    }
)
_NO_UFUNCS = re.compile(r"does not support ufuncs")


def is_conversion_error(err: BaseException) -> bool:
    """Whether ``err`` says a model value was used as a Python bool, number or NumPy array."""
    if isinstance(err, ValueConversionError):
        return True
    if any(cls.__name__ in _CONVERSION_CLASSES for cls in type(err).__mro__):
        return True
    return isinstance(err, TypeError) and bool(_NO_UFUNCS.search(str(err)))


def conversion_error(model: Any, runtime: Any, err: BaseException) -> ModelError:
    """The ModelError for a model value used as a Python value (``if mu > 0:``): the same text
    on every backend."""
    text = _located(model, runtime, err, "a model value is used as a Python value")
    text += (
        "\nThe latent sites' values, the data, a plate's indices and everything computed from them "
        "are arrays that a fit traces once for all their values: Python cannot branch on them "
        "(`if`, `while`, `and`/`or`), turn them into Python numbers (`float(x)`, `int(x)`, "
        "`x.item()`) or NumPy arrays (`np.exp(x)`, a NumPy array indexed with a plate's indices). "
        "Instead: choose between values with ppl_bdl.dsl.math.where (`math.where(mu > 0, a, b)`); "
        "mask terms of the log density (multiply by a 0/1 mask, or math.where inside a factor); "
        "sum a discrete choice out (enumeration: math.logsumexp over its values, in a factor); "
        "compute with ppl_bdl.dsl.math instead of NumPy, and bind NumPy arrays as the model's data."
    )
    return ModelError(text)


def _model_frame(err: BaseException, code: Any) -> traceback.FrameSummary | None:
    """The innermost frame of the traceback in the model function's source file."""
    if code is None:
        return None
    # A backend that finds the error after the run (JAX's checked indexing) gives its frames.
    frames = list(traceback.extract_tb(err.__traceback__)) + list(getattr(err, "source_frames", []))
    frames = [f for f in frames if f.filename == code.co_filename]
    return frames[-1] if frames else None


def _site_of_expression(frame: traceback.FrameSummary) -> str | None:
    """The site whose primitive call, on the failing statement, contains the failing expression.

    Uses the expression's position (Python >= 3.11); without it, the one site call of the
    statement. None when the source cannot be read or no site call contains the expression.
    """
    source = "".join(linecache.getlines(frame.filename))
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    statement = _innermost_statement(tree, frame.lineno)
    if statement is None:
        return None
    calls = [(node, name) for node in ast.walk(statement) if (name := _site_name(node)) is not None]
    start = (frame.lineno, getattr(frame, "colno", None))
    end = (getattr(frame, "end_lineno", None), getattr(frame, "end_colno", None))
    if None in start or None in end:
        return calls[0][1] if len(calls) == 1 else None
    inside = [
        (node, name)
        for node, name in calls
        if (node.lineno, node.col_offset) <= start and end <= (node.end_lineno, node.end_col_offset)
    ]
    if not inside:
        return None
    node, name = min(
        inside, key=lambda c: (c[0].end_lineno - c[0].lineno, c[0].end_col_offset - c[0].col_offset)
    )
    return name


def _innermost_statement(tree: ast.AST, lineno: int) -> ast.stmt | None:
    best = None
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt) and node.lineno <= lineno <= (node.end_lineno or 0):
            if best is None or (node.end_lineno - node.lineno) <= (best.end_lineno - best.lineno):
                best = node
    return best


def _site_name(node: ast.AST) -> str | None:
    """The literal site name of a ``sample("y", ...)``-like call, else None."""
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if called not in _SITE_CALLS:
        return None
    arg = (
        node.args[0]
        if node.args
        else next((k.value for k in node.keywords if k.arg == "name"), None)
    )
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    return None
