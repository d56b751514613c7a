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
    """Import ``source``: a .py file path or an importable module name.

    UsageError when it cannot be found; ``failure`` (naming ``source``) when its code
    raises or exits while importing.
    """
    is_file = source.endswith(".py") or os.sep in source or Path(source).exists()
    try:
        if is_file:
            path = Path(source)
            if not path.is_file():
                raise UsageError(f"{what}: no such file", path=source, hint=f"for example {example}")
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
        return importlib.import_module(source)
    except GraphkitError:
        raise
    except ModuleNotFoundError as exc:
        if exc.name and source.startswith(exc.name):
            raise UsageError(f"{what}: no module named {source!r}", path=source,
                             hint="pass a .py file path or an importable module name (check PYTHONPATH)") from exc
        raise failure(f"importing it failed: {type(exc).__name__}: {exc}", path=source,
                      hint=f"fix the {what} (rerun with --debug for the traceback)") from exc
    except SystemExit as exc:
        raise failure(f"importing it called sys.exit({exc.code})", path=source,
                      hint=f"a {what} must not exit while imported") from exc
    except Exception as exc:  # the user's code raised: report it, it is not graphkit's bug
        raise failure(f"importing it failed: {type(exc).__name__}: {exc}", path=source,
                      hint=f"fix the {what} (rerun with --debug for the traceback)") from exc
