"""CLI conventions as in onnxsim/Polygraphy (issue 16, item 2): global options anywhere,
examples in every --help, argument order in messages, run --bind/--json, rewrite's summary,
and Python warnings kept out of the one-line error stream."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from conftest import error_lines, my_add_model, run_cli


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(my_add_model(), path)
    return path


# --------------------------------------------------------------------------- 1. global options


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_before_or_after_the_subcommand(tmp_path, where):
    args = ["rewrite", tmp_path / "missing.onnx", tmp_path / "out.onnx"]
    proc = run_cli(*(["--debug", *args] if where == "before" else [*args, "--debug"]), check_rc=3)
    assert "Traceback" in proc.stderr
    assert error_lines(proc.stderr)[-1].startswith("graphkit: error: ")


@pytest.mark.parametrize("where", ["before", "after"])
def test_quiet_prints_errors_only(model_file, tmp_path, where):
    args = ["rewrite", model_file, tmp_path / "out.onnx"]
    proc = run_cli(*(["-q", *args] if where == "before" else [*args, "--quiet"]), check_rc=0)
    assert proc.stdout == "" and proc.stderr == ""
    assert (tmp_path / "out.onnx").exists()
    proc = run_cli("-q", "rewrite", tmp_path / "missing.onnx", tmp_path / "o.onnx", check_rc=3)
    assert proc.stdout == "" and error_lines(proc.stderr) == [error_lines(proc.stderr)[0]]
    assert "no such file" in proc.stderr


@pytest.mark.parametrize("where", ["before", "after"])
def test_verbose_reports_wall_time(model_file, tmp_path, where):
    args = ["rewrite", model_file, tmp_path / "out.onnx"]
    proc = run_cli(*(["-v", *args] if where == "before" else [*args, "--verbose"]), check_rc=0)
    assert "graphkit: rewrite took " in proc.stderr
    assert "custom::my_add" in proc.stdout


def test_quiet_and_verbose_exclude_each_other(model_file, tmp_path):
    proc = run_cli("rewrite", model_file, tmp_path / "o.onnx", "-q", "-v", check_rc=2)
    assert "not allowed with" in proc.stderr


@pytest.mark.parametrize("args", [["--version"], ["rewrite", "--version"], ["inspect", "x.onnx", "--version"]])
def test_version_details(args):
    from importlib.metadata import version

    out = run_cli(*args, check_rc=0).stdout
    import graphkit

    assert out.startswith(f"graphkit {graphkit.__version__}\n")
    for dist in ("onnx", "onnxruntime", "onnxruntime-extensions", "torch"):
        assert f"\n{dist} {version(dist)}\n" in out
    assert "native kernel libraries built: " in out and "torch extensions built: " in out


def test_version_lists_built_kernels_and_missing_packages(tmp_path):
    """--version reads the build cache as it is (nothing is built) and names packages that
    are not installed; it never imports torch or onnx."""
    lib = tmp_path / "native" / "lib" / "0123456789abcdef"
    lib.mkdir(parents=True)
    (lib / "libgraphkit_ops.so").write_bytes(b"x" * 10)
    (lib / "libgraphkit_ops.so.record").write_text(json.dumps({"size": 10, "sha256": "-", "packages": ["acme_ops"]}))
    half = tmp_path / "native" / "lib" / "fedcba9876543210"  # no record: not built
    half.mkdir(parents=True)
    (half / "libgraphkit_ops.so").write_bytes(b"x")
    ext = tmp_path / "torch_ext" / "my_add-0123"
    ext.mkdir(parents=True)
    (ext / "m.so").write_bytes(b"y" * 3)
    (ext / "graphkit-build.json").write_text(json.dumps({"name": "my_add", "package": "graphkit_ops.my_add",
                                                         "library": "m.so", "size": 3}))
    code = ("import sys, graphkit.cli as c, importlib.metadata as md; real = md.version\n"
            "def fake(name):\n"
            "    if name == 'torch': raise md.PackageNotFoundError(name)\n"
            "    return real(name)\n"
            "md.version = fake\n"
            "try:\n    c.main(['--version'])\nexcept SystemExit:\n    pass\n"
            "print([m for m in ('torch', 'onnx', 'onnxruntime') if m in sys.modules])")
    import os
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "GRAPHKIT_CACHE_DIR": str(tmp_path)}).stdout
    assert "torch not installed" in out
    assert "native kernel libraries built: 1\n  acme_ops (" in out
    assert "torch extensions built: 1\n  my_add (graphkit_ops.my_add" in out
    assert out.strip().endswith("[]")


# --------------------------------------------------------------------------- 6. warnings


def _nan_inputs(tmp_path, model_file):
    bound = tmp_path / "bound.onnx"
    run_cli("rewrite", model_file, bound, "--bind", "python", check_rc=0)
    x = tmp_path / "x.npz"
    np.savez(x, a=np.array([[np.inf, 1, 2]], np.float32), b=np.array([[-np.inf, 1, 2]], np.float32))
    return bound, x


def test_python_kernel_warning_not_printed(model_file, tmp_path):
    """inf + -inf in the Python kernel makes numpy warn 'invalid value encountered in add':
    a result, not an error; stderr stays empty unless -v or --debug."""
    bound, x = _nan_inputs(tmp_path, model_file)
    proc = run_cli("run", bound, "--inputs", x, check_rc=0)
    assert proc.stderr == "" and "nan" in proc.stdout
    assert "RuntimeWarning" in run_cli("run", bound, "--inputs", x, "-v", check_rc=0).stderr
    assert "RuntimeWarning" in run_cli("--debug", "run", bound, "--inputs", x, check_rc=0).stderr



# --------------------------------------------------------------------------- 2. examples in --help

COMMANDS = ("rewrite", "run", "inspect", "export", "verify", "compare", "ops", "show", "deploy")


@pytest.mark.parametrize("command", COMMANDS)
def test_help_ends_with_examples_then_exit_codes(command):
    import re

    text = run_cli(command, "--help", check_rc=0).stdout
    examples = text[text.index("\nexamples:\n"):].split("\n\nexit codes:")[0].strip().splitlines()[1:]
    assert 2 <= len(examples) <= 4, examples
    assert all(f"{line} ".startswith(f"  graphkit {command} ") for line in examples), examples
    assert re.search(r"exit codes: 0 ok, 2 usage.*\n.*\n.*\n.*\n70 internal error, 128\+N[^\n]*\n$", text)


def test_every_example_parses():
    """Every example in every --help names options that exist (parsed, not run)."""
    import shlex

    from graphkit.cli import EXAMPLES, _parser

    parser = _parser()
    for command, lines in EXAMPLES.items():
        for line in lines:
            words = shlex.split(line.split("  #")[0])
            assert words[0] == "graphkit"
            if "--version" in words:
                continue
            args = parser.parse_args(words[1:])
            assert args.command == (command or args.command), line


def test_help_of_every_command_imports_no_onnx_or_torch():
    import subprocess
    import sys

    code = ("import sys, contextlib, io\nfrom graphkit.cli import main\n"
            f"for c in {COMMANDS!r}:\n"
            "    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
            "        main([c, '--help'])\n"
            "print([m for m in ('torch', 'onnx', 'onnxruntime') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# --------------------------------------------------------------------------- 4. run --bind/--prefer/--json


@pytest.mark.parametrize("how", [["--bind", "python"], ["--bind", "native"], ["--prefer", "python,decompose"],
                                 ["--prefer", "decompose"], []])
def test_run_lowers_in_memory_and_reports_json(model_file, how):
    before = model_file.read_bytes()
    proc = run_cli("run", model_file, *how, "--json", "--seed", "3", check_rc=0)
    report = json.loads(proc.stdout)
    assert report["lowering"] == (None if not how else how[1])
    assert report["inputs"] == {"random": True, "seed": 3}
    (z,) = report["outputs"]
    assert (z["name"], z["type"], z["dtype"], z["shape"]) == ("z", "tensor", "float32", [1, 3])
    assert set(z["stats"]) == {"min", "max", "mean", "nan", "inf"} and z["stats"]["min"] >= 0  # after Relu
    assert model_file.read_bytes() == before  # lowered in memory only


def test_run_lowerings_agree(model_file, tmp_path):
    x = tmp_path / "x.npz"
    np.savez(x, a=np.array([[1, -2, 3], [0.5, 2, -7]], np.float32), b=np.ones((2, 3), np.float32))
    stats = [json.loads(run_cli("run", model_file, "--inputs", x, "--json", *how, check_rc=0).stdout)["outputs"][0]
             for how in (["--bind", "python"], ["--prefer", "decompose"], ["--bind", "native"])]
    assert all(s == stats[0] for s in stats) and stats[0]["shape"] == [2, 3]
    assert stats[0]["stats"]["min"] == 0.0  # Relu


def test_run_json_nan_is_valid_json(model_file, tmp_path):
    x = tmp_path / "x.npz"
    np.savez(x, a=np.array([[np.nan, 1, 2]], np.float32), b=np.array([[0, 1, 2]], np.float32))
    z = json.loads(run_cli("run", model_file, "--inputs", x, "--json", "--bind", "python", check_rc=0).stdout)["outputs"][0]
    assert z["stats"]["nan"] == 1


def test_run_bind_usage_errors(model_file):
    assert "not a list of distinct" in run_cli("run", model_file, "--prefer", "fast", check_rc=2).stderr
    assert "not allowed with" in run_cli("run", model_file, "--bind", "python", "--prefer", "native", check_rc=2).stderr


# --------------------------------------------------------------------------- 5. rewrite summary


@pytest.mark.parametrize("extra", [[], ["--target-opset", "18"]])  # the serialized fast path and the full one
def test_rewrite_summary_time_nodes_and_sizes(model_file, tmp_path, extra):
    import re

    out = tmp_path / "out.onnx"
    text = run_cli("rewrite", model_file, out, *extra, check_rc=0).stdout
    size_in, size_out = model_file.stat().st_size, out.stat().st_size
    m = re.search(r"\n  nodes 2 -> (\d+), size ([\d,]+) -> ([\d,]+) bytes, (\d+\.\d\d) s$", text)
    assert m, text
    assert int(m[1]) == len(onnx.load(out).graph.node)
    assert (int(m[2].replace(",", "")), int(m[3].replace(",", ""))) == (size_in, size_out)
    report = json.loads(run_cli("rewrite", model_file, tmp_path / "o2.onnx", *extra, "--json", check_rc=0).stdout)
    assert (report["nodes_before"], report["nodes_after"]) == (2, int(m[1]))
    assert (report["bytes_before"], report["bytes_after"]) == (size_in, (tmp_path / "o2.onnx").stat().st_size)
    assert 0 < report["seconds"] < 60
    dry = json.loads(run_cli("rewrite", model_file, tmp_path / "o3.onnx", *extra, "--json", "--dry-run",
                             check_rc=0).stdout)
    assert dry["bytes_after"] == size_out and not (tmp_path / "o3.onnx").exists()


# --------------------------------------------------------------------------- 3. argument order


def test_compare_reports_a_vs_b_in_argument_order(model_file, tmp_path):
    b = tmp_path / "b.onnx"
    run_cli("rewrite", model_file, b, check_rc=0)
    out = run_cli("compare", model_file, b, "--bisect", check_rc=0).stdout
    assert out.splitlines()[0].startswith(f"{model_file} vs {b} (")
    assert f"bisect {model_file} vs {b}:" in out
    out = run_cli("compare", b, model_file, check_rc=0).stdout
    assert out.startswith(f"{b} vs {model_file} (")
