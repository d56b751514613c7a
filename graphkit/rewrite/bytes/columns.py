"""Fields of many serialized messages at once, for the bodies' byte writer.

Reading thousands of subgraphs field by field through protobuf's Python objects costs a
wrapper object per message and per repeated field read; here messages of one kind are
parsed together as one message whose fields are all repeated (wire.Skeletons: protobuf
appends a repeated field's values as they come), an end value after each message telling
them apart: :func:`read_columns` (any message of a Skeletons class), :func:`graph_columns`
(GraphProtos). :class:`NotBulk` where the messages are not of a form read so.
"""

from __future__ import annotations

import itertools
import operator
from typing import Any

from graphkit.rewrite.bytes import wire

__all__ = ["ATTRIBUTE_FIELDS", "ATTRIBUTE_TYPE", "HOLDER_FIELDS", "NODE_FIELDS", "PLACEHOLDER_FIELDS", "PREFIX_FIELDS",
           "NotBulk", "graph_columns", "read_columns", "split"]


class NotBulk(Exception):
    """The messages are not of the form read at once (the bodies' declarations then go graph
    by graph: body_scopes.BodyScopes._declared_bulk)."""



# After each graph, an empty entry of each repeated field graph_columns reads: node (1),
# initializer (5), input (11), output (12), value_info (13).
_GRAPH_END = b"\x0a\x00\x2a\x00\x5a\x00\x62\x00\x6a\x00"
_GRAPH_FIELDS = ("node", "initializer", "input", "output", "value_info")


def graph_columns(graphs: list[bytes]) -> dict[str, tuple[list[bytes], list[int]]]:
    """Per field of _GRAPH_FIELDS, the values of every one of the serialized GraphProtos
    ``graphs`` in order (serialized) and how many each has: they are parsed as one message,
    each followed by _GRAPH_END (protobuf appends a repeated field's values as they come; an
    empty value ends a graph's). NotBulk where one holds an empty value itself."""
    joined = wire.Skeletons.load().graph.FromString(b"".join(itertools.chain.from_iterable(
        zip(graphs, itertools.repeat(_GRAPH_END)))))
    out = {}
    n = len(graphs)
    for name in _GRAPH_FIELDS:
        values = getattr(joined, name)[:]
        uniform = _uniform(values, b"", n)
        if uniform is not None:
            out[name] = uniform
            continue
        ends = list(itertools.compress(itertools.count(), map(operator.not_, values)))
        if len(ends) != n:
            raise NotBulk
        counts = list(map(operator.sub, ends, itertools.chain((-1,), ends)))
        counts = list(map(operator.sub, counts, itertools.repeat(1)))
        if len(values) != n:
            values = list(itertools.compress(values, values))
        else:
            values = []
        out[name] = (values, counts)
    return out


def _uniform(values: list, mark: Any, n: int, last: Any = None) -> Any:
    """Where each of the ``n`` messages has as many values as the others (``values``: theirs, each
    message's followed by ``mark``), what read_columns gives for the field (``last``: the
    field's default, where the field is read as each message's last value), found by list
    slicing alone; else None (the messages cut one by one)."""
    if not n or len(values) % n:
        return None
    step = len(values) // n  # every message's values, then its mark
    if values.count(mark) != n or values[step - 1::step].count(mark) != n:
        return None  # some message has more values than another (or holds a mark itself)
    if last is not None:
        return values[step - 2::step] if step > 1 else [last] * n
    del values[step - 1::step]
    return values, [step - 1] * n


_MARK = "\x00graphkit\x00"  # ends a message's values of a string field in columns
_ENDS = {str: _MARK, bytes: b"", int: -1}


def read_columns(cls: Any, messages: list[bytes], fields: tuple[tuple[str, int, type, bool], ...]) -> dict[str, Any]:
    """Fields of every one of the serialized ``messages`` at once: they are parsed as one
    message of ``cls`` (every field repeated), each followed by one end value of each field
    read (protobuf appends a repeated field's values as they come). ``fields``: (name, number,
    value type, last): per name, its values in order and how many each message has, or, where
    ``last``, each message's value (its last one, as protobuf keeps a field given twice; the
    field's default where it has none). NotBulk where a message holds an end value itself."""
    end = b""
    for name, number, kind, _ in fields:
        if kind is int:
            end += wire.encode_varint(number << 3) + wire.encode_varint((1 << 64) - 1)
        else:
            raw = _ENDS[kind].encode() if kind is str else b""
            end += wire.encode_varint(number << 3 | 2) + wire.LENGTHS[len(raw)] + raw
    joined = cls.FromString(b"".join(itertools.chain.from_iterable(zip(messages, itertools.repeat(end)))))
    n = len(messages)
    out: dict[str, Any] = {}
    for name, _, kind, last in fields:
        values = getattr(joined, name)[:]
        mark = _ENDS[kind]
        uniform = _uniform(values, mark, n, kind() if last else None)
        if uniform is not None:
            out[name] = uniform
            continue
        ends = list(itertools.compress(itertools.count(), map(mark.__eq__, values)))
        if len(ends) != n:
            raise NotBulk
        counts = list(map(operator.sub, map(operator.sub, ends, itertools.chain((-1,), ends)), itertools.repeat(1)))
        if last:
            default = kind()
            if not any(counts):
                out[name] = [default] * n
            else:
                lasts = map(values.__getitem__, map(operator.sub, ends, itertools.repeat(1)))
                out[name] = list(map(operator.getitem, zip(itertools.repeat(default), lasts), map(bool, counts)))
        else:
            if len(values) != n:
                values = list(itertools.compress(values, map(mark.__ne__, values)))
            else:
                values = []
            out[name] = (values, counts)
    return out


NODE_FIELDS = (("input", 1, str, False), ("output", 2, str, False), ("name", 3, str, True),
                ("op_type", 4, str, True), ("attribute", 5, bytes, False), ("domain", 7, str, True))
PLACEHOLDER_FIELDS = (("input", 1, str, False), ("output", 2, str, False), ("name", 3, str, True),
                       ("op_type", 4, str, True), ("attribute", 5, bytes, False))
PREFIX_FIELDS = (("name", 3, str, True), ("op_type", 4, str, True))
HOLDER_FIELDS = (("output", 2, str, False), ("op_type", 4, str, True), ("attribute", 5, bytes, False))
ATTRIBUTE_FIELDS = (("name", 1, str, True), ("g", 6, bytes, False), ("graphs", 11, bytes, False),
                     ("type", 20, int, True))
ATTRIBUTE_TYPE = (("type", 20, int, True),)



def split(values: list, counts: list[int]) -> list[list]:
    """``values`` cut into lists of ``counts[i]`` values, in order."""
    at = list(itertools.accumulate(counts, initial=0))
    return list(map(values.__getitem__, map(slice, at, at[1:])))
