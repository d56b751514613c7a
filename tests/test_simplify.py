"""graphkit simplify: each pass on a small inline model (what it removes, what it must
leave), values from ONNX Runtime before and after, custom ops folded and seen through,
the CLI, and cost growth."""

from __future__ import annotations

import json
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphkit.rewrite.simplify import PASS_NAMES, simplify_model, simplify_options
from tests.conftest import run_cli

F = TensorProto.FLOAT
I64 = TensorProto.INT64


def model_of(nodes, inputs, outputs, initializers=(), opset=17, functions=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    imports = [helper.make_opsetid("", opset), helper.make_opsetid("custom", 1)]
    return helper.make_model(graph, opset_imports=imports, ir_version=10, functions=list(functions))


def vi(name, dims, elem=F):
    return helper.make_tensor_value_info(name, elem, dims)


def const(name, value):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value)))


def run(model, feeds):
    from graphkit.runtime import open_session

    return open_session(model).run(feeds)


def simplified(model, **options):
    out, report = simplify_model(model, options=simplify_options(**options))
    return out, report


def same_values(model, out, feeds_list):
    """ORT's outputs before and after agree within 1e-5 of the output's scale (folding a
    scale into a weight rounds once where ORT rounded twice)."""
    for feeds in feeds_list:
        want, got = run(model, feeds), run(out, feeds)
        assert want.keys() == got.keys()
        for k in want:
            scale = float(np.max(np.abs(want[k]))) if want[k].size else 1.0
            np.testing.assert_allclose(got[k], want[k], rtol=0, atol=1e-5 * max(scale, 1e-30))


def ops(model):
    return [n.op_type for n in model.graph.node]


def passes(report):
    return {name.split(":", 1)[1]: what for name, what in report.passes if name.startswith("simplify:")}


def x_feeds(*shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal(s).astype(np.float32)} for s in shapes]


def test_the_cli_and_the_docs_list_the_passes_simplify_has():
    import re

    from conftest import REPO
    from graphkit.cli._simplify_args import PASSES

    assert PASSES == PASS_NAMES
    page = (REPO / "docs" / "simplify.md").read_text()
    table = page[page.index("| pass | what it does |"):].split("\n\n")[0]
    assert tuple(n for n in re.findall(r"^\| ([a-z-]+) \|", table, re.M) if n != "pass") == PASS_NAMES


# -- each pass -------------------------------------------------------------------------

def test_constants_lift_and_constant_subgraphs_fold_dynamic_batch():
    #   x[b,4] --Add-- Mul(Constant 2, Constant 3) --> y
    nodes = [const("two", np.float32(2)), const("three", np.float32(3)),
             helper.make_node("Mul", ["two", "three"], ["six"]),
             helper.make_node("Add", ["x", "six"], ["y"])]
    model = model_of(nodes, [vi("x", ["b", 4])], [vi("y", ["b", 4])])
    out, report = simplified(model)
    assert ops(out) == ["Add"]
    assert {"lift-constants", "fold-constants"} <= set(passes(report))
    same_values(model, out, x_feeds((2, 4), (5, 4)))


def test_static_shape_chains_fold_and_symbolic_ones_give_a_constant_reshape_target():
    #   x[b,6,4]: Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), [24]))  -> Reshape(x, [-1, 24])
    nodes = [helper.make_node("Shape", ["x"], ["s"]), const("zero", np.int64(0)),
             helper.make_node("Gather", ["s", "zero"], ["b"], axis=0), const("ax", np.array([0], np.int64)),
             helper.make_node("Unsqueeze", ["b", "ax"], ["b1"]), const("rest", np.array([24], np.int64)),
             helper.make_node("Concat", ["b1", "rest"], ["shape"], axis=0),
             helper.make_node("Reshape", ["x", "shape"], ["y"]),
             helper.make_node("Shape", ["x"], ["s2"], start=1), helper.make_node("Cast", ["s2"], ["z"], to=F)]
    model = model_of(nodes, [vi("x", ["b", 6, 4])], [vi("y", ["b", 24]), vi("z", [2])])
    out, report = simplified(model)
    assert sorted(ops(out)) == ["Constant", "Reshape"]  # z is a graph output: a Constant node writes it
    reshape = next(n for n in out.graph.node if n.op_type == "Reshape")
    target = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}[reshape.input[1]]
    assert target.tolist() == [-1, 24]  # b, the one symbolic dim, is -1 (not 0): see the next test
    same_values(model, out, x_feeds((2, 6, 4), (7, 6, 4)))


def test_a_target_with_one_symbolic_dim_writes_it_minus_one_and_two_keep_their_copies():
    # ViT's attention: x[b,197,256] -> Reshape(x, [b, 197, -1, 64]); the output is proved
    # [b, 197, 4, 64], so the target is [-1, 197, 4, 64] (ORT plans memory for it as for the
    # computed target; with [0, 197, -1, 64] its plan ran 3-5% slower). With b and s symbolic
    # the copies stay: [0, 0, -1, 64].
    def attention(dims):
        nodes = [helper.make_node("Shape", ["x"], ["s"]), const("zero", np.int64(0)), const("one", np.int64(1)),
                 const("ax", np.array([0], np.int64)),
                 helper.make_node("Gather", ["s", "zero"], ["b"], axis=0), helper.make_node("Unsqueeze", ["b", "ax"], ["b1"]),
                 helper.make_node("Gather", ["s", "one"], ["n"], axis=0), helper.make_node("Unsqueeze", ["n", "ax"], ["n1"]),
                 const("rest", np.array([-1, 64], np.int64)),
                 helper.make_node("Concat", ["b1", "n1", "rest"], ["shape"], axis=0),
                 helper.make_node("Reshape", ["x", "shape"], ["y"])]
        return model_of(nodes, [vi("x", dims)], [vi("y", None)])

    for dims, target, shapes in ((["b", 197, 256], [-1, 197, 4, 64], ((1, 197, 256), (3, 197, 256))),
                                 (["b", "s", 256], [0, 0, -1, 64], ((1, 5, 256), (2, 7, 256)))):
        model = attention(dims)
        out, _ = simplified(model)
        assert ops(out) == ["Reshape"]
        reshape = out.graph.node[0]
        assert numpy_helper.to_array(
            {t.name: t for t in out.graph.initializer}[reshape.input[1]]).tolist() == target, dims
        same_values(model, out, x_feeds(*shapes))


def test_a_reshape_target_with_two_unknown_dims_stays():
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Reshape", ["y0", "s"], ["y"])]
    model = model_of(nodes, [vi("x", ["a", "b"]), vi("y0", ["c", "d"])], [vi("y", ["a", "b"])])
    out, _ = simplified(model)
    assert ops(out) == ["Shape", "Reshape"]


def test_no_ops_go_and_graph_output_names_stay():
    #   x -> Identity -> Cast(float) -> Transpose(identity) -> Dropout -> Add(0) -> Mul(1) -> y
    nodes = [helper.make_node("Identity", ["x"], ["a"]), helper.make_node("Cast", ["a"], ["b"], to=F),
             helper.make_node("Transpose", ["b"], ["c"], perm=[0, 1]), helper.make_node("Dropout", ["c"], ["d"]),
             helper.make_node("Add", ["d", "zero"], ["e"]), helper.make_node("Mul", ["one", "e"], ["f"]),
             helper.make_node("Relu", ["f"], ["g"]), helper.make_node("Identity", ["g"], ["y"])]
    inits = [numpy_helper.from_array(np.zeros(3, np.float32), "zero"), numpy_helper.from_array(np.float32(1), "one")]
    model = model_of(nodes, [vi("x", ["b", 3])], [vi("y", ["b", 3])], inits)
    out, report = simplified(model)
    assert ops(out) == ["Relu"] and out.graph.node[0].output[0] == "y"
    assert [o.name for o in out.graph.output] == ["y"] and [i.name for i in out.graph.input] == ["x"]
    same_values(model, out, x_feeds((2, 3), (4, 3)))


def test_what_is_no_no_op_stays():
    # Add of zeros that broadcasts x wider; Cast to another type; Identity from input to output;
    # Dropout in training mode
    nodes = [helper.make_node("Add", ["x", "zeros"], ["wide"]), helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16),
             helper.make_node("Identity", ["x"], ["same"]),
             helper.make_node("Dropout", ["x", "", "train"], ["dropped"])]
    inits = [numpy_helper.from_array(np.zeros((2, 1, 3), np.float32), "zeros"),
             numpy_helper.from_array(np.array(True), "train")]
    model = model_of(nodes, [vi("x", [4, 3])], [vi("wide", [2, 4, 3]), vi("h", [4, 3], TensorProto.FLOAT16),
                                               vi("same", [4, 3]), vi("dropped", [4, 3])], inits)
    out, _ = simplified(model)
    assert sorted(ops(out)) == ["Add", "Cast", "Dropout", "Identity"]


def test_duplicate_initializers_and_nodes_merge():
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    inits = [numpy_helper.from_array(w, "w1"), numpy_helper.from_array(w.copy(), "w2"),
             numpy_helper.from_array(w.reshape(3, 2), "w3")]  # same bytes, another shape: stays
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"]), helper.make_node("MatMul", ["x", "w2"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["y"]), helper.make_node("MatMul", ["y2", "w3"], ["z"])]
    model = model_of(nodes, [vi("x", ["n", 2]), vi("y2", ["n", 3])], [vi("y", ["n", 3]), vi("z", ["n", 2])], inits)
    out, report = simplified(model)
    assert ops(out) == ["MatMul", "Add", "MatMul"]
    assert sorted(t.name for t in out.graph.initializer) == ["w1", "w3"]
    assert passes(report).keys() >= {"merge-constants", "eliminate-common"}
    rng = np.random.default_rng(1)
    same_values(model, out, [{"x": rng.standard_normal((n, 2)).astype(np.float32),
                              "y2": rng.standard_normal((n, 3)).astype(np.float32)} for n in (1, 5)])


def test_initializers_that_are_graph_inputs_are_never_folded_nor_merged():
    inits = [numpy_helper.from_array(np.float32(2), "k"), numpy_helper.from_array(np.float32(2), "k2")]
    nodes = [helper.make_node("Mul", ["k", "k2"], ["k4"]), helper.make_node("Mul", ["x", "k4"], ["y"])]
    model = model_of(nodes, [vi("x", [3]), vi("k", [])], [vi("y", [3])], inits)
    out, _ = simplified(model)
    assert ops(out) == ["Mul", "Mul"] and {t.name for t in out.graph.initializer} == {"k", "k2"}


def test_dead_nodes_initializers_functions_and_function_inputs_go():
    fn = helper.make_function("local", "f", ["a", "unused"], ["b"], [helper.make_node("Relu", ["a"], ["b"])],
                              [helper.make_opsetid("", 17)])
    never = helper.make_function("local", "never", ["a"], ["b"], [helper.make_node("Neg", ["a"], ["b"])],
                                 [helper.make_opsetid("", 17)])
    nodes = [helper.make_node("f", ["x", "x"], ["y"], domain="local"), helper.make_node("Exp", ["x"], ["dead"])]
    model = model_of(nodes, [vi("x", [3])], [vi("y", [3])], [numpy_helper.from_array(np.ones(3, np.float32), "w")],
                     functions=[fn, never])
    model.opset_import.append(helper.make_opsetid("local", 1))
    out, _ = simplified(model)
    assert ops(out) == ["f"] and list(out.graph.node[0].input) == ["x"]
    assert [f.name for f in out.functions] == ["f"] and list(out.functions[0].input) == ["a"]
    assert not out.graph.initializer
    import onnxruntime as ort

    got = ort.InferenceSession(out.SerializeToString()).run(None, {"x": np.array([-1, 0, 2], np.float32)})[0]
    assert got.tolist() == [0, 0, 2]


def test_inside_if_branches_outer_constants_fold_and_no_ops_go():
    then = helper.make_graph([helper.make_node("Identity", ["x"], ["t1"]), helper.make_node("Add", ["t1", "c"], ["t"])],
                             "then", [], [vi("t", [3])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [vi("e", [3])])
    nodes = [const("c0", np.ones(3, np.float32)), helper.make_node("Mul", ["c0", "c0"], ["c"]),
             helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)]
    model = model_of(nodes, [vi("x", [3]), vi("cond", [], TensorProto.BOOL)], [vi("y", [3])])
    out, _ = simplified(model)
    assert ops(out) == ["If"]
    then_ops = [n.op_type for n in out.graph.node[0].attribute[0].g.node]
    assert "Identity" not in then_ops
    import onnxruntime as ort

    sess = ort.InferenceSession(out.SerializeToString())
    for cond in (True, False):
        feeds = {"x": np.array([1, 2, 3], np.float32), "cond": np.array(cond)}
        want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
        np.testing.assert_array_equal(sess.run(None, feeds)[0], want)


# -- folding limits and reasons --------------------------------------------------------

def test_a_large_folded_output_is_kept_with_its_reason():
    nodes = [const("one", np.ones(1, np.float32)), const("shape", np.array([1024, 1024], np.int64)),
             helper.make_node("Expand", ["one", "shape"], ["big"], name="make_big"),
             helper.make_node("Add", ["x", "big"], ["y"])]
    model = model_of(nodes, [vi("x", [1024, 1024])], [vi("y", [1024, 1024])])
    out, report = simplified(model)
    assert "Expand" in ops(out)
    assert any("make_big" in node and "size limit" in why for node, why in report.kept.items())
    bigger, _ = simplified(model, size_limit=8 << 20)
    assert "Expand" not in ops(bigger)


def test_a_node_whose_evaluation_fails_is_kept_with_its_reason():
    nodes = [const("data", np.arange(3, dtype=np.int64)), const("idx", np.int64(7)),
             helper.make_node("Gather", ["data", "idx"], ["g"], name="bad_gather"),
             helper.make_node("Cast", ["g"], ["gf"], to=F), helper.make_node("Add", ["x", "gf"], ["y"])]
    model = model_of(nodes, [vi("x", [3])], [vi("y", [3])])
    out, report = simplified(model)
    assert "Gather" in ops(out)
    assert "out of range" in report.kept["Gather bad_gather"]


@pytest.mark.parametrize("op, a, b", [
    ("Div", np.array([-7, 7, -7], np.int64), np.array([2, -2, -2], np.int64)),  # truncates toward zero
    ("Sub", np.array([1.5, -2.0], np.float32), np.array([0.25, 3.0], np.float32)),
    ("Equal", np.array([1, 2, 3], np.int64), np.array([1, 0, 3], np.int64)),
])
def test_folded_values_are_onnx_runtimes(op, a, b):
    import onnxruntime as ort

    nodes = [const("a", a), const("b", b), helper.make_node(op, ["a", "b"], ["c"]), helper.make_node("Identity", ["c"], ["y"])]
    elem = helper.np_dtype_to_tensor_dtype(np.asarray(a + b if op != "Equal" else a == b).dtype)
    model = model_of(nodes, [], [vi("y", [len(a)], elem)])
    out, _ = simplified(model)
    assert ops(out) == ["Constant"]
    want = ort.InferenceSession(model.SerializeToString()).run(None, {})[0]
    got = ort.InferenceSession(out.SerializeToString()).run(None, {})[0]
    np.testing.assert_array_equal(got, want)


# -- custom ops --------------------------------------------------------------------------

def test_a_custom_node_with_constant_inputs_folds_by_its_kernel():
    # custom::my_add(2a + b) on constants, then Add with x
    nodes = [const("a", np.full(3, 1.5, np.float32)), const("b", np.arange(3, dtype=np.float32)),
             helper.make_node("my_add", ["a", "b"], ["c"], domain="custom"), helper.make_node("Add", ["x", "c"], ["y"])]
    model = model_of(nodes, [vi("x", [3])], [vi("y", [3])])
    out, _ = simplified(model)
    assert ops(out) == ["Add"]
    np.testing.assert_array_equal(numpy_helper.to_array(out.graph.initializer[0]), [3, 4, 5])


def test_shapes_propagate_past_a_custom_op():
    # y = Reshape(my_add(x, x), Shape(my_add(x, x))) : the shape after the custom op is known
    nodes = [helper.make_node("my_add", ["x", "x"], ["m"], domain="custom"), helper.make_node("Shape", ["m"], ["s"]),
             helper.make_node("Reshape", ["m", "s"], ["y"])]
    model = model_of(nodes, [vi("x", [2, 3])], [vi("y", [2, 3])])
    out, _ = simplified(model)
    assert ops(out) == ["my_add"]


def _dcn_block(follower: str, bias: bool = True):
    """x -> deform_conv2d(W, offset const, [bias]) -> BatchNormalization | Mul | Add -> y."""
    rng = np.random.default_rng(3)
    c, m = 3, 4
    inits = [numpy_helper.from_array(rng.standard_normal((m, c, 3, 3)).astype(np.float32), "w")]
    inputs = ["x", "w", "off"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(m).astype(np.float32), "bias"))
        inputs.append("bias")
    nodes = [helper.make_node("deform_conv2d", inputs, ["d"], domain="custom", padding=[0, 0])]
    if follower == "bn":
        for name, v in (("g", rng.uniform(0.5, 2, m)), ("be", rng.standard_normal(m)), ("mu", rng.standard_normal(m)),
                        ("var", rng.uniform(0.5, 2, m))):
            inits.append(numpy_helper.from_array(v.astype(np.float32), name))
        nodes.append(helper.make_node("BatchNormalization", ["d", "g", "be", "mu", "var"], ["y"], epsilon=1e-3))
    else:
        inits.append(numpy_helper.from_array(rng.standard_normal((m, 1, 1)).astype(np.float32), "k"))
        nodes.append(helper.make_node(follower, ["d", "k"], ["y"]))
    return model_of(nodes, [vi("x", ["n", c, 8, 8]), vi("off", ["n", 18, 6, 6])], [vi("y", ["n", m, 6, 6])], inits,
                    opset=18)


def dcn_feeds(*batches):
    rng = np.random.default_rng(4)
    return [{"x": rng.standard_normal((n, 3, 8, 8)).astype(np.float32),
             "off": (rng.standard_normal((n, 18, 6, 6)) * 0.7).astype(np.float32)} for n in batches]


@pytest.mark.parametrize("follower, bias", [("bn", True), ("bn", False), ("Mul", True), ("Add", False), ("Sub", True),
                                            ("Div", True)])
def test_a_per_channel_scale_and_shift_folds_into_deform_conv2d(follower, bias):
    model = _dcn_block(follower, bias)
    out, report = simplified(model)
    assert ops(out) == ["deform_conv2d"] and out.graph.node[0].output[0] == "y"
    assert "absorb-into-custom-ops" in passes(report)
    same_values(model, out, dcn_feeds(1, 2))


def test_a_follower_that_is_not_per_channel_stays():
    model = _dcn_block("Mul")
    k = next(t for t in model.graph.initializer if t.name == "k")
    k.CopyFrom(numpy_helper.from_array(np.ones((4, 6, 6), np.float32) * 2, "k"))  # varies over H, W
    out, _ = simplified(model)
    assert ops(out) == ["deform_conv2d", "Mul"]


# -- the CLI -----------------------------------------------------------------------------

def test_cli_simplify_writes_reports_explains_and_refuses_bad_options(tmp_path):
    model = _dcn_block("bn")
    src, dst = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save(model, src)
    before = src.read_bytes()
    proc = run_cli("simplify", src, dst, "--json", check_rc=0)
    report = json.loads(proc.stdout)
    assert report["nodes_before"] == 2 and report["nodes_after"] == 1
    assert any(p["pass"] == "simplify:absorb-into-custom-ops" for p in report["passes"])
    assert src.read_bytes() == before and dst.exists()
    dry = tmp_path / "dry.onnx"
    run_cli("simplify", src, dry, "--dry-run", check_rc=0)
    assert not dry.exists()
    bad = run_cli("simplify", src, dst, "--skip", "nonsense", check_rc=2)
    assert "unknown simplify pass" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    assert "not a size" in run_cli("simplify", src, dst, "--size-limit", "lots", check_rc=2).stderr
    kept = run_cli("simplify", src, dst, "--skip", "absorb-into-custom-ops", check_rc=0)
    assert "absorb" not in kept.stdout
    pics = tmp_path / "pics"
    drawn = run_cli("simplify", src, dst, "--diff", pics, check_rc=0)  # the BatchNormalization region, before/after
    assert (pics / "index.html").exists() and list(pics.glob("region-*-before.svg")), drawn.stdout


def test_rewrite_simplify_lowers_then_simplifies(tmp_path):
    nodes = [const("two", np.float32(2)), helper.make_node("my_add", ["x", "x"], ["m"], domain="custom"),
             helper.make_node("Identity", ["m"], ["i"]), helper.make_node("Mul", ["i", "two"], ["y"])]
    model = model_of(nodes, [vi("x", ["n", 3])], [vi("y", ["n", 3])])
    src, dst = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save(model, src)
    proc = run_cli("rewrite", src, dst, "--simplify", "--explain", check_rc=0)
    assert "simplified:" in proc.stdout
    out = onnx.load(dst)
    assert "Constant" not in ops(out) and "Identity" not in ops(out) and "my_add" not in ops(out)
    same_values(model, out, x_feeds((2, 3), (4, 3)))


# -- cost ---------------------------------------------------------------------------------

def _chain(n: int):
    """n blocks of unnamed nodes: Shape -> Gather -> Unsqueeze -> Concat -> Reshape, an Identity,
    a duplicate Relu and a Constant each (the shapes a TorchScript export has)."""
    nodes, prev = [], "x"
    for i in range(n):
        nodes += [helper.make_node("Shape", [prev], [f"s{i}"]), const(f"z{i}", np.int64(0)),
                  helper.make_node("Gather", [f"s{i}", f"z{i}"], [f"b{i}"]), const(f"a{i}", np.array([0], np.int64)),
                  helper.make_node("Unsqueeze", [f"b{i}", f"a{i}"], [f"u{i}"]), const(f"r{i}", np.array([4], np.int64)),
                  helper.make_node("Concat", [f"u{i}", f"r{i}"], [f"c{i}"], axis=0),
                  helper.make_node("Reshape", [prev, f"c{i}"], [f"h{i}"]), helper.make_node("Identity", [f"h{i}"], [f"i{i}"]),
                  helper.make_node("Relu", [f"i{i}"], [f"p{i}"]), helper.make_node("Relu", [f"i{i}"], [f"q{i}"]),
                  helper.make_node("Add", [f"p{i}", f"q{i}"], [f"o{i}"])]
        prev = f"o{i}"
    for node in nodes:
        node.name = ""
    return model_of(nodes, [vi("x", ["b", 4])], [vi(prev, ["b", 4])])


def test_simplify_cost_grows_linearly():
    def best(n):
        model = _chain(n)
        times = []
        for _ in range(3):
            start = time.perf_counter()
            out, _ = simplify_model(model, check=False)
            times.append(time.perf_counter() - start)
        assert len(out.graph.node) == 2 * n  # Relu, Add: the Reshape to x's own [b, 4] goes too
        return min(times)

    small, large = best(150), best(1200)
    assert large / small < 20, (small, large)  # linear: ~8; quadratic: ~64


@pytest.mark.parametrize("shape", ["chain", "fan_out", "if_bodies", "loop_bodies", "functions"])
def test_simplify_cost_grows_linearly_on_the_growth_test_shapes(shape):
    """The rewrite's growth-test shapes (unnamed chains, one value read by n nodes, n If and
    Loop bodies, local functions), simplified at n and 8n nodes: least of 3 runs each."""
    import scaling_models as sm

    build = {"chain": sm.chain, "fan_out": sm.fan_out, "if_bodies": sm.if_bodies, "loop_bodies": sm.loop_bodies,
             "functions": lambda n: sm.functions(n, max(n // 20, 1))}[shape]

    def best(n):
        model = build(n)
        times = []
        for _ in range(3):
            start = time.perf_counter()
            simplify_model(model, check=False)
            times.append(time.perf_counter() - start)
        return min(times)

    n = 100 if shape.endswith("bodies") else 250
    small, large = best(n), best(8 * n)
    assert large / small < 20, (small, large)


def test_a_users_op_gets_folding_and_absorption_through_the_public_opdef_api():
    """An op package's op, declared with ChannelLinear, in a registry of its own: a
    per-channel Mul after it folds into its weight, and a node of it on constants folds."""
    from graphkit.ops import ChannelLinear, OpDef, OpRegistry, Param

    def kernel(x, w, b=None):  # y[n, m] = x[n, :] @ w[m, :] + b[m]
        y = x @ w.T
        return (y if b is None or b.size == 0 else y + b).astype(x.dtype)

    op = OpDef(name="dense", domain="acme", doc="x @ w.T + b", torch_namespace="acme",
               inputs=(Param("x", "T"), Param("w", "T"), Param("b", "T", optional=True)), outputs=(Param("y", "T"),),
               type_constraints={"T": ("tensor(float)",)}, reference=lambda *a: None,
               infer_shapes=lambda s, a: [[s[0][0], s[1][0]] if s[0] and s[1] else None],
               python_kernel=kernel, channel_linear=ChannelLinear(weight="w", bias="b", channel_axis=1, weight_axis=0))
    registry = OpRegistry([op])
    rng = np.random.default_rng(5)
    w, s = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    c = rng.standard_normal((2, 3)).astype(np.float32)
    nodes = [helper.make_node("dense", ["x", "w"], ["d"], domain="acme"), helper.make_node("Mul", ["d", "s"], ["y"]),
             helper.make_node("dense", ["c", "w"], ["z"], domain="acme")]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(s, "s"), numpy_helper.from_array(c, "c")]
    graph = helper.make_graph(nodes, "g", [vi("x", ["n", 3])], [vi("y", ["n", 4]), vi("z", [2, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("acme", 1)])
    out, report = simplify_model(model, registry=registry)
    assert [n.op_type for n in out.graph.node] == ["dense", "Constant"]  # z, a graph output, by a Constant
    values = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    dense = out.graph.node[0]
    x = rng.standard_normal((5, 3)).astype(np.float32)
    np.testing.assert_allclose(kernel(x, values[dense.input[1]], values[dense.input[2]]), kernel(x, w) * s, atol=1e-5)
    np.testing.assert_allclose(numpy_helper.to_array(out.graph.node[1].attribute[0].t), kernel(c, w), rtol=1e-6)


def test_external_weights_stay_external_and_unread_unless_folded(tmp_path, monkeypatch):
    """The DCN block with every weight external: BN folds into deform_conv2d (those weights are
    read), a MatMul's weight nothing folds stays external in the output and is never read."""
    from onnx.external_data_helper import convert_model_to_external_data

    model = _dcn_block("bn")
    big = np.random.default_rng(6).standard_normal((6, 6)).astype(np.float32)
    model.graph.initializer.append(numpy_helper.from_array(big, "big"))
    model.graph.node.append(helper.make_node("MatMul", ["y", "big"], ["y2"]))
    del model.graph.output[:]
    model.graph.output.append(vi("y2", ["n", 4, 6, 6]))
    convert_model_to_external_data(model, all_tensors_to_one_file=False, size_threshold=0)
    src = tmp_path / "in" / "m.onnx"
    src.parent.mkdir()
    onnx.save(model, src)
    dst = tmp_path / "out" / "m.onnx"
    dst.parent.mkdir()
    from graphkit.rewrite.simplify import simplify_file

    read = []
    real = numpy_helper.to_array

    def watching(tensor, base_dir=""):
        read.append(tensor.name)
        return real(tensor, base_dir)

    monkeypatch.setattr(numpy_helper, "to_array", watching)
    result = simplify_file(src, dst, external_data="copy")  # (onnx.load refuses hard-linked weights)
    monkeypatch.undo()
    assert "big" not in read and "w" in read  # the folded weight is read, the other never
    out = onnx.load(dst, load_external_data=False)
    assert [n.op_type for n in out.graph.node] == ["deform_conv2d", "MatMul"]
    big_out = next(t for t in out.graph.initializer if t.name == "big")
    assert big_out.data_location == TensorProto.EXTERNAL
    assert "simplify:absorb-into-custom-ops" in dict(result.report.passes)
    full_in, full_out = onnx.load(src), onnx.load(dst)
    same_values(full_in, full_out, dcn_feeds(1, 2))


# -- folding against ONNX's own test cases -------------------------------------------------

_TABLE_OPS = ("Shape", "Size", "Gather", "Unsqueeze", "Squeeze", "Concat", "Cast", "Add", "Sub", "Mul", "Div", "Equal",
              "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or", "Neg", "Where", "ConstantOfShape",
              "Range", "Expand", "Slice", "Reshape", "Identity", "Flatten", "CumSum", "GatherElements", "Transpose",
              "Sin", "Cos", "Sqrt", "Exp", "Reciprocal",
              # and a few the reference evaluates
              "ReduceSum", "Tile", "Softmax")


def _onnx_cases():
    import warnings

    from onnx.backend.test.case import node

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = node.collect_testcases(None)
    return [c for c in cases if c.model is not None and len(c.model.graph.node) == 1
            and c.model.graph.node[0].op_type in _TABLE_OPS and c.data_sets]


@pytest.mark.parametrize("case", _onnx_cases(), ids=lambda c: c.name)
def test_a_node_on_constants_folds_to_onnxs_expected_outputs(case):
    """ONNX's backend test case for the op with its inputs made initializers: the node folds
    (by graphkit's numpy table, or ONNX's reference) to the case's expected outputs."""
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    inputs, outputs = case.data_sets[0]
    g = model.graph
    feeds = [i.name for i in g.input]
    for name, value in zip(feeds, inputs):
        if isinstance(value, (list, dict)) or (isinstance(value, np.ndarray) and value.dtype.kind in "OSU"):
            pytest.skip("sequence, optional or string inputs")
        tensor = onnx.TensorProto()
        tensor.CopyFrom(value if isinstance(value, onnx.TensorProto) else numpy_helper.from_array(np.asarray(value)))
        tensor.name = name
        g.initializer.append(tensor)
    del g.input[:]
    out, report = simplify_model(model, check=False)
    if [n.op_type for n in out.graph.node] != ["Constant"] * len(outputs):
        assert report.kept, [n.op_type for n in out.graph.node]  # kept, saying why
        return
    for node, want in zip(out.graph.node, outputs):
        if isinstance(want, onnx.TensorProto):  # types numpy lacks: compare as the reference stores them
            assert node.attribute[0].t.data_type == want.data_type
            want = numpy_helper.to_array(want).astype(np.float64)
            got = numpy_helper.to_array(node.attribute[0].t).astype(np.float64)
        else:
            got = numpy_helper.to_array(node.attribute[0].t)
            assert got.dtype == np.asarray(want).dtype
        assert got.shape == np.asarray(want).shape
        np.testing.assert_allclose(got, want, rtol=case.rtol, atol=case.atol, equal_nan=True)


def test_onnxscripts_optimizer_stops_at_a_custom_op():
    """Why fold-constants is graphkit's own (docs/simplify.md): onnxscript's optimizer neither
    evaluates a custom node on constants nor knows the shape after one; graphkit does both."""
    optimizer = pytest.importorskip("onnxscript.optimizer")
    nodes = [helper.make_node("my_add", ["x", "x"], ["m"], domain="custom"), helper.make_node("Shape", ["m"], ["s"]),
             helper.make_node("Reshape", ["m", "s"], ["y"]), const("c", np.ones(3, np.float32)),
             helper.make_node("my_add", ["c", "c"], ["k"], domain="custom"), helper.make_node("Add", ["y", "k"], ["z"])]
    model = model_of(nodes, [vi("x", [2, 3])], [vi("z", [2, 3])])
    assert ops(optimizer.optimize(model)) == ["my_add", "Shape", "Reshape", "my_add", "Add"]
    out, _ = simplified(model)
    assert ops(out) == ["my_add", "Add"]


# -- differential property test ----------------------------------------------------------

def _random_model(draw_ops: list[tuple[str, int]]):
    """x[b, 4, 6] through a chain of the blocks TorchScript exports are made of, each with
    its constants as Constant nodes; every block's output also feeds a duplicate branch."""
    nodes, inits, prev = [], [], "x"
    for i, (kind, seed) in enumerate(draw_ops):
        rng = np.random.default_rng(seed)
        out = f"t{i}"
        if kind == "affine":
            nodes += [const(f"w{i}", rng.standard_normal(6).astype(np.float32)),
                      helper.make_node("Mul", [prev, f"w{i}"], [f"m{i}"]), const(f"z{i}", np.zeros(6, np.float32)),
                      helper.make_node("Add", [f"m{i}", f"z{i}"], [out])]
        elif kind == "reshape_chain":  # Reshape(x, [Shape(x)[0], 24]) then back with [0, 4, 6]
            nodes += [helper.make_node("Shape", [prev], [f"s{i}"]), const(f"g{i}", np.int64(0)),
                      helper.make_node("Gather", [f"s{i}", f"g{i}"], [f"b{i}"]), const(f"a{i}", np.array([0], np.int64)),
                      helper.make_node("Unsqueeze", [f"b{i}", f"a{i}"], [f"u{i}"]),
                      const(f"r{i}", np.array([24], np.int64)), helper.make_node("Concat", [f"u{i}", f"r{i}"], [f"c{i}"], axis=0),
                      helper.make_node("Reshape", [prev, f"c{i}"], [f"h{i}"]),
                      const(f"back{i}", np.array([0, 4, 6], np.int64)), helper.make_node("Reshape", [f"h{i}", f"back{i}"], [out])]
        elif kind == "transpose_pair":
            nodes += [helper.make_node("Transpose", [prev], [f"p{i}"], perm=[0, 2, 1]),
                      helper.make_node("Transpose", [f"p{i}"], [out], perm=[0, 2, 1])]
        elif kind == "casts":
            nodes += [helper.make_node("Cast", [prev], [f"d{i}"], to=TensorProto.DOUBLE),
                      helper.make_node("Cast", [f"d{i}"], [f"e{i}"], to=F), helper.make_node("Cast", [f"e{i}"], [out], to=F)]
        elif kind == "identity_dropout":
            nodes += [helper.make_node("Identity", [prev], [f"i{i}"]), helper.make_node("Dropout", [f"i{i}"], [out])]
        elif kind == "folded_scale":  # a scale computed from constants: Sqrt(Constant) * Constant
            nodes += [const(f"k{i}", np.float32(rng.uniform(1, 4))), helper.make_node("Sqrt", [f"k{i}"], [f"q{i}"]),
                      helper.make_node("Div", [prev, f"q{i}"], [out])]
        elif kind == "duplicate":
            nodes += [helper.make_node("Relu", [prev], [f"l{i}"]), helper.make_node("Relu", [prev], [f"n{i}"]),
                      helper.make_node("Sub", [f"l{i}", f"n{i}"], [f"o{i}"]), helper.make_node("Add", [prev, f"o{i}"], [out])]
        elif kind == "expand_same":
            nodes += [helper.make_node("Shape", [prev], [f"s{i}"]), helper.make_node("Expand", [prev, f"s{i}"], [out])]
        prev = out
    nodes.append(helper.make_node("Identity", [prev], ["y"]))
    return model_of(nodes, [vi("x", ["b", 4, 6])], [vi("y", ["b", 4, 6])], inits)


_KINDS = ["affine", "reshape_chain", "transpose_pair", "casts", "identity_dropout", "folded_scale", "duplicate",
          "expand_same"]


def test_simplify_never_changes_what_a_random_chain_computes():
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    @settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(st.tuples(st.sampled_from(_KINDS), st.integers(0, 1000)), min_size=1, max_size=6))
    def check(blocks):
        model = _random_model(blocks)
        out, _ = simplified(model)
        assert len(out.graph.node) <= len(model.graph.node)
        assert [o.name for o in out.graph.output] == ["y"] and [i.name for i in out.graph.input] == ["x"]
        onnx.checker.check_model(out)
        same_values(model, out, x_feeds((1, 4, 6), (3, 4, 6), seed=len(blocks)))

    check()


def test_torchs_expand_guard_on_symbolic_dims_folds():
    """x.expand(b, 4) as TorchScript writes it: Expand(x, Where(Equal(shape, -1), ones, shape))
    with shape = [Shape(y)[0], 4]: a dim is never -1, so the guard folds and the Expand's
    target is the shape value itself."""
    nodes = [helper.make_node("Shape", ["y"], ["s"]), const("zero", np.int64(0)),
             helper.make_node("Gather", ["s", "zero"], ["b"]), const("ax", np.array([0], np.int64)),
             helper.make_node("Unsqueeze", ["b", "ax"], ["b1"]), const("four", np.array([4], np.int64)),
             helper.make_node("Concat", ["b1", "four"], ["shape"], axis=0), const("neg", np.array([-1, -1], np.int64)),
             helper.make_node("Equal", ["shape", "neg"], ["is_neg"]), const("ones", np.ones(2, np.int64)),
             helper.make_node("Where", ["is_neg", "ones", "shape"], ["target"]),
             helper.make_node("Expand", ["x", "target"], ["e"]), helper.make_node("Add", ["e", "y"], ["z"])]
    model = model_of(nodes, [vi("x", [1, 4]), vi("y", ["b", 4])], [vi("z", ["b", 4])])
    out, _ = simplified(model)
    assert "Equal" not in ops(out) and "Where" not in ops(out)
    rng = np.random.default_rng(8)
    same_values(model, out, [{"x": rng.standard_normal((1, 4)).astype(np.float32),
                              "y": rng.standard_normal((n, 4)).astype(np.float32)} for n in (1, 3)])


def test_shared_inner_unsqueezes_merge_into_each_reader_and_true_and_is_a_no_op():
    #   a -> Unsqueeze[0, 1] -> Unsqueeze[3] -> p ; -> Unsqueeze[2] -> q ; m = And(True, mask)
    nodes = [const("ax01", np.array([0, 1], np.int64)), const("ax3", np.array([3], np.int64)),
             const("ax2", np.array([2], np.int64)), helper.make_node("Unsqueeze", ["a", "ax01"], ["u"]),
             helper.make_node("Unsqueeze", ["u", "ax3"], ["p"]), helper.make_node("Unsqueeze", ["u", "ax2"], ["q"]),
             const("yes", np.array(True)), helper.make_node("And", ["yes", "mask"], ["m"]),
             helper.make_node("Identity", ["m"], ["mo"])]
    model = model_of(nodes, [vi("a", ["n"]), vi("mask", ["n"], TensorProto.BOOL)],
                     [vi("p", [1, 1, "n", 1]), vi("q", [1, 1, 1, "n"]), vi("mo", ["n"], TensorProto.BOOL)])
    out, _ = simplified(model)
    assert sorted(ops(out)) == ["Identity", "Unsqueeze", "Unsqueeze"]  # (Identity: mask is an input, mo an output)
    import onnxruntime as ort

    for n in (1, 4):
        feeds = {"a": np.arange(n, dtype=np.float32), "mask": np.arange(n) % 2 == 0}
        want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
        got = ort.InferenceSession(out.SerializeToString()).run(None, feeds)
        for w, g in zip(want, got):
            np.testing.assert_array_equal(g, w)


def _qkv_block(rng):
    """Three projections of one input (an attention block's query, key and value) and their sum."""
    h = 8
    inits = [numpy_helper.from_array(rng.standard_normal((h, h)).astype(np.float32), f"w{c}") for c in "qkv"]
    inits += [numpy_helper.from_array(rng.standard_normal(h).astype(np.float32), f"b{c}") for c in "qkv"]
    nodes = []
    for c in "qkv":
        nodes += [helper.make_node("MatMul", ["x", f"w{c}"], [f"m{c}"]), helper.make_node("Add", [f"m{c}", f"b{c}"], [c])]
    nodes += [helper.make_node("Add", ["q", "k"], ["qk"]), helper.make_node("Add", ["qk", "v"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, h])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, h])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)


def test_simplify_leaves_qkv_packing_out_unless_fuse_names_it(tmp_path):
    """The packed QKV MatMul and its Split cost ONNX Runtime latency (docs/simplify.md), so
    simplify's fuse pass leaves it out by default; ``--fuse all`` (or qkv) applies it, with
    the same values; an unknown fusion name is a usage error."""
    from graphkit.rewrite import fusions
    from tests.conftest import run_ort

    model = _qkv_block(np.random.default_rng(3))
    default, _ = simplify_model(model)
    assert [n.op_type for n in default.graph.node].count("MatMul") == 3
    packed, _ = simplify_model(model, options=simplify_options(fusions=tuple(fusions.LIBRARY.select("all"))))
    ops = [n.op_type for n in packed.graph.node]
    assert ops.count("MatMul") == 1 and ops.count("Split") == 1
    x = {"x": np.random.default_rng(4).standard_normal((2, 4, 8)).astype(np.float32)}
    np.testing.assert_allclose(run_ort(packed, x)[0], run_ort(model, x)[0], rtol=1e-5, atol=1e-5)

    src, dst = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(model, src)
    run_cli("simplify", src, dst, check_rc=0)
    assert [n.op_type for n in onnx.load(dst).graph.node].count("Split") == 0
    run_cli("simplify", src, dst, "--fuse", "qkv", check_rc=0)
    assert [n.op_type for n in onnx.load(dst).graph.node].count("Split") == 1
    bad = run_cli("simplify", src, dst, "--fuse", "packing", check_rc=2)
    assert "unknown fusion 'packing'" in bad.stderr and "qkv" in bad.stderr
