"""``graphkit simplify IN OUT`` without parsing, serializing or writing its weights' bytes.

On a model file with inline weights, the main graph's large initializers are read as
references to their bytes in IN: external data whose file is the model itself (the offset
and length of each one's raw_data). The simplify passes run on that skeleton; a pass that
needs a weight's value reads it from IN, as it would read it inline (SimplifyScope.in_model_file:
no size limit applies to them). OUT is the passes' output with every such reference made
inline again, the raw_data field put back where protobuf writes it, its bytes copied from IN
by the kernel (``os.copy_file_range``) rather than through Python. A large initializer a
pass made is held as its array (graphkit.rewrite.graph.held), referred to past IN's end, and
written from it; smaller ones are serialized as always; those removed are not copied.

The output is the plain path's, byte for byte (tests/test_simplify_io.py compares them). A
model this does not apply to (external data of its own, a symlink, nothing large, an
encoding it does not read) takes the plain path: :func:`simplify_spliced` returns None.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from typing import Any

import onnx

from graphkit.rewrite.bytes.wire import encode_varint, read_varint, typed_entries
from graphkit.rewrite.graph.held import HeldWeights, holding
from graphkit.rewrite.writers import Pieces, Unsupported

__all__ = ["MIN_SPLICED", "SplicedPieces", "simplify_spliced", "skeleton_of_file"]

MIN_SPLICED = 1 << 16  # raw_data bytes from which an initializer is spliced rather than parsed
_BLOCK = 1 << 12  # bytes read at once while scanning keys and lengths (a weight is skipped, not read)
_EXTERNAL = onnx.TensorProto.EXTERNAL
_TENSOR_DATA_FIELDS = frozenset({4, 5, 6, 7, 10, 11})  # float_data ... uint64_data: not with raw_data
_RAW_DATA = 9
# Where a TensorProto may sit, by message: field number -> the kind of message it holds.
_HOLDS: dict[str, dict[int, str]] = {
    "model": {7: "graph", 20: "training", 25: "function"},
    "training": {1: "graph", 2: "graph"},
    "graph": {1: "node", 5: "tensor", 15: "sparse"},
    "function": {7: "node"},
    "node": {5: "attribute"},
    "attribute": {5: "tensor", 6: "graph", 10: "tensor", 11: "graph", 22: "sparse", 23: "sparse"},
    "sparse": {1: "tensor", 2: "tensor"},
}


class _Malformed(Exception):
    """The bytes are not what this module reads: the plain path runs (and reports)."""


def _entries(data: Any, pos: int, end: int) -> list[tuple[int, int, int, int, int]]:
    """(field, wire type, entry start, value start, entry end) of a message's top-level fields."""
    try:
        return typed_entries(data, pos, end)
    except (IndexError, Unsupported) as exc:  # past the bytes, over 64 bits, a wire type, past end
        raise _Malformed(str(exc) or "truncated varint") from None


class _Source:
    """The input file, open: read in blocks while scanning, its ranges copied to the output."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        st = os.fstat(self.fd)
        self.size = st.st_size
        self.identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        self._buf = b""
        self._base = 0

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def unchanged(self) -> bool:
        try:
            st = os.stat(self.path)
        except OSError:
            return False
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) == self.identity

    def read(self, offset: int, length: int) -> bytes:
        parts, at, left = [], offset, length
        while left > 0:
            got = os.pread(self.fd, min(left, 1 << 30), at)
            if not got:
                raise _Malformed("file ended early")
            parts.append(got)
            at += len(got)
            left -= len(got)
        return b"".join(parts) if len(parts) != 1 else parts[0]

    def _window(self, pos: int, n: int) -> tuple[bytes, int]:
        if pos < self._base or pos + n > self._base + len(self._buf):
            self._buf = self.read(pos, min(max(n, _BLOCK), self.size - pos))
            self._base = pos
        return self._buf, pos - self._base

    def entries(self, pos: int, end: int) -> list[tuple[int, int, int, int, int]]:
        """_entries of the message at [pos, end) of the file, reading keys and lengths only
        (the values are skipped over, never read)."""
        out = []
        try:
            while pos < end:
                buf, i = self._window(pos, min(20, end - pos))
                start = pos
                key, j = read_varint(buf, i)
                number, wire = key >> 3, key & 7
                value = pos + (j - i)
                if wire == 0:
                    _, k = read_varint(buf, j)
                    pos = value + (k - j)
                elif wire == 1:
                    pos = value + 8
                elif wire == 2:
                    length, k = read_varint(buf, j)
                    value = pos + (k - i)
                    pos = value + length
                elif wire == 5:
                    pos = value + 4
                else:
                    raise _Malformed(f"wire type {wire}")
                if pos > end:
                    raise _Malformed("truncated field")
                out.append((number, wire, start, value, pos))
        except (IndexError, Unsupported) as exc:  # read_varint: past the bytes, or over 64 bits
            raise _Malformed(f"varint: {exc or 'truncated'}") from None
        return out


def _without_raw_data(source: _Source, start: int, end: int,
                      large: Callable[[int], bool]) -> tuple[bytes, int, int] | None:
    """The TensorProto at [start, end) of the file without its raw_data, and where that is
    (offset, length); None where it stays as it is (no large raw_data, or fields beside it
    this does not move)."""
    fields = source.entries(start, end)
    raw = [f for f in fields if f[0] == _RAW_DATA]
    if len(raw) != 1 or raw[0][1] != 2 or not large(raw[0][4] - raw[0][3]):
        return None
    if any(f[0] in (3, 13, 14) or f[0] in _TENSOR_DATA_FIELDS for f in fields):  # (segment, external)
        return None
    head = [f for f in fields if f[0] != _RAW_DATA]
    kept = b"".join(source.read(f[2], f[4] - f[2]) for f in head)
    probe = onnx.TensorProto()
    try:
        probe.ParseFromString(kept)
    except Exception as exc:  # noqa: BLE001 - the plain path reports what is wrong
        raise _Malformed(str(exc)) from None
    offset, length = raw[0][3], raw[0][4] - raw[0][3]
    if probe.data_type in (0, onnx.TensorProto.STRING) or not _sized(probe, length):
        return None
    return kept, offset, length


def _sized(tensor: onnx.TensorProto, length: int) -> bool:
    """Whether ``length`` raw bytes are exactly the tensor's dims of its type (inline, the
    rest would be an error the plain path reports)."""
    try:
        item = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    except (KeyError, ValueError, TypeError):
        return False
    count = 1
    for d in tensor.dims:
        count *= d
    if tensor.data_type in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4) or \
            getattr(onnx.TensorProto, "FLOAT4E2M1", -1) == tensor.data_type:
        return False  # packed two to a byte: left inline
    return count * item == length


def skeleton_of_file(source: _Source, min_bytes: int = MIN_SPLICED) -> tuple[bytes, list[tuple[int, int, int]]] | None:
    """The model file's bytes without the raw_data of its main graph's large initializers, and
    for each of those (its index among the initializers, the offset and length of its
    raw_data in the file); None where there is none."""
    from graphkit.rewrite.graph.inference import SMALL_INITIALIZER

    def large(length: int) -> bool:
        return length >= min_bytes and length > SMALL_INITIALIZER  # (and so a "large" initializer to inference)

    top = source.entries(0, source.size)
    graphs = [f for f in top if f[0] == 7]
    if len(graphs) != 1 or graphs[0][1] != 2:
        return None
    _, _, g_start, g_value, g_end = graphs[0]
    parts: list[Any] = []  # bytes, or (start, end) ranges of the file
    refs: list[tuple[int, int, int]] = []
    index = 0
    for number, wire, start, value, end in source.entries(g_value, g_end):
        if number == 5 and wire == 2:
            index += 1
            got = _without_raw_data(source, value, end, large) if large(end - value) else None
            if got is not None:
                kept, offset, length = got
                parts.append(b"\x2a" + encode_varint(len(kept)) + kept)
                refs.append((index - 1, offset, length))
                continue
        if parts and isinstance(parts[-1], tuple) and parts[-1][1] == start:
            parts[-1] = (parts[-1][0], end)
        else:
            parts.append((start, end))
    if not refs:
        return None
    graph = b"".join(p if isinstance(p, bytes) else source.read(p[0], p[1] - p[0]) for p in parts)
    return (source.read(0, g_start) + b"\x3a" + encode_varint(len(graph)) + graph
            + source.read(g_end, source.size - g_end)), refs


def refer(model: onnx.ModelProto, refs: list[tuple[int, int, int]], location: str) -> None:
    """Make each initializer of ``refs`` (skeleton_of_file's) external data at its offset and
    length in the model file ``location``."""
    initializers = model.graph.initializer
    for index, offset, length in refs:
        tensor = initializers[index]
        for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        tensor.data_location = _EXTERNAL


class SplicedPieces(Pieces):
    """A serialized model as bytes, (offset, length) ranges of the input file and memoryviews
    of the large weights the passes made (graphkit.rewrite.graph.held): written
    with the ranges copied file to file (``write_fd``); ``join`` reads them from the input
    again (for --diff and the API), refusing an input that changed since."""

    def __init__(self, parts: list[Any], source: _Source) -> None:
        self._parts = parts
        self._source = source
        self.size = sum(p[1] if isinstance(p, tuple) else len(p) for p in parts)

    def join(self) -> bytes:
        source = self._source
        if source.fd >= 0:
            return self._joined(source)
        try:
            source = _Source(source.path)
        except OSError:
            raise _changed(source.path) from None
        try:
            if source.identity != self._source.identity:
                raise _changed(source.path)
            return self._joined(source)
        finally:
            source.close()

    def _joined(self, source: _Source) -> bytes:
        try:
            return b"".join(source.read(*p) if isinstance(p, tuple) else p for p in self._parts)
        except _Malformed:
            raise _changed(source.path) from None

    def write(self, fh: Any, block: int = 0) -> None:
        fh.flush()
        self.write_fd(fh.fileno())

    def write_fd(self, out: int) -> None:
        """Write the model to the file descriptor ``out`` (at its position)."""
        for p in self._parts:
            if not isinstance(p, tuple):
                _write_all(out, p)  # (bytes, or a memoryview of a weight a pass made: not joined first)
                continue
            try:
                _copy_range(self._source, out, *p)
            except _Malformed:  # the input is shorter than it was
                raise _changed(self._source.path) from None


def _changed(path: str) -> Exception:
    from graphkit.errors import ModelLoadError

    return ModelLoadError("the input changed since it was simplified", path=path,
                          hint="simplify it again once nothing else writes the file")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _copy_range(source: _Source, out: int, offset: int, length: int) -> None:
    """The file's bytes [offset, offset + length) appended to ``out``: by the kernel where it
    can (no copy through Python), else read and written."""
    copy = getattr(os, "copy_file_range", None)
    while length > 0 and copy is not None:
        try:
            n = copy(source.fd, out, length, offset)
        except OSError:
            break  # (EXDEV, ENOSYS, EINVAL on some filesystems: read and write instead)
        if n <= 0:
            break
        offset += n
        length -= n
    while length > 0:
        chunk = source.read(offset, min(length, 1 << 24))
        _write_all(out, chunk)
        offset += len(chunk)
        length -= len(chunk)


def _needle(location: bytes) -> bytes:
    entry = b"\x0a\x08location\x12" + encode_varint(len(location)) + location
    return entry


def _restore_tensor(body: bytes, location: bytes) -> tuple[list[Any], int] | None:
    tensor = onnx.TensorProto.FromString(body)
    if tensor.data_location != _EXTERNAL:
        return None
    info = {e.key: e.value for e in tensor.external_data}
    if info.get("location", "").encode() != location:
        return None
    offset, length = int(info["offset"]), int(info["length"])
    tensor.ClearField("external_data")
    tensor.ClearField("data_location")
    rest = tensor.SerializeToString()
    at = next((f[2] for f in _entries(rest, 0, len(rest)) if f[0] > _RAW_DATA), len(rest))
    head = rest[:at] + b"\x4a" + encode_varint(length)
    return [head, (offset, length), rest[at:]], len(rest) + len(head) - at + length


def _restore(data: bytes, start: int, end: int, kind: str, location: bytes, needle: bytes,
             found: list[int]) -> tuple[list[Any], int] | None:
    """The message at data[start:end] (of ``kind``) with its references made inline again:
    (pieces, size); None where it holds none."""
    if kind == "tensor":
        # A reference is in the tensor's external_data (field 13): its raw_data, perhaps a
        # large weight a pass made, is not searched.
        if not any(f[0] == 13 and data.find(needle, f[3], f[4]) >= 0 for f in _entries(data, start, end)):
            return None
        got = _restore_tensor(data[start:end], location)
        if got is not None:
            found[0] += 1
        return got
    if data.find(needle, start, end) < 0:
        return None
    holds = _HOLDS[kind]
    parts: list[Any] = []
    size = 0
    at = start
    changed = False
    for number, wire, e_start, value, e_end in _entries(data, start, end):
        sub = holds.get(number)
        if sub is None or wire != 2:
            continue
        got = _restore(data, value, e_end, sub, location, needle, found)
        if got is None:
            continue
        changed = True
        parts.append(data[at:e_start])
        size += e_start - at
        key = data[e_start:read_varint(data, e_start)[1]]
        sub_parts, sub_size = got
        head = key + encode_varint(sub_size)
        parts.append(head)
        parts.extend(sub_parts)
        size += len(head) + sub_size
        at = e_end
    if not changed:
        return None
    parts.append(data[at:end])
    size += end - at
    return parts, size


def _holds(parts: list[Any], needle: bytes) -> bool:
    """Whether the bytes parts of ``parts``, joined, hold ``needle`` (without joining them)."""
    n = len(needle) - 1
    tail = b""  # the last n bytes before the part: a needle may cross parts
    for p in parts:
        if isinstance(p, bytes):
            if needle in p or needle in tail + p[:n]:
                return True
            tail = (tail + p[-n:])[-n:]
    return False


def restore(data: bytes, location: bytes) -> tuple[list[Any], int]:
    """The serialized model ``data`` with every reference into the model file made inline:
    pieces (bytes, and (offset, length) ranges of the input file), and how many there were."""
    needle = _needle(location)
    found = [0]
    got = _restore(data, 0, len(data), "model", location, needle, found)
    if got is None:
        return [data], 0
    parts = [p for p in got[0] if not isinstance(p, bytes) or p]
    return parts, found[0]


def _materialized(data: bytes, source: _Source, weights: HeldWeights | None = None) -> bytes:
    """The serialized model ``data`` with every tensor referring into the model file read
    into its raw_data (parsed and serialized whole: what restore does without either)."""
    from graphkit.external_data import external_tensors

    model = onnx.ModelProto.FromString(data)
    for tensor in external_tensors(model):
        if tensor.data_location != _EXTERNAL:
            continue  # (listed once per scope that sees it: made inline already)
        info = {e.key: e.value for e in tensor.external_data}
        got = None if weights is None else weights.array(tensor)
        tensor.raw_data = source.read(int(info["offset"]), int(info["length"])) if got is None else got.tobytes()
        tensor.ClearField("external_data")
        tensor.ClearField("data_location")
    return model.SerializeToString()


def simplify_spliced(src: str, dst: str | None, *, registry: Any, options: Any, check: bool = True,
                     full_check: bool = False, progress: Callable[[str, int, int], None] | None = None,
                     before_write: Callable[[Any, dict[str, int]], None] | None = None
                     ) -> tuple[Any, dict[str, int], SplicedPieces] | None:
    """``rewrite_file(src, dst, lowering=KEEP, simplify=options)`` with the weights spliced
    (the module docstring); returns what its FileRewrite holds (the report, the sizes, the
    output's pieces), or None where the plain path must run (nothing is written then)."""
    try:
        if os.path.islink(src):
            return None  # (ONNX reads no external data through a symlink)
        st = os.stat(src)
        if not stat.S_ISREG(st.st_mode) or not st.st_size or st.st_size > 2**31 - 1:
            return None
        source = _Source(src)
    except (OSError, ValueError):
        return None  # the plain path says what is wrong with the file
    try:
        return _simplify(source, src, dst, registry=registry, options=options, check=check, full_check=full_check,
                         progress=progress, before_write=before_write)
    finally:
        source.close()


def _simplify(source: _Source, src: str, dst: str | None, *, registry: Any, options: Any, check: bool,
              full_check: bool, progress: Any, before_write: Any) -> Any:
    from graphkit.errors import ModelLoadError, OutputError
    from graphkit.external_data import external_tensors
    from graphkit.modelio import PROTOBUF_LIMIT, parse_model_bytes
    from graphkit.ops import default_registry
    from graphkit.publish import atomic_write
    from graphkit.rewrite import engine
    from graphkit.rewrite.engine import Lowering
    from graphkit.rewrite.writers import Request

    name = os.path.basename(src)
    location = name.encode()
    try:
        got = skeleton_of_file(source)
    except (_Malformed, OSError):
        return None
    if got is None:
        return None
    data, refs = got
    try:
        model = parse_model_bytes(data, src)
    except ModelLoadError:
        return None
    if external_tensors(model) or len(model.graph.initializer) <= refs[-1][0]:
        return None  # external data of its own: the plain path places it with the output
    refer(model, refs, name)
    count = len(refs)
    request = Request(data, model, registry=default_registry() if registry is None else registry,
                      prefer=(Lowering.KEEP,), check=check, full_check=full_check, path=src, progress=progress,
                      owned=True, options={"simplify": options})
    del model, data
    with holding(HeldWeights(name, source.size, MIN_SPLICED)) as weights:
        out, report = engine.write(request)
    serialized = out.join()
    del out, request
    parts, _ = restore(serialized, location)
    parts = [weights.data(*p) if isinstance(p, tuple) and p[0] >= source.size else p for p in parts]
    restored = sum(isinstance(p, tuple) for p in parts)
    if _holds(parts, _needle(location)) or any(p is None for p in parts):
        parts, restored = [_materialized(serialized, source, weights)], 0  # a reference where restore does not look
    pieces = SplicedPieces(parts, source)
    report.writer_reason = (f"simplify: {restored} of the input's {count} large initializers copied from it "
                            "unparsed (graphkit.rewrite.simplify._splice)")
    sizes = {"bytes_before": source.size, "bytes_after": len(pieces)}
    if before_write is not None:
        before_write(report, sizes)
    if dst is not None:
        if len(pieces) > PROTOBUF_LIMIT:
            raise OutputError("model is over protobuf's 2 GiB limit and has inline weights",
                              path=os.fspath(dst), hint="move its weights to external data first")
        with atomic_write(dst) as tmp:
            fd = os.open(tmp, os.O_WRONLY | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0))
            try:
                pieces.write_fd(fd)
            finally:
                os.close(fd)
            if not source.unchanged():
                raise _changed(src)
    return report, sizes, pieces
