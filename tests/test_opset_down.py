"""graphkit.export._opset_down: the dynamo exporter's opset-18 model brought down to an older
opset by graphkit's converter (graphkit.rewrite.convert.opset), and, where a node holding
subgraphs has no adapter, by onnx's version converter with what it gets wrong fixed in every
graph, subgraph and model-local function."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from graphkit.errors import ExportError
from graphkit.export._opset_down import convert_down, split_without_num_outputs
from graphkit.rewrite.graph.walk import node_lists
from scaling_models import if_chain_18

ort = pytest.importorskip("onnxruntime")

F = TensorProto.FLOAT


def _split(x: str, outs: list[str], n: int) -> onnx.NodeProto:
    return helper.make_node("Split", [x], outs, axis=1, num_outputs=n)


def _model() -> onnx.ModelProto:
    """Opset 18; x: float[2, 7]. Split-18 into 3 (sizes 3, 3, 1) in the main graph, in an If
    branch and in a local function, which also has a ReduceMean-18:

        x ─ Split ─ a0 a1 a2 ─ Concat(a2, a0) ─> m                      (main graph)
        c ─ If ─> y     then: Split(x) ─ t0 t1 t2 ─ Concat(t2, t1) ─> t   else: Identity(x)
        x ─ local.tail ─> z     body: Split(u) ─ p0 p1 p2; ReduceMean(p0, axes=[1]) ─> r;
                                      Add(p2, r) ─> v
    """
    then = helper.make_graph([_split("x", ["t0", "t1", "t2"], 3), helper.make_node("Concat", ["t2", "t1"], ["t"], axis=1)],
                             "then", [], [helper.make_tensor_value_info("t", F, [2, 4])])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", F, [2, 7])])
    axes = helper.make_node("Constant", [], ["ax"], value=helper.make_tensor("ax", TensorProto.INT64, [1], [1]))
    tail = helper.make_function(
        "local", "tail", ["u"], ["v"],
        [_split("u", ["p0", "p1", "p2"], 3), axes,
         helper.make_node("ReduceMean", ["p0", "ax"], ["r"], keepdims=1, noop_with_empty_axes=0),
         helper.make_node("Add", ["p2", "r"], ["v"])],
        [helper.make_opsetid("", 18)])
    tail.value_info.append(helper.make_tensor_value_info("u", F, [2, 7]))
    graph = helper.make_graph(
        [_split("x", ["a0", "a1", "a2"], 3), helper.make_node("Concat", ["a2", "a0"], ["m"], axis=1),
         helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other),
         helper.make_node("tail", ["x"], ["z"], domain="local")],
        "g", [helper.make_tensor_value_info("x", F, [2, 7]), helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("m", F, [2, 4]), helper.make_tensor_value_info("y", F, [2, "w"]),
         helper.make_tensor_value_info("z", F, [2, 1])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("local", 1)],
                             functions=[tail], ir_version=10)


def _expected(x: np.ndarray) -> dict[str, np.ndarray]:
    a0, a1, a2 = x[:, :3], x[:, 3:6], x[:, 6:]
    return {"m": np.concatenate([a2, a0], axis=1), "y": np.concatenate([a2, a1], axis=1),
            "z": a2 + a0.mean(axis=1, keepdims=True)}


def test_split_is_fixed_in_if_bodies_and_local_functions():
    x = np.arange(14, dtype=np.float32).reshape(2, 7)
    at18 = ort.InferenceSession(_model().SerializeToString()).run(None, {"x": x, "c": np.array(True)})
    assert all(np.allclose(g, w) for g, w in zip(at18, _expected(x).values()))  # the model is right at 18
    out = convert_down(_model(), 17)
    assert [(i.domain, i.version) for i in out.opset_import] == [("", 17), ("local", 1)]
    (fn,) = out.functions
    assert [(i.domain, i.version) for i in fn.opset_import] == [("", 17)]
    for nodes, _ in node_lists(out):
        for node in nodes:
            assert node.domain in ("", "local")
            assert "num_outputs" not in {a.name for a in node.attribute}, node
            assert "noop_with_empty_axes" not in {a.name for a in node.attribute}, node
    onnx.checker.check_model(out)
    got = ort.InferenceSession(out.SerializeToString()).run(None, {"x": x, "c": np.array(True)})
    for name, g, w in zip(("m", "y", "z"), got, _expected(x).values()):
        np.testing.assert_allclose(g, w, rtol=1e-6, err_msg=name)


def test_a_split_of_unknown_length_gets_its_sizes_from_the_shape():
    model = _model()
    model.functions[0].ClearField("value_info")  # the body's Split no longer knows its length
    out = convert_down(model, 17)
    (split,) = [n for n in out.functions[0].node if n.op_type == "Split"]
    assert [a.name for a in split.attribute] == ["axis"] and len(split.input) == 2
    onnx.checker.check_model(out)
    x = np.arange(14, dtype=np.float32).reshape(2, 7)
    got = ort.InferenceSession(out.SerializeToString()).run(None, {"x": x, "c": np.array(True)})
    np.testing.assert_allclose(got[2], _expected(x)["z"], rtol=1e-6)


# -- Split at every opset: sizes of unknown lengths, below 13 (attribute), below 11 (axis) --------

def _split_model(length, *, parts: int = 3, axis: int = 1, sizes: list[int] | None = None,
                 computed_sizes: bool = False, with_if: bool = True) -> onnx.ModelProto:
    """Opset 18; x: float[2, length]. The same Split (num_outputs=parts, or the split input
    ``sizes``: a Constant, or computed from it when ``computed_sizes``) in the main graph, in
    both branches of an If (``with_if``: onnx's converter has no If adapter below 16) and in a
    local function, each concatenated back reversed:

        x ─ Split ─ p0..pk ─ Concat(pk..p0) ─> m
        c ─ If ─> y      then/else: the same on x ─> t / e   (else: y = Neg(Neg(m)))
        x ─ local.rev ─> z
    """
    def nodes(prefix: str, x: str, out: str) -> list[onnx.NodeProto]:
        made, inputs = [], [x]
        if sizes is not None:
            made.append(helper.make_node("Constant", [], [f"{prefix}sz"], value=helper.make_tensor(
                f"{prefix}sz", TensorProto.INT64, [len(sizes)], sizes)))
            if computed_sizes:
                made.append(helper.make_node("Max", [f"{prefix}sz", f"{prefix}sz"], [f"{prefix}sz2"]))
            inputs.append(f"{prefix}sz2" if computed_sizes else f"{prefix}sz")
        count = len(sizes) if sizes is not None else parts
        outs = [f"{prefix}p{i}" for i in range(count)]
        split = helper.make_node("Split", inputs, outs, name=f"{prefix}split", axis=axis,
                                 **({} if sizes is not None else {"num_outputs": parts}))
        return [*made, split, helper.make_node("Concat", outs[::-1], [out], axis=axis)]

    def vi(name):
        return helper.make_tensor_value_info(name, F, [2, length])

    branch = {k: helper.make_graph(nodes(f"{k[0]}_", "x", k[0]), k, [], [vi(k[0])]) for k in ("then", "else")}
    rev = helper.make_function("local", "rev", ["u"], ["v"], nodes("f_", "u", "v"), [helper.make_opsetid("", 18)])
    rev.value_info.append(helper.make_tensor_value_info("u", F, [2, length]))
    middle = ([helper.make_node("If", ["c"], ["y"], then_branch=branch["then"], else_branch=branch["else"])] if with_if
              else [helper.make_node("Neg", ["m"], ["nm"]), helper.make_node("Neg", ["nm"], ["y"])])
    graph = helper.make_graph(
        [*nodes("m_", "x", "m"), *middle, helper.make_node("rev", ["x"], ["z"], domain="local")],
        "g", [vi("x"), helper.make_tensor_value_info("c", TensorProto.BOOL, [])], [vi("m"), vi("y"), vi("z")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("local", 1)],
                             functions=[rev], ir_version=10)


def _reversed_parts(x: np.ndarray, parts: int, sizes: list[int] | None = None) -> np.ndarray:
    length = x.shape[1]
    if sizes is None:  # opset 18: ceil-sized parts, the last one the rest
        chunk = -(-length // parts)
        sizes = [chunk] * (parts - 1) + [length - chunk * (parts - 1)]
    cuts = np.cumsum(sizes)[:-1]
    return np.concatenate(np.split(x, cuts, axis=1)[::-1], axis=1)


def _splits(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for nodes, _ in node_lists(model) for n in nodes if n.op_type == "Split"]


def _runs_as_opset_18(out: onnx.ModelProto, lengths, parts: int, sizes=None) -> None:
    onnx.checker.check_model(out)
    session = ort.InferenceSession(out.SerializeToString())
    for length in lengths:
        x = np.arange(2 * length, dtype=np.float32).reshape(2, length)
        want = _reversed_parts(x, parts, sizes)
        for c in (True, False):
            for name, got in zip(("m", "y", "z"), session.run(None, {"x": x, "c": np.array(c)})):
                np.testing.assert_array_equal(got, want, err_msg=f"{name} length={length} c={c}")


@pytest.mark.parametrize("opset", [17, 16, 13])
def test_unknown_lengths_split_as_opset_18_from_the_shape(opset):
    out = convert_down(_split_model("w", with_if=opset >= 16), opset)
    assert all(len(s.input) == 2 and [a.name for a in s.attribute] == ["axis"] for s in _splits(out))
    _runs_as_opset_18(out, [7, 9, 6, 2], parts=3)  # uneven, uneven, even, an empty last part


def _fixed_at(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """``model``'s Splits brought to ``opset`` as convert_down does after the converter: below
    13, onnx's converter has no adapter for nearly any op (Concat, Neg, Identity, If...), so
    these cases start where it would leave the model (imports at ``opset``, Splits as they were)."""
    for imports in (model.opset_import, *(fn.opset_import for fn in model.functions)):
        for i in imports:
            if i.domain == "":
                i.version = opset
    split_without_num_outputs(model, opset)
    return model


@pytest.mark.parametrize("opset", [12, 11, 10])
def test_below_13_the_sizes_are_an_attribute(opset):
    out = _fixed_at(_split_model(7, with_if=False), opset)
    assert [i.version for i in out.opset_import if i.domain == ""] == [opset]
    for split in _splits(out):
        assert len(split.input) == 1
        assert {a.name: helper.get_attribute_value(a) for a in split.attribute} == {"axis": 1, "split": [3, 3, 1]}
    _runs_as_opset_18(out, [7], parts=3)
    even = _fixed_at(_split_model(6, with_if=False), opset)
    assert all([a.name for a in s.attribute] == ["axis"] for s in _splits(even))
    _runs_as_opset_18(even, [6], parts=3)


def test_below_13_a_constant_split_input_becomes_the_attribute():
    out = _fixed_at(_split_model(7, sizes=[1, 4, 2], with_if=False), 12)
    assert all(helper.get_attribute_value(s.attribute[-1]) == [1, 4, 2] and len(s.input) == 1 for s in _splits(out))
    _runs_as_opset_18(out, [7], parts=3, sizes=[1, 4, 2])


def test_below_11_a_negative_axis_counts_from_the_front():
    out = _fixed_at(_split_model(7, axis=-1, with_if=False), 10)
    assert all(helper.get_attribute_value(s.attribute[0]) == 1 for s in _splits(out))
    _runs_as_opset_18(out, [7], parts=3)


@pytest.mark.parametrize("make, opset, words", [
    (lambda: _split_model("w", with_if=False), 12, "unknown length into 3 parts"),
    (lambda: _split_model(7, sizes=[1, 4, 2], computed_sizes=True, with_if=False), 12, "part sizes 'm_sz2' are computed"),
    (lambda: _split_model(5, parts=4, with_if=False), 17, "opset 18 refuses it"),
], ids=["unknown-length-below-13", "computed-sizes-below-13", "negative-last-part"])
def test_a_split_that_cannot_be_written_is_refused_naming_the_node(make, opset, words):
    with pytest.raises(ExportError) as info:
        _fixed_at(make(), opset)
    assert words in info.value.message and info.value.op == "Split" and info.value.hint
    assert info.value.node in ("m_split", "t_split", "e_split", "f_split")


def test_below_11_a_negative_axis_of_unknown_rank_is_refused():
    model = _split_model(7, axis=-1, sizes=[3, 3, 1], with_if=False)
    for vi in (*model.graph.input, *model.graph.output, *model.functions[0].value_info):
        vi.type.tensor_type.ClearField("shape")
    with pytest.raises(ExportError, match="counts from the back") as info:
        _fixed_at(model, 10)
    assert info.value.hint == "export at opset >= 11, or give the input a shape"


def test_sibling_branches_split_inputs_of_their_own_length():
    """Both branches split a value named "u" into 3, of length 7 in one (Neg(x)) and 14 in
    the other (Concat(x, x)): each Split gets the sizes of its own branch's "u" (a name ->
    type map over the whole model gave both the first one's)."""
    def branch(name: str, make_u: onnx.NodeProto, length: int) -> onnx.GraphProto:
        return helper.make_graph(
            [make_u, helper.make_node("Split", ["u"], ["p0", "p1", "p2"], axis=1, num_outputs=3),
             helper.make_node("Concat", ["p2", "p0"], [name], axis=1)], name, [],
            [helper.make_tensor_value_info(name, F, [2, None])],
            value_info=[helper.make_tensor_value_info("u", F, [2, length])])

    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=branch("t", helper.make_node("Neg", ["x"], ["u"]), 7),
                          else_branch=branch("e", helper.make_node("Concat", ["x", "x"], ["u"], axis=1), 14))], "g",
        [helper.make_tensor_value_info("x", F, [2, 7]), helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", F, [2, None])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    out = convert_down(model, 17)
    assert sorted(_constants(out).values()) == [[3, 3, 1], [5, 5, 4]]
    session = ort.InferenceSession(out.SerializeToString())
    x = np.arange(14, dtype=np.float32).reshape(2, 7)
    (then,) = session.run(None, {"x": x, "c": np.array(True)})
    (other,) = session.run(None, {"x": x, "c": np.array(False)})
    np.testing.assert_array_equal(then, -np.concatenate([x[:, 6:], x[:, :3]], axis=1))
    doubled = np.concatenate([x, x], axis=1)
    np.testing.assert_array_equal(other, np.concatenate([doubled[:, 10:], doubled[:, :5]], axis=1))


def _constants(model: onnx.ModelProto) -> dict[str, list]:
    """The main graph's initializers and every graph's Constant nodes: name -> values."""
    found = {t.name: onnx.numpy_helper.to_array(t).tolist() for t in model.graph.initializer}
    found.update((n.output[0], onnx.numpy_helper.to_array(n.attribute[0].t).tolist())
                 for nodes, _ in node_lists(model) for n in nodes if n.op_type == "Constant")
    return found


def _ref(name: str, ref: str) -> onnx.AttributeProto:
    attr = onnx.AttributeProto(name=name, ref_attr_name=ref, type=onnx.AttributeProto.INT)
    return attr


def _attribute_model() -> onnx.ModelProto:
    """Opset 18; x: float[3, 3]. Functions that read their caller's attribute values:

        local.pick(u; ax):  Gather(u, [1], axis=@ax) ─ ReduceSum(axes=[0]) ─> s     (a Gather in an If
                            branch: the reference sits in a nested graph)
        local.outer(w; bx): pick(w; ax=@bx) ─ Neg ─> n                             (passes its attribute on)
        local.plain(q):     ReduceSum-18 with noop_with_empty_axes=0 ─> r        (no references: stays a function)
        main: pick(x; ax=1) ─> p, outer(x; bx=1) ─> o, plain(x) ─> r

    ax=1 is not the default (0): a converter that loses the reference gives x[1, :] sums."""
    one = helper.make_node("Constant", [], ["one"], value=helper.make_tensor("one", TensorProto.INT64, [1], [1]))
    zero = helper.make_node("Constant", [], ["zero"], value=helper.make_tensor("zero", TensorProto.INT64, [1], [0]))
    gather = helper.make_node("Gather", ["u", "one"], ["g"])
    gather.attribute.append(_ref("axis", "ax"))
    branch = helper.make_graph([gather], "then", [], [helper.make_tensor_value_info("g", F, ["a", "b"])])
    other = helper.make_graph([helper.make_node("Identity", ["u"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", F, ["a", "b"])])
    cond = helper.make_node("Constant", [], ["c"], value=helper.make_tensor("c", TensorProto.BOOL, [], [True]))
    pick = helper.make_function(
        "local", "pick", ["u"], ["s"],
        [one, zero, cond, helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=other),
         helper.make_node("ReduceSum", ["y", "zero"], ["s"], keepdims=0)],
        [helper.make_opsetid("", 18)], attributes=["ax"])
    call = helper.make_node("pick", ["w"], ["t"], domain="local")
    call.attribute.append(_ref("ax", "bx"))
    outer = helper.make_function("local", "outer", ["w"], ["n"], [call, helper.make_node("Neg", ["t"], ["n"])],
                                 [helper.make_opsetid("", 18), helper.make_opsetid("local", 1)], attributes=["bx"])
    plain = helper.make_function(
        "local", "plain", ["q"], ["r"],
        [zero, helper.make_node("ReduceSum", ["q", "zero"], ["r"], keepdims=0, noop_with_empty_axes=0)],
        [helper.make_opsetid("", 18)])
    graph = helper.make_graph(
        [helper.make_node("pick", ["x"], ["p"], domain="local", ax=1),
         helper.make_node("outer", ["x"], ["o"], domain="local", bx=1),
         helper.make_node("plain", ["x"], ["r"], domain="local")],
        "g", [helper.make_tensor_value_info("x", F, [3, 3])],
        [helper.make_tensor_value_info(n, F, ["n"]) for n in ("p", "o", "r")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("local", 1)],
                             functions=[pick, outer, plain], ir_version=10)


def test_a_function_reading_its_callers_attribute_keeps_the_callers_value():
    x = np.arange(9, dtype=np.float32).reshape(3, 3)
    at18 = ort.InferenceSession(_attribute_model().SerializeToString()).run(None, {"x": x})
    np.testing.assert_array_equal(at18[0], [x[:, 1].sum()])  # axis=1 taken from the call
    out = convert_down(_attribute_model(), 17)
    got = ort.InferenceSession(out.SerializeToString()).run(None, {"x": x})
    for name, g, w in zip(("p", "o", "r"), got, at18):
        np.testing.assert_array_equal(g, w, err_msg=name)
    # graphkit's converter converts each body as what it is: the functions and their references stay
    assert [fn.name for fn in out.functions] == ["pick", "outer", "plain"]
    assert sum(a.ref_attr_name != "" for nodes, _ in node_lists(out) for n in nodes for a in n.attribute) == 2
    assert all(i.version == 17 for fn in out.functions for i in fn.opset_import if i.domain == "")
    onnx.checker.check_model(out)


def test_the_split_sizes_constant_takes_a_name_nothing_else_has():
    """x: float[2, 7] split unevenly by a node named "s"; the model already has a tensor named
    "s_split_sizes" (an input) and two Splits named "s" (one in an If branch)."""
    then = helper.make_graph([helper.make_node("Split", ["x"], ["t0", "t1", "t2"], name="s", axis=1, num_outputs=3)],
                             "then", [], [helper.make_tensor_value_info("t2", F, [2, 1])])
    other = helper.make_graph([helper.make_node("Identity", ["w"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", F, [2, 1])])
    graph = helper.make_graph(
        [helper.make_node("Split", ["x"], ["a0", "a1", "a2"], name="s", axis=1, num_outputs=3),
         helper.make_node("Add", ["a2", "s_split_sizes"], ["m"]),
         helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
        "g", [helper.make_tensor_value_info("x", F, [2, 7]), helper.make_tensor_value_info("s_split_sizes", F, [2, 1]),
              helper.make_tensor_value_info("w", F, [2, 1]), helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("m", F, [2, 1]), helper.make_tensor_value_info("y", F, [2, 1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    out = convert_down(model, 17)
    made = _constants(out)  # one for both Splits (the same sizes; the If branch reads the main graph's)
    assert list(made.values()) == [[3, 3, 1]] and "s_split_sizes" not in made, made
    onnx.checker.check_model(out)
    x = np.arange(14, dtype=np.float32).reshape(2, 7)
    feeds = {"x": x, "s_split_sizes": np.full((2, 1), 10, np.float32), "w": np.zeros((2, 1), np.float32),
             "c": np.array(True)}
    m, y = ort.InferenceSession(out.SerializeToString()).run(None, feeds)
    np.testing.assert_array_equal(m, x[:, 6:] + 10)
    np.testing.assert_array_equal(y, x[:, 6:])


@pytest.mark.parametrize("opset", [12, 13])
def test_graphkits_converter_brings_splits_and_if_bodies_below_16(opset):
    """onnx's converter has no If adapter below 16 and none for most ops below 13; graphkit's
    converter (rewrite/convert/opset.py) takes the model, If bodies and function included, down."""
    out = convert_down(_split_model(7), opset)
    assert [i.version for i in out.opset_import if i.domain == ""] == [opset]
    assert all("num_outputs" not in {a.name for a in s.attribute} for s in _splits(out))
    _runs_as_opset_18(out, [7], parts=3)


def test_convert_down_refuses_an_unknown_length_below_13_naming_the_node():
    with pytest.raises(ExportError) as info:
        convert_down(_split_model("w"), 12)
    err = info.value
    assert "unknown length into 3 parts" in err.message and err.op == "ai.onnx::Split"
    assert err.node in ("m_split", "t_split", "e_split", "f_split")
    assert "export at an opset of at least 13" in err.hint and "dynamo=False" in err.hint


def test_a_node_holding_subgraphs_no_adapter_covers_leaves_the_model_to_onnx():
    """If going below 12 (If-11 -> 10) has no adapter here: onnx's converter takes the whole
    model (and has none either: its error, as ConverterError)."""
    from graphkit.export._opset_down import ConverterError

    with pytest.raises(ConverterError, match="No Adapter From Version \\$16 for If"):
        convert_down(_split_model(7), 10)


def test_convert_down_cost_grows_linearly_in_if_bodies():
    """8x the If bodies (and the values around them) cost about 8x: graphkit's converter
    looks at each node once (onnx's converter on the whole model: 30x and more per 8x, its
    shape inference copying the outer scope's types into every body)."""
    import time

    def seconds(n: int) -> float:
        model = if_chain_18(n)
        start = time.process_time()
        out = convert_down(model, 17)
        spent = time.process_time() - start
        assert [i.version for i in out.opset_import if i.domain == ""] == [17]
        return spent

    seconds(100)
    ratio = min(seconds(800), seconds(800)) / min(seconds(100), seconds(100))
    assert ratio < 20, f"8x the If bodies took {ratio:.1f}x the time (linear is ~8x; onnx's converter 47x)"
    small = if_chain_18(3, relus=1)
    out = convert_down(if_chain_18(3, relus=1), 17)
    means = [n for nodes, _ in node_lists(out) for n in nodes if n.op_type == "ReduceMean"]
    assert len(means) == 3 and all(len(n.input) == 1 and [a.name for a in n.attribute] == ["keepdims", "axes"]
                                   for n in means)
    x = np.random.default_rng(0).standard_normal([1, 4]).astype(np.float32)
    (got,) = ort.InferenceSession(out.SerializeToString()).run(None, {"x": x})
    (want,) = ort.InferenceSession(small.SerializeToString()).run(None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_the_benchmark_runs_both_converters_on_the_same_models():
    """bench/opset_down_scaling.py: graphkit's converter and onnx's on the whole model, a row per count."""
    import subprocess
    import sys

    from conftest import REPO

    proc = subprocess.run([sys.executable, str(REPO / "bench" / "opset_down_scaling.py"), "--ifs", "5,10",
                           "--relus", "1"], capture_output=True, text=True, check=True)
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| 5 ") or line.startswith("| 10 ")]
    assert len(rows) == 2 and all(row.rstrip().endswith("x |") for row in rows), proc.stdout
