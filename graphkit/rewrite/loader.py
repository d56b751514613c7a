"""Loading user rules from a Python file or module (`graphkit rewrite --rules`)."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

from graphkit.errors import RewriteError, UsageError
from graphkit.rewrite._gsrules import GraphSurgeonRule
from graphkit.rewrite._rules import Rule, RuleSet

__all__ = ["load_rules"]


def load_rules(source: str) -> RuleSet:
    """Rules from ``source``: a .py file path or an importable module name.

    The file or module must define ``rules``: a RuleSet or a list of Rule.
    """
    path = Path(source)
    try:
        if source.endswith(".py") or path.exists():
            if not path.is_file():
                raise UsageError("no such rules file", path=source, hint="check the --rules path")
            spec = importlib.util.spec_from_file_location(f"graphkit_user_rules_{path.stem}", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(source)
    except UsageError:
        raise
    except ModuleNotFoundError as exc:
        if exc.name and source.startswith(exc.name):
            raise UsageError("no such rules file or module", path=source,
                             hint="pass a .py file path or an importable module name") from exc
        raise RewriteError(f"loading rules failed: {type(exc).__name__}: {exc}", path=source,
                           hint="fix the rules file") from exc
    except SystemExit as exc:
        raise RewriteError(f"loading rules failed: the file called sys.exit({exc.code})", path=source,
                           hint="a rules file must not exit; define `rules` instead") from exc
    except Exception as exc:  # the user's code raised: report it, it is not our bug
        raise RewriteError(f"loading rules failed: {type(exc).__name__}: {exc}", path=source,
                           hint="fix the rules file (rerun with --debug for the traceback)") from exc
    rules = getattr(module, "rules", None)
    if rules is None:
        raise RewriteError("defines no 'rules'", path=source,
                           hint="add `rules = RuleSet([...])` at the end of the file")
    if isinstance(rules, RuleSet):
        return rules
    if isinstance(rules, (list, tuple)) and all(isinstance(r, (Rule, GraphSurgeonRule)) for r in rules):
        return RuleSet(rules)
    raise RewriteError(f"'rules' is {type(rules).__name__}, not a RuleSet or list of Rule", path=source,
                       hint="set `rules = RuleSet([...])`")
