"""Matcher defects of issue 13, each with the model that showed it (these failed before the fix)."""

from __future__ import annotations

import hashlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import run_cli, run_ort
from graphkit.errors import RewriteError
from graphkit.rewrite import Lowering, Rule, RuleSet, rewrite_model

F = TensorProto.FLOAT
RNG = np.random.default_rng(0)


def model(nodes, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, F, s) for n, s in inputs],
                              [helper.make_tensor_value_info(n, F, s) for n, s in outputs],
                              initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def feeds(m):
    return {i.name: RNG.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
            for i in m.graph.input}


def same_numbers(a, b, rtol=1e-5):
    x = feeds(a)
    for want, got in zip(run_ort(a, x), run_ort(b, x)):
        np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-6)


def ops(m):
    return [n.op_type for n in m.graph.node]


def test_node_with_two_sub_pattern_inputs_matches():
    """
    x   y  x   z
     Mul    Mul          ->   x * (y + z)
        \\  /
         Add
    """
    m = model([helper.make_node("Mul", ["x", "y"], ["a"], name="m1"),
               helper.make_node("Mul", ["x", "z"], ["b"], name="m2"),
               helper.make_node("Add", ["a", "b"], ["out"], name="add")],
              [("x", [4]), ("y", [4]), ("z", [4])], [("out", [4])])
    rule = Rule("factor", lambda op, x, y, z: op.Add(op.Mul(x, y), op.Mul(x, z)),
                lambda op, x, y, z: op.Mul(x, op.Add(y, z)))
    out, report = rewrite_model(m, rules=[rule], lowering=Lowering.KEEP)
    assert report.rules.applied == {"factor": 1}
    assert ops(out) == ["Add", "Mul"]
    same_numbers(m, out)


def test_commute_backtracks_across_sibling_inputs():
    """Pattern x*s + x; the graph has s*x + x (the Mul's order only shows at the Add's second input)."""
    m = model([helper.make_node("Mul", ["s", "x"], ["p"], name="mul"),
               helper.make_node("Add", ["p", "x"], ["out"], name="add")],
              [("x", [4]), ("s", [4])], [("out", [4])])

    def rewrite(op, x, s):
        return op.Mul(x, op.Add(s, op.constant(1.0, dtype=F)))

    rule = Rule("scale_plus_self", lambda op, x, s: op.Add(op.Mul(x, s), x), rewrite, commute=True)
    out, report = rewrite_model(m, rules=[rule], lowering=Lowering.KEEP)
    assert report.rules.applied == {"scale_plus_self": 1}
    assert list(out.graph.node[-1].input)[0] == "x"
    same_numbers(m, out)


def test_absent_attribute_reaches_predicate_as_schema_default():
    m = model([helper.make_node("LeakyRelu", ["x"], ["out"], name="lr")], [("x", [4])], [("out", [4])])
    seen = []

    def default_alpha(alpha):
        seen.append(alpha)
        return np.isclose(alpha, 0.01)

    tag = Rule.node("tag_default_leaky", "LeakyRelu", lambda op, x0: op.Relu(x0), alpha=default_alpha)
    rule_exact = Rule.node("gemm_plain", "Gemm", lambda op, x0, x1: op.MatMul(x0, x1), inputs=2, transA=0, transB=0,
                           alpha=1.0)
    out, report = rewrite_model(m, rules=[tag], lowering=Lowering.KEEP)
    assert report.rules.applied == {"tag_default_leaky": 1} and seen and np.isclose(seen[0], 0.01)
    g = model([helper.make_node("Gemm", ["a", "b"], ["out"], name="gemm")], [("a", [2, 3]), ("b", [3, 4])],
              [("out", [2, 4])])
    out, report = rewrite_model(g, rules=[rule_exact], lowering=Lowering.KEEP)
    assert ops(out) == ["MatMul"]
    same_numbers(g, out)


def test_tuple_attribute_constraint_matches_the_list():
    m = model([helper.make_node("Transpose", ["x"], ["out"], perm=[1, 0], name="t")], [("x", [2, 3])],
              [("out", [3, 2])])
    rule = Rule.node("t10", "Transpose", lambda op, x0: op.Transpose(x0, perm=[1, 0], _domain="custom"),
                     perm=(1, 0))
    out, report = rewrite_model(m, rules=[rule], lowering=Lowering.KEEP)
    assert report.rules.applied == {"t10": 1}
    _, report = rewrite_model(m, rules=[Rule.node("t01", "Transpose", lambda op, x0: x0, perm=(0, 1))],
                              lowering=Lowering.KEEP)
    assert report.rules.applied.get("t01", 0) == 0
    assert "attribute perm=[1, 0] does not match" in report.rules.reasons["t01"][0]


def test_raising_predicate_is_a_rule_error_naming_rule_node_and_exception(tmp_path):
    from graphkit.errors import RuleError

    m = model([helper.make_node("LeakyRelu", ["x"], ["out"], name="lr", alpha=0.5)], [("x", [4])], [("out", [4])])
    rule = Rule.node("bad_pred", "LeakyRelu", lambda op, x0: op.Relu(x0), alpha=lambda a: a["key"])
    with pytest.raises(RuleError) as info:
        rewrite_model(m, rules=[rule], lowering=Lowering.KEEP)
    text = str(info.value)
    assert "rule 'bad_pred'" in text and "node 'lr'" in text and "TypeError" in text
    assert info.value.exit_code == 14
    onnx.save(m, tmp_path / "m.onnx")
    rules = tmp_path / "bad_rules.py"
    rules.write_text("from graphkit.rewrite import Rule, RuleSet\n"
                     "rules = RuleSet([Rule.node('bad_pred', 'LeakyRelu', lambda op, x0: op.Relu(x0),\n"
                     "                           alpha=lambda a: 1 / 0)])\n")
    proc = run_cli("rewrite", tmp_path / "m.onnx", tmp_path / "o.onnx", "--rules", rules, check_rc=14)
    assert "bad_pred" in proc.stderr and "ZeroDivisionError" in proc.stderr and "lr" in proc.stderr
    assert not (tmp_path / "o.onnx").exists()


def test_check_and_rewrite_errors_are_rule_errors_naming_the_node():
    from graphkit.errors import RuleError

    m = model([helper.make_node("Relu", ["x"], ["out"], name="r")], [("x", [4])], [("out", [4])])
    with pytest.raises(RuleError, match=r"node 'r'.*rule 'c': check\(\) raised KeyError"):
        rewrite_model(m, rules=[Rule.node("c", "Relu", lambda op, x0: x0, check=lambda ctx, x0: {}["k"])])
    with pytest.raises(RuleError, match=r"rule 'w': rewrite\(\) raised ValueError"):
        rewrite_model(m, rules=[Rule.node("w", "Relu", lambda op, x0: int("x"))])
    with pytest.raises(RuleError, match=r"rule 'none': rewrite\(\) returned None, not tensor names"):
        rewrite_model(m, rules=[Rule.node("none", "Relu", lambda op, x0: None)])
    with pytest.raises(RuleError, match=r"rule 'two': rewrite\(\) returned 2 tensors for the pattern's 1 outputs"):
        rewrite_model(m, rules=[Rule.node("two", "Relu", lambda op, x0: (x0, x0))])


def test_rule_that_reproduces_its_pattern_stops_with_an_error_naming_it():
    from graphkit.errors import RuleError

    m = model([helper.make_node("Relu", ["x"], ["out"], name="r")], [("x", [4])], [("out", [4])])
    again = Rule.node("relu_again", "Relu", lambda op, x0: op.Relu(op.Relu(x0)))
    with pytest.raises(RuleError, match="after 10 rounds rule 'relu_again' \\(.*x\\) still rewrites"):
        rewrite_model(m, rules=[again], lowering=Lowering.KEEP)
    with pytest.raises(RuleError, match="after 3 rounds"):
        rewrite_model(m, rules=RuleSet([again], max_rounds=3), lowering=Lowering.KEEP)
    # a replacement equal to the matched node changes nothing: no round is spent on it
    same = Rule.node("relu_same", "Relu", lambda op, x0: op.Relu(x0))
    out, report = rewrite_model(m, rules=[same], lowering=Lowering.KEEP)
    assert report.rules.applied.get("relu_same", 0) == 0 and ops(out) == ["Relu"]


def scale_model(external_dir=None):
    """
    x   W (initializer, 64 floats)     keep (initializer, used before and after)
     \\ /
     Mul -> Add(., keep) -> out          unused (initializer, unused before: stays)
    """
    w = numpy_helper.from_array(np.full(64, 2.0, np.float32), "W")
    keep = numpy_helper.from_array(np.arange(64, dtype=np.float32), "keep")
    unused = numpy_helper.from_array(np.ones(3, np.float32), "unused")
    m = model([helper.make_node("Mul", ["x", "W"], ["p"], name="mul"),
               helper.make_node("Add", ["p", "keep"], ["out"], name="add")],
              [("x", [64])], [("out", [64])], initializers=[w, keep, unused])
    return m


def double_rule():
    return Rule("mul2_to_add", lambda op, x: op.Mul(x, 2.0), lambda op, x: op.Add(x, x))


def test_initializer_left_unused_by_a_rewrite_is_pruned():
    m = scale_model()
    out, report = rewrite_model(m, rules=[double_rule()], lowering=Lowering.KEEP)
    assert report.rules.applied == {"mul2_to_add": 1}
    assert [t.name for t in out.graph.initializer] == ["keep", "unused"]
    assert [t.name for t in m.graph.initializer] == ["W", "keep", "unused"]  # input untouched
    same_numbers(m, out)


def test_pruning_never_touches_external_data_files(tmp_path):
    import graphkit

    m = scale_model()
    onnx.save(m, tmp_path / "m.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
              location="m.data", size_threshold=0)
    data = tmp_path / "m.data"
    digest = hashlib.sha256(data.read_bytes()).hexdigest()
    loaded = graphkit.load_model(str(tmp_path / "m.onnx"))
    out, _ = rewrite_model(loaded, rules=[double_rule()], lowering=Lowering.KEEP, path=str(tmp_path / "m.onnx"))
    assert "W" not in {t.name for t in out.graph.initializer}
    (tmp_path / "o").mkdir()
    graphkit.save_model(out, str(tmp_path / "o" / "out.onnx"), input_path=str(tmp_path / "m.onnx"))
    assert hashlib.sha256(data.read_bytes()).hexdigest() == digest
    x = {"x": RNG.standard_normal(64).astype(np.float32)}
    import onnxruntime as ort

    got = ort.InferenceSession(str(tmp_path / "o" / "out.onnx"), providers=["CPUExecutionProvider"]).run(None, x)
    np.testing.assert_allclose(got[0], 2 * x["x"] + np.arange(64, dtype=np.float32), rtol=1e-6)


def many_adds_model(n=30):
    """x -> Relu -> Add(., x) -> Relu -> Add ... (n Adds, none fed by Mul(., 2))."""
    nodes, prev = [], "x"
    for i in range(n):
        nodes.append(helper.make_node("Relu", [prev], [f"r{i}"], name=f"relu{i}"))
        nodes.append(helper.make_node("Add", [f"r{i}", "x"], [f"a{i}"], name=f"add{i}"))
        prev = f"a{i}"
    nodes.append(helper.make_node("Mul", [prev, "two"], ["m"], name="mul"))
    nodes.append(helper.make_node("Add", ["m", "x"], ["out"], name="last"))
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    return model(nodes, [("x", [3])], [("out", [3])], initializers=[two])


def test_explain_summarises_per_rule_and_lists_nodes_only_with_all(tmp_path):
    onnx.save(many_adds_model(), tmp_path / "m.onnx")
    rules = tmp_path / "r.py"
    rules.write_text("from graphkit.rewrite import Rule, RuleSet\n"
                     "rules = RuleSet([Rule('fuse', lambda op, x, y: op.Add(op.Mul(x, 2.0), y),\n"
                     "                      lambda op, x, y: op.my_add(x, y, _domain='custom'))])\n")
    args = ("rewrite", tmp_path / "m.onnx", tmp_path / "o.onnx", "--keep-custom", "--rules", rules)
    summary = run_cli(*args, "--explain", check_rc=0).stdout
    lines = summary[summary.index("rule fuse: applied"):].splitlines()
    assert lines == ["rule fuse: applied 1x (1 matched, 30 not)",
                     "  30x no match: Mul input is produced by Relu"]
    full = run_cli(*args, "--explain=all", check_rc=0).stdout
    listed = [line for line in full.splitlines() if line.startswith("  no match: ")]
    assert len(listed) == 30 and "node 'add7'" in listed[7]


def test_reasons_are_not_repeated_across_rounds():
    """The rule applies in round 1; round 2 re-tries the rest: each node's reason is kept once."""
    out, report = rewrite_model(many_adds_model(5), rules=[Rule(
        "fuse", lambda op, x, y: op.Add(op.Mul(x, 2.0), y), lambda op, x, y: op.Sub(x, y))],
        lowering=Lowering.KEEP)
    assert report.rules.applied == {"fuse": 1}
    assert len(report.rules.reasons["fuse"]) == 5
    assert report.to_dict()["rules"]["fuse"]["top_reasons"] == {"Mul input is produced by Relu": 5}


def test_unknown_rewrite_parameter_is_named():
    with pytest.raises(RewriteError, match="rewrite\\(\\) takes 'z', which the pattern does not bind"):
        Rule("r", lambda op, x: op.Relu(x), lambda op, x, z: x)


def test_a_match_vetoed_in_every_round_counts_once():
    """Two Mul(., 2) + Add blocks; check refuses the second. The first is rewritten in round 1,
    round 2 confirms: 2 matches (not 3), 1 applied, the veto reason once."""
    m = model([helper.make_node("Mul", ["x", "two"], ["m1"], name="mul1"),
               helper.make_node("Add", ["m1", "y"], ["a1"], name="add1"),
               helper.make_node("Mul", ["a1", "two"], ["m2"], name="mul2"),
               helper.make_node("Add", ["m2", "y"], ["out"], name="add2")],
              [("x", [3]), ("y", [3])], [("out", [3])],
              initializers=[numpy_helper.from_array(np.array(2.0, np.float32), "two")])
    from graphkit.rewrite import MatchResult

    def check(ctx, x, y):
        return MatchResult().fail("not the second") if ctx.nodes[0].name == "add2" else MatchResult()

    rule = Rule("fuse", lambda op, x, y: op.Add(op.Mul(x, 2.0), y), lambda op, x, y: op.Sub(op.Mul(x, op.initializer(np.float32(2))), op.Neg(y)), check=check)
    out, report = rewrite_model(m, rules=[rule], lowering=Lowering.KEEP)
    assert report.rules.applied == {"fuse": 1} and report.rules.matched == {"fuse": 2}
    assert report.rules.reasons["fuse"] == ["node 'add2': not the second"]
    assert report.rules.explain().splitlines()[0] == "rule fuse: applied 1x (2 matched, 1 not)"
    same_numbers(m, out)


def _double_rule():
    return Rule("double", lambda op, x: op.Mul(x, 2.0), lambda op, x: op.Add(x, x))


def test_an_initializer_that_is_also_an_input_is_not_a_constant():
    """It may be fed at run time: a rule must not bake its default value in."""
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    m = model([helper.make_node("Mul", ["x", "two"], ["out"], name="m")], [("x", [4])], [("out", [4])], [two])
    _, report = rewrite_model(m, rules=[_double_rule()], lowering=Lowering.KEEP)
    assert report.rules.applied.get("double", 0) == 1  # a plain initializer is a constant
    m.graph.input.append(helper.make_tensor_value_info("two", F, []))
    _, report = rewrite_model(m, rules=[_double_rule()], lowering=Lowering.KEEP)
    assert report.rules.applied.get("double", 0) == 0


def test_external_data_outside_the_model_folder_is_never_read_as_a_constant(tmp_path):
    """A hostile location is not a constant (no read outside the folder, no internal error)."""
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    two.data_location = TensorProto.EXTERNAL
    two.ClearField("raw_data")
    for key, value in (("location", "../secret.bin"), ("offset", "0"), ("length", "4")):
        entry = two.external_data.add()
        entry.key, entry.value = key, value
    (tmp_path / "secret.bin").write_bytes(np.array(2.0, np.float32).tobytes())
    (tmp_path / "m").mkdir()
    m = model([helper.make_node("Mul", ["x", "two"], ["out"], name="m")], [("x", [4])], [("out", [4])], [two])
    _, report = rewrite_model(m, rules=[_double_rule()], lowering=Lowering.KEEP, check=False,
                              path=str(tmp_path / "m" / "model.onnx"))
    assert report.rules.applied.get("double", 0) == 0


def test_a_checks_constant_has_the_type_onnx_gives_it():
    """MatchContext.constant (GraphView) and simplify read a Constant node with one reader:
    value_float is float32 and value_int int64 in ONNX (the view gave float64 before)."""
    seen = {}

    def check(ctx, x, c):
        seen["value"] = ctx.constant(c)
        return False

    for attr, want in (("value_float", np.float32), ("value_int", np.int64), ("value_floats", np.float32)):
        value = 2.0 if attr == "value_float" else [2.0] if attr == "value_floats" else 2
        m = model([helper.make_node("Constant", [], ["c"], **{attr: value}), helper.make_node("Mul", ["x", "c"], ["y"])],
                  [("x", [2])], [("y", [2])])
        seen.clear()
        rewrite_model(m, rules=RuleSet([Rule("probe", lambda op, x, c: op.Mul(x, c), lambda op, x, c: x,
                                             check=check)]))
        assert seen["value"].dtype == want, attr
