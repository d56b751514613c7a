"""The rewrite engine: pattern rules, and lowering of custom:: placeholders into
standard ops or kernel bindings."""

from graphkit.rewrite._gsrules import GraphSurgeonRule
from graphkit.rewrite._pattern import const, either, optional
from graphkit.rewrite._rules import GraphPass, MatchContext, MatchResult, Rule, RuleReport, RuleSet, Scope
from graphkit.rewrite.builder import Builder, NameGenerator, TypeTable
from graphkit.rewrite.engine import Lowering, RewriteReport, check_model, rewrite_model

__all__ = ["Builder", "GraphPass", "GraphSurgeonRule", "Lowering", "MatchContext", "MatchResult", "NameGenerator",
           "RewriteReport", "Rule", "RuleReport", "RuleSet", "Scope", "TypeTable", "check_model", "const", "either",
           "optional", "rewrite_model"]
