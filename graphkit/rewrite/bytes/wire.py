"""The protobuf wire format, as the byte writers read and write it.

Varints read and encoded (one at a time, or a column of them with numpy), a message's
top-level entries located, the length-delimited fields of one number listed, byte ranges
spliced, and :class:`Skeletons`: ONNX's messages with their message fields read as bytes.
graphkit.rewrite.bytes.main_graph, bytes.bodies, bytes.body_splice and bytes.conversions write serialized
models with these; a malformed encoding raises :class:`Unsupported` (graphkit.rewrite.writers':
the objects writer runs).
"""

from __future__ import annotations

import threading
from array import array
from operator import itemgetter
from typing import Any

import numpy as np
import onnx

from graphkit.rewrite.writers import Unsupported

__all__ = ["HEADS", "LENGTHS", "MODEL_FUNCTIONS", "MODEL_GRAPH", "MODEL_OPSET_IMPORT", "MODEL_TRAINING_INFO",
           "STR_LENGTHS", "Skeletons", "Unsupported", "encode_varint", "entries", "entry",
           "field", "fields", "header", "node_entries", "node_spans", "read_varint", "splice", "spliced", "text_varint",
           "varint_sizes", "varints"]


# ModelProto's fields the byte writers look for among its top-level entries.
MODEL_GRAPH = 7
MODEL_OPSET_IMPORT = 8
MODEL_TRAINING_INFO = 20
MODEL_FUNCTIONS = 25


def encode_varint(n: int) -> bytes:
    """A varint's bytes."""
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def header(size: int) -> int:
    """The bytes of a node entry's tag and length, from the entry's size."""
    if size <= 1 + 1 + 127:
        return 2
    return next((h for h in range(3, 12) if 1 + len(encode_varint(size - h)) == h), 0)  # 0: no entry is that size


def text_varint(n: int) -> str:
    """A varint's bytes as latin-1 text."""
    return chr(n) if n < 0x80 else encode_varint(n).decode("latin-1")


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at ``data[pos]``, and the position after it."""
    result = shift = 0
    while True:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise Unsupported("malformed varint")


class _Lengths(dict):
    """Encoded varints by value, made on first use."""

    def __missing__(self, n: int) -> bytes:
        self[n] = value = encode_varint(n)
        return value


LENGTHS = _Lengths((i, bytes([i])) for i in range(128))


class _StrLengths(dict):
    """Encoded varints by value, as latin-1 str."""

    def __missing__(self, n: int) -> str:
        self[n] = value = encode_varint(n).decode("latin-1")
        return value


STR_LENGTHS = _StrLengths((i, chr(i)) for i in range(128))


def entries(data: bytes, pos: int, end: int) -> list[tuple[int, int, int, int]]:
    """(field, entry start, value start, entry end) of every top-level field of a message."""
    return [(number, start, value, stop) for number, _, start, value, stop in typed_entries(data, pos, end)]


def typed_entries(data: Any, pos: int, end: int) -> list[tuple[int, int, int, int, int]]:
    """(field, wire type, entry start, value start, entry end) of every top-level field of a
    message; Unsupported for a wire type it does not read or a field past ``end``, IndexError
    for a varint past the bytes."""
    out = []
    while pos < end:
        start = pos
        key, pos = read_varint(data, pos)
        number, wire = key >> 3, key & 7
        value = pos
        if wire == 0:
            _, pos = read_varint(data, pos)
        elif wire == 1:
            pos += 8
        elif wire == 2:
            length, value = read_varint(data, pos)
            pos = value + length
        elif wire == 5:
            pos += 4
        else:
            raise Unsupported(f"wire type {wire}")
        if pos > end:
            raise Unsupported("truncated field")
        out.append((number, wire, start, value, pos))
    return out


def node_entries(data: bytes, pos: int, end: int) -> tuple[array, array, list[tuple[int, int, int]]]:
    """Start and end offsets of a GraphProto's node entries (field 1), in order, and the
    (field, start, end) of its other entries."""
    starts: list[int] = []
    ends: list[int] = []
    others: list[tuple[int, int, int]] = []
    add_start, add_end = starts.append, ends.append
    while pos < end:
        if data[pos] == 0x0A:  # field 1, length-delimited
            add_start(pos)
            length = data[pos + 1]
            if length < 0x80:
                pos += 2 + length
            else:
                length, value = read_varint(data, pos + 1)
                pos = value + length
            add_end(pos)
            continue
        start = pos
        key, p = read_varint(data, pos)
        wire = key & 7
        if wire == 0:
            _, pos = read_varint(data, p)
        elif wire == 1:
            pos = p + 8
        elif wire == 2:
            length, value = read_varint(data, p)
            pos = value + length
        elif wire == 5:
            pos = p + 4
        else:
            raise Unsupported(f"wire type {wire}")
        others.append((key >> 3, start, pos))
    if pos != end:
        raise Unsupported("truncated graph")
    return array("q", starts), array("q", ends), others  # 8 bytes an offset, not a list of ints


def field(tag: bytes, value: str | bytes) -> bytes:
    """A length-delimited field: its ``tag`` (key bytes), the value's length, the value."""
    raw = value.encode() if isinstance(value, str) else value
    return tag + LENGTHS[len(raw)] + raw


def entry(body: bytes) -> bytes:
    """A GraphProto's node entry (field 1) holding the serialized NodeProto ``body``."""
    return b"\x0a" + LENGTHS[len(body)] + body


def fields(data: bytes, pos: int, end: int, wanted: int) -> list[tuple[int, int, int]]:
    """(entry start, value start, entry end) of each length-delimited field ``wanted`` of the
    message at ``data[pos:end]`` (``entries``, with one-byte keys and lengths read inline)."""
    out = []
    varint = read_varint
    while pos < end:
        start = pos
        key = data[pos]
        pos += 1
        if key >= 0x80:
            key, pos = varint(data, start)
        wire = key & 7
        if wire == 2:
            n = data[pos]
            if n < 0x80:
                value = pos + 1
            else:
                n, value = varint(data, pos)
            pos = value + n
            if key >> 3 == wanted:
                out.append((start, value, pos))
        elif wire == 0:
            while data[pos] >= 0x80:
                pos += 1
            pos += 1
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise Unsupported(f"wire type {wire}")
    if pos != end:
        raise Unsupported("truncated field")
    return out


def node_spans(data: bytes, pos: int, end: int) -> tuple[list[int], list[int]]:
    """Starts and ends of a GraphProto's node entries (field 1)."""
    found = fields(data, pos, end, 1)
    return list(map(itemgetter(0), found)), list(map(itemgetter(2), found))


def splice(data: bytes, v0: int, v1: int, edits: list[tuple[int, int, bytes]]) -> bytes:
    """``data[v0:v1]`` with each (start, end, bytes) of ``edits`` (in order) put in place."""
    return b"".join(spliced(data, v0, v1, edits))


def spliced(data: bytes, v0: int, v1: int, edits: list[tuple[int, int, bytes]]) -> list[bytes]:
    """splice's pieces, in order."""
    parts = []
    at = v0
    for start, end, new in edits:
        parts += (data[at:start], new)
        at = end
    parts.append(data[at:v1])
    return parts


def varints(buf: Any, at: Any) -> tuple[Any, Any, Any]:
    """The varints at offsets ``at`` of ``buf`` (uint8): values, byte counts, and whether each
    is as short as it goes and at most 5 bytes long (a longer one reads as not)."""
    top = len(buf) - 1
    b = buf[np.minimum(at, top)].astype(np.int64)
    value = b & 0x7F
    count = np.ones(len(at), np.int64)
    more = b >= 0x80
    last = b
    for i in range(1, 5):
        if not more.any():
            break
        b = buf[np.minimum(at + i, top)].astype(np.int64)
        value |= np.where(more, (b & 0x7F) << (7 * i), 0)
        count += more
        last = np.where(more, b, last)
        more &= b >= 0x80
    return value, count, ~more & ((count == 1) | (last != 0))


def varint_sizes(values: Any) -> Any:
    """Bytes the varints of ``values`` (below 2**35) take."""
    return 1 + (values >= 1 << 7) + (values >= 1 << 14) + (values >= 1 << 21) + (values >= 1 << 28)


class _Heads(dict):
    """A length-delimited field's key and length, encoded, by key << 40 | length (made on first use)."""

    def __missing__(self, key: int) -> bytes:
        self[key] = value = bytes([key >> 40]) + LENGTHS[key & ((1 << 40) - 1)]
        return value


HEADS = _Heads()


class Skeletons:
    """NodeProto, AttributeProto, GraphProto and ValueInfoProto with every message-typed field
    read as repeated bytes (its serialized value, unparsed; repeated, so that one given twice,
    which protobuf would merge, is seen): the same fields, numbers and wire format, so that
    parsing one of them from a message's bytes and serializing it again gives the bytes the
    real message gives (protobuf writes fields in number order either way). Reading a field
    of one costs a bytes or str object, not the Python wrapper of a message, which is what
    makes reading thousands of subgraphs field by field slow."""

    node: Any = None
    attribute: Any = None
    graph: Any = None
    value_info: Any = None
    # ValueInfoProto with every field repeated: ValueInfoProtos serialized one after the other
    # parse as one of these, each field's values in order (protobuf merges repeated fields so)
    value_infos: Any = None
    # NodeProto and AttributeProto so, likewise (AttributeProto's type an int64: any value parses)
    nodes: Any = None
    attributes: Any = None

    _lock = threading.Lock()

    @classmethod
    def load(cls) -> type[Skeletons]:
        if cls.node is not None:
            return cls
        with cls._lock:  # made once: threads rewriting at once never mix two pools' classes
            if cls.node is not None:
                return cls
            from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

            field = descriptor_pb2.FieldDescriptorProto
            proto = descriptor_pb2.FileDescriptorProto()
            onnx.NodeProto.DESCRIPTOR.file.CopyToProto(proto)
            wanted = {"NodeProto", "AttributeProto", "GraphProto", "ValueInfoProto"}
            for message in proto.message_type:
                if message.name in wanted:
                    for f in message.field:
                        if f.type == field.TYPE_MESSAGE:
                            f.type, f.label = field.TYPE_BYTES, field.LABEL_REPEATED
                            f.ClearField("type_name")
                if message.name in ("ValueInfoProto", "NodeProto", "AttributeProto"):
                    columns = proto.message_type.add()
                    columns.CopyFrom(message)
                    columns.name = message.name.replace("Proto", "Columns")
                    for f in columns.field:
                        f.label = field.LABEL_REPEATED
                        if f.type == field.TYPE_ENUM:
                            f.type = field.TYPE_INT64
                            f.ClearField("type_name")
            pool = descriptor_pool.DescriptorPool()  # a pool of its own: onnx's names again, apart
            pool.Add(proto)
            made = {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{proto.package}.{name}"))
                    for name in wanted}
            cls.attribute, cls.graph, cls.value_info = (made["AttributeProto"], made["GraphProto"],
                                                        made["ValueInfoProto"])
            cls.value_infos, cls.nodes, cls.attributes = (
                message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{proto.package}.{name}"))
                for name in ("ValueInfoColumns", "NodeColumns", "AttributeColumns"))
            cls.node = made["NodeProto"]
        return cls
