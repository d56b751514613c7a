"""Fuzz every entry point of graphkit with mutated models: `rewrite` (every --bind, --rules),
`inspect`, `run` (random inputs), `compare`, and the Python API in-process
(rewrite_model, open_session + run).

Each case takes a valid seed model (placeholders, bound nodes, subgraphs, a local function,
external data, attributes) and mutates it 1-4 times, at the byte level (bit flips, cuts,
splices, inserted varints) or at the protobuf-field level (a field of a node, attribute,
tensor, opset import or value_info dropped, duplicated, reordered or set to a hostile
value: huge dims, unknown types, names of other tensors, '..' locations). Then it runs
`graphkit.cli.main([...])` in-process (or the API), outputs in a temporary directory, and checks:

* the exit code is in docs/exit-codes.md's table and is not 70 (internal error);
* a failure prints exactly one stderr line and no traceback;
* the input files are unchanged and a failed rewrite leaves no file behind;
* a successful rewrite's output parses as ONNX.

Cases run in worker processes under RLIMIT_AS with an alarm per case: a crash that kills
the interpreter or hangs is recorded against its case, and the worker restarts after it.
Every case is reproducible from (--seed, case number):

    python bench/fuzz.py --cases 10000            # prints the count and a summary per exit code
    python bench/fuzz.py --reproduce 1234 --save /tmp/case   # writes case 1234's files, reruns it

Exit status 0 when every finding is a known, reported crash class (KNOWN below), 1 otherwise.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import hashlib
import io
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from graphkit.errors import documented_exit_codes

DOCUMENTED = documented_exit_codes()
MEMORY_LIMIT = 3 << 30
CASE_SECONDS = 30

# Crash classes found by this fuzzer and tolerated until fixed. Empty: every crash class found
# so far is fixed (each by a test in tests/test_bad_inputs.py), so any new one fails.
# Key: (exception type, graphkit file, function).
KNOWN: dict[tuple[str, str, str], str] = {}

RULES_FILE = Path(__file__).resolve().parents[1] / "samples" / "rules" / "fuse_my_add.py"


# -- seed models ------------------------------------------------------------------------------------

def seed_models() -> list[tuple[str, bytes, dict[str, bytes]]]:
    """(name, model bytes, extra files beside it) for every seed."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    def model(nodes, inputs, outputs, *, opset=17, domains=("custom",), **kw):
        graph = helper.make_graph(nodes, "g", inputs, outputs, **{k: v for k, v in kw.items()
                                                                if k in ("initializer", "value_info")})
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]
                              + [helper.make_opsetid(d, 1) for d in domains], ir_version=10)
        for f in kw.get("functions", ()):
            m.functions.append(f)
        return m

    def vi(name, shape=("N", 3), elem=TensorProto.FLOAT):
        return helper.make_tensor_value_info(name, elem, list(shape) if shape is not None else None)

    seeds = []
    add = lambda name, m, files=None: seeds.append((name, m.SerializeToString(), files or {}))  # noqa: E731

    add("my_add", model([helper.make_node("my_add", ["a", "b"], ["y"], domain="custom", name="add0"),
                         helper.make_node("Relu", ["y"], ["z"], name="relu0")],
                        [vi("a"), vi("b")], [vi("z", None)]))
    b = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "b")
    add("chain+initializer", model(
        [helper.make_node("my_add", ["a", "b"], ["y0"], domain="custom", name="add0"),
         helper.make_node("my_add", ["y0", "b"], ["y1"], domain="custom", name="add1"),
         helper.make_node("my_add", ["y1", "a"], ["y2"], domain="custom", name="add2"),
         helper.make_node("Relu", ["y2"], ["z"], name="relu0")],
        [vi("a", (2, 3))], [vi("z", (2, 3))], initializer=[b], value_info=[vi("y0", (2, 3)), vi("y1", (2, 3))]))
    then = helper.make_graph([helper.make_node("my_add", ["a", "a"], ["t"], domain="custom", name="inner")],
                             "then", [], [vi("t")])
    other = helper.make_graph([helper.make_node("Identity", ["a"], ["e"], name="ident")], "else", [], [vi("e")])
    add("if-subgraph", model([helper.make_node("If", ["c"], ["z"], name="if0", then_branch=then, else_branch=other)],
                             [vi("a"), vi("c", (), TensorProto.BOOL)], [vi("z")]))
    fn = helper.make_function("local", "twice", ["x"], ["y"],
                              [helper.make_node("my_add", ["x", "x"], ["y"], domain="custom", name="f0")],
                              [helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)])
    add("local-function", model([helper.make_node("twice", ["a"], ["z"], domain="local", name="call0")],
                                [vi("a")], [vi("z")], domains=("custom", "local"), functions=[fn]))
    add("bound", model([helper.make_node("my_add", ["a", "b"], ["y"], domain="graphkit.native", name="n0"),
                        helper.make_node("my_add", ["y", "b"], ["z"], domain="graphkit.python", name="p0")],
                       [vi("a"), vi("b")], [vi("z")], domains=("graphkit.native", "graphkit.python")))
    add("float16", model([helper.make_node("my_add", ["a", "b"], ["z"], domain="custom", name="h0")],
                         [vi("a", (2, 3), TensorProto.FLOAT16), vi("b", (3,), TensorProto.FLOAT16)],
                         [vi("z", (2, 3), TensorProto.FLOAT16)]))
    add("standard-only", model([helper.make_node("Relu", ["a"], ["z"], name="r")], [vi("a")], [vi("z")],
                               domains=()))
    deform = _registry_op("deform_conv2d")
    if deform is not None:
        attrs = {"stride": [1, 1], "padding": [1, 1], "dilation": [1, 1], "groups": 1, "offset_groups": 1}
        add("deform_conv2d", model(
            [helper.make_node("deform_conv2d", ["x", "w", "off"], ["y"], domain="custom", name="dc0", **attrs)],
            [vi("x", (1, 2, 5, 5)), vi("w", (3, 2, 3, 3)), vi("off", (1, 18, 5, 5))], [vi("y", (1, 3, 5, 5))],
            opset=19))
    w = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3), "w")
    ext = model([helper.make_node("my_add", ["x", "w"], ["y"], domain="custom", name="add")],
                [vi("x", (4, 3))], [vi("y", (4, 3))], initializer=[w])
    t = ext.graph.initializer[0]
    raw = t.raw_data
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", "weights.bin"), ("offset", "0"), ("length", str(len(raw)))):
        t.external_data.add(key=k, value=v)
    add("external-data", ext, {"weights.bin": raw})
    onnx.checker  # noqa: B018 - imported for the workers' first case
    return seeds


def _registry_op(name: str):
    from graphkit.ops import default_registry

    return default_registry().get(name)


# -- mutations ---------------------------------------------------------------------------------------

INTS = [0, 1, -1, 2, 3, 7, 255, 2**31 - 1, -(2**31), 2**32, 2**40, 2**62, 2**63 - 1, -(2**63)]
FLOATS = [0.0, -0.0, 1.0, -1.0, 1e-45, 1e38, 1e308, float("nan"), float("inf"), float("-inf")]
STRINGS = ["", "custom", "my_add", "deform_conv2d", "graphkit.native", "graphkit.python", "ai.onnx",
           "com.microsoft", "ai.onnx.contrib", "frobnicate", "Relu", "Add", "If", "Loop", "Constant",
           "Identity", "..", "../x.bin", "/etc/passwd", "weights.bin", "a/../../b", "x" * 5000,
           "\u202egnp.\u00e9", "stride", "groups", "location", "offset", "length", "N", "a", "b", "y", "z"]
DOMAINS = ["", "ai.onnx", "custom", "graphkit.native", "graphkit.python", "local", "com.microsoft", "x.y"]
OP_TYPES = ["my_add", "deform_conv2d", "Relu", "Add", "Mul", "If", "Loop", "Scan", "Constant", "Identity",
            "twice", "frobnicate", ""]
VARINTS = [b"\x00", b"\x7f", b"\xff\xff\xff\xff\x0f", b"\xff" * 9 + b"\x01", b"\x80" * 10, b"\xf0\xff\xff\xff\x07"]


def _messages(msg, out, depth=0):
    out.append(msg)
    if depth > 40 or len(out) > 4000:
        return
    for fd, value in msg.ListFields():
        if fd.message_type is None:
            continue
        if _is_repeated(fd):
            for item in value:
                _messages(item, out, depth + 1)
        else:
            _messages(value, out, depth + 1)


def _is_repeated(fd) -> bool:
    return fd.is_repeated if hasattr(fd, "is_repeated") else fd.label == fd.LABEL_REPEATED


def _names(model) -> list[str]:
    from graphkit.rewrite.graph.walk import graphs

    names = []
    for g in graphs(model.graph):
        for n in g.node:
            names += list(n.input) + list(n.output)
        names += [v.name for v in (*g.input, *g.output, *g.initializer, *g.value_info)]
    return [n for n in names if n] or ["a"]


def _scalar_value(rng: random.Random, fd, names: list[str]):
    t = fd.type
    if fd.enum_type is not None:
        return rng.choice(fd.enum_type.values).number
    if t == fd.TYPE_BOOL:
        return rng.random() < 0.5
    if t in (fd.TYPE_FLOAT, fd.TYPE_DOUBLE):
        return rng.choice(FLOATS)
    if t in (fd.TYPE_STRING,):
        return rng.choice(names) if rng.random() < 0.4 else rng.choice(STRINGS)
    if t == fd.TYPE_BYTES:
        return rng.randbytes(rng.choice([0, 1, 3, 4, 7, 8, 64]))
    value = rng.choice(INTS)
    if t in (fd.TYPE_INT32, fd.TYPE_SINT32, fd.TYPE_SFIXED32):
        value = max(-(2**31), min(2**31 - 1, value))
    elif t in (fd.TYPE_UINT32, fd.TYPE_FIXED32):
        value = abs(value) % 2**32
    elif t in (fd.TYPE_UINT64, fd.TYPE_FIXED64):
        value = abs(value) % 2**64
    return value


def mutate_fields(model, rng: random.Random) -> str:
    """One protobuf-level mutation of ``model`` in place; returns what it did."""
    names = _names(model)
    kind = rng.random()
    if kind < 0.35:
        return _smart(model, rng, names)
    msgs = []
    _messages(model, msgs)
    msg = rng.choice(msgs)
    fields = list(msg.DESCRIPTOR.fields)
    set_fields = [fd for fd, _ in msg.ListFields()]
    fd = rng.choice(set_fields) if set_fields and rng.random() < 0.8 else rng.choice(fields)
    where = f"{msg.DESCRIPTOR.name}.{fd.name}"
    op = rng.random()
    if _is_repeated(fd):
        seq = getattr(msg, fd.name)
        n = len(seq)
        if n and op < 0.3:
            del seq[rng.randrange(n)]
            return f"drop one {where}"
        if n and op < 0.55:
            if fd.message_type is not None:
                items = [type(x)() for x in seq]
                for new, old in zip(items, seq):
                    new.CopyFrom(old)
                dup = items[rng.randrange(n)]
                items.insert(rng.randrange(n + 1), dup)
                del seq[:]
                seq.extend(items)
            else:
                seq.insert(rng.randrange(n + 1), seq[rng.randrange(n)])
            return f"duplicate one {where}"
        if n > 1 and op < 0.7:
            if fd.message_type is not None:
                items = [type(x)() for x in seq]
                for new, old in zip(items, seq):
                    new.CopyFrom(old)
                rng.shuffle(items)
                del seq[:]
                seq.extend(items)
            else:
                items = list(seq)
                rng.shuffle(items)
                del seq[:]
                seq.extend(items)
            return f"shuffle {where}"
        if op < 0.8 and n:
            del seq[:]
            return f"clear {where}"
        if fd.message_type is not None:
            seq.add()
            return f"add empty {where}"
        try:
            for _ in range(rng.choice([1, 1, 2, 5, 100])):
                seq.append(_scalar_value(rng, fd, names))
        except (TypeError, ValueError):
            return f"noop {where}"
        return f"append to {where}"
    if fd.message_type is not None:
        if op < 0.5:
            msg.ClearField(fd.name)
            return f"drop {where}"
        getattr(msg, fd.name).SetInParent()
        return f"touch {where}"
    if op < 0.25:
        msg.ClearField(fd.name)
        return f"drop {where}"
    try:
        setattr(msg, fd.name, _scalar_value(rng, fd, names))
    except (TypeError, ValueError):
        return f"noop {where}"
    return f"alter {where}"


def _smart(model, rng: random.Random, names: list[str]) -> str:
    """Mutations that know ONNX: rewire, retarget ops, opsets, types, dims, external data."""
    import onnx
    from graphkit.rewrite.graph.walk import graphs

    gs = list(graphs(model.graph))
    g = rng.choice(gs)
    nodes = list(g.node)
    choice = rng.randrange(10)
    if choice == 0 and nodes:
        n = rng.choice(nodes)
        if n.input:
            n.input[rng.randrange(len(n.input))] = rng.choice(names + ["", "nowhere"])
            return "rewire an input"
    if choice == 1 and nodes:
        n = rng.choice(nodes)
        if n.output:
            n.output[rng.randrange(len(n.output))] = rng.choice(names + ["", "fresh"])
            return "rename an output"
    if choice == 2 and nodes:
        n = rng.choice(nodes)
        n.domain = rng.choice(DOMAINS)
        if rng.random() < 0.5:
            n.op_type = rng.choice(OP_TYPES)
        return "retarget a node"
    if choice == 3:
        imports = model.opset_import if rng.random() < 0.7 or not model.functions else model.functions[0].opset_import
        r = rng.random()
        if imports and r < 0.4:
            imports[rng.randrange(len(imports))].version = rng.choice([0, 1, 6, 7, 11, 16, 19, 21, 23, 40, 2**40])
        elif imports and r < 0.6:
            del imports[rng.randrange(len(imports))]
        else:
            imports.add(domain=rng.choice(DOMAINS), version=rng.choice([1, 2, 17]))
        return "opset imports"
    if choice == 4:
        values = [*g.input, *g.output, *g.value_info]
        if values:
            v = rng.choice(values)
            tt = v.type.tensor_type
            if rng.random() < 0.5:
                tt.elem_type = rng.choice([0, 1, 2, 6, 7, 8, 9, 10, 11, 16, 17, 21, 23, 999])
            else:
                del tt.shape.dim[:]
                for _ in range(rng.choice([0, 1, 2, 4, 7])):
                    d = tt.shape.dim.add()
                    if rng.random() < 0.3:
                        d.dim_param = rng.choice(["N", "", "M"])
                    else:
                        d.dim_value = rng.choice(INTS)
            return "value type"
    if choice == 5 and nodes:
        n = rng.choice(nodes)
        r = rng.random()
        if n.attribute and r < 0.4:
            a = n.attribute[rng.randrange(len(n.attribute))]
            value = rng.choice([1, 2.5, "s", [1, 2], [1.0], list(range(rng.choice([3, 1000])))])
            a.CopyFrom(onnx.helper.make_attribute(a.name, value))
            if rng.random() < 0.2:  # an empty list, typed by hand (make_attribute cannot infer it)
                del a.ints[:]
                del a.floats[:]
            return "attribute retyped"
        name = rng.choice(["stride", "padding", "dilation", "groups", "offset_groups", "alpha", ""])
        n.attribute.append(onnx.helper.make_attribute(name, rng.choice([1, [1, 1], [0, 0, 0], 2.0, "x", [-1, 5]])))
        return "attribute added"
    if choice == 6:
        tensors = list(g.initializer)
        if tensors:
            t = rng.choice(tensors)
            r = rng.random()
            if r < 0.3:
                del t.dims[:]
                t.dims.extend(rng.choice([[2**62], [2**32, 2**32], [-1], [0], [1, 1, 1], []]))
            elif r < 0.6:
                t.data_location = onnx.TensorProto.EXTERNAL
                del t.external_data[:]
                for k, v in (("location", rng.choice(["weights.bin", "../weights.bin", "/etc/passwd", "", "w2.bin",
                                                       "sub/../weights.bin", "weights.bin\x00x"])),
                             ("offset", rng.choice(["0", "4", "-1", str(2**62), "x"])),
                             ("length", rng.choice(["48", "0", str(2**62), "-5", "1e3"]))):
                    if rng.random() < 0.85:
                        t.external_data.add(key=k, value=v)
            else:
                t.data_type = rng.choice([0, 1, 8, 10, 16, 999 % 25])
            return "initializer"
    if choice == 7 and len(nodes) > 1:
        i, j = rng.sample(range(len(nodes)), 2)
        a, b = onnx.NodeProto(), onnx.NodeProto()
        a.CopyFrom(g.node[i])
        b.CopyFrom(g.node[j])
        g.node[i].CopyFrom(b)
        g.node[j].CopyFrom(a)
        return "swap nodes"
    if choice == 8:
        model.ir_version = rng.choice([0, 1, 3, 7, 8, 9, 10, 11, 12, 13, 99, 2**40])
        return "ir_version"
    if choice == 9 and nodes:
        n = onnx.NodeProto()
        n.CopyFrom(rng.choice(nodes))
        g.node.insert(rng.randrange(len(nodes) + 1), n)
        return "duplicate a node"
    return "noop"


def mutate_bytes(data: bytes, rng: random.Random, seeds: list[bytes]) -> tuple[bytes, str]:
    buf = bytearray(data)
    if not buf:
        return bytes(rng.randbytes(8)), "random"
    k = rng.randrange(8)
    if k == 0:
        for _ in range(rng.choice([1, 1, 2, 8])):
            i = rng.randrange(len(buf))
            buf[i] ^= 1 << rng.randrange(8)
        return bytes(buf), "bit flips"
    if k == 1:
        i = rng.randrange(len(buf))
        buf[i] = rng.choice([0, 1, 0x7F, 0x80, 0xFF, rng.randrange(256)])
        return bytes(buf), "byte set"
    if k == 2:
        return bytes(buf[: rng.randrange(len(buf))]), "truncate"
    if k == 3:
        i = rng.randrange(len(buf))
        j = min(len(buf), i + rng.choice([1, 2, 4, 16, 64]))
        del buf[i:j]
        return bytes(buf), "delete range"
    if k == 4:
        i = rng.randrange(len(buf) + 1)
        buf[i:i] = rng.choice(VARINTS) if rng.random() < 0.6 else rng.randbytes(rng.choice([1, 3, 16]))
        return bytes(buf), "insert"
    if k == 5:
        i = rng.randrange(len(buf))
        j = min(len(buf), i + rng.choice([2, 8, 32, 128]))
        buf[j:j] = buf[i:j]
        return bytes(buf), "duplicate range"
    if k == 6:
        other = rng.choice(seeds)
        cut = rng.randrange(len(buf) + 1)
        return bytes(buf[:cut]) + other[rng.randrange(len(other) + 1):], "splice"
    # a length-delimited field with a huge declared length, appended at the top level
    field = rng.choice([7, 8, 14, 20, 25])
    return bytes(buf) + bytes([(field << 3) | 2]) + rng.choice(VARINTS[2:]) + b"\x01\x02", "huge declared length"


REWRITE_FLAGS = [[], [], ["--bind", "native"], ["--bind", "python"], ["--as-functions"], ["--keep-custom"],
                 ["--prefer", "native,decompose"], ["--target-opset", "19"], ["--dry-run"], ["--json"],
                 ["--external-data", "copy"], ["--full-check"]]


def make_case(seed: int, index: int, seeds) -> tuple[str, bytes, dict[str, bytes], list[str], list[list[str]]]:
    """The case's (seed model name, model bytes, extra files, mutations done, argv lists)."""
    return build_case(random.Random(f"{seed}:{index}"), seeds)


def build_case(rng: random.Random, seeds) -> tuple[str, bytes, dict[str, bytes], list[str], list[list[str]]]:
    """A case drawn with ``rng`` (any random.Random, e.g. hypothesis' st.randoms())."""
    import onnx

    name, data, files = rng.choice(seeds)
    done = []
    byte_level = rng.random() < 0.25  # most byte mutations stop at the parser: keep them a quarter
    for _ in range(rng.choice([1, 1, 2]) if byte_level else rng.choice([1, 1, 2, 3, 4])):
        if byte_level:
            data, what = mutate_bytes(data, rng, [s[1] for s in seeds])
            done.append(f"bytes: {what}")
        else:
            model = onnx.ModelProto()
            try:
                model.ParseFromString(data)
            except Exception:  # noqa: BLE001 - an earlier byte mutation broke it: keep mutating bytes
                data, what = mutate_bytes(data, rng, [s[1] for s in seeds])
                done.append(f"bytes: {what}")
                continue
            done.append("field: " + mutate_fields(model, rng))
            try:
                data = model.SerializeToString()
            except Exception as exc:  # noqa: BLE001 - protobuf refuses the mutation itself
                done.append(f"(unserializable: {type(exc).__name__})")
    argvs = [["rewrite", "{in}", "{out}", *rng.choice(REWRITE_FLAGS)],
             ["inspect", "{in}", *(["--json"] if rng.random() < 0.5 else [])]]
    # one more entry point per case (keeps a case's cost near what it was with two)
    extra = rng.randrange(4)
    if extra == 0:
        argvs.append(["run", "{in}", "--seed", str(rng.randrange(1000)),
                      *(["--dim", f"N={rng.choice([1, 2, 5])}"] if rng.random() < 0.5 else [])])
    elif extra == 1:
        argvs.append(["compare", "{in}", "{in}", *rng.choice([[], ["--bind", "native"], ["--bind", "python"]])])
    elif extra == 2:
        argvs.append(["rewrite", "{in}", "{out}", "--rules", str(RULES_FILE),
                      *rng.choice([[], ["--bind", "native"], ["--bind", "python"]])])
    else:
        argvs.append(["api", "{in}", rng.choice(["decompose", "native", "python"]), str(rng.randrange(1000))])
    return name, data, dict(files), done, argvs


# -- running a case ------------------------------------------------------------------------------------

def _tree(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink():
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            out[str(p.relative_to(root))] = "other"
    return out


def _exception_type(tb: str) -> str:
    """The exception class of the last traceback in ``tb`` (its message may span lines)."""
    lines = tb.splitlines()
    last_frame = max((i for i, ln in enumerate(lines) if ln.startswith("  File ")), default=None)
    if last_frame is None:
        return "?"
    for ln in lines[last_frame + 1:]:
        if ln and not ln.startswith(" "):
            return ln.split(":", 1)[0].strip().rsplit(".", 1)[-1]
    return "?"


def _signature(tb: str, exc_type: str) -> tuple[str, str, str]:
    """(exception type, innermost graphkit or custom_ops file, function) of a traceback."""
    frames = [line.strip() for line in tb.splitlines() if line.strip().startswith("File ")]
    for frame in reversed(frames):
        if "/graphkit/" in frame or "/custom_ops/" in frame:
            path = frame.split('"')[1]
            rel = path[path.rfind("/graphkit/") + 1:] if "/graphkit/" in path else path[path.rfind("/custom_ops/") + 1:]
            return (exc_type, rel, frame.rsplit(" in ", 1)[-1])
    return (exc_type, "?", "?")


def _api(argv: list[str]) -> int:
    """The Python API in-process: rewrite_model, then open_session + run on random inputs.
    Returns 0, or the GraphkitError's exit code; anything else propagates (a finding)."""
    import onnx

    from graphkit.errors import GraphkitError
    from graphkit.rewrite import Lowering, rewrite_model
    from graphkit.runtime.session import open_session

    _, path, lowering, seed = argv
    try:
        model = onnx.load(path, load_external_data=False)
    except Exception:  # noqa: BLE001 - onnx's own parser refuses it: graphkit never sees it
        return 3
    try:
        out, _ = rewrite_model(model, lowering=(Lowering(lowering), Lowering.DECOMPOSE), path=path)
        session = open_session(path)
        session.run(session.random_feeds(int(seed)))
        session = open_session(out)
        session.run(session.random_feeds(int(seed)))
    except GraphkitError as exc:
        return exc.exit_code
    return 0


def run_case(seed: int, index: int, seeds, workdir: Path) -> dict:
    return run_built_case(make_case(seed, index, seeds), index, workdir)


def run_built_case(case: tuple, index: int, workdir: Path) -> dict:
    """Run a case's commands in this process; every check's verdict is in ``problem``."""
    from graphkit.cli import main

    name, data, files, done, argvs = case
    case_dir = workdir / f"case{index}"
    in_dir, out_dir = case_dir / "in", case_dir / "out"
    in_dir.mkdir(parents=True)
    out_dir.mkdir()
    (in_dir / "m.onnx").write_bytes(data)
    for fname, content in files.items():
        (in_dir / fname).write_bytes(content)
    before = _tree(in_dir)
    results = []
    try:
        for argv in argvs:
            argv = [a.replace("{in}", str(in_dir / "m.onnx")).replace("{out}", str(out_dir / "o.onnx")) for a in argv]
            err, out = io.StringIO(), io.StringIO()
            problem = None
            tb = None
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
                try:
                    if argv[0] == "api":
                        try:
                            rc = _api(argv)
                        except Exception:  # noqa: BLE001 - not a GraphkitError: a finding
                            rc, tb = 70, traceback.format_exc()
                    else:
                        rc = main(argv)
                except SystemExit as exc:
                    rc, problem = -1, f"SystemExit({exc.code}) escaped main()"
                except BaseException as exc:  # noqa: BLE001 - main() must catch everything
                    rc, problem = -1, f"{type(exc).__name__} escaped main(): {exc}"
            text = err.getvalue()
            lines = [line for line in text.splitlines() if line.strip()]
            signature = None
            if rc == 70 and tb is not None:
                problem = "internal error (API): " + tb.strip().splitlines()[-1][:200]
                signature = _signature(tb, _exception_type(tb))
            elif rc == 70:
                problem = "internal error (exit 70): " + (lines[0] if lines else "")
                dbg = io.StringIO()
                with contextlib.redirect_stderr(dbg), contextlib.redirect_stdout(io.StringIO()):
                    with contextlib.suppress(BaseException):
                        main([*argv, "--debug"])
                tb = dbg.getvalue()
                signature = _signature(tb, _exception_type(tb))
            elif problem is None and rc not in DOCUMENTED:
                problem = f"exit code {rc} is not in docs/exit-codes.md's table"
            elif problem is None and rc != 0 and argv[0] != "api" and (len(lines) != 1 or not lines[0].startswith("graphkit: error: ")):
                problem = f"{len(lines)} stderr lines: {text[:500]!r}"
            elif problem is None and "Traceback" in text:
                problem = "traceback on stderr"
            if problem is None and argv[0] == "rewrite":
                written = sorted(p.name for p in out_dir.iterdir())
                if rc != 0 and written:
                    problem = f"failed rewrite left {written} behind"
                elif rc == 0 and "--dry-run" not in argv:
                    import onnx

                    try:
                        onnx.load_model_from_string((out_dir / "o.onnx").read_bytes())
                    except Exception as exc:  # noqa: BLE001
                        problem = f"exit 0 but the output does not parse: {exc}"
            if problem is None and _tree(in_dir) != before:
                problem = "an input file changed"
            shown = [a for a in argv[1:] if str(case_dir) not in a and a != str(RULES_FILE)]
            results.append({"argv": argv[:1] + (["--rules"] if str(RULES_FILE) in argv else []) + shown,
                            "rc": rc, "problem": problem, "signature": signature,
                            "stderr": lines[0][:300] if lines else ""})
            for p in out_dir.iterdir():
                p.unlink() if p.is_file() or p.is_symlink() else shutil.rmtree(p)
    finally:
        shutil.rmtree(case_dir, ignore_errors=True)
    return {"case": index, "seed_model": name, "mutations": done, "results": results}


# -- workers and the driver --------------------------------------------------------------------------------

def worker(seed: int, start: int, stop: int, limit: int) -> None:
    if limit:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    def on_alarm(*_):
        raise TimeoutError(f"case took over {CASE_SECONDS} s")

    signal.signal(signal.SIGALRM, on_alarm)
    seeds = seed_models()
    # graphkit's own imports, before the first case's alarm starts
    import graphkit.cli.inspect  # noqa: F401
    import graphkit.cli.compare  # noqa: F401
    import graphkit.cli.rewrite  # noqa: F401
    import graphkit.cli.run  # noqa: F401
    import graphkit.inspection  # noqa: F401
    import graphkit.rewrite  # noqa: F401
    import graphkit.runtime.session  # noqa: F401

    workdir = Path(tempfile.mkdtemp(prefix="graphkit-fuzz-"))
    try:
        for index in range(start, stop):
            print(json.dumps({"start": index}), flush=True)
            signal.alarm(CASE_SECONDS)
            try:
                result = run_case(seed, index, seeds, workdir)
            except TimeoutError as exc:
                result = {"case": index, "results": [{"argv": ["?"], "rc": -2, "problem": f"hang: {exc}",
                                                      "signature": ("hang", "?", "?"), "stderr": ""}]}
            except BaseException as exc:  # noqa: BLE001 - a harness error is a finding too
                result = {"case": index, "results": [{"argv": ["?"], "rc": -3,
                                                      "problem": f"harness: {type(exc).__name__}: {exc}",
                                                      "signature": ("harness", type(exc).__name__, "?"),
                                                      "stderr": traceback.format_exc()[-500:]}]}
            finally:
                signal.alarm(0)
            print(json.dumps(result), flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def drive(seed: int, cases: int, jobs: int, limit: int, max_seconds: float | None) -> dict:
    """Run cases [0, cases) on ``jobs`` worker processes; restart a worker after a dead case."""
    todo = collections.deque()
    per = -(-cases // jobs)
    for j in range(jobs):
        lo, hi = j * per, min(cases, (j + 1) * per)
        if lo < hi:
            todo.append((lo, hi))
    results: dict[int, dict] = {}
    t0 = time.monotonic()
    running: list[tuple[subprocess.Popen, list[int], int]] = []

    def spawn(lo, hi):
        proc = subprocess.Popen([sys.executable, __file__, "--worker", "--seed", str(seed), "--start", str(lo),
                                 "--stop", str(hi), "--limit", str(limit)], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True, bufsize=1)
        return proc

    import selectors

    sel = selectors.DefaultSelector()
    state = {}
    for lo, hi in todo:
        p = spawn(lo, hi)
        state[p] = {"lo": lo, "hi": hi, "current": None}
        sel.register(p.stdout, selectors.EVENT_READ, p)
    timed_out = False
    while state:
        if max_seconds is not None and time.monotonic() - t0 > max_seconds and not timed_out:
            timed_out = True
            for p in state:
                p.kill()
        for key, _ in sel.select(timeout=1.0):
            p = key.data
            line = p.stdout.readline()
            if line:
                msg = json.loads(line)
                if "start" in msg:
                    state[p]["current"] = msg["start"]
                else:
                    results[msg["case"]] = msg
                    state[p]["current"] = None
                continue
            sel.unregister(p.stdout)
            rc = p.wait()
            st = state.pop(p)
            cur = st["current"]
            if cur is not None and not timed_out:
                results[cur] = {"case": cur, "results": [{"argv": ["?"], "rc": -4,
                                                          "problem": f"worker died (exit status {rc})",
                                                          "signature": ("dead process", str(rc), "?"), "stderr": ""}]}
                if cur + 1 < st["hi"]:
                    q = spawn(cur + 1, st["hi"])
                    state[q] = {"lo": cur + 1, "hi": st["hi"], "current": None}
                    sel.register(q.stdout, selectors.EVENT_READ, q)
    return {"seed": seed, "cases": len(results), "results": results, "seconds": time.monotonic() - t0,
            "timed_out": timed_out}


def summarize(run: dict) -> dict:
    by_cmd: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    findings: dict[tuple, dict] = {}
    for index in sorted(run["results"]):
        case = run["results"][index]
        for r in case["results"]:
            by_cmd[r["argv"][0]][r["rc"]] += 1
            if r["problem"]:
                sig = tuple(r["signature"]) if r["signature"] else ("check", r["problem"][:80], r["argv"][0])
                f = findings.setdefault(sig, {"signature": list(sig), "count": 0, "first_case": index,
                                              "problem": r["problem"], "argv": r["argv"],
                                              "mutations": case.get("mutations"), "seed_model": case.get("seed_model"),
                                              "known": KNOWN.get(sig)})
                f["count"] += 1
    return {"seed": run["seed"], "cases": run["cases"], "seconds": round(run["seconds"], 1),
            "exit_codes": {cmd: dict(sorted(c.items())) for cmd, c in sorted(by_cmd.items())},
            "findings": list(findings.values()),
            "new_findings": sum(1 for f in findings.values() if not f["known"])}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--limit", type=int, default=MEMORY_LIMIT, help="RLIMIT_AS per worker, bytes (0: none)")
    ap.add_argument("--max-seconds", type=float, help="stop after this long (the count says how far it got)")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    ap.add_argument("--reproduce", type=int, metavar="CASE", help="run one case in this process and show it")
    ap.add_argument("--save", metavar="DIR", help="with --reproduce: write the case's files to DIR")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--start", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--stop", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.seed, args.start, args.stop, args.limit)
        return 0
    if args.reproduce is not None:
        seeds = seed_models()
        name, data, files, done, argvs = make_case(args.seed, args.reproduce, seeds)
        if args.save:
            d = Path(args.save)
            d.mkdir(parents=True, exist_ok=True)
            (d / "m.onnx").write_bytes(data)
            for f, content in files.items():
                (d / f).write_bytes(content)
        print(f"case {args.reproduce}: seed model {name}, mutations {done}")
        print(json.dumps(run_case(args.seed, args.reproduce, seeds, Path(tempfile.mkdtemp())), indent=2))
        return 0
    summary = summarize(drive(args.seed, args.cases, max(1, args.jobs), args.limit, args.max_seconds))
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"fuzz: {summary['cases']} cases (seed {summary['seed']}) in {summary['seconds']} s")
        for cmd, counts in summary["exit_codes"].items():
            print(f"  {cmd:8} " + ", ".join(f"exit {rc}: {n}" for rc, n in counts.items()))
        if not summary["findings"]:
            print("  findings: none")
        for f in summary["findings"]:
            tag = "known" if f["known"] else "NEW"
            print(f"  [{tag}] {f['count']}x {' / '.join(map(str, f['signature']))}: {f['problem'][:200]}")
            print(f"         first: case {f['first_case']} ({f['seed_model']}: {f['mutations']}), "
                  f"`python bench/fuzz.py --seed {summary['seed']} --reproduce {f['first_case']}`")
    return 1 if summary["new_findings"] else 0


if __name__ == "__main__":
    sys.exit(main())
