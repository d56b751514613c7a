"""Pattern rules: multi-node matching, commutation, constants, consumers, reasons."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import REPO, run_cli, run_ort
from graphkit.errors import RewriteError
from graphkit.rewrite import Lowering, MatchResult, Rule, RuleSet, rewrite_model


def fuse_rule(**kw):
    return Rule("fuse_my_add", lambda op, x, y: op.Add(op.Mul(x, 2.0), y),
                lambda op, x, y: op.my_add(x, y, _domain="custom"), **kw)


def mul_add_model(two=2.0, swap_mul=False, swap_add=False, extra_consumer=False, as_initializer=False,
                  dtype=np.float32):
    """
      x   2          x: input, 2: Constant (or initializer)
       \\ /
       Mul -> m      (m optionally also feeds Neg -> n, an extra output)
         \\  y
          Add -> z
    """
    const = numpy_helper.from_array(np.array(two, dtype), "two")
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    nodes = [] if as_initializer else [helper.make_node("Constant", [], ["two"], value=const, name="c")]
    nodes.append(helper.make_node("Mul", ["two", "x"] if swap_mul else ["x", "two"], ["m"], name="mul"))
    nodes.append(helper.make_node("Add", ["y", "m"] if swap_add else ["m", "y"], ["z"], name="add"))
    outputs = [helper.make_tensor_value_info("z", elem, [3])]
    if extra_consumer:
        nodes.append(helper.make_node("Neg", ["m"], ["n"], name="neg"))
        outputs.append(helper.make_tensor_value_info("n", elem, [3]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(v, elem, [3]) for v in "xy"],
                              outputs, initializer=[const] if as_initializer else [])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


@pytest.mark.parametrize("swap_mul,swap_add", [(False, False), (True, False), (False, True), (True, True)])
def test_fuse_commutative(swap_mul, swap_add):
    out, report = rewrite_model(mul_add_model(swap_mul=swap_mul, swap_add=swap_add),
                                rules=[fuse_rule(commute=True)], lowering=Lowering.KEEP)
    assert [(n.domain, n.op_type) for n in out.graph.node] == [("custom", "my_add")]
    assert list(out.graph.node[0].input) == ["x", "y"] and list(out.graph.node[0].output) == ["z"]
    assert {i.domain: i.version for i in out.opset_import} == {"": 17, "custom": 1}
    assert report.rules.applied == {"fuse_my_add": 1}


def test_without_commute_swapped_inputs_do_not_match_and_say_why():
    out, report = rewrite_model(mul_add_model(swap_mul=True), rules=[fuse_rule()], lowering=Lowering.KEEP)
    assert [n.op_type for n in out.graph.node] == ["Constant", "Mul", "Add"]
    assert "is not a constant" in " ".join(report.rules.reasons["fuse_my_add"])


def test_initializer_constant_matches_and_fused_model_runs_native():
    model = mul_add_model(as_initializer=True)
    out, _ = rewrite_model(model, rules=[fuse_rule()], lowering=Lowering.DECOMPOSE)
    x, y = np.float32([1, 2, 3]), np.float32([4, 5, 6])
    np.testing.assert_allclose(run_ort(out, {"x": x, "y": y})[0], 2 * x + y)


def test_constant_of_other_value_is_not_matched():
    out, report = rewrite_model(mul_add_model(two=3.0), rules=[fuse_rule()], lowering=Lowering.KEEP)
    assert [n.op_type for n in out.graph.node] == ["Constant", "Mul", "Add"]
    assert any("is [3.0], pattern wants 2" in r for r in report.rules.reasons["fuse_my_add"])


def test_inner_node_with_other_consumers_is_not_swallowed():
    out, report = rewrite_model(mul_add_model(extra_consumer=True), rules=[fuse_rule()], lowering=Lowering.KEEP)
    assert "custom" not in {n.domain for n in out.graph.node}
    assert any("has other consumers" in r for r in report.rules.reasons["fuse_my_add"])


@pytest.mark.parametrize("read", ["m", "r"])
def test_a_reader_two_graphs_deep_is_another_consumer(read):
    """A Neg in the branch of an If nested in an If's branch reads ``read``: the main graph's m
    (then the Mul has another consumer and stays), or r, which the outer branch makes (no read
    of the main graph's: the rule applies). ORT gives the model's values either way."""
    from graphkit.rewrite.graph.view import GraphView

    model = mul_add_model()

    def branch(tag: str, nodes: list, out: str) -> onnx.GraphProto:
        return helper.make_graph(nodes, tag, [], [helper.make_tensor_value_info(out, TensorProto.FLOAT, [3])])

    inner = branch("inner", [helper.make_node("Neg", [read], ["in_n"])], "in_n")
    inner_else = branch("inner_else", [helper.make_node("Identity", ["x"], ["in_e"])], "in_e")
    outer = branch("outer", [helper.make_node("Relu", ["x"], ["r"]),
                             helper.make_node("If", ["c"], ["o_y"], then_branch=inner, else_branch=inner_else)], "o_y")
    outer_else = branch("outer_else", [helper.make_node("Identity", ["y"], ["o_e"])], "o_e")
    g = model.graph
    g.node.append(helper.make_node("If", ["c"], ["w"], then_branch=outer, else_branch=outer_else, name="if"))
    g.input.append(helper.make_tensor_value_info("c", TensorProto.BOOL, []))
    g.output.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [3]))
    reads = GraphView(g.node).consumers
    assert "r" not in reads and (len(g.node) - 1 in reads["m"]) is (read == "m")
    out, report = rewrite_model(model, rules=[fuse_rule()])  # (my_add lowered again: ORT runs it)
    assert report.rules.applied == ({} if read == "m" else {"fuse_my_add": 1})
    feeds = {"x": np.float32([1, -2, 3]), "y": np.float32([4, 5, -6]), "c": np.array(True)}
    for got, want in zip(run_ort(out, feeds), run_ort(model, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_check_can_veto_with_reason():
    rule = fuse_rule(check=lambda ctx, x, y: MatchResult().fail("not today"))
    out, report = rewrite_model(mul_add_model(), rules=[rule], lowering=Lowering.KEEP)
    assert len(out.graph.node) == 3
    assert report.rules.reasons["fuse_my_add"] == ["node 'add': not today"]
    assert "no match: node 'add': not today" in report.rules.explain(all=True)
    assert report.rules.explain() == "rule fuse_my_add: applied 0x (1 matched, 1 not)\n  1x no match: not today"


def _sample_rules():
    from graphkit.errors import UsageError
    from graphkit.usercode import import_user_code

    module = import_user_code(str(REPO / "samples" / "rules" / "fuse_my_add.py"), what="rules",
                              failure=UsageError, example="my_rules.py")
    return module.rules


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_sample_rule_fuses_float_models(dtype):
    out, report = rewrite_model(mul_add_model(dtype=dtype, swap_add=True), rules=_sample_rules(),
                                lowering=Lowering.KEEP)
    assert [(n.domain, n.op_type) for n in out.graph.node] == [("custom", "my_add")]
    assert report.rules.applied == {"fuse_my_add": 1}


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_sample_rule_same_dtype_refuses_integer_models(dtype):
    """samples/rules' same_dtype check is real: Mul(x, 2) + y on integers is no my_add."""
    model = mul_add_model(dtype=dtype)
    onnx.checker.check_model(model, full_check=True)
    out, report = rewrite_model(model, rules=_sample_rules(), lowering=Lowering.KEEP)
    assert [n.op_type for n in out.graph.node] == ["Constant", "Mul", "Add"]
    assert report.rules.applied.get("fuse_my_add", 0) == 0
    name = np.dtype(dtype).name
    assert report.rules.reasons["fuse_my_add"] == [
        f"node 'add': my_add takes float16/float/double tensors, x and y are {name}"]
    assert f"x and y are {name}" in report.rules.explain()


def test_single_node_rule_with_attribute_predicate():
    graph = helper.make_graph(
        [helper.make_node("LeakyRelu", ["x"], ["y"], alpha=0.0, name="lr0"),
         helper.make_node("LeakyRelu", ["y"], ["z"], alpha=0.1, name="lr1")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    rule = Rule.node("leaky0_to_relu", "LeakyRelu", lambda op, x0: op.Relu(x0), alpha=lambda a: a == 0.0)
    out, report = rewrite_model(model, rules=[rule])
    assert [n.op_type for n in out.graph.node] == ["Relu", "LeakyRelu"]
    assert any("attribute alpha=" in r for r in report.rules.reasons["leaky0_to_relu"])
    x = np.float32([-1, 0, 2])
    np.testing.assert_allclose(run_ort(out, {"x": x})[0], np.maximum(x, 0))


def test_rule_inside_loop_body():
    body = helper.make_graph(
        [helper.make_node("Mul", ["acc_in", "two"], ["m"], name="b_mul"),
         helper.make_node("Add", ["m", "x"], ["acc_out"], name="b_add"),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [3])])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["n", "c", "x"], ["acc"], body=body, name="loop")], "g",
        [helper.make_tensor_value_info("n", TensorProto.INT64, []),
         helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("acc", TensorProto.FLOAT, [3])],
        initializer=[numpy_helper.from_array(np.array(2.0, np.float32), "two")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    out, report = rewrite_model(model, rules=[fuse_rule()])
    assert report.rules.applied == {"fuse_my_add": 1}
    x = np.float32([1, 2, 3])
    (acc,) = run_ort(out, {"n": np.array(3, np.int64), "c": np.array(True), "x": x})
    np.testing.assert_allclose(acc, 15 * x)  # x -> 3x -> 7x -> 15x


def test_bad_pattern_and_duplicate_names_are_errors():
    with pytest.raises(RewriteError, match="pattern must return an op"):
        Rule("bad", lambda op, x: x, lambda op, x: x)
    with pytest.raises(RewriteError, match="pattern must return an op"):  # every root is an op
        Rule("bad", lambda op, x: (op.Relu(x), x), lambda op, x: (x, x))
    with pytest.raises(RewriteError, match="unique"):
        RuleSet([fuse_rule(), fuse_rule()])


def test_rules_file_from_cli_and_explain(tmp_path):
    onnx.save(mul_add_model(), tmp_path / "std.onnx")
    proc = run_cli("rewrite", tmp_path / "std.onnx", tmp_path / "fused.onnx", "--keep-custom", "--explain",
                   "--rules", REPO / "samples" / "rules" / "fuse_my_add.py", check_rc=0)
    assert "rule fuse_my_add: applied 1x" in proc.stdout
    fused = onnx.load(tmp_path / "fused.onnx")
    assert [(n.domain, n.op_type) for n in fused.graph.node] == [("custom", "my_add")]


def test_rules_file_errors(tmp_path):
    onnx.save(mul_add_model(), tmp_path / "m.onnx")
    proc = run_cli("rewrite", tmp_path / "m.onnx", tmp_path / "o.onnx", "--rules", tmp_path / "none.py", check_rc=2)
    assert "none.py" in proc.stderr
    bad = tmp_path / "bad.py"
    bad.write_text("raise ValueError('boom')\n")
    proc = run_cli("rewrite", tmp_path / "m.onnx", tmp_path / "o.onnx", "--rules", bad, check_rc=7)
    assert "bad.py" in proc.stderr and "boom" in proc.stderr
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    proc = run_cli("rewrite", tmp_path / "m.onnx", tmp_path / "o.onnx", "--rules", empty, check_rc=7)
    assert "defines no 'rules'" in proc.stderr
    assert not (tmp_path / "o.onnx").exists()


def test_graphsurgeon_rule_rewrites_and_reports():
    """
    x -> Relu -> Neg -> y     becomes     x -> Clip(0, 6) -> Neg -> y
    """
    import onnx_graphsurgeon as gs

    from graphkit.rewrite import GraphSurgeonRule

    def relu_to_clip(graph):
        count = 0
        for node in graph.nodes:
            if node.op == "Relu":
                node.op = "Clip"
                node.inputs += [gs.Constant(f"{node.name}_lo", np.array(0, np.float32)),
                                gs.Constant(f"{node.name}_hi", np.array(6, np.float32))]
                count += 1
        return count or MatchResult().fail("no Relu")

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                               helper.make_node("Neg", ["r"], ["y"], name="neg")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    rule = GraphSurgeonRule("relu_to_clip", relu_to_clip)
    out, report = rewrite_model(model, rules=[rule])
    assert [n.op_type for n in out.graph.node] == ["Clip", "Neg"]
    assert report.rules.applied == {"relu_to_clip": 1}
    x = np.float32([-1, 3, 9])
    np.testing.assert_allclose(run_ort(out, {"x": x})[0], -np.clip(x, 0, 6))
    assert report.rules.explain() == "rule relu_to_clip: applied 1x (1 matched, 0 not)"
    again, report = rewrite_model(out, rules=[rule])
    assert report.rules.reasons["relu_to_clip"] == ["no Relu"]
    assert report.rules.explain() == "rule relu_to_clip: applied 0x (0 matched, 1 not)\n  1x no match: no Relu"
    assert again.SerializeToString() == out.SerializeToString()


def test_graphsurgeon_rule_that_raises_is_named():
    from graphkit.rewrite import GraphSurgeonRule

    def boom(graph):
        raise KeyError("nope")

    with pytest.raises(RewriteError, match="rule 'boom' raised KeyError"):
        rewrite_model(mul_add_model(), rules=[GraphSurgeonRule("boom", boom)])


def test_check_that_returns_nothing_says_so():
    rule = fuse_rule(check=lambda ctx, x, y: None)  # forgot the return
    out, report = rewrite_model(mul_add_model(), rules=[rule], lowering=Lowering.KEEP)
    assert len(out.graph.node) == 3
    assert report.rules.reasons["fuse_my_add"] == ["node 'add': check returned None"]


@pytest.mark.parametrize("traced", [True, False], ids=["traced", "per-match"])
def test_rules_functions_are_not_kept_alive_after_the_rewrite(traced):
    """The rule engine's caches (how a function takes its bindings) hold no rule's functions:
    once the caller drops the rule, its rewrite and check (and what they capture) are freed."""
    import gc
    import weakref

    class Payload:  # what a user's functions may capture: big weights, a session
        pass

    def make_rule():
        payload = Payload()

        def rewrite(op, x0):
            payload  # noqa: B018 - captured on purpose
            return op.Neg(x0)

        def check(ctx, x0):
            return payload is not None

        rule = Rule.node("relu_neg", "Relu", rewrite, check=check, per_match=not traced)
        return rule, weakref.ref(payload), weakref.ref(rewrite), weakref.ref(check)

    model = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Relu", ["y"], ["z"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])]), opset_imports=[helper.make_opsetid("", 17)])
    rule, *refs = make_rule()
    out, report = rewrite_model(model, rules=[rule], lowering=Lowering.KEEP)
    assert report.rules.applied == {"relu_neg": 2} and [n.op_type for n in out.graph.node] == ["Neg", "Neg"]
    del rule
    gc.collect()
    assert [ref() for ref in refs] == [None, None, None]
