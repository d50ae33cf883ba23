"""Sphinx configuration: the user guide (Markdown, through MyST) and the API reference (autodoc).

Build with ``bash docs/build.sh``; the site lands in ``docs/_build/html``.
"""

from __future__ import annotations

import inspect
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Import the package from this checkout (``ppl_bdl/backends`` and ``ppl_bdl/models`` are the
# package-dir mappings of an editable install).
sys.path.insert(0, str(ROOT))
os.environ.setdefault("MPLBACKEND", "Agg")

project = "ppl_bdl"
author = "The ppl_bdl authors"
copyright = "the ppl_bdl authors"  # noqa: A001 (Sphinx's name)
release = version = __import__("ppl_bdl").__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "myst_parser",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "examples/README.md", "**/.ipynb_checkpoints"]
templates_path = ["_templates"]

# Markdown: "$x$" maths and heading anchors for the guide's in-page links.
myst_enable_extensions = ["dollarmath", "colon_fence"]
myst_heading_anchors = 3

# The API reference: NumPy-style docstrings, members in source order, signatures with hints.
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False
napoleon_use_ivar = True  # "Attributes" as fields, so a documented property is not described twice
autosummary_generate = True
autosummary_ignore_module_all = False
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True
autodoc_inherit_docstrings = False

# Every reference to ppl_bdl must resolve; references to other libraries (numpy, torch, jax,
# typing) are left unlinked, since the build reaches no other site.
nitpicky = True
nitpick_ignore_regex = [(r"py:.*", r"(?!ppl_bdl\b).*")]

# Classes re-exported by a public namespace are documented there only (autodoc marks their
# defining path as canonical, so references to either path resolve); the internals pages leave
# them out. The map is module -> names, for the autosummary template's ``:exclude-members:``.
PUBLIC_MODULES = (
    "ppl_bdl",
    "ppl_bdl.dist",
    "ppl_bdl.nn",
    "ppl_bdl.guides",
    "ppl_bdl.kernels",
    "ppl_bdl.ebm",
    "ppl_bdl.diffusion",
    "ppl_bdl.backends",
)


def _public_objects() -> dict[int, str]:
    """id(object) -> its public name, for every object a public namespace exports."""
    found: dict[int, str] = {}
    for modname in PUBLIC_MODULES:
        module = _import_target(modname)
        for name in getattr(module, "__all__", ()):
            found.setdefault(id(getattr(module, name)), f"{modname}.{name}")
    return found


def _public_classes_by_module() -> dict[str, list[str]]:
    by_module: dict[str, list[str]] = {}
    for modname in PUBLIC_MODULES:
        module = _import_target(modname)
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name)
            if inspect.isclass(obj) and obj.__module__.startswith("ppl_bdl."):
                by_module.setdefault(obj.__module__, []).append(obj.__qualname__)
    return by_module


_MISSING = object()


def _import_target(target: str):
    """The object at a dotted path (a module, or an attribute of one); _MISSING if none."""
    import importlib

    parts = target.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr, _MISSING)
            if obj is _MISSING:
                return _MISSING
        return obj
    return _MISSING


def _resolve_by_import(app, env, node, contnode):
    """Resolve a ``ppl_bdl`` reference the page index does not know by importing it.

    A re-export path (``ppl_bdl.dsl.nn.lift``) links to where the object is documented (its public
    name or its defining module). A path that exists but is undocumented (a private base class, a
    type alias) renders as text. A path that does not import is left to warn: that is a broken
    reference (a moved or renamed module) and fails the strict build.
    """
    target = node.get("reftarget", "")
    if node.get("refdomain") != "py" or not target.startswith("ppl_bdl"):
        return None
    obj = _import_target(target)
    if obj is _MISSING:
        return None
    domain = env.get_domain("py")
    names = [PUBLIC_NAMES.get(id(obj)), obj.__name__ if inspect.ismodule(obj) else None]
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if module and qualname:
        names.append(f"{module}.{qualname}")
    for name in filter(None, names):
        if name in domain.objects or name in domain.modules:
            return domain.resolve_xref(
                env, node["refdoc"], app.builder, node["reftype"], name, node, contnode
            )
    return contnode


PUBLIC_NAMES = _public_objects()
autosummary_context = {"public_classes": _public_classes_by_module()}


def setup(app):
    app.connect("missing-reference", _resolve_by_import)


html_theme = "furo"
html_title = f"ppl_bdl {release}"
html_static_path: list[str] = []
