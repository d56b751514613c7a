"""The bad-input matrix: `graphkit rewrite`, `inspect`, `run` and the Python API on inputs
a user can get wrong.

Every case checks, beyond its exit code: one stderr line that names the problem and (in
parentheses) the fix, no traceback, every input file byte for byte unchanged and no
partial output (the directory tree is hashed before and after). Cases that must succeed
(NaN/Inf, zero-sized dims) check the output instead. Cases graphkit still gets wrong are
xfail(strict=True) with the place to fix; they turn into failures once fixed, so the
marker gets removed.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import REPO, error_lines, my_add_model
from graphkit.cli import main
from graphkit.errors import EXIT_INTERNAL, GraphkitError

# -- helpers shared with test_hostile.py ---------------------------------------------------------


def snapshot(root: Path) -> dict[str, str]:
    """Relative path -> sha256 (or 'dir'/'fifo'/'link:...') of everything under ``root``."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = "link:" + os.readlink(p)
            elif p.is_dir():
                out[rel] = "dir"
            elif p.is_file():
                st = p.stat()
                out[rel] = (hashlib.sha256(p.read_bytes()).hexdigest() if st.st_size < (64 << 20)
                            else f"big:{st.st_size}:{st.st_mtime_ns}:{st.st_blocks}")
            else:
                out[rel] = "special"
    return out


def save(model: onnx.ModelProto, path: Path) -> Path:
    """Write a model's bytes as they are (onnx.save would refuse invalid ones)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString())
    return path


def external_model(directory: Path, tamper: dict[str, str] | None = None, location: str = "weights.bin") -> Path:
    """m.onnx whose initializer 'w' (64x64 float) lives in weights.bin (tampered if asked).

      x   w (external)
       \\ /
      my_add (custom) -> y
    """
    w = numpy_helper.from_array(np.arange(4096, dtype=np.float32).reshape(64, 64), "w")
    graph = helper.make_graph([helper.make_node("my_add", ["x", "w"], ["y"], domain="custom", name="add")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])], initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)],
                              ir_version=10)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "weights.bin").write_bytes(w.raw_data)
    t = model.graph.initializer[0]
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    entries = {"location": location, "offset": "0", "length": str(4096 * 4), **(tamper or {})}
    for k, v in entries.items():
        t.external_data.add(key=k, value=v)
    return save(model, directory / "m.onnx")


def cli(argv: list, capfd) -> tuple[int, str, str]:
    """graphkit.cli.main(argv) in-process: (exit code, stdout, stderr at the fd level)."""
    capfd.readouterr()
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as exc:  # only argparse may exit; anything else is a finding
        rc = exc.code if isinstance(exc.code, int) else 1
    out, err = capfd.readouterr()
    return rc, out, err


def assert_one_error_line(err: str, rc: int, says: tuple[str, ...], fix: str | None) -> None:
    lines = error_lines(err)
    assert "Traceback" not in err, err
    assert len(lines) == 1, f"expected one stderr line, got {len(lines)}:\n{err}"
    line = lines[0]
    assert rc != EXIT_INTERNAL and "internal error" not in line, line
    assert line.startswith("graphkit: error: "), line
    for text in says:
        assert text in line, f"{text!r} not in {line!r}"
    if fix is not None:
        assert line.rstrip().endswith(")") and fix in line, f"fix {fix!r} not in {line!r}"


def has_custom_attr_op():
    from graphkit.ops import default_registry

    return next((op for op in default_registry() if op.attributes and op.decompositions), None)


def placeholder_model(op, attrs: dict, ir_version: int = 10) -> onnx.ModelProto:
    """One custom::<op> node fed by graph inputs of the op's first allowed type (no shapes)."""
    elem = getattr(TensorProto, op.type_constraints[op.inputs[0].type][0][len("tensor("):-1].upper())
    ins = [p.name for p in op.inputs if not p.optional]
    node = helper.make_node(op.name, ins, [p.name for p in op.outputs], domain="custom", name="n0", **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(i, elem, None) for i in ins],
                              [helper.make_tensor_value_info(o.name, elem, None) for o in op.outputs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19), helper.make_opsetid("custom", 1)],
                             ir_version=ir_version)


# -- the scenarios ---------------------------------------------------------------------------------


@dataclass
class Scenario:
    """What one case runs: CLI ``argv`` or a Python ``api`` call; ``creates`` lists the files a
    successful case writes (relative to tmp_path); ``check`` inspects them."""

    argv: list | None = None
    api: Callable[[], object] | None = None
    creates: tuple[str, ...] = ()
    check: Callable[[Path], None] | None = None
    env: dict = field(default_factory=dict)


def _m(tmp: Path, model: onnx.ModelProto | None = None, name: str = "m.onnx") -> Path:
    return save(model if model is not None else my_add_model(), tmp / "in" / name)


def _out(tmp: Path, name: str = "out.onnx") -> Path:
    (tmp / "out").mkdir(exist_ok=True)
    return tmp / "out" / name


def s_empty_inspect(tmp):
    (tmp / "in").mkdir()
    (tmp / "in" / "m.onnx").write_bytes(b"")
    return Scenario(["inspect", tmp / "in" / "m.onnx"])


def s_empty_run(tmp):
    (tmp / "in").mkdir()
    (tmp / "in" / "m.onnx").write_bytes(b"")
    return Scenario(["run", tmp / "in" / "m.onnx"])


def s_random_bytes_inspect(tmp):
    (tmp / "in").mkdir()
    (tmp / "in" / "m.onnx").write_bytes(random.Random(7).randbytes(4096))
    return Scenario(["inspect", tmp / "in" / "m.onnx"])


def s_random_bytes_run(tmp):
    (tmp / "in").mkdir()
    (tmp / "in" / "m.onnx").write_bytes(random.Random(8).randbytes(4096))
    return Scenario(["run", tmp / "in" / "m.onnx", "--output", _out(tmp, "y.npz")])


def s_truncated_run(tmp):
    data = my_add_model().SerializeToString()
    (tmp / "in").mkdir()
    (tmp / "in" / "m.onnx").write_bytes(data[: len(data) * 2 // 3])
    return Scenario(["run", tmp / "in" / "m.onnx", "--output", _out(tmp, "y.npz")])


def s_truncated_api(tmp):
    import graphkit

    data = my_add_model().SerializeToString()
    (tmp / "in").mkdir()
    (tmp / "in" / "m.onnx").write_bytes(data[:-3])
    return Scenario(api=lambda: graphkit.load_model(tmp / "in" / "m.onnx"))


def s_fifo_model(tmp):
    (tmp / "in").mkdir()
    os.mkfifo(tmp / "in" / "m.onnx")  # opening it would block forever
    return Scenario(["rewrite", tmp / "in" / "m.onnx", _out(tmp)])


def s_symlink_loop_model(tmp):
    (tmp / "in").mkdir()
    os.symlink("m.onnx", tmp / "in" / "m.onnx")
    return Scenario(["inspect", tmp / "in" / "m.onnx"])


def s_cycle(tmp):
    m = my_add_model()
    m.graph.node[0].input[0] = "z"  # add0 reads relu0's output, relu0 reads add0's: a cycle
    return Scenario(["rewrite", _m(tmp, m), _out(tmp)])


def s_cycle_run(tmp):
    m = my_add_model()
    m.graph.node[0].input[0] = "z"
    return Scenario(["run", _m(tmp, m)])


def s_dangling(tmp):
    m = my_add_model()
    m.graph.node[0].input[0] = "nowhere"
    return Scenario(["rewrite", _m(tmp, m), _out(tmp), "--bind", "native"])


def s_dangling_run(tmp):
    m = my_add_model()
    m.graph.node[0].input[0] = "nowhere"
    return Scenario(["run", _m(tmp, m)])


def s_duplicate_outputs(tmp):
    m = my_add_model()
    m.graph.node.append(helper.make_node("Relu", ["a"], ["z"], name="relu1"))  # 'z' produced twice
    return Scenario(["rewrite", _m(tmp, m), _out(tmp)])


def s_duplicate_outputs_run(tmp):
    m = my_add_model()
    m.graph.node.append(helper.make_node("Relu", ["a"], ["z"], name="relu1"))
    return Scenario(["run", _m(tmp, m)])


def s_no_rule_run(tmp):
    m = my_add_model()
    m.graph.node[0].op_type = "frobnicate"
    return Scenario(["run", _m(tmp, m)])


def s_no_rule_as_functions(tmp):
    m = my_add_model()
    m.graph.node[0].op_type = "frobnicate"
    return Scenario(["rewrite", _m(tmp, m), _out(tmp), "--as-functions"])


def s_wrong_arity(tmp):
    m = my_add_model()
    m.graph.node[0].input.append("a")
    return Scenario(["rewrite", _m(tmp, m), _out(tmp), "--bind", "python"])


def s_wrong_arity_api(tmp):
    from graphkit.rewrite import rewrite_model

    m = my_add_model()
    del m.graph.node[0].input[1]
    return Scenario(api=lambda: rewrite_model(m))


def s_wrong_attr_type(tmp):
    op = has_custom_attr_op()
    a = op.attributes[0]
    wrong = "text" if a.type.name != "STRING" else 1.5
    return Scenario(["rewrite", _m(tmp, placeholder_model(op, {a.name: wrong})), _out(tmp)])


def s_unknown_attr_as_functions(tmp):
    m = my_add_model()
    m.graph.node[0].attribute.append(helper.make_attribute("alpha", 1.0))
    return Scenario(["rewrite", _m(tmp, m), _out(tmp), "--as-functions"])


_NEEDS_K = None


def _needs_k_registry():
    """default_registry() plus `needs_k(x) -> x * k` whose INT attribute k is required."""
    global _NEEDS_K
    if _NEEDS_K is None:
        from graphkit.ops import Attr, AttrType, Decomposition, OpDef, Param, default_registry

        def build(b, inputs, attrs):
            return [b.op("Mul", inputs[0], b.constant(attrs["k"], like=inputs[0]))]

        op = OpDef(name="needs_k", doc="x * k", inputs=(Param("x", "T"),), outputs=(Param("y", "T"),),
                   type_constraints={"T": ("tensor(float)",)}, reference=lambda x, k: x * k,
                   infer_shapes=lambda shapes, attrs: [shapes[0]], attributes=(Attr("k", AttrType.INT),),
                   decompositions=(Decomposition("mul", build, min_opset=7),))
        _NEEDS_K = default_registry().with_ops(op)
    return _NEEDS_K


def _needs_k_model(**attrs):
    node = helper.make_node("needs_k", ["x"], ["y"], domain="custom", name="nk", **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)],
                             ir_version=10)


def s_missing_required_attr_api(tmp):
    from graphkit.rewrite import rewrite_model

    return Scenario(api=lambda: rewrite_model(_needs_k_model(), registry=_needs_k_registry()))


def s_wrong_attr_type_api(tmp):
    from graphkit.rewrite import rewrite_model

    return Scenario(api=lambda: rewrite_model(_needs_k_model(k=[1, 2]), registry=_needs_k_registry()))


def s_ir_version_newer(tmp):
    return Scenario(["rewrite", _m(tmp, my_add_model(ir_version=99)), _out(tmp)])


def s_ir_version_newer_run(tmp):
    return Scenario(["run", _m(tmp, my_add_model(ir_version=99))])


def s_opset_ort_lacks(tmp):
    return Scenario(["run", _m(tmp, my_add_model(opset=40))])


def s_ext_missing_run(tmp):
    src = external_model(tmp / "in")
    os.remove(tmp / "in" / "weights.bin")
    return Scenario(["run", src])


def s_ext_missing_rewrite(tmp):
    src = external_model(tmp / "in")
    os.remove(tmp / "in" / "weights.bin")
    return Scenario(["rewrite", src, _out(tmp)])


def s_ext_offset_past_end_run(tmp):
    return Scenario(["run", external_model(tmp / "in", {"offset": "16"})])


def s_ext_offset_past_end_inspect(tmp):
    return Scenario(["inspect", external_model(tmp / "in", {"offset": str(2**62)})])


def s_ext_length_past_end(tmp):
    return Scenario(["rewrite", external_model(tmp / "in", {"length": str(2**62)}), _out(tmp)])


def s_ext_length_past_end_api(tmp):
    from graphkit.runtime import open_session

    src = external_model(tmp / "in", {"length": str(4096 * 4 + 1)})
    return Scenario(api=lambda: open_session(src))


def s_output_is_weights(tmp):
    src = external_model(tmp / "in")
    return Scenario(["rewrite", src, tmp / "in" / "weights.bin"])


def s_output_is_weights_api(tmp):
    import graphkit

    src = external_model(tmp / "in")
    (tmp / "out").mkdir()
    return Scenario(api=lambda: graphkit.save_model(graphkit.load_model(src), tmp / "out" / "weights.bin",
                                                    input_path=src))


def s_run_output_is_model(tmp):
    src = _m(tmp)
    return Scenario(["run", src, "--output", src])


def s_run_output_is_inputs(tmp):
    src = _m(tmp)
    np.savez(tmp / "in" / "x.npz", a=np.ones((2, 3), np.float32), b=np.ones((2, 3), np.float32))
    return Scenario(["run", src, "--inputs", tmp / "in" / "x.npz", "--output", tmp / "in" / "x.npz"])


def s_output_missing_dir_run(tmp):
    return Scenario(["run", _m(tmp), "--output", tmp / "nope" / "y.npz"])


def s_output_missing_dir_api(tmp):
    import graphkit

    src = _m(tmp)
    return Scenario(api=lambda: graphkit.save_model(graphkit.load_model(src), tmp / "nope" / "o.onnx"))


def s_rules_raise_at_import(tmp):
    (tmp / "in").mkdir()
    (tmp / "in" / "rules.py").write_text("raise RuntimeError('broken rules file')\n")
    return Scenario(["rewrite", _m(tmp), _out(tmp), "--rules", tmp / "in" / "rules.py"])


RAISING_RULE = """
from graphkit.rewrite import Rule, RuleSet

def pattern(op, x):
    return op.Relu(x)

def rewrite(op, x):
    {rewrite}

def check(ctx, x):
    {check}

rules = RuleSet([Rule("boom", pattern, rewrite, check=check)])
"""


def s_rules_raise_in_rewrite(tmp):
    (tmp / "in").mkdir()
    (tmp / "in" / "rules.py").write_text(RAISING_RULE.format(rewrite="raise ValueError('boom in rewrite')",
                                                             check="return True"))
    return Scenario(["rewrite", _m(tmp), _out(tmp), "--rules", tmp / "in" / "rules.py"])


def s_rules_raise_in_check(tmp):
    (tmp / "in").mkdir()
    (tmp / "in" / "rules.py").write_text(RAISING_RULE.format(rewrite="return x",
                                                             check="raise KeyError('boom in check')"))
    return Scenario(["rewrite", _m(tmp), _out(tmp), "--rules", tmp / "in" / "rules.py"])


def s_rules_sys_exit(tmp):
    (tmp / "in").mkdir()
    (tmp / "in" / "rules.py").write_text("import sys\nsys.exit(3)\n")
    return Scenario(["rewrite", _m(tmp), _out(tmp), "--rules", tmp / "in" / "rules.py"])


def _bound(tmp, how):
    src = _m(tmp)
    bound = tmp / "in" / f"m.{how}.onnx"
    assert main(["rewrite", str(src), str(bound), "--bind", how]) == 0
    np.savez(tmp / "in" / "x.npz", a=np.ones((2, 3), np.float32), b=np.ones((3, 3), np.float32))
    return bound


def s_python_kernel_raises(tmp):
    return Scenario(["run", _bound(tmp, "python"), "--inputs", tmp / "in" / "x.npz", "--output", _out(tmp, "y.npz")])


def s_native_kernel_raises(tmp):
    return Scenario(["run", _bound(tmp, "native"), "--inputs", tmp / "in" / "x.npz", "--output", _out(tmp, "y.npz")])


def _nan_case(how):
    def scenario(tmp):
        src = _m(tmp)
        model = src
        if how != "placeholder":
            model = tmp / "in" / f"m.{how}.onnx"
            args = ["--bind", how] if how in ("native", "python") else []
            assert main(["rewrite", str(src), str(model), *args]) == 0
        a = np.array([[np.nan, np.inf, -np.inf], [1.0, -np.inf, np.nan]], np.float32)
        b = np.array([[1.0, 2.0, np.inf], [np.inf, np.inf, 0.0]], np.float32)
        np.savez(tmp / "in" / "x.npz", a=a, b=b)

        def check(root):
            z = np.load(root / "out" / "y.npz")["z"]
            with np.errstate(invalid="ignore"):
                np.testing.assert_array_equal(z, np.maximum(2 * a + b, 0))

        return Scenario(["run", model, "--inputs", tmp / "in" / "x.npz", "--output", _out(tmp, "y.npz")],
                        creates=("out/y.npz",), check=check)
    return scenario


def _zero_case(how):
    def scenario(tmp):
        src = _m(tmp, my_add_model(shape_a=("N", 0), shape_b=("N", 0)))
        args = {"decompose": [], "native": ["--bind", "native"], "python": ["--bind", "python"]}[how]
        out = _out(tmp)
        assert main(["rewrite", str(src), str(out), *args]) == 0

        def check(root):
            assert np.load(root / "out" / "y.npz")["z"].shape == (3, 0)

        return Scenario(["run", out, "--dim", "N=3", "--output", _out(tmp, "y.npz")],
                        creates=("out/y.npz",), check=check)
    return scenario


def s_random_inputs_too_big(tmp):
    return Scenario(["run", _m(tmp, my_add_model(shape_a=(2**62, 3), shape_b=(2**62, 3)))])


def s_dim_too_big(tmp):
    return Scenario(["run", _m(tmp), "--dim", f"N={2**40}"])


def s_inputs_wrong_dtype(tmp):
    src = _m(tmp)
    np.savez(tmp / "in" / "x.npz", a=np.ones((2, 3)), b=np.ones((2, 3)))
    return Scenario(["run", src, "--inputs", tmp / "in" / "x.npz"])


def s_inputs_pickled(tmp):
    import pickle  # noqa: S403 - writing the hostile file only; graphkit must refuse to load it

    src = _m(tmp)
    (tmp / "in" / "x.npz").write_bytes(pickle.dumps({"a": 1}))
    return Scenario(["run", src, "--inputs", tmp / "in" / "x.npz"])


def s_output_named_file(tmp):
    m = my_add_model()
    m.graph.node[1].output[0] = "file"  # np.savez(fh, **outputs) used to collide with 'file'
    m.graph.output[0].name = "file"

    def check(root):
        assert np.load(root / "out" / "y.npz")["file"].shape == (1, 3)

    return Scenario(["run", _m(tmp, m), "--output", _out(tmp, "y.npz")], creates=("out/y.npz",), check=check)


def s_bad_elem_type(tmp):
    m = my_add_model()
    m.graph.input[0].type.tensor_type.elem_type = 999
    return Scenario(["rewrite", _m(tmp, m), _out(tmp)])


def s_string_input(tmp):
    m = my_add_model()
    m.graph.input[0].type.tensor_type.elem_type = TensorProto.STRING
    return Scenario(["rewrite", _m(tmp, m), _out(tmp)])


def s_undefined_elem_type(tmp):
    m = my_add_model()
    m.graph.input[0].type.tensor_type.elem_type = TensorProto.UNDEFINED
    return Scenario(["rewrite", _m(tmp, m), _out(tmp), "--bind", "python"])


def s_ref_attr_in_main_graph(tmp):
    m = my_add_model()
    m.graph.node[0].attribute.append(onnx.AttributeProto(name="alpha", type=onnx.AttributeProto.FLOAT,
                                                         ref_attr_name="beta"))  # valid in functions only
    return Scenario(["rewrite", _m(tmp, m), _out(tmp)])


def s_empty_ints_bind(tmp):
    op = has_custom_attr_op()
    name = next(a.name for a in op.attributes if a.type.name == "INTS")
    m = placeholder_model(op, {})
    m.graph.node[0].attribute.append(onnx.AttributeProto(name=name, type=onnx.AttributeProto.INTS))
    return Scenario(["rewrite", _m(tmp, m), _out(tmp), "--bind", "native"])


def s_loop_without_body(tmp):
    vi = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 3])  # noqa: E731
    fn = helper.make_function("local", "twice", ["x"], ["y"],
                              [helper.make_node("my_add", ["x", "x"], ["y"], domain="custom", name="f0")],
                              [helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)])
    g = helper.make_graph([helper.make_node("Loop", ["a"], ["z"], name="loop0")], "g", [vi("a")], [vi("z")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1),
                                            helper.make_opsetid("local", 1)], ir_version=10)
    m.functions.append(fn)
    return Scenario(["rewrite", _m(tmp, m), _out(tmp)])


def _not_utf8(field):
    def scenario(tmp):
        m = my_add_model()  # two custom nodes: inspect sorts their (domain, op_type)
        m.graph.node.append(helper.make_node("my_add", ["a", "z"], ["w"], domain="custom", name="add1"))
        data = m.SerializeToString()
        old = {"op_type": b"\x04add0\"\x06my_add", "input": b"\n\x01a\n\x01b"}[field]  # add0's op_type, its inputs
        new = {"op_type": b"\x04add0\"\x06my\xb8add", "input": b"\n\x01\xff\n\x01b"}[field]
        assert data.count(old) == 1 and len(old) == len(new)
        (tmp / "in").mkdir()
        (tmp / "in" / "m.onnx").write_bytes(data.replace(old, new))
        cmd = ["inspect", tmp / "in" / "m.onnx"] if field == "op_type" else \
            ["rewrite", tmp / "in" / "m.onnx", _out(tmp)]
        return Scenario(cmd)
    return scenario


def _immutable_supported(tmp: Path) -> bool:
    probe = tmp / ".probe"
    probe.mkdir()
    try:
        if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(probe)],
                                                           capture_output=True).returncode != 0:
            return False
        return not os.access(probe, os.W_OK)
    finally:
        subprocess.run(["chattr", "-i", str(probe)], capture_output=True)
        probe.rmdir()


@contextlib.contextmanager
def read_only_dir(directory: Path):
    """A directory nobody, root included, can write: mode 0500, plus chattr +i when root."""
    directory.chmod(0o500)
    immutable = os.geteuid() == 0
    if immutable:
        subprocess.run(["chattr", "+i", str(directory)], check=True, capture_output=True)
    try:
        yield
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(directory)], capture_output=True)
        directory.chmod(0o700)


def s_read_only_output(tmp):
    return Scenario(["rewrite", _m(tmp), _out(tmp)], env={"read_only": tmp / "out"})


def s_read_only_output_run(tmp):
    return Scenario(["run", _m(tmp), "--output", _out(tmp, "y.npz")], env={"read_only": tmp / "out"})






@dataclass
class Case:
    id: str
    make: Callable[[Path], Scenario]
    rc: int | tuple[int, ...]     # the documented code (or the codes that would each be right)
    says: tuple[str, ...] = ()
    fix: str | None = None
    xfail: str | None = None
    needs: str | None = None   # "attr_op", "immutable"


CASES = [
    # files that are not ONNX models
    Case("empty file: inspect", s_empty_inspect, 3, ("m.onnx", "file is empty"), "re-export"),
    Case("empty file: run", s_empty_run, 3, ("m.onnx", "file is empty"), "re-export"),
    Case("random bytes: inspect", s_random_bytes_inspect, 3, ("not an ONNX model",), "re-export"),
    Case("random bytes: run --output", s_random_bytes_run, 3, ("not an ONNX model",), "re-export"),
    Case("truncated model: run", s_truncated_run, 3, ("truncated",), "copied whole"),
    Case("truncated model: API load_model", s_truncated_api, 3, ("truncated",), "copied whole"),
    Case("model is a FIFO: rewrite (never opened)", s_fifo_model, 3, ("not a regular file",), "save the model"),
    Case("model path is a symlink loop: inspect", s_symlink_loop_model, 3, ("cannot open",), "check the path"),
    # broken graphs
    Case("cycle: rewrite", s_cycle, 8, ("topologically sorted", "'z'"), "fix the input model"),
    Case("cycle: run", s_cycle_run, 9, ("not acyclic",), "names the failing node"),
    Case("dangling input name: rewrite --bind native", s_dangling, 8, ("'nowhere'",), "fix the input model"),
    Case("dangling input name: run", s_dangling_run, 9, ("'nowhere'",), "names the failing node"),
    Case("duplicate output names: rewrite", s_duplicate_outputs, 8, ("'z'", "multiple times"), "fix the input model"),
    Case("duplicate output names: run", s_duplicate_outputs_run, 9, ("(z)",), "names the failing node"),
    # custom ops
    Case("custom op with no rule: run", s_no_rule_run, 6, ("custom::frobnicate", "node 'add0'"), "--ops PACKAGE"),
    Case("custom op with no rule: rewrite --as-functions", s_no_rule_as_functions, 6, ("custom::frobnicate",),
         "--ops PACKAGE"),
    Case("wrong arity: rewrite --bind python", s_wrong_arity, 7, ("has 3 inputs", "node 'add0'"), "re-export"),
    Case("wrong arity: API rewrite_model", s_wrong_arity_api, 7, ("has 1 inputs",), "re-export"),
    Case("wrong attribute type: rewrite", s_wrong_attr_type, 7, ("must be",), "fix the attribute's type",
         needs="attr_op"),
    Case("wrong attribute type: API rewrite_model", s_wrong_attr_type_api, 7, ("'k' must be INT",),
         "fix the attribute's type"),
    Case("missing required attribute: API rewrite_model", s_missing_required_attr_api, 7,
         ("missing required attribute 'k'",), "add 'k'"),
    Case("unknown attribute: rewrite --as-functions", s_unknown_attr_as_functions, 7, ("m.onnx", "['alpha']"),
         "remove them"),
    Case("element type 999: rewrite", s_bad_elem_type, (7, 8), ("999",), None),
    Case("string input to a float op: rewrite", s_string_input, (7, 8), ("string",), None),
    Case("UNDEFINED element type: rewrite --bind python", s_undefined_elem_type, 8, ("data type 0",),
         "fix the input model"),
    Case("reference attribute outside a function: rewrite", s_ref_attr_in_main_graph, 7, ("alpha",), None),
    Case("empty INTS attribute: rewrite --bind native", s_empty_ints_bind, (7, 8), ("2 values",), None,
         needs="attr_op"),
    Case("Loop without a body beside a local function: rewrite", s_loop_without_body, 8, ("loop0",), None),
    Case("op_type not valid UTF-8: inspect", _not_utf8("op_type"), 3, ("not valid UTF-8",), "re-export"),
    Case("input name not valid UTF-8: rewrite", _not_utf8("input"), 3, ("not valid UTF-8",), "re-export"),
    # versions
    Case("ir_version newer than supported: rewrite", s_ir_version_newer, 8, ("ir_version 99",), "fix the input model"),
    Case("ir_version newer than supported: run", s_ir_version_newer_run, 9, ("IR version",), "names the failing"),
    Case("opset ONNX Runtime lacks: run", s_opset_ort_lacks, 9, ("opset",), "names the failing"),
    # external data
    Case("missing external data file: run", s_ext_missing_run, 3, ("'weights.bin' is missing",), "copy the weights"),
    Case("missing external data file: rewrite", s_ext_missing_rewrite, 3, ("'weights.bin' is missing",),
         "copy the weights"),
    Case("external offset past the end: run", s_ext_offset_past_end_run, 3, ("past the end",), "truncated"),
    Case("external offset 2**62: inspect", s_ext_offset_past_end_inspect, 3, ("past the end",), "truncated"),
    Case("external length 2**62: rewrite", s_ext_length_past_end, 3, ("past the end",), "truncated"),
    Case("external length past the end: API open_session", s_ext_length_past_end_api, 3, ("past the end",),
         "truncated"),
    # outputs
    Case("output is the input's weights file: rewrite", s_output_is_weights, 4,
         ("external data file 'weights.bin'",), "never overwrites"),
    Case("output would replace the weights the output needs: API save_model", s_output_is_weights_api, 4,
         ("external data file 'weights.bin' the output needs",), "never overwrites"),
    Case("output equal to input: run --output", s_run_output_is_model, 4, ("output is the input",), "new file"),
    Case("output equal to --inputs: run", s_run_output_is_inputs, 4, ("--inputs file",), "new file"),
    Case("output in a missing directory: run --output", s_output_missing_dir_run, 4, ("does not exist",), "create"),
    Case("output in a missing directory: API save_model", s_output_missing_dir_api, 4, ("does not exist",),
         "create"),
    Case("read-only output directory: rewrite", s_read_only_output, 4, ("not writable",), "writable location",
         needs="immutable"),
    Case("read-only output directory: run --output", s_read_only_output_run, 4, ("not writable",),
         "writable location", needs="immutable"),
    # user code
    Case("--rules file raises on import", s_rules_raise_at_import, 7, ("rules.py", "broken rules file"),
         "fix the rules file"),
    Case("--rules rewrite() raises", s_rules_raise_in_rewrite, 14, ("'boom'", "boom in rewrite"), "fix the rule"),
    Case("--rules check() raises", s_rules_raise_in_check, 14, ("'boom'", "boom in check"), "fix the rule"),
    Case("--rules file calls sys.exit", s_rules_sys_exit, 7, ("rules.py", "sys.exit"), None),
    # run time
    Case("Python kernel raises at run time", s_python_kernel_raises, 9, ("Python kernel", "ValueError"),
         "traceback"),
    Case("native kernel fails at run time", s_native_kernel_raises, 9, ("ONNX Runtime failed",), "check the inputs"),
    Case("random inputs of 2**62 rows: run", s_random_inputs_too_big, 2, ("random input 'a'",), "--inputs"),
    Case("--dim N=2**40: run", s_dim_too_big, 2, ("random input 'a'",), "smaller --dim"),
    Case("--inputs of the wrong dtype: run", s_inputs_wrong_dtype, 2, ("float64", "float32"), "astype"),
    Case("--inputs is a pickle: run (never unpickled)", s_inputs_pickled, 2, ("not a readable .npz",),
         "numpy.savez"),
    # must succeed
    Case("NaN/Inf inputs: run placeholder (native library)", _nan_case("placeholder"), 0),
    Case("NaN/Inf inputs: run decomposed", _nan_case("decompose"), 0),
    Case("NaN/Inf inputs: run --bind native", _nan_case("native"), 0),
    Case("NaN/Inf inputs: run --bind python", _nan_case("python"), 0),
    Case("zero-sized dims: decompose + run", _zero_case("decompose"), 0),
    Case("zero-sized dims: --bind native + run", _zero_case("native"), 0),
    Case("zero-sized dims: --bind python + run", _zero_case("python"), 0),
    Case("output named 'file': run --output", s_output_named_file, 0),
]


def _params():
    for case in CASES:
        marks = [pytest.mark.xfail(strict=True, reason=case.xfail)] if case.xfail else []
        yield pytest.param(case, id=case.id, marks=marks)


@pytest.mark.parametrize("case", list(_params()))
def test_bad_input(case: Case, tmp_path, capfd, monkeypatch):
    if case.needs == "attr_op" and has_custom_attr_op() is None:
        pytest.skip("no op in default_registry() has attributes and a decomposition")
    if case.needs == "immutable" and os.geteuid() == 0 and not _immutable_supported(tmp_path):
        pytest.skip("running as root without a working `chattr +i`: root writes through permissions")
    monkeypatch.chdir(tmp_path)
    codes = case.rc if isinstance(case.rc, tuple) else (case.rc,)
    scenario = case.make(tmp_path)
    before = snapshot(tmp_path)
    ro = scenario.env.get("read_only")
    with read_only_dir(ro) if ro else contextlib.nullcontext():
        if scenario.api is not None:
            capfd.readouterr()
            if case.rc == 0:
                scenario.api()
            else:
                with pytest.raises(GraphkitError) as info:
                    scenario.api()
                assert info.value.exit_code in codes, (type(info.value).__name__, str(info.value))
                text = str(info.value)
                for s in case.says:
                    assert s in text, (s, text)
                if case.fix:
                    assert case.fix in (info.value.hint or ""), (case.fix, text)
            err = capfd.readouterr().err
            assert "Traceback" not in err
        else:
            rc, out, err = cli(scenario.argv, capfd)
            if case.rc == 0:
                assert rc == 0, err
                assert not err.strip(), err
            else:
                assert rc in codes, (rc, err)
                assert_one_error_line(err, rc, case.says, case.fix)
    after = snapshot(tmp_path)
    created = sorted(set(after) - set(before))
    assert created == sorted(scenario.creates), f"files created: {created}"
    for rel, digest in before.items():
        assert after.get(rel) == digest, f"{rel} changed"
    if scenario.check is not None:
        scenario.check(tmp_path)


def test_matrix_is_big_enough():
    assert len(CASES) >= 25
    assert {"rewrite", "inspect", "run"} <= {w for c in CASES for w in c.id.replace(":", " ").split()}
    assert any("API" in c.id for c in CASES)


# -- disk full: a real ENOSPC on a tiny tmpfs, in a private mount namespace -----------------------

def _can_mount_tmpfs() -> bool:
    if sys.platform != "linux" or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
                           capture_output=True)
    return probe.returncode == 0


FULL_DISK = """
set -u
mount -t tmpfs -o size=64k,nr_inodes=64 tmpfs "$OUT" || exit 99
dd if=/dev/zero of="$OUT/fill" bs=4096 count=100 2>/dev/null
ls -A "$OUT" > "$LISTING_BEFORE"
"$PY" -m graphkit "$@"
rc=$?
ls -A "$OUT" > "$LISTING_AFTER"
exit $rc
"""


@pytest.mark.skipif(not _can_mount_tmpfs(), reason="needs `unshare -m` and tmpfs mounts (root in a container)")
@pytest.mark.parametrize("what", ["rewrite", "rewrite external data (copy)", "run --output"])
def test_disk_full(what, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    if what == "rewrite":
        src = _m(tmp_path)
        args = ["rewrite", src, out / "o.onnx"]
    elif what == "run --output":
        src = _m(tmp_path)
        args = ["run", src, "--output", out / "y.npz"]
    else:
        src = external_model(tmp_path / "in")
        args = ["rewrite", src, out / "o.onnx", "--external-data", "copy"]
    inputs = snapshot(tmp_path / "in")
    env = {**os.environ, "OUT": str(out), "PY": sys.executable,
           "LISTING_BEFORE": str(tmp_path / "before.txt"), "LISTING_AFTER": str(tmp_path / "after.txt")}
    proc = subprocess.run(["unshare", "-m", "sh", "-c", FULL_DISK, "sh", *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 4, proc.stderr
    assert_one_error_line(proc.stderr, 4, ("No space left on device",), "free some space")
    assert (tmp_path / "before.txt").read_text() == (tmp_path / "after.txt").read_text() == "fill\n"
    assert snapshot(tmp_path / "in") == inputs
