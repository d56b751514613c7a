"""Op packages on the command line: --ops and $GRAPHKIT_OPS on every model command,
`graphkit ops`, unknown ops in `graphkit inspect`, and packages that fail to load (exit 13)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from conftest import REPO, error_lines, my_add_model

SAMPLE_SOURCE = REPO / "samples" / "rms_norm_ops" / "rms_norm_ops"
BUILTIN = {"custom::my_add", "custom::deform_conv2d", "custom::asinh"}
NOT_AN_OP_PACKAGE = 13
SAMPLE: Path = Path()  # a folder holding only the sample's importable package (see below)


@pytest.fixture(autouse=True, scope="module")
def _sample_on_its_own(tmp_path_factory):
    """Copy the sample package alone: importable, but not installed (samples/rms_norm_ops may
    hold a build's .egg-info, whose entry point would make every command see the package)."""
    global SAMPLE
    SAMPLE = tmp_path_factory.mktemp("sample")
    shutil.copytree(SAMPLE_SOURCE, SAMPLE / "rms_norm_ops", ignore=shutil.ignore_patterns("__pycache__"))
    yield


def _installed_op_packages() -> dict[str, str]:
    """Entry point value -> distribution name, of the op packages installed here."""
    from importlib.metadata import entry_points

    from graphkit.ops._discovery import ENTRY_POINT_GROUP

    return {ep.value: getattr(ep.dist, "name", "") for ep in entry_points(group=ENTRY_POINT_GROUP)}


INSTALLED = _installed_op_packages()
# When the sample is installed (pip install ./samples/rms_norm_ops), its entry point brings it
# first and --ops / $GRAPHKIT_OPS naming the same module add nothing.
SAMPLE_DIST = INSTALLED.get("rms_norm_ops:PACKAGE")


def sample_origin(how: str) -> str:
    if SAMPLE_DIST is not None:
        return f"entry point of {SAMPLE_DIST}"
    return "--ops" if how == "--ops" else "$GRAPHKIT_OPS"


def gk(*args, cwd=None, env=None, check_rc=None, pythonpath=None):
    """`python -m graphkit ARGS` with the sample package (and ``pythonpath``) importable."""
    full = {k: v for k, v in os.environ.items() if k != "GRAPHKIT_OPS"}
    inherited = [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []
    full["PYTHONPATH"] = os.pathsep.join(map(str, [*((SAMPLE,) if pythonpath is None else pythonpath), *inherited]))
    full.update(env or {})
    proc = subprocess.run([sys.executable, "-m", "graphkit", *map(str, args)], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=600)
    if check_rc is not None:
        assert proc.returncode == check_rc, (proc.returncode, proc.stdout, proc.stderr)
    return proc


def one_line_error(proc, rc=NOT_AN_OP_PACKAGE):
    assert proc.returncode == rc, (proc.returncode, proc.stdout, proc.stderr)
    lines = error_lines(proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("graphkit: error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


def rms_norm_model(domain="custom", with_weight=True) -> onnx.ModelProto:
    inputs = ["x", "w"] if with_weight else ["x"]
    node = helper.make_node("rms_norm", inputs, ["y", "r"], domain=domain, name="rms0", epsilon=1e-5)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4]),
         helper.make_tensor_value_info("w", TensorProto.FLOAT, [4])][:len(inputs)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4]),
         helper.make_tensor_value_info("r", TensorProto.FLOAT, ["N", 1])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(domain, 1)],
                             ir_version=10)


def mixed_model(functions=False) -> onnx.ModelProto:
    """custom::my_add (built-in), acme::foo x2 (no package), custom::rms_norm (the sample)."""
    nodes = [helper.make_node("my_add", ["a", "b"], ["y"], domain="custom", name="n0"),
             helper.make_node("foo", ["y"], ["z"], domain="acme", name="n1"),
             helper.make_node("foo", ["z"], ["w"], domain="acme", name="n2"),
             helper.make_node("rms_norm", ["w"], ["o", "r"], domain="custom", name="n3"),
             helper.make_node("Relu", ["o"], ["out"], name="relu")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in "ab"],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 3])])
    model = helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 18), helper.make_opsetid("custom", 1), helper.make_opsetid("acme", 1)])
    if functions:  # acme::foo is a model-local function: not a custom op
        model.functions.append(helper.make_function(
            "acme", "foo", ["x"], ["y"], [helper.make_node("Neg", ["x"], ["y"])], [helper.make_opsetid("", 18)]))
    return model


@pytest.fixture
def files(tmp_path):
    onnx.save(my_add_model(), tmp_path / "my_add.onnx")
    onnx.save(rms_norm_model(), tmp_path / "rms.onnx")
    onnx.save(mixed_model(), tmp_path / "mixed.onnx")
    return tmp_path


# --- the option itself -----------------------------------------------------------------

def test_every_model_command_takes_repeatable_ops():
    from graphkit.cli import OPS_COMMANDS, _parser

    argv = {"rewrite": ["in.onnx", "out.onnx"], "simplify": ["in.onnx", "out.onnx"], "run": ["m.onnx"], "inspect": ["m.onnx"],
            "export": ["m.py:build", "out.onnx", "--input", "x=1"], "verify": ["m.py:build", "m.onnx"],
            "compare": ["a.onnx", "b.onnx"], "ops": [], "deploy": ["m.onnx", "-o", "d"]}
    assert set(argv) == set(OPS_COMMANDS)
    parser = _parser()
    for command, rest in argv.items():
        assert parser.parse_args([command, *rest]).ops == [], command
        args = parser.parse_args([command, *rest, "--ops", "acme_ops", "--ops", "./my_ops.py:PACKAGE"])
        assert args.ops == ["acme_ops", "./my_ops.py:PACKAGE"], command


def test_ops_help_names_the_format_and_the_environment_variable():
    from graphkit.cli._args import OPS_HELP
    from graphkit.ops._discovery import ENTRY_POINT_GROUP, ENV_VAR

    assert f"${ENV_VAR}" in OPS_HELP and ENTRY_POINT_GROUP in OPS_HELP
    for form in ("MODULE:ATTR", "FILE.py", "PACKAGE", "For example --ops"):
        assert form in OPS_HELP
    text = gk("inspect", "--help", check_rc=0).stdout
    assert "--ops PACKAGE" in text and "$GRAPHKIT_OPS" in text and "13 op package" in text


# --- graphkit ops ------------------------------------------------------------------------

def test_ops_lists_builtin_ops():
    text = gk("ops", check_rc=0).stdout
    for name in BUILTIN:
        assert f"{name}  (package graphkit_ops" in text
    assert ("rms_norm" in text) == (SAMPLE_DIST is not None)
    assert "bias?: T" in text  # optional inputs are marked
    assert "decompose mul_add (opset >= 7)" in text
    doc = json.loads(gk("ops", "--json", check_rc=0).stdout)
    ops = {op["op"]: op for op in doc["ops"]}
    assert set(ops) >= BUILTIN
    assert doc["packages"][0]["name"] == "graphkit_ops" and doc["packages"][0]["origin"] == "built-in"
    if not INSTALLED:
        assert set(ops) == BUILTIN and len(doc["packages"]) == 1
    for op in (ops[name] for name in BUILTIN):
        assert op["package"]["name"] == "graphkit_ops" and op["domain"] == "custom"
        assert op["since_version"] == 1 and op["torch_op"] == f"torch.ops.graphkit.{op['name']}"
    assert ops["custom::my_add"]["lowerings"]["native"]["kind"] == "sources"
    assert ops["custom::asinh"]["lowerings"]["native"] is None
    assert ops["custom::asinh"]["lowerings"]["python"] is True
    dc = ops["custom::deform_conv2d"]
    assert [i["optional"] for i in dc["inputs"]] == [False, False, False, True, True]
    attrs = {a["name"]: (a["type"], a["required"], a["default"]) for a in dc["attributes"]}
    assert attrs["groups"] == ("INT", False, 1) and attrs["stride"] == ("INTS", False, [1, 1])
    assert {d["name"]: (d["min_opset"], d["max_opset"]) for d in dc["lowerings"]["decompositions"]} == {
        "onnx_deform_conv": (19, None), "grid_sample": (16, None), "gather": (11, None)}


@pytest.mark.parametrize("how", ["--ops", "GRAPHKIT_OPS"])
def test_ops_lists_a_user_package(how):
    extra, env = (["--ops", "rms_norm_ops"], None) if how == "--ops" else ([], {"GRAPHKIT_OPS": "rms_norm_ops"})
    origin = sample_origin(how)
    text = gk("ops", *extra, env=env, check_rc=0).stdout
    header = next(line for line in text.splitlines() if line.startswith("custom::rms_norm  "))
    assert header.startswith("custom::rms_norm  (package rms_norm_ops") and header.endswith(f"[{origin}])")
    assert "torch op torch.ops.acme.rms_norm" in text and "weight?: T" in text
    assert "epsilon: FLOAT = 1e-06" in text
    assert "decompose reduce_mean (opset >= 18)" in text and "python (numpy kernel)" in text
    doc = json.loads(gk("ops", "--json", *extra, env=env, check_rc=0).stdout)
    ops = {op["op"]: op for op in doc["ops"]}
    assert set(ops) >= BUILTIN | {"custom::rms_norm"}
    rms = ops["custom::rms_norm"]
    assert rms["package"]["name"] == "rms_norm_ops" and rms["package"]["origin"] == origin
    assert rms["torch_namespace"] == "acme"
    assert [(i["name"], i["optional"]) for i in rms["inputs"]] == [("x", False), ("weight", True)]
    assert [o["name"] for o in rms["outputs"]] == ["y", "inv_rms"]
    assert rms["type_constraints"] == {"T": ["tensor(float)", "tensor(double)"]}
    assert rms["attributes"][0]["default"] == 1e-6
    assert rms["lowerings"]["native"]["kind"] == "sources"
    assert rms["lowerings"]["native"]["sources"] == ["rms_norm.cc"]
    packages = {p["name"]: p["origin"] for p in doc["packages"]}
    assert packages["graphkit_ops"] == "built-in" and packages["rms_norm_ops"] == origin


def test_ops_selects_by_name():
    doc = json.loads(gk("ops", "--json", "--ops", "rms_norm_ops", "rms_norm", "custom::asinh", check_rc=0).stdout)
    assert [op["op"] for op in doc["ops"]] == ["custom::rms_norm", "custom::asinh"]
    line = one_line_error(gk("ops", "frobnicate"), rc=2)
    assert "frobnicate" in line and "custom::my_add" in line


# --- graphkit inspect ----------------------------------------------------------------------

def test_inspect_marks_unknown_ops(files):
    proc = gk("inspect", files / "mixed.onnx", check_rc=0)
    out = proc.stdout
    assert "acme::foo  x2  UNKNOWN: no op package defines it (pass --ops PACKAGE, set $GRAPHKIT_OPS, " \
           "or install the package that defines it)" in out
    if SAMPLE_DIST is None:
        assert "custom::rms_norm  x1  UNKNOWN" in out  # its package is not loaded
    assert "package: graphkit_ops 0.1.0 (built-in)" in out and "UNKNOWN" not in out.split("custom::my_add")[1].split("\n")[0]
    summary = json.loads(gk("inspect", files / "mixed.onnx", "--json", check_rc=0).stdout)
    ops = {op["op"]: op for op in summary["custom_ops"]}
    assert ops["acme::foo"]["known"] is False and ops["acme::foo"]["count"] == 2
    assert "--ops PACKAGE" in ops["acme::foo"]["hint"] and "$GRAPHKIT_OPS" in ops["acme::foo"]["hint"]
    assert ops["custom::my_add"]["known"] is True and ops["custom::my_add"]["package"]["name"] == "graphkit_ops"
    assert "Relu" not in str(ops)


@pytest.mark.parametrize("how", ["--ops", "GRAPHKIT_OPS"])
def test_inspect_knows_a_user_op_through_its_package(files, how):
    extra, env = (["--ops", "rms_norm_ops"], None) if how == "--ops" else ([], {"GRAPHKIT_OPS": "rms_norm_ops"})
    out = gk("inspect", files / "mixed.onnx", *extra, env=env, check_rc=0).stdout
    assert "custom::rms_norm x1 (n3)" in out and "package: rms_norm_ops" in out
    assert "decompose:reduce_mean, native, python" in out
    summary = json.loads(gk("inspect", files / "mixed.onnx", "--json", *extra, env=env, check_rc=0).stdout)
    rms = next(op for op in summary["custom_ops"] if op["op"] == "custom::rms_norm")
    assert rms["known"] is True and rms["package"]["name"] == "rms_norm_ops"
    assert [op["op"] for op in summary["custom_ops"] if not op["known"]] == ["acme::foo"]


def test_inspect_bound_nodes_and_local_functions(tmp_path):
    onnx.save(mixed_model(functions=True), tmp_path / "f.onnx")
    summary = json.loads(gk("inspect", tmp_path / "f.onnx", "--json", "--ops", "rms_norm_ops", check_rc=0).stdout)
    assert "acme::foo" not in {op["op"] for op in summary["custom_ops"]}  # the model defines it
    onnx.save(rms_norm_model(domain="graphkit.python"), tmp_path / "b.onnx")
    summary = json.loads(gk("inspect", tmp_path / "b.onnx", "--json", "--ops", "rms_norm_ops", check_rc=0).stdout)
    [op] = summary["custom_ops"]
    assert op["op"] == "graphkit.python::rms_norm" and op["bound"] == "python"
    assert op["package"]["name"] == "rms_norm_ops"


# --- graphkit rewrite / run / compare with a user op ---------------------------------------

def test_rewrite_lowers_a_user_op_every_way(files, tmp_path):
    src = files / "rms.onnx"
    if SAMPLE_DIST is None:
        proc = gk("rewrite", src, tmp_path / "x.onnx")
        assert proc.returncode == 6 and "custom::rms_norm" in proc.stderr and "--ops PACKAGE" in proc.stderr
    for how, extra, after in [("decompose", [], "ReduceMean"),
                              ("native", ["--bind", "native"], "graphkit.native::rms_norm"),
                              ("python", ["--bind", "python"], "graphkit.python::rms_norm")]:
        out = tmp_path / f"{how}.onnx"
        report = json.loads(gk("rewrite", src, out, "--ops", "rms_norm_ops", "--json", *extra, check_rc=0).stdout)
        assert report["ops_after"].get(after) == 1, report
        assert "custom::rms_norm" not in report["ops_after"]
    # the same package through the environment
    gk("rewrite", src, tmp_path / "e.onnx", env={"GRAPHKIT_OPS": "rms_norm_ops"}, check_rc=0)
    # run and compare take the registry too (Python kernel vs decomposition)
    run = gk("run", tmp_path / "python.onnx", "--ops", "rms_norm_ops", check_rc=0).stdout
    assert run.startswith("y: float32 [1, 4]")
    gk("compare", tmp_path / "decompose.onnx", tmp_path / "python.onnx", "--ops", "rms_norm_ops", check_rc=0)


def test_bind_native_without_native_kernels_names_the_op_and_its_lowerings(files, tmp_path):
    (tmp_path / "plain_ops.py").write_text(
        "from dataclasses import replace\n"
        "from graphkit.ops import OpPackage\n"
        "from rms_norm_ops import RMS_NORM\n"
        "PACKAGE = OpPackage(name='plain_ops', ops=(replace(RMS_NORM, native=False, domain='plain'),))\n")
    onnx.save(rms_norm_model(domain="plain"), tmp_path / "plain.onnx")
    line = one_line_error(gk("rewrite", tmp_path / "plain.onnx", tmp_path / "o.onnx", "--bind", "native",
                             "--ops", tmp_path / "plain_ops.py"), rc=6)
    assert "plain::rms_norm" in line and "no native kernel" in line
    # the decomposition works at the model's own opset: --prefer decompose, not another opset
    assert "would work: --prefer decompose (decomposition 'reduce_mean'), --bind python" in line
    # the other lowerings of an op in its own domain work
    report = json.loads(gk("rewrite", tmp_path / "plain.onnx", tmp_path / "p.onnx", "--bind", "python", "--json",
                           "--ops", tmp_path / "plain_ops.py", check_rc=0).stdout)
    assert report["ops_after"] == {"graphkit.python.plain::rms_norm": 1}
    assert not (tmp_path / "o.onnx").exists()


# --- packages that cannot be loaded -----------------------------------------------------------

def test_missing_package_module(files):
    for command in (["inspect", files / "my_add.onnx"], ["rewrite", files / "my_add.onnx", files / "o.onnx"],
                    ["run", files / "my_add.onnx"], ["ops"]):
        line = one_line_error(gk(*command, "--ops", "no_such_ops_pkg"))
        assert "no_such_ops_pkg" in line, command
    line = one_line_error(gk("ops", env={"GRAPHKIT_OPS": "no_such_ops_pkg"}))
    assert "no_such_ops_pkg" in line and "$GRAPHKIT_OPS" in line
    assert not (files / "o.onnx").exists()


def test_package_raising_on_import(files, tmp_path):
    (tmp_path / "boom_ops.py").write_text("raise RuntimeError('kaboom while importing')\n")
    for spec in ("boom_ops", str(tmp_path / "boom_ops.py")):
        line = one_line_error(gk("inspect", files / "my_add.onnx", "--ops", spec, pythonpath=(SAMPLE, tmp_path)))
        assert spec in line and "RuntimeError: kaboom while importing" in line
    debug = gk("ops", "--ops", "boom_ops", "--debug", pythonpath=(tmp_path,))
    assert debug.returncode == NOT_AN_OP_PACKAGE and "Traceback" in debug.stderr


def test_package_without_package_attribute(files, tmp_path):
    (tmp_path / "empty_ops.py").write_text("OPS = []\n")
    line = one_line_error(gk("compare", files / "my_add.onnx", files / "my_add.onnx", "--ops", "empty_ops",
                             pythonpath=(tmp_path,)))
    assert "empty_ops" in line and "'PACKAGE'" in line
    line = one_line_error(gk("ops", "--ops", "empty_ops:OPS", pythonpath=(tmp_path,)))
    assert "empty_ops:OPS" in line and "not an OpPackage" in line


def test_two_packages_defining_one_op(files, tmp_path):
    (tmp_path / "other_ops.py").write_text(
        "from dataclasses import replace\n"
        "from graphkit.ops import OpPackage\n"
        "from rms_norm_ops import RMS_NORM\n"
        "PACKAGE = OpPackage(name='other_ops', ops=(replace(RMS_NORM, native=False),))\n")
    (tmp_path / "add_ops.py").write_text(
        "from dataclasses import replace\n"
        "from graphkit.ops import OpPackage\n"
        "from graphkit_ops import MY_ADD\n"
        "PACKAGE = OpPackage(name='add_ops', ops=(replace(MY_ADD, native=False),))\n")
    path = (SAMPLE, tmp_path)
    line = one_line_error(gk("inspect", files / "rms.onnx", "--ops", "rms_norm_ops", "--ops", "other_ops",
                             pythonpath=path))
    assert "custom::rms_norm" in line and f"rms_norm_ops ({sample_origin('--ops')})" in line
    assert "other_ops (--ops)" in line
    line = one_line_error(gk("rewrite", files / "rms.onnx", files / "o.onnx", "--ops", "other_ops",
                             env={"GRAPHKIT_OPS": "rms_norm_ops"}, pythonpath=path))
    assert f"rms_norm_ops ({sample_origin('env')})" in line and "other_ops (--ops)" in line
    line = one_line_error(gk("ops", "--ops", "add_ops", pythonpath=path))
    assert "custom::my_add" in line and "graphkit_ops (built-in)" in line and "add_ops (--ops)" in line
    # one package named twice is one package
    gk("ops", "--ops", "rms_norm_ops", env={"GRAPHKIT_OPS": "rms_norm_ops"}, check_rc=0)


def test_custom_ops_folder_in_the_working_directory_is_not_imported(files, tmp_path):
    """graphkit's own ops are `graphkit_ops`: a user's custom_ops/ never shadows them."""
    work = tmp_path / "project"
    (work / "custom_ops").mkdir(parents=True)
    (work / "custom_ops" / "__init__.py").write_text("raise RuntimeError('the user custom_ops was imported')\n")
    out = gk("inspect", files / "mixed.onnx", "--ops", "rms_norm_ops", cwd=work, check_rc=0).stdout
    assert "package: graphkit_ops" in out and "package: rms_norm_ops" in out
    gk("rewrite", files / "my_add.onnx", work / "a.onnx", cwd=work, check_rc=0)
    gk("rewrite", files / "rms.onnx", work / "b.onnx", "--ops", "rms_norm_ops", "--bind", "native",
       cwd=work, check_rc=0)
    # running it builds (or finds cached) the kernels of graphkit_ops and rms_norm_ops, never custom_ops/
    assert gk("run", work / "b.onnx", "--ops", "rms_norm_ops", cwd=work, check_rc=0).stdout.startswith("y: float32")
    assert "custom::my_add" in gk("ops", cwd=work, check_rc=0).stdout
