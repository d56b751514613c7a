"""Simplify through custom ops, for every op graphkit's registry knows (issue 26 item 2):
shapes past the op come from its OpDef's ``infer_shapes`` (without it the shape chain
stays), a node of it on constants folds, evaluated by its kernel, to what ONNX Runtime
computes; an op with only a torch reference folds by it; a node whose evaluation fails is
kept, and ``--explain`` says why."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import assert_same_outputs
from graphkit.ops import OpDef, OpRegistry, Param, default_registry
from graphkit.rewrite.simplify import simplify_model
from tests.conftest import run_cli

F = TensorProto.FLOAT
BATCHES = (1, 3)


def vi(name, dims, elem=F):
    return helper.make_tensor_value_info(name, elem, dims)


def model_of(nodes, inputs, outputs, inits=(), opset=18, domain="custom"):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(domain, 1)],
                             ir_version=9)


def run(model, feeds):
    """ONNX Runtime's outputs with every custom node decomposed into standard ops (asinh has
    no native kernel; the decomposition is also another path than the kernels folding uses)."""
    from graphkit.rewrite import Lowering, rewrite_model
    from graphkit.runtime import open_session

    return open_session(rewrite_model(model, lowering=Lowering.DECOMPOSE)[0]).run(feeds)


def same_values(model, out, feeds_list):
    assert_same_outputs(run, model, out, feeds_list)


def ops(model):
    return [n.op_type for n in model.graph.node]


# Per op: its inputs (name -> dims, "n" the batch), which are weights (name -> array), its
# attributes, and its output's dims.
_rng = np.random.default_rng(11)
CASES = {
    "my_add": ({"a": ["n", 3], "b": ["n", 3]}, {}, {}, ["n", 3]),
    "asinh": ({"x": ["n", 5]}, {}, {}, ["n", 5]),
    "deform_conv2d": ({"input": ["n", 3, 8, 8], "offset": ["n", 18, 6, 6]},
                      {"weight": _rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
                       "bias": _rng.standard_normal(4).astype(np.float32)},
                      {"padding": [0, 0]}, ["n", 4, 6, 6]),
}


def _op(name):
    return default_registry().lookup("custom", name)


def _inputs(name):
    dynamic, weights, attrs, _ = CASES[name]
    names = [p.name for p in _op(name).inputs]
    names = names[:max(i for i, p in enumerate(names) if p in dynamic or p in weights) + 1]
    return [p if p in dynamic or p in weights else "" for p in names], dynamic, weights, attrs


def _feeds(dynamic, batch, seed):
    rng = np.random.default_rng(seed)
    return {k: (rng.standard_normal([batch if d == "n" else d for d in dims]) * 0.7).astype(np.float32)
            for k, dims in dynamic.items()}


def test_every_registered_op_has_a_case():
    assert {op.name for op in default_registry() if op.domain == "custom"} == set(CASES)


def _shape_model(name):
    """o = op(...); y = Reshape(o, Shape(o)); z = float(Shape(o)[1:])."""
    inputs, dynamic, weights, attrs = _inputs(name)
    out_dims = CASES[name][3]
    nodes = [helper.make_node(name, inputs, ["o"], domain="custom", **attrs),
             helper.make_node("Shape", ["o"], ["s"]), helper.make_node("Reshape", ["o", "s"], ["y"]),
             helper.make_node("Shape", ["o"], ["tail"], start=1), helper.make_node("Cast", ["tail"], ["z"], to=F)]
    inits = [numpy_helper.from_array(v, k) for k, v in weights.items()]
    return model_of(nodes, [vi(k, d) for k, d in dynamic.items()], [vi("y", out_dims), vi("z", [len(out_dims) - 1])],
                    inits)


@pytest.mark.parametrize("name", sorted(CASES))
def test_shapes_propagate_past_the_op_from_its_infer_shapes(name):
    model = _shape_model(name)
    out, _ = simplify_model(model)
    assert ops(out) == [name, "Constant"]  # the Reshape to its own shape gone, z a constant output
    same_values(model, out, [_feeds(CASES[name][0], b, seed=b) for b in BATCHES])

    # the same op without its shape function: nothing after it has a shape, the chain stays
    blind = dataclasses.replace(_op(name), infer_shapes=lambda shapes, attrs: [None])
    registry = OpRegistry([blind if op.name == name else op for op in default_registry()])
    kept, _ = simplify_model(model, registry=registry)
    assert "Shape" in ops(kept), ops(kept)


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_node_of_the_op_on_constants_folds_to_what_onnx_runtime_computes(name):
    inputs, dynamic, weights, attrs = _inputs(name)
    consts = {**{k: v for k, v in _feeds(dynamic, 2, seed=5).items()}, **weights}
    out_dims = [2 if d == "n" else d for d in CASES[name][3]]
    nodes = [helper.make_node(name, inputs, ["o"], domain="custom", **attrs),
             helper.make_node("Add", ["o", "x0"], ["y"])]
    inits = [numpy_helper.from_array(v, k) for k, v in consts.items()]
    model = model_of(nodes, [vi("x0", out_dims)], [vi("y", out_dims)], inits)
    out, report = simplify_model(model)
    assert ops(out) == ["Add"], (ops(out), report.kept)
    rng = np.random.default_rng(6)
    same_values(model, out, [{"x0": rng.standard_normal(out_dims).astype(np.float32)}])


def _user_op(reference, kernel=None):
    return OpDef(name="scaled_tanh", domain="acme", doc="2 tanh(x)", torch_namespace="acme",
                 inputs=(Param("x", "T"),), outputs=(Param("y", "T"),), type_constraints={"T": ("tensor(float)",)},
                 reference=reference, infer_shapes=lambda shapes, attrs: [shapes[0]], python_kernel=kernel)


def test_a_user_op_with_only_a_torch_reference_folds_by_it():
    torch = pytest.importorskip("torch")
    registry = OpRegistry([_user_op(lambda x: 2 * torch.tanh(x))])
    c = np.linspace(-2, 2, 5, dtype=np.float32)
    nodes = [helper.make_node("scaled_tanh", ["c"], ["k"], domain="acme"), helper.make_node("Add", ["x", "k"], ["y"])]
    model = model_of(nodes, [vi("x", ["n", 5])], [vi("y", ["n", 5])], [numpy_helper.from_array(c, "c")], domain="acme")
    out, _ = simplify_model(model, registry=registry)
    assert ops(out) == ["Add"]
    folded = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}[out.graph.node[0].input[1]]
    np.testing.assert_allclose(folded, 2 * np.tanh(c), rtol=1e-6)
    import onnxruntime as ort

    x = np.random.default_rng(7).standard_normal((3, 5)).astype(np.float32)
    got = ort.InferenceSession(out.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, x + 2 * np.tanh(c), rtol=1e-6)


def test_a_user_op_whose_kernel_raises_is_kept_with_the_reason():
    def kernel(x):
        raise ValueError("scaled_tanh needs positive inputs")

    registry = OpRegistry([_user_op(lambda x: None, kernel)])
    nodes = [helper.make_node("scaled_tanh", ["c"], ["k"], domain="acme", name="bad"),
             helper.make_node("Add", ["x", "k"], ["y"])]
    model = model_of(nodes, [vi("x", [5])], [vi("y", [5])], [numpy_helper.from_array(np.ones(5, np.float32), "c")],
                     domain="acme")
    out, report = simplify_model(model, registry=registry)
    assert ops(out) == ["scaled_tanh", "Add"]
    assert "positive inputs" in report.kept["acme::scaled_tanh bad"]


def test_explain_lists_each_node_kept_with_constant_inputs_and_why(tmp_path):
    one = helper.make_node("Constant", [], ["one"], value=numpy_helper.from_array(np.ones(1, np.float32)))
    nodes = [one, helper.make_node("Constant", [], ["shape"], value=numpy_helper.from_array(np.array([512, 1024])))]
    nodes += [helper.make_node("Expand", ["one", "shape"], ["big"], name="make_big"),
              helper.make_node("Add", ["x", "big"], ["y"])]
    for i in range(12):  # 12 Gathers out of range: --explain shows 10, --explain=all each
        nodes += [helper.make_node("Gather", ["data", "idx"], [f"g{i}"], name=f"bad_gather_{i}"),
                  helper.make_node("Cast", [f"g{i}"], [f"f{i}"], to=F), helper.make_node("Add", [f"f{i}", "x1"], [f"z{i}"])]
    inits = [numpy_helper.from_array(np.arange(3, dtype=np.int64), "data"), numpy_helper.from_array(np.int64(7), "idx")]
    outputs = [vi("y", [512, 1024])] + [vi(f"z{i}", [3]) for i in range(12)]
    model = model_of(nodes, [vi("x", [512, 1024]), vi("x1", [3])], outputs, inits, opset=17)
    src, dst = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save(model, src)
    text = run_cli("simplify", src, dst, "--explain", check_rc=0).stdout
    assert "kept with constant inputs: 13 node(s)" in text
    assert "make_big" in text and "over the size limit of 1,048,576 (--size-limit)" in text
    assert "out of range" in text and "3 more (--explain=all lists them)" in text
    full = run_cli("simplify", src, dst, "--explain=all", check_rc=0).stdout
    assert all(f"bad_gather_{i}" in full for i in range(12))
    folded = run_cli("simplify", src, dst, "--explain", "--size-limit", "4MiB", check_rc=0).stdout
    assert "make_big" not in folded and "Expand" not in ops(onnx.load(dst))


def test_graphsurgeons_fold_constants_stops_at_a_custom_op():
    """Why fold-constants is not onnx-graphsurgeon's (docs/simplify.md, "Where the passes come
    from"): its fold_constants evaluates through ONNX Runtime, which has no kernel for a
    custom op, so neither the custom node on constants nor the Shape after one folds."""
    gs = pytest.importorskip("onnx_graphsurgeon")
    const = helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.ones(3, np.float32)))
    nodes = [helper.make_node("my_add", ["x", "x"], ["m"], domain="custom"), helper.make_node("Shape", ["m"], ["s"]),
             helper.make_node("Reshape", ["m", "s"], ["y"]), const,
             helper.make_node("my_add", ["c", "c"], ["k"], domain="custom"), helper.make_node("Add", ["y", "k"], ["z"])]
    model = model_of(nodes, [vi("x", [2, 3])], [vi("z", [2, 3])], opset=17)
    graph = gs.import_onnx(model)
    graph.fold_constants().cleanup()
    assert ops(gs.export_onnx(graph)) == ["my_add", "Shape", "Reshape", "my_add", "Add"]
    out, _ = simplify_model(model)
    assert ops(out) == ["my_add", "Add"]
    same_values(model, out, [{"x": np.random.default_rng(9).standard_normal((2, 3)).astype(np.float32)}])


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_the_dcn_resnets_batchnorms_fold_into_its_deform_conv2d(tmp_path, exporter):
    """The corpus's DCN ResNet (small config, dynamic batch), the row where graphkit has
    fewer nodes than every contender (docs/simplify.md): no BatchNormalization is left
    after a deform_conv2d, each one that was there is gone, and ONNX Runtime's values stay
    within 1e-5 of their scale at both batch sizes."""
    pytest.importorskip("torch")
    pytest.importorskip("onnxscript")
    import simplify_models as sm

    from graphkit.rewrite.simplify import simplify_file
    from graphkit.runtime import open_session

    entry = sm.export_entry(sm.MODELS["dcn_resnet"](True), exporter, True, tmp_path)
    assert entry.error is None, entry.error

    def after_deform(model):
        made = {o for n in model.graph.node if n.op_type == "deform_conv2d" for o in n.output}
        return [n for n in model.graph.node if n.op_type == "BatchNormalization" and n.input[0] in made]

    before = onnx.load(entry.path)
    small = tmp_path / "small.onnx"
    simplify_file(entry.path, small)
    after = onnx.load(small)
    assert after_deform(before) and not after_deform(after)
    assert ops(after).count("BatchNormalization") == ops(before).count("BatchNormalization") - len(after_deform(before))
    want, got = open_session(entry.path), open_session(small)
    for feeds in entry.feeds:
        for w, g in zip(want.run(feeds).values(), got.run(feeds).values()):
            scale = max(float(np.max(np.abs(w))), 1e-30)
            assert float(np.max(np.abs(g.astype(np.float64) - w))) <= 1e-5 * scale
