"""Every docstring example in the library runs (doctest), on the installed package."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest


def _modules() -> list[str]:
    import ppl_bdl.backends
    import ppl_bdl.models

    names = ["ppl_bdl", "ppl_bdl.backends", "ppl_bdl.models"]
    for package in (ppl_bdl, ppl_bdl.backends, ppl_bdl.models):
        prefix = package.__name__ + "."
        names += [info.name for info in pkgutil.walk_packages(package.__path__, prefix=prefix)]
    return sorted({n for n in names if not n.endswith("__main__")})


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE | doctest.IGNORE_EXCEPTION_DETAIL
    result = doctest.testmod(module, optionflags=flags, verbose=False)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"
