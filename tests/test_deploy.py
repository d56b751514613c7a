"""graphkit deploy (issue 27 item 1): a folder from which plain ONNX Runtime, in Python with
no graphkit importable and from a C program, runs a bound model and matches torch; the
folder is relocatable (the BLAS deform_conv2d links is shipped beside the kernel library and
found through $ORIGIN); its manifest says what is in it; a model bound to Python kernels says
it needs graphkit; nothing partial is left on failure."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from conftest import REPO, error_lines, my_add_model, run_cli

ORT_LIBRARY = sorted(glob.glob(os.path.join(os.path.dirname(__import__("onnxruntime").__file__),
                                            "capi", "libonnxruntime.so*")))

# Plain onnxruntime in a fresh interpreter, graphkit made unimportable: the folder must be enough.
PLAIN = r"""
import importlib.abc, json, sys
class NoGraphkit(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("graphkit", "graphkit_ops"):
            raise ImportError(f"{name} must not be needed")
sys.meta_path.insert(0, NoGraphkit())
import numpy as np, onnxruntime as ort
folder, model, feeds = sys.argv[1], sys.argv[2], np.load(sys.argv[3])
manifest = json.load(open(f"{folder}/graphkit-deploy.json"))
so = ort.SessionOptions()
for lib in manifest["libraries"]:
    so.register_custom_ops_library(f"{folder}/{lib['file']}")
session = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
outputs = session.run(None, dict(feeds))
np.save(sys.argv[4], outputs[0])
maps = sorted({l.split()[-1] for l in open("/proc/self/maps") if l.rstrip().endswith(".so")})
print(json.dumps({"graphkit": [m for m in sys.modules if m.startswith("graphkit")], "maps": maps}))
"""


def _plain(folder: Path, model: Path, feeds: dict[str, np.ndarray], tmp: Path) -> tuple[np.ndarray, dict]:
    np.savez(tmp / "feeds.npz", **feeds)
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "PYTHONPATH", "GRAPHKIT_OPS")}
    proc = subprocess.run([sys.executable, "-c", PLAIN, str(folder), str(model), str(tmp / "feeds.npz"),
                           str(tmp / "out.npy")], capture_output=True, text=True, env=env, cwd=tmp, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return np.load(tmp / "out.npy"), json.loads(proc.stdout)


def _compiler() -> str | None:
    return next((c for c in (os.environ.get("CC"), "cc", "gcc", "clang") if c and shutil.which(c)), None)


@pytest.fixture(scope="module")
def run_model(tmp_path_factory):
    """samples/deploy/run_model.c, compiled (it dlopens the libonnxruntime the wheel ships)."""
    cc = _compiler()
    if cc is None:
        pytest.skip("no C compiler (cc, gcc or clang) to build samples/deploy/run_model.c")
    if not ORT_LIBRARY:
        pytest.skip("the onnxruntime wheel holds no capi/libonnxruntime.so*")
    exe = tmp_path_factory.mktemp("c") / "run_model"
    subprocess.run([cc, "-std=c99", "-Wall", "-Werror", "-O1", "-o", str(exe),
                    str(REPO / "samples" / "deploy" / "run_model.c"), "-ldl"], check=True, timeout=300)
    return exe


def _c_run(exe: Path, folder: Path, model: Path, feeds: dict[str, np.ndarray], output: str, tmp: Path) -> np.ndarray:
    args = []
    for name, value in feeds.items():
        value.astype(np.float32).tofile(tmp / f"{name}.bin")
        args.append(f"{name}={tmp / (name + '.bin')}:{'x'.join(map(str, value.shape))}")
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    proc = subprocess.run([str(exe), ORT_LIBRARY[-1], str(folder / "libgraphkit_ops.so"), str(model), output, *args],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    head, *values = proc.stdout.split("\n")
    shape = tuple(int(d) for d in head.split()[1:])
    return np.array([float(v) for v in values if v], np.float32).reshape(shape)


def _deploy_and_move(model: Path, tmp: Path, *extra: str) -> Path:
    """`graphkit deploy MODEL -o built/ --copy-model`, then the folder moved elsewhere and the
    original removed: whatever runs from it cannot lean on where it was written."""
    run_cli("deploy", model, "-o", tmp / "built", "--copy-model", *extra, check_rc=0)
    moved = tmp / "elsewhere" / "deployed"
    moved.parent.mkdir()
    shutil.copytree(tmp / "built", moved, symlinks=True)
    shutil.rmtree(tmp / "built")
    return moved


# --------------------------------------------------------------------------- models vs torch


_EXPORT = """
import sys
sys.path.insert(0, sys.argv[1])
import numpy as np, torch
from simplify_models import MODELS
from graphkit.export import export
model = MODELS[sys.argv[2]](True)
inputs = model.inputs(1, model.length)
export(model.module, inputs, sys.argv[3] + "/m.onnx", dynamo=False, input_names=list(model.input_names))
with torch.no_grad():
    want = model.module.eval()(*inputs).numpy()
np.savez(sys.argv[3] + "/io.npz", want=want, **{n: t.numpy() for n, t in zip(model.input_names, inputs)})
"""


def _bound(name: str, tmp: Path) -> tuple[Path, dict[str, np.ndarray], np.ndarray, str]:
    """A small corpus model exported (TorchScript), rewritten with `graphkit rewrite --bind
    native`, its feeds and torch eager's output. The export runs in a process of its own: what
    exporting leaves in torch (ops, symbolics) must not reach later tests' exports."""
    pytest.importorskip("torch")
    proc = subprocess.run([sys.executable, "-c", _EXPORT, str(REPO / "tests"), name, str(tmp)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    run_cli("rewrite", tmp / "m.onnx", tmp / "m.native.onnx", "--bind", "native", check_rc=0)
    io = dict(np.load(tmp / "io.npz"))
    want = io.pop("want")
    output = onnx.load(tmp / "m.native.onnx").graph.output[0].name
    return tmp / "m.native.onnx", io, want, output


@pytest.mark.parametrize("name", ["my_add_resnet", "dcn_resnet"])
def test_deployed_models_run_in_plain_onnxruntime_and_in_c_and_match_torch(name, tmp_path, run_model):
    bound, feeds, want, output = _bound(name, tmp_path)
    domains = {n.domain for n in onnx.load(bound).graph.node}
    assert "graphkit.native" in domains
    folder = _deploy_and_move(bound, tmp_path)
    got, seen = _plain(folder, folder / bound.name, feeds, tmp_path)
    assert seen["graphkit"] == []
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    from_c = _c_run(run_model, folder, folder / bound.name, feeds, output, tmp_path)
    np.testing.assert_allclose(from_c, want, rtol=1e-4, atol=1e-4)
    if name == "dcn_resnet":  # deform_conv2d's GEMM: OpenBLAS, loaded from the moved folder
        blas = [m for m in seen["maps"] if os.path.basename(m) == "libscipy_openblas.so"]
        assert blas == [str(folder / "libscipy_openblas.so")], seen["maps"]


def test_the_folder_is_relocatable_and_its_manifest_says_what_is_in_it(tmp_path):
    from graphkit import __version__
    from graphkit.rewrite import Lowering, rewrite_model
    from graphkit.runtime._elf import dynamic_section

    bound, _ = rewrite_model(my_add_model(), lowering=Lowering.NATIVE)
    onnx.save(bound, tmp_path / "m.onnx")
    folder = _deploy_and_move(tmp_path / "m.onnx", tmp_path)
    manifest = json.loads((folder / "graphkit-deploy.json").read_text())
    (lib,) = manifest["libraries"]
    assert lib["file"] == "libgraphkit_ops.so" and lib["api_version"] == 17 and lib["packages"] == ["graphkit_ops"]
    assert manifest["onnxruntime"] == {"api_version": 17, "min_version": "1.17"}
    ops = {f"{op['domain']}::{op['name']}": op["element_types"] for op in lib["ops"]}
    assert ops["graphkit.native::my_add"] == ["float16", "float", "double"]
    assert ops["custom::deform_conv2d"] == ["float", "double"] and set(lib["domains"]) == {"custom", "graphkit.native"}
    assert manifest["packages"] == [{"name": "graphkit_ops", "version": __version__, "origin": "built-in",
                                     "distribution": "graphkit-onnx"}]
    (blas,) = manifest["dependencies"]
    assert blas["file"] == "libscipy_openblas.so" and blas["distribution"] == "scipy-openblas32" and blas["version"]
    assert "libstdc++.so.6" in manifest["system_libraries"]
    assert manifest["model"]["nodes"] == {"graphkit.native::my_add": 1} and manifest["python_kernels"] is None
    import hashlib

    for entry in (lib, blas, manifest["model"]):
        assert hashlib.sha256((folder / entry["file"]).read_bytes()).hexdigest() == entry["sha256"]
    assert sorted(p.name for p in folder.iterdir()) == sorted([*manifest["files"], "graphkit-deploy.json"])
    assert dynamic_section(folder / "libgraphkit_ops.so").runpath == ["$ORIGIN"]
    assert "RegisterCustomOpsLibrary_V2" in manifest["load"]["c"]
    assert 'so.register_custom_ops_library("DIR/libgraphkit_ops.so")' in manifest["load"]["python"]


def test_the_report_says_how_to_load_it_from_python_and_c(tmp_path):
    onnx.save(my_add_model(), tmp_path / "m.onnx")  # the placeholder: the library serves custom::my_add too
    out = run_cli("deploy", tmp_path / "m.onnx", "-o", tmp_path / "d", cwd=tmp_path, check_rc=0).stdout
    assert f'so.register_custom_ops_library("{tmp_path / "d"}/libgraphkit_ops.so")' in out
    assert f'api->RegisterCustomOpsLibrary_V2(options, "{tmp_path / "d"}/libgraphkit_ops.so");' in out
    assert "custom::my_add  float16, float, double" in out and "onnxruntime >= 1.17" in out
    assert "m.onnx (not copied" in out and not (tmp_path / "d" / "m.onnx").exists()


def test_a_package_by_name(tmp_path):
    proc = run_cli("deploy", "--package", "graphkit_ops", "-o", tmp_path / "k", "--json", check_rc=0)
    manifest = json.loads(proc.stdout)
    assert manifest["model"] is None and {p.name for p in (tmp_path / "k").iterdir()} == \
        {"libgraphkit_ops.so", "libscipy_openblas.so", "graphkit-deploy.json"}
    line = error_lines(run_cli("deploy", "--package", "nope_ops", "-o", tmp_path / "n").stderr)
    assert len(line) == 1 and "no loaded op package is named 'nope_ops'" in line[0] and "--ops" in line[0]


def test_a_model_on_python_kernels_says_it_needs_graphkit(tmp_path):
    from graphkit import __version__
    from graphkit.rewrite import Lowering, rewrite_model

    bound, _ = rewrite_model(my_add_model(), lowering=Lowering.PYTHON)
    onnx.save(bound, tmp_path / "m.py.onnx")
    out = run_cli("deploy", tmp_path / "m.py.onnx", "-o", tmp_path / "d", check_rc=0).stdout
    note = next(line for line in out.splitlines() if line.startswith("NOTE: "))
    assert "graphkit.python::my_add" in note and "plain onnxruntime cannot run them" in note
    assert f"pip install graphkit-onnx=={__version__} onnxruntime-extensions" in note
    assert "graphkit.open_session('m.py.onnx')" in note and "--bind native" in note
    manifest = json.loads((tmp_path / "d" / "graphkit-deploy.json").read_text())
    assert manifest["libraries"] == [] and manifest["python_kernels"]["packages"] == ["graphkit_ops"]


def test_failures_leave_nothing_and_never_touch_a_folder_graphkit_did_not_write(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    onnx.save(my_add_model(), tmp_path / "m.onnx")
    (line,) = error_lines(run_cli("deploy", tmp_path / "m.onnx", "-o", mine, check_rc=4).stderr)
    assert "no deployment graphkit wrote" in line and (mine / "notes.txt").read_text() == "keep me"
    assert run_cli("deploy", "-o", tmp_path / "x", check_rc=2).stderr.count("nothing to deploy") == 1
    unknown = my_add_model()
    unknown.graph.node[0].op_type = "mystery"
    onnx.save(unknown, tmp_path / "u.onnx")
    (line,) = error_lines(run_cli("deploy", tmp_path / "u.onnx", "-o", tmp_path / "u", check_rc=6).stderr)
    assert "custom::mystery" in line and "--ops PACKAGE" in line
    # an earlier deployment is replaced whole
    run_cli("deploy", tmp_path / "m.onnx", "-o", tmp_path / "d", "--copy-model", check_rc=0)
    run_cli("deploy", tmp_path / "m.onnx", "-o", tmp_path / "d", check_rc=0)
    assert not (tmp_path / "d" / "m.onnx").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "m.onnx", "mine", "u.onnx"]


def test_a_killed_deploys_temporary_folder_is_swept(tmp_path):
    from graphkit.deploy import deploy

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    from graphkit.publish import temporary_path

    left = Path(str(temporary_path(tmp_path / "d")).replace(f"-{os.getpid()}-", f"-{dead}-"))
    left.mkdir()
    (left / "libgraphkit_ops.so").write_bytes(b"half")
    deploy(tmp_path / "d", packages=["graphkit_ops"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]


def test_march_builds_the_kernels_for_another_cpu(tmp_path):
    """--march x86-64: kernels any x86-64 runs (not this machine's -march=native); recorded."""
    import platform

    if platform.machine() != "x86_64":
        pytest.skip("the test names an x86-64 CPU")
    manifest = json.loads(run_cli("deploy", "--package", "graphkit_ops", "-o", tmp_path / "k", "--march", "x86-64",
                                  "--json", check_rc=0).stdout)
    assert manifest["platform"]["march"] == "x86-64"
    from graphkit.rewrite import Lowering, rewrite_model

    bound, _ = rewrite_model(my_add_model(), lowering=Lowering.NATIVE)
    onnx.save(bound, tmp_path / "m.onnx")
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    got, _ = _plain(tmp_path / "k", tmp_path / "m.onnx", {"a": x, "b": -x}, tmp_path)
    np.testing.assert_array_equal(got, x)  # relu(2x - x)
    (line,) = error_lines(run_cli("deploy", "--package", "graphkit_ops", "-o", tmp_path / "b", "--march", "a;b",
                                  check_rc=2).stderr)
    assert "not a CPU name" in line and not (tmp_path / "b").exists()


def test_a_full_disk_is_exit_4_and_leaves_nothing(tmp_path, monkeypatch):
    import errno

    from graphkit.deploy import deploy
    from graphkit.errors import OutputError

    def full(src, dst, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shutil, "copyfile", full)
    with pytest.raises(OutputError) as exc:
        deploy(tmp_path / "d", packages=["graphkit_ops"])
    assert exc.value.exit_code == 4 and "the disk is full" in str(exc.value)
    assert list(tmp_path.iterdir()) == []


def test_a_model_plain_onnxruntime_cannot_open_with_the_library_is_refused(tmp_path):
    """graphkit.native::my_add on int32 (its kernels take float16, float, double): the folder is
    not written, and the error says plain onnxruntime cannot open the model with it."""
    from onnx import TensorProto

    model = my_add_model(dtype=TensorProto.INT32, domain="graphkit.native")
    onnx.save(model, tmp_path / "m.onnx")
    (line,) = error_lines(run_cli("deploy", tmp_path / "m.onnx", "-o", tmp_path / "d", "--copy-model",
                                  check_rc=9).stderr)
    assert "plain onnxruntime cannot open the model with the deployed libraries" in line and "int32" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]
