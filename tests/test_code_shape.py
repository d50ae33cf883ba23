"""The code's shape: functions short enough to read whole (the design's rule: none over 100
lines, split by meaning). Complexity (branches, statements, McCabe) is ruff's, in pyproject.toml."""

from __future__ import annotations

import ast
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The packages whose functions are measured (ppl_bdl's links to backends/ and models/ skipped).
FOLDERS = ("ppl_bdl", "backends", "models")
MAX_LINES = 100


def _sources():
    for folder in FOLDERS:
        for directory, _, files in os.walk(ROOT / folder):  # links not followed
            yield from (Path(directory) / f for f in sorted(files) if f.endswith(".py"))


def _long_functions(path: Path) -> list[str]:
    """``file:line name (n lines)`` of each function or method in ``path`` over MAX_LINES, its
    docstring included (decorators not)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_LINES:
                where = f"{path.relative_to(ROOT)}:{node.lineno}"
                found.append(f"{where} {node.name} ({lines} lines)")
    return found


def test_no_function_is_over_100_lines():
    long = [entry for path in _sources() for entry in _long_functions(path)]
    assert not long, (
        f"functions over {MAX_LINES} lines (split them by meaning into named helpers): {long}"
    )


def test_the_measure_sees_every_package():
    files = {Path(p).relative_to(ROOT).parts[0] for p in _sources()}
    assert files == set(FOLDERS)


def test_every_test_listed_slow_exists():
    """tests/slow_tests.txt names tests that exist: a renamed or deleted test leaves no stale line
    (which would silently put its successor back into the default run)."""
    from conftest import _measured_slow

    tests = Path(__file__).parent
    for node in sorted(_measured_slow()):
        path, _, name = node.partition("::")
        function = name.split("[")[0]
        source = tests.parent / path
        assert source.is_file(), f"slow_tests.txt: {node}: no file {path}"
        assert f"def {function}(" in source.read_text(), f"slow_tests.txt: {node}: no {function}"
