"""Symbolic dims past ONNX inference (simplify's _shapes): where a dim comes out of a Range,
a broadcast, a MatMul, an Expand, a Reshape's -1 or a Concat, inference names it unk__N;
graphkit proves it equal to the input's dim where every input the op accepts makes it so,
and the Reshape targets computed from it fold. Each rule: a model that folds, one that must
not (the dims are not provably equal), and ONNX Runtime before and after at two shapes."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from graphkit.ops import default_registry
from graphkit.rewrite.simplify import simplify_model, simplify_options
from graphkit.rewrite.simplify._shapes import simplify_types

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def model_of(nodes, inputs, outputs, initializers=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def vi(name, dims, elem=F):
    return helper.make_tensor_value_info(name, elem, dims)


def ints(name, values):
    return numpy_helper.from_array(np.asarray(values, np.int64), name)


def node(op, ins, outs, **attrs):
    return helper.make_node(op, ins, outs, **attrs)


def dim_of(src, axis, out):
    """out = [Shape(src)[axis]] (1-D), as TorchScript writes it."""
    return [node("Shape", [src], [out + "_s"]), node("Gather", [out + "_s", f"i{axis}"], [out + "_g"], axis=0),
            node("Unsqueeze", [out + "_g", "ax0"], [out])]


COMMON = [ints("i0", 0), ints("i1", 1), ints("i2", 2), ints("i3", 3), ints("ax0", [0]), ints("minus1", [-1])]


def dims(model, name):
    return simplify_types(model, default_registry()).dims(name)


def simplified(model):
    out, _ = simplify_model(model, options=simplify_options())
    return out


def ops(model):
    return [n.op_type for n in model.graph.node]


def same_values(model, out, feeds_list):
    import onnxruntime as ort

    for feeds in feeds_list:
        want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
        got = ort.InferenceSession(out.SerializeToString()).run(None, feeds)
        for w, g in zip(want, got):
            assert w.shape == g.shape
            np.testing.assert_allclose(g, w, rtol=0, atol=1e-6 * max(float(np.max(np.abs(w))), 1.0))


def feeds(seed, **shapes):
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}


def reshape_to(x, pieces, out):
    """Reshape(x, Concat(pieces)): the target TorchScript computes from Shape chains."""
    return [node("Concat", pieces, [out + "_t"], axis=0), node("Reshape", [x, out + "_t"], [out])]


def reshape_target(model, out):
    reshape = next(n for n in model.graph.node if n.op_type == "Reshape" and n.output[0] == out)
    found = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}.get(reshape.input[1])
    return None if found is None else found.tolist()


# -- Range and broadcasting ----------------------------------------------------------------

def _positions(start="i0", delta="i1"):
    """x[b, n, m, 4] + Range(start, n, delta)[None, :, None, None] + Range(0, m)[None, None, :, None],
    then Reshape to Concat(b, n, m, [2, 2]) (rotary positions in a decoder)."""
    nodes = [node("Shape", ["x"], ["sx"]), node("Gather", ["sx", "i1"], ["n"], axis=0),
             node("Gather", ["sx", "i2"], ["m"], axis=0),
             node("Range", [start, "n", delta], ["pn"]), node("Range", ["i0", "m", "i1"], ["pm"]),
             node("Unsqueeze", ["pn", "ax023"], ["pn4"]), node("Unsqueeze", ["pm", "ax013"], ["pm4"]),
             node("Cast", ["pn4"], ["fn"], to=F), node("Cast", ["pm4"], ["fm"], to=F),
             node("Add", ["x", "fn"], ["xn"]), node("Mul", ["xn", "fm"], ["z"]),
             *dim_of("x", 0, "b1"), *dim_of("x", 1, "n1"), *dim_of("x", 2, "m1"),
             *reshape_to("z", ["b1", "n1", "m1", "two_two"], "y")]
    inits = [*COMMON, ints("ax023", [0, 2, 3]), ints("ax013", [0, 1, 3]), ints("two_two", [2, 2])]
    return model_of(nodes, [vi("x", ["b", "n", "m", 4])], [vi("y", ["b", "n", "m", 2, 2])], inits)


def test_a_range_from_zero_by_one_has_its_limits_dim_and_broadcasts_keep_it():
    model = _positions()
    assert dims(model, "pn") == ["n"] and dims(model, "pm") == ["m"]
    assert dims(model, "z") == ["b", "n", "m", 4]
    out = simplified(model)
    assert ops(out) == ["Range", "Range", "Unsqueeze", "Unsqueeze", "Cast", "Cast", "Add", "Mul", "Reshape"] \
        or sorted(ops(out)) == sorted(["Shape", "Gather", "Gather", "Range", "Range", "Unsqueeze", "Unsqueeze",
                                       "Cast", "Cast", "Add", "Mul", "Reshape"])
    assert reshape_target(out, "y") == [0, 0, 0, 2, 2]
    same_values(model, out, [feeds(0, x=(2, 3, 5, 4)), feeds(1, x=(1, 7, 1, 4))])


def test_a_range_not_from_zero_or_not_by_one_is_not_its_limits_dim():
    for start, delta in (("i1", "i1"), ("i0", "i2")):
        model = _positions(start, delta)
        assert dims(model, "pn") != ["n"]
        assert dims(model, "z")[1] != "n" and dims(model, "z")[2] == "m"
        out = simplified(model)
        assert reshape_target(out, "y") == [0, -1, 0, 2, 2]  # n left to the -1, never claimed
        # (the Range broadcasts against n where it has one entry or n: n = 2 for both)
        same_values(model, out, [feeds(2, x=(2, 2, 3, 4)), feeds(3, x=(3, 2, 1, 4))])


def test_a_broadcast_of_two_different_symbols_is_neither():
    # a[p, 4] + b[q, 4]: p and q are 1 or equal at run time; the result is not known to be either
    model = model_of([node("Add", ["a", "b"], ["c"]), node("Relu", ["c"], ["y"])],
                     [vi("a", ["p", 4]), vi("b", ["q", 4])], [vi("y", [None, 4])])
    got = dims(model, "c")
    assert got[0] not in ("p", "q") and got[1] == 4
    # a symbol against a number other than 1 is that number (the symbol is 1 or equal to it)
    model = model_of([node("Add", ["a", "b"], ["c"])], [vi("a", ["p", 4]), vi("b", [3, 1])], [vi("c", [3, 4])])
    assert dims(model, "c") == [3, 4]


# -- MatMul, Expand and Reshape's -1 ---------------------------------------------------------

def _attention(kv_dims=("b", 2, 1, "s", 8), repeat="b_2_2_s_8"):
    """repeat_kv and attention as a LLaMA export writes them: k[b, 2, s, 8] unsqueezed and
    Expanded to [b, 2, 2, s, 8], Reshaped to [b, 4, s, 8] by a -1; q @ k^T @ k; then the
    Reshape back to [b, s, 32] whose target comes from q's Shape and the output's."""
    nodes = [node("Unsqueeze", ["k", "ax2"], ["k5"]),
             *dim_of("k", 0, "kb"), *dim_of("k", 2, "ks"),
             node("Concat", ["kb", "two", "two", "ks", "eight"], ["b_2_2_s_8"], axis=0),
             node("Expand", ["k5", repeat], ["kx"]),
             node("Reshape", ["kx", "b_4_m1_8"], ["kr"]),
             node("Transpose", ["kr"], ["kt"], perm=[0, 1, 3, 2]),
             node("MatMul", ["q", "kt"], ["scores"]),
             node("MatMul", ["scores", "kr"], ["att"]),
             *dim_of("att", 0, "ab"), *dim_of("q", 2, "qs"),
             *reshape_to("att", ["ab", "minus1", "qs", "eight"], "att4"),
             node("Transpose", ["att4"], ["att_t"], perm=[0, 2, 1, 3]),
             *dim_of("q", 0, "qb"),
             *reshape_to("att_t", ["qb", "qs", "minus1"], "y")]
    inits = [*COMMON, ints("ax2", [2]), ints("two", [2]), ints("eight", [8]), ints("b_4_m1_8", [0, 4, -1, 8]),
             ints("fixed", [1, 2, 2, 5, 8])]
    return model_of(nodes, [vi("q", ["b", 4, "s", 8]), vi("k", ["b", 2, "s", 8])], [vi("y", ["b", "s", 32])],
                    inits)


def test_expand_reshape_minus_one_and_matmul_keep_the_sequence_dim():
    model = _attention()
    assert dims(model, "kx") == ["b", 2, 2, "s", 8]
    assert dims(model, "kr") == ["b", 4, "s", 8]  # -1: b*2*2*s*8 / (b*4*8)
    assert dims(model, "scores") == ["b", 4, "s", "s"] and dims(model, "att") == ["b", 4, "s", 8]
    out = simplified(model)
    assert "att4" not in {o for n in out.graph.node for o in n.output}  # [b, -1, s, 8] of att: its own dims
    assert reshape_target(out, "y") == [0, 0, -1]
    expand = next(n for n in out.graph.node if n.op_type == "Expand")
    assert {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}[expand.input[1]].tolist() == [1, 2, 2, 1, 8]
    assert "Shape" not in ops(out)  # (b and s of the Expand's target: k's own, so 1)
    rng = np.random.default_rng(4)
    same_values(model, out, [{"q": rng.standard_normal((b, 4, s, 8)).astype(np.float32),
                              "k": rng.standard_normal((b, 2, s, 8)).astype(np.float32)}
                             for b, s in ((2, 5), (1, 1), (3, 9))])


def test_an_expand_between_two_symbols_proves_neither():
    # x[a, 4] expanded to [c, 4], c another input's dim: a is 1 or c, c is 1 or a
    nodes = [*dim_of("w", 0, "c"), node("Concat", ["c", "four"], ["c4"], axis=0),
             node("Expand", ["x", "c4"], ["e"]), *dim_of("x", 0, "a"), *reshape_to("e", ["a", "minus1"], "y")]
    model = model_of(nodes, [vi("x", ["a", 4]), vi("w", ["c"])], [vi("y", ["a", 4])], [*COMMON, ints("four", [4])])
    assert dims(model, "e")[0] not in ("a", "c")
    out = simplified(model)
    assert reshape_target(out, "y") is None  # not [0, -1] (a no-op): e's first dim is not known to be a
    expand = next(n for n in out.graph.node if n.op_type == "Expand")
    assert expand.input[1] not in {t.name for t in out.graph.initializer}  # c is not x's a: it stays computed
    rng = np.random.default_rng(5)
    same_values(model, out, [{"x": rng.standard_normal((a, 4)).astype(np.float32),
                              "w": rng.standard_normal(c).astype(np.float32)} for a, c in ((3, 3), (1, 1), (1, 3))])
    # a symbol expanded to 1 keeps the symbol
    model = _attention(repeat="fixed")
    assert dims(model, "kx") == ["b", 2, 2, 5, 8] and dims(model, "kr") == ["b", 4, 5, 8]


def test_a_reshape_minus_one_that_is_no_one_dim_stays_unknown():
    # x[a, c] to [d, -1], d another input's dim: a*c/d is no one dim
    nodes = [*dim_of("w", 0, "d"), *reshape_to("x", ["d", "minus1"], "r"), node("Relu", ["r"], ["y"])]
    model = model_of(nodes, [vi("x", ["a", "c"]), vi("w", ["d"])], [vi("y", ["d", None])], COMMON)
    got = dims(model, "r")
    assert got[0] == "d" and got[1] not in ("a", "c")
    out = simplified(model)
    assert reshape_target(out, "r") is None
    rng = np.random.default_rng(5)
    same_values(model, out, [{"x": rng.standard_normal((2, 6)).astype(np.float32),
                              "w": rng.standard_normal(3).astype(np.float32)},
                             {"x": rng.standard_normal((4, 1)).astype(np.float32),
                              "w": rng.standard_normal(2).astype(np.float32)}])


def test_a_reshape_to_another_order_of_the_same_dims_stays():
    # x[p, q] to [q, p] (from its own Shape): not its dims, whatever p and q are
    nodes = [*dim_of("x", 0, "p"), *dim_of("x", 1, "q"), *reshape_to("x", ["q", "p"], "y")]
    model = model_of(nodes, [vi("x", ["p", "q"])], [vi("y", ["q", "p"])], COMMON)
    out = simplified(model)
    assert "Reshape" in ops(out)
    rng = np.random.default_rng(6)
    same_values(model, out, [{"x": rng.standard_normal((2, 3)).astype(np.float32)},
                             {"x": rng.standard_normal((4, 4)).astype(np.float32)}])


# -- Concat ------------------------------------------------------------------------------------

def test_concat_adds_along_its_axis_and_keeps_the_other_dims():
    # Concat(x[b, 4], Range(0, b)[:, None] as float) on axis 1: [b, 5]; on axis 0 a sum of symbols
    nodes = [node("Shape", ["x"], ["sx"]), node("Gather", ["sx", "i0"], ["b"], axis=0),
             node("Range", ["i0", "b", "i1"], ["pos"]), node("Unsqueeze", ["pos", "ax1"], ["pos2"]),
             node("Cast", ["pos2"], ["fpos"], to=F), node("Concat", ["x", "fpos"], ["c"], axis=1),
             node("Concat", ["x", "x"], ["c0"], axis=0),
             *dim_of("x", 0, "b1"), *reshape_to("c", ["b1", "minus1"], "y"),
             node("Relu", ["c0"], ["y0"])]
    model = model_of(nodes, [vi("x", ["b", 4])], [vi("y", ["b", 5]), vi("y0", [None, 4])],
                     [*COMMON, ints("ax1", [1])])
    assert dims(model, "c") == ["b", 5]
    assert dims(model, "c0")[0] != "b"
    out = simplified(model)
    assert "y_t" not in {o for n in out.graph.node for o in n.output}  # [b, -1] on [b, 5]: a no-op
    rng = np.random.default_rng(7)
    same_values(model, out, [{"x": rng.standard_normal((3, 4)).astype(np.float32)},
                             {"x": rng.standard_normal((1, 4)).astype(np.float32)}])


def test_torchs_expand_guard_on_a_constant_condition_gives_the_expand_its_dims():
    # x[1, n].expand(b, -1) as TorchScript writes it, once the guard Equal(shape, -1) is
    # constant: Expand(x, Where([False, True], [b, -1], [1, 1])) is [b, n]
    nodes = [*dim_of("w", 0, "b"), node("Concat", ["b", "minus1"], ["shape"], axis=0),
             node("Where", ["is_neg", "ones", "shape"], ["target"]), node("Expand", ["x", "target"], ["e"]),
             *dim_of("x", 1, "n"), *reshape_to("e", ["b", "n"], "y")]
    inits = [*COMMON, numpy_helper.from_array(np.array([False, True]), "is_neg"), ints("ones", [1, 1])]
    model = model_of(nodes, [vi("x", [1, "n"]), vi("w", ["b"])], [vi("y", ["b", "n"])], inits)
    assert dims(model, "e") == ["b", "n"]
    out = simplified(model)
    assert "Reshape" not in ops(out)  # to e's own dims
    rng = np.random.default_rng(9)
    same_values(model, out, [{"x": rng.standard_normal((1, n)).astype(np.float32),
                              "w": rng.standard_normal(b).astype(np.float32)} for b, n in ((3, 5), (1, 1), (2, 1))])
