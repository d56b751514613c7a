"""The bodies' byte writer's repeats, many placeholders at a time.

A lowering the plan made for the first node of a kind, repeated on the others as bytes
(bytes.common has the one-at-a-time writers, LoweringTemplateWriter and BoundWriter): a bound
node's fields for many nodes at once (:func:`bound_all`), a template written for many
placeholders a field of all of them at once (:class:`Layout`), in any scope
(:class:`Emitter`: the names it reads from its scope as slots), and an adoption of another
scope's template in a body with no constants yet (:class:`Adoption`).
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable
from typing import Any

import onnx

from graphkit.rewrite.bytes import wire
from graphkit.rewrite.bytes.common import BoundWriter, LoweringTemplateWriter
from graphkit.rewrite.lowering.plan import LoweringPlan, LoweringTemplate
from graphkit.rewrite.writers import Unsupported

__all__ = ["Adoption", "Emitter", "Layout", "bound", "bound_all"]


def bound(writer: BoundWriter, node: Any) -> bytes:
    """``writer.emit`` for a wire.Skeletons NodeProto: the node with the bound one's domain and attributes."""
    attributes = getattr(writer, "attribute_bytes", None)
    if attributes is None:
        attributes = writer.attribute_bytes = [a.SerializeToString() for a in writer.attributes]
    out = wire.Skeletons.load().node()
    out.CopyFrom(node)
    out.domain = writer.domain
    del out.attribute[:]
    out.attribute.extend(attributes)
    return wire.entry(out.SerializeToString())


def bound_all(writer: BoundWriter, nodes: list[bytes]) -> list[bytes]:
    """``bound`` for each of the serialized ``nodes``, a field of all of them at a time."""
    sk = wire.Skeletons.load().node
    attributes = getattr(writer, "attribute_bytes", None)
    if attributes is None:
        attributes = writer.attribute_bytes = [a.SerializeToString() for a in writer.attributes]
    repeat = itertools.repeat
    parsed = list(map(sk.FromString, nodes))
    list(map(setattr, parsed, repeat("domain"), repeat(writer.domain)))
    list(map(sk.ClearField, parsed, repeat("attribute")))
    if attributes:
        entries = b"".join(b"\x2a" + wire.LENGTHS[len(a)] + a for a in attributes)
        list(map(sk.MergeFromString, parsed, repeat(entries)))
    return list(map(wire.entry, map(sk.SerializeToString, parsed)))


class Layout:
    """A template's nodes (after an adoption's constants) written for many placeholders at a
    time, a field of all of them at once: ``emit(values, asked)`` is, per placeholder, the
    entries ``LoweringTemplateWriter.emit`` (and ``Adoption.emit``) write, from its values (the
    template's inputs padded, the constants it reads, its outputs) and the names the
    generator gave it (``asks``: per template node, its name, then the names it generates)."""

    def __init__(self, written: LoweringTemplateWriter, tails: list[bytes], n_inputs: int) -> None:
        self.plan = written._plan
        self.tails = tails  # per constant made first: its node's fields after output and name
        self.n_inputs = n_inputs  # constants are the values after the inputs
        self.asks: list[str] = []
        self.generated: list[int] = []  # per generated name (in slot order): its place in ``asks``
        for suffix, generated, _, _ in self.plan:
            self.asks.append(suffix)
            for g in generated:
                self.generated.append(len(self.asks))
                self.asks.append(g)
        self.n_values: int | None = None

    def emit(self, values: list[list[str]], asked: list[list[str]]) -> list[bytes]:
        L = wire.LENGTHS
        lengths = L.__getitem__
        repeat = itertools.repeat
        add = operator.add
        v_cols = list(zip(*values))
        a_cols = list(zip(*asked))
        n_values = len(v_cols)
        encoded: dict[int, tuple[list[bytes], list[bytes], list[int]]] = {}

        def column(slot: int) -> tuple[list[bytes], list[bytes], list[int]]:
            """(names, their length prefixes, prefix + name sizes) of a values slot (or, past the
            values, a generated name's), encoded once."""
            got = encoded.get(slot)
            if got is None:
                names = v_cols[slot] if slot < n_values else a_cols[self.generated[slot - n_values]]
                raw = list(map(str.encode, names))
                sizes = list(map(len, raw))
                prefixes = list(map(lengths, sizes))
                got = encoded[slot] = (raw, prefixes, list(map(add, sizes, map(len, prefixes))))
            return got

        columns: list[Any] = []
        for c, tail in enumerate(self.tails):  # Constant nodes: output and name, then the rest
            raw, prefixes, sized = column(self.n_inputs + c)
            body = list(map(add, map(add, sized, sized), repeat(2 + len(tail))))
            columns += (repeat(b"\x0a"), map(lengths, body), repeat(b"\x12"), prefixes, raw, repeat(b"\x1a"),
                        prefixes, raw, repeat(tail))
        at = 0
        for suffix, generated, fields, rest in self.plan:
            raw_names = list(map(str.encode, a_cols[at]))
            at += 1 + len(generated)
            name_sizes = list(map(len, raw_names))
            name_prefixes = list(map(lengths, name_sizes))
            fixed = len(rest)
            sizes: Any = list(map(add, name_sizes, map(len, name_prefixes)))
            body: list[Any] = []
            for f in fields:
                if f.__class__ is int:
                    raw, prefixes, sized = column(f)
                    body += (prefixes, raw)
                    sizes = map(add, sizes, sized)
                else:
                    body.append(repeat(f))
                    fixed += len(f)
            columns += (repeat(b"\x0a"), map(lengths, map(add, sizes, repeat(fixed))), *body, name_prefixes,
                        raw_names, repeat(rest))
        return list(map(b"".join, zip(*columns)))


class Emitter:
    """A plan template written as serialized nodes for any scope: the names it reads from its
    scope (an adopted template's constants) are slots after its inputs."""

    def __init__(self, template: LoweringTemplate) -> None:
        self.nodes = template.nodes  # kept: emitters are found by the identity of this list
        self.reads = list(template.constants)
        self.n_inputs = len(template.inputs)
        view = LoweringTemplate(template.nodes, [*template.inputs, *self.reads], template.outputs, template.prefix)
        self.written = LoweringTemplateWriter(view)

    def emit(self, template: LoweringTemplate, inputs: list[str], outputs: list[str], prefix: str,
             fresh: Callable[[str], str]) -> bytes:
        """``template.instantiate(inputs, outputs, prefix, fresh)``, serialized."""
        return self.written.emit([*inputs, *[""] * (self.n_inputs - len(inputs)),
                                  *map(template.constants.__getitem__, self.reads), *outputs], prefix, fresh)


class Adoption:
    """``LoweringPlan.adopt`` in a scope with no constants yet (a body whose only placeholder
    this is), written as bytes (by its Layout): each constant the template reads, a copy of
    its node named and producing ``fresh(prefix + "/const")`` (``tails``: its fields after the
    output and the name), then the template's instance reading them."""

    def __init__(self, plan: LoweringPlan, key: tuple) -> None:
        template, reads = plan.adoption(key)
        self.tails = []
        for _, const in reads:
            if const.input or len(const.output) != 1:
                raise Unsupported("a template reading a constant that is not a Constant node")
            rest = onnx.NodeProto()
            rest.CopyFrom(const)
            rest.ClearField("output")
            rest.ClearField("name")
            self.tails.append(rest.SerializeToString())  # the fields after output (2) and name (3)
        self.emitter = Emitter(LoweringTemplate(template.nodes, template.inputs, template.outputs, template.prefix,
                                         {name: name for name, _ in reads}))
        self.template = template
        self.constants = [const for _, const in reads]  # what count() counts of each adoption
