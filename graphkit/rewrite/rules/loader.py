"""Loading user rules from a Python file or module (`graphkit rewrite --rules`)."""

from __future__ import annotations

from graphkit.errors import RewriteError
from graphkit.rewrite.rules.graphsurgeon import GraphSurgeonRule
from graphkit.rewrite.rules.ruleset import GraphPass, Rule, RuleSet
from graphkit.usercode import import_user_code

__all__ = ["load_rules"]


def load_rules(source: str) -> RuleSet:
    """Rules from ``source``: a .py file path or an importable module name.

    The file or module must define ``rules``: a RuleSet or a list of Rule.
    """
    module = import_user_code(source, what="rules file", failure=RewriteError, example="--rules my_rules.py")
    rules = getattr(module, "rules", None)
    if rules is None:
        raise RewriteError("defines no 'rules'", path=source,
                           hint="add `rules = RuleSet([...])` at the end of the file")
    if isinstance(rules, RuleSet):
        return rules
    if isinstance(rules, (list, tuple)) and all(isinstance(r, (Rule, GraphPass, GraphSurgeonRule)) for r in rules):
        return RuleSet(rules)
    raise RewriteError(f"'rules' is {type(rules).__name__}, not a RuleSet or list of Rule", path=source,
                       hint="set `rules = RuleSet([...])`")
