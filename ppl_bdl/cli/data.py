"""Reading the ``ppl-bdl fit`` command's inputs: the data file into the model's arguments by
name, the model from ``MODULE:MODEL``, and the two bound together (docs/cli.md).

Example
-------
>>> load_model("ppl_bdl.models.regression:linear_regression").name
'linear_regression'
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from ppl_bdl.dsl.model import Model
from ppl_bdl.errors import ConfigError, DataError

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
            f"model {target!r} is a {type(found).__name__}, not a model made with @ppl_bdl.dsl.model."
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
        n
        for n, p in params.items()
        if p.default is inspect.Parameter.empty
        and n not in data
        and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    if missing:
        raise DataError(
            f"--data lacks {missing}, which {model.name}() needs; it has {sorted(data)}."
        )
    return model(**data)
