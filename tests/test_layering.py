"""graphkit/rewrite/ imports one way: graphkit.rewrite.simplify sits above the engine (its
entry points call rewrite_model / rewrite_file with a SimplifyOptions, whose run and
write_file the engine calls), so nothing else in graphkit/rewrite/ imports it, not even
inside a function (docs/layout.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import graphkit.rewrite

REWRITE = Path(graphkit.rewrite.__file__).parent


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth of its code (absolute names)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_nothing_below_simplify_imports_it():
    below = [p for p in REWRITE.rglob("*.py") if "simplify" not in p.relative_to(REWRITE).parts[:1]]
    assert len(below) > 50 and REWRITE / "passes" / "simplify.py" in below
    wrong = {str(p.relative_to(REWRITE)): sorted(n for n in _imports(p) if n == "graphkit.rewrite.simplify"
                                                   or n.startswith("graphkit.rewrite.simplify."))
             for p in below}
    assert {k: v for k, v in wrong.items() if v} == {}


def test_the_import_finder_sees_imports_inside_functions(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from graphkit.rewrite.simplify._run import run_simplify\n")
    assert "graphkit.rewrite.simplify._run" in _imports(source)
