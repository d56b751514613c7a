"""The rewrite engine: pattern rules, and lowering of custom:: placeholders into
standard ops or kernel bindings.

Where a placeholder becomes standard ops: ``LoweringPlan.lower`` (lowering/plan.py), whichever
writer runs. The layout:

- engine.py: ``rewrite_model``, a short sequence of passes (``PASSES``) over one model;
- files.py: ``rewrite_bytes`` and ``rewrite_file``, the one entry point, which picks a writer;
- writers.py: the writers (objects, and the byte writers in bytes/), their one interface;
- lowering/: the plan, lowering selection, the Builder decompositions use, kernel binding;
- rules/: the pattern language, matcher, Rule/RuleSet/GraphPass, rules over graphsurgeon;
- graph/: walking every graph, subgraph and function body; scopes; a node-list index;
- convert/: ai.onnx opset conversion (``--target-opset``);
- bytes/: the byte writers, spliced into the serialized model;
- fusions/: the fusion library (``--fuse``);
- simplify/: ``graphkit simplify``, above the engine: its entry points, and its passes, which the
  engine runs through the SimplifyOptions it is handed.
"""

from graphkit.rewrite.rules.graphsurgeon import GraphSurgeonRule
from graphkit.rewrite.rules.pattern import const, either, optional
from graphkit.rewrite.rules.ruleset import GraphPass, MatchContext, MatchResult, Rule, RuleSet, Scope
from graphkit.rewrite.lowering.builder import Builder
from graphkit.rewrite.engine import Lowering, rewrite_model
from graphkit.rewrite.files import rewrite_file

# What rules files, op packages' decompositions and their callers use. Builder, MatchContext
# and Scope are what a decomposition, a rule's check and a GraphPass receive. The rest is
# imported from its module (rewrite_bytes from files.py, LoweringPlan from lowering/plan.py,
# RewriteReport from engine.py, ...); tests/test_public_api.py pins this list.
__all__ = ["Builder", "GraphPass", "GraphSurgeonRule", "Lowering", "MatchContext", "MatchResult", "Rule", "RuleSet",
           "Scope", "const", "either", "optional", "rewrite_file", "rewrite_model"]
