"""Rules written against onnx-graphsurgeon's Graph/Node/Variable objects.

The fast protobuf-level engine serves pattern rules and lowering; a GraphSurgeonRule
gets the whole model as a ``gs.Graph`` (imported only when such a rule is given), changes
it in place and says how many places it rewrote::

    def relu6_to_clip(graph):
        count = 0
        for node in graph.nodes:
            if node.op == "Relu6":
                node.op, node.domain = "Clip", ""
                node.inputs += [gs.Constant(f"{node.name}_lo", np.float32(0)),
                                gs.Constant(f"{node.name}_hi", np.float32(6))]
                count += 1
        return count or MatchResult().fail("no Relu6 node")

    rules = RuleSet([GraphSurgeonRule("relu6_to_clip", relu6_to_clip)])
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import onnx

from graphkit.errors import RewriteError

__all__ = ["GraphSurgeonRule", "apply_graphsurgeon_rules"]


@dataclass
class GraphSurgeonRule:
    """``apply(graph: gs.Graph) -> int | MatchResult``: rewrites in place, returns the count."""

    name: str
    apply: Callable[[Any], Any]


def apply_graphsurgeon_rules(model: onnx.ModelProto, rules: list[GraphSurgeonRule], report: Any,
                             path: str | None = None) -> onnx.ModelProto:
    """Run ``rules`` on ``model`` through onnx-graphsurgeon; returns the model to keep."""
    import onnx_graphsurgeon as gs

    graph = gs.import_onnx(model)
    changed = 0
    for rule in rules:
        try:
            result = rule.apply(graph)
        except Exception as exc:  # the user's rule raised: name it
            raise RewriteError(f"rule '{rule.name}' raised {type(exc).__name__}: {exc}", path=path,
                               hint="fix the rule (rerun with --debug for the traceback)") from exc
        if isinstance(result, bool) or not isinstance(result, int):
            report.fail(rule.name, getattr(result, "reason", "") or "returned no count")
            continue
        if result:
            report.apply(rule.name, result)
            changed += result
        else:
            report.fail(rule.name, "rewrote nothing")
    if not changed:
        return model
    graph.cleanup().toposort()
    exported = gs.export_onnx(graph)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out.graph.CopyFrom(exported.graph)
    del out.functions[:]
    out.functions.extend(exported.functions)
    known = {imp.domain for imp in out.opset_import}
    out.opset_import.extend(imp for imp in exported.opset_import if imp.domain not in known)
    return out
