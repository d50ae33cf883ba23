"""The seam: every backend provides the whole Backend protocol, the core uses nothing else,
tests no backend's name, and the layers import each other in one direction only."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import ppl_bdl as bdl
from ppl_bdl import backend_protocol
from ppl_bdl.backend_protocol import Backend

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "ppl_bdl"
BACKENDS = ROOT / "backends"


def _protocol_members() -> set[str]:
    members: set[str] = set()
    for group in Backend.__mro__:
        if group.__module__ == backend_protocol.__name__:
            members |= set(getattr(group, "__annotations__", {}))
            members |= {n for n, v in vars(group).items() if callable(v) and not n.startswith("_")}
    return members


def test_every_backend_implements_the_protocol(backend):
    be = bdl.backends.get(backend)
    assert isinstance(be, Backend)
    missing = sorted(m for m in _protocol_members() if not hasattr(be, m))
    assert not missing, f"{backend} lacks {missing}"
    math_missing = [n for n in bdl.dsl.math.NAMES if n != "pi" and not hasattr(be.math, n)]
    assert not math_missing, f"{backend}.math lacks {math_missing}"


def _core_files():
    return sorted(CORE.rglob("*.py"))


#: Names the core gives a backend object.
BACKEND_NAMES = {"be", "backend", "_be"}


def _backend_attributes(tree: ast.AST) -> set[str]:
    """Attributes read off names that hold a backend (``be.x``, ``self.backend.x``, ...)."""
    found = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        value = node.value
        if isinstance(value, ast.Name) and value.id in BACKEND_NAMES:
            found.add(node.attr)
        elif isinstance(value, ast.Attribute) and value.attr in BACKEND_NAMES:
            found.add(node.attr)
    return found


def test_the_core_uses_only_declared_entry_points():
    members = _protocol_members()
    extra = {}
    for path in _core_files():
        used = _backend_attributes(ast.parse(path.read_text()))
        undeclared = used - members
        if undeclared:
            extra[str(path.relative_to(ROOT))] = sorted(undeclared)
    assert not extra, f"backend entry points used by the core but not in the protocol: {extra}"


def _docstring_nodes(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def test_the_core_tests_no_backend_name():
    """No string constant that is a backend's or array library's name, no ``array_family``."""
    names = {"pyro", "numpyro", "torch", "jax", "jaxlib"}
    found = []
    for path in _core_files():
        text = path.read_text()
        tree = ast.parse(text)
        docs = _docstring_nodes(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and id(node) not in docs and node.value in names:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
        if "array_family" in text:
            found.append(f"{path.relative_to(ROOT)}: array_family")
    assert not found, found


def test_backends_do_not_import_the_drivers():
    offenders = [
        str(p.relative_to(ROOT))
        for p in BACKENDS.rglob("*.py")
        if re.search(r"(from|import)\s+(\.\.|ppl_bdl\.)inference", p.read_text())
    ]
    assert not offenders, offenders


def _modules() -> dict[str, Path]:
    """Every module of the installed package, by its dotted name."""
    found = {}
    for folder, package in ((CORE, ["ppl_bdl"]), (BACKENDS, ["ppl_bdl", "backends"])):
        for path in folder.rglob("*.py"):
            parts = package + list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path) -> list[tuple[str, int, bool]]:
    """Every import statement of module ``name``, anywhere in it: (the module or ``module.name``
    it names, line, whether it sits inside a function). An import inside a function is an arrow
    of the layering like any other: it only runs later."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package[: len(package) - child.level + 1]
                    module = ".".join(base + ([child.module] if child.module else []))
                else:
                    module = child.module or ""
                found.append((module, child.lineno, in_function))
                found.extend((f"{module}.{a.name}", child.lineno, in_function) for a in child.names)
            elif isinstance(child, ast.Import):
                found.extend((a.name, child.lineno, in_function) for a in child.names)
            functions = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
            visit(child, in_function or isinstance(child, functions))

    visit(ast.parse(path.read_text()), False)
    return found


def _module_imports(name: str, path: Path) -> set[str]:
    """The ppl_bdl modules (or ``module.name``) that ``name`` imports, at its top or inside a
    function."""
    return {module for module, _, _ in _imports(name, path)}


def _function_level_imports() -> list[tuple[str, int, str]]:
    """(file, line, module) of every import statement inside a function that names one of the
    package's own modules (the most specific one it names)."""
    modules, found = _modules(), []
    for name, path in modules.items():
        by_line: dict[int, str] = {}
        for module, line, in_function in _imports(name, path):
            if in_function and module in modules:
                by_line[line] = max(by_line.get(line, ""), module, key=len)
        found += [(str(path.relative_to(ROOT)), line, m) for line, m in by_line.items()]
    return found


#: A backend module may import its own heavy pieces (``numpyro.infer``, ``funsor``, ``torch.fx``
#: behind ``backends/numpyro/mcmc.py``, ``_numpyro_enum.py``, ``_jax_lift.py``, ``_pyro_*.py``,
#: ``_torch_lift.py``) when an entry point that needs them is first called, so that getting a
#: backend stays fast. These are the only imports of the package's own modules inside functions
#: that stay: 12 today (NumPyro 7, Pyro 5).
LAZY_BACKEND_PIECES = 12


def test_imports_inside_functions_are_few():
    """Heavy third-party libraries (torch, jax, pyro, numpyro, arviz, xarray, matplotlib) are
    imported inside functions, so ``import ppl_bdl`` imports no backend library; the package's
    own modules are imported at the top, where the layering can see them."""
    found = _function_level_imports()
    pieces = [
        f for f in found if f[0].startswith("backends/") and f[2].startswith("ppl_bdl.backends.")
    ]
    other = [f for f in found if f not in pieces]
    assert not other, f"imports of the package's own modules inside functions: {other}"
    assert len(pieces) <= LAZY_BACKEND_PIECES, pieces


def test_importing_the_package_imports_no_backend_library():
    import subprocess
    import sys

    code = "import sys, ppl_bdl; print([m for m in ('torch', 'jax', 'pyro', 'numpyro', 'ray') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_no_import_cycles():
    """The layers read in one direction, counting imports inside functions too."""
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        imported = {m for m in _module_imports(name, path) if m in modules and m != name}
        # A package's __init__ importing its own submodules is not a cycle of the layers.
        graph[name] = {m for m in imported if not m.startswith(name + ".")}
    cycles, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        for nxt in graph[node]:
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = "done"

    for node in graph:
        if node not in state:
            visit(node, [node])
    assert not cycles, cycles
