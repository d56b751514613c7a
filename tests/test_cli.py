"""The graphkit command: the rewrite flow and every error path a user can hit."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import onnx
import pytest

from conftest import error_lines, my_add_model, run_cli

INPUT_ERRORS = {
    "missing": (None, 3, "no such file"),
    "empty": (b"", 3, "file is empty"),
    "random bytes": (bytes(range(256)) * 4, 3, "not an ONNX model"),
}


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(my_add_model(), path)
    return path


def _snapshot(directory):
    return {p.name: p.read_bytes() for p in directory.iterdir()}


def test_help_is_fast_and_does_not_import_heavy_modules():
    code = ("import sys, graphkit.cli; graphkit.cli._parser(); "
            "heavy = [m for m in ('torch', 'onnx', 'onnxruntime') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    assert "rewrite" in run_cli("--help", check_rc=0).stdout


def test_rewrite_decomposes_and_reports(model_file, tmp_path):
    proc = run_cli("rewrite", model_file, tmp_path / "out.onnx", check_rc=0)
    assert "custom::my_add: decompose:mul_add x1" in proc.stdout
    out = onnx.load(tmp_path / "out.onnx")
    assert [n.op_type for n in out.graph.node] == ["Constant", "Mul", "Add", "Relu"]
    assert oct((tmp_path / "out.onnx").stat().st_mode & 0o777) != "0o600"


def test_rewrite_json_report(model_file, tmp_path):
    proc = run_cli("rewrite", model_file, tmp_path / "out.onnx", "--bind", "native", "--json", check_rc=0)
    report = json.loads(proc.stdout)
    assert report["ops_after"] == {"Relu": 1, "graphkit.native::my_add": 1}


@pytest.mark.parametrize("case", sorted(INPUT_ERRORS))
def test_bad_input_files(case, tmp_path):
    content, rc, text = INPUT_ERRORS[case]
    src = tmp_path / "in.onnx"
    if content is not None:
        src.write_bytes(content)
    before = _snapshot(tmp_path)
    proc = run_cli("rewrite", src, tmp_path / "out.onnx", check_rc=rc)
    assert text in proc.stderr and str(src) in proc.stderr
    assert len(error_lines(proc.stderr)) == 1 and "Traceback" not in proc.stderr
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("cut", [10, 0.5, -1])
def test_truncated_model(model_file, tmp_path, cut):
    data = model_file.read_bytes()
    n = cut if isinstance(cut, int) and cut > 0 else (int(len(data) * cut) if cut > 0 else len(data) + cut)
    src = tmp_path / "cut.onnx"
    src.write_bytes(data[:n])
    proc = run_cli("rewrite", src, tmp_path / "out.onnx", check_rc=3)
    assert "truncated" in proc.stderr
    assert not (tmp_path / "out.onnx").exists()


def test_directory_as_input(tmp_path):
    proc = run_cli("rewrite", tmp_path, tmp_path / "out.onnx", check_rc=3)
    assert "is a directory" in proc.stderr


def test_output_equal_to_input_is_refused(model_file):
    before = model_file.read_bytes()
    proc = run_cli("rewrite", model_file, model_file, check_rc=4)
    assert "output is the input" in proc.stderr
    link = model_file.parent / "alias.onnx"
    os.symlink(model_file, link)
    run_cli("rewrite", model_file, link, check_rc=4)
    assert model_file.read_bytes() == before


def test_output_in_missing_directory(model_file, tmp_path):
    proc = run_cli("rewrite", model_file, tmp_path / "nope" / "out.onnx", check_rc=4)
    assert "does not exist" in proc.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through permissions; see the RLIMIT test")
def test_unwritable_output_directory(model_file, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    run_cli("rewrite", model_file, ro / "out.onnx", check_rc=4)


def test_disk_full_leaves_nothing_behind(model_file, tmp_path):
    """RLIMIT_FSIZE makes the write fail with EFBIG, like a full disk."""
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    code = ("import resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
            "resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64)); "
            "from graphkit.cli import main; sys.exit(main(sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", code, "rewrite", str(model_file), str(out_dir / "o.onnx")],
                          capture_output=True, text=True)
    assert proc.returncode == 4, proc.stderr
    assert "cannot write" in proc.stderr
    assert list(out_dir.iterdir()) == []


def test_unreadable_output_path_that_is_a_directory(model_file, tmp_path):
    (tmp_path / "d.onnx").mkdir()
    run_cli("rewrite", model_file, tmp_path / "d.onnx", check_rc=4)


def test_custom_op_without_rule(tmp_path):
    model = my_add_model()
    model.graph.node[0].op_type = "frobnicate"
    src = tmp_path / "f.onnx"
    onnx.save(model, src)
    proc = run_cli("rewrite", src, tmp_path / "out.onnx", check_rc=6)
    assert "custom::frobnicate" in proc.stderr and "node 'add0'" in proc.stderr
    assert not (tmp_path / "out.onnx").exists()


def test_debug_shows_traceback(tmp_path):
    proc = run_cli("rewrite", tmp_path / "missing.onnx", tmp_path / "o.onnx", "--debug", check_rc=3)
    assert "Traceback" in proc.stderr


def test_usage_error_exit_code():
    assert run_cli("rewrite").returncode == 2
    assert run_cli("frobnicate").returncode == 2


def test_exit_codes_documented_in_docs():
    from doc_pages import DOCS
    from graphkit import errors

    table = (DOCS / "exit-codes.md").read_text()
    for cls in (errors.UsageError, errors.ModelLoadError, errors.OutputError, errors.UnsupportedOpError,
                errors.RewriteError, errors.ValidationError, errors.KernelError, errors.NativeBuildError,
                errors.ExportError, errors.OpPackageError, errors.OpDefinitionError, errors.VerificationError):
        assert f"| {cls.exit_code} |" in table, cls


def test_prefer_target_opset_as_functions_dry_run_and_progress(model_file, tmp_path):
    import json as _json

    out = tmp_path / "p.onnx"
    report = _json.loads(run_cli("rewrite", model_file, out, "--prefer", "native,decompose", "--json",
                                 check_rc=0).stdout)
    assert report["actions"] == [{"op": "custom::my_add", "lowering": "bind:native", "nodes": 1}]
    run_cli("rewrite", model_file, tmp_path / "t.onnx", "--target-opset", "19", check_rc=0)
    assert {i.domain: i.version for i in onnx.load(tmp_path / "t.onnx").opset_import} == {"": 19}
    run_cli("rewrite", model_file, tmp_path / "f.onnx", "--as-functions", check_rc=0)
    assert [f.name for f in onnx.load(tmp_path / "f.onnx").functions] == ["my_add"]
    proc = run_cli("rewrite", model_file, tmp_path / "d.onnx", "--dry-run", check_rc=0)
    assert "dry run" in proc.stdout and not (tmp_path / "d.onnx").exists()
    assert run_cli("rewrite", model_file, out, "--prefer", "native,bogus").returncode == 2
    assert run_cli("rewrite", model_file, out, "--bind", "native", "--keep-custom").returncode == 2


def test_progress_bar_on_big_models(tmp_path):
    from onnx import TensorProto, helper

    nodes = [helper.make_node("my_add", ["x", "x"] if i == 0 else [f"y{i - 1}", "x"], [f"y{i}"], domain="custom",
                              name=f"n{i}") for i in range(10_500)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y10499", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)],
                              ir_version=10)
    onnx.save(model, tmp_path / "big.onnx")
    proc = run_cli("rewrite", tmp_path / "big.onnx", tmp_path / "o.onnx", "--progress", check_rc=0)
    assert "lowering" in proc.stderr and "10500/10500" in proc.stderr
    quiet = run_cli("rewrite", tmp_path / "big.onnx", tmp_path / "o2.onnx", check_rc=0)
    assert quiet.stderr == ""
