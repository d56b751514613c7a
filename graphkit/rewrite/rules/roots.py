"""Where a pattern's later roots are looked for, once the ones before are matched.

A later root shares something with what is matched already: a variable's tensor, the output
of a pattern node another root holds, or a constant. Somewhere in its subtree a pattern node
reads that tensor (its *entry*), through a path of pattern nodes from the root down. In the
graph, the root is then among the nodes reached from the tensor's readers by walking that path
up: readers of the entry's op type, their readers of the next op type, ... up to the root's
(``(Neg(Abs(x)), Neg(Relu(x)))``: Relu readers of x, then their Neg readers). Every match
has its root there, so one entry's list is complete.

A list depends on the graph alone: it is made once per view (and set of taken nodes), and a
cursor skips the nodes that earlier matches took, so that n anchors sharing one tensor (a
wide fan-out) cost n steps, not n squared. A root that shares no tensor is looked for among
every node of its op type; one that shares only a ``const()`` value, first among the readers
of the tensor that matched it, then up from the readers of every other constant of that value
(equal values in two initializers match too): one list for all of them, made once, so that n
pairs each holding their own initializer of one value cost n steps too.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from graphkit.rewrite.graph.view import GraphView
from graphkit.rewrite.rules.pattern import Const, Out, PNode, Var, pattern_nodes

__all__ = ["NAME", "RootFinder"]

# A const(v) binding's tensor name is kept under v + NAME (Match.bindings holds only variables).
NAME = "\0name"

Failure = tuple[str, str]  # (text naming nodes, generic for the summary)


@dataclass(frozen=True)
class _Entry:
    kind: str  # "var", "node" (a pattern node an earlier root holds) or "const"
    key: Any  # the variable's name, or (id(pattern node), output index)
    path: tuple[tuple[PNode, int], ...]  # (pattern node, output its parent reads): the root first


def _entries(root: PNode, earlier: set[int]) -> list[_Entry]:
    """Every place where ``root``'s subtree reads a tensor that earlier roots may bind, reached
    through plain inputs (not under optional() or either(), which may not be taken)."""
    found: list[_Entry] = []
    seen: set[int] = set()
    stack = [((root, 0),)]
    while stack:
        path = stack.pop()
        q = path[-1][0]
        if id(q) in seen:
            continue
        seen.add(id(q))
        for p in q.inputs:
            cls = p.__class__
            if cls is Var:
                found.append(_Entry("var", p.name, path))
            elif cls is Const:
                found.append(_Entry("const", p.var.name, path))
            elif cls is PNode or cls is Out:
                node, out = (p.node, p.index) if cls is Out else (p, 0)
                if id(node) in earlier:
                    found.append(_Entry("node", (id(node), out), path))
                else:
                    stack.append(path + ((node, out),))
    return found


class RootFinder:
    """Candidates for root ``k`` of a pattern (k >= 1), given a partial match."""

    def __init__(self, roots: list[Any]) -> None:
        self.heads = [r.node if isinstance(r, Out) else r for r in roots]
        self._entries: dict[int, list[_Entry]] = {}
        self._lists: dict[tuple, tuple[list[int], Failure | None]] = {}
        self._cursor: dict[tuple, int] = {}
        self._made_for: tuple[Any, Any] = (None, None)  # (view, taken set) the lists hold for
        # per root: the key and lists candidates() walked last (the second: other equal constants')
        self._last: dict[int, tuple[tuple, list[int], list[int]]] = {}

    def candidates(self, k: int, bindings: dict[str, Any], nodes: dict[int, int], used: frozenset[int],
                   view: GraphView, taken: set[int]) -> tuple[Iterator[int], Failure | None]:
        """Graph nodes that may be root ``k``, lazily and not in ``used`` or ``taken``; or,
        where there can be none, why (the failure names the node where the path stops)."""
        if self._made_for[0] is not view or self._made_for[1] is not taken:
            self._lists.clear()
            self._cursor.clear()
            self._made_for = (view, taken)
        entries = self._entries.get(k)
        if entries is None:
            earlier = {id(p) for head in self.heads[:k] for p in pattern_nodes(head)}
            entries = self._entries[k] = _entries(self.heads[k], earlier)
        best, const = None, None
        for i, entry in enumerate(entries):
            tensor = self._tensor(entry, bindings, nodes, view)
            if tensor is None:
                continue
            if entry.kind == "const":
                const = const or (i, tensor)
                continue
            size = len(view.consumers.get(tensor, ()))
            if best is None or size < best[0]:
                best = (size, i, tensor)
        key = (k, *best[1:]) if best is not None else (k, *const) if const is not None else (k,)
        made = self._lists.get(key)
        if made is None:
            made = self._lists[key] = self._make(k, entries, key, view)
        listed, why = made
        if best is None and const is not None:
            others = view.equal_constants(const[1])
            if len(others) > 1:  # readers of equal values in other tensors too
                equal = (k, const[0], "=", others[0])  # others[0]: the same for every tensor of the value
                if equal not in self._lists:
                    self._lists[equal] = self._climb_all(k, entries[const[0]].path, others, view)
                also = self._lists[equal][0]
                if also:
                    self._last[k] = (key, listed, also)
                    return self._walk_both(key, listed, equal, also, used, taken), None
        if why is not None and not listed:
            return iter(()), why
        self._last[k] = (key, listed, [])
        return self._walk(key, listed, used, taken), None

    def why_none(self, k: int, used: frozenset[int], taken: set[int]) -> Failure:
        """Why the candidates() just walked for root ``k`` yielded none: each is in this match
        (then no other node is there) or an earlier one."""
        key, listed, also = self._last[k]
        what = self._what(k)
        if any(c not in used for c in listed) or any(c not in used for c in also):
            return f"{what}: every candidate is part of this match or an earlier one", "overlaps an earlier match"
        if len(key) == 1:
            op = self.heads[k].op_type
            return f"{what}: no {op} node here but this match's", f"pattern output {k + 1}: no other {op} node"
        path = self._entries[k][key[1]].path
        op, tensor = path[-1][0].op_type, key[2]
        if also:
            return (f"{what}: the {op} readers of '{tensor}' and of the constants equal to it lead to "
                    f"no {self.heads[k].op_type} outside this match",
                    f"pattern output {k + 1}: no other {self.heads[k].op_type} up from the shared constant")
        if len(path) == 1:
            return (f"{what}: no other {op} reads '{tensor}'",
                    f"pattern output {k + 1}: no other {op} reads the shared tensor")
        return (f"{what}: the {op} readers of '{tensor}' lead to no {self.heads[k].op_type} outside this match",
                f"pattern output {k + 1}: no other {self.heads[k].op_type} up from the shared tensor")

    def _walk(self, key: tuple, listed: list[int], used: frozenset[int], taken: set[int]) -> Iterator[int]:
        start = self._cursor.get(key, 0)
        while start < len(listed) and listed[start] in taken:  # taken for the rest of this round
            start += 1
        self._cursor[key] = start
        for i in range(start, len(listed)):
            c = listed[i]
            if c not in used and c not in taken:
                yield c

    def _walk_both(self, key: tuple, listed: list[int], equal: tuple, also: list[int], used: frozenset[int],
                   taken: set[int]) -> Iterator[int]:
        """``listed`` (up from the bound tensor), then ``also`` (up from every equal constant) less those."""
        yield from self._walk(key, listed, used, taken)
        seen = set(listed)
        for c in self._walk(equal, also, used, taken):
            if c not in seen:
                yield c

    @staticmethod
    def _tensor(entry: _Entry, bindings: dict[str, Any], nodes: dict[int, int], view: GraphView) -> str | None:
        if entry.kind == "node":
            index = nodes.get(entry.key[0])
            if index is None:
                return None
            outs = view.outputs[index]
            name = outs[entry.key[1]] if entry.key[1] < len(outs) else ""
        else:
            name = bindings.get(entry.key if entry.kind == "var" else entry.key + NAME)
        return name if isinstance(name, str) and name else None

    def _make(self, k: int, entries: list[_Entry], key: tuple, view: GraphView) -> tuple[list[int], Failure | None]:
        op = self.heads[k].op_type
        if len(key) == 1:  # the root shares no tensor with the others
            listed = view.by_op.get(op, [])
            return listed, None if listed else (f"{self._what(k)}: no {op} node here", f"no {op} node")
        return self._climb(k, entries[key[1]].path, key[2], view)

    def _climb_all(self, k: int, path: tuple[tuple[PNode, int], ...], tensors: list[str],
                   view: GraphView) -> tuple[list[int], Failure | None]:
        """The nodes reached up ``path`` from the readers of any of ``tensors``, in node order."""
        found: set[int] = set()
        for tensor in tensors:
            found.update(self._climb(k, path, tensor, view)[0])
        return sorted(found), None

    def _climb(self, k: int, path: tuple[tuple[PNode, int], ...], tensor: str,
               view: GraphView) -> tuple[list[int], Failure | None]:
        """The nodes reached from the readers of ``tensor`` up ``path`` (root last), in node order."""
        consumers, ops, outputs = view.consumers, view.ops, view.outputs
        entry = path[-1][0]
        level = sorted({c for c in consumers.get(tensor, ()) if ops[c] == entry.op_type})
        if not level:
            return [], (f"{self._what(k)}: no {entry.op_type} reads '{tensor}' "
                        f"(its readers: {self._readers(tensor, view)})",
                        f"pattern output {k + 1}: no {entry.op_type} reads the shared tensor")
        for j in range(len(path) - 2, -1, -1):
            want, out = path[j][0].op_type, path[j + 1][1]
            above: set[int] = set()
            for g in level:
                outs = outputs[g]
                if out < len(outs) and outs[out]:
                    above.update(c for c in consumers.get(outs[out], ()) if ops[c] == want)
            if not above:
                g = level[0]
                outs = outputs[g]
                name = outs[out] if out < len(outs) else ""
                node = view.nodes[g]
                return [], (f"{self._what(k)}: node '{node.name or ops[g]}' output '{name}' is read by "
                            f"{self._readers(name, view)}, not {want}",
                            f"pattern output {k + 1}: {path[j + 1][0].op_type} output is read by no {want}")
            level = sorted(above)
        return level, None

    def _what(self, k: int) -> str:
        shown = repr(self.heads[k])
        return f"pattern output {k + 1} ({shown if len(shown) <= 60 else shown[:57] + '...'})"

    @staticmethod
    def _readers(name: str, view: GraphView) -> str:
        ops = sorted({view.ops[c] for c in view.consumers.get(name, ())}) if name else []
        return ", ".join(ops) if ops else "no node"
