"""graphkit's public surface, pinned (issue 28 item 1): the exact ``__all__`` of every
``graphkit/**/__init__.py``. Adding or removing a public name is a decision: change the
table here, and docs/layout.md's "Public API" section with it."""

from __future__ import annotations

import ast
import importlib
import inspect
import pathlib

import pytest

import graphkit

ROOT = pathlib.Path(graphkit.__file__).parent

PUBLIC = {
    "graphkit": {"GraphkitError", "Lowering", "__version__", "export_model", "load_model", "open_session",
                 "rewrite_model", "save_model"},
    "graphkit.cli": {"main"},
    "graphkit.export": {"GAP_FILLERS", "Backend", "ExportReport", "Exporter", "Opset", "RewriteContext",
                        "RewriteRegistry", "TorchOps", "autograd_function", "export", "foreign_symbolic"},
    "graphkit.ops": {"Attr", "AttrType", "ChannelLinear", "Decomposition", "ForeignOp", "NativeKernels", "OpDef",
                     "OpPackage", "OpRegistry", "Param", "StandardOp", "broadcast", "default_registry", "discover"},
    "graphkit.rewrite": {"Builder", "GraphPass", "GraphSurgeonRule", "Lowering", "MatchContext", "MatchResult", "Rule",
                         "RuleSet", "Scope", "const", "either", "optional", "rewrite_file", "rewrite_model"},
    "graphkit.rewrite.fusions": {"LIBRARY", "Fusion", "get", "names", "rule_set"},
    "graphkit.rewrite.simplify": {"PASS_NAMES", "SimplifyOptions", "simplify_file", "simplify_model",
                                  "simplify_options"},
    "graphkit.runtime": {"Session", "open_session"},
}


def _packages() -> dict[str, pathlib.Path]:
    return {".".join(p.parent.relative_to(ROOT.parent).parts): p for p in sorted(ROOT.rglob("__init__.py"))}


def _declared_all(path: pathlib.Path) -> list[str] | None:
    """The names ``__all__`` lists in the file (None when it has none), without importing it."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return [e.value for e in getattr(node.value, "elts", ()) if isinstance(e, ast.Constant)]
    return None


def test_every_package_with_names_is_pinned():
    """A new __init__ declaring public names needs its row above; one without __all__ exports nothing."""
    for name, path in _packages().items():
        if name == "graphkit":
            continue  # its __all__ is built from the lazy table: checked below through the module
        declared = _declared_all(path)
        assert (declared is not None) == (name in PUBLIC), f"{path}: __all__ {declared!r}, pinned {name in PUBLIC}"


@pytest.mark.parametrize("package", sorted(PUBLIC))
def test_all_is_the_pinned_set(package):
    module = importlib.import_module(package)
    assert len(module.__all__) == len(set(module.__all__)), f"{package}.__all__ repeats a name"
    assert set(module.__all__) == PUBLIC[package], (
        f"{package}.__all__ changed: added {sorted(set(module.__all__) - PUBLIC[package])}, "
        f"removed {sorted(PUBLIC[package] - set(module.__all__))}; update tests/test_public_api.py and docs/layout.md")
    for name in module.__all__:
        assert getattr(module, name) is not None, f"{package}.{name}"


@pytest.mark.parametrize("package", sorted(PUBLIC))
def test_what_an_init_defines_is_public_or_underscored(package):
    """Classes and functions an __init__ defines itself are in __all__ or start with '_'."""
    module = importlib.import_module(package)
    defined = {name for name, value in vars(module).items()
               if (inspect.isclass(value) or inspect.isfunction(value)) and value.__module__ == package}
    hidden = sorted(n for n in defined - set(module.__all__) if not n.startswith("_"))
    assert not hidden, f"{package} defines {hidden} outside __all__: add them to it or prefix '_'"


def test_moved_top_level_names_say_where_they_went():
    for name in ("OpDef", "OpRegistry", "default_registry"):
        with pytest.raises(AttributeError, match="import it from graphkit.ops"):
            getattr(graphkit, name)
        assert hasattr(importlib.import_module("graphkit.ops"), name)


def test_the_count_docs_give():
    """docs/layout.md states the number of public names: it stays the table's."""
    total = sum(len(names) for names in PUBLIC.values())
    text = (ROOT.parent / "docs" / "layout.md").read_text()
    assert f"{total} public names" in text
