"""The wire-level fast path gives rewrite_model's result, field for field, or steps aside."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from conftest import NP_TYPES, REPO, my_add_model, run_cli
from graphkit.errors import GraphkitError, RewriteError, ValidationError
from graphkit.ops import Decomposition, NativeKernels, OpDef, OpPackage, OpRegistry, Param, default_registry
from graphkit.rewrite import Lowering, rewrite_model
from graphkit.rewrite.bytes import bodies
from graphkit.rewrite.bytes import body_scopes
from graphkit.rewrite.bytes import body_splice
from graphkit.rewrite.bytes import columns
from graphkit.rewrite.bytes import common
from graphkit.rewrite.bytes import main_graph
from graphkit.rewrite.bytes import wire
from graphkit.rewrite.writers import InBodies, Pieces, Request, Unsupported
from graphkit.rewrite.engine import DEFAULT_PREFERENCE
from graphkit.rewrite.files import rewrite_bytes
from graphkit.rewrite.graph.types import TypeTable

F = TensorProto.FLOAT


def _bench_model(pairs: int) -> onnx.ModelProto:
    spec = importlib.util.spec_from_file_location("rewrite_100k", REPO / "bench" / "rewrite_100k.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "chain.onnx"
        bench.make_model(path, pairs)
        return onnx.load(path)


def lower_bytes(data: bytes, model: onnx.ModelProto, **options):
    """The byte writer rewrite_bytes runs: the main graph's, else (placeholders in subgraphs) the
    bodies'; the output's bytes and the report. ``options``: the Request's keywords."""
    try:
        out, report = main_graph.write(Request(data, model, **options))
    except InBodies:
        out, report = bodies.write(Request(data, model, **options))
    return out.join(), report


def _request(data: bytes, model: onnx.ModelProto, **options) -> Request:
    return Request(data, model, registry=default_registry(), prefer=DEFAULT_PREFERENCE, **options)


def _without_writer(report) -> dict:
    out = report.to_dict()
    del out["writer"]
    return out


def _prefer(lowering) -> tuple:
    return (lowering,) if isinstance(lowering, Lowering) else tuple(lowering)


def same(model: onnx.ModelProto, *, registry: OpRegistry | None = None, lowering=DEFAULT_PREFERENCE,
         check: bool = True, data: bytes | None = None, **options) -> bytes:
    """Rewrite ``model`` both ways; the results must be equal field for field, reports too.
    ``options``: target_opset."""
    registry = registry or default_registry()
    data = model.SerializeToString() if data is None else data
    fast, fast_report = lower_bytes(data, model, registry=registry, prefer=_prefer(lowering), check=check, **options)
    slow, slow_report = rewrite_model(model, registry=registry, lowering=lowering, check=check, **options)
    assert onnx.ModelProto.FromString(fast).SerializeToString() == slow.SerializeToString()
    assert _without_writer(fast_report) == _without_writer(slow_report)
    assert fast_report.writer == "bytes" and slow_report.writer == "objects"
    assert fast_report.actions == slow_report.actions
    assert +fast_report.ops_before == +slow_report.ops_before
    via_api, api_report = rewrite_bytes(data, registry=registry, lowering=lowering, check=check, **options)
    assert via_api == fast and api_report.writer == "bytes"
    return fast


def steps_aside(model: onnx.ModelProto, match: str, registry: OpRegistry | None = None, check: bool = True) -> None:
    data = model.SerializeToString()
    registry = registry or default_registry()
    with pytest.raises(Unsupported, match=match):
        lower_bytes(data, model, registry=registry, prefer=DEFAULT_PREFERENCE, check=check)
    # rewrite_bytes still gives the object path's result
    out, report = rewrite_bytes(data, registry=registry, check=check)
    slow, slow_report = rewrite_model(model, registry=registry, check=check)
    assert out == slow.SerializeToString() and _without_writer(report) == _without_writer(slow_report)
    assert report.writer == "objects" and match.split("|")[0] in report.writer_reason


# -- equal results --------------------------------------------------------------------------

@pytest.mark.parametrize("pairs", [1, 2, 50, 600])
def test_bench_model(pairs):
    same(_bench_model(pairs))


def test_bench_model_bytes_identical():
    model = _bench_model(300)
    fast = same(model)
    assert fast == rewrite_model(model)[0].SerializeToString()  # canonical input: even the bytes


@pytest.mark.parametrize("dtype", list(NP_TYPES))
@pytest.mark.parametrize("opset", [13, 17, 21])
def test_my_add(dtype, opset):
    same(my_add_model(dtype, opset))


@pytest.mark.parametrize("lowering", [Lowering.NATIVE, Lowering.PYTHON, Lowering.DECOMPOSE,
                                      (Lowering.NATIVE, Lowering.DECOMPOSE)])
def test_lowerings(lowering):
    same(_bench_model(40), lowering=lowering)
    same(my_add_model(TensorProto.DOUBLE), lowering=lowering)


def test_keep_and_no_custom_nodes_give_the_input_bytes():
    model = _bench_model(5)
    data = model.SerializeToString()
    out, report = lower_bytes(data, model, registry=default_registry(), prefer=(Lowering.KEEP,))
    assert out is data and not report.changed
    plain = onnx.ModelProto()
    plain.CopyFrom(my_add_model())
    plain.graph.node[0].domain = ""
    plain.graph.node[0].op_type = "Add"
    del plain.opset_import[1:]
    data = plain.SerializeToString()
    out, report = rewrite_bytes(data)
    assert out == data and report.ops_after == report.ops_before == {("", "Add"): 1, ("", "Relu"): 1}


def _rich_model(opset: int = 17) -> onnx.ModelProto:
    """Initializers, value_info, doc strings, metadata, a standard If with subgraphs, typed chains."""
    then_g = helper.make_graph([helper.make_node("Relu", ["r0"], ["t_out"], name="then_relu")], "then", [],
                               [helper.make_tensor_value_info("t_out", F, None)])
    else_g = helper.make_graph([helper.make_node("Neg", ["r0"], ["e_out"], name="else_neg")], "else", [],
                               [helper.make_tensor_value_info("e_out", F, None)])
    w = numpy_helper.from_array(np.full((2, 3), 0.5, np.float32), "w")
    nodes = [
        helper.make_node("my_add", ["x", "w"], ["a0"], domain="custom", name="add0", doc_string="first"),
        helper.make_node("Relu", ["a0"], ["r0"], name="relu0"),
        helper.make_node("ReduceSum", ["r0"], ["s"], name="sum", keepdims=0),
        helper.make_node("Greater", ["s", "zero"], ["cond"], name="gt"),
        helper.make_node("If", ["cond"], ["branch"], name="if0", then_branch=then_g, else_branch=else_g),
        helper.make_node("my_add", ["branch", "x"], ["a1"], domain="custom", name="add1"),
        helper.make_node("Shape", ["a1"], ["shp"], name="shape"),
        helper.make_node("Cast", ["shp"], ["shp_f"], name="cast", to=F),
        helper.make_node("TopK", ["a1", "k"], ["top", "top_i"], name="topk", axis=1),
        helper.make_node("my_add", ["top", "top"], ["a2"], domain="custom", name="add2"),
        helper.make_node("CastLike", ["shp_f", "a2"], ["like"], name="castlike") if opset >= 15 else
        helper.make_node("Where", ["cond", "a2", "shp_f"], ["like"], name="where"),
        helper.make_node("my_add", ["like", "like"], ["a3"], domain="custom", name="add3"),
        helper.make_node("Identity", ["a3"], ["y"], name="ident"),
    ]
    graph = helper.make_graph(
        nodes, "rich", [helper.make_tensor_value_info("x", F, [2, 3])],
        [helper.make_tensor_value_info("y", F, None), helper.make_tensor_value_info("top_i", TensorProto.INT64, None)],
        initializer=[w, numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
                     numpy_helper.from_array(np.array([2], np.int64), "k")],
        value_info=[helper.make_tensor_value_info("r0", F, [2, 3]),
                    helper.make_tensor_value_info("branch", F, [2, 3])],  # If outputs need a declaration
        doc_string="graph doc")
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("custom", 1)],
                              ir_version=10, producer_name="test", doc_string="model doc")
    helper.set_model_props(model, {"author": "me", "license": "MIT"})
    return model


@pytest.mark.parametrize("opset", [13, 17, 21])
def test_rich_model_with_if_subgraph(opset):
    fast = same(_rich_model(opset))
    out = onnx.ModelProto.FromString(fast)
    assert out.doc_string == "model doc" and out.graph.doc_string == "graph doc"
    assert [p.key for p in out.metadata_props] == ["author", "license"]
    assert out.graph.initializer[0].name == "w" and out.graph.value_info[0].name == "r0"


def test_rich_model_bound():
    same(_rich_model(), lowering=Lowering.NATIVE)


def test_opset_imports_of_kernel_domains_and_none_left_custom():
    model = _bench_model(3)
    model.opset_import.append(helper.make_opsetid("com.example", 2))
    out = onnx.ModelProto.FromString(same(model, lowering=Lowering.PYTHON))
    assert [(i.domain, i.version) for i in out.opset_import] == [("", 17), ("com.example", 2),
                                                                  ("graphkit.python", 1)]


def test_names_taken_in_the_input_are_avoided():
    """An input name starting with a placeholder's '<name>/' makes the generator see every name."""
    model = _bench_model(4)
    relu = model.graph.node[3]
    relu.output[0] = "add2/Mul_out"  # would be generated for add2
    model.graph.node[4].input[0] = "add2/Mul_out"
    model.graph.node[0].name = "add2/Mul"  # a placeholder named like a generated node
    fast = onnx.ModelProto.FromString(same(model))
    names = [n.name for n in fast.graph.node]
    assert "add2/Mul_1" in names and len(set(names)) == len(names)


def test_duplicate_and_missing_node_names():
    model = _bench_model(6)
    for i, node in enumerate(model.graph.node):
        if node.domain == "custom":
            node.name = "" if i % 4 == 0 else "same"
    fast = onnx.ModelProto.FromString(same(model))
    names = [n.name for n in fast.graph.node]
    assert len(set(names)) == len(names) and "my_add/Mul" in names and "same/Mul_1" in names


def test_non_canonical_encoding_and_field_order():
    """Fields out of the usual order (graph first, opset imports last): the same model."""
    model = _bench_model(4)
    data = model.SerializeToString()
    entries = wire.entries(data, 0, len(data))
    shuffled = b"".join(data[start:end] for field, start, _, end in sorted(entries, key=lambda e: -e[0]))
    assert onnx.ModelProto.FromString(shuffled).SerializeToString() == data
    same(model, data=shuffled)


def _opdef_with_attributes() -> OpRegistry:
    from graphkit.ops import Attr, AttrType

    def scale(b, inputs, attrs):
        x, bias = inputs
        y = b.Mul(x, b.constant(attrs["alpha"], like=x))
        return [b.Add(y, bias) if bias else y, b.Identity(x)]

    op = OpDef(name="scale", doc="alpha * x (+ bias); x", inputs=(Param("x", "T"), Param("bias", "T", optional=True)),
               outputs=(Param("y", "T"), Param("x_copy", "T")), type_constraints={"T": ("tensor(float)",)},
               attributes=(Attr("alpha", AttrType.FLOAT, 2.0),), reference=None,
               infer_shapes=lambda shapes, attrs: [shapes[0], shapes[0]],
               decompositions=(Decomposition("mul", scale, min_opset=7),), native=True)
    # --bind native needs a package that brings the kernel (never built here: rewriting only)
    package = OpPackage("test_scale", (op,), native=NativeKernels(root=".", sources=("scale.cc",)))
    return default_registry().with_ops(package)


def test_attributes_optional_inputs_and_two_outputs():
    registry = _opdef_with_attributes()
    nodes, prev = [], "x"
    for i in range(8):
        attrs = {} if i % 3 == 0 else {"alpha": 1.0 + (i % 2)}
        inputs = [prev] if i % 2 else [prev, "x"]
        nodes.append(helper.make_node("scale", inputs, [f"s{i}", f"c{i}"], domain="custom", name=f"scale{i}", **attrs))
        nodes.append(helper.make_node("Relu", [f"s{i}"], [f"r{i}"], name=f"relu{i}"))
        prev = f"r{i}"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [1, 4])],
                              [helper.make_tensor_value_info(prev, F, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)],
                              ir_version=10)
    same(model, registry=registry)
    same(model, registry=registry, lowering=Lowering.NATIVE)


def test_shape_dependent_decomposition_deform_conv():
    """deform_conv2d reads shapes: no template, the engine lowers every node."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 2, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("deform_conv2d", ["x", "w", f"off{i}"], [f"y{i}"], domain="custom", name=f"dc{i}",
                              padding=[1, 1]) for i in range(3)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", F, [1, 2, 5, 5])]
        + [helper.make_tensor_value_info(f"off{i}", F, [1, 18, 5, 5]) for i in range(3)],
        [helper.make_tensor_value_info(f"y{i}", F, [1, 4, 5, 5]) for i in range(3)], initializer=[w])
    for opset in (11, 16, 19):
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                        helper.make_opsetid("custom", 1)], ir_version=9)
        same(model)


def test_asinh_shared_constants_across_kinds():
    nodes = [helper.make_node("asinh", ["x"], ["a"], domain="custom", name="as0"),
             helper.make_node("Cast", ["a"], ["d"], to=TensorProto.DOUBLE, name="cast"),
             helper.make_node("asinh", ["d"], ["b"], domain="custom", name="as1"),
             helper.make_node("asinh", ["x"], ["c"], domain="custom", name="as2")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [3])],
                              [helper.make_tensor_value_info("b", TensorProto.DOUBLE, [3]),
                               helper.make_tensor_value_info("c", F, [3])])
    for opset in (7, 8, 17):
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                        helper.make_opsetid("custom", 1)], ir_version=8)
        same(model)


def test_no_check():
    same(_bench_model(20), check=False)


def test_invalid_replacement_reported_alike():
    def bad(b, inputs, attrs):
        return [b.op("MatMul", inputs[0], b.constant([1.0, 2.0], like=inputs[0]))]

    op = OpDef(name="bad", doc="", inputs=(Param("x", "T"),), outputs=(Param("y", "T"),), reference=None,
               infer_shapes=lambda shapes, attrs: [shapes[0]], type_constraints={"T": ("tensor(float)",)},
               decompositions=(Decomposition("bad", bad, min_opset=7),))
    registry = OpRegistry([op])
    graph = helper.make_graph([helper.make_node("bad", ["x"], ["y"], domain="custom", name="b0")], "g",
                              [helper.make_tensor_value_info("x", F, [3, 3])],
                              [helper.make_tensor_value_info("y", F, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)],
                              ir_version=10)
    with pytest.raises(ValidationError) as slow:
        rewrite_model(model, registry=registry)
    with pytest.raises(ValidationError) as fast:
        lower_bytes(model.SerializeToString(), model, registry=registry, prefer=DEFAULT_PREFERENCE)
    assert str(fast.value) == str(slow.value)


def test_progress_reported(monkeypatch):
    from graphkit.rewrite import engine

    monkeypatch.setattr(engine, "PROGRESS_MIN_NODES", 10)
    monkeypatch.setattr(engine, "PROGRESS_STEP", 8)
    model = _bench_model(30)
    calls = []
    lower_bytes(model.SerializeToString(), model, registry=default_registry(), prefer=DEFAULT_PREFERENCE,
                progress=lambda *a: calls.append(a))
    assert calls[0] == ("lowering", 0, 60) and calls[-1] == ("lowering", 60, 60) and len(calls) > 4


# -- the object path's business -------------------------------------------------------------

def _subgraph_holding_custom() -> onnx.ModelProto:
    then_g = helper.make_graph([helper.make_node("my_add", ["x", "x"], ["t"], domain="custom", name="inner")],
                               "then", [], [helper.make_tensor_value_info("t", F, None)])
    else_g = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", F, None)])
    nodes = [helper.make_node("my_add", ["x", "x"], ["a"], domain="custom", name="outer"),
             helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [2]),
                                           helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", F, None),
                               helper.make_tensor_value_info("a", F, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)],
                             ir_version=10)


def test_custom_nodes_in_subgraphs_and_the_main_graph():
    """Placeholders in the main graph and in a branch (shapeless body outputs): the bodies' writer."""
    for check in (False, True):
        assert onnx.ModelProto.FromString(same(_subgraph_holding_custom(), check=check)).graph.node[0].op_type == "Constant"


def test_engine_lowers_custom_nodes_inside_subgraphs():
    out, _ = rewrite_model(_subgraph_holding_custom())
    assert all(n.domain != "custom" for a in out.graph.node[-1].attribute for n in a.g.node)


def test_functions_go_the_object_way():
    model = _bench_model(2)
    fn = helper.make_function("local", "f", ["i"], ["o"], [helper.make_node("Relu", ["i"], ["o"])],
                              [helper.make_opsetid("", 17)])
    model.functions.append(fn)
    steps_aside(model, "functions")


def test_unknown_type_goes_the_object_way():
    """A placeholder input the forward pass cannot type: the engine would run shape inference."""
    nodes = [helper.make_node("Unique", ["x"], ["u"], name="unique"),
             helper.make_node("my_add", ["u", "u"], ["y"], domain="custom", name="add")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [4])],
                              [helper.make_tensor_value_info("y", F, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)],
                              ir_version=10)
    steps_aside(model, "inference")


def test_later_producer_goes_the_object_way():
    """Nodes out of order: the engine's forward pass types the input from a later node."""
    model = _bench_model(3)
    nodes = list(model.graph.node)
    nodes[2], nodes[3] = nodes[3], nodes[2]  # relu0... add1 before relu... (not sorted)
    del model.graph.node[:]
    model.graph.node.extend([nodes[0], nodes[2], nodes[1], *nodes[3:]])
    steps_aside(model, "inference", check=False)  # the checker refuses unsorted graphs anyway


def _asks_a_shape(how: str, seen: list) -> OpRegistry:
    """An op whose decomposition asks what only ONNX shape inference knows: its input's shape
    (``caught``: any exception caught and kept in ``seen``, a Relu where a shape came, else an
    Identity; ``uncaught``: the shape used as it comes), or the type of a tensor it made
    (``like``: constant(like=) of its own Relu's output)."""
    def build(b, inputs, attrs):
        (x,) = inputs
        if how == "like":
            return [b.Mul(x, b.constant(2.0, like=b.Relu(x)))]
        if how == "uncaught":
            return [b.Reshape(x, b.constant(b.shape(x), dtype=TensorProto.INT64))]
        try:
            dims = b.shape(x)
        except Exception as exc:  # noqa: BLE001 - what any op's code may do
            seen.append(exc)
            dims = None
        return [b.Relu(x) if dims else b.Identity(x)]

    op = OpDef(name="asks", doc="", inputs=(Param("x", "T"),), outputs=(Param("y", "T"),), reference=None,
               infer_shapes=lambda shapes, attrs: [shapes[0]], type_constraints={"T": ("tensor(float)",)},
               decompositions=(Decomposition("asks", build, min_opset=7),))
    return OpRegistry([op])


def _asking_model(where: str) -> onnx.ModelProto:
    """x -> Relu -> r -> custom::asks: r's element type from the forward pass, its shape from
    inference only; in the main graph, or in both branches of an If."""
    def chain(tag: str) -> list[onnx.NodeProto]:
        return [helper.make_node("Relu", ["x"], [f"{tag}r"], name=f"{tag}relu"),
                helper.make_node("asks", [f"{tag}r"], [f"{tag}y"], domain="custom", name=f"{tag}asks")]

    x = helper.make_tensor_value_info("x", F, [2, 3])
    if where == "main":
        graph = helper.make_graph(chain(""), "g", [x], [helper.make_tensor_value_info("y", F, [2, 3])])
    else:
        def branch(tag: str) -> onnx.GraphProto:
            return helper.make_graph(chain(tag), tag, [], [helper.make_tensor_value_info(f"{tag}y", F, [2, 3])])

        cond = helper.make_node("Constant", [], ["c"], value=helper.make_tensor("v", TensorProto.BOOL, [], [True]))
        graph = helper.make_graph([cond, helper.make_node("If", ["c"], ["y"], then_branch=branch("t"),
                                                          else_branch=branch("e"))],
                                  "g", [x], [helper.make_tensor_value_info("y", F, [2, 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)],
                             ir_version=10)


@pytest.mark.parametrize("how", ["caught", "uncaught", "like"])
@pytest.mark.parametrize("where", ["main", "branch"])
def test_a_query_only_inference_answers_never_raises_into_the_op(where, how):
    """A decomposition asks the byte writer's type table what only ONNX shape inference
    knows (issue 28): the writer's "step aside" never reaches the op's code (which may catch
    it, or the selection take it for a bug in the op); the query answers None there and the
    writer steps aside once the plan returns: the objects writer's result, whatever the op
    did with that answer."""
    seen: list = []
    registry = _asks_a_shape(how, seen)
    model = _asking_model(where)
    steps_aside(model, "shape inference", registry=registry)
    assert not seen
    out, report = rewrite_bytes(model.SerializeToString(), registry=registry)
    want = {"caught": "Relu", "uncaught": "Reshape", "like": "CastLike"}[how]
    assert want in {n.op_type for g in _graphs(onnx.ModelProto.FromString(out)) for n in g.node}


def _graphs(model: onnx.ModelProto) -> list[onnx.GraphProto]:
    from graphkit.rewrite.graph.walk import graphs

    return list(graphs(model.graph))


def test_type_table_serving_steps_aside_at_its_end():
    """Outside ``serving`` (the writer's own code asks) a query the table cannot answer is
    Unsupported; inside, None, and the block ends in Unsupported naming it, in place of
    whatever the block raised (that followed from the answer)."""
    model = _asking_model("main")
    nodes = model.graph.node
    types, typing = common.forward_types(model, default_registry(), nodes, [n.domain for n in nodes],
                                         [n.op_type for n in nodes], [list(n.input) for n in nodes],
                                         [list(n.output) for n in nodes], set())
    with pytest.raises(Unsupported, match="shape inference"):
        types.shape("r")
    with typing.serving():  # what it answers as the engine's table does
        assert types.elem_type("r") == F and types.shape("x") == [2, 3]
    with pytest.raises(Unsupported, match="shape inference") as stepped:
        with typing.serving():
            assert types.shape("r") is None
            raise ValueError("the op's code, on an answer that was not the engine's")
    assert stepped.value.__suppress_context__
    with pytest.raises(Unsupported, match="shape inference"):
        with typing.serving():
            assert types.shape("r") is None  # returned normally: steps aside all the same


def test_errors_are_the_object_paths():
    """Both writers lower through one plan: an error is the same error, in the same words."""
    from graphkit.errors import UnsupportedOpError

    model = _bench_model(2)
    model.graph.node[0].op_type = "nope"
    with pytest.raises(UnsupportedOpError) as fast:
        lower_bytes(model.SerializeToString(), model, registry=default_registry(), prefer=DEFAULT_PREFERENCE)
    with pytest.raises(UnsupportedOpError) as slow:
        rewrite_model(model)
    assert str(fast.value) == str(slow.value)


# -- the CLI --------------------------------------------------------------------------------

def test_cli_writes_what_rewrite_model_gives(tmp_path):
    model = _rich_model()
    src, dst = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(model, src)
    proc = run_cli("rewrite", src, dst, "--json", check_rc=0)
    assert onnx.load(dst).SerializeToString() == rewrite_model(model)[0].SerializeToString()
    assert '"custom::my_add": 4' in proc.stdout
    run_cli("rewrite", src, src, check_rc=4)  # never over the input
    run_cli("rewrite", src, tmp_path / "dry.onnx", "--dry-run", check_rc=0)
    assert not (tmp_path / "dry.onnx").exists()
    (tmp_path / "bad.onnx").write_bytes(b"\x08\x07garbage")
    proc = run_cli("rewrite", tmp_path / "bad.onnx", tmp_path / "o.onnx", check_rc=3)
    assert "not an ONNX model" in proc.stderr


def test_cli_keep_custom_copies_the_bytes(tmp_path):
    src, dst = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(_bench_model(3), src)
    run_cli("rewrite", src, dst, "--keep-custom", check_rc=0)
    assert dst.read_bytes() == src.read_bytes()


# -- what the engine does wrong, the fast path repeats --------------------------------------

def test_bench_chain_keeps_its_meaning():
    model = _bench_model(3)
    out, _ = rewrite_model(model)
    mul = next(n for n in out.graph.node if n.name == "add1/Mul")
    assert mul.input[0] == "r0"


def test_long_names_and_big_nodes():
    """Lengths over one varint byte: long names, a node over 16 KiB, a big graph."""
    model = _bench_model(6)
    for node in model.graph.node:
        if node.domain == "custom":
            node.name = node.name + "/" + "n" * 300
        else:
            node.doc_string = "d" * 20_000
    out = onnx.ModelProto.FromString(same(model))
    assert max(len(n.name) for n in out.graph.node) > 300


def test_initializer_names_and_weights_in_the_name_probe():
    """An initializer named like a generated name counts; weights that happen to hold
    '<prefix>/' bytes do not."""
    model = _bench_model(3)
    weights = np.frombuffer(b"add1/add2/xx" * 4, np.float32).copy()
    model.graph.initializer.append(numpy_helper.from_array(weights, "w"))
    model.graph.initializer.append(numpy_helper.from_array(np.zeros(2, np.float32), "add1/Mul_out"))
    fast = onnx.ModelProto.FromString(same(model))
    assert "add1/Mul_out_1" in [o for n in fast.graph.node for o in n.output]
    del model.graph.initializer[1]
    data = model.SerializeToString()
    _, _, g0, g1 = next(e for e in wire.entries(data, 0, len(data)) if e[0] == 7)
    starts, ends, others = wire.node_entries(data, g0, g1)
    regions = [(starts[0], ends[-1])] + [(s, e) for f, s, e in others if f != 5]
    assert common.name_seed(data, regions, ["w"], {"add0", "add1", "add2"}, model) is None
    assert b"add1/" in data
    same(model)


def test_non_ascii_names():
    model = _bench_model(5)
    for node in model.graph.node:
        node.name = node.name.replace("add", "sümme")
        for seq in (node.input, node.output):
            for j, name in enumerate(seq):
                if name != "x":
                    seq[j] = name + "·ü"
    model.graph.output[0].name += "·ü"
    onnx.checker.check_model(model)
    fast = onnx.ModelProto.FromString(same(model))
    assert "sümme3/Mul" in [n.name for n in fast.graph.node]
    same(model, lowering=Lowering.PYTHON)


def test_big_model_check_on_bytes(monkeypatch):
    """Over FULL_CHECK_NODES the checker runs on the output bytes; its verdicts are the engine's."""
    from graphkit.rewrite import engine

    monkeypatch.setattr(engine, "FULL_CHECK_NODES", 0)
    model = _bench_model(30)
    same(model)
    model.graph.node[1].attribute.append(helper.make_attribute("bogus", 1))  # a Relu the checker refuses
    with pytest.raises(ValidationError) as slow:
        rewrite_model(model)
    with pytest.raises(ValidationError) as fast:
        lower_bytes(model.SerializeToString(), model, registry=default_registry(), prefer=DEFAULT_PREFERENCE)
    assert str(fast.value) == str(slow.value)


def test_external_data(tmp_path, monkeypatch):
    from graphkit.rewrite import engine

    model = _rich_model()
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.full((2, 3), 0.5, np.float32), "w"))
    onnx.save(model, tmp_path / "m.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
              location="m.data", size_threshold=0)
    monkeypatch.chdir(tmp_path)
    loaded = onnx.load(tmp_path / "m.onnx", load_external_data=False)
    data = (tmp_path / "m.onnx").read_bytes()
    assert _request(data, loaded).has_external_data()
    same(loaded, data=data)
    monkeypatch.setattr(engine, "FULL_CHECK_NODES", 0)
    same(loaded, data=data)
    assert not _request(_bench_model(2).SerializeToString(), _bench_model(2)).has_external_data()


def test_bound_nodes_sharing_a_name():
    model = _bench_model(6)
    for node in model.graph.node:
        if node.domain == "custom":
            node.name = "same"
    same(model, lowering=Lowering.NATIVE)
    same(model, lowering=Lowering.PYTHON)


def test_templates_with_constants_first_and_typed_constants():
    def swapped(b, inputs, attrs):
        a, c = inputs
        return [b.Add(c, b.Mul(b.constant(3, like=a), a))]

    op = OpDef(name="swapped", doc="3a + c", inputs=(Param("a", "T"), Param("c", "T")), outputs=(Param("y", "T"),),
               reference=None, infer_shapes=lambda shapes, attrs: [shapes[0]],
               type_constraints={"T": ("tensor(float)", "tensor(double)")},
               decompositions=(Decomposition("mul_add", swapped, min_opset=7),))
    registry = default_registry().with_ops(op)
    nodes = [helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.ones(3, np.float64))),
             helper.make_node("ConstantOfShape", ["shape"], ["z"]),
             helper.make_node("Cast", ["z"], ["zd"], to=TensorProto.DOUBLE)]
    prev = "k"
    for i in range(5):
        nodes.append(helper.make_node("swapped", [prev, "zd" if i % 2 else "k"], [f"s{i}"], domain="custom",
                                      name=f"sw{i}"))
        nodes.append(helper.make_node("Neg", [f"s{i}"], [f"n{i}"]))
        prev = f"n{i}"
    nodes.append(helper.make_node("swapped", ["z", "z"], ["f"], domain="custom", name="float"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("shape", TensorProto.INT64, [1])],
                              [helper.make_tensor_value_info(prev, TensorProto.DOUBLE, None),
                               helper.make_tensor_value_info("f", F, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)],
                              ir_version=10)
    same(model, registry=registry)


def test_sparse_initializer_names_are_searched():
    model = _bench_model(3)
    values = numpy_helper.from_array(np.ones(1, np.float32), "add1/Mul_out")
    indices = numpy_helper.from_array(np.zeros(1, np.int64), "idx")
    model.graph.sparse_initializer.append(helper.make_sparse_tensor(values, indices, [4]))
    same(model, check=False)  # (the engine's ModelIndex does not see sparse initializer names either)


def test_check_infers_up_to_where_the_checked_names_are_made(monkeypatch):
    """The per-replacement check asks for shapes of undeclared inputs (the engine runs ONNX
    inference over the whole rewritten model then): inference over the nodes up to where
    those names are made gives them the same types."""
    real = main_graph._inference_prefix
    cuts = []

    def spy(whole, names):
        cut = real(onnx.ModelProto.FromString(whole.SerializeToString()), names)
        typed = [{vi.name: vi.type for vi in (*m.graph.input, *m.graph.output, *m.graph.value_info)}
                 for m in (onnx.shape_inference.infer_shapes(x, check_type=False, strict_mode=False)
                           for x in (whole, cut))]
        assert all(typed[0].get(n) == typed[1].get(n) for n in names)
        cuts.append((len(cut.graph.node), len(whole.graph.node)))
        return cut

    monkeypatch.setattr(main_graph, "_inference_prefix", spy)
    same(_bench_model(40))
    same(_bench_model(40), lowering=Lowering.NATIVE)
    assert cuts and all(n < 12 < total for n, total in cuts)


def _scoped_model(pairs: int, taken: str | None = None) -> onnx.ModelProto:
    """Names as torch.onnx.export writes them: '/scope/op' nodes, '/scope/op_output_0' tensors."""
    nodes, prev = [], "x"
    for i in range(pairs):
        nodes.append(helper.make_node("my_add", [prev, "x"], [f"/layers.{i}/my_add_output_0"], domain="custom",
                                      name=f"/layers.{i}/my_add"))
        out = taken if taken and i == 1 else f"/layers.{i}/Relu_output_0"
        nodes.append(helper.make_node("Relu", [nodes[-1].output[0]], [out], name=f"/layers.{i}/Relu"))
        prev = out
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [1, 4])],
                              [helper.make_tensor_value_info(prev, F, [1, 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)],
                             ir_version=10)


def test_scoped_names():
    same(_scoped_model(30))
    fast = onnx.ModelProto.FromString(same(_scoped_model(30, taken="/layers.3/my_add/Mul_out")))
    assert "/layers.3/my_add/Mul_out_1" in [o for n in fast.graph.node for o in n.output]


def test_cli_report_that_cannot_be_made_writes_nothing(tmp_path):
    """A node domain that is not UTF-8 (protobuf hands it over as bytes) breaks the JSON
    report: that happens before the output is written."""
    data = my_add_model().SerializeToString()
    assert data.count(b":\x06custom") == 1  # the node's domain field
    src, dst = tmp_path / "in.onnx", tmp_path / "out.onnx"
    src.write_bytes(data.replace(b":\x06custom", b":\x06\xe3ustom"))
    proc = run_cli("rewrite", src, dst, "--json", "--debug", check_rc=3)
    assert "not valid UTF-8" in proc.stderr and not dst.exists(), proc.stderr


def test_rewrite_file_refused_before_the_writers_keeps_no_model(tmp_path, monkeypatch):
    """What the writers learn of the bytes (external data, canonical or not) is the request's,
    remembered nowhere else: a rewrite refused before any writer runs (a --target-opset out of
    range) leaves nothing holding the parsed model after the error."""
    import graphkit.modelio as modelio
    from graphkit.errors import UsageError
    from graphkit.rewrite import rewrite_file

    parsed = []
    parse = modelio.parse_model_bytes
    monkeypatch.setattr(modelio, "parse_model_bytes", lambda *a: parsed.append(parse(*a)) or parsed[-1])
    src = tmp_path / "in.onnx"
    onnx.save(_scaling("if_bodies", 3), src)
    with pytest.raises(UsageError, match="--target-opset 2") as refused:
        rewrite_file(src, None, target_opset=2)
    del refused  # its traceback's frames hold the calls' arguments
    refs = sys.getrefcount(parsed[0])  # (outside the assert: pytest's rewriting would hold it once more)
    assert len(parsed) == 1 and refs == 2  # the list's, the call's argument


def test_a_request_remembers_what_it_learns_of_the_bytes(monkeypatch):
    """has_external_data scans the bytes (and may ask canonical(): one ByteSize) once per request."""
    model = _scaling("if_bodies", 3)
    data = model.SerializeToString() + b"\xf0"  # a padded key's first byte: canonical() is asked
    request = _request(data, model)
    sizes = []
    size = onnx.ModelProto.ByteSize
    monkeypatch.setattr(onnx.ModelProto, "ByteSize", lambda m: sizes.append(1) or size(m), raising=False)
    assert request.has_external_data() is False and request.has_external_data() is False
    assert request.canonical() is False and len(sizes) <= 1


def test_rewrite_file_is_the_clis_one_entry_point(tmp_path, monkeypatch):
    """The CLI goes through rewrite_file; its JSON report names the writer and the passes run."""
    import json

    from graphkit.rewrite import rewrite_file

    src = tmp_path / "in.onnx"
    onnx.save(_bench_model(20), src)
    result = rewrite_file(src, tmp_path / "api.onnx")
    report, sizes = result.report, result.sizes
    assert result.output == (tmp_path / "api.onnx").read_bytes()
    assert report.writer == "bytes" and [p for p, _ in report.passes] == ["lower", "fix-imports"]
    assert sizes["bytes_after"] == (tmp_path / "api.onnx").stat().st_size
    report = rewrite_file(src, None, target_opset=18).report  # a dry run; imports only: the byte writer
    assert report.writer == "bytes" and "--target-opset: imports only" in report.writer_reason
    assert [p for p, _ in report.passes] == ["convert-opset", "lower", "fix-imports"]
    report = rewrite_file(src, None, target_opset=18, as_functions=True).report  # the objects writer
    assert report.writer == "objects" and "--as-functions" in report.writer_reason
    proc = run_cli("rewrite", src, tmp_path / "cli.onnx", "--json")
    assert json.loads(proc.stdout)["writer"]["name"] == "bytes"
    assert (tmp_path / "cli.onnx").read_bytes() == (tmp_path / "api.onnx").read_bytes()


def _unnamed(op: str, n: int, fan_out: bool, mixed: bool = False) -> onnx.ModelProto:
    """n unnamed custom nodes chained (or all reading x); ``mixed``: every third one of
    another kind (aliasing x, x), so one prefix has two kinds."""
    nodes, prev = [], "x"
    for i in range(n):
        src = "x" if fan_out else prev
        args = [src, src] if op == "my_add" and (not mixed or i % 3 == 0) else [src, "x"][:2 if op == "my_add" else 1]
        nodes.append(helper.make_node(op, args, [f"y{i}"], domain="custom"))
        prev = f"y{i}"
    outs = [f"y{i}" for i in range(n)] if fan_out else [prev]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [3])],
                              [helper.make_tensor_value_info(o, F, [3]) for o in outs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)],
                             ir_version=10)


@pytest.mark.parametrize("op", ["my_add", "asinh"])
@pytest.mark.parametrize("fan_out", [False, True], ids=["chain", "fan-out"])
@pytest.mark.parametrize("mixed", [False, True], ids=["one-kind", "two-kinds"])
def test_unnamed_nodes_repeated_by_kind(op, fan_out, mixed):
    """Unnamed placeholders share one name prefix: the byte writer numbers their names as the
    name generator does (asinh's decomposition has names the generator numbers itself)."""
    same(_unnamed(op, 25, fan_out, mixed and op == "my_add"))


def test_if_bodies_share_a_template_with_constants_of_their_own():
    """Thousands of If bodies: each body gets the decomposition adopted from the first, with
    its own constants (a body cannot see a sibling's); numerics as each built on its own."""
    from graphkit.runtime import open_session

    cond = helper.make_node("Constant", [], ["c"], value=helper.make_tensor("v", TensorProto.BOOL, [], [True]))
    nodes, prev = [cond], "x"
    for i in range(6):
        body = helper.make_graph([helper.make_node("asinh", [prev], [f"t{i}"], domain="custom")], f"b{i}", [],
                                 [helper.make_tensor_value_info(f"t{i}", F, [3])])
        nodes.append(helper.make_node("If", ["c"], [f"o{i}"], then_branch=body, else_branch=body))
        prev = f"o{i}"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [3])],
                              [helper.make_tensor_value_info(prev, F, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)],
                              ir_version=10)
    out, report = rewrite_model(model)
    assert report.actions[("custom::asinh", next(h for _, h in report.actions))] == 12
    for node in out.graph.node[1:]:
        for attr in node.attribute:
            made = {o for n in attr.g.node for o in n.output}
            assert all(i in made or i.startswith(("x", "o")) for n in attr.g.node for i in n.input)
    x = np.array([-2.0, 0.5, 3.0], np.float32)
    got = open_session(out).run({"x": x})[prev]
    np.testing.assert_allclose(got, np.arcsinh(np.arcsinh(np.arcsinh(np.arcsinh(np.arcsinh(np.arcsinh(x)))))),
                               rtol=1e-5, atol=1e-6)


def test_unnamed_nodes_whose_template_the_generator_numbers():
    """cube(x) = x*x*x names its nodes 'cube/Mul' and 'cube/Mul_1': repeats of one prefix then
    take the generator's numbering ('cube/Mul_1_1', ...), which the byte writer asks it for."""
    op = OpDef(name="cube", doc="x*x*x", inputs=(Param("x", "T"),), outputs=(Param("y", "T"),),
               type_constraints={"T": ("tensor(float)",)}, reference=None, infer_shapes=lambda s, a: [s[0]],
               decompositions=(Decomposition("mul", lambda b, i, a: [b.Mul(b.Mul(i[0], i[0]), i[0])],
                                             min_opset=7),))
    registry = default_registry().with_ops(OpPackage("test_cube", (op,)))
    for fan_out in (False, True):
        nodes, prev = [], "x"
        for i in range(12):
            nodes.append(helper.make_node("cube", ["x" if fan_out else prev], [f"y{i}"], domain="custom"))
            prev = f"y{i}"
        graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [3])],
                                  [helper.make_tensor_value_info(prev, F, [3])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                        helper.make_opsetid("custom", 1)], ir_version=10)
        names = [n.name for n in onnx.ModelProto.FromString(same(model, registry=registry)).graph.node]
        assert "cube/Mul_1_1" in names and len(set(names)) == len(names)


# -- the check by parts -------------------------------------------------------------------

def _by_parts(model: onnx.ModelProto, monkeypatch, registry: OpRegistry | None = None, **options):
    """lower_bytes over FULL_CHECK_NODES: (output, report, the whole-output checks run)."""
    from graphkit.rewrite import engine

    monkeypatch.setattr(engine, "FULL_CHECK_NODES", 0)
    whole = []
    check_bytes = common._check_bytes
    monkeypatch.setattr(common, "_check_bytes", lambda *a: (whole.append(a), check_bytes(*a)))
    out, report = lower_bytes(model.SerializeToString(), model, registry=registry or default_registry(),
                              prefer=DEFAULT_PREFERENCE, **options)
    return out, report, whole


def test_input_checked_before_the_lowering_lists(monkeypatch):
    """Checked by parts, the checker runs on the input before the nodes' names are read
    (its parse of the model and the lowering's lists are never held at once) and once only."""
    from graphkit.rewrite import engine

    monkeypatch.setattr(engine, "FULL_CHECK_NODES", 0)
    calls = []
    for name in ("input_refused", "node_names"):  # where the writer calls it, and where its helpers do
        fn = getattr(common, name)
        spy = (lambda *a, _fn=fn, _name=name: (calls.append(_name), _fn(*a))[1])
        monkeypatch.setattr(main_graph, name, spy)
        monkeypatch.setattr(common, name, spy)
    model = _bench_model(30)
    _, report = lower_bytes(model.SerializeToString(), model, registry=default_registry(), prefer=DEFAULT_PREFERENCE)
    assert report.writer_reason.endswith(common.CHECKED_BY_PARTS)
    assert calls == ["input_refused", "node_names", "input_refused"]  # the input, then the replacements
    calls.clear()
    lower_bytes(model.SerializeToString(), model, registry=default_registry(), prefer=DEFAULT_PREFERENCE, check=False)
    assert calls == ["node_names"]


@pytest.mark.parametrize("model", [_bench_model(7), _unnamed("my_add", 7, True), _unnamed("asinh", 7, False),
                                   _unnamed("my_add", 8, False, mixed=True)],
                         ids=["named", "fan-out", "asinh-chain", "two-kinds"])
def test_repeats_written_a_block_at_a_time(model, monkeypatch):
    """A kind's repeats are written a block at a time; the blocks' seams change nothing."""
    monkeypatch.setattr(main_graph, "_EMIT_BLOCK", 2)
    same(model)


def test_pieces_write_what_join_makes(tmp_path):
    """The output written piece by piece, a few joined at a time, is the joined output."""
    data = bytes(range(256)) * 3
    pieces = Pieces([memoryview(data)[:5], b"", data[5:300], memoryview(data)[300:], b"tail"])
    assert len(pieces) == len(data) + 4 and pieces.join() == data + b"tail"
    with open(tmp_path / "out", "wb") as fh:
        pieces.write(fh, block=2)
    assert (tmp_path / "out").read_bytes() == pieces.join()


def test_freed_memory_released_where_glibc_can():
    """On Linux with glibc, the checker's freed memory is handed back (malloc_trim is found)."""
    import platform
    import sys

    from graphkit.rewrite import _memory

    _memory.release_freed_memory()
    if sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc":
        assert _memory._trim[0] is not None


@pytest.mark.parametrize("platform_name, libc", [("darwin", None), ("linux", "musl")])
def test_freed_memory_release_does_nothing_without_malloc_trim(platform_name, libc, monkeypatch):
    """Elsewhere than glibc (macOS, musl: no malloc_trim) the release is a silent no-op."""
    import ctypes
    import sys

    from graphkit.rewrite import _memory

    class NoTrim:  # a C library without malloc_trim
        def __init__(self, name):
            pass

    monkeypatch.setattr(_memory, "_trim", [])
    monkeypatch.setattr(sys, "platform", platform_name)
    if libc:
        monkeypatch.setattr(ctypes, "CDLL", NoTrim)
    _memory.release_freed_memory()
    _memory.release_freed_memory()
    assert _memory._trim == [None]


@pytest.mark.parametrize("model", [_bench_model(30), _unnamed("my_add", 30, True), _unnamed("asinh", 30, False),
                                   _unnamed("my_add", 30, False, mixed=True)],
                         ids=["named", "fan-out", "asinh-chain", "two-kinds"])
def test_big_output_checked_by_parts(model, monkeypatch):
    """Over FULL_CHECK_NODES a valid output is checked by parts, never whole; the report says so."""
    out, report, whole = _by_parts(model, monkeypatch)
    assert not whole and report.writer_reason.endswith(common.CHECKED_BY_PARTS)
    onnx.checker.check_model(out)  # what the parts stood for


def test_invalid_input_node_found_by_parts_reported_by_the_whole_check(monkeypatch):
    """A kept node the checker refuses fails the input's part; the whole output is then
    checked, and the error is its own (test_big_model_check_on_bytes: the engine's words)."""
    model = _bench_model(30)
    model.graph.node[5].attribute.append(helper.make_attribute("bogus", 1))
    with pytest.raises(ValidationError, match="bogus"):
        _by_parts(model, monkeypatch)


def _part(nodes, inputs, outputs) -> tuple:
    return (b"".join(wire.entry(n.SerializeToString()) for n in nodes), tuple(inputs), tuple(outputs))


def test_check_parts_refuses_what_the_checker_would():
    """Each condition of the argument, and each part, on its own."""
    model = _bench_model(2)  # x -> add0 (my_add) -> relu0 -> add1 -> relu1
    data, registry = model.SerializeToString(), default_registry()
    header = onnx.ModelProto(ir_version=10, opset_import=[helper.make_opsetid("", 17)]).SerializeToString()
    add0, add1 = [n for n in model.graph.node if n.domain == "custom"]

    def parts(first=None, second=None, *, data=data, header=header, used=frozenset({""})):
        mul = helper.make_node("Mul", [add0.input[0], add0.input[1]], [add0.output[0]], name="add0/Mul")
        first = first or [_part([mul], add0.input, add0.output)]
        second = second or [_part([helper.make_node("Mul", list(add1.input), list(add1.output))], add1.input,
                                  add1.output)]
        return common.check_parts(data, model, header, first + second, set(used), registry)

    assert parts() is None
    bad_attr = helper.make_node("Mul", list(add0.input), list(add0.output), bogus=1)
    assert parts([_part([bad_attr], add0.input, add0.output)]) == "the checker refuses the replacements"
    stranger = helper.make_node("Mul", [add0.input[0], "nowhere"], list(add0.output))
    assert "reads 'nowhere'" in parts([_part([stranger], add0.input, add0.output)])
    elsewhere = helper.make_node("Mul", list(add0.input), ["other"])
    assert "does not make" in parts([_part([elsewhere], add0.input, add0.output)])
    relu = next(n for n in model.graph.node if n.op_type == "Relu")
    relu.attribute.append(helper.make_attribute("bogus", 1))
    assert parts(data=model.SerializeToString()) == "the checker refuses the input"
    newer = onnx.ModelProto(ir_version=10, opset_import=[helper.make_opsetid("", 18)]).SerializeToString()
    assert parts(header=newer) == "an opset import changed"
    assert parts(used={"", "elsewhere"}) == "an opset import changed"
    holder = helper.make_node("If", ["x"], list(add0.output), then_branch=helper.make_graph([], "t", [], []),
                              else_branch=helper.make_graph([], "e", [], []))
    assert parts([_part([holder], add0.input, add0.output)]) == "a replacement with a subgraph"


def test_representatives_cover_each_pattern_of_empty_names():
    """One repeat per pattern of empty names besides every node the plan lowered."""
    class Kind:
        members = [1, 2, 3, 4, 5]

    values = [("a", "b", "y0"), ("a", "b", "y1"), ("a", "", "y2"), ("", "b", "y3"), ("a", "", "y4"), ("c", "d", "y5")]
    assert main_graph._representatives([0], {"k": Kind, "none": None}, values) == [0, 1, 2, 3]


def _field(tag: bytes, body: bytes) -> bytes:
    return tag + wire.encode_varint(len(body)) + body


# A varint field's key and value as protobuf writes them, then padded with continuation bytes.
PADDINGS = [(b"", b""), (b"\x80\x00", b""), (b"", b"\x80\x00"), (b"\x80\x80\x00", b"\x80\x00")]


def _padded(key: int, value: int, key_pad: bytes, value_pad: bytes) -> bytes:
    def enc(n: int, pad: bytes) -> bytes:
        raw = bytearray(wire.encode_varint(n))
        if pad:
            raw[-1] |= 0x80  # the last byte continues into the padding, which adds nothing
        return bytes(raw) + pad
    return enc(key, key_pad) + enc(value, value_pad)


@pytest.mark.parametrize("key_pad, value_pad", PADDINGS)
def test_probes_find_padded_varints(key_pad, value_pad):
    """The byte probes for external data and subgraphs find every encoding of their field,
    canonical or padded (a writer may encode a varint longer than it needs)."""
    tensor = onnx.TensorProto(name="w", data_type=F, dims=[1])
    tensor.external_data.add(key="location", value="w.bin")
    tensor_body = tensor.SerializeToString() + _padded(14 << 3, onnx.TensorProto.EXTERNAL, key_pad, value_pad)
    attr_body = (onnx.AttributeProto(name="then_branch", g=helper.make_graph([], "t", [], [])).SerializeToString()
                 + _padded(20 << 3, onnx.AttributeProto.GRAPH, key_pad, value_pad))
    node_body = helper.make_node("Identity", ["c"], ["o"]).SerializeToString() + _field(b"\x2a", attr_body)
    graph_body = _field(b"\x0a", node_body) + _field(b"\x2a", tensor_body) + _field(b"\x12", b"g")
    data = b"\x08\x0a" + _field(b"\x3a", graph_body)
    model = onnx.ModelProto.FromString(data)
    assert model.graph.initializer[0].data_location == onnx.TensorProto.EXTERNAL
    assert model.graph.node[0].attribute[0].type == onnx.AttributeProto.GRAPH
    assert _request(data, model).has_external_data()
    _, _, g0, g1 = wire.entries(data, 0, len(data))[1]
    _, _, holders = main_graph._subgraph_info(list(model.graph.node), data, g0, g1,
                                            lambda: len(data) == model.ByteSize())
    assert holders == {0}


@pytest.mark.parametrize("size", [60, 120, 130, 300])
@pytest.mark.parametrize("fan_out", [False, True], ids=["chain", "fan-out"])
def test_unnamed_repeats_with_long_value_names(size, fan_out, monkeypatch):
    """Repeats written a column at a time: a node's length summed from its names' (over 127
    bytes with one name of 60), and the per-node writer where a name is 128 bytes or more."""
    model = _unnamed("my_add", 12, fan_out)
    for node in model.graph.node:
        node.output[0] = node.output[0] + "v" * size
        node.input[:] = [i if i == "x" else i + "v" * size for i in node.input]
    for vi in model.graph.output:
        vi.name += "v" * size
    calls = []
    emit_all = common.LoweringTemplateWriter.emit_all
    monkeypatch.setattr(common.LoweringTemplateWriter, "emit_all", lambda *a: calls.append(1) or emit_all(*a))
    same(model)
    assert bool(calls) == (size > 125)  # names y<i> + size "v"s


def test_forward_pass_waits_when_placeholders_read_declared_names():
    """Fan-out from a graph input: the forward pass waits until an undeclared name is asked
    for, and then gives the types it gives when run at once."""
    model = _unnamed("my_add", 6, True)
    del model.graph.output[:5]  # y0 ... y4 undeclared
    nodes = model.graph.node
    fields = ([n.domain for n in nodes], [n.op_type for n in nodes], [list(n.input) for n in nodes],
              [list(n.output) for n in nodes])

    def table(read):
        return common.forward_types(model, default_registry(), nodes, *fields, set(), read=read)[0]

    waiting, at_once = table(["x"]), table(["x", "y0"])
    assert waiting.waiting and not at_once.waiting
    assert waiting.elem_type("x") == F and waiting.waiting
    assert waiting.elem_type("y3") == at_once.elem_type("y3") == F and not waiting.waiting


# -- --target-opset: the byte writer where the conversion moves only the imports ------------

def _opset(model: onnx.ModelProto) -> int:
    return next(i.version for i in model.opset_import if i.domain in ("", "ai.onnx"))


@pytest.mark.parametrize("target", [17, 18, 20, 16], ids=["same", "17-18", "17-20", "17-16"])
@pytest.mark.parametrize("shape", ["named", "unnamed", "fan-out"])
def test_target_opset_imports_only(target, shape):
    """my_add + Relu (no standard op has a new version from 16 to 20): the byte writer lowers at
    the target opset and writes the new import; the report says "imports only" as the objects
    writer's convert-opset pass does."""
    model = {"named": lambda: _bench_model(20), "unnamed": lambda: _unnamed("my_add", 20, False),
             "fan-out": lambda: _unnamed("asinh", 20, True)}[shape]()
    before = _opset(model)
    out = onnx.ModelProto.FromString(same(model, target_opset=target))
    assert _opset(out) == target
    report = lower_bytes(model.SerializeToString(), model, registry=default_registry(),
                         prefer=DEFAULT_PREFERENCE, target_opset=target)[1]
    if target == before:
        assert report.conversions == [] and "convert-opset" not in dict(report.passes)
    else:
        assert report.conversions == [(before, target, "imports only")]
        assert report.passes[0] == ("convert-opset", f"ai.onnx opset {before} -> {target}")
        assert "--target-opset: imports only" in report.writer_reason


def test_target_opset_down_from_18():
    same(my_add_model(TensorProto.FLOAT, 18), target_opset=17)
    same(_unnamed("asinh", 10, False), target_opset=21)


def test_target_opset_checked_by_parts(monkeypatch):
    """An imports-only conversion keeps every kept node's meaning: the parts still decide."""
    out, report, whole = _by_parts(_unnamed("my_add", 30, False), monkeypatch, target_opset=18)
    assert not whole and report.writer_reason.endswith(common.CHECKED_BY_PARTS)
    onnx.checker.check_model(out)


# -- --target-opset that converts nodes: graphkit's adapters, spliced like the replacements ---

def _converting(pairs: int, *, named: bool = False, opset: int = 13, fan_out: bool = False) -> onnx.ModelProto:
    """my_add, then nodes whose ops graphkit's adapters change going up to 18, ``pairs`` times
    (every value [1, 1]):

        a = my_add(prev, prev)          (fan_out: my_add(x, x))
        ReduceMean(a, axes=[0])         axes an input at 18: a constant [0]
        ReduceMax(.., axes=[0])         the same constant, named after the first ReduceMean
        ReduceMean(.., axes=[-2])       another constant
        ReduceMean(.., keepdims=1)      no axes: the node stays as it was
        Concat(.., ..) -> Split(axis=1) two outputs: Split-18's num_outputs=2 added
        Squeeze(Unsqueeze(a, axes=[0]), axes=[0])  (from opset 11: axes an input at 13)
        my_add(split outputs) -> prev
    """
    def name(n: str) -> str:
        return n if named else ""

    nodes, prev = [], "x"
    for i in range(pairs):
        src = "x" if fan_out else prev
        nodes += [helper.make_node("my_add", [src, src], [f"a{i}"], domain="custom", name=name(f"add{i}")),
                  helper.make_node("ReduceMean", [f"a{i}"], [f"r{i}"], axes=[0], keepdims=1, name=name(f"mean{i}")),
                  helper.make_node("ReduceMax", [f"r{i}"], [f"m{i}"], axes=[0], keepdims=1, name=name(f"max{i}")),
                  helper.make_node("ReduceMean", [f"m{i}"], [f"q{i}"], axes=[-2], keepdims=1),
                  helper.make_node("ReduceMean", [f"q{i}"], [f"k{i}"], keepdims=1, name=name(f"all{i}")),
                  helper.make_node("Concat", [f"k{i}", f"k{i}"], [f"c{i}"], axis=1),
                  helper.make_node("Split", [f"c{i}"], [f"s{i}a", f"s{i}b"], axis=1, name=name(f"split{i}"))]
        last = f"s{i}a"
        if opset < 13:
            nodes += [helper.make_node("Unsqueeze", [last], [f"u{i}"], axes=[0]),
                      helper.make_node("Squeeze", [f"u{i}"], [f"v{i}"], axes=[0])]
            last = f"v{i}"
        nodes.append(helper.make_node("my_add", [last, f"s{i}b"], [f"p{i}"], domain="custom"))
        prev = f"p{i}"
    outs = [f"p{i}" for i in range(pairs)] if fan_out else [prev]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [1, 1])],
                              [helper.make_tensor_value_info(o, F, [1, 1]) for o in outs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("custom", 1)],
                             ir_version=10)


def _converted_by_bytes(model: onnx.ModelProto, target: int = 18, **options) -> onnx.ModelProto:
    """same() on a --target-opset rewrite whose conversion changes nodes: the byte writer
    converted them (the report says so), the bytes are the objects writer's."""
    out = same(model, target_opset=target, **options)
    data = options.pop("data", None)
    report = rewrite_bytes(model.SerializeToString() if data is None else data, target_opset=target, **options)[1]
    assert report.conversions == [(_opset(model), target, "adapters")], report.conversions
    assert "graphkit's adapters converted" in report.writer_reason, report.writer_reason
    if data is None:
        assert out == rewrite_model(model, target_opset=target, **options)[0].SerializeToString()
    return onnx.ModelProto.FromString(out)


@pytest.mark.parametrize("opset", [13, 11])
@pytest.mark.parametrize("shape", ["named", "unnamed", "fan-out"])
def test_target_opset_converting_byte_identical(shape, opset):
    """Placeholders and converted nodes mixed: kinds sharing a constant, a node left as it
    was, Split-18's num_outputs, Squeeze/Unsqueeze from 11; the constants after the graph's
    initializers, named as the adapters name them."""
    model = _converting(5, named=shape == "named", fan_out=shape == "fan-out", opset=opset)
    model.graph.initializer.append(numpy_helper.from_array(np.zeros(1, np.float32), "unused"))
    out = _converted_by_bytes(model)
    assert [t.name for t in out.graph.initializer][0] == "unused"
    axes = {t.name: list(t.int64_data) for t in out.graph.initializer[1:]}
    base = "mean0" if shape == "named" else "r0"
    assert axes[f"{base}_axes"] == [0] and [-2] in axes.values()
    assert all(n.op_type != "Split" or any(a.name == "num_outputs" for a in n.attribute) for n in out.graph.node)


def test_target_opset_converting_no_node_changes():
    """Relu from 13 to 14 only takes more types: the adapters change no node, the report says
    "adapters" as the objects writer's, the byte writer writes the imports."""
    model = my_add_model(TensorProto.FLOAT, 13)
    same(model, target_opset=14)
    report = rewrite_bytes(model.SerializeToString(), target_opset=14)[1]
    assert report.conversions == [(13, 14, "adapters")] and "changed no node" in report.writer_reason


def test_target_opset_converting_numerics():
    from graphkit.runtime import open_session

    out = _converted_by_bytes(_converting(2, opset=11))
    x = np.array([[-1.5]], np.float32)
    # my_add(a, b) = 2a + b; each reduction of a [1, 1] keeps it; the Split halves are equal
    got = open_session(out).run({"x": x})["p1"]
    np.testing.assert_allclose(got, 81 * x, rtol=1e-6)


def test_target_opset_converting_names_taken():
    """The constant's first name is a name of the model (an initializer's); another occurs
    in the bytes but names nothing (a doc string): the full name index decides, as the
    adapters' generator does. A name with '<prefix>/' in it makes the lowering's generator
    start from every name, the constants' included."""
    model = _converting(3)
    model.graph.initializer.append(numpy_helper.from_array(np.zeros(1, np.float32), "r0_axes"))
    model.graph.node[3].doc_string = "reads q0_axes"
    model.graph.node[4].output[0] = model.graph.node[5].input[0] = model.graph.node[5].input[1] = "my_add/k0"
    out = _converted_by_bytes(model)
    names = [t.name for t in out.graph.initializer]
    assert names[:2] == ["r0_axes", "r0_axes_1"] and "m0_axes" not in names and "q0_axes" in names


def test_target_opset_converting_non_canonical_nodes_empty_inputs_and_non_ascii_names():
    """Entries written in another field order, an empty input, names outside ASCII: each such
    node is converted on its own, by the same adapters."""
    model = _converting(4, named=True)
    model.graph.node[6].input.append("")  # Split's sizes left out
    data = model.SerializeToString()
    _, _, g0, g1 = next(e for e in wire.entries(data, 0, len(data)) if e[0] == 7)
    starts, ends, others = wire.node_entries(data, g0, g1)
    pieces, at = [], g0
    for k, (start, end) in enumerate(zip(starts, ends)):
        body_at = wire.entries(data, start, end)[0][2]
        fields = wire.entries(data, body_at, end)
        if k in (1, 8):  # a ReduceMean of the first kind, and one of its repeats: op_type first
            fields.sort(key=lambda f: f[0] != 4)
        body = b"".join(data[s:e] for _, s, _, e in fields)
        pieces += [data[at:start], _field(b"\x0a", body)]
        at = end
    shuffled = data[:g0 - len(wire.encode_varint(g1 - g0))] + wire.encode_varint(g1 - g0) + \
        b"".join(pieces) + data[at:]
    assert onnx.ModelProto.FromString(shuffled).SerializeToString() == data
    _converted_by_bytes(model, data=shuffled)
    for node in model.graph.node:
        node.name += "·ü" if node.name else ""
    _converted_by_bytes(model)


def test_target_opset_converting_checked_by_parts(monkeypatch):
    """A converted node of each kind is a part: the parts still decide."""
    out, report, whole = _by_parts(_converting(6), monkeypatch, target_opset=18)
    assert not whole and report.writer_reason.endswith(common.CHECKED_BY_PARTS), report.writer_reason
    onnx.checker.check_model(out)


@pytest.mark.parametrize("by_parts", [False, True], ids=["whole", "by-parts"])
@pytest.mark.parametrize("shape", ["main", "bodies"])
def test_target_opset_converting_invalid_output_reported_alike(shape, by_parts, monkeypatch):
    """A kept node the checker refuses (an attribute its op lacks): both writers report it in
    the same words, the conversion named, its hint given."""
    from graphkit.rewrite import engine

    if by_parts:
        monkeypatch.setattr(engine, "FULL_CHECK_NODES", 0)
    model = _converting(3) if shape == "main" else _reducing_nested(False)
    next(n for n in model.graph.node if n.op_type in ("Concat", "Add")).attribute.append(
        helper.make_attribute("bogus", 1))
    with pytest.raises(ValidationError) as slow:
        rewrite_model(model, target_opset=18)
    with pytest.raises(ValidationError) as fast:
        lower_bytes(model.SerializeToString(), model, registry=default_registry(), prefer=DEFAULT_PREFERENCE,
                    target_opset=18)
    assert str(fast.value) == str(slow.value) and "the ai.onnx opset conversion" in str(fast.value)
    assert fast.value.hint == slow.value.hint


def _reduce_in_a_body() -> onnx.ModelProto:
    """_converting(2), then an If whose branches hold a ReduceMean each (and no placeholder)."""
    model = _converting(2)

    def body(tag: str) -> onnx.GraphProto:
        return helper.make_graph([helper.make_node("ReduceMean", ["p1"], [tag], axes=[0], keepdims=1)], tag, [],
                                 [helper.make_tensor_value_info(tag, F, [1, 1])])

    model.graph.node.extend([helper.make_node("Constant", [], ["c"],
                                              value=helper.make_tensor("v", TensorProto.BOOL, [], [True])),
                             helper.make_node("If", ["c"], ["o"], then_branch=body("bt"), else_branch=body("be"))])
    model.graph.output[0].name = "o"
    return model


def _reduce_18() -> onnx.ModelProto:
    model = _unnamed("my_add", 3, False)
    model.opset_import[0].version = 18
    model.graph.initializer.append(numpy_helper.from_array(np.array([0], np.int64), "axes"))
    model.graph.node.append(helper.make_node("ReduceMean", ["y2", "axes"], ["m"], keepdims=1))
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("m", F, [1]))
    return model


def _softmax_11() -> onnx.ModelProto:
    model = _unnamed("my_add", 3, False)
    model.opset_import[0].version = 11
    model.graph.node.append(helper.make_node("Softmax", ["y2"], ["m"], axis=0))
    model.graph.output[0].name = "m"
    return model


def _down(units: int, *, named: bool = False, kept: bool = False) -> onnx.ModelProto:
    """Opset 18, converted down to 13 (every value [1, 1]), ``units`` times:

        a = my_add(prev, prev)
        ReduceMean(a, axes)             axes: an initializer all of them read (removed after)
        ReduceMax(.., ax<i>)            ax<i>: a Constant node of value_ints [0] (removed after)
        Relu(..)                        Relu-14 added types: checked, left as it is
        Reshape(.., shape, allowzero=1) allowzero dropped (the shape, constant, has no 0)
    ``kept``: the axes initializer and the first Constant also read by an Identity made an
    output (so they stay)."""
    def name(n: str) -> str:
        return n if named else ""

    nodes, prev = [], "x"
    for i in range(units):
        nodes += [helper.make_node("my_add", [prev, prev], [f"a{i}"], domain="custom", name=name(f"add{i}")),
                  helper.make_node("ReduceMean", [f"a{i}", "axes"], [f"r{i}"], keepdims=1, name=name(f"mean{i}")),
                  helper.make_node("Constant", [], [f"ax{i}"], value_ints=[0]),
                  helper.make_node("ReduceMax", [f"r{i}", f"ax{i}"], [f"m{i}"], keepdims=1),
                  helper.make_node("Relu", [f"m{i}"], [f"l{i}"], name=name(f"relu{i}")),
                  helper.make_node("Reshape", [f"l{i}", "shape"], [f"s{i}"], allowzero=1)]
        prev = f"s{i}"
    outputs = [helper.make_tensor_value_info(prev, F, [1, 1])]
    if kept:
        nodes += [helper.make_node("Identity", ["axes"], ["axes_out"]),
                  helper.make_node("Identity", ["ax0"], ["ax_out"])]
        outputs += [helper.make_tensor_value_info("axes_out", TensorProto.INT64, [1]),
                    helper.make_tensor_value_info("ax_out", TensorProto.INT64, [1])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [1, 1])], outputs, initializer=[
        numpy_helper.from_array(np.array([0], np.int64), "axes"), numpy_helper.from_array(np.array([1, 1], np.int64),
                                                                                          "shape")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("custom", 1)],
                             ir_version=10)


@pytest.mark.parametrize("kept", [False, True], ids=["removed", "kept"])
@pytest.mark.parametrize("named", [False, True], ids=["unnamed", "named"])
def test_target_opset_converting_down_byte_identical(named, kept):
    """Down from 18 to 13: the adapters read each node's declared types and its axes' constant
    (an initializer, a Constant node), which nothing reads after and is removed, as the
    objects writer removes it; a node a step only checks stays as it was."""
    model = _down(5, named=named, kept=kept)
    out = _converted_by_bytes(model, 13)
    assert ("axes" in {t.name for t in out.graph.initializer}) == kept
    assert sum(n.op_type == "Constant" and n.output[0].startswith("ax") for n in out.graph.node) == (1 if kept else 0)
    assert all(len(n.input) == 1 for n in out.graph.node if n.op_type.startswith("Reduce"))
    report = rewrite_bytes(model.SerializeToString(), target_opset=13)[1]
    assert report.ops_after[("", "Constant")] == sum(n.op_type == "Constant" for n in out.graph.node)


@pytest.mark.parametrize("elsewhere", ["graph output", "another node", "tensor bytes", "doc string"])
def test_target_opset_converting_down_a_constant_named_elsewhere(elsewhere):
    """Whether a constant the converted nodes stop reading is read elsewhere is first told by
    counting its name's field-1 entries in the serialized model: a graph output of that name,
    another node reading it, the same bytes inside a tensor or a doc string each count one more,
    and the nodes are then looked at one by one. The constant is kept where read (the first
    two), removed where not, as the objects writer does."""
    model = _down(3)
    g = model.graph
    if elsewhere == "graph output":
        g.output.append(helper.make_tensor_value_info("axes", TensorProto.INT64, [1]))
    elif elsewhere == "another node":
        g.node.append(helper.make_node("Neg", ["axes"], ["negated_axes"]))
        g.output.append(helper.make_tensor_value_info("negated_axes", TensorProto.INT64, [1]))
    elif elsewhere == "tensor bytes":
        g.initializer.append(numpy_helper.from_array(np.frombuffer(b"\x0a\x04axes\x00\x00", np.int64).copy(), "blob"))
        g.node.append(helper.make_node("Neg", ["blob"], ["blob_out"]))
        g.output.append(helper.make_tensor_value_info("blob_out", TensorProto.INT64, [1]))
    else:
        g.node.append(helper.make_node("Neg", ["x"], ["negated"], doc_string="\x0a\x04axes"))
        g.output.append(helper.make_tensor_value_info("negated", F, [1, 1]))
    out = _converted_by_bytes(model, 13)
    read = elsewhere in ("graph output", "another node")
    assert ("axes" in {t.name for t in out.graph.initializer}) == read
    assert all(len(n.input) == 1 for n in out.graph.node if n.op_type.startswith("Reduce"))


def test_target_opset_converting_down_numerics_and_by_parts(monkeypatch):
    from graphkit.runtime import open_session

    model = _down(3)
    out = _converted_by_bytes(model, 13)
    x = np.array([[0.75]], np.float32)
    np.testing.assert_allclose(open_session(out).run({"x": x})["s2"], 27 * x, rtol=1e-6)
    out, report, whole = _by_parts(model, monkeypatch, target_opset=13)
    assert not whole and report.writer_reason.endswith(common.CHECKED_BY_PARTS), report.writer_reason


def test_target_opset_converting_down_refusals_reported_alike():
    """What the adapters refuse going down, both writers refuse in the same words: axes that
    are no constant, noop_with_empty_axes=1 without axes, and axes from an initializer that
    is also a graph input (a default the caller may replace at run time: baked into an
    attribute, a value fed would be ignored)."""
    for change in ("input", "noop", "fed"):
        model = _down(2)
        reduce = model.graph.node[1]
        if change == "input":
            model.graph.input.append(helper.make_tensor_value_info("dyn", TensorProto.INT64, [1]))
            reduce.input[1] = "dyn"
        elif change == "fed":
            model.graph.input.append(helper.make_tensor_value_info("axes", TensorProto.INT64, [1]))
        else:
            del reduce.input[1:]
            reduce.attribute.append(helper.make_attribute("noop_with_empty_axes", 1))
        with pytest.raises(RewriteError) as slow:
            rewrite_model(model, target_opset=13)
        with pytest.raises(RewriteError) as fast:
            lower_bytes(model.SerializeToString(), model, registry=default_registry(), prefer=DEFAULT_PREFERENCE,
                        target_opset=13)
        assert str(fast.value) == str(slow.value)


def test_target_opset_converting_down_non_ascii_names():
    model = _down(3, named=True)
    for node in model.graph.node:
        node.name += "·ü" if node.name else ""
    _converted_by_bytes(model, 13)


def _reduce_18_in_a_body() -> onnx.ModelProto:
    model = _reduce_18()
    body = helper.make_graph([helper.make_node("ReduceMean", ["m", "axes"], ["b"], keepdims=1)], "then", [],
                             [helper.make_tensor_value_info("b", F, [1])])
    model.graph.node.extend([helper.make_node("Constant", [], ["c"],
                                              value=helper.make_tensor("v", TensorProto.BOOL, [], [True])),
                             helper.make_node("If", ["c"], ["o"], then_branch=body, else_branch=body)])
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("o", F, [1]))
    return model


@pytest.mark.parametrize("model, target, match", [
    (_reduce_18_in_a_body(), 17, "ReduceMean nodes in a subgraph convert down"),
    (_softmax_11(), 13, "last-axis"),
], ids=["down-in-a-body", "last-axis"])
def test_target_opset_converting_goes_the_object_way(model, target, match):
    """Conversions that read the model or change subgraphs: the objects writer runs, and the
    report names the precondition that failed."""
    data = model.SerializeToString()
    with pytest.raises(Unsupported, match=match):
        lower_bytes(data, model, registry=default_registry(), prefer=DEFAULT_PREFERENCE, target_opset=target)
    out, report = rewrite_bytes(data, target_opset=target)
    slow, slow_report = rewrite_model(model, target_opset=target)
    assert out == slow.SerializeToString() and _without_writer(report) == _without_writer(slow_report)
    assert report.writer == "objects" and "needs the objects writer's conversion" in report.writer_reason


def _reducing_nested(named: bool) -> onnx.ModelProto:
    """_nested_model with a value of the main graph, the Loop body and the If's then branch
    (each made by a placeholder) added its ReduceMean over axis 0, and the else branch made
    one without placeholders (a ReduceMax of axis 0 added to v, negated)."""
    model = _nested_model(named)
    loop_body = model.graph.node[1].attribute[0].g
    branches = {a.name: a.g for a in loop_body.node[2].attribute}
    then_g, else_g = branches["then_branch"], branches["else_branch"]

    def reduce_after(g: onnx.GraphProto, index: int) -> None:
        out = g.node[index].output[0]
        g.node[index].output[0] = out + "_pre"
        made = [helper.make_node("ReduceMean", [out + "_pre"], [out + "_r"], axes=[0], keepdims=1,
                                 name=f"rm_{out}" if named else ""),
                helper.make_node("Add", [out + "_pre", out + "_r"], [out])]
        nodes = [*g.node[:index + 1], *made, *g.node[index + 1:]]
        del g.node[:]
        g.node.extend(nodes)

    reduce_after(then_g, 0)  # inner graphs first: rebuilding a node list copies the graphs in it
    else_g.CopyFrom(_body([helper.make_node("ReduceMax", ["v"], ["e0r"], axes=[0], keepdims=1),
                           helper.make_node("Add", ["v", "e0r"], ["e0"]),
                           helper.make_node("Neg", ["e0"], ["e1"])], "else", outputs=["e1"]))
    reduce_after(loop_body, 1)
    reduce_after(model.graph, 0)
    return model


@pytest.mark.parametrize("shape", ["if_bodies", "nested", "nested-named", "in-a-body-only"])
def test_target_opset_converting_in_bodies_byte_identical(shape):
    """The bodies' writer converts nodes in every graph, the constants named in the adapters'
    walk order (a graph, then the graphs in it, the last first) and read from the main graph;
    a body holding converted nodes and no placeholder is written again too."""
    model = {"if_bodies": lambda: _scaling("if_bodies", 7), "nested": lambda: _reducing_nested(False),
             "nested-named": lambda: _reducing_nested(True), "in-a-body-only": _reduce_in_a_body}[shape]()
    if shape == "if_bodies":
        import scaling_models

        model = scaling_models.if_bodies(7, reduce=True)
    out = _converted_by_bytes(model)
    converted = [n for g in _walk_graphs(out.graph) for n in g.node if n.op_type.startswith("Reduce")]
    initializers = {t.name for t in out.graph.initializer}
    assert converted and not any(a.name == "axes" for n in converted for a in n.attribute)
    assert all(n.input[1:] == [] or n.input[1] in initializers for n in converted)
    assert sum(len(n.input) == 2 for n in converted) >= 3
    report = rewrite_bytes(model.SerializeToString(), target_opset=18)[1]
    assert report.writer_reason.startswith(bodies.WHY), report.writer_reason


def _subs(scope) -> list:
    """A scope's ``subs`` with each nested scope as its path."""
    return [(index, n, dirty, [(a, field, [(k, sub.path) for k, sub in subs]) for a, field, subs in held])
            for index, n, dirty, held in scope.subs]


def _loops_of_reducing_ifs(n: int) -> onnx.ModelProto:
    """``n`` chained Loops (one trip), each body an If whose branches are a my_add of the
    carried value and a ReduceMean of it (names all their own: the declarations are read at once)."""
    def vi(name: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 4])

    nodes = [helper.make_node("Constant", [], ["m"], value=helper.make_tensor("m", TensorProto.INT64, [], [1])),
             helper.make_node("Constant", [], ["c"], value=helper.make_tensor("c", TensorProto.BOOL, [], [True]))]
    prev = "x"
    for i in range(n):
        def branch(tag: str) -> onnx.GraphProto:
            return helper.make_graph([helper.make_node("my_add", [f"v{i}", f"v{i}"], [f"{tag}{i}a"], domain="custom"),
                                      helper.make_node("ReduceMean", [f"{tag}{i}a"], [f"{tag}{i}"], axes=[0],
                                                       keepdims=1)], f"{tag}{i}", [], [vi(f"{tag}{i}")])
        body = helper.make_graph(
            [helper.make_node("Identity", [f"ci{i}"], [f"co{i}"]),
             helper.make_node("If", [f"ci{i}"], [f"vo{i}"], then_branch=branch("t"), else_branch=branch("e"))],
            f"b{i}", [helper.make_tensor_value_info(f"it{i}", TensorProto.INT64, []),
                      helper.make_tensor_value_info(f"ci{i}", TensorProto.BOOL, []), vi(f"v{i}")],
            [helper.make_tensor_value_info(f"co{i}", TensorProto.BOOL, []), vi(f"vo{i}")])
        nodes.append(helper.make_node("Loop", ["m", "c", prev], [f"o{i}"], body=body))
        prev = f"o{i}"
    graph = helper.make_graph(nodes, "g", [vi("x")], [vi(prev)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)],
                             ir_version=8)


@pytest.mark.parametrize("shape, bulk", [("if_bodies", True), ("loops_of_ifs", True), ("nested", False)])
def test_target_opset_converting_in_bodies_reads_declarations_at_once(shape, bulk, monkeypatch):
    """A conversion changing nodes in bodies: the declarations are read at once, then every
    graph is listed (BodyScopes.list_every_graph: the scopes the graph-by-graph pass lists, each
    placeholder's fields as read) for the conversion to splice into; the objects writer's bytes."""
    import scaling_models

    model = {"if_bodies": lambda: scaling_models.if_bodies(7, reduce=True), "nested": lambda: _reducing_nested(False),
             "loops_of_ifs": lambda: _loops_of_reducing_ifs(5)}[shape]()
    listed: list[list] = []
    list_every_graph = body_scopes.BodyScopes.list_every_graph

    def spy(self, *args):
        list_every_graph(self, *args)
        listed.append([(s.path, s.custom, s.size, s.dirty, s.fields is not None, _subs(s)) for s in self.scopes])

    monkeypatch.setattr(body_scopes.BodyScopes, "list_every_graph", spy)
    ran = _bulk_spy(monkeypatch)
    _converted_by_bytes(model)
    if not bulk:  # not of the form _declared_bulk reads: graph by graph, every graph listed by that pass
        assert ran and not any(ran) and not listed, (ran, listed)
        return
    assert ran and all(ran) and listed, (ran, listed)
    # the graph-by-graph pass lists the same scopes
    data = model.SerializeToString()
    nodes = model.graph.node
    from operator import attrgetter

    holders = [i for i, n in enumerate(nodes) if any(a.type == onnx.AttributeProto.GRAPH for a in n.attribute)]
    one_by_one = body_scopes.BodyScopes(model, default_registry(), body_splice.SpliceGraph(model.graph, ()),
                                   list(map(attrgetter("domain"), nodes)), list(map(attrgetter("op_type"), nodes)),
                                   holders, forward=False, data=data, spans=None)
    assert [(*row[:4], row[5]) for row in listed[0][1:]] == [(s.path, s.custom, s.size, s.dirty, _subs(s))
                                                              for s in one_by_one.scopes[1:]]
    assert listed[0][0][5] == _subs(one_by_one.scopes[0]) and len(listed[0]) == len(one_by_one.scopes) > 1
    assert all(fields for _, custom, _, _, fields, _ in listed[0][1:] if custom)  # fields carried over


def test_target_opset_converting_in_bodies_numerics():
    from graphkit.runtime import open_session

    model = _reducing_nested(False)
    out = _converted_by_bytes(model)
    x = np.array([-1.0, 0.25, 2.0], np.float32)
    feeds = {"x": x, "m": np.array(2, np.int64), "c": np.array(True)}
    want = open_session(rewrite_model(model)[0]).run(feeds)["z"]  # at opset 17, axes attributes
    np.testing.assert_allclose(open_session(out).run(feeds)["z"], want, rtol=1e-6)


def test_target_opset_converting_in_bodies_checked_by_parts(monkeypatch):
    out, report, whole = _by_parts(_reducing_nested(True), monkeypatch, target_opset=18)
    assert report.writer_reason.endswith(common.CHECKED_BY_PARTS), report.writer_reason
    onnx.checker.check_model(out)


def test_target_opset_converting_ir_3_goes_the_object_way():
    """Below IR 4 the adapters' constants are Constant nodes first in the graph."""
    model = _converting(2)
    model.ir_version = 3
    with pytest.raises(Unsupported, match="IR version below 4"):
        lower_bytes(model.SerializeToString(), model, registry=default_registry(), prefer=DEFAULT_PREFERENCE,
                    target_opset=18)


def test_target_opset_on_a_model_importing_no_ai_onnx_opset():
    """Nothing to convert from (bench/fuzz.py found a TypeError here): the import is added, as
    "imports only", by the objects writer, and the report says why the byte writer did not run."""
    model = my_add_model()
    del model.opset_import[0]
    out, report = rewrite_bytes(model.SerializeToString(), target_opset=19)
    slow, slow_report = rewrite_model(model, target_opset=19)
    assert out == slow.SerializeToString() and _without_writer(report) == _without_writer(slow_report)
    assert report.conversions == [(None, 19, "imports only")] and _opset(slow) == 19
    assert "without an ai.onnx opset import" in report.writer_reason


def test_target_opset_with_nothing_to_lower_goes_the_object_way():
    model = _unnamed("my_add", 2, False)
    model.graph.node[0].domain = model.graph.node[1].domain = ""
    model.graph.node[0].op_type = model.graph.node[1].op_type = "Add"
    data = model.SerializeToString()
    with pytest.raises(Unsupported, match="nothing to lower"):
        lower_bytes(data, model, registry=default_registry(), prefer=DEFAULT_PREFERENCE, target_opset=18)
    out, report = rewrite_bytes(data, target_opset=18)
    assert out == rewrite_model(model, target_opset=18)[0].SerializeToString() and report.writer == "objects"


# -- placeholders inside subgraphs: the bodies' byte writer (graphkit.rewrite.bytes.bodies) ------

def _scaling(shape: str, n: int) -> onnx.ModelProto:
    import sys

    sys.path.insert(0, str(REPO / "tests"))
    import scaling_models

    return getattr(scaling_models, shape)(n)


def _body(nodes: list, name: str, inputs=(), outputs=(), elem=F) -> onnx.GraphProto:
    return helper.make_graph(nodes, name, [helper.make_tensor_value_info(i, t, s) for i, t, s in inputs],
                             [helper.make_tensor_value_info(o, elem, [3]) for o in outputs])


def _nested_model(named: bool, unknown: bool = False) -> onnx.ModelProto:
    """A Loop whose body holds an If whose branches hold placeholders (two kinds, repeats of a
    kind in one branch, outer values read at two levels), placeholders in the Loop body and
    in the main graph too; a branch's placeholder makes the branch's output."""
    def name(n: str) -> str:
        return n if named else ""

    then_g = _body([helper.make_node("my_add", ["v", "x"], ["t0"], domain="custom", name=name("t_add")),
                    helper.make_node("asinh", ["t0"], ["t1"], domain="custom", name=name("t_asinh")),
                    helper.make_node("my_add", ["t1", "t1"], ["t2"], domain="custom", name=name("t_add2"))],
                   "then", outputs=["t2"])
    else_g = _body([helper.make_node("Neg", ["v"], ["e0"], name="neg"),
                    helper.make_node("asinh", ["e0"], ["e1"], domain="custom", name=name("e_asinh"))],
                   "else", outputs=["e1"])
    loop_body = _body([helper.make_node("Identity", ["cond_in"], ["cond_out"]),
                       helper.make_node("my_add", ["v_in", "x"], ["v"], domain="custom", name=name("l_add")),
                       helper.make_node("If", ["c"], ["v_out"], then_branch=then_g, else_branch=else_g)],
                      "loop", inputs=[("i", TensorProto.INT64, []), ("cond_in", TensorProto.BOOL, []),
                                      ("v_in", F, [3])], outputs=["cond_out", "v_out"])
    loop_body.output[0].type.tensor_type.elem_type = TensorProto.BOOL
    del loop_body.output[0].type.tensor_type.shape.dim[:]
    if unknown:  # the carried value's type declared nowhere: the engine would infer it
        loop_body.input[2].type.tensor_type.elem_type = 0
    nodes = [helper.make_node("my_add", ["x", "x"], ["a"], domain="custom", name=name("m_add")),
             helper.make_node("Loop", ["m", "", "a"], ["y"], body=loop_body),
             helper.make_node("my_add", ["y", "a"], ["z"], domain="custom", name=name("m_add2"))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [3]),
                                           helper.make_tensor_value_info("m", TensorProto.INT64, []),
                                           helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("z", F, [3])],
                              value_info=[helper.make_tensor_value_info("y", F, [3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)],
                             ir_version=10)


def _same_bytes(model: onnx.ModelProto, **options) -> bytes:
    """same(), and the bodies' writer ran; the input is canonical, so even the bytes are the objects writer's."""
    fast = same(model, **options)
    report = rewrite_bytes(model.SerializeToString(), **options)[1]
    assert report.writer == "bytes" and report.writer_reason.startswith(bodies.WHY)
    slow = rewrite_model(model, **options)[0]
    assert fast == slow.SerializeToString()
    return fast


@pytest.mark.parametrize("lowering", [Lowering.DECOMPOSE, Lowering.NATIVE, Lowering.PYTHON,
                                      (Lowering.NATIVE, Lowering.DECOMPOSE)], ids=["decompose", "native", "python",
                                                                                   "native-decompose"])
@pytest.mark.parametrize("shape", ["if_bodies", "loop_bodies"])
def test_bodies_byte_identical(shape, lowering):
    """If branches reading the outer value, Loop bodies reading their own input: each
    placeholder makes its body's output; each body adopts the first one's template with a
    constant of its own."""
    _same_bytes(_scaling(shape, 7), lowering=lowering)


@pytest.mark.parametrize("named", [True, False], ids=["named", "unnamed"])
@pytest.mark.parametrize("lowering", [Lowering.DECOMPOSE, Lowering.PYTHON])
def test_nested_bodies_byte_identical(named, lowering):
    """Nested bodies, outer names read two levels down, two kinds and repeats in one branch
    (constants shared by value there), placeholders in the main graph besides."""
    out = onnx.ModelProto.FromString(_same_bytes(_nested_model(named), lowering=lowering))
    assert not any(n.domain == "custom" for g in _walk_graphs(out.graph) for n in g.node)


def _walk_graphs(graph: onnx.GraphProto):
    from graphkit.rewrite.graph.walk import graphs

    return list(graphs(graph))


def test_nested_bodies_numerics():
    """The rewritten nested model computes what the placeholders stand for."""
    from graphkit.runtime import open_session

    out = onnx.ModelProto.FromString(_same_bytes(_nested_model(False)))
    x = np.array([-1.0, 0.25, 2.0], np.float32)
    for cond in (True, False):
        got = open_session(out).run({"x": x, "m": np.array(2, np.int64), "c": np.array(cond)})["z"]
        a = 2 * x + x
        v = a
        for _ in range(2):
            v = 2 * v + x
            if cond:
                t1 = np.arcsinh(2 * v + x)
                v = 2 * t1 + t1
            else:
                v = np.arcsinh(-v)
        np.testing.assert_allclose(got, 2 * v + a, rtol=1e-5, atol=1e-5)


def test_bodies_names_shared_and_taken():
    """Placeholders of one name in many bodies, and names of the input (in a body) that the
    generator would make: it sees every name of every scope, as the engine's."""
    model = _scaling("if_bodies", 5)
    for node in model.graph.node[1:]:
        for attr in node.attribute:
            attr.g.node[0].name = "same"
    model.graph.node[3].attribute[0].g.node[0].output[0] = "same/Mul_out"  # an output of a then branch
    model.graph.node[3].attribute[0].g.output[0].name = "same/Mul_out"
    out = onnx.ModelProto.FromString(_same_bytes(model))
    names = [n.name for g in _walk_graphs(out.graph) for n in g.node if n.name]
    assert len(set(names)) == len(names) and "same/Mul_1" in names


def test_bodies_target_opset_imports_only():
    out = onnx.ModelProto.FromString(_same_bytes(_scaling("loop_bodies", 4), target_opset=18))
    assert _opset(out) == 18


def test_bodies_unknown_type_goes_the_object_way():
    """A body's placeholder reading a value no declaration or forward rule types."""
    steps_aside(_nested_model(True, unknown=True), "inference")


def test_custom_node_holding_a_subgraph_goes_the_object_way():
    model = _scaling("if_bodies", 2)
    model.graph.node[1].domain = "custom"
    model.graph.node[1].op_type = "my_add"
    with pytest.raises(Unsupported, match="a custom node with a subgraph"):
        lower_bytes(model.SerializeToString(), model, registry=default_registry(), prefer=DEFAULT_PREFERENCE,
                    check=False)


@pytest.mark.parametrize("shape", ["if_bodies", "loop_bodies", "nested"])
def test_bodies_checked_by_parts(shape, monkeypatch):
    """Over FULL_CHECK_NODES, bodies are checked by parts like the main graph."""
    model = _nested_model(True) if shape == "nested" else _scaling(shape, 20)
    out, report, whole = _by_parts(model, monkeypatch)
    assert report.writer_reason.endswith(common.CHECKED_BY_PARTS), report.writer_reason
    onnx.checker.check_model(out)


def test_bodies_input_checked_before_the_type_table(monkeypatch):
    """As in the main graph's writer, the checker runs on the input before the bodies' writer
    reads every node (test_input_checked_before_the_lowering_lists), and once only."""
    calls = []
    check, types = common.input_refused, body_scopes.BodyScopes
    for module in (bodies, common):  # where the writer calls it, and where check_parts does
        monkeypatch.setattr(module, "input_refused", lambda *a: (calls.append("check"), check(*a))[1])
    monkeypatch.setattr(bodies, "BodyScopes", lambda *a, **k: (calls.append("types"), types(*a, **k))[1])
    _, report, _ = _by_parts(_scaling("if_bodies", 20), monkeypatch)
    assert report.writer_reason.endswith(common.CHECKED_BY_PARTS), report.writer_reason
    assert calls[:2] == ["check", "types"] and calls.count("check") == 2  # the input, the replacements


def test_bodies_invalid_node_found_by_parts_reported_by_the_whole_check(monkeypatch):
    model = _scaling("loop_bodies", 20)
    model.graph.node[5].attribute[0].g.node[0].attribute.append(helper.make_attribute("bogus", 1))
    with pytest.raises(ValidationError, match="bogus"):
        _by_parts(model, monkeypatch)


def test_bodies_non_canonical_encoding():
    """An If whose attributes come in another order, and a length written with padding: the
    located entries are the parsed model's, and the output is the objects writer's (reparsed)."""
    model = _scaling("if_bodies", 3)
    for node in model.graph.node[1:]:
        node.attribute.reverse()
    same(model)


# -- the main-graph nodes holding bodies, written again (body_splice.holder_entries) ----------

def _holder_spy(monkeypatch) -> list:
    """Per block _holder_entries hands to _spliced_holders: (nodes it spliced, nodes handed)."""
    blocks = []
    spliced = body_splice._spliced_holders

    def spy(data, buf, v0, *args):
        out = spliced(data, buf, v0, *args)
        blocks.append((sum(e is not None for e in out), len(out)))
        return out

    monkeypatch.setattr(body_splice, "_spliced_holders", spy)
    return blocks


def _holders_alike(model: onnx.ModelProto, monkeypatch, data: bytes | None = None, *,
                   canonical: bool = True, **options) -> list:
    """The bodies' writer on ``model`` (serialized as ``data``): the objects writer's model field
    for field (its bytes where ``canonical``), and byte for byte what it writes with every
    holder parsed and written again (the way before splicing, still the one for a node where a
    message would not come back as it is). Returns _holder_spy's blocks of the first run."""
    data = model.SerializeToString() if data is None else data
    blocks = _holder_spy(monkeypatch)
    fast = same(model, data=data, **options) if canonical else _same_bytes(model, **options)
    ran = list(blocks)
    assert ran, "the bodies' writer wrote no holder"
    registry = default_registry()
    with monkeypatch.context() as m:
        m.setattr(body_splice, "_spliced_holders", lambda data, buf, v0, *a: [None] * len(v0))
        parsed, _ = lower_bytes(data, model, registry=registry, prefer=DEFAULT_PREFERENCE, check=True, **options)
    assert fast == parsed
    return ran


def _branch(nodes: list, name: str, out: str, value_info=()) -> onnx.GraphProto:
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(out, F, [1, 4])],
                             value_info=[helper.make_tensor_value_info(v, F, [1, 4]) for v in value_info])


def _if_model(n: int, *, then_nodes: Any = None, else_nodes: Any = None, **fields) -> onnx.ModelProto:
    """``n`` chained If nodes (``fields`` set on each: name, doc_string, domain); branch i of
    each made by ``then_nodes(i, prev)`` / ``else_nodes(i, prev)`` -> (nodes, value_info),
    its output f"t{i}" / f"e{i}"; by default a my_add of the previous output."""
    def plain(tag):
        return lambda i, prev: ([helper.make_node("my_add", [prev, prev], [f"{tag}{i}"], domain="custom")], [])

    then_nodes, else_nodes = then_nodes or plain("t"), else_nodes or plain("e")
    cond = helper.make_node("Constant", [], ["c"], value=helper.make_tensor("v", TensorProto.BOOL, [], [True]))
    nodes, prev = [cond], "x"
    for i in range(n):
        t_nodes, t_vi = then_nodes(i, prev)
        e_nodes, e_vi = else_nodes(i, prev)
        node = helper.make_node("If", ["c"], [f"o{i}"], then_branch=_branch(t_nodes, f"t{i}", f"t{i}", t_vi),
                                else_branch=_branch(e_nodes, f"e{i}", f"e{i}", e_vi))
        for field, value in fields.items():
            setattr(node, field, f"{value}{i}" if field == "name" else value)
        nodes.append(node)
        prev = f"o{i}"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [1, 4])],
                              [helper.make_tensor_value_info(prev, F, [1, 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)],
                             ir_version=10)


def _middle(tag: str):
    """A branch of three nodes: Neg, the placeholder, Relu (the placeholder neither first nor last)."""
    return lambda i, prev: ([helper.make_node("Neg", [prev], [f"{tag}n{i}"]),
                             helper.make_node("my_add", [f"{tag}n{i}", prev], [f"{tag}a{i}"], domain="custom"),
                             helper.make_node("Relu", [f"{tag}a{i}"], [f"{tag}{i}"])], [f"{tag}n{i}", f"{tag}a{i}"])


def _two(tag: str):
    """A branch with two placeholders and a standard node between them."""
    return lambda i, prev: ([helper.make_node("my_add", [prev, prev], [f"{tag}a{i}"], domain="custom"),
                             helper.make_node("Neg", [f"{tag}a{i}"], [f"{tag}n{i}"]),
                             helper.make_node("asinh", [f"{tag}n{i}"], [f"{tag}{i}"], domain="custom")],
                            [f"{tag}a{i}", f"{tag}n{i}"])


def _none(tag: str):
    """A branch without a placeholder."""
    return lambda i, prev: ([helper.make_node("Neg", [prev], [f"{tag}{i}"])], [])


def _four_or_two(model_n: int) -> onnx.ModelProto:
    """If nodes with as many cuts (length prefixes, placeholders) in another order: every other
    one four placeholders in its then branch and none in its else branch, the others one in each."""
    def then_nodes(i, prev):
        if i % 2 == 0:
            return [helper.make_node("my_add", [prev, prev], [f"t{i}"], domain="custom")], []
        names = [prev] + [f"t{i}_{k}" for k in range(3)] + [f"t{i}"]
        return ([helper.make_node("my_add", [a, a], [b], domain="custom") for a, b in zip(names, names[1:])],
                names[1:-1])

    def else_nodes(i, prev):
        if i % 2:
            return [helper.make_node("Neg", [prev], [f"e{i}"])], []
        return [helper.make_node("my_add", [prev, prev], [f"e{i}"], domain="custom")], []

    return _if_model(model_n, then_nodes=then_nodes, else_nodes=else_nodes)


def _alternate(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every other If's attributes the other way round: then_branch and else_branch names, as
    long as each other, in one column of pieces."""
    for node in model.graph.node[1::2]:
        node.attribute.reverse()
    return model


@pytest.mark.parametrize("case", ["if", "loop", "named", "doc_and_domain", "middle", "two_a_branch",
                                  "one_branch_without", "else_only", "attributes_either_way", "scan",
                                  "cuts_in_another_order"])
def test_holders_spliced_byte_identical(case, monkeypatch):
    """Canonical inputs: every holder written without parsing, the objects writer's bytes and
    those of the parsing way: If and Loop bodies; fields of the If node before and after its
    attributes (name; doc_string and domain); a placeholder between two nodes of its branch;
    two in one branch; a branch without any (its attribute left as it is); the branches'
    attributes in either order; Scan nodes (an int attribute beside the body); nodes with as
    many cuts, made of length prefixes and placeholders in another order."""
    model = {"if": lambda: _scaling("if_bodies", 5), "loop": lambda: _scaling("loop_bodies", 5),
             "named": lambda: _if_model(4, name="if"),
             "doc_and_domain": lambda: _if_model(4, name="if", doc_string="a branch", domain=""),
             "middle": lambda: _if_model(4, then_nodes=_middle("t"), else_nodes=_middle("e")),
             "two_a_branch": lambda: _if_model(4, then_nodes=_two("t"), else_nodes=_middle("e")),
             "one_branch_without": lambda: _if_model(4, else_nodes=_none("e")),
             "else_only": lambda: _if_model(4, then_nodes=_none("t")),
             "attributes_either_way": lambda: _alternate(_if_model(5)), "scan": lambda: _scan_bodies(4),
             "cuts_in_another_order": lambda: _four_or_two(4)}[case]()
    ran = _bulk_spy(monkeypatch)
    blocks = _holders_alike(model, monkeypatch, canonical=False)
    assert ran and all(ran)
    assert blocks and all(spliced == handed for spliced, handed in blocks), blocks


def _nested_if(n: int) -> onnx.ModelProto:
    """An If whose then branch holds an If with placeholders (a holder of a deeper graph), then
    ``n`` plain If nodes holding their own: parsed and spliced holders, in the main graph's order."""
    inner = helper.make_node("If", ["c"], ["io"], then_branch=_branch(
        [helper.make_node("my_add", ["x", "x"], ["it"], domain="custom")], "it", "it"),
        else_branch=_branch([helper.make_node("asinh", ["x"], ["ie"], domain="custom")], "ie", "ie"))
    outer = helper.make_node("If", ["c"], ["oo"], then_branch=_branch(
        [inner, helper.make_node("my_add", ["io", "x"], ["ot"], domain="custom")], "ot", "ot", ["io"]),
        else_branch=_branch([helper.make_node("Neg", ["x"], ["oe"])], "oe", "oe"))
    model = _if_model(n)
    nodes = list(model.graph.node)
    nodes[1].input[0] = "c"
    for node in nodes[1:]:
        for attr in node.attribute:
            if attr.g.node[0].input[0] == "x":
                attr.g.node[0].input[:] = ["oo", "oo"]
    del model.graph.node[:]
    model.graph.node.extend([nodes[0], outer, *nodes[1:]])
    return model


def test_holders_nested_and_own_in_one_graph(monkeypatch):
    """A holder of a deeper graph (parsed: _Edits) before holders of their own graphs (spliced):
    the entries are put back in the main graph's order."""
    model = _nested_if(3)
    onnx.checker.check_model(model)
    ran = _bulk_spy(monkeypatch)
    blocks = _holders_alike(model, monkeypatch, canonical=False)
    assert all(ran) and blocks and all(b == (3, 3) for b in blocks), blocks


def test_holders_of_several_graphs_in_one_attribute(monkeypatch):
    """A node of another domain holding three graphs in one attribute (GRAPHS), the first and
    the last with a placeholder: spliced, the middle graph left as it is; the objects writer's
    bytes (not checked: the checker knows no such op)."""
    nodes, prev = [], "x"
    for i in range(3):
        bodies = [_branch([helper.make_node("my_add", [prev, prev], [f"b{i}_{k}"], domain="custom")],
                          f"b{i}_{k}", f"b{i}_{k}") for k in range(3)]
        bodies[1] = _branch([helper.make_node("Neg", [prev], [f"b{i}_1"])], f"b{i}_1", f"b{i}_1")
        node = helper.make_node("Multi", [prev], [f"o{i}"], domain="com.example")
        node.attribute.append(helper.make_attribute("bodies", bodies))
        nodes.append(node)
        prev = f"o{i}"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [1, 4])],
                              [helper.make_tensor_value_info(prev, F, [1, 4])],
                              value_info=[helper.make_tensor_value_info(f"o{i}", F, [1, 4]) for i in range(3)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1),
                                                    helper.make_opsetid("com.example", 1)], ir_version=10)
    data = model.SerializeToString()
    registry = default_registry()
    blocks = _holder_spy(monkeypatch)
    fast, report = lower_bytes(data, model, registry=registry, prefer=DEFAULT_PREFERENCE, check=False)
    assert report.writer == "bytes" and blocks == [(3, 3)]
    monkeypatch.setattr(body_splice, "_spliced_holders", lambda data, buf, v0, *a: [None] * len(v0))
    parsed, _ = lower_bytes(data, model, registry=registry, prefer=DEFAULT_PREFERENCE, check=False)
    assert fast == parsed == rewrite_model(model, check=False)[0].SerializeToString()


def _message_fields(value: bytes) -> list[tuple[int, int, bytes]]:
    """(number, wire type, raw value: a length-delimited one's content, else its bytes) of each field."""
    return [(field, value[start] & 7 if value[start] < 0x80 else wire.read_varint(value, start)[0] & 7,
             value[v0:end]) for field, start, v0, end in wire.entries(value, 0, len(value))]


def _message(fields: list, padded: int | None = None) -> bytes:
    """``fields`` written again, field ``padded``'s length (or varint value) one byte longer than it needs."""
    out = b""
    for k, (number, wire_type, raw) in enumerate(fields):
        out += wire.encode_varint(number << 3 | wire_type)
        if wire_type == 2:
            length = wire.encode_varint(len(raw))
            if k == padded:
                length = bytes([length[0] | 0x80]) + length[1:] + b"\x00" if len(length) == 1 else \
                    length[:-1] + bytes([length[-1] | 0x80, 0])
            out += length
        elif k == padded:
            raw = raw[:-1] + bytes([raw[-1] | 0x80, 0])
        out += raw
    return out


def _first_attribute(fields: list, edit) -> list:
    k = next(k for k, f in enumerate(fields) if f[0] == 5)
    fields[k] = (5, 2, edit(_message_fields(fields[k][2])))
    return fields


def _first_graph(fields: list, edit) -> list:
    def in_attribute(attribute):
        k = next(k for k, f in enumerate(attribute) if f[0] == 6)
        attribute[k] = (6, 2, edit(_message_fields(attribute[k][2])))
        return _message(attribute)
    return _first_attribute(fields, in_attribute)


# Ways a holder's bytes may differ from what protobuf writes: each parsed, and written as ever.
_NOT_CANONICAL = {
    "op_type_after_attributes": lambda f: [x for x in f if x[0] != 4] + [x for x in f if x[0] == 4],
    "name_after_attributes": lambda f: [x for x in f if x[0] != 3] + [x for x in f if x[0] == 3],
    "name_twice": lambda f: [x for x in f if x[0] == 3] + f,
    "unknown_field": lambda f: [x for x in f if x[0] < 5] + [(99, 2, b"x")] + [x for x in f if x[0] >= 5],
    "attribute_length_padded": lambda f: ("pad", next(k for k, x in enumerate(f) if x[0] == 5)),
    "attribute_type_padded": lambda f: _first_attribute(f, lambda a: _message(a, padded=len(a) - 1)),
    "attribute_type_first": lambda f: _first_attribute(f, lambda a: _message(a[-1:] + a[:-1])),
    "graph_name_first": lambda f: _first_graph(f, lambda g: _message([x for x in g if x[0] == 2]
                                                                       + [x for x in g if x[0] != 2])),
    "graph_node_length_padded": lambda f: _first_graph(f, lambda g: _message(g, padded=0)),
}


def _holder_rewritten(data: bytes, index: int, how: str) -> bytes:
    """``data`` (a model) with main-graph node ``index`` written as ``how`` (_NOT_CANONICAL) says."""
    top = wire.entries(data, 0, len(data))
    _, g_start, g0, g1 = next(e for e in top if e[0] == 7)
    starts, ends, _ = wire.node_entries(data, g0, g1)
    start, end = starts[index], ends[index]
    fields = _message_fields(data[start:end])[0][2]
    fields = _message_fields(fields)
    made = _NOT_CANONICAL[how](fields)
    value = _message(fields, padded=made[1]) if made[0] == "pad" else _message(made)
    graph = data[g0:start] + b"\x0a" + wire.encode_varint(len(value)) + value + data[end:g1]
    return data[:g_start] + b"\x3a" + wire.encode_varint(len(graph)) + graph + data[g1:]


@pytest.mark.parametrize("how", sorted(_NOT_CANONICAL))
def test_holders_not_as_protobuf_writes_them_are_parsed(how, monkeypatch):
    """An If node (of four) whose bytes are not as protobuf writes them, in the node, in an
    attribute holding a branch, in a branch: that one parsed and written again (bytes as
    before), the others spliced; the objects writer's model, field for field."""
    data = _holder_rewritten(_if_model(4, name="if").SerializeToString(), 2, how)
    model = onnx.ModelProto.FromString(data)
    assert model.SerializeToString() != data
    blocks = _holders_alike(model, monkeypatch, data)
    assert blocks and all(b == (3, 4) for b in blocks), blocks


@settings(max_examples=25, derandomize=True, deadline=None, database=None)
@given(st.lists(st.sampled_from([None, *sorted(_NOT_CANONICAL)]), min_size=4, max_size=4))
def test_holders_spliced_or_parsed_mixed(hows):
    """Any mix of holders as protobuf writes them and not: the same bytes as the parsing way."""
    data = _if_model(4, then_nodes=_middle("t"), name="if").SerializeToString()
    for index, how in enumerate(hows):
        if how is not None:
            data = _holder_rewritten(data, index + 1, how)
    model = onnx.ModelProto.FromString(data)
    registry = default_registry()
    with pytest.MonkeyPatch.context() as m:
        blocks = _holder_spy(m)
        fast, _ = lower_bytes(data, model, registry=registry, prefer=DEFAULT_PREFERENCE, check=False)
        m.setattr(body_splice, "_spliced_holders", lambda data, buf, v0, *a: [None] * len(v0))
        parsed, _ = lower_bytes(data, model, registry=registry, prefer=DEFAULT_PREFERENCE, check=False)
    assert fast == parsed and blocks == [(hows.count(None), 4)]


@pytest.mark.parametrize("how", [None, *sorted(_NOT_CANONICAL)])
def test_converted_bodies_holders_spliced_at_once_or_node_by_node(how, monkeypatch):
    """A conversion in bodies lists every graph and graph_bytes writes the main graph: its If
    nodes are written a block at a time (_spliced_holders), one whose bytes are not as
    protobuf writes them node by node, with the bytes each gets when every one goes node by
    node; the objects writer's model, field for field."""
    import scaling_models

    model = scaling_models.if_bodies(4, reduce=True)
    for i, node in enumerate(model.graph.node[1:]):
        node.name = f"if{i}"
    data = model.SerializeToString()
    if how is not None:
        data = _holder_rewritten(data, 2, how)
        assert onnx.ModelProto.FromString(data).SerializeToString() != data
    model = onnx.ModelProto.FromString(data)
    blocks = _holder_spy(monkeypatch)
    same(model, data=data, target_opset=18)
    assert blocks and blocks[0] == (4 if how is None else 3, 4), blocks
    registry = default_registry()
    fast, report = lower_bytes(data, model, registry=registry, prefer=DEFAULT_PREFERENCE, target_opset=18)
    assert report.conversions == [(17, 18, "adapters")]
    monkeypatch.setattr(body_splice, "_spliced_holders", lambda data, buf, v0, *a: [None] * len(v0))
    one_by_one, _ = lower_bytes(data, model, registry=registry, prefer=DEFAULT_PREFERENCE, target_opset=18)
    assert fast == one_by_one


def test_converted_bodies_nodes_around_placeholders():
    """Bodies whose converted nodes come before and after their placeholders, and bodies with
    converted nodes alone: each body's entries put in its node order (ScopedSplice.merge)."""
    vi = helper.make_tensor_value_info
    cond = helper.make_node("Constant", [], ["c"], value=helper.make_tensor("v", TensorProto.BOOL, [], [True]))
    nodes, prev = [cond], "x"
    for i in range(3):
        def body(tag: str, placeholder: bool) -> onnx.GraphProto:
            made = [helper.make_node("ReduceMean", [prev], [f"{tag}{i}r"], axes=[1], keepdims=1),
                    helper.make_node("my_add", [f"{tag}{i}r", prev], [f"{tag}{i}a"], domain="custom")
                    if placeholder else helper.make_node("Add", [f"{tag}{i}r", prev], [f"{tag}{i}a"]),
                    helper.make_node("ReduceMean", [f"{tag}{i}a"], [f"{tag}{i}"], axes=[0], keepdims=1)]
            return helper.make_graph(made, f"{tag}{i}", [], [vi(f"{tag}{i}", F, [1, 4])])
        nodes.append(helper.make_node("If", ["c"], [f"o{i}"], then_branch=body("t", True),
                                      else_branch=body("e", i != 1)))
        prev = f"o{i}"
    graph = helper.make_graph(nodes, "g", [vi("x", F, [1, 4])], [vi(prev, F, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)],
                              ir_version=8)
    out = _converted_by_bytes(model)
    converted = [n for g in _walk_graphs(out.graph) for n in g.node if n.op_type == "ReduceMean"]
    assert len(converted) == 12 and all(len(n.input) == 2 for n in converted)


def test_holders_with_long_bodies_parsed(monkeypatch):
    """Messages still being read after _SCAN_MIN fields, if fewer than _SCAN_MIN, go the parsing way."""
    def longer(i, prev):  # the second If's then branch five nodes longer than the others
        nodes, value_info = [], []
        for k in range(5 if i == 1 else 0):
            nodes.append(helper.make_node("Neg", [prev], [f"tn{i}_{k}"]))
            prev = f"tn{i}_{k}"
            value_info.append(prev)
        return nodes + [helper.make_node("my_add", [prev, prev], [f"t{i}"], domain="custom")], value_info

    monkeypatch.setattr(body_splice, "_SCAN_MIN", 2)
    blocks = _holders_alike(_if_model(3, then_nodes=longer), monkeypatch, canonical=False)
    assert blocks and all(b == (2, 3) for b in blocks), blocks


def test_holder_rules_are_protobufs_order():
    """_Rules' ranks are the order protobuf writes a skeleton's fields in: a message with
    every field it knows set reads as written back; with two fields swapped, not."""
    from google.protobuf.descriptor import FieldDescriptor as D

    sk = wire.Skeletons.load()
    for message, rules in zip((sk.node, sk.attribute, sk.graph), body_splice._Rules.of()):
        full = message()
        for f in message.DESCRIPTOR.fields:
            value = {D.TYPE_STRING: "s", D.TYPE_BYTES: b"b", D.TYPE_FLOAT: 1.5, D.TYPE_INT64: 7,
                     D.TYPE_ENUM: 5}.get(f.type)
            if value is None:
                pytest.fail(f"a field of a type the test does not set: {f.name}")
            if f.is_repeated:
                getattr(full, f.name).extend([value, value])
            else:
                setattr(full, f.name, value)
        data = full.SerializeToString()
        buf = np.frombuffer(data, np.uint8)
        ok, _ = body_splice._scan(buf, np.array([0]), np.array([len(data)]), rules, ())
        assert ok.tolist() == [True], message.DESCRIPTOR.name
        fields = _message_fields(data)
        swapped = _message(fields[:1] + fields[2:3] + fields[1:2] + fields[3:])
        ok, _ = body_splice._scan(np.frombuffer(swapped, np.uint8), np.array([0]), np.array([len(swapped)]), rules, ())
        assert ok.tolist() == [fields[1][0] == fields[2][0]], message.DESCRIPTOR.name


def test_bodies_declaring_one_name_with_two_types():
    """Sibling Loop bodies that define the same input name, float in one and double in the
    other: the engine's type table has a table per scope then; the byte writer steps aside
    (whether it reads declarations alone, every placeholder input being declared, or runs
    the whole pass)."""
    def loop(i: int, elem: int, carried: str) -> onnx.NodeProto:
        body = helper.make_graph(
            [helper.make_node("Identity", ["ci"], [f"co{i}"]),
             helper.make_node("my_add", ["v", "v"], [f"vo{i}"], domain="custom")], f"b{i}",
            [helper.make_tensor_value_info("it", TensorProto.INT64, []),
             helper.make_tensor_value_info("ci", TensorProto.BOOL, []), helper.make_tensor_value_info("v", elem, [3])],
            [helper.make_tensor_value_info(f"co{i}", TensorProto.BOOL, []), helper.make_tensor_value_info(f"vo{i}", elem, [3])])
        return helper.make_node("Loop", ["m", "", carried], [f"o{i}"], body=body)

    nodes = [helper.make_node("Constant", [], ["m"], value=helper.make_tensor("m", TensorProto.INT64, [], [1])),
             loop(0, F, "x"), loop(1, TensorProto.DOUBLE, "xd")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [3]),
                                           helper.make_tensor_value_info("xd", TensorProto.DOUBLE, [3])],
                              [helper.make_tensor_value_info("o0", F, [3]),
                               helper.make_tensor_value_info("o1", TensorProto.DOUBLE, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)],
                              ir_version=10)
    steps_aside(model, "sibling subgraphs both define", check=False)
    out, _ = rewrite_model(model, check=False)
    consts = [n for g in _walk_graphs(out.graph) for n in g.node if n.op_type == "Constant" and n.name]
    assert sorted(c.attribute[0].t.data_type for c in consts) == [F, TensorProto.DOUBLE]


# -- converting --target-opset on random models: the writers agree, or the byte writer steps aside

_AXES_INPUT_FROM = {"ReduceMean": 18, "ReduceMax": 18, "ReduceSum": 13, "Squeeze": 13, "Unsqueeze": 13}


def _random_converting_model(rng, opset: int) -> onnx.ModelProto:
    """A chain over a [1, 1] value of placeholders, reductions (axes an attribute or an input,
    from a shared initializer or a Constant, at ``opset``), Unsqueeze/Squeeze pairs and
    Relus, names drawn from a few that collide (empty, shared, '<prefix>/', an axes
    constant's name)."""
    nodes, inits, prev = [], {}, "x"
    names = ["", "", "n", "my_add/n", "r1_axes", "axes_0"]

    def axes(op: str, values: list[int], i: int) -> tuple[list[str], dict]:
        if opset < _AXES_INPUT_FROM[op]:
            return [], {"axes": values}
        if rng.random() < 0.5:
            name = f"axes_{values[0] % 2}"
            inits[name] = numpy_helper.from_array(np.array(values, np.int64), name)
            return [name], {}
        nodes.append(helper.make_node("Constant", [], [f"c{i}"], value_ints=values))
        return [f"c{i}"], {}

    for i in range(rng.randint(1, 8)):
        kind = rng.choice(["my_add", "reduce", "squeeze", "relu"])
        name = rng.choice(names)
        name = f"{name}{i}" if name and rng.random() < 0.5 else name
        if kind == "my_add":
            nodes.append(helper.make_node("my_add", [prev, prev], [f"v{i}"], domain="custom", name=name))
        elif kind == "reduce":
            op = rng.choice(["ReduceMean", "ReduceMax", "ReduceSum"])
            extra, attrs = axes(op, [rng.choice([0, -1])], i)
            nodes.append(helper.make_node(op, [prev, *extra], [f"v{i}"], keepdims=1, name=name, **attrs))
        elif kind == "squeeze":
            extra, attrs = axes("Unsqueeze", [0], i)
            nodes.append(helper.make_node("Unsqueeze", [prev, *extra], [f"u{i}"], name=name, **attrs))
            extra, attrs = axes("Squeeze", [0], 100 + i)
            nodes.append(helper.make_node("Squeeze", [f"u{i}", *extra], [f"v{i}"], **attrs))
        else:
            nodes.append(helper.make_node("Relu", [prev], [f"v{i}"], name=name))
        prev = f"v{i}"
    nodes.append(helper.make_node("my_add", [prev, "x"], ["y"], domain="custom"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [1, 1])],
                              [helper.make_tensor_value_info("y", F, [1, 1])], initializer=list(inits.values()))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("custom", 1)],
                             ir_version=10)


@settings(max_examples=60, derandomize=True, deadline=None, database=None)
@given(st.randoms(use_true_random=False), st.sampled_from([11, 13, 17, 18]), st.sampled_from([11, 13, 17, 18]))
def test_target_opset_converting_random_models_agree(rng, opset, target):
    """Whatever the byte writer takes it writes as the objects writer does, field for field and
    byte for byte, reports alike; an error is the objects writer's, in its words."""
    model = _random_converting_model(rng, opset)
    data = model.SerializeToString()
    try:
        slow, slow_report = rewrite_model(model, target_opset=target)
    except (RewriteError, ValidationError) as exc:
        with pytest.raises(type(exc)) as fast:
            rewrite_bytes(data, target_opset=target)
        assert str(fast.value) == str(exc)
        return
    out, report = rewrite_bytes(data, target_opset=target)
    assert out == slow.SerializeToString() and _without_writer(report) == _without_writer(slow_report)


# -- the bodies' declarations read at once (BodyScopes._declared_bulk) or graph by graph --------

def _loop_bodies_rich(n: int, *, outer_value_info: bool = False, initializer: bool = False,
                      outer_output: bool = False) -> onnx.ModelProto:
    """``n`` Loops whose bodies hold several placeholders (two kinds, a repeat, an optional
    input left out), value_info for their intermediate names and an Identity between; with
    ``outer_value_info`` a body declares the outer "x" too, with ``initializer`` it holds one,
    with ``outer_output`` its carried output is the outer "x" itself."""
    nodes = [helper.make_node("Constant", [], ["m"], value=helper.make_tensor("m", TensorProto.INT64, [], [2])),
             helper.make_node("Constant", [], ["c"], value=helper.make_tensor("v", TensorProto.BOOL, [], [True]))]
    prev = "x"
    for i in range(n):
        inner = [helper.make_node("Identity", [f"ci{i}"], [f"co{i}"]),
                 helper.make_node("my_add", [f"v{i}", "x"], [f"a{i}"], domain="custom"),
                 helper.make_node("asinh", [f"a{i}"], [f"s{i}"], domain="custom"),
                 helper.make_node("my_add", [f"s{i}", f"s{i}"], [f"vo{i}"], domain="custom")]
        value_info = [helper.make_tensor_value_info(f"a{i}", F, [3]), helper.make_tensor_value_info(f"s{i}", F, [3])]
        if outer_value_info:
            value_info.append(helper.make_tensor_value_info("x", F, [3]))
        inits = [numpy_helper.from_array(np.ones(3, np.float32), f"w{i}")] if initializer else []
        if initializer:
            inner.append(helper.make_node("Mul", [f"vo{i}", f"w{i}"], [f"vw{i}"]))
        out = f"vw{i}" if initializer else ("x" if outer_output else f"vo{i}")
        body = helper.make_graph(
            inner, f"b{i}",
            [helper.make_tensor_value_info(f"it{i}", TensorProto.INT64, []),
             helper.make_tensor_value_info(f"ci{i}", TensorProto.BOOL, []), helper.make_tensor_value_info(f"v{i}", F, [3])],
            [helper.make_tensor_value_info(f"co{i}", TensorProto.BOOL, []), helper.make_tensor_value_info(out, F, [3])],
            initializer=inits, value_info=value_info)
        nodes.append(helper.make_node("Loop", ["m", "c", prev], [f"o{i}"], body=body))
        prev = f"o{i}"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [3])],
                              [helper.make_tensor_value_info(prev, F, [3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)],
                             ir_version=10)


def _scan_bodies(n: int) -> onnx.ModelProto:
    """``n`` Scans over rows of a [4, 3] input, each body a my_add of the row and the outer "b"."""
    nodes, prev = [], "x"
    for i in range(n):
        body = helper.make_graph([helper.make_node("my_add", [f"r{i}", "b"], [f"ro{i}"], domain="custom")], f"s{i}",
                                 [helper.make_tensor_value_info(f"r{i}", F, [3])],
                                 [helper.make_tensor_value_info(f"ro{i}", F, [3])])
        nodes.append(helper.make_node("Scan", [prev], [f"o{i}"], body=body, num_scan_inputs=1))
        prev = f"o{i}"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [4, 3]),
                                           helper.make_tensor_value_info("b", F, [3])],
                              [helper.make_tensor_value_info(prev, F, [4, 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)],
                             ir_version=10)


def _bulk_spy(monkeypatch) -> list:
    """Records, per run of BodyScopes._declared_bulk, whether it read the declarations (True) or
    left them to the graph-by-graph pass (False)."""
    ran = []
    bulk = body_scopes.BodyScopes._declared_bulk

    def spy(self, *args):
        try:
            bulk(self, *args)
        except columns.NotBulk:
            ran.append(False)
            raise
        ran.append(True)

    monkeypatch.setattr(body_scopes.BodyScopes, "_declared_bulk", spy)
    return ran


@pytest.mark.parametrize("case, bulk", [
    ("if_bodies", True), ("loop_bodies", True), ("loop_rich", True), ("scan", True), ("nested_declared", True),
    ("nested_unnamed", False), ("names_taken", True), ("outer_value_info", False), ("initializer", False),
    ("outer_output", False)])
@pytest.mark.parametrize("lowering", [Lowering.DECOMPOSE, (Lowering.NATIVE, Lowering.DECOMPOSE),
                                      (Lowering.PYTHON, Lowering.DECOMPOSE)], ids=["decompose", "native", "python"])
def test_bodies_read_at_once_or_graph_by_graph(case, bulk, lowering, monkeypatch):
    """Both ways of reading the bodies' declarations give the objects writer's bytes: at once
    where every name a body defines or declares is its own, graph by graph otherwise (a body
    declaring an outer name, holding an initializer, or passing an outer name out; a
    placeholder reading a name declared nowhere, which needs the whole forward pass)."""
    if case == "names_taken":  # a generated name taken in a body, placeholders of one name
        model = _scaling("if_bodies", 5)
        for node in model.graph.node[1:]:
            for attr in node.attribute:
                attr.g.node[0].name = "same"
        model.graph.node[3].attribute[0].g.node[0].output[0] = "same/Mul_out"
        model.graph.node[3].attribute[0].g.output[0].name = "same/Mul_out"
    elif case.startswith("nested"):
        model = _nested_model(case == "nested_declared")
        if case == "nested_declared":  # If in a Loop body, every name a placeholder reads declared
            loop_body = model.graph.node[1].attribute[0].g
            loop_body.value_info.append(helper.make_tensor_value_info("v", F, [3]))
            branches = {a.name: a.g for a in loop_body.node[2].attribute}
            then_g, else_g = branches["then_branch"], branches["else_branch"]
            then_g.value_info.extend(helper.make_tensor_value_info(n, F, [3]) for n in ("t0", "t1"))
            else_g.value_info.append(helper.make_tensor_value_info("e0", F, [3]))
    else:
        model = {"if_bodies": lambda: _scaling("if_bodies", 6), "loop_bodies": lambda: _scaling("loop_bodies", 6),
                 "loop_rich": lambda: _loop_bodies_rich(4), "scan": lambda: _scan_bodies(4),
                 "outer_value_info": lambda: _loop_bodies_rich(3, outer_value_info=True),
                 "initializer": lambda: _loop_bodies_rich(3, initializer=True),
                 "outer_output": lambda: _loop_bodies_rich(3, outer_output=True)}[case]()
    ran = _bulk_spy(monkeypatch)
    _same_bytes(model, lowering=lowering, check=case != "outer_output")  # the checker refuses that one's output
    assert ran and all(r == bulk for r in ran), ran


def _deform_in_branches(n: int, wrong_last: bool = False) -> onnx.ModelProto:
    """``n`` If nodes whose branches run deform_conv2d (its check reads the offset's shape) on
    an offset the branch makes and declares twice: a wrong shape, then the right one (the
    other way round where ``wrong_last``)."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 2, 3, 3)).astype(np.float32), "w")
    cond = helper.make_node("Constant", [], ["c"], value=helper.make_tensor("v", TensorProto.BOOL, [], [True]))
    nodes = [cond]
    for i in range(n):
        def branch(tag: str) -> onnx.GraphProto:
            shapes = [[1, 18, 7, 7] if i % 2 else ["h", 18, 5, 5], [1, 18, 5, 5]]
            vi = [helper.make_tensor_value_info(f"{tag}off{i}", F, s) for s in shapes[::-1 if wrong_last else 1]]
            return helper.make_graph(
                [helper.make_node("Identity", ["off"], [f"{tag}off{i}"]),
                 helper.make_node("deform_conv2d", ["x", "w", f"{tag}off{i}"], [f"{tag}{i}"], domain="custom",
                                  padding=[1, 1])],
                f"{tag}{i}", [], [helper.make_tensor_value_info(f"{tag}{i}", F, [1, 4, 5, 5])], value_info=vi)
        nodes.append(helper.make_node("If", ["c"], [f"o{i}"], then_branch=branch("t"), else_branch=branch("e")))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [1, 2, 5, 5]),
                                           helper.make_tensor_value_info("off", F, [1, 18, 5, 5])],
                              [helper.make_tensor_value_info(f"o{i}", F, [1, 4, 5, 5]) for i in range(n)],
                              initializer=[w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)],
                             ir_version=9)


@pytest.mark.parametrize("lookups", [1, 64])
def test_bodies_read_at_once_shapes_of_names_declared_twice(lookups, monkeypatch):
    """Shapes a body declares twice, read at once (the TypeProtos left pending, looked up
    there or the table made past _LOOKUPS names): the last declaration, as the objects
    writer's table has it, for the check and for the writer's bytes; the wrong one last gives
    the objects writer's error."""
    monkeypatch.setattr(TypeTable, "LOOKUPS", lookups)
    ran = _bulk_spy(monkeypatch)
    for lowering in (Lowering.NATIVE, Lowering.DECOMPOSE):  # the check reads the shape; the decomposition too
        _same_bytes(_deform_in_branches(4), lowering=lowering)
        wrong = _deform_in_branches(2, wrong_last=True)
        with pytest.raises(GraphkitError) as fast:  # a ValidationError (the check) or a RewriteError
            lower_bytes(wrong.SerializeToString(), wrong, registry=default_registry(), prefer=(lowering,))
        with pytest.raises(GraphkitError) as slow:
            rewrite_model(wrong, lowering=lowering)
        assert str(fast.value) == str(slow.value) and "offset height is 7" in str(fast.value)
    assert ran and all(ran), ran


@pytest.mark.parametrize("late", ["initializer", "outer_value_info", "sibling_reuse"])
def test_bodies_not_read_at_once_past_the_first_blocks(late, monkeypatch):
    """Bodies read a block at a time (two graphs a block here) until one in the last block is
    not of that form: the graph-by-graph pass then reads them all (nothing the first blocks
    read is kept), the objects writer's bytes; two sibling branches defining one name: the
    objects writer, as for a model of one block."""
    monkeypatch.setattr(body_splice, "BLOCK", 2)
    model = _if_model(7)
    branch = model.graph.node[-1].attribute[0].g
    if late == "initializer":
        branch.initializer.append(numpy_helper.from_array(np.ones((1, 4), np.float32), "late_w"))
    elif late == "outer_value_info":
        branch.value_info.append(helper.make_tensor_value_info("x", F, [1, 4]))
    else:
        for attr in model.graph.node[-1].attribute:
            out = attr.g.node[0].output[0]
            attr.g.node[0].output[0] = "shared"
            attr.g.node.append(helper.make_node("Identity", ["shared"], [out]))
        steps_aside(model, "sibling subgraphs both define 'shared'")
        return
    ran = _bulk_spy(monkeypatch)
    _same_bytes(model)
    assert ran and not any(ran), ran


def test_bodies_read_at_once_compute_what_the_placeholders_stand_for():
    """Loop bodies with several placeholders and Scan bodies, rewritten, against numpy."""
    from graphkit.runtime import open_session

    x = np.array([-1.0, 0.5, 2.0], np.float32)
    got = open_session(onnx.ModelProto.FromString(_same_bytes(_loop_bodies_rich(2)))).run({"x": x})
    v = x
    for _ in range(2):  # two Loops of two trips each
        for _ in range(2):
            s = np.arcsinh(2 * v + x)
            v = 2 * s + s
    np.testing.assert_allclose(got["o1"], v, rtol=1e-5)
    rows = np.arange(12, dtype=np.float32).reshape(4, 3)
    b = np.array([1.0, -2.0, 0.5], np.float32)
    got = open_session(onnx.ModelProto.FromString(_same_bytes(_scan_bodies(2)))).run({"x": rows, "b": b})
    np.testing.assert_allclose(got["o1"], 2 * (2 * rows + b) + b, rtol=1e-6)


def test_bodies_writer_from_threads(monkeypatch):
    """Threads rewriting bodies at once, the skeleton message classes made by whichever comes
    first (once): every output the objects writer's."""
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setattr(wire.Skeletons, "node", None)
    model = _scaling("if_bodies", 30)
    data = model.SerializeToString()
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: rewrite_bytes(data), range(8)))
    assert {report.writer for _, report in results} == {"bytes"}
    assert {out for out, _ in results} == {rewrite_model(model)[0].SerializeToString()}


@pytest.mark.parametrize("case", ["if_bodies", "loop_bodies", "loop_rich", "scan"])
def test_bodies_read_at_once_give_the_graph_by_graph_table(case, monkeypatch):
    """The declarations read at once leave the type table the graph-by-graph pass leaves:
    element types, TypeProtos (made when first asked for), names left untyped, op counts,
    the scopes holding placeholders (paths and placeholder indices)."""
    from operator import attrgetter

    model = {"if_bodies": lambda: _scaling("if_bodies", 6), "loop_bodies": lambda: _scaling("loop_bodies", 6),
             "loop_rich": lambda: _loop_bodies_rich(4), "scan": lambda: _scan_bodies(4),
             "cuts_in_another_order": lambda: _four_or_two(4)}[case]()
    data = model.SerializeToString()
    nodes = model.graph.node
    top = wire.entries(data, 0, len(data))
    _, _, g0, g1 = next(e for e in top if e[0] == 7)
    starts, ends, _ = wire.node_entries(data, g0, g1)
    domains, op_types = list(map(attrgetter("domain"), nodes)), list(map(attrgetter("op_type"), nodes))
    holders = [i for i, n in enumerate(nodes) if any(a.type == onnx.AttributeProto.GRAPH for a in n.attribute)]
    tables = [body_scopes.BodyScopes(model, default_registry(), body_splice.SpliceGraph(model.graph, ()), domains, op_types,
                                holders, forward=False, data=data, spans=spans) for spans in ((starts, ends), None)]
    bulk, one_by_one = tables
    assert bulk.bulk and not one_by_one.bulk
    # a TypeProto asked for before the table is made is found in what is pending (the last
    # declaration of its name), then remembered; past LOOKUPS names the table is made
    table, want_table = bulk.table, one_by_one.table
    asked = [*want_table._types, "no such name"]
    monkeypatch.setattr(TypeTable, "LOOKUPS", len(asked) + 1)
    for name in asked * 2:
        got, want = table._type(name), want_table._type(name)
        assert (got and got.SerializeToString()) == (want and want.SerializeToString()), name
    assert table._types_pending is not None
    monkeypatch.setattr(TypeTable, "LOOKUPS", 1)
    assert table._type("not asked yet") is None
    assert table._types_pending is None  # made at once now
    assert table._elem == want_table._elem and table._defined == want_table._defined
    assert {k: v.SerializeToString() for k, v in table._types.items()} == {
        k: v.SerializeToString() for k, v in want_table._types.items()}
    assert +bulk.counts == +one_by_one.counts
    assert [(s.path, s.custom) for s in bulk.scopes] == [(s.path, s.custom) for s in one_by_one.scopes if s.custom
                                                          or not s.path]


@pytest.mark.parametrize("reuse", ["then_of_first_and_last", "untyped_and_typed", "none"])
def test_bodies_names_defined_twice_across_blocks_go_graph_by_graph(reuse, monkeypatch):
    """A name two bodies define (sibling graphs: allowed), found only when a later block is read
    (blocks of 2 holders here): the declarations read at once are dropped and the graph-by-graph
    pass finds it, which hands the model to the objects writer (a type table per scope); typed
    in one body and untyped in the other is found too."""
    monkeypatch.setattr(body_splice, "BLOCK", 2)
    cond = helper.make_node("Constant", [], ["c"], value=helper.make_tensor("v", TensorProto.BOOL, [], [True]))
    nodes, prev, n = [cond], "x", 6
    for i in range(n):
        def body(tag: str) -> onnx.GraphProto:
            inner = f"{tag}{i}w"
            if reuse == "then_of_first_and_last" and tag == "t" and i in (0, n - 1):
                inner = "shared"
            if reuse == "untyped_and_typed" and tag == "e" and i in (0, n - 1):
                inner = "shared"
            declared = [helper.make_tensor_value_info(inner, TensorProto.FLOAT, [1, 4])] if (
                reuse != "untyped_and_typed" or i == 0) else []
            return helper.make_graph([helper.make_node("Relu", [prev], [inner]),
                                      helper.make_node("my_add", [inner, inner], [f"{tag}{i}"], domain="custom")],
                                     f"{tag}{i}", [], [helper.make_tensor_value_info(f"{tag}{i}", TensorProto.FLOAT,
                                                                                      [1, 4])], value_info=declared)
        nodes.append(helper.make_node("If", ["c"], [f"o{i}"], then_branch=body("t"), else_branch=body("e")))
        prev = f"o{i}"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)],
                              ir_version=8)
    ran = _bulk_spy(monkeypatch)
    out, report = rewrite_bytes(model.SerializeToString())
    assert report.writer == ("bytes" if reuse == "none" else "objects")
    assert ran == [reuse == "none"], ran
    assert out == rewrite_model(model)[0].SerializeToString()
