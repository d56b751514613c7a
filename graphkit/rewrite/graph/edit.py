"""Edits of a node list that rules and passes share: reordering, renaming reads, finding
what a rewrite left unread (producers, initializers)."""

from __future__ import annotations

import onnx

from graphkit.rewrite.graph.view import GraphView
from graphkit.rewrite.graph.walk import graphs, subgraphs, walk

__all__ = ["dead_producers", "outer_names", "prune_initializers", "referenced", "rename_inputs", "same_nodes",
           "toposort"]


def same_nodes(new: list[onnx.NodeProto], old: list[onnx.NodeProto]) -> bool:
    """Is the replacement the matched nodes again (names aside)? Then it changes nothing:
    an Identity kept for a graph output, typically."""
    if len(new) != len(old):
        return False
    if len(new) == 1:
        if new[0].op_type != old[0].op_type:
            return False
    elif sorted(n.op_type for n in new) != sorted(n.op_type for n in old):
        return False
    key = lambda n: (n.domain, n.op_type, tuple(n.input), tuple(n.output),  # noqa: E731
                     tuple(a.SerializeToString() for a in n.attribute))
    return sorted(map(key, new)) == sorted(map(key, old))


def rename_inputs(nodes: list[onnx.NodeProto], aliases: dict[str, str]) -> None:
    def resolve(name: str) -> str:
        seen = set()
        while name in aliases and name not in seen:
            seen.add(name)
            name = aliases[name]
        return name

    for node in nodes:
        for i, name in enumerate(node.input):
            if name in aliases:
                node.input[i] = resolve(name)


def toposort(nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """``nodes`` in an order where producers come first, otherwise keeping their order."""
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    deps = []
    for n in nodes:
        names = list(n.input)
        for g in subgraphs(n):
            names.extend(outer_names(g))
        deps.append([producer[x] for x in names if x in producer])
    done = [False] * len(nodes)
    order: list[onnx.NodeProto] = []
    for start in range(len(nodes)):
        stack = [(start, 0)]
        while stack:
            i, k = stack.pop()
            if done[i]:
                continue
            if k < len(deps[i]):
                stack.append((i, k + 1))
                j = deps[i][k]
                if not done[j]:
                    stack.append((j, 0))
                continue
            done[i] = True
            order.append(nodes[i])
    return order


def outer_names(graph: onnx.GraphProto) -> list[str]:
    return [name for g in graphs(graph) for n in g.node for name in n.input]


def dead_producers(view: GraphView, candidates: set[str], gone: set[int], read: set[str],
                    protected: set[str]) -> set[int]:
    """Producers of ``candidates`` that nothing reads once the ``gone`` nodes are gone (and the
    new nodes read ``read``), transitively; indices into ``view``."""
    dead: set[int] = set()
    work = [name for name in candidates if name in view.producer]
    while work:
        index = view.producer[work.pop()]
        if index in dead or index in gone:
            continue
        if any(out in protected or out in read
               or any(c not in dead and c not in gone for c in view.consumers.get(out, ()))
               for out in view.outputs[index] if out):
            continue
        dead.add(index)
        work.extend(n for n in view.inputs[index] if n in view.producer)
    return dead


def prune_initializers(model: onnx.ModelProto, released: set[str]) -> None:
    """Drop the initializers named in ``released`` (read before a rewrite, or made by one) that
    are read no more.

    Graph inputs of the same name stay (they may be fed). A dropped initializer stored as
    external data is only removed from the model; its file is left as it is.
    """
    owners = [g for g in graphs(model.graph) if g.initializer]
    if not owners or not any(t.name in released for g in owners for t in g.initializer):
        return  # no initializer a rewrite released: nothing to count
    after = referenced(model)
    for g in owners:
        inputs = {i.name for i in g.input}
        dead = [k for k, t in enumerate(g.initializer)
                if t.name in released and t.name not in after and t.name not in inputs]
        for k in reversed(dead):
            del g.initializer[k]


def referenced(model: onnx.ModelProto) -> set[str]:
    """Every tensor name read anywhere in the model (node inputs, graph outputs)."""
    names: set[str] = set()
    for _, v in walk(model):
        if v.graph is not None:  # a function body's outputs are its callers'
            names.update(o.name for o in v.graph.output)
        for n in v.nodes:
            names.update(n.input)
    return names
