"""Importing code the user names on the command line (rules files, model factories).

Only ever called with a path or module name the user typed; nothing in a model file
reaches it.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
import types
from pathlib import Path

from graphkit.errors import GraphkitError, UsageError

__all__ = ["import_user_code"]


def import_user_code(source: str, *, what: str, failure: type[GraphkitError], example: str) -> types.ModuleType:
    """Import ``source``: a .py file, a package folder or an importable module name.

    The rule, in order: a name ending in ``.py`` is a file; an existing folder holding
    ``__init__.py`` is that package (see :func:`_import_folder`); a name holding a path
    separator, or an existing file, is a file; anything else is a module name, imported
    from ``sys.path`` (a folder without ``__init__.py`` included: it may name a namespace
    package or an installed module). A dotted name whose first part is a package folder in
    the working directory is imported from there.

    UsageError when it cannot be found; ``failure`` (naming ``source``) when its code
    raises or exits while importing, or when another module of the package's name is
    already imported.
    """
    path = Path(source)
    try:
        if not source.endswith(".py") and path.is_dir() and (path / "__init__.py").is_file():
            return _import_folder(path, source, what=what, failure=failure)
        if source.endswith(".py") or os.sep in source or (os.altsep or os.sep) in source or path.is_file():
            if not path.is_file():
                kind = "a folder without __init__.py" if path.is_dir() else "no such file"
                raise UsageError(f"{what}: {kind}", path=source,
                                 hint=f"name a .py file or a folder holding __init__.py; for example {example}")
            return _import_file(path)
        top = source.partition(".")[0]
        if top.isidentifier() and (Path(top) / "__init__.py").is_file():
            _import_folder(Path(top), top, what=what, failure=failure)  # the package, from the working directory
        return importlib.import_module(source)
    except GraphkitError:
        raise
    except ModuleNotFoundError as exc:
        if exc.name and source.startswith(exc.name):
            folder = f" ('{source}' here is a folder without __init__.py)" if path.is_dir() else ""
            raise UsageError(f"{what}: no module named {source!r}{folder}", path=source,
                             hint="pass a .py file path, a package folder or an importable module name "
                                  "(check PYTHONPATH)") from exc
        raise failure(f"importing it failed: {type(exc).__name__}: {exc}", path=source,
                      hint=f"fix the {what} (rerun with --debug for the traceback)") from exc
    except SystemExit as exc:
        raise failure(f"importing it called sys.exit({exc.code})", path=source,
                      hint=f"a {what} must not exit while imported") from exc
    except Exception as exc:  # the user's code raised: report it, it is not graphkit's bug
        raise failure(f"importing it failed: {type(exc).__name__}: {exc}", path=source,
                      hint=f"fix the {what} (rerun with --debug for the traceback)") from exc


def _import_file(path: Path) -> types.ModuleType:
    name = f"graphkit_user_{re.sub(r'[^0-9A-Za-z_]', '_', path.stem)}"
    loaded = sys.modules.get(name)
    if loaded is not None and getattr(loaded, "__file__", None) == str(path.resolve()):
        return loaded  # one file, one module: its classes and objects stay the same
    spec = importlib.util.spec_from_file_location(name, path.resolve())
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look modules up by name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _import_folder(folder: Path, source: str, *, what: str, failure: type[GraphkitError]) -> types.ModuleType:
    """Import the package in ``folder`` under its dotted name (its parent folders holding
    ``__init__.py`` are its parent packages), with the folder above the outermost package put
    first on ``sys.path``, as ``python -m`` run from there would: the package's own absolute
    and relative imports work. Another module of the outermost name already imported from
    elsewhere is ``failure``."""
    folder = folder.resolve()
    parts, root = [folder.name], folder.parent
    while (root / "__init__.py").is_file() and root.parent != root:
        parts.insert(0, root.name)
        root = root.parent
    if not all(p.isidentifier() for p in parts):
        raise UsageError(f"{what}: package folder '{'/'.join(parts)}' is not an importable name", path=source,
                         hint="package folders are Python identifiers (letters, digits, underscores)")
    loaded = sys.modules.get(parts[0])
    if loaded is not None:
        where = [Path(p).resolve() for p in getattr(loaded, "__path__", None) or ()] or \
            [Path(getattr(loaded, "__file__", None) or "?").resolve().parent]
        if root / parts[0] not in where:
            raise failure(f"{what}: a different module '{parts[0]}' is already imported, from "
                          f"{os.pathsep.join(map(str, where))}", path=source,
                          hint="rename the folder, or uninstall the other one (pip install -e the folder "
                               "to use it everywhere)")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return importlib.import_module(".".join(parts))
