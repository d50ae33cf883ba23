"""Every shipped model and the docs' models run with NumPy values on both sides of their operators.

Each model's source is rewritten (:class:`NumPyIdentities`): every operand of a binary operator
or comparison and every name the model reads goes through ``numpy_identity``, which applies a
NumPy identity to a float array of the backend, alternately with the NumPy value on the left
and on the right (``np.zeros(()) + x``, ``x * np.ones(())``, ``-(np.zeros(()) - x)``, ...).
The rewritten model must have the same potential and gradient as the original through the path
the samplers use (the traced step on torch), and fit with NUTS and VI (``-m slow`` for all of
them; the README's model by default).
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
from potentials import assert_fits, assert_same_potential

import ppl_bdl as bdl
from ppl_bdl import dist, models, nn
from ppl_bdl import math as bm

ROOT = Path(__file__).resolve().parents[1]
ZERO, ONE = np.zeros(()), np.ones(())
IDENTITIES = (
    lambda x: ZERO + x,
    lambda x: x * ONE,
    lambda x: -(ZERO - x),
    lambda x: x + ZERO,
    lambda x: ONE * x,
    lambda x: x - ZERO,
    lambda x: x / ONE,
)


def numpy_identity(x, k: int):
    """``x`` through the ``k``-th NumPy identity if it is a float array of a backend."""
    dtype = getattr(x, "dtype", None)
    if isinstance(x, np.ndarray) or dtype is None or "float" not in str(dtype):
        return x
    return IDENTITIES[k % len(IDENTITIES)](x)


class NumPyIdentities(ast.NodeTransformer):
    """Route the operands of operators and comparisons, and the names read, through
    ``numpy_identity``."""

    def __init__(self):
        self.count = 0

    def wrap(self, node: ast.expr) -> ast.expr:
        self.count += 1
        call = ast.Call(
            ast.Name("numpy_identity", ast.Load()), [node, ast.Constant(self.count)], []
        )
        return ast.copy_location(call, node)

    def visit_BinOp(self, node: ast.BinOp) -> ast.expr:
        self.generic_visit(node)
        node.left, node.right = self.wrap(node.left), self.wrap(node.right)
        return node

    def visit_Compare(self, node: ast.Compare) -> ast.expr:
        self.generic_visit(node)
        node.left = self.wrap(node.left)
        node.comparators = [self.wrap(c) for c in node.comparators]
        return node

    def visit_Name(self, node: ast.Name) -> ast.expr:
        return self.wrap(node) if isinstance(node.ctx, ast.Load) else node


def _compile(function: ast.FunctionDef, namespace: dict, filename: str, rewrite: bool):
    function = ast.parse(ast.unparse(function)).body[0]  # a fresh copy
    function.decorator_list = []
    if rewrite:
        function = NumPyIdentities().visit(function)
        namespace = {**namespace, "numpy_identity": numpy_identity}
    module = ast.fix_missing_locations(ast.Module([function], []))
    exec(compile(module, filename, "exec"), namespace)  # noqa: S102
    return bdl.model(namespace[function.name])


def rewritten(model: bdl.Model) -> bdl.Model:
    """``model`` with NumPy identities on both sides of its operators."""
    fn = model.fn
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    namespace = dict(fn.__globals__)
    if fn.__closure__:  # a model made by a factory (the BNNs): its free variables as globals
        namespace.update(
            zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__), strict=True)
        )
    return _compile(tree.body[0], namespace, inspect.getsourcefile(fn), rewrite=True)


def docs_models() -> dict[str, tuple]:
    """The models of the README's example and docs/dsl.md, original and rewritten, bound."""
    # (docs/dsl.md's constant W is defined next to its model)
    namespace = {"np": np, "bdl": bdl, "dist": dist, "bm": bm, "nn": nn, "W": np.arange(1.0, 4.0)}
    functions = {}
    for page in ("README.md", "docs/dsl.md"):
        for block in re.findall(r"```python\n(.*?)```", (ROOT / page).read_text(), re.S):
            for node in ast.parse(block).body:
                if (
                    isinstance(node, ast.FunctionDef)
                    and node.decorator_list
                    and "model" in ast.unparse(node.decorator_list[0])
                ):
                    functions[node.name] = (node, page)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(12, 3))
    y = X @ np.array([1.0, -2.0, 0.5]) + 0.3 * rng.normal(size=12)
    data = {"linreg": (X, y), "bnn": (X, y), "robust": (y,), "weighted": (y[:3],), "mixture": (y,)}
    assert set(functions) == set(data), sorted(functions)
    return {
        name: tuple(
            _compile(node, namespace, page, rewrite)(*data[name]) for rewrite in (False, True)
        )
        for name, (node, page) in functions.items()
    }


EXAMPLES = models.examples()
DOCS = docs_models()
CASES = {
    **{
        name: (bound, rewritten(bound.model)(*bound.args, **bound.kwargs))
        for name, bound in EXAMPLES.items()
    },
    **{f"docs:{name}": pair for name, pair in DOCS.items()},
}


def test_the_rewrite_puts_numpy_on_both_sides_of_every_operator():
    """The rewrite changes every model (a test that rewrote nothing would pass trivially)."""
    for name, (_, changed) in CASES.items():
        assert "numpy_identity" in changed.model.fn.__code__.co_names, name
    assert len(CASES) == len(EXAMPLES) + 5


#: By default: the docs' models on every backend, and on torch one shipped model of each kind
#: (hierarchical, BNN, mixture with enumeration, scan); every model everywhere under -m slow.
ON_TORCH = {
    "eight_schools_noncentered",
    "bnn_classification",
    "gaussian_mixture",
    "stochastic_volatility",
    "kidiq",
}
DEFAULT = [
    (b, n)
    for b in bdl.backends.available()
    for n in sorted(CASES)
    if n.startswith("docs:") or (b == "pyro" and n in ON_TORCH)
]
REST = [(b, n) for b in bdl.backends.available() for n in sorted(CASES) if (b, n) not in DEFAULT]


@pytest.mark.parametrize(("backend", "name"), DEFAULT)
def test_numpy_on_both_sides_gives_the_same_potential(backend, name):
    _check_potential(backend, name)


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "name"), REST)
def test_numpy_on_both_sides_gives_the_same_potential_everywhere(backend, name):
    _check_potential(backend, name)


def _check_potential(backend, name):
    original, changed = CASES[name]
    be = bdl.backends.get(backend)
    from ppl_bdl.trace.layout import LatentLayout, trace_model

    dim = LatentLayout.from_sites(trace_model(original, be), be).dim
    assert_same_potential(changed, original, backend, dim)


def test_the_readme_model_fits_with_numpy_on_both_sides():
    assert_fits(DOCS["linreg"][1], "pyro")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_every_model_fits_with_numpy_on_both_sides(backend, name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_fits(CASES[name][1], backend)
