"""The rewrite engine: pattern rules, and lowering of custom:: placeholders into
standard ops or kernel bindings."""

from graphkit.rewrite._gsrules import GraphSurgeonRule
from graphkit.rewrite._pattern import const, either, optional
from graphkit.rewrite._rules import GraphPass, MatchContext, MatchResult, Rule, RuleReport, RuleSet, Scope
from graphkit.rewrite.builder import Builder, NameGenerator, TypeTable
from graphkit.rewrite.engine import Lowering, PassResult, RewriteReport, check_model, rewrite_model
from graphkit.rewrite.plan import LoweringPlan
from graphkit.rewrite.serialized import rewrite_bytes, rewrite_file

__all__ = ["Builder", "GraphPass", "GraphSurgeonRule", "Lowering", "LoweringPlan", "MatchContext", "MatchResult",
           "NameGenerator", "PassResult", "RewriteReport", "Rule", "RuleReport", "RuleSet", "Scope", "TypeTable",
           "check_model", "const", "either", "optional", "rewrite_bytes", "rewrite_file", "rewrite_model"]
