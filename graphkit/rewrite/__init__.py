"""The rewrite engine: pattern rules, and lowering of custom:: placeholders into
standard ops or kernel bindings.

Where a placeholder becomes standard ops: :meth:`LoweringPlan.lower` (plan.py), whichever
writer runs. The writers (writers.py says which runs when, and their one interface): the
objects writer (engine.py: ``rewrite_model``'s passes on the parsed model) and the byte
writers on the serialized model (_fastpath.py: placeholders in the main graph;
_bodybytes.py with _bodysplice.py: in If/Loop/Scan bodies; what they share in
_bytecommon.py, conversions in _convertbytes.py, the wire format in _wire.py).
serialized.py (``rewrite_bytes``, ``rewrite_file``) picks one.
"""

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
