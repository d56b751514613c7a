"""The rewrite engine: pattern rules, and lowering of custom:: placeholders into
standard ops or kernel bindings."""

from graphkit.rewrite._gsrules import GraphSurgeonRule
from graphkit.rewrite._rules import MatchContext, MatchResult, Rule, RuleReport, RuleSet
from graphkit.rewrite.builder import Builder, NameGenerator, TypeTable
from graphkit.rewrite.engine import Lowering, RewriteReport, check_model, rewrite_model

__all__ = ["Builder", "GraphSurgeonRule", "Lowering", "MatchContext", "MatchResult", "NameGenerator", "RewriteReport",
           "Rule", "RuleReport", "RuleSet", "TypeTable", "check_model", "rewrite_model"]
