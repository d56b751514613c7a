"""Each simplify pass alone (every other one skipped) on a small model made for it: the
pass reports a change, the graph's inputs and outputs are the same protos, and ONNX
Runtime gives the same values before and after at two batch sizes (issue 26, "every pass
is checked by a differential test"). cancel-reshapes' own cases are here too."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import assert_same_outputs
from graphkit.rewrite.simplify import PASS_NAMES, simplify_model, simplify_options

F = TensorProto.FLOAT
BATCHES = (1, 3)


def vi(name, dims, elem=F):
    return helper.make_tensor_value_info(name, elem, dims)


def init(name, value):
    return numpy_helper.from_array(np.asarray(value), name)


def model_of(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    imports = [helper.make_opsetid("", opset), helper.make_opsetid("custom", 1)]
    return helper.make_model(graph, opset_imports=imports, ir_version=9)


def x_model(nodes, inits=(), out_dims=("b", 4, 6)):
    """x[b, 4, 6] -> ... -> y."""
    return model_of(nodes, [vi("x", ["b", 4, 6])], [vi("y", list(out_dims))], inits)


def x_feeds(seed):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((n, 4, 6)).astype(np.float32)} for n in BATCHES]


def run(model, feeds):
    from graphkit.runtime import open_session

    return open_session(model).run(feeds)


def same_values(model, out, feeds_list):
    assert_same_outputs(run, model, out, feeds_list)


def _lift():
    c = helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.linspace(-1, 1, 6, dtype=np.float32)))
    return x_model([c, helper.make_node("Add", ["x", "c"], ["y"])]), x_feeds(1)


def _fold_constants():
    nodes = [helper.make_node("Mul", ["two", "three"], ["six"]), helper.make_node("Sqrt", ["six"], ["r"]),
             helper.make_node("Add", ["x", "r"], ["y"])]
    return x_model(nodes, [init("two", np.float32(2)), init("three", np.full(6, 3, np.float32))]), x_feeds(2)


def _fold_shapes():
    #   Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), [24])) then back with [0, 4, 6]
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Unsqueeze", ["n", "ax"], ["n1"]),
             helper.make_node("Concat", ["n1", "rest"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Reshape", ["r", "back"], ["y"])]
    inits = [init("zero", np.int64(0)), init("ax", np.array([0], np.int64)), init("rest", np.array([24], np.int64)),
             init("back", np.array([0, 4, 6], np.int64))]
    return x_model(nodes, inits), x_feeds(3)


def _remove_no_ops():
    nodes = [helper.make_node("Identity", ["x"], ["a"]), helper.make_node("Cast", ["a"], ["b"], to=F),
             helper.make_node("Transpose", ["b"], ["c"], perm=[0, 1, 2]), helper.make_node("Dropout", ["c"], ["d"]),
             helper.make_node("Mul", ["d", "one"], ["e"]), helper.make_node("Tanh", ["e"], ["y"])]
    return x_model(nodes, [init("one", np.float32(1))]), x_feeds(4)


def _cancel_reshapes():
    # what a dynamo export writes around a GELU: [b, 4, 6] -> [-1, 6] -> scalar ops -> [-1, 4, 6]
    nodes = [helper.make_node("Reshape", ["x", "flat"], ["f"]), helper.make_node("Mul", ["f", "half"], ["m"]),
             helper.make_node("Add", ["m", "shift"], ["a"]), helper.make_node("Tanh", ["a"], ["t"]),
             helper.make_node("Reshape", ["t", "back"], ["y"])]
    inits = [init("flat", np.array([-1, 6], np.int64)), init("back", np.array([-1, 4, 6], np.int64)),
             init("half", np.float32(0.5)), init("shift", np.array([0.25], np.float32))]
    return x_model(nodes, inits), x_feeds(5)


def _absorb():
    rng = np.random.default_rng(6)
    c, m = 3, 4
    inits = [init("w", rng.standard_normal((m, c, 3, 3)).astype(np.float32)),
             init("bias", rng.standard_normal(m).astype(np.float32)),
             init("g", rng.uniform(0.5, 2, m).astype(np.float32)), init("be", rng.standard_normal(m).astype(np.float32)),
             init("mu", rng.standard_normal(m).astype(np.float32)), init("var", rng.uniform(0.5, 2, m).astype(np.float32))]
    nodes = [helper.make_node("deform_conv2d", ["x", "w", "off", "bias"], ["d"], domain="custom", padding=[0, 0]),
             helper.make_node("BatchNormalization", ["d", "g", "be", "mu", "var"], ["y"], epsilon=1e-3)]
    model = model_of(nodes, [vi("x", ["n", c, 8, 8]), vi("off", ["n", 18, 6, 6])], [vi("y", ["n", m, 6, 6])], inits,
                     opset=18)
    feeds = [{"x": rng.standard_normal((n, c, 8, 8)).astype(np.float32),
              "off": (rng.standard_normal((n, 18, 6, 6)) * 0.7).astype(np.float32)} for n in BATCHES]
    return model, feeds


def _merge_constants():
    w = np.random.default_rng(7).standard_normal(6).astype(np.float32)
    nodes = [helper.make_node("Mul", ["x", "w1"], ["a"]), helper.make_node("Add", ["a", "w2"], ["y"])]
    return x_model(nodes, [init("w1", w), init("w2", w.copy())]), x_feeds(7)


def _eliminate_common():
    nodes = [helper.make_node("Sigmoid", ["x"], ["p"]), helper.make_node("Sigmoid", ["x"], ["q"]),
             helper.make_node("Mul", ["p", "q"], ["y"])]
    return x_model(nodes), x_feeds(8)


def _eliminate_dead():
    nodes = [helper.make_node("Exp", ["x"], ["unused"]), helper.make_node("Relu", ["x"], ["y"])]
    return x_model(nodes, [init("never_read", np.ones(3, np.float32))]), x_feeds(9)


def _fuse():
    # MatMul + bias on a 2-D input: the gemm fusion
    rng = np.random.default_rng(10)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "bias"], ["y"])]
    inits = [init("w", rng.standard_normal((6, 5)).astype(np.float32)), init("bias", rng.standard_normal(5).astype(np.float32))]
    model = model_of(nodes, [vi("x", ["b", 6])], [vi("y", ["b", 5])], inits)
    return model, [{"x": rng.standard_normal((n, 6)).astype(np.float32)} for n in BATCHES]


CASES = {"lift-constants": _lift, "fold-constants": _fold_constants, "fold-shapes": _fold_shapes,
         "remove-no-ops": _remove_no_ops, "cancel-reshapes": _cancel_reshapes, "absorb-into-custom-ops": _absorb,
         "merge-constants": _merge_constants, "eliminate-common": _eliminate_common,
         "eliminate-dead": _eliminate_dead, "fuse": _fuse}


def test_every_pass_has_a_case():
    assert tuple(CASES) == PASS_NAMES


# fold-shapes reads the shape values fold-constants follows (Shape -> Gather -> ... with
# their symbolic dims): without it, it has none to make constant.
NEEDS = {"fold-shapes": {"fold-constants"}}


def _size(model):
    return len(model.graph.node), len(model.graph.initializer)


@pytest.mark.parametrize("name", PASS_NAMES)
def test_each_pass_alone_changes_the_model_and_not_its_values(name):
    model, feeds = CASES[name]()
    onnx.checker.check_model(model)
    out, report = simplify_model(model, options=simplify_options(skip=set(PASS_NAMES) - {name} - NEEDS.get(name, set())))
    reported = [p for p, _ in report.passes if p.startswith("simplify:")]
    assert reported == [f"simplify:{name}"], report.passes
    assert _size(out) != _size(model) or [n.op_type for n in out.graph.node] != [n.op_type for n in model.graph.node]
    for field in ("input", "output"):
        assert ([v.SerializeToString() for v in getattr(out.graph, field)]
                == [v.SerializeToString() for v in getattr(model.graph, field)]), field
    onnx.checker.check_model(out)
    same_values(model, out, feeds)


# -- cancel-reshapes -----------------------------------------------------------------------

def ops(model):
    return [n.op_type for n in model.graph.node]


def only_cancel(model):
    out, _ = simplify_model(model, options=simplify_options(skip=set(PASS_NAMES) - {"cancel-reshapes"}))
    return out


def test_both_reshapes_go_and_the_ops_between_compute_on_the_input():
    model, feeds = _cancel_reshapes()
    out = only_cancel(model)
    assert ops(out) == ["Mul", "Add", "Tanh"] and out.graph.node[-1].output[0] == "y"
    same_values(model, out, feeds)


@pytest.mark.parametrize("change", ["operand_per_row", "read_outside", "other_shape", "reshape_is_output"])
def test_a_reshape_pair_that_does_not_cancel_stays(change):
    model, feeds = _cancel_reshapes()
    g = model.graph
    if change == "operand_per_row":  # [b, 24] * a [24] row: on x's [b, 4, 6] it would not broadcast
        g.initializer[0].CopyFrom(init("flat", np.array([-1, 24], np.int64)))
        g.initializer.append(init("row", np.linspace(1, 2, 24, dtype=np.float32)))
        g.node[1].input[1] = "row"
    elif change == "read_outside":  # what the region makes is also a graph output
        g.output.append(vi("m", ["r", 6]))  # (r: the rows, 4b)
    elif change == "other_shape":  # back to [b, 6, 4], not x's [b, 4, 6]
        g.initializer[1].CopyFrom(init("back", np.array([-1, 6, 4], np.int64)))
        g.output[0].CopyFrom(vi("y", ["b", 6, 4]))
    else:
        g.output.append(vi("f", ["r", 6]))
    out = only_cancel(model)
    assert ops(out).count("Reshape") == 2, ops(out)
    same_values(model, out, feeds)


def _dead_reader_hides_a_reshape_pair():
    # cancel-reshapes runs before eliminate-dead: only the next round sees the pair cancel
    model, feeds = _cancel_reshapes()
    model.graph.node.append(helper.make_node("ReduceSum", ["m"], ["never_read"]))  # (not elementwise)
    return model, feeds


@pytest.mark.parametrize("name", [*PASS_NAMES, "dead-reader"])
def test_simplify_stops_at_a_fixed_point(name):
    """The passes and the fusions repeat until none changes the model: simplifying the output
    again changes nothing (on each pass's model, every pass on)."""
    model, feeds = CASES[name]() if name in CASES else _dead_reader_hides_a_reshape_pair()
    once, _ = simplify_model(model)
    twice, report = simplify_model(once)
    assert not [p for p, _ in report.passes if p.startswith("simplify")], report.passes
    assert twice.graph.SerializeToString() == once.graph.SerializeToString()
    same_values(model, once, feeds)
