"""The command's --ops reach every registry it builds, and hints speak the caller's language
(issue 27 item 2): `graphkit export --ops PKG` with a model whose factory builds `TorchOps()`
(docs/writing-ops.md step 4), an unknown op's export error naming the op and the fix (not
the other exporter), an error raised in the model's own code named where it was raised, and
API callers told about `registry=`, never `--ops`."""

from __future__ import annotations

import sys
import threading

import pytest

from conftest import error_lines, run_cli

torch = pytest.importorskip("torch")

# An op package no test installs (a unique op name): only --ops or $GRAPHKIT_OPS can load it.
PACKAGE = '''
from graphkit.ops import OpDef, OpPackage, Param

THRICE = OpDef(name="thrice_scoped", doc="3x", inputs=(Param("x", "T"),), outputs=(Param("y", "T"),),
               type_constraints={"T": ("tensor(float)",)}, reference=lambda x: 3 * x,
               infer_shapes=lambda s, a: [s[0]], python_kernel=lambda x: 3 * x)
PACKAGE = OpPackage("scoped_ops", (THRICE,))
'''

MODEL = '''
import torch
from graphkit.export import TorchOps


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ops = TorchOps()  # the default registry, as docs/writing-ops.md step 4 builds it

    def forward(self, x):
        return self.ops.thrice_scoped(x) + 1


def build():
    return Net()
'''


@pytest.fixture
def work(tmp_path):
    (tmp_path / "scopedops").mkdir()
    (tmp_path / "scopedops" / "__init__.py").write_text(PACKAGE)
    (tmp_path / "model.py").write_text(MODEL)
    return tmp_path


@pytest.mark.parametrize("exporter", [[], ["--no-dynamo"]])
def test_export_ops_reach_the_factorys_torch_ops(work, exporter):
    import onnx

    run_cli("export", "model.py:build", "m.onnx", "--input", "x=4x16", "--ops", "scopedops", *exporter,
            "--verify", "--bind", "python", cwd=work, check_rc=0, env={"GRAPHKIT_OPS": ""})
    assert [(n.domain, n.op_type) for n in onnx.load(work / "m.onnx").graph.node if n.domain == "custom"] == \
        [("custom", "thrice_scoped")]


@pytest.mark.parametrize("exporter", [[], ["--no-dynamo"]])
def test_an_unknown_op_names_the_op_and_the_fix_not_the_other_exporter(work, exporter):
    proc = run_cli("export", "model.py:build", "m.onnx", "--input", "x=4x16", *exporter, cwd=work,
                   env={"GRAPHKIT_OPS": ""})
    (line,) = error_lines(proc.stderr)
    assert proc.returncode == 13, proc.stderr  # an op package cannot be found
    assert "no op named 'thrice_scoped'" in line and "pass --ops PACKAGE" in line
    assert "dynamo" not in line and not (work / "m.onnx").exists()


@pytest.mark.parametrize("dynamo", [True, False])
def test_an_unknown_op_from_the_api_names_registry_and_stays_an_attribute_error(work, dynamo):
    from graphkit.errors import UnknownOpError
    from graphkit.export import TorchOps, export

    sys.path.insert(0, str(work))
    try:
        from model import build
    finally:
        sys.path.remove(str(work))
        sys.modules.pop("model", None)
    with pytest.raises(UnknownOpError) as exc:
        export(build(), (torch.randn(4, 16),), work / "m.onnx", dynamo=dynamo)
    assert exc.value.exit_code == 13 and "discover(['PACKAGE'])" in exc.value.hint
    assert "--ops" not in str(exc.value) and "dynamo" not in str(exc.value)
    assert not hasattr(TorchOps(), "thrice_scoped")  # hasattr still answers False


@pytest.mark.parametrize("exporter", [[], ["--no-dynamo"]])
def test_an_error_in_the_models_code_is_named_where_it_was_raised(tmp_path, exporter):
    (tmp_path / "bad.py").write_text("import torch\n\n\nclass Net(torch.nn.Module):\n"
                                     "    def forward(self, x):\n        return x * undefined_name\n\n\n"
                                     "def build():\n    return Net()\n")
    proc = run_cli("export", "bad.py:build", "m.onnx", "--input", "x=2x3", *exporter, cwd=tmp_path, check_rc=11)
    (line,) = error_lines(proc.stderr)
    assert "NameError" in line and f"{tmp_path / 'bad.py'}:6" in line and "fix the model there" in line
    assert "try dynamo" not in line


def test_the_commands_ops_last_as_long_as_the_command(work, monkeypatch):
    """Inside command_line(), discover() (what TorchOps() and open_session() use) holds the
    command's --ops; after it, and in other threads, nothing is left of them."""
    from graphkit._invocation import command_line, in_command
    from graphkit.ops import discover

    monkeypatch.chdir(work)
    monkeypatch.delenv("GRAPHKIT_OPS", raising=False)
    assert discover().get("thrice_scoped") is None and not in_command()
    seen = {}
    with command_line(["scopedops"]):
        assert discover().get("thrice_scoped") is not None and in_command()
        worker = threading.Thread(target=lambda: seen.update(op=discover().get("thrice_scoped")))
        worker.start()
        worker.join()
    assert seen == {"op": None}
    assert discover().get("thrice_scoped") is None and not in_command()
