"""Traced replacements stamped on single-node matches (see graphkit.rewrite.rules.template): each
matched node overwritten in place with its template's node, named and wired as the Builder
would make it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import onnx

from graphkit.rewrite.graph.view import GraphView
from graphkit.rewrite.graph.walk import holds_graphs
from graphkit.rewrite.rules.matcher import Matcher
from graphkit.rewrite.rules.report import OpDelta, RuleReport
from graphkit.rewrite.rules.template import TracedReplacement

__all__ = ["UNTRACED", "Stamps", "report_stamps", "stamp_matches"]

UNTRACED = object()  # a count of *xs inputs whose template was not traced yet


def stamp_matches(view: GraphView, candidates: Any, matcher: Matcher, run: Any, rule: str,
                  stamp: "Stamps") -> int:
    """Stamp the template on the matches at ``candidates`` (a flat pattern, no check), in
    order, up to the first that has none (no match, no template); returns how many.
    (``Stamps.name`` and ``write`` inlined: this loop runs once per match.)"""
    flat_match, fresh, templates = matcher.flat_match, run.fresh, run.templates
    many = matcher.flat[2]
    matcher.taken = set()  # single nodes in order: no match overlaps an earlier one
    nodes = view.nodes
    indices, ops, domains, made = stamp.indices, stamp.ops, stamp.domains, stamp.made
    done = 0
    for index in candidates:
        found = flat_match(index)
        if found is None:
            break
        domain, names, rest, output, node = found
        extra = -1 if many is None else len(rest)
        template = templates.get(extra, UNTRACED)
        if template is UNTRACED:
            template = run.template(extra)
        if template is None or not output:
            break
        if node is None:
            node = nodes[index]
        if node.attribute and holds_graphs(node):
            break  # the values its graphs read go with it: the general path releases them
        op_type = template.op_type
        node_name = fresh(f"{node.name or rule}/{op_type}")
        fresh(f"{node_name}_out")
        if template.same_inputs and not rest:
            inputs = names
        else:
            inputs = template.inputs(names, rest)
            stamp.released.update(set(node.input).difference(inputs))
        node.CopyFrom(template.node)
        node.input.extend(inputs)
        node.output.append(output)
        node.name = node_name
        indices.append(index)
        ops.append(op_type)
        domains[domain] = domains.get(domain, 0) + 1
        key = id(template)
        made[key] = (template, made[key][1] + 1) if key in made else (template, 1)
        done += 1
    return done


def report_stamps(view: GraphView, stamp: "Stamps", report: RuleReport, rule: str,
                  counted: bool = False) -> tuple[int, GraphView | None]:
    """Report the stamped matches (``counted``: as matches too, already), tell the OpDelta;
    the count and the view if it still holds."""
    stamped = len(stamp.indices)
    if not stamped:
        return 0, view
    if not counted:
        report.matched[rule] = report.matched.get(rule, 0) + stamped
    report.applied[rule] = report.applied.get(rule, 0) + stamped
    return stamped, view if view.restamp(stamp.indices, stamp.ops) else None


class Stamps:
    """Matched nodes overwritten with their template's node, named and wired as the Builder
    would make it: the fields CopyFrom of the per-match replacement gives. Keeps what the
    op counts and the view need (which nodes, of which op now, from which domain)."""

    __slots__ = ("delta", "domains", "indices", "made", "op_type", "ops", "released")
    # indices, ops: the current scope's; domains, made: every scope's. A node holding graphs
    # is never stamped (callers see to it): the outer values its graphs read are released
    # by the general path, as unused initializers to prune.

    def __init__(self, delta: OpDelta, op_type: str) -> None:
        self.delta, self.op_type = delta, op_type  # op_type: the matched nodes'
        self.indices: list[int] = []
        self.ops: list[str] = []
        self.domains: dict[str, int] = {}
        self.made: dict[int, tuple[TracedReplacement, int]] = {}
        self.released: set[str] = set()  # inputs stamped nodes stopped reading (the rule pass's set)

    @staticmethod
    def name(fresh: Callable[[str], str], node: onnx.NodeProto, rule: str, template: TracedReplacement) -> str:
        """The names the Builder would give the node and its output (which finish() replaces)."""
        name = fresh(f"{node.name or rule}/{template.op_type}")
        fresh(f"{name}_out")
        return name

    def write(self, index: int, node: onnx.NodeProto, template: TracedReplacement, name: str, inputs: Any, output: str,
              domain: str) -> None:
        """Overwrite ``node`` (at ``index``, holding no graph) with the template's node, so
        named and wired."""
        self.released.update(set(node.input).difference(inputs))
        node.CopyFrom(template.node)
        node.input.extend(inputs)
        node.output.append(output)
        node.name = name
        self.indices.append(index)
        self.ops.append(template.op_type)
        self.domains[domain] = self.domains.get(domain, 0) + 1
        made = self.made.get(id(template))
        self.made[id(template)] = (template, 1 if made is None else made[1] + 1)

    def count(self) -> None:
        """Tell the OpDelta (once, when done with every scope)."""
        delta = self.delta
        if delta.exact:
            for domain, n in self.domains.items():
                delta.counts[(domain, self.op_type)] -= n
            for template, n in self.made.values():
                delta.counts[(template.domain, template.op_type)] += n
        self.domains, self.made = {}, {}
