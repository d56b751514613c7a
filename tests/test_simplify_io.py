"""graphkit simplify on model files with large inline weights: the weights' bytes are copied
from the input unparsed (graphkit.rewrite.simplify._splice). The output must be the plain
path's (``fast=False``: parsed, simplified, serialized whole) byte for byte, with weights
folded, merged, removed, changed, lifted and inside subgraphs, and compute what the input
computes in ONNX Runtime."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphkit.rewrite.simplify import simplify_file, simplify_options
from graphkit.rewrite.simplify import _splice
from tests.conftest import run_cli

F = TensorProto.FLOAT
ROWS, COLS = 128, 160  # a weight of 80 KiB: over _splice.MIN_SPLICED


def vi(name, dims, elem=F):
    return helper.make_tensor_value_info(name, elem, dims)


def weight(rng, name, shape=(ROWS, COLS)):
    return numpy_helper.from_array((rng.standard_normal(shape) * 0.05).astype(np.float32), name)


def model_of(nodes, inputs, outputs, initializers, opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializers)
    imports = [helper.make_opsetid("", opset), helper.make_opsetid("custom", 1)]
    return helper.make_model(graph, opset_imports=imports, ir_version=10)


def mlp():
    """Large weights that pass through, fold (a Transpose of one), merge (two equal ones),
    go (one nothing reads) and are lifted (a large Constant node); small ones beside them."""
    rng = np.random.default_rng(0)
    w1, wt, w2, unused = weight(rng, "w1"), weight(rng, "wt"), weight(rng, "w2"), weight(rng, "unused")
    w2dup = onnx.TensorProto()
    w2dup.CopyFrom(w2)
    w2dup.name = "w2dup"
    b1 = numpy_helper.from_array(rng.standard_normal(COLS).astype(np.float32), "b1")
    lifted = (rng.standard_normal((COLS, COLS)) * 0.05).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h1"]),
        helper.make_node("Add", ["h1", "b1"], ["h2"]),
        helper.make_node("Transpose", ["wt"], ["wtt"], perm=[1, 0]),  # folds: a new initializer
        helper.make_node("MatMul", ["h2", "wtt"], ["h3"]),
        helper.make_node("MatMul", ["h3", "w2"], ["a"]),
        helper.make_node("MatMul", ["h3", "w2dup"], ["b"]),  # w2dup merges into w2, then the node into the other
        helper.make_node("Add", ["a", "b"], ["c"]),
        helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(lifted)),
        helper.make_node("MatMul", ["c", "k"], ["d"]),
        helper.make_node("Identity", ["d"], ["y"]),
    ]
    return model_of(nodes, [vi("x", ["n", ROWS])], [vi("y", ["n", COLS])], [w1, b1, wt, w2, w2dup, unused])


def with_subgraphs():
    """An If whose branches hold large initializers of their own and read the main graph's."""
    rng = np.random.default_rng(1)
    outer = weight(rng, "outer")

    def branch(name, seed):
        inner = weight(np.random.default_rng(seed), f"{name}_w", (COLS, COLS))
        nodes = [helper.make_node("MatMul", ["x", "outer"], [f"{name}_h"]),
                 helper.make_node("MatMul", [f"{name}_h", f"{name}_w"], [f"{name}_y"])]
        return helper.make_graph(nodes, name, [], [vi(f"{name}_y", ["n", COLS])], [inner])

    nodes = [helper.make_node("If", ["cond"], ["r"], then_branch=branch("then", 2), else_branch=branch("else", 3)),
             helper.make_node("MatMul", ["r", "main"], ["y"])]
    main = weight(rng, "main", (COLS, COLS))
    return model_of(nodes, [vi("x", ["n", ROWS]), vi("cond", [], TensorProto.BOOL)], [vi("y", ["n", COLS])],
                    [outer, main])


def dcn():
    """deform_conv2d then BatchNormalization: the BN folds into the op's weight (changed) and
    bias (made); the offsets' large constant passes through."""
    rng = np.random.default_rng(3)
    c, m = 32, 64
    inits = [numpy_helper.from_array((rng.standard_normal((m, c, 3, 3)) * 0.1).astype(np.float32), "w")]
    for name, v in (("g", rng.uniform(0.5, 2, m)), ("be", rng.standard_normal(m)), ("mu", rng.standard_normal(m)),
                    ("var", rng.uniform(0.5, 2, m))):
        inits.append(numpy_helper.from_array(v.astype(np.float32), name))
    inits.append(numpy_helper.from_array((rng.standard_normal((1, 18, 30, 30)) * 0.5).astype(np.float32), "off"))
    nodes = [helper.make_node("deform_conv2d", ["x", "w", "off"], ["d"], domain="custom", padding=[0, 0]),
             helper.make_node("BatchNormalization", ["d", "g", "be", "mu", "var"], ["y"], epsilon=1e-3)]
    return model_of(nodes, [vi("x", [1, c, 32, 32])], [vi("y", [1, m, 30, 30])], inits, opset=18)


def conv_bn():
    """Conv then BatchNormalization: the fusion library's conv_bn reads the Conv's large weight
    (through the rules' graph view, as external data of the model file) and makes new ones."""
    rng = np.random.default_rng(4)
    c, m = 64, 128
    inits = [numpy_helper.from_array((rng.standard_normal((m, c, 3, 3)) * 0.05).astype(np.float32), "w")]
    for name, v in (("g", rng.uniform(0.5, 2, m)), ("be", rng.standard_normal(m)), ("mu", rng.standard_normal(m)),
                    ("var", rng.uniform(0.5, 2, m))):
        inits.append(numpy_helper.from_array(v.astype(np.float32), name))
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "g", "be", "mu", "var"], ["y"], epsilon=1e-5)]
    return model_of(nodes, [vi("x", ["n", c, 8, 8])], [vi("y", ["n", m, 8, 8])], inits)


def folded_conv_bn():
    """conv_bn whose Conv weight is a Transpose of a large one: fold-constants makes the
    weight (held as an array by the splice) that the fusion library's conv_bn then reads."""
    model = conv_bn()
    w = next(t for t in model.graph.initializer if t.name == "w")
    w.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w).transpose(1, 0, 2, 3).copy(), "w0"))
    model.graph.node.insert(0, helper.make_node("Transpose", ["w0"], ["w"], perm=[1, 0, 2, 3]))
    return model


def feeds_for(name):
    rng = np.random.default_rng(7)
    if name == "dcn":
        return [{"x": rng.standard_normal((1, 32, 32, 32)).astype(np.float32)}]
    if name in ("conv_bn", "folded_conv_bn"):
        return [{"x": rng.standard_normal((n, 64, 8, 8)).astype(np.float32)} for n in (1, 2)]
    feeds = [{"x": rng.standard_normal((n, ROWS)).astype(np.float32)} for n in (1, 3)]
    if name == "with_subgraphs":
        feeds = [{**f, "cond": np.array(c)} for f in feeds for c in (True, False)]
    return feeds


MODELS = {"mlp": mlp, "with_subgraphs": with_subgraphs, "dcn": dcn, "conv_bn": conv_bn,
          "folded_conv_bn": folded_conv_bn}


def run(path, feeds):
    from graphkit.runtime import open_session

    return open_session(str(path)).run(feeds)


def same_values(src, dst, feeds_list):
    for feeds in feeds_list:
        want, got = run(src, feeds), run(dst, feeds)
        assert want.keys() == got.keys()
        for k in want:
            scale = float(np.max(np.abs(want[k]))) if want[k].size else 1.0
            np.testing.assert_allclose(got[k], want[k], rtol=0, atol=1e-5 * max(scale, 1e-30))


def spliced_and_plain(tmp_path, model, **options):
    src = tmp_path / "in" / "model.onnx"
    src.parent.mkdir(exist_ok=True)
    onnx.save(model, src)
    spliced, plain = tmp_path / "spliced.onnx", tmp_path / "plain.onnx"
    opts = simplify_options(**options)
    fast = simplify_file(src, spliced, options=opts)
    slow = simplify_file(src, plain, options=opts, fast=False)
    return src, spliced, plain, fast, slow


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("size_limit", [None, 1024])
def test_spliced_output_is_the_plain_paths_byte_for_byte(tmp_path, name, size_limit):
    """Every model, with the default fold limit and one far under the weights' size (a weight
    of the model file is read as an inline one is: no limit keeps it from folding)."""
    options = {} if size_limit is None else {"size_limit": size_limit}
    src, spliced, plain, fast, slow = spliced_and_plain(tmp_path, MODELS[name](), **options)
    assert "copied from it unparsed" in fast.report.writer_reason
    assert "unparsed" not in slow.report.writer_reason
    assert spliced.read_bytes() == plain.read_bytes()
    assert fast.output == slow.output == plain.read_bytes()
    assert fast.report.passes == slow.report.passes and fast.report.ops_after == slow.report.ops_after
    assert fast.sizes == slow.sizes
    same_values(src, spliced, feeds_for(name))


def test_what_the_passes_did_to_the_large_weights(tmp_path):
    """The mlp: the Transpose folded, the duplicate merged, the unused one gone, the Constant
    lifted; the weights left are the input's bytes."""
    src, spliced, _, fast, _ = spliced_and_plain(tmp_path, mlp())
    passes = dict(fast.report.passes)
    for name in ("fold-constants", "merge-constants", "eliminate-dead", "lift-constants"):
        assert f"simplify:{name}" in passes, passes
    before = {t.name: t for t in onnx.load(src).graph.initializer}
    after = {t.name: t for t in onnx.load(spliced).graph.initializer}
    assert {"wt", "w2dup", "unused"}.isdisjoint(after) and {"w1", "w2", "b1"} <= set(after)
    for name in ("w1", "w2"):
        assert after[name].SerializeToString() == before[name].SerializeToString()
    assert all(t.data_location != TensorProto.EXTERNAL for t in after.values())


def test_a_fusion_reads_a_large_weight_of_the_model_file(tmp_path):
    src, spliced, _, fast, _ = spliced_and_plain(tmp_path, conv_bn())
    assert "simplify:fuse" in dict(fast.report.passes)
    assert [n.op_type for n in onnx.load(spliced).graph.node] == ["Conv"]


@pytest.mark.parametrize("name", ["dcn", "mlp", "folded_conv_bn"])
def test_large_weights_a_pass_made_are_written_from_their_arrays(tmp_path, name):
    """A weight folded (the DCN's BatchNormalization into its weight, the mlp's Transpose) is
    held as an array (graphkit.rewrite.graph.held), written from it and never serialized:
    a memoryview among the output's pieces, the bytes the plain path's. In folded_conv_bn the
    fusion library's conv_bn reads the held weight fold-constants made (its own new weight is
    inline: no memoryview); reading none, it would not fuse."""
    src, _, plain, _, _ = spliced_and_plain(tmp_path, MODELS[name]())
    report, sizes, pieces = _splice.simplify_spliced(str(src), None, registry=None, options=simplify_options())
    held = [p for p in pieces._parts if isinstance(p, memoryview)]
    assert pieces.join() == plain.read_bytes() and sizes["bytes_after"] == len(pieces)
    if name == "folded_conv_bn":
        assert "simplify:fold-constants" in dict(report.passes) and "simplify:fuse" in dict(report.passes)
        assert [n.op_type for n in onnx.load(plain).graph.node] == ["Conv"] and not held
    else:
        assert held and all(len(p) >= _splice.MIN_SPLICED for p in held)


def test_a_held_weight_where_restore_does_not_look_is_materialized(tmp_path):
    """_materialized (restore's fallback) writes a held weight's bytes into its raw_data: the
    tensor numpy_helper.from_array makes."""
    from graphkit.rewrite.graph.held import HeldWeights

    src = tmp_path / "m.onnx"
    onnx.save(mlp(), src)
    value = np.random.default_rng(8).standard_normal((ROWS, COLS)).astype(np.float32)
    model = onnx.load(src)
    weights = HeldWeights("m.onnx", os.path.getsize(src), _splice.MIN_SPLICED)
    assert weights.hold(model.graph.initializer.add(), value, "made")
    assert not weights.hold(onnx.TensorProto(), value[:2], "small")
    want = onnx.load(src)
    want.graph.initializer.append(numpy_helper.from_array(value, "made"))
    source = _splice._Source(str(src))
    try:
        assert _splice._materialized(model.SerializeToString(), source, weights) == want.SerializeToString()
    finally:
        source.close()


def test_the_weights_are_not_read_into_python_where_no_pass_needs_them(tmp_path, monkeypatch):
    """Nothing folds or merges: the bytes read through Python are a small part of the file."""
    rng = np.random.default_rng(5)
    inits = [weight(rng, f"w{i}", (ROWS, ROWS)) for i in range(4)]
    nodes, x = [], "x"
    for i in range(4):
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"h{i}"]))
        x = f"h{i}"
    nodes.append(helper.make_node("Identity", [x], ["y"]))
    model = model_of(nodes, [vi("x", ["n", ROWS])], [vi("y", ["n", ROWS])], inits)
    src = tmp_path / "m.onnx"
    onnx.save(model, src)
    read = []
    real = _splice._Source.read
    monkeypatch.setattr(_splice._Source, "read", lambda self, offset, length: (read.append(length),
                                                                              real(self, offset, length))[1])
    result = simplify_file(src, tmp_path / "out.onnx")
    monkeypatch.undo()
    assert "copied from it unparsed" in result.report.writer_reason
    assert sum(read) < os.path.getsize(src) // 4, read
    plain = simplify_file(src, tmp_path / "plain.onnx", fast=False)
    assert (tmp_path / "out.onnx").read_bytes() == (tmp_path / "plain.onnx").read_bytes()
    assert plain.report.ops_after == result.report.ops_after


def test_external_data_and_symlinks_take_the_plain_path(tmp_path):
    """A model with external data of its own (placed with the output as before), and one read
    through a symlink (ONNX reads no external data through one): the plain path, same output."""
    from onnx.external_data_helper import convert_model_to_external_data

    model = mlp()
    convert_model_to_external_data(model, all_tensors_to_one_file=True, location="w.bin", size_threshold=1024)
    src = tmp_path / "ext" / "m.onnx"
    src.parent.mkdir()
    onnx.save(model, src)
    out = tmp_path / "ext_out" / "m.onnx"
    out.parent.mkdir()
    result = simplify_file(src, out, external_data="copy")
    assert "unparsed" not in result.report.writer_reason
    same_values(src, out, feeds_for("mlp"))

    real = tmp_path / "real.onnx"
    onnx.save(mlp(), real)
    link = tmp_path / "link.onnx"
    link.symlink_to(real)
    via_link = simplify_file(link, tmp_path / "a.onnx")
    assert "unparsed" not in via_link.report.writer_reason
    simplify_file(real, tmp_path / "b.onnx")
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()


def test_dry_run_and_a_refusal_before_writing(tmp_path):
    """A dry run writes nothing and its output is the plain path's; what raises in
    before_write leaves nothing behind; an input changed since refuses to give its output."""
    from graphkit.errors import ModelLoadError

    src = tmp_path / "m.onnx"
    onnx.save(mlp(), src)
    dry = simplify_file(src, None)
    assert "unparsed" in dry.report.writer_reason
    assert dry.sizes["bytes_after"] == len(simplify_file(src, None, fast=False).output)

    def refuse(report, sizes):
        raise RuntimeError("no")

    with pytest.raises(RuntimeError):
        simplify_file(src, tmp_path / "never.onnx", before_write=refuse)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]

    data = src.read_bytes()
    src.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    os.utime(src, ns=(1, 1))
    with pytest.raises(ModelLoadError, match="changed"):
        dry.output


def test_the_skeleton_made_inline_again_is_the_model(tmp_path):
    """_materialized (restore's fallback) on the skeleton gives the model back."""
    model = with_subgraphs()
    src = tmp_path / "m.onnx"
    onnx.save(model, src)
    source = _splice._Source(str(src))
    try:
        skeleton, refs = _splice.skeleton_of_file(source)
        assert len(refs) == 2  # the main graph's two; those inside the If's branches stay inline
        assert len(skeleton) < os.path.getsize(src) - sum(length for _, _, length in refs) + 1024
        parsed = onnx.ModelProto.FromString(skeleton)
        _splice.refer(parsed, refs, "m.onnx")
        skeleton = parsed.SerializeToString()
        assert _splice._materialized(skeleton, source) == model.SerializeToString()
        parts, restored = _splice.restore(skeleton, b"m.onnx")
        assert restored == 2
        assert b"".join(p if isinstance(p, bytes) else source.read(*p) for p in parts) == model.SerializeToString()
    finally:
        source.close()


def test_cli_writes_the_plain_paths_bytes(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(mlp(), src)
    proc = run_cli("simplify", str(src), str(tmp_path / "cli.onnx"), "--json")
    assert proc.returncode == 0, proc.stderr
    simplify_file(src, tmp_path / "plain.onnx", fast=False)
    assert (tmp_path / "cli.onnx").read_bytes() == (tmp_path / "plain.onnx").read_bytes()


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize("axes, keepdims", [(None, 1), ([1], 0), ([-1, 0], 1), ([2], 1), ([0, 2], 0)])
def test_reduce_max_and_min_fold_in_numpy_as_the_reference_does(op, opset, axes, keepdims):
    """ReduceMax/ReduceMin fold in the numpy table (the dynamo ViT's attention mask: no
    onnx.reference import, about 0.1 s of its run), to the reference's values and dtype."""
    from graphkit.rewrite.simplify import _evaluate

    rng = np.random.default_rng(11)
    for x in (rng.standard_normal((3, 4, 5)).astype(np.float32), rng.integers(-9, 9, (3, 4, 5)).astype(np.int32)):
        attrs = {"keepdims": keepdims}
        inputs = [x]
        if axes is not None and opset < 18:
            attrs["axes"] = axes
        elif axes is not None:
            inputs.append(np.array(axes, np.int64))
        node = helper.make_node(op, ["x", "axes"][:len(inputs)], ["y"], **attrs)
        assert _evaluate._numpy(op, node, inputs, opset) is not None  # the table's, not the reference's
        got = _evaluate.evaluate(node, inputs, opset, None, frozenset())
        want = _evaluate._reference(node, inputs, opset)
        assert got[0].dtype == want[0].dtype and got[0].shape == want[0].shape
        np.testing.assert_array_equal(got[0], want[0])


@pytest.mark.parametrize("data", [b"\x3a\x80", b"\x3a" + b"\xff" * 10 + b"\x01", b"\x3f\x00", b"\x3a\x05ab"],
                         ids=["truncated varint", "varint over 64 bits", "wire type 7", "truncated field"])
def test_bytes_the_splice_does_not_read_are_malformed_not_a_crash(tmp_path, data):
    """The splice reads keys and lengths with bytes/wire.read_varint; what it cannot read is
    _Malformed (the plain path runs and reports), never an IndexError or wire's Unsupported."""
    with pytest.raises(_splice._Malformed):
        _splice._entries(data, 0, len(data))
    src = tmp_path / "bad.onnx"
    src.write_bytes(data)
    source = _splice._Source(str(src))
    try:
        with pytest.raises(_splice._Malformed):
            source.entries(0, source.size)
    finally:
        source.close()
    assert _splice.simplify_spliced(str(src), None, registry=None, options=simplify_options()) is None
