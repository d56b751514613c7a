"""Install-time behaviour: the Makefile's torch index choice and a plain `pip install .`."""

from __future__ import annotations

import shutil
import sys
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _make_n(tmp_path, *args):
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    r = subprocess.run(
        ["make", "-n", "install", f"VENV={tmp_path / 'venv'}", *args],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )
    return [line for line in r.stdout.splitlines() if "torch==" in line]


def test_make_installs_torch_from_default_index(tmp_path):
    (line,) = _make_n(tmp_path)
    assert "--index-url" not in line and "--extra-index-url" not in line
    assert line.split()[-1] == "torch==2.13.0"


def test_make_torch_index_url_selects_index(tmp_path):
    url = "https://example.invalid/whl/cpu"
    (line,) = _make_n(tmp_path, f"TORCH_INDEX_URL={url}")
    assert f"--index-url {url} torch==2.13.0" in line


# -------------------------------------------------- `pip install .` without the torch extra

_MODEL_PY = """
import torch

class Scale(torch.nn.Module):
    def forward(self, x):
        return x * 2.0

def build():
    return Scale()
"""


def test_dynamo_export_without_onnxscript_names_the_extra(tmp_path, monkeypatch):
    """Plain `pip install .` has torch maybe, but not onnxscript (the torch extra)."""
    torch = pytest.importorskip("torch")
    from graphkit.errors import ExportError
    from graphkit.export import export

    class Scale(torch.nn.Module):
        def forward(self, x):
            return x * 2.0

    monkeypatch.setitem(sys.modules, "onnxscript", None)  # `import onnxscript` -> ImportError
    with pytest.raises(ExportError) as info:
        export(Scale(), (torch.ones(2, 3),), tmp_path / "m.onnx")
    assert "onnxscript" in info.value.message
    assert "pip install 'graphkit-onnx[torch]'" in info.value.hint
    assert not (tmp_path / "m.onnx").exists()
    # TorchScript needs no onnxscript: the hint's alternative works.
    export(Scale(), (torch.ones(2, 3),), tmp_path / "ts.onnx", dynamo=False)
    assert (tmp_path / "ts.onnx").exists()


def test_cli_export_without_onnxscript_is_one_line(tmp_path, monkeypatch, capsys):
    pytest.importorskip("torch")
    from graphkit.cli import main
    from graphkit.errors import ExportError

    (tmp_path / "model.py").write_text(_MODEL_PY)
    monkeypatch.setitem(sys.modules, "onnxscript", None)
    code = main(["export", f"{tmp_path / 'model.py'}:build", str(tmp_path / "m.onnx"), "--input", "x=2x3"])
    assert code == ExportError.exit_code
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "onnxscript" in err and "pip install 'graphkit-onnx[torch]'" in err


@pytest.mark.parametrize("found, name", [([], "graphkit-onnx"), (["graphkit-onnx"], "graphkit-onnx"),
                                         (["graphkit", "graphkit-onnx"], "graphkit-onnx"),
                                         (["my-graphkit-fork"], "my-graphkit-fork")])
def test_the_extra_hint_names_the_installed_distribution(found, name, monkeypatch):
    """A stale graphkit.egg-info in a source checkout also claims the package: the hint
    still names graphkit-onnx."""
    import importlib.metadata

    from graphkit.export._export import _distribution_name

    monkeypatch.setattr(importlib.metadata, "packages_distributions", lambda: {"graphkit": found} if found else {})
    assert _distribution_name() == name


def test_pyproject_lists_every_package_of_the_tree():
    """setuptools installs only the packages pyproject names: a subpackage left out is missing
    from a wheel (graphkit.rewrite.fusions once was), while an editable checkout still works."""
    import tomllib

    root = Path(__file__).resolve().parents[1]
    listed = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(root).parts) for p in (root / "graphkit").rglob("__init__.py")}
    found |= {"graphkit_ops" + "".join("." + part for part in p.parent.relative_to(root / "custom_ops").parts)
              for p in (root / "custom_ops").rglob("__init__.py")}
    assert found == listed, (sorted(found - listed), sorted(listed - found))
